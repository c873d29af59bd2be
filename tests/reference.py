"""Independent, deliberately naive references the fast code is tested against."""

from __future__ import annotations

import torch


def ssm_sequential(x, dt, A, B, C, initial_state=None):
    """The SSM recurrence one token at a time, straight from its definition:
        S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_tᵀ,   y_t = S_t C_t
    x (b, l, h, p), dt (b, l, h), A (h,), B/C (b, l, g, n). Returns y, final S."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    group_of_head = torch.arange(h) // (h // g)
    S = torch.zeros(b, h, p, n, dtype=x.dtype) if initial_state is None else initial_state.clone()
    ys = []
    for t in range(l):
        Bt = B[:, t, group_of_head]  # b h n
        Ct = C[:, t, group_of_head]
        decay = torch.exp(dt[:, t] * A)  # b h
        S = S * decay[..., None, None] + (dt[:, t, :, None, None] * x[:, t, :, :, None] * Bt[:, :, None, :])
        ys.append((S * Ct[:, :, None, :]).sum(-1))
    return torch.stack(ys, dim=1), S


def mamba2_mixer_reference(m, u):
    """A Mamba-2 mixer forward written from its definition, reading the module's
    weights: explicit conv taps, the sequential SSM, the gated group RMSNorm."""
    bsz, seqlen, _ = u.shape
    zxbcdt = u @ m.in_proj.weight.T
    d_inner, conv_dim, h, g, n, p = m.d_inner, m.conv_dim, m.nheads, m.ngroups, m.d_state, m.headdim
    z, xBC, dt = zxbcdt[..., :d_inner], zxbcdt[..., d_inner:d_inner + conv_dim], zxbcdt[..., d_inner + conv_dim:]
    k = m.conv1d.weight.shape[-1]
    w = m.conv1d.weight[:, 0, :]  # (conv_dim, k); tap k-1 multiplies the current token
    conv = torch.zeros_like(xBC) + m.conv1d.bias
    for t in range(seqlen):
        for j in range(k):
            src = t - (k - 1) + j
            if src >= 0:
                conv[:, t] = conv[:, t] + w[:, j] * xBC[:, src]
    xBC = conv * torch.sigmoid(conv)
    x = xBC[..., :d_inner].reshape(bsz, seqlen, h, p)
    B = xBC[..., d_inner:d_inner + g * n].reshape(bsz, seqlen, g, n)
    C = xBC[..., d_inner + g * n:].reshape(bsz, seqlen, g, n)
    dt = torch.nn.functional.softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    y, _ = ssm_sequential(x, dt, A, B, C)
    y = (y + x * m.D[:, None]).reshape(bsz, seqlen, d_inner)
    y = y * (z * torch.sigmoid(z))
    groups = y.reshape(bsz, seqlen, g, d_inner // g)
    groups = groups / torch.sqrt((groups ** 2).mean(-1, keepdim=True) + m.norm.eps)
    y = groups.reshape(bsz, seqlen, d_inner) * m.norm.weight
    return y @ m.out_proj.weight.T
