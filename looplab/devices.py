"""Where a computation runs and at which precision: the device a command or a stage
asks for (`auto`, `cpu`, `cuda[:N]`), and the autocast that training, evaluation,
decoding and the benchmarks run their forward passes under.

One module below every room that computes (training, evaluation, inference, costs,
the doctor and the command line), so none of them imports another for it.
"""

from __future__ import annotations

import contextlib

import torch

from looplab.errors import ConfigError


def resolve_device(name: str | torch.device | None) -> torch.device:
    """auto (or None): CUDA when there is one, else CPU; cuda[:N] needs a GPU."""
    name = str(name or "auto")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} is invalid here: no CUDA device; allowed: auto | cpu")
    return torch.device(name)


def resolved_precision(precision: str, device: torch.device) -> str:
    """train.precision on `device`: 'auto' is bf16 on CUDA and fp32 on a CPU."""
    return ("bf16" if device.type == "cuda" else "fp32") if precision == "auto" else precision


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA by default ('auto'), plain fp32 on CPU; 'bf16' forces it
    on either (CPU autocast on a CPU: the benchmark's --dtype bf16), 'fp32' never."""
    if resolved_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
