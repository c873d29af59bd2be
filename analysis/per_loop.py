"""The per-loop instruments (looplab/training/instruments.py) as a table and charts.

Every stage logs, at each evaluation, per loop r: the hidden-state RMS norm and the
gradient norm reaching the shared block from loop r (full depth), and under skip at each
q the fraction of tokens still running and the relative distance of their states from
the dense run's (tracking.loop_metric names). The table keeps each stage's last values,
one row per (stage run, policy, loop, quantity), the seeds pooled per (method, stage,
policy, loop, quantity) with their mean and count; a stage several trials share counts
once (by stage key).

    loop_table(runs)   -> method, stage, policy, q, loop, quantity, value (mean over seeds), n
    loop_charts(table) -> hidden norm and gradient per loop, per stage and method; under skip
                          (final gated stages, q in CHART_QS) the active fraction and the state gap
"""

from __future__ import annotations

import polars as pl

from analysis.charts import PALETTE, ChartSpec, Point, Series
from analysis.load import PARAM, RunSet
from looplab.policy import FULL, SKIP
from looplab.stages import STAGE_NAMES
from looplab.tracking import ACTIVE, GRAD_NORM, HIDDEN_NORM, STAGE, STAGE_KEY, STATE_GAP, parse_loop_metric

CHART_QS = (0.2, 0.4)  # the skip thresholds the charts draw (the table has every q)
LABELS = {
    HIDDEN_NORM: "hidden-state RMS norm",
    GRAD_NORM: "gradient norm from the loop",
    ACTIVE: "fraction of tokens running the loop",
    STATE_GAP: "state gap to dense (relative L2)",
}


def loop_table(runs: RunSet) -> pl.DataFrame | None:
    """The per-loop instruments of the stage runs (None when no run logged any)."""
    parsed = [(k, *p) for k in runs.metrics["key"].unique().to_list() if (p := parse_loop_metric(k)) is not None]
    if not parsed:
        return None
    keys = pl.DataFrame(
        {
            "key": [k for k, *_ in parsed],
            "policy": [p.execution if p is not None else FULL for _, p, _, _ in parsed],
            "q": [p.q if p is not None else None for _, p, _, _ in parsed],
            "loop": [r for *_, r, _ in parsed],
            "quantity": [q for *_, q in parsed],
        },
        schema_overrides={"q": pl.Float64},
    )
    seed = PARAM + "train.seed"
    stages = runs.runs.filter(pl.col("level") == STAGE)
    stages = stages.select(
        "run_id", "stage", "method", STAGE_KEY, (pl.col(seed) if seed in stages.columns else pl.lit(None)).alias("seed")
    )
    stages = stages.unique(STAGE_KEY, keep="first", maintain_order=True)  # a reused stage counts once
    values = (
        runs.metrics.join(keys, on="key")
        .join(stages, on="run_id")
        .select("method", "stage", "policy", "q", "loop", "quantity", "seed", pl.col("last").alias("value"))
    )
    if values.is_empty():
        return None
    return (
        values.group_by("method", "stage", "policy", "q", "loop", "quantity", maintain_order=True)
        .agg(pl.col("value").mean(), pl.col("seed").n_unique().alias("n"))
        .sort("quantity", "method", "stage", "policy", "q", "loop", nulls_last=True)
    )


def loop_charts(table: pl.DataFrame) -> list[ChartSpec]:
    """Hidden norm and gradient per loop (series: stage · method); under skip, on the final
    gated stage, the active fraction and state gap (series: method · q)."""
    charts = []
    order = {s: i for i, s in enumerate(STAGE_NAMES)}
    for quantity in (HIDDEN_NORM, GRAD_NORM):
        rows = table.filter((pl.col("quantity") == quantity) & (pl.col("policy") == FULL))
        series_keys = sorted(
            {(s, m) for s, m in rows.select("stage", "method").iter_rows()},
            key=lambda sm: (order.get(sm[0], 99), str(sm[1])),
        )
        charts.append(_chart(f"loops_{quantity}", rows, series_keys, ("stage", "method"), quantity))
    gated_last = table.filter(pl.col("policy") == SKIP)["stage"].unique().to_list()
    final = max(gated_last, key=lambda s: order.get(s, -1)) if gated_last else None
    for quantity in (ACTIVE, STATE_GAP) if final is not None else ():  # no gated stage ran skip
        rows = table.filter(
            (pl.col("quantity") == quantity)
            & (pl.col("policy") == SKIP)
            & (pl.col("stage") == final)
            & pl.col("q").is_in(list(CHART_QS))
        )
        series_keys = sorted({(m, q) for m, q in rows.select("method", "q").iter_rows()}, key=str)
        charts.append(
            _chart(f"loops_{quantity}", rows, series_keys, ("method", "q"), quantity, note=f" (skip, {final})")
        )
    return [c for c in charts if c.series]


def _chart(name: str, rows: pl.DataFrame, series_keys, columns, quantity: str, note: str = "") -> ChartSpec:
    series = []
    for i, key in enumerate(series_keys[: len(PALETTE)]):
        part = rows.filter(pl.all_horizontal([pl.col(c).eq_missing(v) for c, v in zip(columns, key)])).sort("loop")
        label = " · ".join(f"q={v:g}" if c == "q" else str(v) for c, v in zip(columns, key))
        pts = [Point(float(r), v, f"{label} loop {r}") for r, v in part.select("loop", "value").iter_rows()]
        series.append(Series(label, PALETTE[i], pts, line=[(p.x, p.y) for p in pts], shape="linear"))
    return ChartSpec(
        name=name, title=f"{LABELS[quantity]} per loop{note}", x_label="loop r", y_label=LABELS[quantity], series=series
    )
