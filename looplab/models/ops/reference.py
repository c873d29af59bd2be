"""The `*_ref` oracles: each Mamba-2 op written again from its definition, slowly and
plainly, for the tests (and anyone checking a kernel) to compare the fast code against.

In the library, as mamba-ssm keeps a `*_ref` beside each kernel, so that every check
reads one definition of each op. In one module that imports nothing else of looplab,
so that an oracle cannot share a bug with the code it checks: it loops over tokens
where the fast code is chunked, takes windows of the padded sequence where the fast
conv shifts and adds, and spells out what the fast code fuses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ssm_scan_ref(x, dt, A, B, C, initial_state=None):
    """The SSM recurrence one token at a time, straight from its definition:
        S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_tᵀ,   y_t = S_t C_t
    x (b, l, h, p), dt (b, l, h), A (h,), B/C (b, l, g, n). Returns y, final S."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    group_of_head = torch.arange(h, device=x.device) // (h // g)
    S = torch.zeros(b, h, p, n, dtype=x.dtype, device=x.device) if initial_state is None else initial_state.clone()
    ys = []
    for t in range(l):
        Bt = B[:, t, group_of_head]  # b h n
        Ct = C[:, t, group_of_head]
        decay = torch.exp(dt[:, t] * A)  # b h
        S = S * decay[..., None, None] + (dt[:, t, :, None, None] * x[:, t, :, :, None] * Bt[:, :, None, :])
        ys.append((S * Ct[:, :, None, :]).sum(-1))
    return torch.stack(ys, dim=1), S


def causal_conv1d_ref(x, weight, bias=None, seq_idx=None, activation=None):
    """causal-conv1d's depthwise causal conv, x (b, d, l), weight (d, k):
    out_t = bias + Σ_j weight[:, j] · x_{t-(k-1)+j}, where a tap before the row's start
    or in another sequence than token t's (seq_idx (b, l)) reads zero; then silu if
    activation is "silu" or "swish"."""
    k = weight.shape[-1]
    windows = F.pad(x, (k - 1, 0)).unfold(-1, k, 1)  # b d l k; window[..., t, j] = x_{t-(k-1)+j}
    if seq_idx is not None:
        seq_windows = F.pad(seq_idx, (k - 1, 0), value=-1).unfold(-1, k, 1)  # b l k
        windows = windows * (seq_windows == seq_idx.unsqueeze(-1)).unsqueeze(1).to(x.dtype)
    out = (windows * weight[:, None, :]).sum(-1)
    if bias is not None:
        out = out + bias[:, None]
    return F.silu(out) if activation in ("silu", "swish") else out


def mamba_chunk_scan_combined_ref(  # noqa: PLR0913 - mamba-ssm's kernel signature, the reference's contract
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    dt_softplus=False,
    **unused,
):
    """mamba-ssm's `mamba_chunk_scan_combined`, as looplab calls it, from its definition:
    dt = softplus(dt + dt_bias), the recurrence token by token within each sequence of
    seq_idx (b, l), plus D·x. chunk_size changes nothing here (the kernel's tiling)."""
    # The oracle's scope is looplab's call (models/mamba2.py's _scan_cuda): no z gating
    # (the gated norm comes after), no initial states, no returned states.
    if z is not None or initial_states is not None or unused:
        raise ValueError(
            f"mamba_chunk_scan_combined_ref covers looplab's call only; got z={z is not None}, "
            f"initial_states={initial_states is not None}, extra={sorted(unused)}"
        )
    if dt_bias is not None:
        dt = dt + dt_bias
    dt = F.softplus(dt) if dt_softplus else dt
    seq_idx = torch.zeros(x.shape[:2], dtype=torch.int32, device=x.device) if seq_idx is None else seq_idx
    rows = []
    for r in range(x.shape[0]):
        parts = []
        for s in torch.unique_consecutive(seq_idx[r]):
            t = (seq_idx[r] == s).nonzero()[:, 0]
            y, _ = ssm_scan_ref(x[r : r + 1, t], dt[r : r + 1, t], A, B[r : r + 1, t], C[r : r + 1, t])
            parts.append(y)
        rows.append(torch.cat(parts, dim=1))
    y = torch.cat(rows)
    return y if D is None else y + x * D[:, None]


def mamba2_mixer_ref(m, u):
    """A Mamba-2 mixer's forward written from its definition, reading the module m's
    weights (models/mamba2.py's Mamba2): the causal conv from its windows, the
    sequential SSM, the gated group RMSNorm spelled out."""
    bsz, seqlen, _ = u.shape
    zxbcdt = u @ m.in_proj.weight.T
    d_inner, conv_dim, h, g, n, p = m.d_inner, m.conv_dim, m.nheads, m.ngroups, m.d_state, m.headdim
    z, xBC, dt = zxbcdt[..., :d_inner], zxbcdt[..., d_inner : d_inner + conv_dim], zxbcdt[..., d_inner + conv_dim :]
    xBC = causal_conv1d_ref(xBC.transpose(1, 2), m.conv1d.weight[:, 0], m.conv1d.bias, activation="silu")
    xBC = xBC.transpose(1, 2)
    x = xBC[..., :d_inner].reshape(bsz, seqlen, h, p)
    B = xBC[..., d_inner : d_inner + g * n].reshape(bsz, seqlen, g, n)
    C = xBC[..., d_inner + g * n :].reshape(bsz, seqlen, g, n)
    dt = F.softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    y, _ = ssm_scan_ref(x, dt, A, B, C)
    y = (y + x * m.D[:, None]).reshape(bsz, seqlen, d_inner)
    y = y * (z * torch.sigmoid(z))
    groups = y.reshape(bsz, seqlen, g, d_inner // g)
    groups = groups / torch.sqrt((groups**2).mean(-1, keepdim=True) + m.norm.eps)
    y = groups.reshape(bsz, seqlen, d_inner) * m.norm.weight
    return y @ m.out_proj.weight.T
