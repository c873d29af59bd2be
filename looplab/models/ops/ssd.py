"""The chunked SSD scan in torch: the prefill and training path of a Mamba-2 block
wherever mamba-ssm's CUDA kernels do not run (ops/dispatch.py decides).

The SSM, per head h with scalar decay A_h < 0 and state S (headdim × d_state):
    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_tᵀ,    y_t = S_t C_t + D_h x_t
The chunked form (the Mamba-2 paper's "SSD") splits the sequence into chunks of Q
tokens: inside a chunk the recurrence is a masked Q×Q matrix product (quadratic but
matmul-friendly); between chunks only the (headdim × d_state) states are passed on.
Its oracle is the token-by-token recurrence, ops/reference.py's ssm_scan_ref.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _pad_to_chunks(x, dt, B, C, seq_idx, Q: int):
    """x, dt, B, C (and seq_idx) padded along l to a whole number of chunks of Q."""
    pad = (-x.shape[1]) % Q
    if pad:  # dt = 0 on pads: an identity step that adds nothing to the state
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
        if seq_idx is not None:  # pads continue the last sequence (as identity steps)
            seq_idx = torch.cat([seq_idx, seq_idx[:, -1:].expand(-1, pad)], dim=1)
    return x, dt, B, C, seq_idx


def _pass_states(a_cum, chunk_states, initial_state, seq, dtype: torch.dtype):
    """ssd_chunked's step 3: the state entering each chunk (b c g h p n) and the final
    state (b g h p n), from the chunks' log-decays a_cum (b c g h q), their end states
    chunk_states (b c g h p n), initial_state (b, h, p, n) or None, and the sequence
    ids seq (b c 1 1 q) of a packed layout or None; initial_state enters in dtype (x's)."""
    bsz, nc, ngroups, hpg, headdim, dstate = chunk_states.shape
    totals = a_cum[..., -1].permute(0, 2, 3, 1)  # b g h c: log-decay across each chunk
    inclusive = torch.cumsum(totals, dim=-1)
    exclusive = F.pad(inclusive, (1, 0))  # b g h (c+1): decay from the start to chunk z
    later = torch.ones(nc + 1, nc, dtype=torch.bool, device=a_cum.device).tril(-1)  # chunk c ends before z
    if seq is not None:
        # A chunk's end state reaches chunk z only within one sequence; sequences are
        # contiguous, so "same sequence at c's end and at z's start" says it all.
        ends = seq[:, :, 0, 0, -1]  # b c
        starts = torch.cat([seq[:, :, 0, 0, 0], seq[:, -1:, 0, 0, -1]], dim=1)  # b (c+1); row c+1: the end
        later = later & (starts.unsqueeze(-1) == ends.unsqueeze(-2))[:, None, None]
    passing = torch.exp((exclusive.unsqueeze(-1) - inclusive.unsqueeze(-2)).masked_fill(~later, float("-inf")))
    states = passing @ chunk_states.permute(0, 2, 3, 1, 4, 5).reshape(bsz, ngroups, hpg, nc, headdim * dstate)
    if initial_state is not None:
        init = initial_state.reshape(bsz, ngroups, hpg, 1, headdim * dstate).to(dtype)
        states = states + torch.exp(exclusive).unsqueeze(-1) * init
    states = states.reshape(bsz, ngroups, hpg, nc + 1, headdim, dstate)
    return states[:, :, :, :nc].permute(0, 3, 1, 2, 4, 5), states[:, :, :, nc]


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    state_at: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked state-space duality scan (without the D skip term).

    x (b, l, h, p), dt (b, l, h) already positive, A (h,) negative, B and C
    (b, l, g, n) with h divisible by g; initial_state (b, h, p, n) or None.
    seq_idx (b, l), non-decreasing along l, packs several sequences into one row:
    no state flows from one sequence into the next (the ragged layout of skip
    execution). Returns y (b, l, h, p) and the final state (b, h, p, n), which with
    seq_idx is the state of each row's last sequence.

    state_at (rows, positions), two (k,) index tensors: return instead of the final
    state the states right after those positions (k, h, p, n), each the state of the
    sequence its position belongs to. Prefill reads the state of every sequence of a
    ragged layout this way (each row's real tokens end at a different position).
    """
    if seq_idx is not None and initial_state is not None:
        raise ValueError("ssd_chunked: initial_state with seq_idx is not supported")
    bsz, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    hpg = nheads // ngroups  # heads per group share B and C
    Q = chunk_size
    x, dt, B, C, seq_idx = _pad_to_chunks(x, dt, B, C, seq_idx, Q)
    nc = x.shape[1] // Q
    if seq_idx is not None:
        seq = seq_idx.reshape(bsz, nc, 1, 1, Q)  # broadcasts over (group, head)

    # Layout (batch, chunk, group, head-in-group, position, feature) throughout.
    x = x.reshape(bsz, nc, Q, ngroups, hpg, headdim).permute(0, 1, 3, 4, 2, 5)
    dt = dt.reshape(bsz, nc, Q, ngroups, hpg).permute(0, 1, 3, 4, 2)
    B = B.reshape(bsz, nc, Q, ngroups, dstate).transpose(2, 3).unsqueeze(3)  # b c g 1 q n
    C = C.reshape(bsz, nc, Q, ngroups, dstate).transpose(2, 3).unsqueeze(3)
    a_cum = torch.cumsum(dt * A.reshape(ngroups, hpg, 1), dim=-1)  # b c g h q, decreasing

    xdt = x * dt.unsqueeze(-1)  # every input enters the state scaled by its dt

    # 1. Within a chunk: y_i = Σ_{j≤i} (C_i·B_j) exp(a_i − a_j) dt_j x_j.
    #    Masking before exp keeps the (positive) upper triangle from overflowing.
    keep = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    if seq_idx is not None:
        keep = keep & (seq.unsqueeze(-1) == seq.unsqueeze(-2))
    decay = _SegmentDecay.apply(a_cum, keep)
    y = ((C @ B.transpose(-1, -2)) * decay) @ xdt  # b c g h q p

    # 2. Each chunk's contribution to the state at its end.
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # b c g h q
    if seq_idx is not None:  # only the sequence still running at the chunk's end
        to_end = to_end * (seq == seq[..., -1:])
    chunk_states = (xdt * to_end.unsqueeze(-1)).transpose(-1, -2) @ B  # b c g h p n

    # 3. Pass states across chunks, in closed form: the state entering chunk z is
    #    Σ_{c<z} exp(a_tot[c+1..z-1]) chunk_states[c] + exp(a_tot[0..z-1]) S_init.
    #    One small (nc+1)×nc matrix product per head instead of a sequential loop
    #    (whose per-chunk slicing would cost O(nc²) memory traffic in backward);
    #    row nc is the final state.
    entering, state = _pass_states(a_cum, chunk_states, initial_state, seq if seq_idx is not None else None, x.dtype)

    # 4. The state entering a chunk, read out at every position of it.
    from_start = torch.exp(a_cum)
    if seq_idx is not None:  # positions of a sequence that began inside this chunk
        from_start = from_start * (seq == seq[..., :1])
    y = y + (C @ entering.transpose(-1, -2)) * from_start.unsqueeze(-1)

    y = y.permute(0, 1, 4, 2, 3, 5).reshape(bsz, nc * Q, nheads, headdim)[:, :seqlen]
    if state_at is not None:
        return y, _states_after(state_at, Q, a_cum, xdt, B, entering, seq if seq_idx is not None else None)
    return y, state.reshape(bsz, nheads, headdim, dstate)


def _states_after(state_at, Q, a_cum, xdt, B, entering, seq) -> torch.Tensor:
    """ssd_chunked's states after chosen positions, from its chunk layout: the state
    entering the position's chunk, decayed to the position, plus the chunk's inputs
    up to it: S_t = exp(a_t) S_enter + Σ_{j≤t} exp(a_t − a_j) dt_j x_j B_jᵀ, within
    the position's own sequence."""
    rows, pos = state_at
    c, i = pos // Q, (pos % Q)[:, None, None, None]  # chunk, offset in it
    a = a_cum[rows, c]  # k g h q
    a_t = a.gather(-1, i.expand(*a.shape[:-1], 1))  # k g h 1
    keep = torch.arange(Q, device=a.device) <= i  # j ≤ t
    if seq is not None:
        s = seq[rows, c, 0, 0]  # k q
        s_t = s.gather(-1, i[:, 0, 0])  # k 1
        keep = keep & (s == s_t)[:, None, None]
        from_start = torch.exp(a_t) * (s[:, :1] == s_t)[:, None, None]  # the entering state is this sequence's
    else:
        from_start = torch.exp(a_t)
    w = torch.exp((a_t - a).masked_fill(~keep, float("-inf")))  # k g h q
    states = (xdt[rows, c] * w.unsqueeze(-1)).transpose(-1, -2) @ B[rows, c]  # k g h p n
    states = states + from_start.unsqueeze(-1) * entering[rows, c]
    return states.reshape(rows.shape[0], -1, *states.shape[-2:])


class _SegmentDecay(torch.autograd.Function):
    """d_ij = exp(a_i − a_j) where keep[i, j], else 0: the intra-chunk decay
    matrix, a (…, Q) → (…, Q, Q). Autograd of the plain expression makes four
    passes over the (…, Q, Q) tensor in backward before its two reductions (exp's
    product, masked_fill's copy and fill, sub's negation) and one more copy in
    forward; here backward forms m = g ⊙ d once (zero where masked, as d is) and
    reduces it along both axes: ∂/∂a_k = Σ_j m_kj − Σ_i m_ik."""

    @staticmethod
    def forward(ctx, a, keep):
        d = (a.unsqueeze(-1) - a.unsqueeze(-2)).masked_fill_(~keep, float("-inf")).exp_()
        ctx.save_for_backward(d)
        return d

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (d,) = ctx.saved_tensors
        m = grad * d
        return m.sum(-1) - m.sum(-2), None
