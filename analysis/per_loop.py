"""The per-loop instruments (looplab/training/instruments.py) as a table and charts.

Every stage logs, at each evaluation, per loop r: the hidden-state RMS norm and the
gradient norm reaching the shared block from loop r (full depth), and under skip at each
q the fraction of tokens still running and the relative distance of their states from
the dense run's (tracking.loop_metric names). The table keeps each stage's last values,
one row per (stage run, policy, loop, quantity), the seeds pooled per (method, stage,
value of each searched axis, policy, loop, quantity) with their mean and count n (the
seeds averaged); a stage several trials share counts once (by stage key), and a stage
the trials of several values of an axis share (the pre-training a β ablation starts
from) has the value SHARED on that axis. The axes are the scan's (tag scan_axes) or
else the sweep's searched axes (analysis/axis.py), so five β models are five lines,
never one line of their mean.

    loop_table(runs)   -> method, stage, <axis>..., policy, q, loop, quantity, value (mean over seeds), n
    loop_charts(table) -> hidden norm and gradient per loop, per stage, method and axis value; under
                          skip (final gated stages, q in CHART_QS) the active fraction and the state gap
"""

from __future__ import annotations

import polars as pl

from analysis.axis import SEARCH, Axis, searched_axes, with_axis_values
from analysis.charts import PALETTE, ChartSpec, Point, Series
from analysis.load import RunSet
from analysis.names import PARAM
from analysis.scan import scan_axes
from looplab.policy import FULL, SKIP
from looplab.stages import STAGE_NAMES
from looplab.tracking import ACTIVE, GRAD_NORM, HIDDEN_NORM, STAGE, STAGE_KEY, STATE_GAP, TRIAL, parse_loop_metric

SHARED = "shared"  # a stage's value on an axis whose several values' trials all continue it
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
        "run_id",
        "stage",
        "method",
        STAGE_KEY,
        "parent_run_id",
        (pl.col(seed) if seed in stages.columns else pl.lit(None)).alias("seed"),
    )
    axes = loop_axes(runs)
    stages = _axis_values(stages, runs, axes)
    stages = stages.unique(STAGE_KEY, keep="first", maintain_order=True)  # a reused stage counts once
    names = [a.name for a in axes]
    values = (
        runs.metrics.join(keys, on="key")
        .join(stages, on="run_id")
        .select("method", "stage", *names, "policy", "q", "loop", "quantity", "seed", pl.col("last").alias("value"))
    )
    if values.is_empty():
        return None
    return (
        values.group_by("method", "stage", *names, "policy", "q", "loop", "quantity", maintain_order=True)
        .agg(pl.col("value").mean(), pl.col("seed").n_unique().alias("n"))
        .sort("quantity", "method", "stage", *names, "policy", "q", "loop", nulls_last=True)
    )


def loop_axes(runs: RunSet) -> list[Axis]:
    """The axes the instruments are split by: a scan's (tag scan_axes), else every
    searched axis of the trials (analysis/axis.py)."""
    trials = runs.runs.filter(pl.col("level") == TRIAL)
    scan = scan_axes(runs.runs)
    if scan:
        trials = trials.select([c for c in trials.columns if not c.startswith(SEARCH) or c[len(SEARCH) :] in scan])
    return searched_axes(trials)


def _axis_values(stages: pl.DataFrame, runs: RunSet, axes: list[Axis]) -> pl.DataFrame:
    """Each stage run with one column per axis: its trials' value, or SHARED when trials
    of several values continue the same stage (one stage key)."""
    if not axes:
        return stages
    names = [a.name for a in axes]
    trials = with_axis_values(runs.runs.filter(pl.col("level") == TRIAL), axes).select(
        pl.col("run_id").alias("parent_run_id"), *names
    )
    tagged = stages.join(trials, on="parent_run_id", how="left")
    per_key = tagged.group_by(STAGE_KEY).agg(
        pl.when(pl.col(n).drop_nulls().n_unique() == 1)
        .then(pl.col(n).drop_nulls().first())
        .otherwise(pl.lit(SHARED))
        .alias(n)
        for n in names
    )
    return stages.join(per_key, on=STAGE_KEY, how="left").with_columns(pl.col(n).fill_null(SHARED) for n in names)


def loop_charts(table: pl.DataFrame) -> list[ChartSpec]:
    """Hidden norm and gradient per loop (series: stage · method · axis values); under skip,
    on the final gated stage, the active fraction and state gap (series: method · axis
    values · q). Colour: the axis values (the method and stage where nothing is searched);
    line style: the rest. Every series is named with its n, the seeds it averages."""
    charts = []
    order = {s: i for i, s in enumerate(STAGE_NAMES)}
    axes = [c for c in table.columns if c not in COLUMNS]
    for quantity in (HIDDEN_NORM, GRAD_NORM):
        rows = table.filter((pl.col("quantity") == quantity) & (pl.col("policy") == FULL))
        keys = sorted(
            set(rows.select("stage", "method", *axes).iter_rows()),
            key=lambda k: (order.get(k[0], 99), *map(str, k[1:])),
        )
        charts.append(_chart(f"loops_{quantity}", rows, keys, ("stage", "method", *axes), axes, quantity))
    gated_last = table.filter(pl.col("policy") == SKIP)["stage"].unique().to_list()
    final = max(gated_last, key=lambda s: order.get(s, -1)) if gated_last else None
    for quantity in (ACTIVE, STATE_GAP) if final is not None else ():  # no gated stage ran skip
        rows = table.filter(
            (pl.col("quantity") == quantity)
            & (pl.col("policy") == SKIP)
            & (pl.col("stage") == final)
            & pl.col("q").is_in(list(CHART_QS))
        )
        keys = sorted(set(rows.select("method", *axes, "q").iter_rows()), key=str)
        charts.append(
            _chart(f"loops_{quantity}", rows, keys, ("method", *axes, "q"), axes, quantity, f" (skip, {final})")
        )
    return [c for c in charts if c.series]


COLUMNS = ("method", "stage", "policy", "q", "loop", "quantity", "value", "n")  # loop_table's; the rest are axes


def _chart(name: str, rows: pl.DataFrame, keys, columns, axes, quantity: str, note: str = "") -> ChartSpec:
    coloured = [c for c in columns if c in axes] or [c for c in columns if c in ("stage", "method")]
    colours: dict[tuple, str] = {}
    styles: dict[tuple, int] = {}
    series = []
    for key in keys:
        by = dict(zip(columns, key))
        part = rows.filter(pl.all_horizontal([pl.col(c).eq_missing(v) for c, v in by.items()])).sort("loop")
        group = tuple(by[c] for c in coloured)
        style = tuple(v for c, v in by.items() if c not in coloured)
        colour = colours.setdefault(group, PALETTE[len(colours) % len(PALETTE)])
        dash = styles.setdefault(style, len(styles))
        ns = sorted(set(part["n"].to_list()))
        n = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}–{ns[-1]}"
        label = f"{_label(by)} ({n})"
        pts = [Point(float(r), v, f"{label} loop {r}") for r, v in part.select("loop", "value").iter_rows()]
        series.append(
            Series(
                label,
                colour,
                pts,
                line=[(p.x, p.y) for p in pts],
                shape="linear",
                dashed=dash == 1,
                dotted=dash >= 2,
                group=_label({c: by[c] for c in coloured}),
                style=_label({c: by[c] for c in by if c not in coloured}),
            )
        )
    loops = sorted({int(p.x) for s in series for p in s.points})
    return ChartSpec(
        name=name,
        title=f"{LABELS[quantity]} per loop{note}",
        x_label="loop r",
        y_label=LABELS[quantity],
        series=series,
        legend_title=" · ".join(columns),
        x_ticks=[(float(r), str(r)) for r in loops],  # a loop is a whole number: no tick at 1.5
    )


def _label(by: dict) -> str:
    """ "stage1 · Ouro · β=0.25 · q=0.2": a stage shared along an axis says so ("β shared")."""
    parts = []
    for c, v in by.items():
        if c == "q":
            parts.append(f"q={v:g}")
        elif c in ("stage", "method"):
            parts.append(str(v))
        else:
            parts.append(f"{c} {SHARED}" if v == SHARED else f"{c}={v}")
    return " · ".join(parts)
