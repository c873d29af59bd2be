"""The per-loop instruments (analysis/per_loop.py): loops.csv and four charts."""

from __future__ import annotations

import polars as pl

from analysis.per_loop import COLUMNS, SHARED, loop_charts, loop_table
from analysis.report.context import ReportContext, Section
from analysis.report.render import render
from analysis.report.wording import mean_over


def loops_section(ctx: ReportContext) -> list[Section]:
    """Each stage's per-loop norms and skip footprint; nothing (a note) when none was logged."""
    table = loop_table(ctx.runs)
    if table is None:
        ctx.note("per-loop instruments: skipped, no stage logged loop<r>_* metrics")
        return []
    ctx.csv(table, "loops.csv")
    specs = loop_charts(table)
    for spec in specs:
        ctx.chart(spec)
    body = render("loops.html.j2", names=[spec.name for spec in specs], split=loops_split(table))
    return [("Per-loop instruments", body)]


def loops_split(table: pl.DataFrame) -> str:
    """What one per-loop line is: its axis values and the seeds it averages."""
    axes = [c for c in table.columns if c not in COLUMNS]
    split = (
        f"one line per stage, method and {' × '.join(axes)} (a stage the values share, the pre-training, "
        f"marked '{SHARED}')"
        if axes
        else "one line per stage and method"
    )
    return f"{split}: {mean_over(table['n'].to_list())} (n in its name)"
