"""Fig. 2: perplexity under skip execution at each q, full depth dashed."""

from __future__ import annotations

import polars as pl

from analysis.charts import skip_chart
from analysis.report.context import ReportContext, Section
from analysis.report.render import chart_slot


def skip_section(ctx: ReportContext, agg: pl.DataFrame) -> list[Section]:
    """The skip chart; nothing when no final stage ran skip."""
    spec = skip_chart(agg)
    if spec is None:
        return []
    ctx.chart(spec)
    caption = "Final stage, skip execution at each q; dashed: all R loops (Fig. 2)."
    return [("Perplexity under skip", chart_slot(spec.name, caption))]
