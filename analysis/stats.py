"""The statistics every verdict and every summary sentence rests on.

  Interval          a mean over seeds with its interval and what it was built from (sd,
                    se, df), so that it can be read again at another level (a family-wise
                    correction) or tested. sides 2: a two-sided interval; sides 1: the two
                    one-sided bounds, each alone at the level (a claim tested one-sided
                    against a bound reads the bound on its own side)
  mean_interval     the mean of per-seed values, Student-t
  difference        arm a minus arm b by seed: paired (the mean of the per-seed
                    differences) or Welch's two independent means
  p_value           the t test of mean = null: two-sided, or one-sided in a direction
  exact_p           Fisher's exact test on held-out counts pooled over seeds, for a count
                    measure whose seeds do not vary at all (the t test has no spread to read)
  holm              Holm's step-down over a fixed family, and the level at which each
                    member's interval is shown so that no interval contradicts a decision
  seeds_for_power   the seeds at which a t test of an effect, given its spread, has the
                    power asked (the protocol's power analysis)

Nothing here knows a claim; analysis/claims.py applies these to the paper's claims and
analysis/prose.py to the documents' summary sentences.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Iterable

CONFIDENCE = 0.95
POWER = 0.8  # the power a protocol's seeds are sized for
MAX_SEEDS = 1000  # seeds_for_power gives up beyond this (an effect too small to size for)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t at (fractional) df degrees of freedom."""
    from scipy.stats import t  # imported here: scipy.stats takes most of a second to import

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """A mean with its interval (None when n < 2 or the values do not spread) over n
    values, and what the interval was built from: sd, the spread of the values across
    seeds (the per-seed values or differences; for Welch the larger arm's), the t
    statistic's standard error se and degrees of freedom df, and sides (2: mean ±
    t_{(1+c)/2}·se; 1: each bound one-sided at c, mean ± t_c·se)."""

    mean: float | None
    low: float | None
    high: float | None
    n: int
    paired: bool | None = None  # for a difference: paired over seeds, or Welch's
    sd: float | None = None
    se: float | None = None
    df: float | None = None
    sides: int = 2

    @property
    def no_spread(self) -> bool:
        """Every seed gave exactly the same value (or difference): no t test exists."""
        return self.se == 0.0

    def text(self, digits: int = 2, unit: str = "", signed: bool = True) -> str:
        """'+3.10 % [+1.20, +5.00] (n=3)'; signed=False for ratios: '1.70x [1.60, 1.80] (n=3)'."""
        if self.mean is None:
            return "n/a"
        sign = "+" if signed else ""
        body = f"{self.mean:{sign}.{digits}f}{unit}"
        if self.no_spread:
            return f"{body} (n={self.n}, no spread across seeds)"
        if self.low is None or self.high is None:
            return f"{body} (n={self.n}, no interval)"
        return f"{body} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}] (n={self.n})"

    def at(self, confidence: float) -> "Interval":
        """The same estimate's interval at another confidence (mean ± t·se)."""
        if self.mean is None or self.se is None or self.df is None or self.no_spread:
            return self
        half = t_quantile(_upper(confidence, self.sides), self.df) * self.se
        return replace(self, low=self.mean - half, high=self.mean + half)

    def mapped(self, f) -> "Interval":
        """The interval on another scale, a monotone increasing f applied to mean and
        endpoints (the test statistics stay on the tested scale)."""

        def g(v):
            return None if v is None else f(v)

        return replace(self, mean=g(self.mean), low=g(self.low), high=g(self.high))


def _upper(confidence: float, sides: int) -> float:
    """The t quantile a bound at this confidence reads: (1 + c)/2 two-sided, c one-sided."""
    if sides not in (1, 2):
        raise ValueError(f"sides={sides!r} is invalid; allowed: 1 | 2")
    return confidence if sides == 1 else 0.5 + confidence / 2


def _clean(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_interval(values: Iterable[float | None], confidence: float = CONFIDENCE, sides: int = 2) -> Interval:
    """Mean ± t·s/√n over the finite values (no interval for n < 2; none either when
    every value is the same: Interval.no_spread)."""
    v = _clean(values)
    if not v:
        return Interval(None, None, None, 0, sides=sides)
    mean = statistics.fmean(v)
    if len(v) < 2:
        return Interval(mean, None, None, len(v), sides=sides)
    sd = statistics.stdev(v)
    if sd == 0.0:
        return Interval(mean, None, None, len(v), sd=0.0, se=0.0, df=len(v) - 1, sides=sides)
    se = sd / math.sqrt(len(v))
    half = t_quantile(_upper(confidence, sides), len(v) - 1) * se
    return Interval(mean, mean - half, mean + half, len(v), sd=sd, se=se, df=len(v) - 1, sides=sides)


def difference(a: dict, b: dict, *, paired: bool, confidence: float = CONFIDENCE, sides: int = 2) -> Interval:
    """Arm a minus arm b, values keyed by seed. paired: the mean of the per-seed
    differences over the seeds both have, with its t interval (the arms share what a
    seed fixes: a parent stage, or the data order and initialisation seed, so a seed's
    difference removes it). Unpaired: the difference of the means with Welch's interval
    (Welch–Satterthwaite degrees of freedom); no interval when either arm has fewer
    than two values."""
    if paired:
        seeds = sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None)
        return replace(mean_interval([a[s] - b[s] for s in seeds], confidence, sides), paired=True)
    xa, xb = _clean(a.values()), _clean(b.values())
    if not xa or not xb:
        return Interval(None, None, None, min(len(xa), len(xb)), paired=False, sides=sides)
    mean = statistics.fmean(xa) - statistics.fmean(xb)
    n = min(len(xa), len(xb))
    if len(xa) < 2 or len(xb) < 2:
        return Interval(mean, None, None, n, paired=False, sides=sides)
    va, vb = statistics.variance(xa) / len(xa), statistics.variance(xb) / len(xb)
    se = math.sqrt(va + vb)
    sd = math.sqrt(max(statistics.variance(xa), statistics.variance(xb)))
    if se == 0.0:
        return Interval(mean, None, None, n, paired=False, sd=0.0, se=0.0, df=float(len(xa) + len(xb) - 2))
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t_quantile(_upper(confidence, sides), df) * se
    return Interval(mean, mean - half, mean + half, n, paired=False, sd=sd, se=se, df=df, sides=sides)


def p_value(interval: Interval, null: float = 0.0, direction: int = 1) -> float | None:
    """The t test of mean = null: two-sided for a two-sided interval; for a one-sided
    one (sides 1), the p of the test against the null in `direction` (+1: is the mean
    above the null; -1: below it). None without a test (n < 2, or no spread)."""
    if interval.mean is None or interval.se is None or interval.df is None or interval.no_spread:
        return None
    from scipy.stats import t

    stat = (interval.mean - null) / interval.se
    if interval.sides == 2:
        return float(2 * t.sf(abs(stat), interval.df))
    return float(t.sf(stat, interval.df) if direction == 1 else t.cdf(stat, interval.df))


def exact_p(correct_a: int, total_a: int, correct_b: int, total_b: int, *, sides: int = 2, direction: int = 1) -> float:
    """Fisher's exact test that arm a's held-out accuracy equals arm b's, from counts
    pooled over seeds (correct out of total examples each). Two-sided, or one-sided in
    `direction` (+1: a above b)."""
    from scipy.stats import fisher_exact

    alternative = "two-sided" if sides == 2 else ("greater" if direction == 1 else "less")
    table = [[correct_a, total_a - correct_a], [correct_b, total_b - correct_b]]
    return float(fisher_exact(table, alternative=alternative).pvalue)


@dataclass(frozen=True)
class HolmStep:
    """One family member's outcome: its adjusted p-value, whether it is rejected, and
    the confidence its interval is shown at so that the interval excludes the null
    exactly when it is rejected."""

    p_adjusted: float
    rejected: bool
    level: float


def holm(p_values: list[float | None], alpha: float) -> list[HolmStep]:
    """Holm's step-down over a fixed family of m = len(p_values) tests, in their order. A
    member without a test (None) counts as p = 1: it holds its place, so m never
    depends on which claims produced a p-value. Sorted ascending, the k-th (k = 1..m) is
    rejected while p_(j) ≤ α/(m − j + 1) for every j ≤ k; its adjusted p-value is
    max_{j ≤ k} min(1, (m − j + 1) p_(j)). Holm-compatible intervals: a rejected member
    at the level its step tested, 1 − α/(m − k + 1) (its interval excludes the null);
    with r rejected, every other member at 1 − α/(m − r) (its interval includes the null,
    as its p exceeds α/(m − r))."""
    m = len(p_values)
    ps = [1.0 if p is None else float(p) for p in p_values]
    order = sorted(range(m), key=ps.__getitem__)
    adjusted, running, rejected = [0.0] * m, 0.0, 0
    for k, i in enumerate(order):  # k = 0..m-1: the (k+1)-th smallest, compared with α/(m − k)
        running = max(running, min(1.0, (m - k) * ps[i]))
        adjusted[i] = running
        if rejected == k and ps[i] <= alpha / (m - k):  # every smaller one rejected, and this one too
            rejected += 1
    rank = {i: k for k, i in enumerate(order)}
    return [
        HolmStep(adjusted[i], rank[i] < rejected, 1.0 - alpha / (m - (rank[i] if rank[i] < rejected else rejected)))
        for i in range(m)
    ]


def power(n: int, effect: float, sd: float, alpha: float, *, sides: int = 2) -> float:
    """The power of a t test over n per-seed values (one per seed, or paired
    differences) at level alpha to detect a true mean `effect` away from the null, sd
    the spread of the per-seed values: the noncentral t's mass beyond the critical t."""
    from scipy.stats import nct
    from scipy.stats import t as student

    if n < 2 or sd <= 0:
        return float("nan")
    df = n - 1
    shift = abs(effect) / (sd / math.sqrt(n))  # the t statistic's noncentrality
    critical = float(student.ppf(1 - alpha / sides, df))
    reach = _finite_or(float(nct.sf(critical, df, shift)), lambda: 1.0 - float(nct.cdf(critical, df, shift)))
    if sides == 2:  # the far tail: vanishing for a shift this large, where scipy may answer nan
        reach += _finite_or(float(nct.cdf(-critical, df, shift)), lambda: 0.0)
    return min(1.0, reach)


def _finite_or(value: float, fallback) -> float:
    return value if math.isfinite(value) else fallback()


def seeds_for_power(effect: float, sd: float, alpha: float, *, sides: int = 2, target: float = POWER) -> int | None:
    """The fewest seeds (≥ 2) at which `power` reaches `target`; None when no n up to
    MAX_SEEDS does (an effect of zero, or one too small against its spread)."""
    if effect == 0 or not math.isfinite(effect) or sd <= 0:
        return None

    def enough(n: int) -> bool:
        return power(n, effect, sd, alpha, sides=sides) >= target

    lo = hi = 2
    if enough(lo):
        return lo
    while not enough(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while hi - lo > 1:  # power grows with n: bisect for the first n that reaches the target
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi
