"""Speed beside quality: the speed sweep's runs (level bench, tagged with a speed_key:
trainables/bench.py, sweeps/bench.py) joined by stage key to the evaluation points of
the stage each one timed, so a timed skip policy sits beside the validation perplexity
the same checkpoint reached under that policy and at full compute.

    speed_table(runs, points)  one row per timed point (the newest run per point and machine):
      identity  experiment, checkpoint (<stage>-<stage_key>), method, stage, stage_key,
                device, batch, seq_len, policy (its spec), dtype, packing
      speed     executed_loops (d̄ on the timed inputs), time_full_s, time_skip_s,
                tokens_per_s_full / tokens_per_s_skip (batch · L / median time), each
                with its _min/_max over the repeats (batch · L / the slowest and the
                fastest repeat; null for runs logged before repeats kept their times),
                speedup, loop_bound (R / d̄), flop_ratio ((F0 + R·Fr)/(F0 + d̄·Fr),
                looplab/costs/resources.py), of_flop_ratio (speedup / flop_ratio)
      quality   ppl_full (the stage's validation perplexity at full depth), ppl (under
                the timed policy: the gate at the same q, or the same zoo rule and
                threshold), val_executed_loops (the validation set's loops under it);
                null where the stage run did not evaluate it
    speed_chart(table)         validation perplexity against measured prefill tokens/s:
                one series per checkpoint × batch × length, full compute and each timed
                policy as points (executed loops in the label), joined in order of falling
                compute

    arrivals_table(runs)       one row per decoding-under-arrivals point (sweeps/bench.py --arrivals;
                looplab/inference/arrivals.py), the newest per point and machine:
      identity  experiment, checkpoint, method, stage, stage_key, device, slots, schedule,
                policy (full is the baseline), requests, prompt_len, new_tokens, seed
      speed     executed_loops (d̄ of the decoded tokens), tokens_per_s (prefills
                included), decode_tokens_per_s, speedup (decode tokens/s over full's in
                the same slots and schedule), loop_bound, flop_ratio (of d̄, the LM head
                read out per token), of_flop_ratio; vs_best_full (decode tokens/s over
                the fastest full schedule's at the same stream and slots) and realised
                (vs_best_full / flop_ratio)
    arrivals_chart(table)      decode tokens/s against d̄ per checkpoint × slots × schedule,
                with the FLOP ratio's tokens/s (full's × the bound of each d̄) dashed

The metric and param names are the tracking contract's (looplab/tracking/).
"""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.charts import PALETTE, ChartSpec, Point, Series, as_float, log_scale, optional_float
from analysis.load import METRIC, PARAM, RunSet
from looplab import tracking
from looplab.policy import FULL

IDENTITY = (
    "experiment",
    "checkpoint",
    "method",
    "stage",
    tracking.STAGE_KEY,
    "device",
    "batch",
    "seq_len",
    "policy",
    "dtype",
    "packing",
)
SPEED_SPREAD = ("tokens_per_s_full_min", "tokens_per_s_full_max", "tokens_per_s_skip_min", "tokens_per_s_skip_max")
# Skip against full, and how much of the FLOP ratio that is: the last columns of both
# kinds of speed run (prefill and arrivals)
SPEEDUP = ("speedup", tracking.SPEEDUP_MIN, tracking.SPEEDUP_MAX, "loop_bound", tracking.FLOP_RATIO, "of_flop_ratio")
SPEED = (
    tracking.EXECUTED_LOOPS,
    tracking.TIME_FULL,
    tracking.TIME_SKIP,
    tracking.TOKENS_PER_S_FULL,
    tracking.TOKENS_PER_S_SKIP,
    *SPEED_SPREAD,
    *SPEEDUP,
)
# One arrivals point: the experiment, the checkpoint (its stage key), the machine and
# the served configuration; a point measured again keeps its newest run.
ARRIVAL_POINT = (
    "experiment",
    tracking.STAGE_KEY,
    "device",
    "slots",
    "schedule",
    "policy",
    "requests",
    "prompt_len",
    "new_tokens",
    "seed",
)
ARRIVAL_IDENTITY = ("experiment", "checkpoint", "method", "stage", *ARRIVAL_POINT[1:])
# Against the fastest full schedule of the same stream and slots (looplab/costs/arrival_bench.py):
# a schedule's own full can flatter it
AGAINST_BEST_FULL = ("vs_best_full", "realised")
ARRIVAL_SPEED = (
    tracking.EXECUTED_LOOPS,
    tracking.TOKENS_PER_S,
    tracking.DECODE_TOKENS_PER_S,
    tracking.DECODE_TOKENS_PER_S_MIN,
    tracking.DECODE_TOKENS_PER_S_MAX,
    *SPEEDUP,
    *AGAINST_BEST_FULL,
)
PPL_FULL = names.at_point(tracking.PPL, FULL)  # the stage's validation perplexity at full depth
QUALITY = (PPL_FULL, tracking.PPL, names.SPEED_VALIDATION_LOOPS)


def _column(table: pl.DataFrame, name: str, dtype) -> pl.Expr:
    return pl.col(name).cast(dtype, strict=False) if name in table.columns else pl.lit(None, dtype)


def _finished_bench(runs: RunSet, point_param: str) -> pl.DataFrame | None:
    """The FINISHED keyed bench runs that carry this point param (speed.batch: prefill
    points; speed.slots: arrivals points); None without any."""
    table = runs.runs
    column = PARAM + tracking.SPEED_PARAM + point_param
    if tracking.SPEED_KEY not in table.columns or column not in table.columns:
        return None
    bench = table.filter(
        (pl.col("level") == tracking.BENCH)
        & pl.col(tracking.SPEED_KEY).is_not_null()
        & (pl.col("status") == "FINISHED")
        & pl.col(column).is_not_null()
    )
    return None if bench.is_empty() else bench


def _with_checkpoint(runs: RunSet, rows: pl.DataFrame) -> pl.DataFrame:
    """The timed stage's name beside its key, and checkpoint = <stage>-<stage_key>."""
    stages = (
        runs.runs.filter(pl.col("level") == tracking.STAGE)
        .select("experiment", tracking.STAGE_KEY, "stage")
        .unique(["experiment", tracking.STAGE_KEY])
    )
    return rows.join(stages, on=["experiment", tracking.STAGE_KEY], how="left").with_columns(
        pl.concat_str([pl.col("stage").fill_null("?"), pl.col(tracking.STAGE_KEY)], separator="-").alias("checkpoint")
    )


def speed_runs(runs: RunSet) -> pl.DataFrame | None:
    """The FINISHED speed runs as rows of IDENTITY and the speed columns; None without any."""
    bench = _finished_bench(runs, "batch")
    if bench is None:
        return None
    metric = lambda name: _column(bench, METRIC + name, pl.Float64)  # noqa: E731
    param = lambda name, dtype=pl.String: _column(bench, PARAM + name, dtype)  # noqa: E731
    rows = bench.select(
        "experiment",
        tracking.STAGE_KEY,
        "method",
        "start_time",
        param(tracking.SPEED_PARAM + "batch", pl.Int64).alias("batch"),
        param(tracking.SPEED_PARAM + "seq_len", pl.Int64).alias("seq_len"),
        pl.coalesce(pl.col(tracking.POLICY_TAG), param(tracking.SPEED_PARAM + "policy")).alias("policy"),
        param(tracking.SPEED_PARAM + "dtype").alias("dtype"),
        param(tracking.SPEED_PARAM + "packing").alias("packing"),
        param(tracking.MACHINE_PARAM + "device").alias("device"),
        metric(tracking.MEAN_LOOPS).alias(tracking.EXECUTED_LOOPS),
        metric(tracking.TIME_FULL).alias(tracking.TIME_FULL),
        metric(tracking.TIME_SKIP).alias(tracking.TIME_SKIP),
        metric(tracking.SPEEDUP).alias("speedup"),
        *(
            metric(name).alias(name)
            for name in (tracking.TIME_FULL_MIN, tracking.TIME_FULL_MAX, tracking.TIME_SKIP_MIN, tracking.TIME_SKIP_MAX)
        ),
        metric(tracking.SPEEDUP_MIN).alias(tracking.SPEEDUP_MIN),
        metric(tracking.SPEEDUP_MAX).alias(tracking.SPEEDUP_MAX),
        metric(tracking.LOOP_BOUND).alias("loop_bound"),
        metric(tracking.FLOP_RATIO).alias(tracking.FLOP_RATIO),
    )
    tokens = (pl.col("batch") * pl.col("seq_len")).cast(pl.Float64)
    rows = rows.with_columns(
        (tokens / pl.col(tracking.TIME_FULL)).alias(tracking.TOKENS_PER_S_FULL),
        (tokens / pl.col(tracking.TIME_SKIP)).alias(tracking.TOKENS_PER_S_SKIP),
        # the slowest repeat is the fewest tokens/s
        (tokens / pl.col(tracking.TIME_FULL_MAX)).alias("tokens_per_s_full_min"),
        (tokens / pl.col(tracking.TIME_FULL_MIN)).alias("tokens_per_s_full_max"),
        (tokens / pl.col(tracking.TIME_SKIP_MAX)).alias("tokens_per_s_skip_min"),
        (tokens / pl.col(tracking.TIME_SKIP_MIN)).alias("tokens_per_s_skip_max"),
        (pl.col("speedup") / pl.col(tracking.FLOP_RATIO)).alias("of_flop_ratio"),
    )
    # One measurement per point and machine: the newest (another --repeats or threads count
    # is another key, timed again).
    point = ["experiment", tracking.STAGE_KEY, "device", "batch", "seq_len", "policy", "dtype", "packing"]
    return rows.sort("start_time").unique(point, keep="last", maintain_order=True).drop("start_time")


def _policy_points(specs) -> pl.DataFrame:
    """A timed policy's spec → the evaluation point it is in the points table: its kind
    (skip for the gate, skip-entropy, ...) and its threshold in q."""
    from looplab.policy import GATE, ExitPolicy

    rows = []
    for spec in specs:
        policy = ExitPolicy.parse(spec)
        value = policy.q if policy.rule == GATE else policy.threshold
        assert value is not None  # a timed policy is a gate or a zoo rule: it has a threshold
        rows.append({"policy": spec, "_kind": policy.kind, "_q": float(value)})
    return pl.DataFrame(rows, schema={"policy": pl.String, "_kind": pl.String, "_q": pl.Float64})


def speed_table(runs: RunSet, points: pl.DataFrame | None) -> pl.DataFrame | None:
    """The speed runs with their stage's validation perplexity (module docstring); None
    when the experiments hold no speed run."""
    rows = speed_runs(runs)
    if rows is None:
        return None
    rows = _with_checkpoint(runs, rows)
    rows = rows.join(_policy_points(rows["policy"].unique().to_list()), on="policy", how="left")
    if points is not None and points.height:
        # A shared stage is a copy per trial (same key, same values): one value per point.
        quality = points.group_by("experiment", tracking.STAGE_KEY, "policy", pl.col("q").round(6)).agg(
            pl.col("ppl").mean(), pl.col(tracking.EXECUTED_LOOPS).mean()
        )
        full = quality.filter(pl.col("policy") == FULL).select(
            "experiment", tracking.STAGE_KEY, pl.col("ppl").alias(PPL_FULL)
        )
        timed = quality.select(
            "experiment",
            tracking.STAGE_KEY,
            pl.col("policy").alias("_kind"),
            pl.col("q").alias("_q"),
            "ppl",
            pl.col(tracking.EXECUTED_LOOPS).alias(names.SPEED_VALIDATION_LOOPS),
        )
        rows = (
            rows.with_columns(pl.col("_q").round(6))
            .join(full, on=["experiment", tracking.STAGE_KEY], how="left")
            .join(timed, on=["experiment", tracking.STAGE_KEY, "_kind", "_q"], how="left")
        )
    else:
        rows = rows.with_columns(*(pl.lit(None, pl.Float64).alias(c) for c in QUALITY))
    return rows.select(*IDENTITY, *SPEED, *QUALITY).sort(
        "experiment", "checkpoint", "device", "seq_len", "batch", "policy"
    )


def speed_chart(table: pl.DataFrame) -> ChartSpec | None:
    """Validation perplexity against measured prefill tokens/s (module docstring); None
    when no timed point has a perplexity to draw."""
    drawn = table.filter(pl.col("ppl").is_not_null() | pl.col(PPL_FULL).is_not_null())
    if drawn.is_empty():
        return None
    # Split series by what varies: the checkpoint, batch and length always; machine, dtype
    # and packing only where the table mixes them.
    by = ["checkpoint", "batch", "seq_len"] + [c for c in ("device", "dtype", "packing") if drawn[c].n_unique() > 1]
    methods = drawn.select("checkpoint", "method").unique()
    short = {
        c: (f"{m} {c.split('-')[0]}" if methods.filter(pl.col("method") == m).height == 1 else f"{m} {c}")
        for c, m in methods.iter_rows()
    }
    series, xs, ys = [], [], []
    for i, (key, group) in enumerate(drawn.sort(*by).group_by(by, maintain_order=True)):
        info = dict(zip(by, key))
        name = " · ".join(
            [short[info["checkpoint"]], f"b{info['batch']} L{info['seq_len']}", *(str(info[c]) for c in by[3:])]
        )
        pts = []
        full = group.filter(pl.col(PPL_FULL).is_not_null())
        if full.height:  # each timed policy ran its own full twin: their mean, the bar over all their repeats
            pts.append(
                Point(
                    as_float(full[tracking.TOKENS_PER_S_FULL].mean()),
                    float(full[PPL_FULL][0]),
                    f"full: all R loops ({full.height} timing(s))",
                    x_lo=optional_float(full["tokens_per_s_full_min"].min()),
                    x_hi=optional_float(full["tokens_per_s_full_max"].max()),
                )
            )
        # The line follows the compute as it falls (full, then the policies by fewer
        # executed loops), not the x order: timing noise would zigzag it.
        for r in (
            group.filter(pl.col("ppl").is_not_null())
            .sort(tracking.EXECUTED_LOOPS, descending=True)
            .iter_rows(named=True)
        ):
            bound = f" (FLOP ratio {r[tracking.FLOP_RATIO]:.2f}x)" if r[tracking.FLOP_RATIO] is not None else ""
            pts.append(
                Point(
                    r[tracking.TOKENS_PER_S_SKIP],
                    r["ppl"],
                    f"{r['policy']}: {r[tracking.EXECUTED_LOOPS]:.2f} loops, {r['speedup']:.2f}x{_spread(r)}{bound}",
                    x_lo=r["tokens_per_s_skip_min"],
                    x_hi=r["tokens_per_s_skip_max"],
                )
            )
        xs += [p.x for p in pts]
        ys += [p.y for p in pts]
        series.append(Series(name, PALETTE[i % len(PALETTE)], pts, [(p.x, p.y) for p in pts], "linear"))
    return ChartSpec(
        "speed",
        "Validation perplexity against measured prefill tokens/s",
        "prefill tokens/s (batch · L / median time; bars: fastest to slowest repeat)",
        "validation perplexity",
        series,
        log_y=log_scale(ys),
        log_x=log_scale(xs),
    )


# ---- decoding under continuous arrivals -------------------------------------------------------------
def _against_best_full(rows: pl.DataFrame) -> pl.DataFrame:
    """vs_best_full: decode tokens/s over the fastest full run of the same checkpoint,
    device, stream and slots (whichever schedule it ran); realised: that over the FLOP
    ratio. Null where no full run of that stream and slots is stored."""
    stream = [c for c in ARRIVAL_POINT if c not in ("schedule", "policy")]
    full = pl.col(tracking.DECODE_TOKENS_PER_S).filter(pl.col("policy") == FULL)
    rows = rows.with_columns((pl.col(tracking.DECODE_TOKENS_PER_S) / full.max().over(stream)).alias("vs_best_full"))
    return rows.with_columns((pl.col("vs_best_full") / pl.col(tracking.FLOP_RATIO)).alias("realised"))


def arrivals_table(runs: RunSet) -> pl.DataFrame | None:
    """The FINISHED arrivals runs (module docstring); None when the experiments hold none."""
    bench = _finished_bench(runs, "slots")
    if bench is None:
        return None
    metric = lambda name: _column(bench, METRIC + name, pl.Float64)  # noqa: E731
    param = lambda name, dtype=pl.String: _column(bench, PARAM + tracking.SPEED_PARAM + name, dtype)  # noqa: E731
    rows = bench.select(
        "experiment",
        tracking.STAGE_KEY,
        "method",
        "start_time",
        _column(bench, PARAM + tracking.MACHINE_PARAM + "device", pl.String).alias("device"),
        param("slots", pl.Int64).alias("slots"),
        param("schedule").alias("schedule"),
        pl.coalesce(pl.col(tracking.POLICY_TAG), param("policy")).alias("policy"),
        param("requests", pl.Int64).alias("requests"),
        param("prompt_len").alias("prompt_len"),
        param("new_tokens").alias("new_tokens"),
        param("seed", pl.Int64).alias("seed"),
        metric(tracking.MEAN_LOOPS).alias(tracking.EXECUTED_LOOPS),
        metric(tracking.TOKENS_PER_S).alias(tracking.TOKENS_PER_S),
        metric(tracking.DECODE_TOKENS_PER_S).alias(tracking.DECODE_TOKENS_PER_S),
        *(
            metric(name).alias(name)
            for name in (
                tracking.DECODE_TOKENS_PER_S_MIN,
                tracking.DECODE_TOKENS_PER_S_MAX,
                tracking.SPEEDUP_MIN,
                tracking.SPEEDUP_MAX,
            )
        ),
        metric(tracking.SPEEDUP).alias("speedup"),
        metric(tracking.LOOP_BOUND).alias("loop_bound"),
        metric(tracking.FLOP_RATIO).alias(tracking.FLOP_RATIO),
    )
    rows = rows.with_columns((pl.col("speedup") / pl.col(tracking.FLOP_RATIO)).alias("of_flop_ratio"))
    rows = rows.sort("start_time").unique(list(ARRIVAL_POINT), keep="last", maintain_order=True).drop("start_time")
    rows = _against_best_full(rows)
    return (
        _with_checkpoint(runs, rows)
        .select(*ARRIVAL_IDENTITY, *ARRIVAL_SPEED)
        .sort(
            "experiment",
            "checkpoint",
            "device",
            "slots",
            "schedule",
            tracking.EXECUTED_LOOPS,
            descending=[False, False, False, False, False, True],
        )
    )


def where_skipping_pays(table: pl.DataFrame) -> str | None:
    """One sentence: where an exit policy decodes faster than the best full schedule
    (vs_best_full above 1), or, where none does, the closest one. None without a
    policy read against a full run."""
    read = table.filter((pl.col("policy") != FULL) & pl.col("vs_best_full").is_not_null())
    if read.is_empty():
        return None

    def point(r: dict) -> str:
        return (
            f"{r['policy']} on {r['schedule']} at {r['slots']} slots ({r['checkpoint']}: "
            f"{r['vs_best_full']:.2f}× the best full, {r['realised']:.0%} of its FLOP ratio)"
        )

    pays = read.filter(pl.col("vs_best_full") > 1).sort("vs_best_full", descending=True)
    if pays.is_empty():
        best = read.sort("vs_best_full", descending=True).row(0, named=True)
        return f"Skipping decodes slower than the best full schedule everywhere here; closest: {point(best)}."
    return f"Skipping beats the best full schedule at {'; '.join(point(r) for r in pays.iter_rows(named=True))}."


def _spread(row: dict) -> str:
    """' [1.10, 1.30] over repeats' when the run logged its spread (runs before it did not)."""
    lo, hi = row.get(tracking.SPEEDUP_MIN), row.get(tracking.SPEEDUP_MAX)
    return "" if lo is None or hi is None else f" [{lo:.2f}, {hi:.2f}] over repeats"


def arrivals_chart(table: pl.DataFrame) -> ChartSpec | None:
    """Decode tokens/s against d̄: per checkpoint × slots × schedule the measured points
    (full at d̄ = R, then each policy), and dashed the tokens/s the FLOP ratio allows
    (full's decode tokens/s × the bound of each point's d̄). None without a point."""
    drawn = table.filter(
        pl.col(tracking.DECODE_TOKENS_PER_S).is_not_null() & pl.col(tracking.EXECUTED_LOOPS).is_not_null()
    )
    if drawn.is_empty():
        return None
    by = ["checkpoint", "slots", "schedule"] + [
        c for c in ("device", "requests", "prompt_len", "new_tokens", "seed") if drawn[c].n_unique() > 1
    ]
    series, ys = [], []
    for i, (key, group) in enumerate(drawn.sort(*by).group_by(by, maintain_order=True)):
        info = dict(zip(by, key))
        name = " · ".join(
            [
                f"{group['method'][0]} {info['checkpoint'].split('-')[0]}",
                f"{info['slots']} slots",
                *(str(info[c]) for c in by[2:]),
            ]
        )
        color = PALETTE[i % len(PALETTE)]
        rows = list(group.sort(tracking.EXECUTED_LOOPS, descending=True).iter_rows(named=True))
        pts = [
            Point(
                r[tracking.EXECUTED_LOOPS],
                r[tracking.DECODE_TOKENS_PER_S],
                f"{r['policy']}: d̄ {r[tracking.EXECUTED_LOOPS]:.2f}, {r['speedup']:.2f}x{_spread(r)}"
                + (f" of FLOP ratio {r[tracking.FLOP_RATIO]:.2f}x" if r[tracking.FLOP_RATIO] is not None else ""),
                lo=r[tracking.DECODE_TOKENS_PER_S_MIN],
                hi=r[tracking.DECODE_TOKENS_PER_S_MAX],
            )
            for r in rows
        ]
        series.append(Series(name, color, pts, [(p.x, p.y) for p in pts], "linear"))
        ys += [p.y for p in pts]
        full = [r[tracking.DECODE_TOKENS_PER_S] for r in rows if r["policy"] == FULL]
        if full:  # the bound is a speedup over full: drawn from full's measured tokens/s
            bound = [
                Point(
                    r[tracking.EXECUTED_LOOPS],
                    full[0] * r[tracking.FLOP_RATIO],
                    f"{r['policy']}: FLOP ratio {r[tracking.FLOP_RATIO]:.2f}x",
                )
                for r in rows
                if r[tracking.FLOP_RATIO] is not None
            ]
            series.append(
                Series(f"{name} · FLOP ratio", color, bound, [(p.x, p.y) for p in bound], "linear", dashed=True)
            )
            ys += [p.y for p in bound]
    return ChartSpec(
        "arrivals",
        "Decode tokens/s under continuous arrivals against executed loops d̄",
        "executed loops d̄ (decoded tokens)",
        "decode tokens/s (the wall less the prefills)",
        series,
        log_y=log_scale(ys),
    )
