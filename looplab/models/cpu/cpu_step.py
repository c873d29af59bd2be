"""The Mamba-2 single-token step as a compiled CPU kernel (opt-in: LOOPLAB_CPU_STEP_KERNEL=1).

Decoding a small model on a CPU is bound by per-operation overhead, not arithmetic:
the torch step (Mamba2._step_torch) is ~25 tensor operations per block, and rows
that run a loop alone (skip decoding's running tokens, or depth batching's rows at
different loops, looplab/inference/depth_batching.py) have their states gathered and written
back. The kernel (cpu_step.cpp) does the conv step, the SSM step and the gated norm
in one call, updating each row's conv and SSM states in place at its cache slot, as
mamba-ssm's selective_state_update does on CUDA with state_batch_indices.

It is built on first use (models/cpu/native.py: a C++ compiler and ninja, ~25 s, cached).
Opt-in because that build is slow and needs a toolchain; once asked for, a failed
build is an error, not a silent fallback, so a benchmark never reports the torch
path's figures as the kernel's. float32 and float64 only (a bf16 model keeps
its fp32 SSM state: the torch path runs it).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from looplab.models.cpu import native

CPU_STEP_KERNEL_ENV = "LOOPLAB_CPU_STEP_KERNEL"
SOURCE = Path(__file__).with_name("cpu_step.cpp")


def requested() -> bool:
    return os.environ.get(CPU_STEP_KERNEL_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def kernel():
    """The compiled extension (built on first call)."""
    try:
        return native.build("looplab_cpu_step", SOURCE)
    except Exception as e:
        raise RuntimeError(
            f"{CPU_STEP_KERNEL_ENV}=1 but the CPU step kernel did not build ({native.first_line(e)}); "
            f"install a C++ compiler and ninja, or unset {CPU_STEP_KERNEL_ENV}"
        ) from e


def serves(t: torch.Tensor) -> bool:
    """Whether decoding a model of t's device and dtype runs the kernel (requested, on
    the CPU, float32 or float64): what a benchmark records."""
    return requested() and t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)


def applies(xBC: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> bool:
    """Whether this step runs in the kernel: served, no autograd (it has no backward),
    and states of the inputs' dtype, contiguous (updated in place by slot)."""
    return (
        serves(xBC)
        and not torch.is_grad_enabled()
        and conv.dtype == ssm.dtype == xBC.dtype
        and conv.is_contiguous()
        and ssm.is_contiguous()
    )
