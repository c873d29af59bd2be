"""A CPU stand-in for causal-conv1d 1.7.0's `causal_conv1d_fn`, for tests.

The library only runs on CUDA. This stand-in rejects what the library would reject and
lays its outputs out as the library does, so a layout regression in looplab's CUDA
path fails on a CPU:
- the layout steps of its Python wrapper (causal_conv1d/causal_conv1d_interface.py,
  causal_conv1d/cpp_functions.py: which tensors are made contiguous, `out` and `dx`
  allocated with `torch.empty_like(x)`),
- the TORCH_CHECKs of its C++ entry points `causal_conv1d_fwd` / `causal_conv1d_bwd`
  (csrc/causal_conv1d.cpp), restated here, and
- one rule its channel-last kernel relies on without a check: it reads 16-byte vectors
  along the channels, so x must start 16-byte aligned (the storage's base pointer is
  allocator-aligned; the storage offset must keep it so).
The conv itself is looplab's oracle of it, causal_conv1d_ref (models/ops/reference.py:
windows over the padded sequence), independent of looplab's own conv. Not modelled:
initial/final states (looplab does not use them), is_cuda checks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from looplab.models.ops.reference import causal_conv1d_ref

FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


class CausalConv1dCheckError(RuntimeError):
    """What the library's TORCH_CHECK would have raised on a GPU."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CausalConv1dCheckError(msg)


def is_channel_last(x: torch.Tensor) -> bool:
    """The library's own test: `x.stride(1) == 1 && x.stride(2) > 1`."""
    return x.stride(1) == 1 and x.stride(2) > 1


def _check_common(x, weight, bias, seq_idx) -> bool:
    _check(x.dtype in FLOAT_TYPES, f"input dtype {x.dtype} is not float32/float16/bfloat16")
    _check(weight.dtype in FLOAT_TYPES, f"weight dtype {weight.dtype} is not float32/float16/bfloat16")
    _check(x.dim() == 3, "x must be (batch, dim, seqlen)")
    batch, dim, seqlen = x.shape
    width = weight.shape[-1]
    _check(tuple(weight.shape) == (dim, width), f"weight must have shape (dim, width), got {tuple(weight.shape)}")
    _check(2 <= width <= 4, "causal_conv1d only supports width between 2 and 4")
    _check(x.stride(2) == 1 or x.stride(1) == 1, f"x needs stride(1) or stride(2) == 1, strides {x.stride()}")
    channel_last = is_channel_last(x)
    if channel_last:
        _check(dim % 8 == 0, f"channel-last needs dim % 8 == 0, dim {dim}")
        _check(
            x.stride(2) % 8 == 0 and x.stride(0) % 8 == 0,
            f"channel-last needs x.stride(0) and x.stride(2) multiples of 8, strides {x.stride()}",
        )
        _check(
            x.storage_offset() * x.element_size() % 16 == 0,
            f"channel-last kernel reads 16-byte vectors: storage offset {x.storage_offset()} misaligns x",
        )
    if bias is not None:
        _check(bias.dtype == weight.dtype, "bias dtype must equal weight dtype")
        _check(bias.stride(-1) == 1, "bias.stride(-1) must be 1")
        _check(tuple(bias.shape) == (dim,), "bias must have shape (dim,)")
    if seq_idx is not None:
        _check(channel_last, "seq_idx is only supported for channel last layout")
        _check(seq_idx.dtype == torch.int32, f"seq_idx must be int32, got {seq_idx.dtype}")
        _check(seq_idx.is_contiguous(), "seq_idx must be contiguous")
        _check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must have shape (batch, seqlen)")
    return channel_last


def check_forward(x, weight, bias=None, seq_idx=None) -> None:
    """causal_conv1d_fwd's checks, on the tensors as its Python wrapper passes them."""
    _check_common(x, weight, bias, seq_idx)


def check_backward(x, weight, bias, dout, seq_idx) -> torch.Tensor:
    """causal_conv1d_bwd's checks; returns dout as the kernel reads it."""
    channel_last = _check_common(x, weight, bias, seq_idx)
    _check(dout.shape == x.shape, "dout must have x's shape")
    # The C++ side re-lays dout out to match x, then checks it like x.
    if not channel_last and dout.stride(2) != 1:
        dout = dout.contiguous()
    if channel_last and dout.stride(1) != 1:
        dout = dout.transpose(-1, -2).contiguous().transpose(-1, -2)
    if channel_last:
        _check(
            dout.stride(2) % 8 == 0 and dout.stride(0) % 8 == 0,
            f"channel-last needs dout.stride(0) and dout.stride(2) multiples of 8, strides {dout.stride()}",
        )
    return dout


class _CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, activation):
        check_forward(x, weight, bias, seq_idx)
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.activation = activation
        out = torch.empty_like(x)  # the library's output layout
        if x.device.type != "meta":
            out.copy_(causal_conv1d_ref(x, weight, bias, seq_idx, activation))
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias, seq_idx = ctx.saved_tensors
        if dout.stride(2) != 1 and dout.stride(1) != 1:  # the Python wrapper's step
            dout = dout.contiguous()
        dout = check_backward(x, weight, bias, dout, seq_idx)
        dx = torch.empty_like(x)  # the wrapper allocates dx so; the C++ side checks it
        _check(dx.stride(1) == 1 if is_channel_last(x) else dx.stride(2) == 1, "dx layout does not match x")
        if x.device.type == "meta":
            return dx, torch.empty_like(weight), None if bias is None else torch.empty_like(bias), None, None
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (x, weight) + (() if bias is None else (bias,))]
            out = causal_conv1d_ref(*leaves[:2], leaves[2] if bias is not None else None, seq_idx, ctx.activation)
            grads = torch.autograd.grad(out, leaves, dout)
        dx.copy_(grads[0])
        return dx, grads[1], grads[2] if bias is not None else None, None, None


class CausalConv1dStandIn:
    """Callable like `causal_conv1d.causal_conv1d_fn`; records the layout of every x it
    is handed in `calls`: (shape, strides, storage offset, seq_idx given)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(
        self,
        x,
        weight,
        bias=None,
        seq_idx=None,
        initial_states=None,
        return_final_states=False,
        final_states_out=None,
        activation=None,
    ):
        if initial_states is not None or return_final_states or final_states_out is not None:
            raise NotImplementedError("the stand-in does not model conv states")
        if activation not in (None, "silu", "swish"):
            raise NotImplementedError("activation must be None, silu, or swish")
        # The Python wrapper's layout steps before the C++ call.
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        bias = bias.contiguous() if bias is not None else None
        seq_idx = seq_idx.contiguous() if seq_idx is not None else None
        self.calls.append((tuple(x.shape), x.stride(), x.storage_offset(), seq_idx is not None))
        return _CausalConv1dFn.apply(x, weight, bias, seq_idx, activation)


def causal_conv1d_update_standin(
    x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None
):
    """Callable like causal-conv1d 1.7.0's `causal_conv1d_update` (the decode step): x
    (batch, dim) is appended to the rows conv_state_indices (int32, (batch,)) of
    conv_state (rows, dim, state_len >= width - 1), read through its strides and
    updated in place, oldest input first; returns the conv of each row's last width
    inputs. Restates the C++ entry point's checks (dtypes, shapes, indices)."""
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")
    if cache_seqlens is not None:
        raise NotImplementedError("the stand-in does not model circular conv states")
    _check(x.dim() == 2, "the stand-in models x of shape (batch, dim)")
    _check(x.dtype in FLOAT_TYPES and weight.dtype in FLOAT_TYPES, "x and weight must be float32/float16/bfloat16")
    _check(conv_state.dtype == x.dtype, f"conv_state dtype {conv_state.dtype} must equal x dtype {x.dtype}")
    batch, dim = x.shape
    width = weight.shape[-1]
    _check(tuple(weight.shape) == (dim, width), f"weight must have shape (dim, width), got {tuple(weight.shape)}")
    _check(
        conv_state.dim() == 3 and conv_state.shape[1] == dim and conv_state.shape[2] >= width - 1,
        f"conv_state must be (rows, dim, state_len >= width - 1), got {tuple(conv_state.shape)}",
    )
    if conv_state_indices is None:
        _check(conv_state.shape[0] == batch, "conv_state must have batch rows without conv_state_indices")
        rows = torch.arange(batch)
    else:
        _check(conv_state_indices.dtype == torch.int32, "conv_state_indices must be int32")
        _check(tuple(conv_state_indices.shape) == (batch,), "conv_state_indices must have shape (batch,)")
        rows = conv_state_indices.long()
    if bias is not None:
        _check(bias.dtype == weight.dtype and tuple(bias.shape) == (dim,), "bias must be (dim,) of weight's dtype")
    state = conv_state[rows]  # (batch, dim, state_len)
    window = torch.cat([state, x[..., None]], dim=-1)  # oldest first
    out = (window[..., -width:] * weight).sum(-1) + (bias if bias is not None else 0)
    conv_state[rows] = window[..., 1:]  # through the strides of the tensor handed in
    return (F.silu(out) if activation in ("silu", "swish") else out).to(x.dtype)
