"""β's diagnostics over training (App. D): exit entropy and expected exit step, one curve per β."""

from __future__ import annotations

import polars as pl

from analysis.charts import beta_charts
from analysis.load import RunSet, beta_histories
from analysis.names import PARAM
from analysis.report.context import ReportContext, Section
from analysis.report.render import render
from analysis.report.wording import mean_over


def beta_section(ctx: ReportContext) -> list[Section]:
    """The gate stage's diagnostic curves; nothing (a note) when no gate stage trained."""
    histories = beta_histories(ctx.runs)
    if histories is None or histories.is_empty():
        ctx.note("β diagnostics: skipped, no exit_entropy / expected_exit_step history (no gate stage trained)")
        return []
    specs = beta_charts(histories, n_loops=shared_n_loops(ctx.runs))
    for spec in specs:
        ctx.chart(spec)
    runs_per_beta = histories.group_by("beta").agg(pl.col("run_id").n_unique())["run_id"].to_list()
    body = render(
        "beta.html.j2",
        names=[spec.name for spec in specs],
        stage=str(histories["stage"][0]),
        mean_over=mean_over(runs_per_beta),
    )
    return [("β diagnostics", body)]


def shared_n_loops(runs: RunSet) -> int | None:
    """The loop count R every run has (the diagnostics' bound), None when they differ."""
    col = PARAM + "model.n_loops"
    if col not in runs.runs.columns:
        return None
    values = runs.runs[col].drop_nulls().unique().to_list()
    return int(values[0]) if len(values) == 1 else None
