"""A Mamba-2 block's work over a sequence as C++ CPU kernels with their backward: the
causal depthwise conv with its SiLU, and the SSM scan, token by token. They run where a
training run compiles on a CPU (train.compile on: models/compiled.py sets each block's
`cpu_kernels`); eager runs keep the torch ops (ops/conv.py, ops/ssd.py), whose floats
the miniature's protocol was fixed with. cpu_step.py is the one-token counterpart.

Why: on a small model the chunked scan (ops/ssd.py) is overhead and memory traffic.
For `debug` (d 64, 8 heads of 16 × 16 states, chunks of 32) it builds a 32 × 32 decay
matrix per chunk and head and runs hundreds of tiny batched products, and Inductor,
which fuses the elementwise work around them, cannot fuse those; nor does it keep the
conv's backward from recomputing a SiLU's exp once per tap. The recurrence itself is
two vector operations per token, head and state row, on a state that stays in L1:
cpu_sequence.cpp runs it as written, and its backward runs it in reverse from states
checkpointed every SPAN tokens (recomputed a span at a time); what that saves is in
docs/benchmarks.md ("The miniature's stages, eager and compiled"). The oracles are ops/reference.py's ssm_scan_ref and causal_conv1d_ref, as the torch ops' are.

Registered as torch custom operators (looplab::ssm_scan, looplab::conv_silu and their
backwards), so that dynamo traces each as one opaque node and Inductor fuses what lies
between them. Built on first use (models/cpu/native.py); where it does not build,
available() warns once and the torch ops run.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

from looplab.models.cpu import native

SOURCE = Path(__file__).with_name("cpu_sequence.cpp")
SPAN = 32  # tokens between the states the scan's forward keeps for its backward


@functools.cache
def kernel():
    """The compiled extension (built on first call); raises what the build raised."""
    return native.build("looplab_cpu_sequence", SOURCE)


@functools.cache
def available() -> bool:
    """Whether the kernels build here; a failure warns once and leaves the torch ops."""
    try:
        kernel()
    except Exception as e:  # noqa: BLE001 - compiler, ninja or header problems
        warnings.warn(
            f"the CPU sequence kernels did not build ({native.first_line(e)}); the torch ops run", stacklevel=2
        )
        return False
    return True


def applies(x: torch.Tensor) -> bool:
    """Whether the kernels take tensors of x's device and dtype: float32 and float64 on a
    CPU (where they are available(): asked once, where a run decides to use them)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


# ---- the conv and its SiLU -------------------------------------------------------------


def conv_silu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None = None
) -> torch.Tensor:
    """F.silu(ops/conv.py's causal_depthwise_conv(x, weight, bias, seq_idx)): x (b, l, c),
    weight (c, 1, k), bias (c,) or None, seq_idx (b, l) or None."""
    # Contiguous here, where Inductor can write them so: the operator saves its inputs for
    # its backward, which would copy a view again.
    return torch.ops.looplab.conv_silu(x.contiguous(), weight, bias, _long(seq_idx))


def _conv_silu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None
) -> torch.Tensor:
    return kernel().conv_silu_forward(*_dense(x, weight, bias, seq_idx))


def _conv_silu_fake(x, weight, bias, seq_idx):
    return x.new_empty(x.shape)


def _conv_silu_backward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None, dy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx, dweight and dbias (empty without a bias)."""
    dx, dweight, dbias = kernel().conv_silu_backward(*_dense(x, weight, bias, seq_idx, dy))
    return dx, dweight, dbias


def _conv_silu_backward_fake(x, weight, bias, seq_idx, dy):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), x.new_empty(0 if bias is None else bias.shape[0])


def _conv_setup(ctx, inputs, output):
    x, weight, bias, seq_idx = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx)


def _conv_backward(ctx, dy):
    x, weight, bias, seq_idx = ctx.saved_tensors
    dx, dweight, dbias = torch.ops.looplab.conv_silu_backward(x, weight, bias, seq_idx, dy)
    return dx, dweight, None if bias is None else dbias, None


# ---- the SSM scan ------------------------------------------------------------------------


def ssm_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    seq_idx: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ops/ssd.py's ssd_chunked contract (without state_at): x (b, l, h, p), dt (b, l, h)
    positive, A (h,) negative, B and C (b, l, g, n); seq_idx (b, l) non-decreasing resets
    the state where it changes; initial_state (b, h, p, n). Returns y (b, l, h, p) and
    the final state (b, h, p, n)."""
    if seq_idx is not None and initial_state is not None:
        raise ValueError("ssm_scan: initial_state with seq_idx is not supported")
    x, dt, B, C = (t.contiguous() for t in (x, dt, B, C))  # (as conv_silu's)
    y, final, _ = torch.ops.looplab.ssm_scan(x, dt, A, B, C, _long(seq_idx), initial_state)
    return y, final


def _long(seq_idx: torch.Tensor | None) -> torch.Tensor | None:
    return None if seq_idx is None else seq_idx.long()


def _dense(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The kernels read their tensors contiguous (what autograd saved, or Inductor passes,
    may be views)."""
    return [None if t is None else t.contiguous() for t in tensors]


def _spans(length: int) -> int:
    return -(-length // SPAN)


def _ssm_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    seq_idx: torch.Tensor | None,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, the final state, and the checkpointed states (b, h, spans, p, n) the backward reads."""
    y, final, checkpoints = kernel().scan_forward(*_dense(x, dt, A, B, C, seq_idx, initial_state), SPAN)
    return y, final, checkpoints


def _ssm_scan_fake(x, dt, A, B, C, seq_idx, initial_state):
    b, length, h, p = x.shape
    n = B.shape[-1]
    return x.new_empty(x.shape), x.new_empty(b, h, p, n), x.new_empty(b, h, _spans(length), p, n)


def _ssm_scan_backward(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    seq_idx: torch.Tensor | None,
    checkpoints: torch.Tensor,
    dy: torch.Tensor,
    dfinal: torch.Tensor | None,
    with_initial: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx, ddt, dA, dB, dC and d(initial_state) (empty without one)."""
    dx, ddt, dA, dB, dC, dinit = kernel().scan_backward(
        *_dense(x, dt, A, B, C, seq_idx, checkpoints, dy, dfinal), with_initial, SPAN
    )
    return dx, ddt, dA, dB, dC, dinit


def _ssm_scan_backward_fake(x, dt, A, B, C, seq_idx, checkpoints, dy, dfinal, with_initial):
    b, _, h, p = x.shape
    init = x.new_empty(b, h, p, B.shape[-1]) if with_initial else x.new_empty(0)
    return (
        x.new_empty(x.shape),
        dt.new_empty(dt.shape),
        A.new_empty(A.shape),
        B.new_empty(B.shape),
        C.new_empty(C.shape),
        init,
    )


def _scan_setup(ctx, inputs, output):
    x, dt, A, B, C, seq_idx, initial_state = inputs
    ctx.save_for_backward(x, dt, A, B, C, seq_idx, output[2])
    ctx.with_initial = initial_state is not None


def _scan_backward(ctx, dy, dfinal, _dcheckpoints):
    x, dt, A, B, C, seq_idx, checkpoints = ctx.saved_tensors
    dx, ddt, dA, dB, dC, dinit = torch.ops.looplab.ssm_scan_backward(
        x, dt, A, B, C, seq_idx, checkpoints, dy, dfinal, ctx.with_initial
    )
    return dx, ddt, dA, dB, dC, None, dinit if ctx.with_initial else None


# ---- registration ------------------------------------------------------------------------


def _define(name: str, fn, fake, backward=None, setup=None) -> None:
    op = torch.library.custom_op(f"looplab::{name}", fn, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup)


# Once a process: another copy of this module (an exported Hugging Face folder's, which
# carries the model's source but not the C++) finds the operators defined and uses them.
if not hasattr(torch.ops.looplab, "ssm_scan"):
    _define("conv_silu_backward", _conv_silu_backward, _conv_silu_backward_fake)
    _define("conv_silu", _conv_silu, _conv_silu_fake, _conv_backward, _conv_setup)
    _define("ssm_scan_backward", _ssm_scan_backward, _ssm_scan_backward_fake)
    _define("ssm_scan", _ssm_scan, _ssm_scan_fake, _scan_backward, _scan_setup)
