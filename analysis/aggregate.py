"""Seeds → one row per configuration: mean, standard deviation, a confidence interval
and n; or the paper's best-of-seeds protocol (Mano, p-hop).

The interval is Student's t, two-sided, for the mean over seeds:
    mean ± t_{(1+c)/2, n-1} · s / √n,   s the sample standard deviation (ddof = 1),
so 95% with 3 seeds uses t = 4.303 (scipy.stats.t). With one seed std and the interval
are null.
Nulls (a seed that lacks a metric) are left out of that metric's statistics.
"""

from __future__ import annotations

import math

import polars as pl

from analysis import names
from analysis.errors import AnalysisError
from looplab import tracking
from looplab.policy import FULL

# Columns that describe a configuration (equal across its seeds), carried through by default.
DESCRIPTIVE = (*names.POINT_NAME, "n_loops", "preset", "trial_config_hash", tracking.CONFIG_HASH)
PER_SEED = ("params.train.seed", "params.search.seed")


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (0 < p < 1), scipy's.
    Checked here because scipy answers nan for an invalid p or df, which would pass
    on as a null interval without a word."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"student_t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    # Imported here: scipy.stats takes most of a second to import, which a CLI run that
    # stops at a bad experiment name should not pay.
    from scipy.stats import t

    return float(t.ppf(p, df))


def aggregate_seeds(
    df: pl.DataFrame,
    values,
    *,
    by=("experiment", "trial_config_hash", "stage", "policy", "q", "depth"),
    seed: str = "seed",
    confidence: float = 0.95,
    best_of_seeds: str | None = None,
    maximize: bool | None = None,
    carry=None,
) -> pl.DataFrame:
    """One row per group of `by` (default: one configuration's evaluation point, seeds
    pooled). For each column v in `values`: v (the mean), v_std, v_ci_low, v_ci_high;
    and n_seeds, seeds (sorted list).

    best_of_seeds=COLUMN: the paper's protocol instead: v is the value of the seed
    whose COLUMN is best (max if maximize, else min; by default the direction of
    names.higher_is_better; ties: the lowest seed), chosen_seed says which; v_std
    still describes the spread over seeds, and the interval is null (it is not a mean).

    carry: columns to keep (their first value per group); default the descriptive
    columns present (names in DESCRIPTIVE and params.* except the seed)."""
    values = [values] if isinstance(values, str) else list(values)
    by = [c for c in by if c in df.columns]
    _check_request(df, values, confidence, best_of_seeds)
    if carry is None:
        carry = [c for c in df.columns if (c in DESCRIPTIVE or (c.startswith("params.") and c not in PER_SEED))]
    carry = [c for c in carry if c not in by and c not in values and c != seed]
    stats = _group_stats(df, values, seed, carry)
    if best_of_seeds:
        stats.append(_best_seed_pick(df, values, seed, best_of_seeds, maximize))
    grouped = df.group_by(by, maintain_order=True).agg(stats) if by else df.select(stats)
    out = _value_columns(grouped, values, confidence, bool(best_of_seeds))
    lead = [*by, *carry, "n_seeds", *(["seeds"] if seed in df.columns else [])]
    if best_of_seeds and seed in df.columns:
        out.append(pl.col("_best").struct.field(seed).alias("chosen_seed"))
    return grouped.select([*lead, *out])


def _check_request(df: pl.DataFrame, values: list[str], confidence: float, best_of_seeds: str | None) -> None:
    """A confidence outside (0, 1), or a value or best-of-seeds column the frame lacks."""
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence={confidence} is invalid; allowed: a fraction in (0, 1), e.g. 0.95")
    missing = [v for v in values + ([best_of_seeds] if best_of_seeds else []) if v not in df.columns]
    if missing:
        raise AnalysisError(
            f"cannot aggregate {', '.join(missing)}: no such column; columns: "
            f"{', '.join(c for c in df.columns if not c.startswith('params.'))}"
        )


def _group_stats(df: pl.DataFrame, values: list[str], seed: str, carry: list[str]) -> list[pl.Expr]:
    """Per group: n_seeds and the sorted seeds, the carried columns' first values, and
    each value's mean, std and count (the interval is computed from these afterwards)."""
    stats = (
        [pl.len().alias("n_seeds"), pl.col(seed).sort().alias("seeds")]
        if seed in df.columns
        else [pl.len().alias("n_seeds")]
    )
    stats += [pl.col(c).first() for c in carry]
    for v in values:
        stats += [
            pl.col(v).mean().alias(f"{v}_mean"),
            pl.col(v).std(ddof=1).alias(f"{v}_std"),
            pl.col(v).count().alias(f"{v}_n"),
        ]
    return stats


def _best_seed_pick(
    df: pl.DataFrame, values: list[str], seed: str, best_of_seeds: str, maximize: bool | None
) -> pl.Expr:
    """_best: per group, the values (and seed) of the seed whose best_of_seeds column is
    best; a missing value ranks last, ties go to the lowest seed."""
    up = names.higher_is_better(best_of_seeds) if maximize is None else maximize
    if up is None:
        raise AnalysisError(f"best_of_seeds={best_of_seeds!r}: say maximize=True or False (no known direction)")
    ranked = pl.col(best_of_seeds).fill_null(-math.inf if up else math.inf)
    order = [ranked, pl.col(seed)] if seed in df.columns else [ranked]
    return (
        pl.struct([*values, *([seed] if seed in df.columns else [])])
        .sort_by(order, descending=[up, False][: len(order)])
        .first()
        .alias("_best")
    )


def _value_columns(grouped: pl.DataFrame, values: list[str], confidence: float, best: bool) -> list[pl.Expr]:
    """Each value's v, v_std, v_ci_low, v_ci_high: the mean with its Student-t interval,
    or under best-of-seeds the chosen seed's value and no interval."""
    counts = {n for v in values for n in grouped[f"{v}_n"].to_list() if n and n >= 2}
    t = {n: student_t_quantile(0.5 + confidence / 2.0, n - 1) for n in counts}
    out = []
    for v in values:
        half = (
            pl.col(f"{v}_n").replace_strict(t, default=None, return_dtype=pl.Float64)
            * pl.col(f"{v}_std")
            / pl.col(f"{v}_n").cast(pl.Float64).sqrt()
        )
        if best:
            out += [
                pl.col("_best").struct.field(v).alias(v),
                pl.col(f"{v}_std"),
                pl.lit(None, pl.Float64).alias(f"{v}_ci_low"),
                pl.lit(None, pl.Float64).alias(f"{v}_ci_high"),
            ]
        else:
            out += [
                pl.col(f"{v}_mean").alias(v),
                pl.col(f"{v}_std"),
                (pl.col(f"{v}_mean") - half).alias(f"{v}_ci_low"),
                (pl.col(f"{v}_mean") + half).alias(f"{v}_ci_high"),
            ]
    return out


def choose_best_seeds(
    points: pl.DataFrame,
    quality: str,
    *,
    maximize: bool | None = None,
    per=("experiment", "trial_config_hash"),
    on_point: str = FULL,
) -> pl.DataFrame:
    """The paper's best-of-seeds, per configuration: keep every point of the seed whose
    final-stage `on_point` evaluation (default: full) is best on `quality`. Points of
    one configuration then come from one seed, so a frontier never mixes seeds.
    Configurations without that point keep all their seeds."""
    up = names.higher_is_better(quality) if maximize is None else maximize
    final = points.filter(pl.col("is_final_stage") & (pl.col("policy") == on_point) & pl.col(quality).is_not_null())
    ranked = final.with_columns(pl.col(quality).alias("_score"))
    chosen = (
        ranked.sort(["_score", "seed"], descending=[bool(up), False], nulls_last=True)
        .group_by(list(per), maintain_order=True)
        .agg(pl.col("seed").first().alias("_chosen"))
    )
    merged = points.join(chosen, on=list(per), how="left")
    return merged.filter(pl.col("_chosen").is_null() | (pl.col("seed") == pl.col("_chosen"))).drop("_chosen")
