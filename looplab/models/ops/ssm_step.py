"""One token of the SSM recurrence per row, in torch, the stored states updated in
place: the decoding step of a Mamba-2 block where mamba-ssm's `selective_state_update`
does not run (ops/dispatch.py decides).

Apart from the chunked scan (ops/ssd.py) because decoding's costs are another kind:
a step is memory-bound, so what matters is how few passes it makes over the stored
states, not how its products are grouped. models/cpu/cpu_step.cpp compiles the same
arithmetic. The tests hold it to the full forward: a prefill, then steps, must give
what the whole sequence gives (tests/test_decode.py).
"""

from __future__ import annotations

import torch


def ssm_step(
    ssm: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    rows: torch.Tensor | None,
) -> torch.Tensor:
    """S ← exp(dt A) S + dt x Bᵀ, y = S C + D x for one new token per row.

    ssm (batch, h, p, d_state) the stored states, updated in place; x (n, h, p), dt
    (n, h) already positive, A (h,), B and C (n, g, d_state) with h divisible by g,
    D (h,); rows (n,) the stored rows the tokens belong to, or None for every row in
    order. Returns y (n, h, p)."""
    n, h, p = x.shape
    g, dstate = B.shape[1], B.shape[2]
    decay = torch.exp(dt * A)[..., None]  # (n, h, 1)
    xdt = (dt[..., None] * x).view(n, g, -1, 1)
    B, C = B.unsqueeze(2), C.unsqueeze(2)  # (n, g, 1, d_state)
    batch = ssm.shape[0]
    if rows is not None and 2 * n >= batch and not torch.compiler.is_compiling():
        # Most rows run (eager): the update is memory-bound, and gathering the running
        # rows' states and writing them back costs about two more passes over them than
        # updating every row in place. So every row steps, the others by an exact
        # identity (decay 1, input 0), and only the running rows' y is read.
        decay = torch.ones(batch, h, 1, dtype=decay.dtype, device=decay.device).index_copy_(0, rows, decay)
        xdt = xdt.new_zeros(batch, *xdt.shape[1:]).index_copy_(0, rows, xdt)
        B = B.new_zeros(batch, *B.shape[1:]).index_copy_(0, rows, B)
        C = C.new_zeros(batch, *C.shape[1:]).index_copy_(0, rows, C)
        n, rows, out_rows = batch, None, rows
    else:
        out_rows = None
    # The heads of a group share B and C, so each (row, group) is one block of
    # heads·headdim state rows: dt x Bᵀ is an outer product added in place, and
    # y = S C is read as the row vector Cᵀ Sᵀ (one small GEMM per block; the
    # batched matrix-vector form is several times slower on CPU).
    xdt, B, C = xdt.view(n * g, -1, 1), B.reshape(n * g, 1, dstate), C.reshape(n * g, 1, dstate)
    if torch.compiler.is_compiling():
        # Compiled: the new states in one fused pass, one read and one write of the
        # stored states, by row index where rows are given (a depth batch's slots).
        # The eager forms below compiled ran slower (at paper-140m's state, 8 slots of
        # 32, 1 thread: 2.2 against 0.36 ms a layer); eager, they are the faster ones.
        # (Broadcast over (row, group, head, p, d_state) views: merging p and d_state
        # into one axis before the product undid the fusion, 1.4 ms.)
        hg = h // g
        stored = ssm if rows is None else ssm[rows]
        states = stored.view(n, g, hg, p, dstate) * decay.view(n, g, hg, 1, 1)
        states = states + xdt.view(n, g, hg, p, 1) * B.view(n, g, 1, 1, dstate)
        if rows is None:
            ssm.copy_(states.view(n, h, p, dstate))
        else:
            ssm.index_put_((rows,), states.view(n, h, p, dstate))
        y = torch.bmm(states.view(n * g, hg * p, dstate), C.view(n * g, dstate, 1)).view(n, h, p)
        if out_rows is not None:
            y = y.index_select(0, out_rows)
    elif rows is None:
        states = ssm.view(n * g, -1, dstate)  # in place
        states.view(n, h, -1).mul_(decay)
        states.addcmul_(xdt, B)
        y = torch.bmm(C, states.transpose(1, 2)).view(n, h, p)
        if out_rows is not None:
            y = y.index_select(0, out_rows)
    else:
        # A few rows run (or rows of different loops: looplab/inference/depth_batching.py): their
        # states are gathered, stepped, and the change S_new − S added back with
        # index_add_ (its per-row fast path beats index_copy_'s several times on CPU).
        old = ssm.index_select(0, rows).view(n * g, -1, dstate)
        states = (old.view(n, h, -1) * decay).view(n * g, -1, dstate)
        states.addcmul_(xdt, B)
        y = torch.bmm(C, states.transpose(1, 2)).view(n, h, p)
        ssm.index_add_(0, rows, torch.sub(states, old, out=old).view(n, h, p, dstate))
    return y + x * D[:, None]
