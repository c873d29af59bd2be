"""The sweep's question first: per value of the searched axis, the final stage's quality
at full depth (mean over seeds, its interval), the β diagnostics and the skip point at the
representative q where the stage has them; axis.csv and axis.png."""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.axis import Axis, format_value, with_axis_values
from analysis.charts import axis_chart, bars_phrase
from analysis.report.context import ReportContext, Section
from analysis.report.findings import findings_html
from analysis.report.quality import quality_label
from analysis.report.render import render
from analysis.report.wording import seed_phrase
from looplab import tracking
from looplab.policy import FULL, SKIP

DIAGNOSTICS = {tracking.EXIT_ENTROPY: "exit entropy", tracking.EXPECTED_EXIT_STEP: "expected exit step"}


def axis_section(ctx: ReportContext, agg: pl.DataFrame, axes: list[Axis], quality: str) -> list[Section]:
    """The searched axis' table, chart and findings; nothing (a note) when no final stage
    has the quality at full depth."""
    if not axes:
        return []
    final = with_axis_values(agg.filter(pl.col("is_final_stage")), axes)
    full = final.filter(pl.col("policy") == FULL)
    title = " × ".join(a.name for a in axes)
    if full.is_empty() or quality not in full.columns or full[quality].is_null().all():
        ctx.note(f"searched axis ({title}): skipped, no final stage has a full-depth {quality}")
        return []
    qlabel = quality_label(quality)
    several = full["method"].drop_nulls().n_unique() > 1
    keys = [a.name for a in axes] + (["method"] if several else [])
    table, diagnostics = full_depth_table(full, axes, keys, quality, qlabel)
    table, skip_label = with_skip_point(table, final, quality, qlabel, ctx.representative_q)
    table = table.sort([c for c in table.columns if c.startswith("_order")] + keys, nulls_last=True)
    shown = shown_columns(table, qlabel)
    ctx.csv(shown, "axis.csv")
    spec = axis_chart(table, axes, keys, quality, qlabel, skip_label)
    ctx.chart(spec)
    seeds = sorted({int(s) for ss in full["seeds"].to_list() for s in (ss or [])}) if "seeds" in full.columns else []
    body = render(
        "searched_axis.html.j2",
        findings=findings_html(agg, full, keys, quality, qlabel, title, ctx.confidence),
        title=title,
        qlabel=qlabel,
        bars=bars_phrase(spec),
        seeds=seed_phrase(seeds),
        confidence=f"{ctx.confidence:.0%}",
        diagnostics=bool(diagnostics),
        skip_q=format_value(ctx.representative_q) if skip_label else None,
        shown=shown,
    )
    return [(f"The searched axis: {title}", body)]


def full_depth_table(
    full: pl.DataFrame, axes: list[Axis], keys: list[str], quality: str, qlabel: str
) -> tuple[pl.DataFrame, list[pl.Expr]]:
    """Per configuration: its keys, seeds, the quality with its interval and the β
    diagnostics the stage logged, plus hidden _order columns that sort numeric axes by number."""
    low, high = names.interval_of(quality)
    columns: list[str | pl.Expr] = [
        *keys,
        pl.col("n_seeds").alias("seeds"),
        pl.col(quality).alias(qlabel),
        pl.col(low).alias(f"{qlabel} low"),
        pl.col(high).alias(f"{qlabel} high"),
    ]
    diagnostics = [
        pl.col(c).alias(label) for c, label in DIAGNOSTICS.items() if c in full.columns and full[c].is_not_null().any()
    ]
    columns += diagnostics
    order = [e.alias(f"_order{i}") for i, a in enumerate(axes) if (e := a.number_expr()) is not None]
    table = full.with_columns(order).select(*columns, "trial_config_hash", *(o.meta.output_name() for o in order))
    return table, diagnostics


def with_skip_point(
    table: pl.DataFrame, final: pl.DataFrame, quality: str, qlabel: str, representative_q: float | None
) -> tuple[pl.DataFrame, str | None]:
    """table joined with each configuration's skip point at the representative q (its
    executed loops and quality) and that point's label; the table alone when there is none."""
    if representative_q is None:
        return table, None
    skip = final.filter((pl.col("policy") == SKIP) & ((pl.col("q") - representative_q).abs() < 1e-9))
    if not (skip.height and skip[quality].is_not_null().any()):
        return table, None
    low, high = names.interval_of(quality)
    label = f"skip q={format_value(representative_q)}"
    joined = table.join(
        skip.select(
            "trial_config_hash",
            pl.col(tracking.EXECUTED_LOOPS).alias(f"{label} loops"),
            pl.col(quality).alias(f"{label} {qlabel}"),
            pl.col(low).alias("_skip_low"),
            pl.col(high).alias("_skip_high"),
        ),
        on="trial_config_hash",
        how="left",
    )
    return joined, label


def shown_columns(table: pl.DataFrame, qlabel: str) -> pl.DataFrame:
    """What axis.csv and the page show: no hidden helpers, no interval columns that are all empty."""
    return table.select(
        [
            c
            for c in table.columns
            if not c.startswith("_")
            and c != "trial_config_hash"
            and not (c in (f"{qlabel} low", f"{qlabel} high") and table[c].is_null().all())
        ]
    )
