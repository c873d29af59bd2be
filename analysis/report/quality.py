"""Which columns the report plots: the compute and quality axes by their CLI names,
their labels and directions, the quality `auto` picks, and the checks that the chosen
columns exist in every experiment."""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.errors import AnalysisError
from analysis.names import PARAM
from analysis.points import BEST_COLUMNS, QUANTITIES
from looplab import tracking

# Compute axes by their CLI names: (points column, axis label).
COMPUTE_AXES = {
    tracking.EXECUTED_LOOPS: (tracking.EXECUTED_LOOPS, "executed loops per token"),
    "downstream_loops": (tracking.LM_EVAL_LOOPS, "executed loops per token on the tasks"),
    "flops": (tracking.BACKBONE_FLOPS, "backbone FLOPs per token"),
    "time": ("pipeline_seconds", "training seconds up to the stage"),
}
QUALITY_LABELS = {
    tracking.ACCURACY: "accuracy",
    tracking.PPL: "validation perplexity",
    tracking.LOSS: "validation loss",
    tracking.LM_EVAL_AVG: "lm-eval average accuracy",
}
BASE_VALUES = (
    *QUANTITIES,
    *BEST_COLUMNS,
    tracking.LM_EVAL_AVG,
    *names.SUITE_MEANS,
    *names.BETA_DIAGNOSTICS,
    names.TRAIN_LOSS,
    tracking.STAGE_SECONDS,
    "pipeline_seconds",
)


def quality_label(quality: str) -> str:
    """The words for a quality column on an axis or in a caption."""
    return QUALITY_LABELS.get(quality, quality)


def task_columns(points: pl.DataFrame) -> list[str]:
    """Every per-task downstream column: accuracies and the families (loops, FLOPs, ...)."""
    return [c for family in (None, *tracking.LM_EVAL_FAMILIES) for c in names.task_columns(points.columns, family)]


def maximize(quality: str) -> bool:
    """Whether higher is better for quality; an unknown direction is the caller's error."""
    up = names.higher_is_better(quality.removesuffix("_best"))
    if up is None:
        raise AnalysisError(
            f"quality {quality!r} has no known direction; allowed: accuracy | ppl | loss | "
            f"{tracking.LM_EVAL_AVG} | lm_eval.<task> (or one of them with _best)"
        )
    return up


def resolve_quality(points: pl.DataFrame, quality: str, notes: list[str]) -> str:
    """quality, or for `auto` the measure every experiment has: the lm-eval average, else
    perplexity for text tasks, else accuracy."""
    if quality != "auto":
        maximize(quality)
        return quality
    final = points.filter(pl.col("is_final_stage"))
    per_exp = final.group_by("experiment").agg(
        pl.col(tracking.LM_EVAL_AVG).is_not_null().any().alias("lm"),
        (pl.col(PARAM + "task.kind") == "text").any().alias("text")
        if PARAM + "task.kind" in final.columns
        else pl.lit(False).alias("text"),
    )
    if per_exp.height and per_exp["lm"].all():
        return tracking.LM_EVAL_AVG
    if per_exp.height and per_exp["text"].all():
        return "ppl"
    if per_exp.height and per_exp["text"].any():
        notes.append(
            "text and synthetic tasks mixed: the frontier uses accuracy (next-token for text, exact match otherwise)"
        )
    return "accuracy"


def check_columns(points: pl.DataFrame, columns: list[str], strict: bool, notes: list[str]) -> None:
    """A compute or quality column that no run has, or that some experiment lacks."""
    for column in columns:
        if column not in points.columns or points[column].is_null().all():
            message = (
                f"no run logged {column!r} in {', '.join(sorted(set(points['experiment'].to_list())))}; "
                f"columns with values: {', '.join(available_columns(points))}"
            )
            if strict:
                raise AnalysisError(message)
            notes.append(message)
            continue
        have = points.group_by("experiment").agg(pl.col(column).is_not_null().any().alias("has"))
        lacking = have.filter(~pl.col("has"))["experiment"].to_list()
        if lacking:
            message = (
                f"mixed schemas: experiment {', '.join(map(repr, sorted(lacking)))} has no {column!r} "
                "(the other experiments do); analyse them separately or pick another column"
            )
            if strict:
                raise AnalysisError(message)
            notes.append(message)


def available_columns(points: pl.DataFrame) -> list[str]:
    """The compute and quality columns some run logged, for an error that names the alternatives."""
    candidates = [
        c
        for c in (
            tracking.EXECUTED_LOOPS,
            tracking.BACKBONE_FLOPS,
            "pipeline_seconds",
            tracking.ACCURACY,
            tracking.PPL,
            tracking.LOSS,
            tracking.LM_EVAL_AVG,
        )
        if c in points.columns
    ]
    return [c for c in candidates if points[c].is_not_null().any()] or ["none"]
