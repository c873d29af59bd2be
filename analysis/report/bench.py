"""The speed sweep's measurements (analysis/bench.py): prefill throughput beside the
stage's perplexity, and decoding under continuous arrivals; nothing without speed runs."""

from __future__ import annotations

import polars as pl

from analysis.charts import bars_phrase
from analysis.report.context import ReportContext, Section
from analysis.report.render import render
from looplab import tracking


def speed_section(ctx: ReportContext, points: pl.DataFrame | None) -> list[Section]:
    """The timed prefill points: speed.csv, speed.png."""
    from analysis.bench import PPL_FULL, speed_chart, speed_table

    table = speed_table(ctx.runs, points)
    if table is None:
        return []
    ctx.csv(table, "speed.csv")
    spec = speed_chart(table)
    if spec is None:
        ctx.note("prefill speed: no chart, no timed stage has a validation perplexity under its policies")
    else:
        ctx.chart(spec)
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
    return [("Prefill speed against quality", render("speed.html.j2", charted=spec is not None, shown=shown))]


def arrivals_section(ctx: ReportContext) -> list[Section]:
    """Decoding under continuous arrivals (the speed sweep's --arrivals runs): arrivals.csv, arrivals.png."""
    from analysis.bench import arrivals_chart, arrivals_table, where_skipping_pays

    table = arrivals_table(ctx.runs)
    if table is None:
        return []
    ctx.csv(table, "arrivals.csv")
    spec = arrivals_chart(table)
    bars = None
    if spec is not None:
        ctx.chart(spec)
        bars = bars_phrase(
            spec, "the range over the timed repeats (the point is their median)", "one timed repeat: no range"
        )
    verdict = where_skipping_pays(table)
    return [("Decoding under continuous arrivals", render("arrivals.html.j2", bars=bars, table=table, verdict=verdict))]
