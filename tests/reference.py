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
