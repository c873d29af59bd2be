"""The precision floor of the numerically delicate parts of a model (the scan, dt, the
norms, the exit gate's logit).

A module of its own because the mixer, its ops and the looped model all apply this
one rule, and none of them should import another for it.
"""

from __future__ import annotations

import torch


def upcast(t: torch.Tensor) -> torch.Tensor:
    """At least float32 for the numerically delicate parts (float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))
