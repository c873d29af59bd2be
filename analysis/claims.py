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

from typing import TYPE_CHECKING

from analysis import names
from analysis.claim_families import batch_claims, by_seed, hole_claims, loop_claims, rows_by_seed, speed_claims
from analysis.claim_rules import (
    CLAIMS,
    DESCRIPTIVE,
    FEW_PERCENT,
    INCONCLUSIVE,
    LINEAR,
    LOG,
    MANO_EXAMPLES,
    NO_SPREAD,
    NOT_REPRODUCED,
    PAIRED,
    PER_SEED,
    PHOP_EXAMPLES,
    REPRODUCED,
    WELCH,
    Claim,
)
from analysis.curves import increase_pct, interpolate, loss_gap_pct, mean_difference
from analysis.errors import AnalysisError
from analysis.names import PARAM
from analysis.stats import p_value
from analysis.verdicts import ClaimResult, correct, decide, judge, verdict_markdown, verdict_table
from looplab import tracking
from looplab.policy import FORCED, FULL, SKIP
from looplab.stages import DEFAULT_STAGE

if TYPE_CHECKING:
    import polars as pl

# The claims' public names, wherever they live (claim_rules, curves, verdicts,
# claim_families): sweeps/ and tests/ import them from here.
__all__ = [
    "CLAIMS",
    "DESCRIPTIVE",
    "FEW_PERCENT",
    "INCONCLUSIVE",
    "LINEAR",
    "LOG",
    "MANO_EXAMPLES",
    "NO_SPREAD",
    "NOT_REPRODUCED",
    "PAIRED",
    "PER_SEED",
    "PHOP_EXAMPLES",
    "REPRODUCED",
    "SEARCHED",
    "TARGET_FLOOR",
    "TARGET_FRACTION",
    "WELCH",
    "Claim",
    "ClaimResult",
    "batch_claims",
    "by_seed",
    "correct",
    "decide",
    "hole_claims",
    "increase_pct",
    "interpolate",
    "judge",
    "loop_claims",
    "mean_difference",
    "p_value",
    "rows_by_seed",
    "speed_claims",
    "target_loops",
    "trial_measures",
    "verdict_markdown",
    "verdict_table",
]

SEARCHED = PARAM + tracking.SEARCH_PARAM  # a trial's searched values: params.search.<name>

# "About half the loops", where C3 and C3-few read each arm's skip curve: R/2, and never
# below 1.5 (at R = 2 half is 1 loop, the floor of every curve: every token exits first).
TARGET_FRACTION, TARGET_FLOOR = 0.5, 1.5


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
        row[names.FIXED_OVER_SKIP] = loss_gap_pct(mean_difference(fixed_curve, skip_curve)) if has_skip else None
        row[names.FORCED_OVER_SKIP] = loss_gap_pct(mean_difference(forced_curve, skip_curve)) if has_skip else None
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
