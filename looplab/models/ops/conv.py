"""The depthwise causal conv of a Mamba-2 block in torch: over a sequence (prefill,
training) and for one new token per row (decoding).

Apart from the SSD because it is another operation, with other kernels on CUDA
(causal-conv1d's, whose input layout ops/causal_conv1d_layout.py meets) and its own
oracle, ops/reference.py's causal_conv1d_ref.
"""

from __future__ import annotations

import torch


class _CausalDepthwiseConv(torch.autograd.Function):
    """Depthwise causal conv on channels-last input as k shifted multiply-adds,
    accumulated in place. On CPU this is several times faster than F.conv1d's
    grouped path, forward and backward, and it needs no transposes; the explicit
    backward avoids the zero-filled buffers that autograd of slices would allocate.
    With seq_idx, a tap that would reach into another sequence reads zero."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx):
        k = weight.shape[-1]
        w = weight[:, 0, :]
        out = x * w[:, k - 1]
        for shift, j, src in _taps(x, k, seq_idx):
            out[:, shift:].addcmul_(src, w[:, j])
        if bias is not None:
            out += bias
        ctx.save_for_backward(x, weight, seq_idx)
        ctx.has_bias, ctx.has_seq = bias is not None, seq_idx is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, seq_idx = ctx.saved_tensors
        seq_idx = seq_idx if ctx.has_seq else None
        k, seqlen = weight.shape[-1], x.shape[1]
        w = weight[:, 0, :]
        grad = grad.contiguous()
        grad_x = grad * w[:, k - 1]
        grad_w = torch.zeros_like(w)
        grad_w[:, k - 1] = (grad * x).sum((0, 1))
        for shift, j, src in _taps(x, k, seq_idx):
            g = grad[:, shift:]
            if seq_idx is not None:
                g = g * _same_seq(seq_idx, shift)
            grad_x[:, : seqlen - shift].addcmul_(g, w[:, j])
            grad_w[:, j] = (grad[:, shift:] * src).sum((0, 1))
        grad_b = grad.sum((0, 1)) if ctx.has_bias else None
        return grad_x, grad_w.unsqueeze(1), grad_b, None


def _same_seq(seq_idx: torch.Tensor, shift: int) -> torch.Tensor:
    """(b, l-shift, 1): 1 where position t and t-shift belong to the same sequence."""
    return (seq_idx[:, shift:] == seq_idx[:, :-shift]).unsqueeze(-1)


def _taps(x: torch.Tensor, k: int, seq_idx: torch.Tensor | None):
    """(shift, tap index, source slice) for the taps that read earlier tokens."""
    seqlen = x.shape[1]
    for j in range(k - 1):
        shift = k - 1 - j  # tap j reads the token `shift` positions back
        if shift < seqlen:
            src = x[:, : seqlen - shift]
            yield shift, j, src if seq_idx is None else src * _same_seq(seq_idx, shift)


def causal_depthwise_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None = None
) -> torch.Tensor:
    """x (b, l, c), weight (c, 1, k): out_t = bias + Σ_j weight[:, j] · x_{t-(k-1)+j},
    with zeros before the start of the sequence (of the token's own sequence when
    seq_idx (b, l) marks several sequences packed into one row)."""
    return _CausalDepthwiseConv.apply(x.contiguous(), weight, bias, seq_idx)


def causal_depthwise_conv_step(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor | None
) -> torch.Tensor:
    """One new input per row through the conv: x (n, c) joins the last k − 1 inputs
    stored in window (batch, k − 1, c), oldest first, which is updated in place, in
    the rows `rows` (n,) or in every row for None. Returns the conv's output (n, c)."""
    # Packed rows are gathered with index_select (a row copy; advanced indexing is
    # several times slower on CPU) and written back.
    past = window if rows is None else window.index_select(0, rows)  # (n, k - 1, c)
    full = torch.cat([past, x.to(past.dtype)[:, None]], dim=1)  # (n, k, c), oldest first
    if rows is None:
        window.copy_(full[:, 1:])
    else:
        window.index_copy_(0, rows, full[:, 1:])
    out = (full * weight[:, 0].t().contiguous()).sum(1)  # a contiguous (k, c) is 3× faster
    if bias is not None:
        out = out + bias
    return out


# ---- causal-conv1d's two entry points, in torch --------------------------------------
# For a GPU node with mamba-ssm's Triton kernels but no causal-conv1d build (its CUDA
# sources took 6 minutes to build for one architecture on a 16-core H200 node, more than
# a lent machine's check can spend): the scan and the decode step keep the Triton
# kernels and run the conv here, with causal-conv1d's calling conventions, so
# Mamba2._scan_cuda and _step_cuda read the same either way (models/ops/dispatch.py).


def _activated(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    """causal-conv1d's activation: None, or SiLU under either of its names."""
    return torch.nn.functional.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_fn_torch(x, weight, bias=None, seq_idx=None, activation=None):
    """causal_conv1d_fn's contract: x (b, c, l), weight (c, k), bias (c,), seq_idx (b, l)
    int32, activation None, "silu" or "swish"; returns (b, c, l) in x's dtype."""
    out = causal_depthwise_conv(x.transpose(1, 2), weight[:, None, :], bias, seq_idx)
    return _activated(out, activation).to(x.dtype).transpose(1, 2)


def causal_conv1d_update_torch(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None):
    """causal_conv1d_update's contract: x (n, c), conv_state (batch, c, k − 1) updated in
    place (in rows conv_state_indices (n,) int32, or every row), weight (c, k); returns
    (n, c) in x's dtype."""
    rows = None if conv_state_indices is None else conv_state_indices.long()
    out = causal_depthwise_conv_step(x, conv_state.transpose(1, 2), weight[:, None, :], bias, rows)
    return _activated(out, activation).to(x.dtype)
