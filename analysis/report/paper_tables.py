"""The paper-shaped tables (analysis/tables.py): tables/*.md, *.csv, tables.md all in one."""

from __future__ import annotations

import polars as pl

from analysis.report.context import ReportContext, Section
from analysis.report.render import render
from analysis.tables import all_tables


def tables_section(ctx: ReportContext, agg: pl.DataFrame) -> list[Section]:
    """Every table the data supports, written under tables/; the others' reasons as notes."""
    tables, skipped = all_tables(agg, ctx.representative_q)
    ctx.notes.extend(skipped)
    if not tables:
        return []
    folder = ctx.out / "tables"
    for table in tables:
        ctx.paths.update({f"tables/{k}": v for k, v in table.write(folder).items()})
    (folder / "tables.md").write_text("\n".join(t.markdown() for t in tables))
    ctx.paths["tables/tables.md"] = folder / "tables.md"
    # Each table renders its own HTML (analysis/tables.py): the template places it as it is.
    return [("Tables", render("paper_tables.html.j2", tables=[t.html() for t in tables]))]
