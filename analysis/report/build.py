"""build_report: load the runs, run every section in the page's order, write the page
(assemble.py), the notes and (optionally) the MLflow artifacts."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from analysis.aggregate import aggregate_seeds, choose_best_seeds
from analysis.axis import searched_axes
from analysis.errors import AnalysisError
from analysis.load import RunSet, load_runs
from analysis.points import evaluation_points
from analysis.report.artifacts import log_to_sweep_run
from analysis.report.assemble import PLOTLY_JS, render_page, write_plotly_js
from analysis.report.bench import arrivals_section, speed_section
from analysis.report.beta import beta_section
from analysis.report.context import ReportContext, Section
from analysis.report.coverage import coverage_lines
from analysis.report.depth import depth_section
from analysis.report.downstream import downstream_section
from analysis.report.frontier import FrontierRequest, frontier_section
from analysis.report.loops import loops_section
from analysis.report.paper_tables import tables_section
from analysis.report.quality import (
    BASE_VALUES,
    COMPUTE_AXES,
    check_columns,
    maximize,
    resolve_quality,
    task_columns,
)
from analysis.report.scan import scan_section
from analysis.report.searched_axis import axis_section
from analysis.report.skip import skip_section
from analysis.report.wording import seed_phrase
from analysis.report.zoo import zoo_section
from analysis.tables import REPRESENTATIVE_Q
from looplab import tracking


@dataclass(frozen=True)
class ReportOptions:
    """How build_report reads the runs and what it draws (the analysis command's options).

    sweep_run_id: the sweep run whose artifacts the files become (default: the newest
    sweep run of the experiments); with scope "sweep" only that sweep's runs are read
    (analysis/load.sweep_runs: its subtree, the stage runs it reused, their evaluations),
    with "experiment" every run of the experiments; the page's header says which.
    trial_keys (scope "sweep"): the final stage keys of the sweep's trials, as its driver
    knows them, so that trials it reused whole from another sweep's run are read too.
    compute: executed_loops | flops | time | a
    points column. quality: auto (lm-eval average when every experiment has it, else
    perplexity for text tasks, else accuracy) | accuracy | ppl | loss | lm_eval_avg |
    lm_eval.<task> | <x>_best. stage: the stage whose evaluations make the frontier
    (default: each trial's final stage; "all": every stage, as separate series).
    series_by: columns that split the series (default method and policy). best_of_seeds:
    the paper's protocol for Mano and p-hop (per configuration, the seed with the best
    full-depth quality) instead of the mean. statuses: trial statuses kept (None: all).
    strict: a missing metric raises instead of a note. lead: sections (title, HTML) the
    caller puts first, e.g. sweeps/paper_mini.py's verdicts. representative_q: the q
    Table 4 shows each gated method at beside its best-Avg. q (the paper's 0.8; None:
    only the best)."""

    sweep_run_id: str | None = None
    log_artifacts: bool = True
    compute: str = tracking.EXECUTED_LOOPS
    quality: str = "auto"
    stage: str | None = None
    series_by: tuple[str, ...] | None = None
    best_of_seeds: bool = False
    confidence: float = 0.95
    budget: float | None = None
    scope: Literal["experiment", "sweep"] = "experiment"
    trial_keys: tuple[str, ...] = ()
    statuses: tuple[str, ...] | None = ("FINISHED",)
    strict: bool = False
    lead: tuple[Section, ...] = ()
    representative_q: float | None = REPRESENTATIVE_Q

    def __post_init__(self) -> None:
        if self.scope not in ("experiment", "sweep"):
            raise AnalysisError(f"scope={self.scope!r} is invalid; allowed: experiment | sweep")
        if self.scope == "sweep" and not self.sweep_run_id:
            raise AnalysisError("scope=sweep needs a sweep run id (--sweep-run ID)")
        if self.trial_keys and self.scope != "sweep":
            raise AnalysisError("trial_keys name one sweep's trials; allowed with scope=sweep only")


def build_report(tracking_uri: str, experiments, out_dir, options: ReportOptions | None = None) -> dict[str, Path]:
    """Write the analysis of `experiments` into out_dir (see the package docstring), as
    `options` say (ReportOptions; the defaults are what a sweep writes at its end)."""
    o = options or ReportOptions()
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(
        tracking_uri, experiments, sweep_run_id=o.sweep_run_id, subtree=o.scope == "sweep", trial_keys=o.trial_keys
    )
    ctx = ReportContext(runs, out, runs.notes, o.strict, o.confidence, o.representative_q)
    points = _evaluation_points(ctx, o.statuses)
    # The page opens with the sweep's own question (a scan's effects, the caller's lead,
    # the searched axis, β's diagnostics); the generic frontiers and tables follow.
    head: list[Section] = list(o.lead)
    sections: list[Section] = []
    best_of_seeds = False
    if points is not None:
        ctx.csv(points, "points.csv")
        request = _frontier_request(ctx, points, o)
        points, best_of_seeds = _seed_choice(points, request.quality, o.best_of_seeds, ctx.notes)
        head, sections = _point_sections(ctx, points, request, head)
    head += beta_section(ctx)
    sections = head + sections + loops_section(ctx) + speed_section(ctx, points) + arrivals_section(ctx)
    covered = coverage_lines(runs, o.sweep_run_id, o.scope)
    _write_page(ctx, sections, covered + meta_lines(runs, points, best_of_seeds, o.confidence))
    if o.log_artifacts:
        _log_artifacts(ctx, o.sweep_run_id)
    return ctx.paths


def _evaluation_points(ctx: ReportContext, statuses) -> pl.DataFrame | None:
    """The evaluation-points table; None (a note) when no run has an evaluation, an error when strict."""
    try:
        return evaluation_points(ctx.runs, statuses=statuses)
    except AnalysisError as e:
        if ctx.strict:
            raise
        ctx.note(str(e))
        return None


def _frontier_request(ctx: ReportContext, points: pl.DataFrame, o: ReportOptions) -> FrontierRequest:
    """The frontier's axes: the asked-for quality (auto resolved), and for a downstream
    quality the loops executed on the tasks rather than on the validation set."""
    compute = o.compute
    quality = resolve_quality(points, o.quality, ctx.notes)
    if (
        compute == tracking.EXECUTED_LOOPS
        and quality.startswith(("lm_eval", tracking.LM_EVAL_AVG))
        and points[tracking.LM_EVAL_LOOPS].is_not_null().any()
    ):
        compute = "downstream_loops"
        ctx.note("frontier: downstream quality against the loops executed on the tasks (lm_eval_loops)")
    compute_col = COMPUTE_AXES.get(compute, (compute, compute))[0]
    check_columns(points, [compute_col, quality], ctx.strict, ctx.notes)
    return FrontierRequest(compute, compute_col, quality, o.stage, o.series_by, o.budget)


def _seed_choice(
    points: pl.DataFrame, quality: str, best_of_seeds: bool, notes: list[str]
) -> tuple[pl.DataFrame, bool]:
    """points reduced to the best seed per configuration when asked and possible; whether it was."""
    if best_of_seeds and quality in points.columns and points[quality].is_not_null().any():
        return choose_best_seeds(points, quality, maximize=maximize(quality)), True
    if best_of_seeds:
        notes.append(f"best of seeds: not applied, no {quality!r} to choose seeds by; seeds are averaged")
    return points, False


def _point_sections(
    ctx: ReportContext, points: pl.DataFrame, request: FrontierRequest, lead: list[Section]
) -> tuple[list[Section], list[Section]]:
    """The sections read from the evaluation points, seeds pooled (aggregated.csv): the
    page's head (a scan's effects, the lead, the searched axis) and its generic body."""
    values = [v for v in (*BASE_VALUES, *task_columns(points)) if v in points.columns]
    agg = aggregate_seeds(points, values, confidence=ctx.confidence)
    ctx.csv(agg, "aggregated.csv")
    scan = scan_section(ctx, points)
    axes = [] if scan else searched_axes(agg)  # a scan's section is its axes'
    head = scan + lead + axis_section(ctx, agg, axes, request.quality)
    body = [
        *frontier_section(ctx, agg, request, axes),
        *downstream_section(ctx, agg),
        *zoo_section(ctx, agg, request.quality),
        *skip_section(ctx, agg),
        *tables_section(ctx, agg),
        *depth_section(ctx, points),
    ]
    return head, body


def _write_page(ctx: ReportContext, sections: list[Section], meta: list[str]) -> None:
    """report.html (every section and chart), plotly.js beside it, and notes.txt."""
    page = render_page(
        title=f"looplab analysis: {', '.join(ctx.runs.experiments.values())}",
        meta=meta,
        notes=ctx.notes,
        sections=sections,
        charts=ctx.charts,
    )
    (ctx.out / "report.html").write_text(page)
    ctx.paths["report.html"] = ctx.out / "report.html"
    ctx.paths[PLOTLY_JS] = write_plotly_js(ctx.out)  # an artifact too: the logged folder works alone
    _write_notes(ctx)
    ctx.paths["notes.txt"] = ctx.out / "notes.txt"


def _write_notes(ctx: ReportContext) -> None:
    (ctx.out / "notes.txt").write_text("\n".join(ctx.notes) + ("\n" if ctx.notes else ""))


def _log_artifacts(ctx: ReportContext, sweep_run_id: str | None) -> None:
    """Log the written files to the sweep run; notes.txt is written again with the outcome."""
    log_to_sweep_run(ctx.runs, sweep_run_id, ctx.paths, ctx.notes, ctx.strict)
    _write_notes(ctx)


def meta_lines(runs: RunSet, points: pl.DataFrame | None, best_of_seeds: bool, confidence: float) -> list[str]:
    """The page's header: the store, the runs by level, the points and seeds, the time written."""
    levels = runs.runs["level"].value_counts(sort=True)
    counted = ", ".join(f"{n} {lvl or 'untagged'}" for lvl, n in levels.iter_rows())
    lines = [f"tracking URI: {runs.tracking_uri}", f"runs: {runs.runs.height} ({counted})"]
    if points is not None:
        seeds = sorted(set(points["seed"].drop_nulls().to_list()))
        lines.append(
            f"evaluation points: {points.height}; {seed_phrase(seeds)}; "
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
