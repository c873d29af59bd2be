"""What each figure shows, as plain data: one ChartSpec drawn twice, as a PNG
(analysis.plots, matplotlib) and as an interactive Plotly figure in the HTML report
(analysis.page). Building the spec once keeps the two in agreement.

  frontier_chart  quality against compute per series (method × policy by default):
                  every point (with its seed interval), the Pareto frontier as a step
                  line; drawn for the report's frontier, Fig. 3 and the policy zoo.
  downstream_rows Fig. 3's points: downstream average accuracy against the executed
                  loops on the tasks, per arm (the pre-trained model at forced depths,
                  each gated method's final stage under dense and skip over q).
  zoo_rows        each zero-shot exit rule's points beside the learned gate's, per
                  method and execution, on the final stage.
  skip_chart      perplexity under skip against executed loops per method, full
                  compute as a dashed line (Fig. 2).
  (analysis/bench.py draws perplexity against measured prefill tokens/s with the same spec.)
  axis_chart      the report's first chart: the final stage's quality against the
                  sweep's searched axis (analysis/axis.py), at full depth and under skip.
  beta_charts     exit entropy and expected exit step over training, one curve per β
                  (mean over seeds at each step, cut to the steps every curve has:
                  App. D, Figs. 4–5).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import SupportsFloat, TypeGuard

import polars as pl

from analysis import names
from analysis.axis import Axis
from analysis.frontier import frontier_mask
from looplab import tracking
from looplab.policy import DENSE, FORCED, FULL, SKIP, number_name
from looplab.stages import STAGE_NAMES

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MAX_SERIES = len(PALETTE)  # beyond this a chart's series are grouped coarser (one colour each must stay readable)


def finite(v: object) -> TypeGuard[float]:
    """A number to draw (not None, NaN or infinite)."""
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def as_float(value: object) -> float:
    """A value polars returns from a numeric column (Series.min(), .mean(), a row's cell),
    which it types as anything a column can hold, as a float; None raises TypeError, as
    float(None) does."""
    if not isinstance(value, SupportsFloat):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def optional_float(value: object) -> float | None:
    """as_float, but None (a column of nulls) stays None."""
    return None if value is None else as_float(value)


@dataclass
class Point:
    x: float
    y: float
    label: str
    lo: float | None = None  # the seed interval of y, when there is one
    hi: float | None = None
    on_frontier: bool = False
    x_lo: float | None = None  # the spread of x, when it is measured (a timing's repeats)
    x_hi: float | None = None


@dataclass
class Series:
    name: str
    color: str
    points: list[Point] = field(default_factory=list)
    line: list[tuple[float, float]] = field(default_factory=list)
    shape: str = "step"  # step | linear
    dashed: bool = False
    dotted: bool = False  # a third line style beside solid and dashed
    # The two factors the colour and the line style stand for (e.g. "β=0.25", "skip"): with both
    # set on every series, a legend beyond a handful of series lists each factor's values once.
    group: str = ""
    style: str = ""


@dataclass
class ChartSpec:
    name: str  # file stem of the PNG
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    log_y: bool = False
    hlines: list[tuple[float, str]] = field(default_factory=list)
    log_x: bool = False
    legend_title: str = ""  # what the series vary in, e.g. "β · policy"
    x_ticks: list[tuple[float, str]] = field(default_factory=list)  # a categorical x: (position, label)


# The series (or, in a factored legend, the colours) a reader tells apart on one chart:
# beyond it a legend lists factors (legend_entries) and a chart becomes small multiples
# (small_multiples), in the PNG and in the HTML report alike.
LEGEND_HANDFUL = 6
KEY_COLOR = "#555"  # a line-style entry's colour in a factored legend


def legend_entries(spec: ChartSpec) -> list[Series] | None:
    """The legend of a chart beyond LEGEND_HANDFUL series whose colour and line style each
    stand for one factor: one entry per colour (its group, e.g. β=0.25) and one per line
    style (e.g. skip), 5 + 3 entries instead of 15. None (one entry per series) for a
    handful of series, or when colour and style do not tell every series apart."""
    if len(spec.series) <= LEGEND_HANDFUL or not all(s.group and s.style for s in spec.series):
        return None
    colours = {s.group: s.color for s in spec.series}
    styles = {s.style: (s.dashed, s.dotted) for s in spec.series}
    consistent = all(colours[s.group] == s.color and styles[s.style] == (s.dashed, s.dotted) for s in spec.series)
    distinct = len({(s.group, s.style) for s in spec.series}) == len(spec.series)
    if not (
        consistent
        and distinct
        and len(set(colours.values())) == len(colours)
        and len(set(styles.values())) == len(styles)
    ):
        return None
    return [Series(g, c, group=g) for g, c in colours.items()] + [
        Series(st, KEY_COLOR, dashed=d, dotted=o, style=st) for st, (d, o) in styles.items()
    ]


def small_multiples(spec: ChartSpec) -> list[ChartSpec]:
    """A chart with more than LEGEND_HANDFUL colours to tell apart as panels of at most
    that many each, as even as they split, titled "(1 of 3)"..., every one with its
    legend and its series' own colours; any other chart: itself. The colours are the
    series, or in a factored legend (legend_entries) the groups, each panel then holding
    every series of its groups (β=0.25 under each policy). The PNG (analysis/plots.py)
    and the HTML report (analysis/page.py) draw the same panels on the same limits."""
    factored = legend_entries(spec) is not None
    colour_of = [s.group if factored else str(i) for i, s in enumerate(spec.series)]
    keys = list(dict.fromkeys(colour_of))
    if len(keys) <= LEGEND_HANDFUL:
        return [spec]
    n = -(-len(keys) // LEGEND_HANDFUL)
    size, extra = divmod(len(keys), n)  # the first `extra` panels take one key more
    bounds = [i * size + min(i, extra) for i in range(n + 1)]
    panel_of = {key: i for i in range(n) for key in keys[bounds[i] : bounds[i + 1]]}
    return [
        dataclasses.replace(
            spec,
            series=[s for s, key in zip(spec.series, colour_of) if panel_of[key] == i],
            title=f"{spec.title} ({i + 1} of {n})",
        )
        for i in range(n)
    ]


TICK_DIGITS = 3  # a tick label's fewest significant digits: 0.243768 reads 0.244, within 0.5% of its place
AXIS_CHARS = 60  # label characters an x axis holds side by side (590 px of Plotly's at 12 px; a PNG panel at 10 pt)
AXIS_PADDING = 1.1  # an axis spans its values and a margin (matplotlib's 5% a side; Plotly's about as much)


def tick_labels(values: list[float]) -> list[str]:
    """Each number in the fewest significant digits, TICK_DIGITS at least, that still tell
    the distinct values apart: 0.179388, 0.183162, 0.243768, 0.25 read 0.179, 0.183,
    0.244, 0.25; 0.1 and 0.1001 read 0.1 and 0.1001."""
    distinct = len(set(values))
    for digits in range(TICK_DIGITS, 18):
        labels = [f"{v:.{digits}g}" for v in values]
        if len(set(labels)) == distinct:
            return labels
    return [repr(v) for v in values]


def spaced_ticks(ticks: list[tuple[float, str]], log: bool = False) -> list[tuple[float, str]]:
    """The ticks (position, label) whose labels fit side by side on an axis spanning their
    positions (log: on a log scale, every position positive), left to right: one whose label would touch the last
    kept one's (their half-widths and a character apart, an axis holding AXIS_CHARS) is
    left out, its value still in the chart's hover text and tables."""
    place = [math.log10(x) if log else x for x, _ in ticks]
    span = (max(place) - min(place)) * AXIS_PADDING if ticks else 0.0
    kept: list[int] = []
    for i, (_, label) in enumerate(ticks):
        if kept and span > 0:
            last = kept[-1]
            apart = abs(place[i] - place[last]) / span * AXIS_CHARS
            if apart < (len(label) + len(ticks[last][1])) / 2 + 1:
                continue
        kept.append(i)
    return [ticks[i] for i in kept]


def bars_phrase(spec: ChartSpec, what: str = "the seed interval", none: str = "one seed: no interval") -> str:
    """What a caption says of the error bars, from what the chart draws: 'bars: <what>'
    when every point has an interval, '…, where a point has one' when some do, `none`
    when no point has one (no bars are drawn)."""
    drawn = [finite(p.lo) and finite(p.hi) for s in spec.series for p in s.points]
    if drawn and all(drawn):
        return f"bars: {what}"
    if any(drawn):
        return f"bars: {what}, where a point has one"
    return none


def log_scale(values) -> bool:
    """Log y when every value is positive and they span more than a factor of 20 (ppl blow-ups)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 20


def frontier_chart(
    frontier: pl.DataFrame,
    compute: str,
    quality: str,
    *,
    compute_label: str,
    quality_label: str,
    title: str,
    name: str = "frontier",
    legend_title: str = "",
    colour_by: str | None = None,
) -> ChartSpec:
    """frontier: rows with series, compute, quality, quality_ci_low/high, on_frontier, label, point.
    colour_by: a column whose value picks the colour (series sharing it share a colour,
    e.g. one β drawn under dense and skip); the series' policies then differ by dash
    (solid, dashed, dotted in the order the policies come)."""
    series: list[Series] = []
    colours: dict[object, str] = {}  # colour_by's value -> its colour
    policies: dict[object, list[object]] = {}  # colour_by's value -> the policies drawn in its colour
    order: dict[object, int] = {}  # policy -> its dash
    for i, (key, group) in enumerate(frontier.group_by("series", maintain_order=True)):
        key = key[0] if isinstance(key, tuple) else key
        pts = [
            Point(
                r["compute"],
                r["quality"],
                f"{r['label']} · {r['point']} ({r['stage']})",
                r.get("quality_ci_low"),
                r.get("quality_ci_high"),
                bool(r["on_frontier"]),
            )
            for r in group.sort("compute").iter_rows(named=True)
        ]
        line = [(p.x, p.y) for p in pts if p.on_frontier]
        colour, style, factors = PALETTE[i % len(PALETTE)], 0, {}
        if colour_by is not None:
            shade = group[colour_by][0]
            colour = colours.setdefault(shade, PALETTE[len(colours) % len(PALETTE)])
            policy = group["policy"][0]
            seen = policies.setdefault(shade, [])
            seen.append(policy)
            # one dash per policy across the chart, so a legend can list policies once
            style = order.setdefault(policy, len(order)) if seen.count(policy) == 1 else len(seen) - 1
            factors = {"group": str(shade), "style": str(policy)}
        series.append(Series(str(key), colour, pts, line, "step", dashed=style == 1, dotted=style >= 2, **factors))
    return ChartSpec(
        name,
        title,
        compute_label,
        quality_label,
        series,
        log_y=log_scale(frontier["quality"].to_list()) and names.higher_is_better(quality) is False,
        legend_title=legend_title,
    )


def downstream_rows(agg: pl.DataFrame) -> pl.DataFrame | None:
    """Fig. 3's points, from seed-aggregated points: rows with a downstream average
    (lm_eval_avg) and downstream executed loops (lm_eval_loops), each with a `series`:
    `forced depth (N⊗R)` for a model without a gate at forced depths 1..R (full depth as
    d=R: App. E, the Fixed Exit Depth curve) and `<method> · <dense|skip>` for each gated
    method's final stage over q (the Ouro and CHASE curves). None when nothing has both."""
    from analysis.points import full_as_forced_depth, shared_once
    from looplab.stages import get_stage

    rows = agg.filter(pl.col(tracking.LM_EVAL_AVG).is_not_null() & pl.col(tracking.LM_EVAL_LOOPS).is_not_null())
    if rows.is_empty():
        return None
    gateless = [s for s in STAGE_NAMES if not get_stage(s).gated]
    fixed = shared_once(
        full_as_forced_depth(rows.filter(pl.col("stage").is_in(gateless))).filter(pl.col("policy") == FORCED)
    )
    fixed = fixed.with_columns(
        (pl.lit("forced depth (") + pl.col("model").fill_null("?") + pl.lit(")")).alias("series")
    )
    gated = rows.filter(
        pl.col("is_final_stage") & pl.col("policy").is_in([DENSE, SKIP]) & ~pl.col("stage").is_in(gateless)
    )
    gated = gated.with_columns(
        pl.concat_str([pl.col("method").fill_null("?"), pl.col("policy")], separator=" · ").alias("series")
    )
    out = pl.concat([fixed, gated], how="diagonal_relaxed")
    return None if out.is_empty() else out


def zoo_rows(agg: pl.DataFrame, compute: str, quality: str) -> pl.DataFrame | None:
    """The policy zoo's points: on each trial's final stage, the zero-shot exit rules
    (policy <execution>-<rule>) and the learned gate (dense, skip), series
    `<method> · <policy>`, with both compute and quality. None without a rule's point."""
    final = agg.filter(pl.col("is_final_stage") & pl.col(compute).is_not_null() & pl.col(quality).is_not_null())
    rule = pl.col("policy").str.contains("-", literal=True)
    if final.filter(rule).is_empty():
        return None
    rows = final.filter(rule | pl.col("policy").is_in([DENSE, SKIP]))
    return rows.with_columns(
        pl.concat_str([pl.col("method").fill_null("?"), pl.col("policy")], separator=" · ").alias("series")
    )


def skip_chart(agg: pl.DataFrame) -> ChartSpec | None:
    """One curve per configuration over q, and its full compute (all R loops) as a dashed
    line across the chart in the same colour (colour: the configuration, line style: skip
    or full compute, so a legend of many lists each once and small multiples keep a
    configuration's two lines together); with more than MAX_SERIES configurations, one
    series per method whose line is its lowest perplexity at each compute (the frontier),
    so a large sweep still reads (and draws) as a handful of curves."""
    final = agg.filter(pl.col("is_final_stage"))
    skip = final.filter((pl.col("policy") == SKIP) & pl.col("ppl").is_not_null())
    if skip.is_empty():
        return None
    by = "label" if skip["label"].n_unique() <= MAX_SERIES else "method"
    across = (as_float(skip[tracking.EXECUTED_LOOPS].min()), as_float(skip[tracking.EXECUTED_LOOPS].max()))
    series = []
    for i, (key, group) in enumerate(skip.sort(by).group_by(by, maintain_order=True)):
        name = key[0] if isinstance(key, tuple) else key
        colour = PALETTE[i % len(PALETTE)]
        group = group.sort(tracking.EXECUTED_LOOPS, "ppl")
        low, high = names.interval_of(tracking.PPL)
        pts = [
            Point(
                r[tracking.EXECUTED_LOOPS], r["ppl"], f"{r['label']} · q={number_name(r['q'])}", r.get(low), r.get(high)
            )
            for r in group.iter_rows(named=True)
        ]
        line = [(p.x, p.y) for p in pts] if by == "label" else _lower_envelope(pts)  # pts sorted by x, y
        series.append(Series(f"{name} skip", colour, pts, line, "linear", group=str(name), style=SKIP))
        full = final.filter((pl.col("policy") == FULL) & (pl.col(by) == name))["ppl"].drop_nulls()
        if full.len():
            series.append(_full_compute(str(name), colour, as_float(full.min()), across, best=by == "method"))
    return ChartSpec(
        names.SKIP_PPL_CHART,
        "Perplexity under skip as compute falls",
        "executed loops",
        "validation perplexity",
        series,
        log_y=log_scale([p.y for s in series for p in s.points]),
    )


FULL_COMPUTE = "full compute"  # the skip chart's reference line: a configuration at all R loops


def _full_compute(name: str, colour: str, ppl: float, across: tuple[float, float], best: bool) -> Series:
    """A configuration's full-compute perplexity as a dashed line across the chart's
    executed loops, its value at the right end (hover)."""
    label = f"{name} {FULL_COMPUTE}" + (" (best)" if best else "")
    low, high = across
    return Series(
        label,
        colour,
        [Point(high, ppl, f"{label}: all R loops")],
        [(low, ppl), (high, ppl)],
        "linear",
        dashed=True,
        group=name,
        style=FULL_COMPUTE,
    )


def _lower_envelope(pts: list[Point]) -> list[tuple[float, float]]:
    """The lowest y reached at or below each x: the points on the (min-y) frontier."""
    on = frontier_mask([p.x for p in pts], [p.y for p in pts], [()] * len(pts), maximize=False)
    return [(p.x, p.y) for p, keep in zip(pts, on) if keep]


def beta_charts(histories: pl.DataFrame, *, n_loops: int | None = None) -> list[ChartSpec]:
    """histories: run_id, key, step, value, beta (one training run per seed and β).
    With n_loops R, the entropy chart marks its maximum log R."""
    charts = []
    titles = {
        tracking.EXIT_ENTROPY: ("Exit entropy during training", "exit entropy"),
        tracking.EXPECTED_EXIT_STEP: ("Expected exit step during training", "expected exit step"),
    }
    for key in names.BETA_DIAGNOSTICS:
        rows = histories.filter((pl.col("key") == key) & pl.col("value").is_not_null())
        if rows.is_empty():
            continue
        # The common training range: every curve reaches it (App. D truncates the same way).
        last_step = rows.group_by("run_id").agg(pl.col("step").max())["step"].min()
        rows = rows.filter(pl.col("step") <= last_step)
        mean = (
            rows.group_by("beta", "step")
            .agg(pl.col("value").mean(), pl.col("run_id").n_unique().alias("n"))
            .sort("beta", "step", nulls_last=True)
        )
        series = []
        for i, (beta, group) in enumerate(mean.group_by("beta", maintain_order=True)):
            beta = beta[0] if isinstance(beta, tuple) else beta
            name = f"β={beta:g}" if beta is not None else "β=?"
            pts = [
                Point(float(r["step"]), r["value"], f"{name} step {r['step']} (n={r['n']})")
                for r in group.iter_rows(named=True)
            ]
            series.append(Series(name, PALETTE[i % len(PALETTE)], pts, [(p.x, p.y) for p in pts], "linear"))
        title, label = titles[key]
        hlines = [(math.log(n_loops), f"max entropy log {n_loops}")] if key == tracking.EXIT_ENTROPY and n_loops else []
        charts.append(ChartSpec(f"beta_{key}", title, "training step", label, series, hlines=hlines, legend_title="β"))
    return charts


def _axis_places(table: pl.DataFrame, name: str) -> tuple[bool, list, list]:
    """(numeric, each row's x, the ticks) of the axis `name`: its own values when numeric
    (the _order0 column), else positions 0..k-1 labelled by its values."""
    if "_order0" in table.columns and table["_order0"].is_not_null().all():
        xs = table["_order0"].to_list()
        places = sorted(set(xs))
        return True, xs, list(zip(places, tick_labels(places)))
    values = list(dict.fromkeys(table[name].to_list()))
    positions = {v: float(i) for i, v in enumerate(values)}
    return False, [positions[v] for v in table[name].to_list()], list(zip(positions.values(), values))


def axis_chart(
    table: pl.DataFrame, axes: list[Axis], keys: list[str], quality: str, qlabel: str, skip_label: str | None
) -> ChartSpec:
    """The quality against the first axis, one line per method and value of the other
    axes (and one dashed per skip point); a numeric axis on its own scale (log when its
    values span more than 10×), its ticks short and apart (tick_labels, spaced_ticks); any
    other at positions 0..k-1 labelled by its values."""
    first = axes[0]
    numeric, xs, x_ticks = _axis_places(table, first.name)
    table = table.with_columns(pl.Series("_x", xs, pl.Float64))
    rest = keys[1:]
    low, high = f"{qlabel} low", f"{qlabel} high"
    series = []
    groups = table.group_by(rest, maintain_order=True) if rest else [((), table)]
    for i, (key, group) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        name = " · ".join(f"{k}={v}" if k != "method" else str(v) for k, v in zip(rest, key))
        group = group.sort("_x")
        colour = PALETTE[i % len(PALETTE)]
        pts = [
            Point(r["_x"], r[qlabel], f"{first.name}={r[first.name]} (seeds: {r['seeds']})", r[low], r[high])
            for r in group.iter_rows(named=True)
            if r[qlabel] is not None
        ]
        # A line joins the values of a numeric axis; categories (N⊗R, arms) are points only.
        series.append(
            Series(
                " · ".join(filter(None, (name, "full depth"))),
                colour,
                pts,
                [(p.x, p.y) for p in pts] if numeric else [],
                "linear",
            )
        )
        if skip_label:
            pts = [
                Point(
                    r["_x"],
                    r[f"{skip_label} {qlabel}"],
                    f"{first.name}={r[first.name]} · {skip_label}",
                    r["_skip_low"],
                    r["_skip_high"],
                )
                for r in group.iter_rows(named=True)
                if r[f"{skip_label} {qlabel}"] is not None
            ]
            series.append(
                Series(
                    " · ".join(filter(None, (name, skip_label))),
                    colour,
                    pts,
                    [(p.x, p.y) for p in pts] if numeric else [],
                    "linear",
                    dashed=True,
                )
            )
    ys = [p.y for s in series for p in s.points]
    xs_pos = [x for x in xs if x is not None]
    log_x = numeric and bool(xs_pos) and min(xs_pos) > 0 and max(xs_pos) / min(xs_pos) > 10
    if numeric:
        x_ticks = spaced_ticks(x_ticks, log=log_x)
    return ChartSpec(
        "axis",
        f"{qlabel} against {first.name} (final stage)",
        first.name,
        qlabel,
        series,
        log_y=log_scale(ys) and names.higher_is_better(quality) is False,
        log_x=log_x,
        legend_title=" · ".join(rest),
        x_ticks=x_ticks,
    )
