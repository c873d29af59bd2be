"""The paper's claims as computed verdicts (DESIGN.md, "Claims and verdicts").

A claim compares two arms on one measure at matched compute, over seeds. The pieces:

  interpolate     piecewise-linear through one curve's (executed loops, value) points;
                  None outside them: a curve is never extrapolated
  trial_measures  one row per trial: each curve's mean CE at the claim's executed loops
                  (the skip sweep over q with full compute at R; the fixed-depth curve of
                  forced depths 1..R, of the trial's own final stage and of its pre-training)
  mean_interval   the mean over seeds with its Student-t interval
  difference      arm A minus arm B with its interval: paired over seeds (the mean of the
                  per-seed differences) when both arms continue one parent stage, else
                  Welch's interval for two independent means
  verdict         "reproduced (direction)" when the interval excludes the null value on
                  the paper's side, "not reproduced" when it excludes it on the other side,
                  else "inconclusive" (an interval that includes the null, or none at all)

Mean CE (loss), not perplexity, is interpolated: a token-level mixture of two policies has
the mixture's mean CE at the mixture's mean loops, so a straight line in (loops, loss) is
what mixing two measured policies achieves; perplexity is exp(loss) at the end.

CLAIMS holds the paper's four headline claims (and their sub-claims) with the paper's own
figure beside each; claim_rows computes ours from the evaluation points
(analysis.points) and the prefill benchmark records (sweeps/paper_mini.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import polars as pl

from analysis import names
from analysis.aggregate import student_t_quantile
from analysis.errors import AnalysisError
from analysis.load import PARAM
from looplab import tracking
from looplab.policy import FORCED, FULL, SKIP
from looplab.stages import DEFAULT_STAGE

SEARCHED = PARAM + tracking.SEARCH_PARAM  # a trial's searched values: params.search.<name>

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced (direction)", "not reproduced", "inconclusive"
NO_SPREAD = "inconclusive (no spread)"
CONFIDENCE = 0.95
# "Within a few percent of full compute": the paper reports +3-4 % (Fig. 2); the verdict
# asks whether CHASE's increase lies below this bound.
FEW_PERCENT = 5.0


# ---- the numbers -------------------------------------------------------------------------


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """The piecewise-linear curve through (xs, ys) at x; None when x lies outside
    [min xs, max xs] or there are no points. Points at the same x are averaged first."""
    pts: dict[float, list[float]] = {}
    for a, b in zip(xs, ys):
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
            pts.setdefault(float(a), []).append(float(b))
    if not pts:
        return None
    curve = sorted((a, sum(b) / len(b)) for a, b in pts.items())
    if not curve[0][0] - 1e-9 <= x <= curve[-1][0] + 1e-9:
        return None
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[0][1] if abs(x - curve[0][0]) <= 1e-9 else curve[-1][1]


def mean_difference(
    a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]]
) -> float | None:
    """The mean of curve a minus curve b (each piecewise-linear through its (xs, ys)) over
    the x range both cover; exact: the difference is linear between the union of the
    two curves' breakpoints, so the trapezoid rule over them is its integral. None when
    the ranges do not overlap or meet in a point."""

    def points(xs, ys):
        return sorted(
            {
                float(x)
                for x, y in zip(xs, ys)
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
            }
        )

    pa, pb = points(*a), points(*b)
    if not pa or not pb:
        return None
    lo, hi = max(pa[0], pb[0]), min(pa[-1], pb[-1])
    if hi - lo <= 1e-9:
        return None
    cuts = sorted({lo, hi, *(x for x in pa + pb if lo < x < hi)})
    diff = [interpolate(*a, x) - interpolate(*b, x) for x in cuts]
    area = sum((x1 - x0) * (d0 + d1) / 2 for x0, x1, d0, d1 in zip(cuts, cuts[1:], diff, diff[1:]))
    return area / (hi - lo)


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided interval (None when n < 2) over n values, and what the
    interval was built from: sd, the spread of the values across seeds (the per-seed
    values, or differences; for Welch the larger arm's), and the t statistic's standard
    error se and degrees of freedom df, so that the same estimate can be re-read at
    another confidence (a family-wise correction, `at`) or tested (`p_value`)."""

    mean: float | None
    low: float | None
    high: float | None
    n: int
    paired: bool | None = None  # for a difference: paired over seeds, or Welch's
    sd: float | None = None
    se: float | None = None
    df: float | None = None

    def text(self, digits: int = 2, unit: str = "", signed: bool = True) -> str:
        """'+3.10 % [+1.20, +5.00] (n=3)'; signed=False for ratios: '1.70x [1.60, 1.80] (n=3)'."""
        if self.mean is None:
            return "n/a"
        sign = "+" if signed else ""
        body = f"{self.mean:{sign}.{digits}f}{unit}"
        if self.low is None:
            return f"{body} (n={self.n}, no interval)"
        return f"{body} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}] (n={self.n})"

    def at(self, confidence: float) -> "Interval":
        """The same estimate's interval at another confidence (mean ± t·se)."""
        if self.mean is None or self.se is None or self.df is None:
            return self
        half = t_quantile(0.5 + confidence / 2, self.df) * self.se
        return replace(self, low=self.mean - half, high=self.mean + half)

    def mapped(self, f) -> "Interval":
        """The interval on another scale, a monotone increasing f applied to mean and
        endpoints (the test statistics stay on the tested scale)."""

        def g(v):
            return None if v is None else f(v)

        return replace(self, mean=g(self.mean), low=g(self.low), high=g(self.high))


def _clean(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_interval(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t_{(1+c)/2, n-1} · s/√n over the finite values (no interval for n < 2)."""
    v = _clean(values)
    if not v:
        return Interval(None, None, None, 0)
    mean = statistics.fmean(v)
    if len(v) < 2:
        return Interval(mean, None, None, len(v))
    sd = statistics.stdev(v)
    se = sd / math.sqrt(len(v))
    half = student_t_quantile(0.5 + confidence / 2, len(v) - 1) * se
    return Interval(mean, mean - half, mean + half, len(v), sd=sd, se=se, df=len(v) - 1)


def difference(a: dict, b: dict, *, paired: bool, confidence: float = CONFIDENCE) -> Interval:
    """Arm a minus arm b, values keyed by seed. paired: the mean of the per-seed
    differences over the seeds both have, with its t interval (the arms continue one
    parent, so a seed's difference removes what the parent shares). Unpaired: the
    difference of the means with Welch's interval (Welch–Satterthwaite degrees of
    freedom); no interval when either arm has fewer than two values."""
    if paired:
        seeds = sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None)
        return replace(mean_interval([a[s] - b[s] for s in seeds], confidence), paired=True)
    xa, xb = _clean(a.values()), _clean(b.values())
    if not xa or not xb:
        return Interval(None, None, None, min(len(xa), len(xb)), paired=False)
    mean = statistics.fmean(xa) - statistics.fmean(xb)
    n = min(len(xa), len(xb))
    if len(xa) < 2 or len(xb) < 2:
        return Interval(mean, None, None, n, paired=False)
    va, vb = statistics.variance(xa) / len(xa), statistics.variance(xb) / len(xb)
    se = math.sqrt(va + vb)
    sd = math.sqrt(max(statistics.variance(xa), statistics.variance(xb)))
    if se == 0:  # no spread at all: a zero-width interval, which verdict() never reads as evidence
        return Interval(mean, mean, mean, n, paired=False, sd=0.0, se=0.0, df=float(len(xa) + len(xb) - 2))
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t_quantile(0.5 + confidence / 2, df) * se
    return Interval(mean, mean - half, mean + half, n, paired=False, sd=sd, se=se, df=df)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t at (fractional) df degrees of freedom."""
    from scipy.stats import t  # fractional degrees of freedom (Welch)

    return float(t.ppf(p, df))


def no_spread(interval: Interval, resolution: float) -> bool:
    """Whether the values do not vary across seeds by as much as the metric's declared
    resolution (the smallest difference it can show: one example of a 500-example
    accuracy is 0.2 points). A zero-width interval then measures the metric's
    granularity, not the seeds' agreement, and is no evidence by itself."""
    return interval.sd is not None and _within(interval.sd, resolution)


def _within(value: float, resolution: float) -> bool:
    """|value| ≤ resolution, up to floating point (100 − 99.8 is 0.2000000000000028)."""
    return abs(value) <= resolution * (1 + 1e-9) + 1e-12


def verdict(interval: Interval, direction: int, null: float = 0.0, resolution: float = 0.0) -> str:
    """The paper's direction is measure > null (direction +1) or measure < null (-1).
    Values that do not spread across seeds by more than `resolution` (no_spread) give
    NO_SPREAD unless the mean lies more than one resolution from the null, which the
    metric can show whatever the seeds' agreement: then its side decides."""
    if direction not in (1, -1):
        raise ValueError(f"direction={direction!r} is invalid; allowed: 1 | -1")
    if interval.low is None or interval.high is None:
        return INCONCLUSIVE
    if no_spread(interval, resolution):
        if _within(interval.mean - null, resolution):
            return NO_SPREAD
        return REPRODUCED if (interval.mean > null) == (direction == 1) else NOT_REPRODUCED
    if interval.low > null:
        return REPRODUCED if direction == 1 else NOT_REPRODUCED
    if interval.high < null:
        return REPRODUCED if direction == -1 else NOT_REPRODUCED
    return INCONCLUSIVE


def p_value(interval: Interval, null: float = 0.0, resolution: float = 0.0) -> float | None:
    """Two-sided p-value of the t test of mean = null (None without an interval). Values
    with no spread (no_spread) are decided as verdict() decides them: 0 when the mean
    lies more than one resolution from the null, else 1."""
    if interval.mean is None or interval.se is None or interval.df is None:
        return None
    if no_spread(interval, resolution) or interval.se == 0:
        return 1.0 if _within(interval.mean - null, resolution) else 0.0
    from scipy.stats import t

    return float(2 * t.sf(abs(interval.mean - null) / interval.se, interval.df))


def increase_pct(loss: float | None, reference: float | None) -> float | None:
    """Perplexity increase over a reference in percent, from mean CEs: 100 (e^(l − l_ref) − 1)."""
    if loss is None or reference is None:
        return None
    return 100.0 * math.expm1(loss - reference)


# ---- the claims ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims and the rule that judges ours: its direction against a
    null value, and the metric's resolution (the smallest difference the metric can
    show, below which seeds that do not spread prove nothing: no_spread). A log_ratio
    claim is tested on the difference of log perplexities (Welch on the log scale) and
    shown as that ratio's percent, 100 (e^d − 1); its null and resolution are given in
    the percent it is shown in."""

    id: str
    statement: str  # what the paper claims
    measure: str  # what we compute, and its unit
    paper: str  # the paper's own figure for it
    direction: int  # +1: the paper's direction is measure > null; -1: measure < null
    resolution: float
    null: float = 0.0
    unit: str = ""
    log_ratio: bool = False

    @property
    def signed(self) -> bool:
        """A difference shows its sign; a ratio (null 1) does not."""
        return self.null != 1.0

    def rule(self) -> dict:
        """What decides this claim's verdict (a protocol's content hash covers it)."""
        return {
            "direction": self.direction,
            "null": self.null,
            "resolution": self.resolution,
            "log_ratio": self.log_ratio,
        }

    def _tested(self, v: float) -> float:
        return math.log1p(v / 100.0) if self.log_ratio else v

    def shown(self, interval: Interval) -> Interval:
        """The interval in the unit the claim is shown in."""
        return interval.mapped(lambda v: 100.0 * math.expm1(v)) if self.log_ratio else interval

    def verdict(self, tested: Interval) -> str:
        return verdict(tested, self.direction, self._tested(self.null), self._tested(self.resolution))

    def p_value(self, tested: Interval) -> float | None:
        return p_value(tested, self._tested(self.null), self._tested(self.resolution))

    def text(self, tested: Interval) -> str:
        return self.shown(tested).text(2, self.unit, self.signed)


PPL_RESOLUTION = 0.01  # %: a mean CE over 8,192 held-out tokens, logged to float precision, shows 0.01 %
SPEED_RESOLUTION = 0.01  # x: a timing ratio's last digit worth reading
PHOP_RESOLUTION = 100 / 500  # points: one example of phop-debug's 500 held-out examples
MANO_RESOLUTION = 100 / 500  # points: one example of mano-debug's 500 held-out examples

CLAIMS: dict[str, Claim] = {
    c.id: c
    for c in (
        Claim(
            "C1",
            "looping helps at equal parameters (N⊗R beats N⊗1)",
            "p-hop exact match of N⊗R minus N⊗1, points",
            "p-hop p=16: 1⊗6 99.51 % vs 1⊗1 38.32 % (+61.2 points, Table 2)",
            +1,
            PHOP_RESOLUTION,
            unit=" pt",
        ),
        Claim(
            "C1-mano",
            "looping helps at equal parameters on Mano (N⊗R beats N⊗1)",
            "Mano exact match (ℓ = L) of N⊗R minus N⊗1, points",
            "L=10: 4⊗6 99.21 % vs 4⊗1 55.60 % (+43.6 points, Table 1)",
            +1,
            MANO_RESOLUTION,
            unit=" pt",
        ),
        Claim(
            "C1-LM",
            "looping helps at equal parameters, language modelling",
            "perplexity of N⊗1 over N⊗R, % (positive: the looped model is better)",
            "140M Mamba-2: loop4 14.68 vs baseline 15.80 (+7.6 %, Table 4); 6⊗4 19.98 vs 6⊗1 21.96 (+9.9 %, Table 3)",
            +1,
            PPL_RESOLUTION,
            unit=" %",
            log_ratio=True,
        ),
        Claim(
            "C1-depth",
            "where NR⊗1 stands: the iso-depth (iso-FLOPs) non-looped model stays ahead",
            "perplexity of N⊗R over NR⊗1, % (positive: the deeper non-looped model is better)",
            "24⊗1 16.15 vs 6⊗4 19.98 (+23.7 %, Table 3)",
            +1,
            PPL_RESOLUTION,
            unit=" %",
            log_ratio=True,
        ),
        Claim(
            "C2",
            "adaptive exits beat forced fixed depth at equal executed loops",
            "perplexity of the fixed-loop model forced to d loops over CHASE skip at the same executed loops, mean "
            "over the loops both cover, %",
            "140M at ~2 loops: forced 2 loops PPL 12,907 vs CHASE skip 16.45 at 2.15 loops (Fig. 3, App. E)",
            +1,
            PPL_RESOLUTION,
            unit=" %",
        ),
        Claim(
            "C2-own",
            "(stronger) adaptive exits beat the same gated model at a forced depth",
            "perplexity of CHASE's own model forced to d loops over its skip at the same executed loops, mean over "
            "the loops both cover, %",
            "not reported: the paper forces the fixed-loop model",
            +1,
            PPL_RESOLUTION,
            unit=" %",
        ),
        Claim(
            "C3",
            "cache holes: stock Ouro skip degrades far more than CHASE skip at about half the loops",
            "Ouro's perplexity increase over its full compute minus CHASE's, at R/2 executed loops, points of %",
            "370M: Ouro up to +4788 %, CHASE +3-4 % (Fig. 2)",
            +1,
            PPL_RESOLUTION,
            unit=" pt",
        ),
        Claim(
            "C3-few",
            "CHASE skip stays within a few percent of full compute",
            f"CHASE's perplexity increase over its full compute at R/2 executed loops, % (bound {FEW_PERCENT:g} %)",
            "+3-4 % across the range (Fig. 2)",
            -1,
            PPL_RESOLUTION,
            null=FEW_PERCENT,
            unit=" %",
        ),
        Claim(
            "C4",
            "skip turns saved loops into prefill speedup where compute binds",
            "prefill speedup of skip over full at the largest batch, × (null 1)",
            "1.73x (140M) / 1.83x (370M) at batch 64, q=0.2 (Table 5)",
            +1,
            SPEED_RESOLUTION,
            null=1.0,
            unit="x",
        ),
        Claim(
            "C4-batch1",
            "and not at batch 1, where the prefill is latency-bound",
            "prefill speedup at batch 1, × (the paper: no faster than full, i.e. below 1)",
            "0.95-0.97x at batch 1 (140M, Table 5)",
            -1,
            SPEED_RESOLUTION,
            null=1.0,
            unit="x",
        ),
        Claim(
            "C4-padded",
            "the same speedup in the paper's layout (padded survivors, bf16 autocast)",
            "prefill speedup of skip over full at the largest batch with survivors padded to each batch's largest "
            "count under bf16 autocast, × (null 1)",
            "1.73x (140M) at batch 64, q=0.2, padded bf16 on a GPU at L 2048 (Table 5)",
            +1,
            SPEED_RESOLUTION,
            null=1.0,
            unit="x",
        ),
        Claim(
            "C4-growth",
            "the speedup grows as the batch makes the prefill compute-bound",
            "speedup at the largest batch minus at batch 1, paired by model",
            "1.73x - 0.96x = +0.77 (140M, batch 64 vs 1, q=0.2, Table 5)",
            +1,
            SPEED_RESOLUTION,
            unit="x",
        ),
    )
}


def target_loops(n_loops: int) -> float:
    """ "About half the loops": R/2, and 1.5 at R = 2 (whose half, 1 loop, is the floor of
    every curve: every token exits after its first loop)."""
    return max(n_loops / 2.0, 1.5)


# ---- per trial ---------------------------------------------------------------------------------


def trial_measures(points: pl.DataFrame, *, loops_at=target_loops) -> pl.DataFrame:
    """One row per trial: experiment, trial_run_id, trial_key (its final stage's key), seed,
    method, the searched params
    (params.search.*, the seed aside), n_layers, n_loops, loops (the claim's executed
    loops, loops_at(R)), full_loss, full_ppl, full_accuracy, and at those loops each
    curve's mean CE (None where the curve does not reach them):
      skip_loss      the final stage's skip sweep over q, with full compute at R
      forced_loss    the final stage's own fixed-depth curve (forced 1..R-1, full at R)
      fixed_loss     the pre-training stage's fixed-depth curve (the paper's "Fixed Exit
                     Depth": the fixed-loop model forced to d loops)
    skip_increase  skip_loss's perplexity increase over full_loss, %
    skip_min_loops the fewest loops the skip sweep executed (why skip_loss may be None)
    fixed_over_skip, forced_over_skip  the fixed-depth curve (pre-training's; the final
                   stage's own) over the skip curve across the executed loops both cover:
                   the mean CE gap (mean_difference) as a perplexity ratio, %
    skip_x, skip_y, forced_x, forced_y  the skip curve and the final stage's own fixed-
                   depth curve themselves, for comparisons across trials."""
    need = {"trial_run_id", "stage", "policy", tracking.EXECUTED_LOOPS, "loss", "is_final_stage"}
    missing = need - set(points.columns)
    if missing:
        raise AnalysisError(f"cannot read claims from these points: no column {', '.join(sorted(missing))}")
    searched = sorted(c for c in points.columns if c.startswith(SEARCHED) and c != SEARCHED + "seed")
    rows = []
    for (trial,), part in points.group_by(["trial_run_id"], maintain_order=True):
        final = part.filter(pl.col("is_final_stage"))
        if final.is_empty():
            continue
        first = final.row(0, named=True)
        n_loops = int(_first(part, "params.model.n_loops") or first.get("n_loops") or 0)
        loops = loops_at(n_loops) if n_loops else None
        full = _point(final, FULL)
        full_loss = full.get("loss")
        skip = final.filter(pl.col("policy") == SKIP)
        skip_x = skip[tracking.EXECUTED_LOOPS].to_list() + ([n_loops] if full_loss is not None else [])
        skip_y = skip["loss"].to_list() + ([full_loss] if full_loss is not None else [])
        pretrain = part.filter(pl.col("stage") == DEFAULT_STAGE)
        skip_curve, forced_curve, fixed_curve = (
            (skip_x, skip_y),
            _fixed_curve(final, n_loops),
            _fixed_curve(pretrain, n_loops),
        )
        row = {
            "experiment": first.get("experiment"),
            "trial_run_id": trial,
            "trial_key": first.get("trial_key"),
            "seed": first.get("seed"),
            "method": first.get("method"),
            "stage": first.get("stage"),
            **{c: first.get(c) for c in searched},
            "n_layers": _first(part, "params.model.n_layers"),
            "n_loops": n_loops,
            "loops": loops,
            names.FULL_LOSS: full_loss,
            names.FULL_PPL: full.get(tracking.PPL),
            names.FULL_ACCURACY: full.get(tracking.ACCURACY),
            names.SKIP_LOSS: _at(skip_x, skip_y, loops) if not skip.is_empty() else None,
            names.FORCED_LOSS: _at(*forced_curve, loops),
            names.FIXED_LOSS: _at(*fixed_curve, loops),
            names.SKIP_MIN_LOOPS: min(skip[tracking.EXECUTED_LOOPS].drop_nulls().to_list(), default=None),
        }
        row[names.SKIP_INCREASE] = increase_pct(row[names.SKIP_LOSS], full_loss)
        has_skip = not skip.is_empty()
        row[names.FIXED_OVER_SKIP] = _pct(mean_difference(fixed_curve, skip_curve)) if has_skip else None
        row[names.FORCED_OVER_SKIP] = _pct(mean_difference(forced_curve, skip_curve)) if has_skip else None
        row.update(
            {
                names.SKIP_X: [float(x) for x in skip_x] if has_skip else [],
                names.SKIP_Y: [float(y) for y in skip_y] if has_skip else [],
                names.FORCED_X: [float(x) for x in forced_curve[0]],
                names.FORCED_Y: [float(y) for y in forced_curve[1]],
            }
        )
        rows.append(row)
    if not rows:
        raise AnalysisError("no finished trial with a final stage among these points")
    return pl.DataFrame(rows, infer_schema_length=None)


def _pct(loss_gap: float | None) -> float | None:
    """A mean CE gap as a perplexity ratio's percent: 100 (e^gap − 1)."""
    return None if loss_gap is None else 100.0 * math.expm1(loss_gap)


def _first(df: pl.DataFrame, column: str):
    if column not in df.columns:
        return None
    values = df[column].drop_nulls()
    return values[0] if len(values) else None


def _point(df: pl.DataFrame, policy: str) -> dict:
    rows = df.filter(pl.col("policy") == policy)
    return rows.row(0, named=True) if rows.height else {}


def _fixed_curve(stage_points: pl.DataFrame, n_loops: int) -> tuple[list, list]:
    """(loops, loss) of forced depths 1..R-1 and full depth at R (forced R is full)."""
    forced = stage_points.filter(pl.col("policy") == FORCED)
    if forced.is_empty():
        return [], []
    full = _point(stage_points, FULL)
    xs = forced["depth"].cast(pl.Float64).to_list() + ([float(n_loops)] if full.get("loss") is not None else [])
    ys = forced["loss"].to_list() + ([full["loss"]] if full.get("loss") is not None else [])
    return xs, ys


def _at(xs, ys, x):
    return None if x is None or not xs else interpolate(xs, ys, x)


# ---- the verdicts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimResult:
    """A claim's figure over seeds and its verdict. tested: the interval on the scale the
    claim is tested on (Claim.shown gives the one shown); unmatched: where the verdict
    reads a compute-matched comparison, the same figure against the unmatched arm,
    shown beside it and never judged. A family-wise correction (holm) fills p,
    p_adjusted, adjusted (the interval at the level the correction tested this claim
    at) and sets verdict to the corrected one, keeping raw_verdict, the uncorrected."""

    claim: Claim
    tested: Interval
    verdict: str
    detail: str = ""  # which arms, at which loops, what was left out
    unmatched: Interval | None = None
    unmatched_detail: str = ""
    p: float | None = None
    p_adjusted: float | None = None
    adjusted: Interval | None = None
    raw_verdict: str | None = None

    @property
    def interval(self) -> Interval:
        """The figure as shown (the claim's unit)."""
        return self.claim.shown(self.tested)

    def row(self) -> dict:
        c, shown = self.claim, self.interval
        adjusted = c.shown(self.adjusted) if self.adjusted is not None else None
        unmatched = c.shown(self.unmatched) if self.unmatched is not None else None
        return {
            "claim": c.id,
            "statement": c.statement,
            "paper": c.paper,
            "measure": c.measure,
            "ours": c.text(self.tested),
            "mean": shown.mean,
            "low": shown.low,
            "high": shown.high,
            "n": shown.n,
            "p": self.p,
            "p_holm": self.p_adjusted,
            "holm_low": adjusted.low if adjusted else None,
            "holm_high": adjusted.high if adjusted else None,
            "unmatched": c.text(self.unmatched) if self.unmatched is not None else None,
            "unmatched_mean": unmatched.mean if unmatched else None,
            "verdict": self.verdict,
            "verdict_unadjusted": self.raw_verdict or self.verdict,
            "detail": self.detail,
            "unmatched_detail": self.unmatched_detail,
        }


def judge(
    claim_id: str,
    interval: Interval,
    detail: str = "",
    *,
    unmatched: Interval | None = None,
    unmatched_detail: str = "",
) -> ClaimResult:
    claim = CLAIMS[claim_id]
    return ClaimResult(
        claim, interval, claim.verdict(interval), detail, unmatched, unmatched_detail, p=claim.p_value(interval)
    )


def holm(results: list[ClaimResult], confidence: float = CONFIDENCE) -> list[ClaimResult]:
    """Holm's step-down correction over the family of claims with a test (a p-value),
    at family-wise error 1 − confidence: sorted by p, the k-th of m is rejected while
    p_(j) ≤ α/(m − j + 1) for every j ≤ k; its adjusted p-value is
    max_{j ≤ k} min(1, (m − j + 1) p_(j)) and decides its verdict (rejected: the side
    of the null decides, as uncorrected; else inconclusive, or no spread as before).
    Each claim's `adjusted` interval is the one at the level its step tested,
    1 − α/(m − k + 1). Claims without a test keep their verdict. The order is kept."""
    alpha = 1.0 - confidence
    tested = sorted((r.p, i) for i, r in enumerate(results) if r.p is not None)
    m = len(tested)
    out = list(results)
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        r = results[i]
        level = 1.0 - alpha / (m - k)
        corrected = r.verdict if running <= alpha or r.verdict == NO_SPREAD else INCONCLUSIVE
        out[i] = replace(r, p_adjusted=running, adjusted=r.tested.at(level), verdict=corrected, raw_verdict=r.verdict)
    return out


def rows_by_seed(rows: pl.DataFrame) -> dict:
    """{seed: row} of one arm's rows (a seed's row once; the first when repeated)."""
    out: dict = {}
    for row in rows.iter_rows(named=True):
        out.setdefault(row["seed"], row)
    return out


def by_seed(rows: pl.DataFrame, column: str) -> dict:
    """{seed: value} of one arm's rows (a seed's value once; the first when repeated)."""
    return {seed: row[column] for seed, row in rows_by_seed(rows).items()}


def hole_claims(
    trials: pl.DataFrame,
    *,
    ouro: str = "Ouro",
    chase: str = "CHASE",
    matched_ouro: pl.DataFrame | None = None,
    matched_fixed: pl.DataFrame | None = None,
) -> list[ClaimResult]:
    """C2, C2-own, C3 and C3-few from the gated trials of one configuration
    (trial_measures' rows, seeds apart): the Ouro and CHASE arms continue one Stage-1, so
    C3 pairs them by seed; C2 compares CHASE's skip with a fixed depth, one value per seed.

    Compute-matched comparators, where given, are what the verdicts read (the unmatched
    figure is shown beside): matched_ouro, trials of Ouro continued (no holes) for as
    many weight-training steps as CHASE's extra stage, on the same Stage-1 (C3, paired);
    matched_fixed, trials of the fixed-loop model trained as long as CHASE's weights
    (C2: their own fixed-depth curve over CHASE's skip curve, paired by seed)."""
    gated = trials.filter(pl.col("method").is_in([ouro, chase]))
    o, c = gated.filter(pl.col("method") == ouro), gated.filter(pl.col("method") == chase)
    loops = _loops_text(gated)
    out = []
    c2_unmatched = mean_interval(c[names.FIXED_OVER_SKIP].to_list())
    c2_unmatched_text = (
        "CHASE skip against the pre-trained model forced to each depth, averaged over the executed "
        "loops both curves cover"
    )
    if matched_fixed is None:
        out.append(judge("C2", c2_unmatched, c2_unmatched_text))
    else:
        skips = rows_by_seed(c)
        gaps = {
            seed: _pct(
                mean_difference(
                    (row[names.FORCED_X], row[names.FORCED_Y]), (skips[seed][names.SKIP_X], skips[seed][names.SKIP_Y])
                )
            )
            for seed, row in rows_by_seed(matched_fixed).items()
            if seed in skips
        }
        out.append(
            judge(
                "C2",
                mean_interval(gaps.values()),
                "CHASE skip against the fixed-loop model trained as many weight steps as CHASE "
                "(compute-matched), forced to each depth, paired by seed, averaged over the executed "
                "loops both curves cover",
                unmatched=c2_unmatched,
                unmatched_detail="against the pre-trained model: " + c2_unmatched_text,
            )
        )
    out.append(
        judge(
            "C2-own",
            mean_interval(c[names.FORCED_OVER_SKIP].to_list()),
            "CHASE skip against its own model forced to each depth (one model: matched by construction), "
            "averaged over the executed loops both curves cover",
        )
    )
    increase = names.SKIP_INCREASE
    c3_unmatched = difference(by_seed(o, increase), by_seed(c, increase), paired=True)
    reach = _reach_note(gated if matched_ouro is None else pl.concat([gated, matched_ouro], how="diagonal_relaxed"))
    if matched_ouro is None:
        out.append(
            judge(
                "C3",
                c3_unmatched,
                f"Ouro minus CHASE, paired over seeds (both continue one Stage-1), at {loops}" + reach,
            )
        )
    else:
        out.append(
            judge(
                "C3",
                difference(by_seed(matched_ouro, increase), by_seed(c, increase), paired=True),
                f"Ouro continued without holes as many weight steps as CHASE's stage (compute-matched) "
                f"minus CHASE, paired over seeds (both continue one Stage-1), at {loops}" + reach,
                unmatched=c3_unmatched,
                unmatched_detail="stock Ouro (fewer weight steps) minus CHASE",
            )
        )
    out.append(judge("C3-few", mean_interval(c[increase].to_list()), f"CHASE at {loops}"))
    return out


def _loops_text(trials: pl.DataFrame) -> str:
    values = sorted(set(trials["loops"].drop_nulls().to_list()))
    return ("executed loops " + ", ".join(f"{v:g}" for v in values)) if values else "no target loops"


def _reach_note(trials: pl.DataFrame) -> str:
    short = trials.filter(pl.col(names.SKIP_LOSS).is_null())
    if short.is_empty():
        return ""
    fewest = short[names.SKIP_MIN_LOOPS].drop_nulls().to_list()
    return (
        f"; {short.height} arm(s) whose skip sweep does not reach those loops left out "
        f"(fewest loops: {', '.join(f'{v:.2f}' for v in fewest)})"
    )


def loop_claims(
    fixed: pl.DataFrame,
    *,
    quality: str,
    looped: tuple[int, int],
    base: tuple[int, int],
    deep: tuple[int, int] | None,
    claim: str = "C1",
) -> list[ClaimResult]:
    """`claim` (C1 on p-hop, C1-mano on Mano; quality accuracy: exact match in points) or
    C1-LM and C1-depth (quality ppl): N⊗R against N⊗1 and NR⊗1, from one row per
    pre-trained model and seed (columns n_layers, n_loops, seed, full_accuracy /
    full_ppl). Independent pre-trainings: Welch."""

    def arm(pair):
        rows = fixed.filter((pl.col("n_layers") == pair[0]) & (pl.col("n_loops") == pair[1]))
        return rows.unique(["seed"], keep="first", maintain_order=True)

    def name(pair):
        return f"{pair[0]}⊗{pair[1]}"

    a, b = arm(looped), arm(base)
    if quality == tracking.ACCURACY:

        def percent(rows):
            return {s: 100 * v for s, v in by_seed(rows, names.FULL_ACCURACY).items() if v is not None}

        gain = difference(percent(a), percent(b), paired=False)
        return [judge(claim, gain, f"{name(looped)} minus {name(base)}, Welch (independent pre-trainings)")]
    ratio_looped = _log_ppl(a)
    out = [
        judge(
            "C1-LM",
            difference(_log_ppl(b), ratio_looped, paired=False),
            f"{name(base)} over {name(looped)}, Welch on log perplexity",
        )
    ]
    if deep is not None:
        out.append(
            judge(
                "C1-depth",
                difference(ratio_looped, _log_ppl(arm(deep)), paired=False),
                f"{name(looped)} over {name(deep)}, Welch on log perplexity",
            )
        )
    return out


def _log_ppl(rows: pl.DataFrame) -> dict:
    return {s: math.log(v) for s, v in by_seed(rows, names.FULL_PPL).items() if v is not None and v > 0}


def speed_claims(records: list[dict]) -> list[ClaimResult]:
    """C4, C4-batch1 and C4-growth from prefill benchmark records (looplab/costs/timing.py's,
    one per seed's model, batch and layout, with "seed") in looplab's layout (varlen
    survivors): the speedup at the largest batch measured, at batch 1, and the
    difference of the two per model; C4-padded from the records in the paper's layout
    (packing "padded"), at its largest batch."""
    paper = [r for r in records if r.get("packing") == "padded"]
    ours = [r for r in records if r.get("packing") != "padded"]
    out = []
    if ours:
        largest = max(r["batch"] for r in ours)
        big = [r["speedup"] for r in ours if r["batch"] == largest]
        one = [r["speedup"] for r in ours if r["batch"] == 1]
        bound = statistics.fmean(r[tracking.LOOP_BOUND] for r in ours if r["batch"] == largest)
        out.append(
            judge(
                "C4",
                mean_interval(big),
                f"batch {largest}, seq_len {ours[0]['seq_len']}, "
                f"{ours[0]['policy']}, varlen fp32; loop bound R/loops "
                f"{bound:.2f}x, of it {statistics.fmean(big) / bound:.0%}",
            )
        )
        if one and largest != 1:
            out.append(judge("C4-batch1", mean_interval(one), f"batch 1, seq_len {ours[0]['seq_len']}"))

            def by_model(batch):
                return {r.get("seed", i): r["speedup"] for i, r in enumerate(x for x in ours if x["batch"] == batch)}

            out.append(
                judge(
                    "C4-growth",
                    difference(by_model(largest), by_model(1), paired=True),
                    f"batch {largest} minus batch 1, paired by seed (one model)",
                )
            )
    if paper:
        largest_padded = max(r["batch"] for r in paper)
        out.append(
            judge(
                "C4-padded",
                mean_interval([r["speedup"] for r in paper if r["batch"] == largest_padded]),
                f"batch {largest_padded}, seq_len {paper[0]['seq_len']}, {paper[0]['policy']}, padded "
                "bf16 on this machine (the paper: a GPU at L 2048)",
            )
        )
    return out


# ---- the table ---------------------------------------------------------------------------------------


def verdict_table(results: list[ClaimResult]) -> pl.DataFrame:
    return pl.DataFrame([r.row() for r in results], infer_schema_length=None)


def verdict_markdown(results: list[ClaimResult]) -> str:
    """The verdicts as a markdown table, one short line per claim: the paper's figure
    beside ours with its uncorrected interval, the Holm-corrected interval and p-value
    where a correction ran, the unmatched arm's figure where the verdict reads a
    compute-matched one, and the verdict; what each figure measures follows the table."""
    corrected = any(r.p_adjusted is not None for r in results)
    head = "| claim | the paper | ours (95 %, uncorrected) |"
    head += " Holm-corrected |" if corrected else ""
    head += " unmatched arm | verdict |"
    lines = [head, "|" + "---|" * head.count(" |")]
    for r in results:
        c = r.claim
        row = f"| **{c.id}** {c.statement} | {c.paper} | {c.text(r.tested)} |"
        if corrected:
            row += f" {c.text(r.adjusted)}, p {r.p_adjusted:.3g} |" if r.adjusted is not None else " n/a |"
        row += f" {c.text(r.unmatched) if r.unmatched is not None else '—'} |"
        verdict_text = r.verdict
        if r.raw_verdict is not None and r.raw_verdict != r.verdict:
            verdict_text += f" (uncorrected: {r.raw_verdict})"
        lines.append(row + f" {verdict_text} |")
    lines.append("")
    for r in results:
        c = r.claim
        lines.append(
            f"- **{c.id}**: {c.measure}{'; ' + r.detail if r.detail else ''}"
            + (f"; unmatched: {r.unmatched_detail}" if r.unmatched is not None else "")
        )
    return "\n".join(lines)
