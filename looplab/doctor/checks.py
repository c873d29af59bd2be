"""A check's result (pass | fail | skip, its figure and reason) and the ways to make
one; a kernel's error against its reference, within a tolerance per dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PASS, FAIL, SKIP = "pass", "fail", "skip"


TOLERANCE = {"float32": 2e-4, "bfloat16": 3e-2, "float64": 1e-9}  # max |Δ| / max |reference|, per dtype


# Triton's tl.dot takes float32 inputs in TF32 on NVIDIA GPUs unless told otherwise
# (input_precision, TRITON_F32_DEFAULT), so mamba-ssm's scan kernels in float32 carry
# TF32's rounding (unit roundoff 2^-11, bf16's is 2^-8): on an H200 a parameter's
# gradient was off by 1.9e-3 of its largest entry, bf16's were 1.9e-2. Its tolerance
# is bf16's scaled by the ratio of the roundoffs (8x smaller). The decode step's
# kernel has no dot and keeps float32's.
TF32_TOLERANCE = TOLERANCE["bfloat16"] / 8


@dataclass
class Check:
    name: str
    status: str
    figure: str = ""
    value: float | None = None
    unit: str = ""
    reason: str = ""
    seconds: float | None = None  # the wall time of the group that made it (run() sets it)

    def line(self) -> str:
        text = f"{self.status.upper():4s}  {self.name:34s} {self.figure}"
        text += f"  ({self.reason})" if self.reason else ""
        return text + (f"  [{self.seconds:.0f} s]" if self.seconds is not None and self.seconds >= 1 else "")


def passed(name: str, figure: str = "", value: float | None = None, unit: str = "") -> Check:
    return Check(name, PASS, figure, value, unit)


def skipped(name: str, reason: str) -> Check:
    return Check(name, SKIP, reason=reason)


def failed(name: str, reason: str, figure: str = "", value: float | None = None, unit: str = "") -> Check:
    return Check(name, FAIL, figure, value, unit, reason)


def guarded(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    """A check that raises fails with its exception in one line, and the others run on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a broken node is what the doctor reports
        return [failed(name, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")]


def max_error(a, b) -> float:
    """max |a − b| / max |b| (b the reference), in float64."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def within(name: str, errors: dict[str, float], dtype, tol: float | None = None) -> Check:
    tol = TOLERANCE[str(dtype).removeprefix("torch.")] if tol is None else tol
    worst = max(errors, key=lambda name: errors[name])
    figure = f"max error {errors[worst]:.1e} ({worst}) against {tol:.0e}"
    return (
        passed(name, figure, errors[worst])
        if errors[worst] <= tol
        else failed(name, f"{worst} is off by {errors[worst]:.1e} > {tol:.0e}", figure, errors[worst])
    )
