"""The paper's claims as computed verdicts (DESIGN.md, "Claims and verdicts").

A claim compares two arms on one measure at matched training, over seeds. The pieces:

  interpolate     piecewise-linear through one curve's (executed loops, value) points;
                  None outside them: a curve is never extrapolated
  trial_measures  one row per trial: each curve's mean CE at the claim's executed loops
                  (the skip sweep over q with full compute at R; the fixed-depth curve of
                  forced depths 1..R, of the trial's own final stage and of its pre-training)
  Claim           the paper's statement and the rule that judges ours: its direction
                  against a null, the scale seeds are averaged and tested on (linear, or
                  log for a ratio), the test (paired, Welch, or one value per seed), its
                  sides (a bound is tested one-sided), and where it can be tested at all
  judge, correct  a claim's figure, its t test (or an exact test on held-out counts where
                  seeds do not vary at all), and Holm's correction over a fixed family
                  with intervals shown at levels that never contradict a verdict

The statistics themselves (intervals, tests, Holm's steps, power) are analysis/stats.py.

Mean CE (loss), not perplexity, is interpolated: a token-level mixture of two policies has
the mixture's mean CE at the mixture's mean loops, so a straight line in (loops, loss) is
what mixing two measured policies achieves; perplexity is exp(loss) at the end.

CLAIMS holds the paper's four headline claims (and their sub-claims) with the paper's own
figure beside each; loop_claims, hole_claims and speed_claims compute ours from the
trial measures and the prefill benchmark records (sweeps/paper_mini.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

from analysis import names
from analysis.errors import AnalysisError
from analysis.names import PARAM
from analysis.stats import CONFIDENCE, Interval, difference, exact_p, holm, mean_interval, p_value
from looplab import tracking
from looplab.policy import FORCED, FULL, SKIP
from looplab.stages import DEFAULT_STAGE

if TYPE_CHECKING:
    import polars as pl

SEARCHED = PARAM + tracking.SEARCH_PARAM  # a trial's searched values: params.search.<name>

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced (direction)", "not reproduced", "inconclusive"
NO_SPREAD = "inconclusive (no spread)"  # every seed gave the same value and no exact test decides
DESCRIPTIVE = "descriptive (not judged here)"  # a claim outside the protocol's family on this machine
# "Within a few percent of full compute": the paper reports +3-4 % (Fig. 2); the verdict
# asks whether CHASE's increase lies below this bound.
FEW_PERCENT = 5.0
# "About half the loops", where C3 and C3-few read each arm's skip curve: R/2, and never
# below 1.5 (at R = 2 half is 1 loop, the floor of every curve: every token exits first).
TARGET_FRACTION, TARGET_FLOOR = 0.5, 1.5


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


def increase_pct(loss: float | None, reference: float | None) -> float | None:
    """Perplexity increase over a reference in percent, from mean CEs: 100 (e^(l − l_ref) − 1)."""
    if loss is None or reference is None:
        return None
    return 100.0 * math.expm1(loss - reference)


# ---- the claims ----------------------------------------------------------------------------


LINEAR, LOG = "linear", "log"  # the scale a claim's seeds are averaged and tested on
PAIRED, WELCH, PER_SEED = "paired", "Welch", "per seed"  # how its per-seed values become an interval


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims and the rule that judges ours.

    direction  +1: the paper's direction is measure > null; -1: measure < null
    scale      LINEAR, or LOG for a ratio: a percent change (unit " %") is tested as
               log(1 + v/100), a ratio (unit "x") as log v, and shown back in its unit
               (a geometric mean over seeds; a ratio's interval then stays a ratio's)
    test       PAIRED (two arms' difference per seed: the arms share what a seed fixes),
               WELCH (two arms' independent means), or PER_SEED (one value per seed,
               itself a matched comparison inside one seed)
    sides      2: a two-sided t test; 1: one-sided in the paper's direction (a bound,
               such as "within 5 %": non-inferiority)
    examples   held-out examples behind each per-seed value of a count measure
               (accuracy): where seeds do not vary at all, Fisher's exact test on the
               counts pooled over seeds decides instead of a t test (0: not a count)
    gpu_only   a phenomenon only a GPU shows (a latency-bound batch-1 prefill): on a
               CPU the claim is shown, outside the family, and never judged
    why        why this scale and test, said where the claim is shown"""

    id: str
    statement: str  # what the paper claims
    measure: str  # what we compute, and its unit
    paper: str  # the paper's own figure for it
    direction: int
    unit: str = ""
    null: float = 0.0
    scale: str = LINEAR
    test: str = PER_SEED
    sides: int = 2
    examples: int = 0
    gpu_only: bool = False
    why: str = ""

    def __post_init__(self) -> None:
        if self.direction not in (1, -1):
            raise ValueError(f"Claim.direction={self.direction!r} is invalid; allowed: 1 | -1")
        if self.scale not in (LINEAR, LOG) or (self.scale == LOG and self.unit not in (" %", "x")):
            raise ValueError(
                f"Claim.scale={self.scale!r} is invalid with unit={self.unit!r}; allowed: {LINEAR}, or {LOG} "
                "for a percent change (' %') or a ratio ('x')"
            )
        if self.test not in (PAIRED, WELCH, PER_SEED):
            raise ValueError(f"Claim.test={self.test!r} is invalid; allowed: {PAIRED} | {WELCH} | {PER_SEED}")
        if self.sides not in (1, 2):
            raise ValueError(f"Claim.sides={self.sides!r} is invalid; allowed: 1 | 2")

    @property
    def signed(self) -> bool:
        """A difference shows its sign; a ratio (null 1) does not."""
        return self.null != 1.0

    def rule(self) -> dict:
        """What decides this claim's verdict (a protocol's content hash covers it)."""
        return {
            "direction": self.direction,
            "null": self.null,
            "unit": self.unit,
            "scale": self.scale,
            "test": self.test,
            "sides": self.sides,
            "examples": self.examples,
            "gpu_only": self.gpu_only,
        }

    def tested_value(self, v: float) -> float:
        """A value in the claim's unit on the scale it is tested on."""
        if self.scale == LINEAR:
            return v
        return math.log1p(v / 100.0) if self.unit == " %" else math.log(v)

    def shown_value(self, t: float) -> float:
        if self.scale == LINEAR:
            return t
        return 100.0 * math.expm1(t) if self.unit == " %" else math.exp(t)

    @property
    def tested_null(self) -> float:
        return self.tested_value(self.null)

    def interval(self, values, confidence: float = CONFIDENCE) -> Interval:
        """Per-seed values in the claim's unit as its tested interval (PER_SEED claims)."""
        floor = -100.0 if self.unit == " %" else 0.0  # where the log scale ends: a ratio of 0
        clean = [v for v in values if v is not None and math.isfinite(v) and (self.scale == LINEAR or v > floor)]
        return mean_interval([self.tested_value(v) for v in clean], confidence, self.sides)

    def difference(self, a: dict, b: dict, confidence: float = CONFIDENCE) -> Interval:
        """Arm a minus arm b by seed, values already on the tested scale (PAIRED, WELCH)."""
        return difference(a, b, paired=self.test != WELCH, confidence=confidence, sides=self.sides)

    def shown(self, interval: Interval) -> Interval:
        """The interval in the unit the claim is shown in."""
        return interval if self.scale == LINEAR else interval.mapped(self.shown_value)

    def on_paper_side(self, tested_mean: float) -> bool:
        return (tested_mean > self.tested_null) == (self.direction == 1)

    def p_value(self, tested: Interval) -> float | None:
        """The t test in the claim's sides (one-sided: in the paper's direction)."""
        return p_value(tested, self.tested_null, self.direction)

    def verdict(self, tested: Interval) -> str:
        """The verdict an interval gives at its own level: reproduced when it excludes
        the null on the paper's side, not reproduced on the other side, else
        inconclusive (no spread: every seed gave the same value)."""
        if tested.no_spread:
            return NO_SPREAD
        if tested.low is None or tested.high is None:
            return INCONCLUSIVE
        null = self.tested_null
        if tested.low > null:
            return REPRODUCED if self.direction == 1 else NOT_REPRODUCED
        if tested.high < null:
            return REPRODUCED if self.direction == -1 else NOT_REPRODUCED
        return INCONCLUSIVE

    def text(self, tested: Interval) -> str:
        return self.shown(tested).text(2, self.unit, self.signed)

    def how(self) -> str:
        """The test and the scale in words, for the line under the verdict table."""
        side = "against the bound" if self.null != 0 else ("above zero" if self.direction == 1 else "below zero")
        sides = "two-sided" if self.sides == 2 else f"one-sided {side}"
        scale = "log scale (a geometric mean over seeds)" if self.scale == LOG else "linear scale"
        return f"{self.test} t test, {sides}, on the {scale}" + (f": {self.why}" if self.why else "")


PHOP_EXAMPLES = 500  # phop-debug's held-out examples (task.eval_count): the exact test's unit
MANO_EXAMPLES = 500  # mano-debug's

_SAME_SEED = "both models of a seed train on the same batches in the same order and are scored on the same held-out set"

CLAIMS: dict[str, Claim] = {
    c.id: c
    for c in (
        Claim(
            "C1",
            "looping helps at equal parameters (N⊗R beats N⊗1)",
            "p-hop exact match of N⊗R minus N⊗1, points",
            "p-hop p=16: 1⊗6 99.51 % vs 1⊗1 38.32 % (+61.2 points, Table 2)",
            +1,
            unit=" pt",
            test=PAIRED,
            examples=PHOP_EXAMPLES,
            why=f"paired by seed because {_SAME_SEED}; points of accuracy add",
        ),
        Claim(
            "C1-mano",
            "looping helps at equal parameters on Mano (N⊗R beats N⊗1)",
            "Mano exact match (ℓ = L) of N⊗R minus N⊗1, points",
            "L=10: 4⊗6 99.21 % vs 4⊗1 55.60 % (+43.6 points, Table 1)",
            +1,
            unit=" pt",
            test=PAIRED,
            examples=MANO_EXAMPLES,
            why=f"paired by seed because {_SAME_SEED}; points of accuracy add",
        ),
        Claim(
            "C1-LM",
            "looping helps at equal parameters, language modelling",
            "perplexity of N⊗1 over N⊗R, % (positive: the looped model is better)",
            "140M Mamba-2: loop4 14.68 vs baseline 15.80 (+7.6 %, Table 4); 6⊗4 19.98 vs 6⊗1 21.96 (+9.9 %, Table 3)",
            +1,
            unit=" %",
            scale=LOG,
            test=PAIRED,
            why=f"paired by seed because {_SAME_SEED}; a perplexity ratio is a difference of log perplexities",
        ),
        Claim(
            "C1-depth",
            "where NR⊗1 stands: the iso-depth (iso-FLOPs) non-looped model stays ahead",
            "perplexity of N⊗R over NR⊗1, % (positive: the deeper non-looped model is better)",
            "24⊗1 16.15 vs 6⊗4 19.98 (+23.7 %, Table 3)",
            +1,
            unit=" %",
            scale=LOG,
            test=PAIRED,
            why=f"paired by seed because {_SAME_SEED}; a perplexity ratio is a difference of log perplexities",
        ),
        Claim(
            "C2",
            "adaptive exits beat forced fixed depth at equal executed loops",
            "perplexity of the fixed-loop model forced to d loops over CHASE skip at the same executed loops, mean "
            "over the loops both cover, %",
            "140M at ~2 loops: forced 2 loops PPL 12,907 vs CHASE skip 16.45 at 2.15 loops (Fig. 3, App. E)",
            +1,
            unit=" %",
            scale=LOG,
            why="each seed's value is a mean gap in log perplexity, shown as a ratio",
        ),
        Claim(
            "C2-own",
            "(stronger) adaptive exits beat the same gated model at a forced depth",
            "perplexity of CHASE's own model forced to d loops over its skip at the same executed loops, mean over "
            "the loops both cover, %",
            "not reported: the paper forces the fixed-loop model",
            +1,
            unit=" %",
            scale=LOG,
            why="each seed's value is a mean gap in log perplexity, shown as a ratio",
        ),
        Claim(
            "C3",
            "cache holes: stock Ouro skip degrades far more than CHASE skip at about half the loops",
            "Ouro's perplexity increase over its full compute minus CHASE's, at R/2 executed loops, points of %",
            "370M: Ouro up to +4788 %, CHASE +3-4 % (Fig. 2)",
            +1,
            unit=" pt",
            test=PAIRED,
            why="paired by seed because both arms continue one Stage-1; a difference of two increases in points, "
            "as the paper's Fig. 2 compares them",
        ),
        Claim(
            "C3-few",
            "CHASE skip stays within a few percent of full compute",
            f"CHASE's perplexity increase over its full compute at R/2 executed loops, % (bound {FEW_PERCENT:g} %)",
            "+3-4 % across the range (Fig. 2)",
            -1,
            unit=" %",
            null=FEW_PERCENT,
            scale=LOG,
            sides=1,
            why="a bound (non-inferiority) is tested on its own side; a perplexity ratio on the log scale",
        ),
        Claim(
            "C3-growth",
            "the cache-hole gap grows with training, on the road to the paper's sizes",
            "per seed, the least-squares slope of Ouro's minus CHASE's perplexity increase at R/2 executed loops "
            "against log2 of the pre-training steps, points per doubling",
            "at 140M-370M and 150B tokens Ouro up to +4788 %, CHASE +3-4 % (Fig. 2); at laptop scale a gap of a "
            "few points",
            +1,
            unit=" pt",
            sides=1,
            why="a difference of two slopes, in points of increase per doubling; one-sided: the claim is growth "
            "(the scan's own protocol, sweeps/c3_growth.py)",
        ),
        Claim(
            "C4",
            "skip turns saved loops into prefill speedup where compute binds",
            "prefill speedup of skip over full at the largest batch, × (null 1)",
            "1.73x (140M) / 1.83x (370M) at batch 64, q=0.2 (Table 5)",
            +1,
            unit="x",
            null=1.0,
            scale=LOG,
            why="a speedup is a ratio of times",
        ),
        Claim(
            "C4-batch1",
            "and not at batch 1, where the prefill is latency-bound",
            "prefill speedup at batch 1, × (the paper: no faster than full, i.e. below 1)",
            "0.95-0.97x at batch 1 (140M, Table 5)",
            -1,
            unit="x",
            null=1.0,
            scale=LOG,
            gpu_only=True,
            why="a speedup is a ratio of times; a latency-bound batch-1 prefill is a GPU's regime",
        ),
        Claim(
            "C4-padded",
            "the same speedup in the paper's layout (padded survivors, bf16 autocast)",
            "prefill speedup of skip over full at the largest batch with survivors padded to each batch's largest "
            "count under bf16 autocast, × (null 1)",
            "1.73x (140M) at batch 64, q=0.2, padded bf16 on a GPU at L 2048 (Table 5)",
            +1,
            unit="x",
            null=1.0,
            scale=LOG,
            why="a speedup is a ratio of times",
        ),
        Claim(
            "C4-growth",
            "the speedup grows as the batch makes the prefill compute-bound",
            "speedup at the largest batch minus at batch 1, paired by model",
            "1.73x - 0.96x = +0.77 (140M, batch 64 vs 1, q=0.2, Table 5)",
            +1,
            unit="x",
            test=PAIRED,
            gpu_only=True,
            why="one model timed at both batches; a difference of speedups, as the paper's Table 5 reads it; "
            "a latency-bound batch-1 prefill is a GPU's regime",
        ),
    )
}


def target_loops(n_loops: int) -> float:
    """ "About half the loops": TARGET_FRACTION of R, at least TARGET_FLOOR."""
    return max(TARGET_FRACTION * n_loops, TARGET_FLOOR)


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
    import polars as pl

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
    import polars as pl

    rows = df.filter(pl.col("policy") == policy)
    return rows.row(0, named=True) if rows.height else {}


def _fixed_curve(stage_points: pl.DataFrame, n_loops: int) -> tuple[list, list]:
    """(loops, loss) of forced depths 1..R-1 and full depth at R (forced R is full)."""
    import polars as pl

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
    claim is tested on, at the claim's confidence (Claim.shown gives the one shown);
    unmatched: where the verdict reads a step-matched comparison, the same figure
    against the unmatched arm, shown beside it and never judged; p: the claim's test
    (the t test, or Fisher's exact test on held-out counts where seeds do not vary at
    all: exact). A family-wise correction (correct) fills p_adjusted and adjusted (the
    interval at the level Holm's procedure shows it at) and sets verdict to the
    corrected one, keeping raw_verdict, the uncorrected."""

    claim: Claim
    tested: Interval
    verdict: str
    detail: str = ""  # which arms, at which loops, what was left out
    unmatched: Interval | None = None
    unmatched_detail: str = ""
    p: float | None = None
    exact: bool = False
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
            "test": c.how(),
            "ours": c.text(self.tested),
            "mean": shown.mean,
            "low": shown.low,
            "high": shown.high,
            "n": shown.n,
            "p": self.p,
            "p_exact": self.exact,
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


def decide(claim: Claim, tested: Interval, p: float | None, rejected: bool, shown_at: Interval) -> str:
    """A verdict from a test's decision and the interval shown with it: rejected, the
    side of the estimate decides; not rejected, "not reproduced" only where the shown
    interval excludes the null on the other side (a one-sided claim's far bound), else
    inconclusive (no spread where every seed gave the same value and nothing decided)."""
    if p is not None and rejected and tested.mean is not None:
        return REPRODUCED if claim.on_paper_side(tested.mean) else NOT_REPRODUCED
    null = claim.tested_null
    if shown_at.low is not None and shown_at.high is not None and not shown_at.no_spread:
        if (shown_at.low > null and claim.direction == -1) or (shown_at.high < null and claim.direction == 1):
            return NOT_REPRODUCED
    return NO_SPREAD if tested.no_spread else INCONCLUSIVE


def judge(
    claim_id: str,
    interval: Interval,
    detail: str = "",
    *,
    unmatched: Interval | None = None,
    unmatched_detail: str = "",
    exact: float | None = None,
    confidence: float = CONFIDENCE,
) -> ClaimResult:
    """A claim's result, uncorrected: its t test, or `exact` (an exact test's p) where
    the seeds do not vary at all; the verdict at `confidence`."""
    claim = CLAIMS[claim_id]
    p = exact if interval.no_spread else claim.p_value(interval)
    rejected = p is not None and p <= 1.0 - confidence
    return ClaimResult(
        claim,
        interval,
        decide(claim, interval, p, rejected, interval),
        detail,
        unmatched,
        unmatched_detail,
        p=p,
        exact=interval.no_spread and exact is not None,
    )


def correct(results: list[ClaimResult], family: Sequence[str], confidence: float = CONFIDENCE) -> list[ClaimResult]:
    """Holm's correction over a fixed family of claims (analysis.stats.holm) at
    family-wise error 1 − confidence. The family is declared, not found: a member with no
    result, or no test, counts as p = 1 and still holds its place (it is added as
    "inconclusive (no result)" when missing). Each member's adjusted interval is shown
    at the level Holm's procedure gives it, so no interval contradicts its verdict.
    Results outside the family are descriptive: shown, never judged. Family order first,
    then the rest in their order."""
    by_id = {r.claim.id: r for r in results}
    members = [
        by_id.get(c) or ClaimResult(CLAIMS[c], Interval(None, None, None, 0), INCONCLUSIVE, "no result") for c in family
    ]
    steps = holm([r.p for r in members], 1.0 - confidence)
    out = []
    for r, step in zip(members, steps):
        adjusted = r.tested.at(step.level)
        out.append(
            replace(
                r,
                p_adjusted=step.p_adjusted,
                adjusted=adjusted,
                verdict=decide(r.claim, r.tested, r.p, step.rejected, adjusted),
                raw_verdict=r.verdict,
            )
        )
    return out + [replace(r, verdict=DESCRIPTIVE, raw_verdict=r.verdict) for r in results if r.claim.id not in family]


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

    Step-matched comparators, where given, are what the verdicts read (the unmatched
    figure is shown beside): matched_ouro, trials of Ouro continued (no holes) for as
    many weight-training steps as CHASE's extra stage, on the same Stage-1 (C3, paired);
    matched_fixed, trials of the fixed-loop model trained as many steps as CHASE's
    weights (C2: their own fixed-depth curve over CHASE's skip curve, paired by seed).
    Every continued stage continues its parent's data stream, so step-matched arms have
    seen as many fresh tokens."""
    import polars as pl

    gated = trials.filter(pl.col("method").is_in([ouro, chase]))
    o, c = gated.filter(pl.col("method") == ouro), gated.filter(pl.col("method") == chase)
    loops = _loops_text(gated)
    out = []
    c2_unmatched = CLAIMS["C2"].interval(c[names.FIXED_OVER_SKIP].to_list())
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
                CLAIMS["C2"].interval(gaps.values()),
                "CHASE skip against the fixed-loop model trained as many weight steps as CHASE "
                "(step-matched), forced to each depth, paired by seed, averaged over the executed "
                "loops both curves cover",
                unmatched=c2_unmatched,
                unmatched_detail="against the pre-trained model: " + c2_unmatched_text,
            )
        )
    out.append(
        judge(
            "C2-own",
            CLAIMS["C2-own"].interval(c[names.FORCED_OVER_SKIP].to_list()),
            "CHASE skip against its own model forced to each depth (one model: matched by construction), "
            "averaged over the executed loops both curves cover",
        )
    )
    increase = names.SKIP_INCREASE
    c3 = CLAIMS["C3"]
    c3_unmatched = c3.difference(by_seed(o, increase), by_seed(c, increase))
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
                c3.difference(by_seed(matched_ouro, increase), by_seed(c, increase)),
                f"Ouro continued without holes as many weight steps as CHASE's stage (step-matched) "
                f"minus CHASE, paired over seeds (both continue one Stage-1), at {loops}" + reach,
                unmatched=c3_unmatched,
                unmatched_detail="stock Ouro (fewer weight steps) minus CHASE",
            )
        )
    out.append(judge("C3-few", CLAIMS["C3-few"].interval(c[increase].to_list()), f"CHASE at {loops}"))
    return out


def _loops_text(trials: pl.DataFrame) -> str:
    values = sorted(set(trials["loops"].drop_nulls().to_list()))
    return ("executed loops " + ", ".join(f"{v:g}" for v in values)) if values else "no target loops"


def _reach_note(trials: pl.DataFrame) -> str:
    import polars as pl

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
    full_ppl), paired or Welch as each claim declares (Claim.test). Where an accuracy
    difference does not vary across seeds at all, Fisher's exact test on the held-out
    counts pooled over the seeds decides."""
    import polars as pl

    def arm(pair):
        rows = fixed.filter((pl.col("n_layers") == pair[0]) & (pl.col("n_loops") == pair[1]))
        return rows.unique(["seed"], keep="first", maintain_order=True)

    def name(pair):
        return f"{pair[0]}⊗{pair[1]}"

    def how(c: Claim) -> str:
        return "paired by seed" if c.test == PAIRED else "Welch (independent pre-trainings)"

    a, b = arm(looped), arm(base)
    if quality == tracking.ACCURACY:
        c = CLAIMS[claim]

        def percent(rows):
            return {s: 100 * v for s, v in by_seed(rows, names.FULL_ACCURACY).items() if v is not None}

        pa, pb = percent(a), percent(b)
        gain = c.difference(pa, pb)
        return [
            judge(
                claim,
                gain,
                f"{name(looped)} minus {name(base)}, {how(c)}",
                exact=_exact_counts(c, pa, pb) if gain.no_spread else None,
            )
        ]
    ratio_looped = _log_ppl(a)
    lm = CLAIMS["C1-LM"]
    out = [
        judge(
            "C1-LM",
            lm.difference(_log_ppl(b), ratio_looped),
            f"{name(base)} over {name(looped)}, {how(lm)}, on log perplexity",
        )
    ]
    if deep is not None:
        depth = CLAIMS["C1-depth"]
        out.append(
            judge(
                "C1-depth",
                depth.difference(ratio_looped, _log_ppl(arm(deep))),
                f"{name(looped)} over {name(deep)}, {how(depth)}, on log perplexity",
            )
        )
    return out


def _exact_counts(claim: Claim, a: dict, b: dict) -> float | None:
    """Fisher's exact p for two arms' accuracies (percent by seed) as held-out counts
    pooled over the seeds both have (claim.examples examples a seed and arm)."""
    if not claim.examples:
        return None
    seeds = [s for s in a if s in b]
    if not seeds:
        return None
    total = claim.examples * len(seeds)

    def correct(arm: dict) -> int:
        return sum(round(arm[s] / 100 * claim.examples) for s in seeds)

    return exact_p(correct(a), total, correct(b), total, sides=claim.sides, direction=claim.direction)


def _log_ppl(rows: pl.DataFrame) -> dict:
    return {s: math.log(v) for s, v in by_seed(rows, names.FULL_PPL).items() if v is not None and v > 0}


def speed_claims(records: list[dict]) -> list[ClaimResult]:
    """C4, C4-batch1 and C4-growth from prefill benchmark records (looplab/costs/timing.py's,
    one per seed's model, batch and layout, with "seed") in looplab's layout (varlen
    survivors): the speedup at the largest batch measured, and batch_claims; C4-padded
    from the records in the paper's layout (packing "padded"), at its largest batch.
    Speedups are averaged on the log scale."""
    paper = [r for r in records if r.get("packing") == "padded"]
    ours = [r for r in records if r.get("packing") != "padded"]
    out = []
    if ours:
        largest = max(r["batch"] for r in ours)
        big = [r["speedup"] for r in ours if r["batch"] == largest]
        bound = statistics.fmean(r[tracking.LOOP_BOUND] for r in ours if r["batch"] == largest)
        geometric = math.exp(statistics.fmean(math.log(v) for v in big))
        out.append(
            judge(
                "C4",
                CLAIMS["C4"].interval(big),
                f"batch {largest}, seq_len {ours[0]['seq_len']}, "
                f"{ours[0]['policy']}, varlen fp32; loop bound R/loops "
                f"{bound:.2f}x, of it {geometric / bound:.0%}",
            )
        )
        out += batch_claims(ours, f"seq_len {ours[0]['seq_len']}")
    if paper:
        largest_padded = max(r["batch"] for r in paper)
        out.append(
            judge(
                "C4-padded",
                CLAIMS["C4-padded"].interval([r["speedup"] for r in paper if r["batch"] == largest_padded]),
                f"batch {largest_padded}, seq_len {paper[0]['seq_len']}, {paper[0]['policy']}, padded "
                "bf16 on this machine (the paper: a GPU at L 2048)",
            )
        )
    return out


def batch_claims(records: list[dict], where: str, confidence: float = CONFIDENCE) -> list[ClaimResult]:
    """C4-batch1 and C4-growth from one layout's records (a CPU's varlen ones, or a GPU's
    at the paper's setting, sweeps/gpu_claims.py): the speedup at batch 1, and the speedup
    at the largest batch minus at batch 1, paired by seed (one model timed at both).
    None without batch 1 and a larger one."""
    largest = max((r["batch"] for r in records), default=1)
    if largest == 1 or not any(r["batch"] == 1 for r in records):
        return []

    def by_seed(batch: int) -> dict:
        return {r.get("seed", i): r["speedup"] for i, r in enumerate(x for x in records if x["batch"] == batch)}

    one = by_seed(1)
    return [
        judge(
            "C4-batch1",
            CLAIMS["C4-batch1"].interval(one.values(), confidence),
            f"batch 1, {where}",
            confidence=confidence,
        ),
        judge(
            "C4-growth",
            CLAIMS["C4-growth"].difference(by_seed(largest), one, confidence),
            f"batch {largest} minus batch 1, paired by seed (one model), {where}",
            confidence=confidence,
        ),
    ]


# ---- the table ---------------------------------------------------------------------------------------


def verdict_table(results: list[ClaimResult]) -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame([r.row() for r in results], infer_schema_length=None)


def verdict_markdown(results: list[ClaimResult]) -> str:
    """The verdicts as a markdown table, one short line per claim: the paper's figure
    beside ours with its uncorrected interval, the Holm-compatible interval and adjusted
    p-value where a correction ran, the unmatched arm's figure where the verdict reads a
    step-matched one, and the verdict; what each figure measures, and how it is tested,
    follows the table."""
    corrected = any(r.p_adjusted is not None for r in results)
    head = "| claim | the paper | ours (95 %, uncorrected) |"
    head += " Holm-compatible |" if corrected else ""
    head += " unmatched arm | verdict |"
    lines = [head, "|" + "---|" * head.count(" |")]
    for r in results:
        c = r.claim
        row = f"| **{c.id}** {c.statement} | {c.paper} | {c.text(r.tested)} |"
        if corrected:
            if r.adjusted is not None and r.p_adjusted is not None:
                row += f" {c.text(r.adjusted)}, p {r.p_adjusted:.3g}{' (exact)' if r.exact else ''} |"
            else:
                row += " — |"
        row += f" {c.text(r.unmatched) if r.unmatched is not None else '—'} |"
        verdict_text = r.verdict
        if r.verdict != DESCRIPTIVE and r.raw_verdict is not None and r.raw_verdict != r.verdict:
            verdict_text += f" (uncorrected: {r.raw_verdict})"
        lines.append(row + f" {verdict_text} |")
    lines.append("")
    for r in results:
        c = r.claim
        lines.append(
            f"- **{c.id}**: {c.measure}{'; ' + r.detail if r.detail else ''}"
            + (f"; unmatched: {r.unmatched_detail}" if r.unmatched is not None else "")
            + f"; {c.how()}"
            + ("; every seed gave the same value: Fisher's exact test on the held-out counts" if r.exact else "")
        )
    return "\n".join(lines)
