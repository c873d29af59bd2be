"""The effective-depth exponent of a loop (analysis/depth_fit.py): depth_fit.csv, depth_fit.png."""

from __future__ import annotations

import polars as pl

from analysis.report.context import ReportContext, Section
from analysis.report.render import render


def depth_section(ctx: ReportContext, points: pl.DataFrame) -> list[Section]:
    """γ per experiment and architecture with its chart; nothing (notes) without a design to fit."""
    from analysis.depth_fit import write_depth_fit  # numpy's fit only where a report asks for it

    written, table, spec, skipped = write_depth_fit(points, ctx.out)
    ctx.notes.extend(skipped)
    if table is None or spec is None:  # write_depth_fit returns both or neither
        return []
    ctx.paths.update(written)
    ctx.chart(spec)
    shown = table.select(
        "experiment", "arch", "setting", "gamma", "low", "high", "a", "b", "rmse", "n_points", "at_bound"
    )
    return [("Effective depth of a loop", render("depth.html.j2", shown=shown))]
