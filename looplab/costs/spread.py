"""Honest timing figures: repeats summarised as median, min and max; a figure whose
repeats spread wider than its stated bound, or that was measured while other work
loaded the machine, is marked noisy and reported as not a result.

On the shared 2-core machines of this project a timing swings 2-10x with other load,
and a difference of two noisy timings went negative. So every time here is one direct
measurement (never a difference), must be finite and > 0, and a figure states the
spread it was judged against.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

SPREAD_BOUND = 0.25  # (max − min) / median over a figure's repeats, above which it is noisy
LOAD_SLACK = 0.5  # load from other work tolerated beyond the cores a run leaves free


@dataclass(frozen=True)
class Timing:
    """Seconds of one quantity over repeats, each a direct measurement."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("a timing needs at least one repeat")
        bad = [s for s in self.seconds if not (math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(
                f"a time must be finite and > 0 seconds, got {bad[0]!r} (a difference of two timings is not a time)"
            )

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)

    @property
    def spread(self) -> float:
        """(max − min) / median: 0 for one repeat."""
        return (self.max - self.min) / self.median


@dataclass(frozen=True)
class Load:
    """The 1-minute load average before and after a measurement, on `cpus` CPUs, of
    which the measurement itself used `threads`."""

    before: float
    after: float
    cpus: int
    threads: int

    @property
    def others(self) -> float:
        """The load of other work: before the run all of it; after, less this run's threads."""
        return max(self.before, self.after - self.threads)

    @property
    def busy(self) -> bool:
        return self.others > max(0, self.cpus - self.threads) + LOAD_SLACK

    def text(self) -> str:
        return f"load {self.before:.2f} → {self.after:.2f} on {self.cpus} CPUs, {self.threads} threads"


@dataclass(frozen=True)
class Figure:
    """One reported number, derived from timings (a rate, a ratio of medians), with
    the timings it came from: noisy when any of them spreads wider than `bound` or the
    machine was busy, and then not a result."""

    name: str
    value: float
    unit: str
    timings: tuple[Timing, ...]
    load: Load | None = None
    bound: float = SPREAD_BOUND
    note: str = ""
    # A reason from outside its timings, e.g. a GEMM of the same run that ran faster than
    # the peak this figure is divided by (the peak was then under-measured).
    contradicted: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"{self.name}: a figure must be finite and > 0, got {self.value!r}")

    @property
    def spread(self) -> float:
        return max(t.spread for t in self.timings)

    @property
    def noisy_because(self) -> str:
        """Why the figure is not a result ("" when it is one)."""
        reasons = []
        if self.spread > self.bound:
            reasons.append(f"spread {self.spread:.0%} > {self.bound:.0%}")
        if self.load is not None and self.load.busy:
            reasons.append(f"machine busy ({self.load.text()})")
        if self.contradicted:
            reasons.append(self.contradicted)
        return "; ".join(reasons)

    @property
    def noisy(self) -> bool:
        return bool(self.noisy_because)

    def shown(self, digits: int = 3) -> str:
        """The value as a table shows it: "noisy" instead of a number that is not a result."""
        return "noisy" if self.noisy else f"{self.value:.{digits}g}"

    def row(self) -> dict:
        return {
            "figure": self.name,
            "value": None if self.noisy else self.value,
            "measured": self.value,
            "unit": self.unit,
            "spread": self.spread,
            "bound": self.bound,
            "noisy": self.noisy_because,
            "note": self.note,
        }
