"""build_report: MLflow runs → every file of the analysis, in one call.

    from analysis.report import build_report
    paths = build_report(uri, ["beta_ablation-local"], "runs/beta/analysis", sweep_run_id=run_id)

writes into out_dir:
  axis.csv               the sweep's searched axis first (analysis/axis.py): per value, the final stage's
                         quality at full depth with its seed interval, β diagnostics, skip at the
                         representative q; absent when the runs vary nothing but the seed
  points.csv             the evaluation-points table (one row per trial × stage × point)
  aggregated.csv         the same, seeds pooled per configuration (mean, std, t-interval, n)
  frontier.csv           the frontier's input points (seeds pooled) with on_frontier flags
  frontier_areas.csv     the signed area between every two series' frontiers
  budget.csv             the best point under --budget, overall and per series (when given)
  tables/*.md, *.csv     the paper-shaped tables (analysis.tables), tables.md all in one
  downstream.csv         Fig. 3's points (downstream Avg. against executed loops on the tasks, per arm)
  zoo.csv                each zero-shot exit rule's frontier against the learned gate's (area, mean gap)
  loops.csv              the per-loop instruments (analysis/per_loop.py)
  speed.csv              timed prefill points beside the stage's perplexity (analysis/speed.py; speed runs only)
  depth_fit.csv          a loop's worth in layers, γ of loss ≈ a + b·log(N·R^γ) with its interval, per
                         experiment and arch (analysis/depth_fit.py; pre-training at ≥ 2 N and ≥ 2 R)
  scan.csv, scan.md      a scan's effects along its axes (analysis/scan.py; scan.png, scan_<axis>.png)
  *.png                  axis.png, frontier.png, downstream.png (Fig. 3), zoo.png, skip_ppl.png,
                         beta_exit_entropy.png, beta_expected_exit_step.png, loops_*.png, speed.png,
                         depth_fit.png
  report.html            one self-contained interactive page with all of it
  notes.txt              what was skipped and why
and logs them as artifacts (folder `analysis`) of the sweep run: `sweep_run_id`, or
the newest run tagged level=sweep in the experiments. Returns {file name: path}.

With strict=False (what sweeps call) a missing metric never raises: what the data
supports is written and notes.txt says what was skipped. strict=True (the CLI) raises
AnalysisError when the asked-for compute or quality exists in no run or not in every
experiment (mixed schemas), or when no run has an evaluation metric at all.
"""

from __future__ import annotations

import datetime as _dt
import html
import itertools
import shutil
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import polars as pl

from analysis import names
from analysis.names import PARAM
from analysis.aggregate import aggregate_seeds, choose_best_seeds
from analysis.axis import Axis, format_value, searched_axes, series_name, with_axis_values
from analysis.charts import (
    ChartSpec,
    axis_chart,
    bars_phrase,
    beta_charts,
    downstream_rows,
    frontier_chart,
    legend_entries,
    skip_chart,
    zoo_rows,
)
from analysis.errors import AnalysisError
from analysis.frontier import best_under_budget, frontier_gap, pareto_frontier
from analysis.load import RunSet, beta_histories, load_runs
from analysis.page import chart_slot, render_page
from analysis.per_loop import loop_charts, loop_table
from analysis.scan import scan_axes, write_scan
from analysis.plots import render_png
from analysis.points import BEST_COLUMNS, QUANTITIES, evaluation_points, full_as_forced_depth, shared_once
from analysis.prose import Arm, findings
from analysis.tables import REPRESENTATIVE_Q, all_tables
from looplab import tracking
from looplab.policy import FULL, SKIP

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
ARTIFACT_DIR = "analysis"
AXIS_VALUES = "axis_values"  # the frontier rows' "β=0.25" column: a series' colour when the axis splits them
MAX_AREA_SERIES = 12  # pairs grow quadratically; beyond this the areas table is left out


def build_report(
    tracking_uri: str,
    experiments,
    out_dir,
    *,
    sweep_run_id: str | None = None,
    log_artifacts: bool = True,
    compute: str = tracking.EXECUTED_LOOPS,
    quality: str = "auto",
    stage: str | None = None,
    series_by=None,
    best_of_seeds: bool = False,
    confidence: float = 0.95,
    budget: float | None = None,
    scope: str = "experiment",
    statuses=("FINISHED",),
    strict: bool = False,
    lead: list[tuple[str, str]] | None = None,
    representative_q: float | None = REPRESENTATIVE_Q,
) -> dict[str, Path]:
    """Write the analysis of `experiments` into out_dir (see the module docstring).

    compute: executed_loops | flops | time | a points column. quality: auto (lm-eval
    average when every experiment has it, else perplexity for text tasks, else
    accuracy) | accuracy | ppl | loss | lm_eval_avg | lm_eval.<task> | <x>_best.
    stage: the stage whose evaluations make the frontier (default: each trial's final
    stage; "all": every stage, as separate series). series_by: columns that split the
    series (default method and policy). best_of_seeds: the paper's protocol for Mano
    and p-hop (per configuration, the seed with the best full-depth quality) instead
    of the mean. scope: "experiment" reads every run of the experiments; "sweep" only
    the subtree of sweep_run_id. statuses: trial statuses kept (None: all). lead: sections
    (title, HTML) the caller puts first, e.g. sweeps/paper_mini.py's verdicts.
    representative_q: the q Table 4 shows each gated method at beside its best-Avg. q
    (the paper's 0.8; None: only the best)."""
    if scope not in ("experiment", "sweep"):
        raise AnalysisError(f"scope={scope!r} is invalid; allowed: experiment | sweep")
    if scope == "sweep" and not sweep_run_id:
        raise AnalysisError("scope=sweep needs a sweep run id (--sweep-run ID)")
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(tracking_uri, experiments, sweep_run_id=sweep_run_id, subtree=scope == "sweep")
    notes = runs.notes
    paths: dict[str, Path] = {}
    try:
        points = evaluation_points(runs, statuses=statuses)
    except AnalysisError as e:
        if strict:
            raise
        notes.append(str(e))
        points = None

    # The page opens with the sweep's own question (a scan's effects, the caller's lead,
    # the searched axis, β's diagnostics); the generic frontiers and tables follow.
    head: list[tuple[str, str]] = list(lead or [])
    sections: list[tuple[str, str]] = []
    charts: list[ChartSpec] = []
    if points is not None:
        paths.update(write_csv(points, out / "points.csv"))
        quality = _resolve_quality(points, quality, notes)
        if (
            compute == tracking.EXECUTED_LOOPS
            and quality.startswith(("lm_eval", tracking.LM_EVAL_AVG))
            and points[tracking.LM_EVAL_LOOPS].is_not_null().any()
        ):
            # A downstream quality against the loops run on the same tasks, not the validation set's.
            compute = "downstream_loops"
            notes.append("frontier: downstream quality against the loops executed on the tasks (lm_eval_loops)")
        compute_col = COMPUTE_AXES.get(compute, (compute, compute))[0]
        _check_columns(points, [compute_col, quality], strict, notes)
        if best_of_seeds and quality in points.columns and points[quality].is_not_null().any():
            points = choose_best_seeds(points, quality, maximize=_maximize(quality))
        elif best_of_seeds:
            notes.append(f"best of seeds: not applied, no {quality!r} to choose seeds by; seeds are averaged")
            best_of_seeds = False
        values = [v for v in (*BASE_VALUES, *_task_columns(points)) if v in points.columns]
        agg = aggregate_seeds(points, values, confidence=confidence)
        paths.update(write_csv(agg, out / "aggregated.csv"))
        scan = _scan_section(runs, points, out, paths, charts, notes)
        axes = [] if scan else searched_axes(agg)  # a scan's section is its axes'
        question = _axis_section(agg, axes, quality, representative_q, confidence, out, paths, charts, notes)
        head = scan + head + question
        sections += _frontier_section(
            agg, compute, compute_col, quality, stage, series_by, budget, out, paths, charts, notes, strict, axes
        )
        sections += _downstream_section(agg, out, paths, charts, notes)
        sections += _zoo_section(agg, quality, out, paths, charts, notes)
        sections += _skip_section(agg, out, paths, charts)
        sections += _tables_section(agg, out, paths, notes, representative_q)
        sections += _depth_section(points, out, paths, charts, notes)
    head += _beta_section(runs, out, paths, charts, notes)
    sections = head + sections
    sections += _loops_section(runs, out, paths, charts, notes)
    sections += _speed_section(runs, points, out, paths, charts, notes)
    sections += _arrivals_section(runs, out, paths, charts, notes)
    meta = _meta(runs, points, best_of_seeds, confidence)
    page = render_page(
        title=f"looplab analysis: {', '.join(runs.experiments.values())}",
        meta=meta,
        notes=notes,
        sections=sections,
        charts=charts,
    )
    (out / "report.html").write_text(page)
    paths["report.html"] = out / "report.html"
    (out / "notes.txt").write_text("\n".join(notes) + ("\n" if notes else ""))
    paths["notes.txt"] = out / "notes.txt"
    if log_artifacts:
        _log_artifacts(runs, sweep_run_id, paths, notes, strict)
        (out / "notes.txt").write_text("\n".join(notes) + ("\n" if notes else ""))
    return paths


def write_csv(df: pl.DataFrame, path: Path) -> dict[str, Path]:
    """df as CSV, list columns (a trial's curves, a point's seeds) joined with ';'."""
    lists = [c for c, t in df.schema.items() if isinstance(t, pl.List)]
    df.with_columns([pl.col(c).cast(pl.List(pl.String)).list.join(";") for c in lists]).write_csv(path)
    return {path.name: path}


def _task_columns(points: pl.DataFrame) -> list[str]:
    """Every per-task downstream column: accuracies and the families (loops, FLOPs, ...)."""
    return [c for family in (None, *tracking.LM_EVAL_FAMILIES) for c in names.task_columns(points.columns, family)]


def _maximize(quality: str) -> bool:
    up = names.higher_is_better(quality.removesuffix("_best"))
    if up is None:
        raise AnalysisError(
            f"quality {quality!r} has no known direction; allowed: accuracy | ppl | loss | "
            f"{tracking.LM_EVAL_AVG} | lm_eval.<task> (or one of them with _best)"
        )
    return up


def _resolve_quality(points: pl.DataFrame, quality: str, notes: list[str]) -> str:
    if quality != "auto":
        _maximize(quality)
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


def _check_columns(points: pl.DataFrame, columns: list[str], strict: bool, notes: list[str]) -> None:
    """A compute or quality column that no run has, or that some experiment lacks."""
    for column in columns:
        if column not in points.columns or points[column].is_null().all():
            message = (
                f"no run logged {column!r} in {', '.join(sorted(set(points['experiment'].to_list())))}; "
                f"columns with values: {', '.join(_available(points))}"
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


def _available(points: pl.DataFrame) -> list[str]:
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


def _frontier_rows(
    agg: pl.DataFrame, stage: str | None, series_by, quality: str, axes: list[Axis] = ()
) -> pl.DataFrame:
    if stage is None:
        rows = agg.filter(pl.col("is_final_stage"))
    elif stage == "all":
        rows = agg
    else:
        rows = agg.filter(pl.col("stage") == stage)
        if rows.is_empty():
            present = names.ordered_stages(agg["stage"].to_list())
            raise AnalysisError(
                f"no evaluations of stage {stage!r}; stages evaluated: {', '.join(present) or 'none'} (or all)"
            )
    rows = full_as_forced_depth(rows)
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


def _frontier_section(
    agg,
    compute,
    compute_col,
    quality,
    stage,
    series_by,
    budget,
    out,
    paths,
    charts,
    notes,
    strict,
    axes: list[Axis] = (),
) -> list[tuple[str, str]]:
    maximize = _maximize(quality)
    try:
        rows = _frontier_rows(agg, stage, series_by, quality, axes)
        if series_by:
            _check_series_columns(rows, series_by, strict, notes)
        flagged = pareto_frontier(rows, compute_col, quality, maximize=maximize, by="series")
    except AnalysisError as e:
        if strict:
            raise
        notes.append(f"frontier: skipped, {e}")
        return []
    frontier = flagged.with_columns(
        pl.lit(compute_col).alias("compute_metric"),
        pl.lit(quality).alias("quality_metric"),
        pl.col(compute_col).alias("compute"),
        pl.col(quality).alias("quality"),
        pl.col(f"{quality}_std").alias("quality_std"),
        pl.col(f"{quality}_ci_low").alias("quality_ci_low"),
        pl.col(f"{quality}_ci_high").alias("quality_ci_high"),
    ).sort("series", "compute", "quality")
    lead = [
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
    frontier = frontier.select(lead + [c for c in frontier.columns if c not in lead])
    paths.update(write_csv(frontier, out / "frontier.csv"))

    compute_label = COMPUTE_AXES.get(compute, (compute, compute))[1]
    quality_label = QUALITY_LABELS.get(quality, quality) + (" (best of seeds)" if "chosen_seed" in agg.columns else "")
    which = "final stage" if stage is None else ("every stage" if stage == "all" else f"stage {stage}")
    by_axis = bool(axes) and not series_by
    several = frontier["method"].drop_nulls().n_unique() > 1
    legend = (
        " · ".join(series_by)
        if series_by
        else " · ".join(
            [
                *(["method"] if several or not by_axis else []),
                *(["stage"] if stage == "all" else []),
                *(a.name for a in axes if by_axis),
                "policy",
            ]
        )
    )
    spec = frontier_chart(
        frontier,
        compute_col,
        quality,
        compute_label=compute_label,
        quality_label=quality_label,
        title=f"{quality_label} against {compute_label} ({which})",
        legend_title=legend,
        colour_by=AXIS_VALUES if by_axis else None,
    )
    paths["frontier.png"] = render_png(spec, out / "frontier.png")
    charts.append(spec)
    factored = legend_entries(spec) is not None
    html_parts = [
        chart_slot(
            "frontier",
            "Each series' Pareto frontier as a step line (outlined points are on it); "
            f"{bars_phrase(spec)}. "
            + (
                f"Colour: {' · '.join(a.name for a in axes)}; line style: policy. Click a colour's legend entry to "
                "hide its series"
                if factored
                else "Click a legend entry to hide a series"
            )
            + "; drag to zoom, double-click to reset.",
        )
    ]

    areas = _areas(frontier, maximize, notes)
    if areas is not None:
        paths.update(write_csv(areas, out / "frontier_areas.csv"))
        html_parts.append(
            _html_table(
                areas,
                "Area between frontiers (step functions over the shared compute range; positive: the first series "
                "is better). Mean gap = area / range width.",
            )
        )
    if budget is not None:
        chosen = _budget(frontier, compute_col, quality, budget, maximize, notes)
        if chosen is not None:
            paths.update(write_csv(chosen, out / "budget.csv"))
            html_parts.append(
                _html_table(chosen, f"Best point with {compute_col} <= {budget:g}, overall and per series.")
            )
    return [("Compute–quality frontier", "".join(html_parts))]


def _axis_section(
    agg, axes: list[Axis], quality, representative_q, confidence, out, paths, charts, notes
) -> list[tuple[str, str]]:
    """The sweep's question first: per value of the searched axis, the final stage's
    quality at full depth (mean over seeds, its interval), the β diagnostics and the
    skip point at the representative q where the stage has them; axis.csv and axis.png."""
    if not axes:
        return []
    final = with_axis_values(agg.filter(pl.col("is_final_stage")), axes)
    full = final.filter(pl.col("policy") == FULL)
    title = " × ".join(a.name for a in axes)
    if full.is_empty() or quality not in full.columns or full[quality].is_null().all():
        notes.append(f"searched axis ({title}): skipped, no final stage has a full-depth {quality}")
        return []
    qlabel = QUALITY_LABELS.get(quality, quality)
    several = full["method"].drop_nulls().n_unique() > 1
    keys = [a.name for a in axes] + (["method"] if several else [])
    low, high = names.interval_of(quality)
    columns = [
        *keys,
        pl.col("n_seeds").alias("seeds"),
        pl.col(quality).alias(qlabel),
        pl.col(low).alias(f"{qlabel} low"),
        pl.col(high).alias(f"{qlabel} high"),
    ]
    extras = {tracking.EXIT_ENTROPY: "exit entropy", tracking.EXPECTED_EXIT_STEP: "expected exit step"}
    diagnostics = [
        pl.col(c).alias(label) for c, label in extras.items() if c in full.columns and full[c].is_not_null().any()
    ]
    columns += diagnostics
    order = [e.alias(f"_order{i}") for i, a in enumerate(axes) if (e := a.number_expr()) is not None]
    table = full.with_columns(order).select(*columns, "trial_config_hash", *(o.meta.output_name() for o in order))
    skip_label = None
    if representative_q is not None:
        skip = final.filter((pl.col("policy") == SKIP) & ((pl.col("q") - representative_q).abs() < 1e-9))
        if skip.height and skip[quality].is_not_null().any():
            skip_label = f"skip q={format_value(representative_q)}"
            table = table.join(
                skip.select(
                    "trial_config_hash",
                    pl.col(tracking.EXECUTED_LOOPS).alias(f"{skip_label} loops"),
                    pl.col(quality).alias(f"{skip_label} {qlabel}"),
                    pl.col(low).alias("_skip_low"),
                    pl.col(high).alias("_skip_high"),
                ),
                on="trial_config_hash",
                how="left",
            )
    sort = [c for c in table.columns if c.startswith("_order")] + keys
    table = table.sort(sort, nulls_last=True)
    shown = table.select(
        [
            c
            for c in table.columns
            if not c.startswith("_")
            and c != "trial_config_hash"
            and not (c in (f"{qlabel} low", f"{qlabel} high") and table[c].is_null().all())
        ]
    )
    paths.update(write_csv(shown, out / "axis.csv"))

    spec = axis_chart(table, axes, keys, quality, qlabel, skip_label)
    paths["axis.png"] = render_png(spec, out / "axis.png")
    charts.append(spec)
    seeds = sorted({int(s) for ss in full["seeds"].to_list() for s in (ss or [])}) if "seeds" in full.columns else []
    caption = (
        f"What the sweep varied: {title}. Per value, the final stage at full depth: {qlabel}, mean over "
        f"{_seed_phrase(seeds)} with its {confidence:.0%} Student-t interval (low–high; none with one seed)"
        + (", the training's last exit entropy and expected exit step" if diagnostics else "")
        + (
            f", and skip execution at q={format_value(representative_q)}: executed loops and {qlabel}"
            if skip_label
            else ""
        )
        + ". axis.csv has the same rows; the frontier below splits its series "
        f"by {title} too."
    )
    return [
        (
            f"The searched axis: {title}",
            _findings_html(agg, full, keys, quality, qlabel, title, confidence)
            + chart_slot(
                "axis",
                f"{qlabel} against {title}; {bars_phrase(spec)}"
                + ("; dashed: skip at the representative q" if skip_label else "")
                + ".",
            )
            + _html_table(shown, caption),
        )
    ]


def _seed_phrase(seeds: list[int]) -> str:
    """'3 seeds (0, 1, 2)', '1 seed (0)': a count, never a bare list that reads '0 seeds'."""
    if not seeds:
        return "the seeds"
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})"


def _check_series_columns(rows: pl.DataFrame, series_by, strict: bool, notes: list[str]) -> None:
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


def _areas(frontier: pl.DataFrame, maximize: bool, notes: list[str]) -> pl.DataFrame | None:
    groups = {name[0]: g for name, g in frontier.group_by("series", maintain_order=True)}
    if len(groups) < 2:
        return None
    if len(groups) > MAX_AREA_SERIES:
        notes.append(f"frontier areas: skipped, {len(groups)} series (at most {MAX_AREA_SERIES} compared pairwise)")
        return None
    rows = []
    for a, b in itertools.combinations(sorted(groups), 2):
        try:
            gap = frontier_gap(groups[a], groups[b], "compute", "quality", maximize=maximize)
        except AnalysisError as e:
            rows.append(
                {
                    "series_a": a,
                    "series_b": b,
                    "area": None,
                    "mean_gap": None,
                    "compute_from": None,
                    "compute_to": None,
                    "note": str(e),
                }
            )
            continue
        rows.append(
            {
                "series_a": a,
                "series_b": b,
                "area": gap["area"],
                "mean_gap": gap["mean_gap"],
                "compute_from": gap["lo"],
                "compute_to": gap["hi"],
                "note": "",
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "series_a": pl.String,
            "series_b": pl.String,
            "area": pl.Float64,
            "mean_gap": pl.Float64,
            "compute_from": pl.Float64,
            "compute_to": pl.Float64,
            "note": pl.String,
        },
    )


def _budget(frontier, compute_col, quality, budget, maximize, notes) -> pl.DataFrame | None:
    picks = []
    scopes = [("all series", frontier)] + [(name[0], g) for name, g in frontier.group_by("series", maintain_order=True)]
    for scope, rows in scopes:
        try:
            best = best_under_budget(rows, "compute", "quality", budget, maximize=maximize)
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
                compute_col: best["compute"],
                quality: best["quality"],
                "n_seeds": best["n_seeds"],
            }
        )
    return pl.DataFrame(picks) if picks else None


def _flagged(rows: pl.DataFrame, compute_col: str, quality: str) -> pl.DataFrame:
    """Rows with a series column as frontier_chart draws them: compute, quality, its
    seed interval, on_frontier per series."""
    maximize = _maximize(quality)
    flagged = pareto_frontier(rows, compute_col, quality, maximize=maximize, by="series")
    return flagged.with_columns(
        pl.col(compute_col).alias("compute"),
        pl.col(quality).alias("quality"),
        pl.col(f"{quality}_ci_low").alias("quality_ci_low"),
        pl.col(f"{quality}_ci_high").alias("quality_ci_high"),
    ).sort("series", "compute", "quality")


def _downstream_section(agg, out, paths, charts, notes) -> list[tuple[str, str]]:
    """Fig. 3: downstream average accuracy against the loops executed on the tasks."""
    rows = downstream_rows(agg)
    if rows is None:
        notes.append(
            "downstream accuracy (Fig. 3): skipped, no downstream evaluations with executed loops "
            "(lm_eval.* and lm_eval_loops.*: --eval-tasks, or python -m sweeps.evaluate)"
        )
        return []
    flagged = _flagged(rows, tracking.LM_EVAL_LOOPS, tracking.LM_EVAL_AVG)
    lead = [
        "series",
        "compute",
        "quality",
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
    ]
    paths.update(write_csv(flagged.select([c for c in lead if c in flagged.columns]), out / "downstream.csv"))
    spec = frontier_chart(
        flagged,
        tracking.LM_EVAL_LOOPS,
        tracking.LM_EVAL_AVG,
        name="downstream",
        compute_label="executed loops per token on the tasks",
        quality_label="downstream average accuracy",
        title="Downstream accuracy against executed loops (Fig. 3)",
    )
    paths["downstream.png"] = render_png(spec, out / "downstream.png")
    charts.append(spec)
    return [
        (
            "Downstream accuracy against compute",
            chart_slot(
                "downstream",
                "Average accuracy over the evaluated tasks against the loops executed per token on them: the "
                "pre-trained model forced to each depth (App. E), and each gated method's final stage under "
                f"dense and skip over q (App. F); {bars_phrase(spec, 'seed intervals')}; step lines: each series' "
                "frontier.",
            ),
        )
    ]


def _zoo_section(agg, quality, out, paths, charts, notes) -> list[tuple[str, str]]:
    """The zero-shot exit rules beside the learned gate: does the gate earn its training?"""
    # The axes the rules were measured on: downstream when they were evaluated on tasks,
    # else the validation set's, in the report's quality when they have it.
    rules = agg.filter(pl.col("is_final_stage") & pl.col("policy").str.contains("-", literal=True))
    axes = [(tracking.LM_EVAL_LOOPS, tracking.LM_EVAL_AVG)] + [
        (tracking.EXECUTED_LOOPS, q)
        for q in dict.fromkeys((quality, tracking.ACCURACY, tracking.PPL, tracking.LOSS))
        if q in QUALITY_LABELS and q != tracking.LM_EVAL_AVG
    ]
    found = next(
        (
            (c, q)
            for c, q in axes
            if c in rules.columns
            and q in rules.columns
            and rules.filter(pl.col(c).is_not_null() & pl.col(q).is_not_null()).height
        ),
        None,
    )
    rows = zoo_rows(agg, *found) if found else None
    if rows is not None:
        compute_col, zoo_quality = found
        downstream = compute_col == tracking.LM_EVAL_LOOPS
    if rows is None:
        notes.append(
            "policy zoo: skipped, no zero-shot exit rule evaluated on a final stage "
            "(metrics like skip_entropy2.5_*, dense_kl0.01_*)"
        )
        return []
    maximize = _maximize(zoo_quality)
    flagged = _flagged(rows, compute_col, zoo_quality)
    groups = {name[0]: g for name, g in flagged.group_by("series", maintain_order=True)}
    gaps = []
    for series, group in groups.items():
        method, _, policy = series.partition(" · ")
        if not names.is_rule_policy(policy):
            continue
        gate = f"{method} · {policy.split('-', 1)[0]}"
        row = {
            "method": method,
            "rule": policy,
            "gate": gate,
            "area": None,
            "mean_gap": None,
            "compute_from": None,
            "compute_to": None,
            "note": "",
        }
        if gate not in groups:
            row["note"] = f"no learned gate under {policy.split('-', 1)[0]} in {method}"
        else:
            try:
                gap = frontier_gap(groups[gate], group, "compute", "quality", maximize=maximize)
                row.update(
                    area=gap["area"],
                    mean_gap=gap["mean_gap"],
                    compute_from=gap["lo"],
                    compute_to=gap["hi"],
                    note="the gate is better"
                    if gap["area"] > 0
                    else "the rule is better"
                    if gap["area"] < 0
                    else "a tie",
                )
            except AnalysisError as e:
                row["note"] = str(e)
        gaps.append(row)
    table = pl.DataFrame(
        gaps,
        schema={
            "method": pl.String,
            "rule": pl.String,
            "gate": pl.String,
            "area": pl.Float64,
            "mean_gap": pl.Float64,
            "compute_from": pl.Float64,
            "compute_to": pl.Float64,
            "note": pl.String,
        },
    )
    paths.update(write_csv(table, out / "zoo.csv"))
    label = QUALITY_LABELS.get(zoo_quality, zoo_quality)
    compute_label = COMPUTE_AXES["downstream_loops" if downstream else tracking.EXECUTED_LOOPS][1]
    spec = frontier_chart(
        flagged,
        compute_col,
        zoo_quality,
        name="zoo",
        compute_label=compute_label,
        quality_label=label,
        title=f"Exit rules against the learned gate ({label})",
    )
    paths["zoo.png"] = render_png(spec, out / "zoo.png")
    charts.append(spec)
    return [
        (
            "Policy zoo: zero-shot exit rules against the learned gate",
            chart_slot(
                "zoo",
                "Final stage of each trial: each zero-shot exit rule (execution-rule, over its threshold) beside the "
                "learned gate (over q) of the same method and execution.",
            )
            + _html_table(
                table,
                "Area between the gate's frontier and each rule's over their shared compute range (step functions; "
                "positive: the learned gate is better, so it earns its training). Mean gap = area / range width.",
            ),
        )
    ]


def _skip_section(agg, out, paths, charts) -> list[tuple[str, str]]:
    spec = skip_chart(agg)
    if spec is None:
        return []
    png = f"{spec.name}.png"
    paths[png] = render_png(spec, out / png)
    charts.append(spec)
    return [
        (
            "Perplexity under skip",
            chart_slot(spec.name, "Final stage, skip execution at each q; dashed: all R loops (Fig. 2)."),
        )
    ]


def _tables_section(agg, out, paths, notes, representative_q=REPRESENTATIVE_Q) -> list[tuple[str, str]]:
    tables, skipped = all_tables(agg, representative_q)
    notes.extend(skipped)
    if not tables:
        return []
    folder = out / "tables"
    for table in tables:
        paths.update({f"tables/{k}": v for k, v in table.write(folder).items()})
    (folder / "tables.md").write_text("\n".join(t.markdown() for t in tables))
    paths["tables/tables.md"] = folder / "tables.md"
    return [("Tables", "".join(t.html() for t in tables))]


def _depth_section(points, out, paths, charts, notes) -> list[tuple[str, str]]:
    """The effective-depth exponent of a loop (analysis/depth_fit.py): depth_fit.csv, depth_fit.png."""
    from analysis.depth_fit import write_depth_fit  # numpy's fit only where a report asks for it

    written, table, spec, skipped = write_depth_fit(points, out)
    notes.extend(skipped)
    if table is None:
        return []
    paths.update(written)
    paths["depth_fit.png"] = render_png(spec, out / "depth_fit.png")
    charts.append(spec)
    shown = table.select(
        "experiment", "arch", "setting", "gamma", "low", "high", "a", "b", "rmse", "n_points", "at_bound"
    )
    return [
        (
            "Effective depth of a loop",
            chart_slot(
                "depth_fit",
                "Pre-training validation loss at full depth "
                "against N·R^γ, points coloured by R, the fitted "
                "a + b·log(N·R^γ) dashed.",
            )
            + _html_table(
                shown,
                "γ: what one loop is worth in unshared layers (1: a layer, 0: nothing), fitted per experiment and "
                "architecture by least squares over γ ∈ [0, 1.5]; low–high: its profile-likelihood "
                "interval; at_bound: the estimate or interval touches the search range's edge.",
            ),
        )
    ]


def _beta_section(runs: RunSet, out, paths, charts, notes) -> list[tuple[str, str]]:
    histories = beta_histories(runs)
    if histories is None or histories.is_empty():
        notes.append("β diagnostics: skipped, no exit_entropy / expected_exit_step history (no gate stage trained)")
        return []
    specs = beta_charts(histories, n_loops=_n_loops(runs))
    slots = []
    for spec in specs:
        paths[f"{spec.name}.png"] = render_png(spec, out / f"{spec.name}.png")
        charts.append(spec)
        slots.append(chart_slot(spec.name))
    stage = histories["stage"][0]
    runs_per_beta = histories.group_by("beta").agg(pl.col("run_id").n_unique())["run_id"].to_list()
    return [
        (
            "β diagnostics",
            "".join(slots) + f'<p class="caption">Stage {html.escape(str(stage))} training, one '
            f"curve per β ({_mean_over(runs_per_beta)}), cut to the steps every run reached (App. D).</p>",
        )
    ]


def _mean_over(counts: list[int]) -> str:
    """What a curve per group is, from its runs per group: 'one run each', 'mean over 3 seeds'."""
    if not counts or max(counts) == 1:
        return "one run each, no mean"
    low, high = min(counts), max(counts)
    return f"mean over {low} seeds" if low == high else f"mean over {low}–{high} seeds"


def _loops_split(table: pl.DataFrame) -> str:
    """What one per-loop line is: its axis values and the seeds it averages."""
    from analysis.per_loop import COLUMNS, SHARED

    axes = [c for c in table.columns if c not in COLUMNS]
    split = (
        f"one line per stage, method and {' × '.join(axes)} (a stage the values share, the pre-training, "
        f"marked '{SHARED}')"
        if axes
        else "one line per stage and method"
    )
    return f"{split}: {_mean_over(table['n'].to_list())} (n in its name)"


def _findings_html(agg, full, keys, quality, qlabel, title, confidence) -> str:
    """'What this sweep found': sentences generated from the axis table (analysis/prose.py)."""
    low, high = names.interval_of(quality)

    def arms(column: str, lo: str | None, hi: str | None) -> list[Arm]:
        rows = full.filter(pl.col(column).is_not_null())
        return [
            Arm(
                " · ".join(f"{k}={r[k]}" if k != "method" else str(r[k]) for k in keys),
                float(r[column]),
                r.get(lo) if lo else None,
                r.get(hi) if hi else None,
                int(r["n_seeds"]),
            )
            for r in rows.iter_rows(named=True)
        ]

    others = tuple(
        (QUALITY_LABELS[c], arms(c, *names.interval_of(c)))
        for c in (tracking.ACCURACY, tracking.PPL)
        if c != quality and c in full.columns and full[c].is_not_null().any()
    )
    final = ", ".join(names.ordered_stages(full["stage"].drop_nulls().unique().to_list()))
    sentences = findings(
        arms(quality, low, high),
        measure=qlabel,
        axis=title,
        higher_is_better=bool(_maximize(quality)),
        baseline=_baseline(agg, quality),
        others=others,
        confidence=confidence,
        result=f"final-stage ({final}) result",
    )
    return "<h3>What this sweep found</h3><p>" + html.escape(" ".join(sentences)) + "</p>"


def _baseline(agg: pl.DataFrame, quality: str) -> Arm | None:
    """The model the searched stages start from: the one pre-trained (gateless, not final)
    stage configuration every trial shares, at full depth; None when there is not exactly one."""
    from looplab.stages import STAGES

    gateless = [s for s, stage in STAGES.items() if not stage.gated]
    rows = shared_once(
        agg.filter(
            pl.col("stage").is_in(gateless)
            & ~pl.col("is_final_stage")
            & (pl.col("policy") == FULL)
            & pl.col(quality).is_not_null()
        )
    )
    if rows.height != 1:
        return None
    r = rows.row(0, named=True)
    low, high = names.interval_of(quality)
    return Arm(f"the pre-trained model ({r['stage']})", float(r[quality]), r.get(low), r.get(high), int(r["n_seeds"]))


def _scan_section(runs: RunSet, points, out, paths, charts, notes) -> list[tuple[str, str]]:
    """A scan's effects along its axes (analysis/scan.py), first in its report."""
    axes = scan_axes(runs.runs)
    if not axes:
        return []
    try:
        written, table, specs = write_scan(points, axes, out)
    except AnalysisError as e:
        notes.append(f"effect against scale: skipped, {e}")
        return []
    paths.update(written)
    charts.extend(specs)
    slots = "".join(chart_slot(spec.name) for spec in specs)
    return [
        (
            "Effect against scale",
            slots
            + '<p class="caption">Each line varies one axis of the scan ('
            + html.escape(", ".join(axes))
            + "); "
            + bars_phrase(
                ChartSpec("", "", "", "", [s for spec in specs for s in spec.series]),
                "95 % intervals over seeds (analysis/claims.py)",
            )
            + ". "
            "scan.md and scan.csv hold every configuration.</p>" + _html_table(table, "every configuration and effect"),
        )
    ]


def _loops_section(runs: RunSet, out, paths, charts, notes) -> list[tuple[str, str]]:
    """The per-loop instruments (analysis/per_loop.py): loops.csv and four charts."""
    table = loop_table(runs)
    if table is None:
        notes.append("per-loop instruments: skipped, no stage logged loop<r>_* metrics")
        return []
    paths.update(write_csv(table, out / "loops.csv"))
    slots = []
    for spec in loop_charts(table):
        paths[f"{spec.name}.png"] = render_png(spec, out / f"{spec.name}.png")
        charts.append(spec)
        slots.append(chart_slot(spec.name))
    return [
        (
            "Per-loop instruments",
            "".join(slots)
            + '<p class="caption">Each stage\'s last evaluation, '
            + html.escape(_loops_split(table))
            + ": the hidden-state RMS norm and the gradient norm reaching the shared block from each loop "
            "(full depth); under skip on the final gated stage, the fraction of tokens still running each loop and "
            "the relative distance of their states from the dense run's (the cache holes' footprint). "
            "loops.csv has every stage and q.</p>",
        )
    ]


def _speed_section(runs: RunSet, points, out, paths, charts, notes) -> list[tuple[str, str]]:
    """The speed sweep's timed points beside the stage's perplexity (analysis/speed.py):
    speed.csv, speed.png; nothing when the experiments hold no speed run."""
    from analysis.speed import PPL_FULL, speed_chart, speed_table

    table = speed_table(runs, points)
    if table is None:
        return []
    paths.update(write_csv(table, out / "speed.csv"))
    slots = ""
    spec = speed_chart(table)
    if spec is None:
        notes.append("prefill speed: no chart, no timed stage has a validation perplexity under its policies")
    else:
        paths["speed.png"] = render_png(spec, out / "speed.png")
        charts.append(spec)
        slots = chart_slot(
            "speed",
            "Each checkpoint's validation perplexity at full compute and under each timed "
            "skip policy against the prefill throughput measured at that batch and length "
            "(batch · L / median time); the label has the executed loops and the speedup.",
        )
    shown = table.select(
        "checkpoint",
        "method",
        "device",
        "batch",
        "seq_len",
        "policy",
        tracking.EXECUTED_LOOPS,
        tracking.TOKENS_PER_S_FULL,
        tracking.TOKENS_PER_S_SKIP,
        "speedup",
        "loop_bound",
        tracking.FLOP_RATIO,
        "of_flop_ratio",
        PPL_FULL,
        tracking.PPL,
    )
    return [
        (
            "Prefill speed against quality",
            slots
            + _html_table(
                shown,
                "Each timed point (sweeps/speed.py; one MLflow run per point and machine): executed loops d̄ on the "
                "timed inputs, tokens/s of full and skip execution, the measured speedup, its loop bound R/d̄ and "
                "FLOP ratio (F0 + R·Fr)/(F0 + d̄·Fr), the share of the FLOP ratio reached, and the stage's validation "
                "perplexity at full depth and under the same policy. speed.csv has every column.",
            ),
        )
    ]


def _arrivals_section(runs: RunSet, out, paths, charts, notes) -> list[tuple[str, str]]:
    """Decoding under continuous arrivals (the speed sweep's --arrivals runs,
    analysis/speed.py): arrivals.csv and arrivals.png; nothing when there are none."""
    from analysis.speed import arrivals_chart, arrivals_table

    table = arrivals_table(runs)
    if table is None:
        return []
    paths.update(write_csv(table, out / "arrivals.csv"))
    slots = ""
    spec = arrivals_chart(table)
    if spec is not None:
        paths["arrivals.png"] = render_png(spec, out / "arrivals.png")
        charts.append(spec)
        slots = chart_slot(
            "arrivals",
            "Decode tokens/s of each checkpoint, schedule and policy against its executed "
            "loops d̄; dashed: full's decode tokens/s times the FLOP ratio at that d̄; "
            f"{bars_phrase(spec, 'the range over the timed repeats (the point is their median)', 'one timed repeat: no range')}.",
        )
    return [
        (
            "Decoding under continuous arrivals",
            slots
            + _html_table(
                table,
                "Each point (sweeps/speed.py --arrivals; one MLflow run per point and machine): requests of drawn "
                "lengths on a fixed number of cache rows, a freed row taking the next request; speedup is decode "
                "tokens/s over full's in the same rows and schedule. arrivals.csv has every column.",
            ),
        )
    ]


def _n_loops(runs: RunSet) -> int | None:
    col = PARAM + "model.n_loops"
    if col not in runs.runs.columns:
        return None
    values = runs.runs[col].drop_nulls().unique().to_list()
    return int(values[0]) if len(values) == 1 else None


def _html_table(df: pl.DataFrame, caption: str) -> str:
    def cell(v):
        if v is None:
            return ""
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row) + "</tr>" for row in df.iter_rows()
    )
    return (
        f'<p class="caption">{html.escape(caption)}</p><table class="paper"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _meta(runs: RunSet, points, best_of_seeds: bool, confidence: float) -> list[str]:
    levels = runs.runs["level"].value_counts(sort=True)
    counted = ", ".join(f"{n} {lvl or 'untagged'}" for lvl, n in levels.iter_rows())
    lines = [f"tracking URI: {runs.tracking_uri}", f"runs: {runs.runs.height} ({counted})"]
    if points is not None:
        seeds = sorted(set(points["seed"].drop_nulls().to_list()))
        lines.append(
            f"evaluation points: {points.height}; {_seed_phrase(seeds)}; "
            + (
                "best of seeds per configuration"
                if best_of_seeds
                else "one seed: no mean, no interval"
                if len(seeds) <= 1
                else f"mean over seeds, {confidence:.0%} Student-t interval"
            )
        )
    lines.append(f"written {_dt.datetime.now().isoformat(timespec='seconds')}")
    return lines


def _local_artifact_dir(runs: RunSet, run_id: str) -> Path | None:
    """The run's artifact folder when its artifact URI is a local path (file:// or
    plain), else None. A run outside the loaded runs (another experiment) goes
    through MLflow."""
    hit = runs.runs.filter(pl.col("run_id") == run_id)
    uri = hit["artifact_uri"][0] if hit.height else None
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


def newest_sweep_run(runs: RunSet) -> str | None:
    sweeps = runs.runs.filter(pl.col("level") == tracking.SWEEP).sort("start_time", descending=True)
    return sweeps["run_id"][0] if sweeps.height else None


def _log_artifacts(
    runs: RunSet, sweep_run_id: str | None, paths: dict[str, Path], notes: list[str], strict: bool
) -> None:
    """The files this report wrote (not whatever else lies in out_dir), under analysis/."""
    target = sweep_run_id or newest_sweep_run(runs)
    if target is None:
        notes.append("artifacts: not logged, no run tagged level=sweep in the experiments (pass --sweep-run ID)")
        return
    try:
        local = _local_artifact_dir(runs, target)
        if local is not None:  # what MLflow's LocalArtifactRepository does, without importing mlflow (4 s)
            for name, path in paths.items():
                dest = local / ARTIFACT_DIR / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
        else:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=runs.tracking_uri)
            for name, path in paths.items():
                folder = Path(name).parent.as_posix()
                client.log_artifact(
                    target, str(path), artifact_path=ARTIFACT_DIR if folder == "." else f"{ARTIFACT_DIR}/{folder}"
                )
    except Exception as e:  # noqa: BLE001 -- any store failure (permissions, server) must not cost the written files
        message = f"artifacts: logging to run {target} failed ({type(e).__name__}: {str(e).splitlines()[0]})"
        if strict:
            raise AnalysisError(message) from None
        notes.append(message)
        return
    notes.append(f"artifacts: logged to run {target} under {ARTIFACT_DIR}/")
