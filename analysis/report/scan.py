"""A scan's effects along its axes (analysis/scan.py), first in its report."""

from __future__ import annotations

import polars as pl

from analysis.charts import ChartSpec, bars_phrase
from analysis.errors import AnalysisError
from analysis.report.context import ReportContext, Section
from analysis.report.render import render
from analysis.scan import scan_axes, write_scan


def scan_section(ctx: ReportContext, points: pl.DataFrame) -> list[Section]:
    """The scan's charts and table; nothing when the runs are no scan (a note when its effects fail)."""
    axes = scan_axes(ctx.runs.runs)
    if not axes:
        return []
    try:
        written, table, specs = write_scan(points, axes, ctx.out)
    except AnalysisError as e:
        ctx.note(f"effect against scale: skipped, {e}")
        return []
    ctx.paths.update(written)
    ctx.charts.extend(specs)  # write_scan drew the PNGs
    every_series = ChartSpec("", "", "", "", [s for spec in specs for s in spec.series])
    body = render(
        "scan.html.j2",
        names=[spec.name for spec in specs],
        axes=", ".join(axes),
        bars=bars_phrase(every_series, "95 % intervals over seeds (analysis/claims.py)"),
        table=table,
    )
    return [("Effect against scale", body)]
