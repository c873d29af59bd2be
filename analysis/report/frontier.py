"""The compute–quality frontier section: each series' Pareto frontier (frontier.csv,
frontier.png), the area between every two series' frontiers (frontier_areas.csv) and
the best point under a compute budget (budget.csv)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import polars as pl

from analysis import names
from analysis.axis import Axis, series_name
from analysis.charts import ChartSpec, bars_phrase, frontier_chart, legend_entries
from analysis.errors import AnalysisError
from analysis.frontier import best_under_budget, frontier_gap, pareto_frontier
from analysis.points import full_as_forced_depth
from analysis.report.context import ReportContext, Section
from analysis.report.quality import COMPUTE_AXES, maximize, quality_label
from analysis.report.render import html_table, render

AXIS_VALUES = "axis_values"  # the frontier rows' "β=0.25" column: a series' colour when the axis splits them
MAX_AREA_SERIES = 12  # pairs grow quadratically; beyond this the areas table is left out
# frontier.csv's first columns, in this order; the rest follow as the points table has them.
FRONTIER_LEAD = [
    "series",
    "compute_metric",
    "compute",
    "quality_metric",
    "quality",
    "quality_std",
    "quality_ci_low",
    "quality_ci_high",
    "n_seeds",
    "on_frontier",
    "experiment",
    "method",
    "label",
    "stage",
    "policy",
    "q",
    "depth",
    "point",
    "trial_config_hash",
]
AREAS_SCHEMA = {
    "series_a": pl.String,
    "series_b": pl.String,
    "area": pl.Float64,
    "mean_gap": pl.Float64,
    "compute_from": pl.Float64,
    "compute_to": pl.Float64,
    "note": pl.String,
}


@dataclass(frozen=True)
class FrontierRequest:
    """What the caller asked the frontier to show: compute (its CLI name and points column)
    against quality, for which stage, split into which series, under which budget."""

    compute: str
    compute_col: str
    quality: str
    stage: str | None = None
    series_by: tuple[str, ...] | list[str] | None = None
    budget: float | None = None


def frontier_rows(agg: pl.DataFrame, stage: str | None, series_by, axes: list[Axis]) -> pl.DataFrame:
    """The stage's rows with a series column: the searched axis' values and the policy when
    the sweep varied an axis and the caller named no split, else series_by (default
    method and policy, the stage too for stage="all")."""
    rows = full_as_forced_depth(_stage_rows(agg, stage))
    if axes and not series_by:  # the sweep's values split the series: "β=0.25 · skip" (method first when several)
        parts = [
            *(["method"] if rows["method"].drop_nulls().n_unique() > 1 else []),
            *(["stage"] if stage == "all" else []),
        ]
        return rows.with_columns(series_name(axes).alias(AXIS_VALUES)).with_columns(
            pl.concat_str(
                [*(pl.col(p).cast(pl.String).fill_null("?") for p in parts), pl.col(AXIS_VALUES), pl.col("policy")],
                separator=" · ",
            ).alias("series")
        )
    parts = list(series_by) if series_by else ["method", *(["stage"] if stage == "all" else []), "policy"]
    missing = [p for p in parts if p not in rows.columns]
    if missing:
        raise AnalysisError(
            f"cannot split series by {', '.join(missing)}: no such column (params are "
            f"params.<name>, e.g. params.exit.beta)"
        )
    return rows.with_columns(
        pl.concat_str([pl.col(p).cast(pl.String).fill_null("?") for p in parts], separator=" · ").alias("series")
    )


def _stage_rows(agg: pl.DataFrame, stage: str | None) -> pl.DataFrame:
    """The evaluations the frontier is drawn from: each trial's final stage, every stage, or one."""
    if stage is None:
        return agg.filter(pl.col("is_final_stage"))
    if stage == "all":
        return agg
    rows = agg.filter(pl.col("stage") == stage)
    if rows.is_empty():
        present = names.ordered_stages(agg["stage"].to_list())
        raise AnalysisError(
            f"no evaluations of stage {stage!r}; stages evaluated: {', '.join(present) or 'none'} (or all)"
        )
    return rows


def check_series_columns(rows: pl.DataFrame, series_by, strict: bool, notes: list[str]) -> None:
    """A series column some experiment lacks: its series read '?' (an error when strict)."""
    for column in series_by:
        have = rows.group_by("experiment").agg(pl.col(column).is_not_null().any().alias("has"))
        lacking = have.filter(~pl.col("has"))["experiment"].to_list()
        if lacking and have.height > 1:
            message = (
                f"mixed schemas: experiment {', '.join(map(repr, sorted(lacking)))} has no {column!r}; "
                "its series are labelled '?'"
            )
            if strict:
                raise AnalysisError(message)
            notes.append(message)


def flag_frontier(rows: pl.DataFrame, compute_col: str, quality: str) -> pl.DataFrame:
    """Rows with a series column as frontier_chart draws them: compute, quality, its
    seed interval, on_frontier per series."""
    flagged = pareto_frontier(rows, compute_col, quality, maximize=maximize(quality), by="series")
    return flagged.with_columns(
        pl.col(compute_col).alias("compute"),
        pl.col(quality).alias("quality"),
        pl.col(f"{quality}_ci_low").alias("quality_ci_low"),
        pl.col(f"{quality}_ci_high").alias("quality_ci_high"),
    ).sort("series", "compute", "quality")


def frontier_table(flagged: pl.DataFrame, compute_col: str, quality: str) -> pl.DataFrame:
    """frontier.csv: the flagged rows under generic names (compute, quality and its
    spread), FRONTIER_LEAD first, so every report's file reads the same."""
    frontier = flagged.with_columns(
        pl.lit(compute_col).alias("compute_metric"),
        pl.lit(quality).alias("quality_metric"),
        pl.col(compute_col).alias("compute"),
        pl.col(quality).alias("quality"),
        pl.col(f"{quality}_std").alias("quality_std"),
        pl.col(f"{quality}_ci_low").alias("quality_ci_low"),
        pl.col(f"{quality}_ci_high").alias("quality_ci_high"),
    ).sort("series", "compute", "quality")
    return frontier.select(FRONTIER_LEAD + [c for c in frontier.columns if c not in FRONTIER_LEAD])


def legend_title(frontier: pl.DataFrame, request: FrontierRequest, axes: list[Axis]) -> str:
    """What the series vary in, e.g. "method · policy" or "β · policy"."""
    if request.series_by:
        return " · ".join(request.series_by)
    by_axis = bool(axes)
    several = frontier["method"].drop_nulls().n_unique() > 1
    return " · ".join(
        [
            *(["method"] if several or not by_axis else []),
            *(["stage"] if request.stage == "all" else []),
            *(a.name for a in axes if by_axis),
            "policy",
        ]
    )


def frontier_spec(frontier: pl.DataFrame, agg: pl.DataFrame, request: FrontierRequest, axes: list[Axis]) -> ChartSpec:
    """The frontier chart: labelled axes, coloured by the searched axis' values when they split the series."""
    compute_label = COMPUTE_AXES.get(request.compute, (request.compute, request.compute))[1]
    best = " (best of seeds)" if "chosen_seed" in agg.columns else ""
    label = quality_label(request.quality) + best
    stage = request.stage
    which = "final stage" if stage is None else ("every stage" if stage == "all" else f"stage {stage}")
    by_axis = bool(axes) and not request.series_by
    return frontier_chart(
        frontier,
        request.compute_col,
        request.quality,
        compute_label=compute_label,
        quality_label=label,
        title=f"{label} against {compute_label} ({which})",
        legend_title=legend_title(frontier, request, axes if by_axis else []),
        colour_by=AXIS_VALUES if by_axis else None,
    )


def frontier_section(
    ctx: ReportContext, agg: pl.DataFrame, request: FrontierRequest, axes: list[Axis]
) -> list[Section]:
    """Each series' frontier (frontier.csv, frontier.png), the areas between frontiers and
    the best point under the budget; nothing (a note) when the rows cannot be split."""
    up = maximize(request.quality)
    try:
        rows = frontier_rows(agg, request.stage, request.series_by, axes)
        if request.series_by:
            check_series_columns(rows, request.series_by, ctx.strict, ctx.notes)
        flagged = pareto_frontier(rows, request.compute_col, request.quality, maximize=up, by="series")
    except AnalysisError as e:
        if ctx.strict:
            raise
        ctx.note(f"frontier: skipped, {e}")
        return []
    frontier = frontier_table(flagged, request.compute_col, request.quality)
    ctx.csv(frontier, "frontier.csv")
    spec = frontier_spec(frontier, agg, request, axes)
    ctx.chart(spec)
    tables = [*_areas_table(ctx, frontier, request), *_budget_table(ctx, frontier, request)]
    body = render(
        "frontier.html.j2",
        bars=bars_phrase(spec),
        factored=legend_entries(spec) is not None,
        colour=" · ".join(a.name for a in axes),
        tables=tables,
    )
    return [("Compute–quality frontier", body)]


def _areas_table(ctx: ReportContext, frontier: pl.DataFrame, request: FrontierRequest) -> list[str]:
    """frontier_areas.csv and its HTML table, when there are two to MAX_AREA_SERIES series."""
    areas = frontier_areas(frontier, maximize(request.quality), ctx.notes)
    if areas is None:
        return []
    ctx.csv(areas, "frontier_areas.csv")
    caption = (
        "Area between frontiers (step functions over the shared compute range; positive: the first series "
        "is better). Mean gap = area / range width."
    )
    return [html_table(areas, caption)]


def _budget_table(ctx: ReportContext, frontier: pl.DataFrame, request: FrontierRequest) -> list[str]:
    """budget.csv and its HTML table, when a budget was given and some point is under it."""
    if request.budget is None:
        return []
    chosen = budget_picks(frontier, request, request.budget, ctx.notes)
    if chosen is None:
        return []
    ctx.csv(chosen, "budget.csv")
    return [html_table(chosen, f"Best point with {request.compute_col} <= {request.budget:g}, overall and per series.")]


def frontier_areas(frontier: pl.DataFrame, maximize: bool, notes: list[str]) -> pl.DataFrame | None:
    """The signed area between every two series' frontiers; None for one series or too many."""
    groups = {name[0]: g for name, g in frontier.group_by("series", maintain_order=True)}
    if len(groups) < 2:
        return None
    if len(groups) > MAX_AREA_SERIES:
        notes.append(f"frontier areas: skipped, {len(groups)} series (at most {MAX_AREA_SERIES} compared pairwise)")
        return None
    rows = []
    for a, b in itertools.combinations(sorted(groups), 2):
        row = {"series_a": a, "series_b": b, "area": None, "mean_gap": None}
        row |= {"compute_from": None, "compute_to": None, "note": ""}
        try:
            gap = frontier_gap(groups[a], groups[b], "compute", "quality", maximize=maximize)
        except AnalysisError as e:
            row["note"] = str(e)
        else:
            row |= {
                "area": gap["area"],
                "mean_gap": gap["mean_gap"],
                "compute_from": gap["lo"],
                "compute_to": gap["hi"],
            }
        rows.append(row)
    return pl.DataFrame(rows, schema=AREAS_SCHEMA)


def budget_picks(
    frontier: pl.DataFrame, request: FrontierRequest, budget: float, notes: list[str]
) -> pl.DataFrame | None:
    """The best point with compute under the budget, over all series and per series."""
    picks = []
    quality = request.quality
    scopes = [("all series", frontier)] + [(name[0], g) for name, g in frontier.group_by("series", maintain_order=True)]
    for scope, rows in scopes:
        try:
            best = best_under_budget(rows, "compute", "quality", budget, maximize=maximize(quality))
        except AnalysisError as e:
            notes.append(f"budget {budget:g} ({scope}): {e}")
            continue
        picks.append(
            {
                "scope": scope,
                "series": best["series"],
                "label": best["label"],
                "point": best["point"],
                "stage": best["stage"],
                request.compute_col: best["compute"],
                quality: best["quality"],
                "n_seeds": best["n_seeds"],
            }
        )
    return pl.DataFrame(picks) if picks else None
