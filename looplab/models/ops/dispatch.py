"""Which implementation a Mamba-2 block runs, and why: mamba-ssm's and causal-conv1d's
CUDA kernels, the C++ CPU kernels (the conv and scan of a compiled run,
models/cpu/cpu_sequence.py; the opt-in decode step, models/cpu/cpu_step.py), or this package's
torch ops.

The choice lives here, once, because three readers need the same answer: the mixer
(models/mamba2.py) at every call, `looplab doctor`, which reports kernel_path and
step_implementation, and the benchmarks, which record step_implementation. The
mixer looks these functions up through this module at each call, so a test routes
CPU tensors through the CUDA branch by replacing use_cuda_kernels and
cuda_scan_kernels (or their step twins) here. LOOPLAB_FORCE_TORCH=1 forces the torch
path everywhere, the CPU step too.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from looplab.models.cpu import cpu_sequence, cpu_step
from looplab.models.ops import conv

FORCE_TORCH_ENV = "LOOPLAB_FORCE_TORCH"

IMPORT_ERRORS: dict[str, str] = {}  # kernel module -> why it did not import (looplab doctor names it)


def _guarded_import(*names: tuple[str, str]):
    """The named objects, or None. Imported lazily and guarded broadly: on a CPU build
    or a version mismatch these packages fail with ImportError, OSError or "undefined
    symbol", none of which may break the torch path; the failure is kept in
    IMPORT_ERRORS, so a health check can say why the kernels are off."""
    found = []
    for module, name in names:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except Exception as e:  # noqa: BLE001 - any failure means "no kernels"
            IMPORT_ERRORS[module] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            return None
    return tuple(found)


@functools.cache
def cuda_scan_kernels():
    """(causal_conv1d_fn, mamba_chunk_scan_combined): the prefill kernels, or None.
    Without causal-conv1d the conv runs in torch, with its contract (ops/conv.py)."""
    return _with_conv(
        _guarded_import(("causal_conv1d", "causal_conv1d_fn")),
        _guarded_import(("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined")),
        conv.causal_conv1d_fn_torch,
    )


@functools.cache
def cuda_step_kernels():
    """(causal_conv1d_update, selective_state_update): the single-token kernels of
    decoding, or None. Without causal-conv1d the conv runs in torch (ops/conv.py)."""
    return _with_conv(
        _guarded_import(("causal_conv1d", "causal_conv1d_update")),
        _guarded_import(("mamba_ssm.ops.triton.selective_state_update", "selective_state_update")),
        conv.causal_conv1d_update_torch,
    )


def _with_conv(conv_kernel, triton_kernel, torch_conv):
    """(the conv, the Triton kernel): mamba-ssm's Triton kernel is what the CUDA path
    needs; causal-conv1d's conv is used where it imports, torch's conv (same contract)
    where it does not. None without the Triton kernel."""
    if triton_kernel is None:
        return None
    return (conv_kernel[0] if conv_kernel else torch_conv, triton_kernel[0])


def conv_implementation(step: bool = False) -> str:
    """Which conv the CUDA path's prefill (or, with step, its decode step) runs:
    causal-conv1d's kernel, or torch's and why."""
    kernels = cuda_step_kernels() if step else cuda_scan_kernels()
    torch_conv = conv.causal_conv1d_update_torch if step else conv.causal_conv1d_fn_torch
    if kernels is not None and kernels[0] is torch_conv:
        return f"torch conv (causal-conv1d: {IMPORT_ERRORS.get('causal_conv1d', 'not imported')})"
    return "causal_conv1d_update" if step else "causal_conv1d_fn"


def torch_forced() -> bool:
    """LOOPLAB_FORCE_TORCH=1: every Mamba-2 block runs its torch path, the CPU step too."""
    return os.environ.get(FORCE_TORCH_ENV, "0") == "1"


def _kernels_apply(t: torch.Tensor, kernels) -> bool:
    return t.is_cuda and not torch_forced() and kernels() is not None


def use_cuda_kernels(t: torch.Tensor) -> bool:
    return _kernels_apply(t, cuda_scan_kernels)


def use_cuda_step_kernels(t: torch.Tensor) -> bool:
    return _kernels_apply(t, cuda_step_kernels)


def kernel_path(t: torch.Tensor) -> tuple[str, str]:
    """Which prefill scan a Mamba-2 block on t's device runs, and why: ("cuda", ...) for
    mamba-ssm's and causal-conv1d's kernels, else ("torch", the reason)."""
    if torch_forced():
        return "torch", f"{FORCE_TORCH_ENV}=1"
    if not t.is_cuda:
        return "torch", f"{t.device.type} tensors (the kernels are CUDA's)"
    if cuda_scan_kernels() is None:
        return "torch", "; ".join(f"{m}: {e}" for m, e in IMPORT_ERRORS.items()) or "the kernels did not import"
    return "cuda", f"mamba_chunk_scan_combined + {conv_implementation()}"


def cpu_sequence_kernels_serve() -> bool:
    """Whether a compiled run on a CPU runs its Mamba-2 blocks' conv and scan as C++
    kernels (models/cpu/cpu_sequence.py; models/compiled.py asks): unless
    LOOPLAB_FORCE_TORCH=1, where they build (a failed build warns once: the torch ops)."""
    return not torch_forced() and cpu_sequence.available()


def step_implementation(t: torch.Tensor) -> str:
    """Which single-token step decoding a model of t's device and dtype runs, for
    benchmark records: "cuda" (mamba-ssm's kernels), "cpu-kernel" or "torch"."""
    if use_cuda_step_kernels(t):
        return "cuda"
    if cpu_step.serves(t) and not torch_forced():
        return "cpu-kernel"
    return "torch"
