"""Effect against scale: the scale scan's table and figures (sweeps/scale_scan.py).

A scan varies its axes (the sweep run's tag scan_axes) one at a time. Along an axis p,
a line is a set of configurations that agree on every other axis; each configuration's
effect is read over its seeds with analysis/claims.py's measures and intervals:

  holes   (gated trials: the Ouro and CHASE arms of each configuration) each arm's
          perplexity increase over its own full compute at R/2 executed loops, and the
          gap Ouro − CHASE, paired over seeds (C3's measure), with C3's verdict per point
  loops   (pre-training only: N⊗R beside N⊗1 and NR⊗1) the exact-match gain of N⊗R over
          N⊗1 and over NR⊗1 in points (C1's measure, Welch), per level

The report of a scan's experiment (analysis/report/, `python -m analysis`) holds them:
scan.csv, scan.md (the table), scan.png (one panel per line) and scan_<axis>.png.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from analysis import names
from analysis.charts import PALETTE, ChartSpec, Point, Series
from analysis.claims import CLAIMS, SEARCHED, trial_measures
from analysis.errors import AnalysisError
from analysis.stats import Interval, difference, mean_interval
from looplab import tracking

GAP, OURO, CHASE, LOOPED_GAIN, DEPTH_GAIN = "Ouro − CHASE", "Ouro", "CHASE", "N⊗R − N⊗1", "N⊗R − NR⊗1"


def scan_axes(runs_table: pl.DataFrame) -> list[str]:
    """The axes the scan's sweep run recorded (tag scan_axes), in order."""
    if tracking.SCAN_AXES not in runs_table.columns:
        return []
    tagged = runs_table.filter(pl.col("level") == tracking.SWEEP)[tracking.SCAN_AXES].drop_nulls().to_list()
    axes: list[str] = []
    for text in tagged:
        axes += [a for a in text.split(",") if a and a not in axes]
    return axes


def hole_effects(trials: pl.DataFrame, axes: list[str]) -> pl.DataFrame:
    """One row per (configuration, effect) of the gated trials (trial_measures rows):
    the axes' values, effect (Ouro, CHASE, Ouro − CHASE), mean, low, high, n, loops,
    and the verdict of C3 on the gap row."""
    gated = trials.filter(pl.col("method").is_in([OURO, CHASE]))
    if gated.is_empty():
        raise AnalysisError("no Ouro or CHASE trials: the holes scan's effects need both arms")
    config = _config_columns(gated, exclude=("arm",))
    rows = []
    for values, part in gated.group_by(config, maintain_order=True):
        o, c = part.filter(pl.col("method") == OURO), part.filter(pl.col("method") == CHASE)
        by = dict(zip(config, values))
        loops = part["loops"].drop_nulls()
        common = {**_axis_values(by, axes), "loops": loops[0] if len(loops) else None}
        ouro = dict(o.select("seed", names.SKIP_INCREASE).iter_rows())
        chase = dict(c.select("seed", names.SKIP_INCREASE).iter_rows())
        gap = difference(ouro, chase, paired=True)
        for name, interval in (
            (OURO, mean_interval(ouro.values())),
            (CHASE, mean_interval(chase.values())),
            (GAP, gap),
        ):
            rows.append(
                {
                    **common,
                    **_interval_columns(name, interval),
                    "verdict": CLAIMS["C3"].verdict(gap) if name == GAP else None,
                }
            )
    return pl.DataFrame(rows, infer_schema_length=None)


def loop_effects(trials: pl.DataFrame, axes: list[str]) -> pl.DataFrame:
    """One row per (configuration, effect) of pre-training-only trials: N⊗R's exact-match
    gain over N⊗1 and over NR⊗1, in points (Welch: independent pre-trainings), per
    looped pair N⊗R of the grid."""
    fixed = trials.filter(pl.col("method") == "fixed")
    if fixed.is_empty():
        raise AnalysisError("no pre-training-only trials: the loops scan's effects need N⊗R, N⊗1 and NR⊗1")
    config = _config_columns(fixed, exclude=("n_layers", "n_loops"))
    rows = []
    groups = fixed.group_by(config, maintain_order=True) if config else [((), fixed)]
    for values, part in groups:
        by = dict(zip(config, values))
        acc = {
            (n, r): {s: 100 * a for s, a in seeds.items() if a is not None}
            for (n, r), seeds in _accuracy_by_pair(part).items()
        }
        for (n, r), looped in acc.items():
            if r == 1:
                continue
            for name, other in ((LOOPED_GAIN, (n, 1)), (DEPTH_GAIN, (n * r, 1))):
                if other in acc:
                    gain = difference(looped, acc[other], paired=False)
                    rows.append(
                        {
                            **_axis_values(by, axes),
                            "model": f"{n}⊗{r}",
                            **_interval_columns(name, gain),
                            "verdict": CLAIMS["C1"].verdict(gain) if name == LOOPED_GAIN else None,
                        }
                    )
    if not rows:
        raise AnalysisError("no looped pair N⊗R (R > 1) with its N⊗1 or NR⊗1 in these trials")
    return pl.DataFrame(rows, infer_schema_length=None)


def _accuracy_by_pair(part: pl.DataFrame) -> dict:
    out: dict = {}
    for n, r, seed, acc in part.select("n_layers", "n_loops", "seed", names.FULL_ACCURACY).iter_rows():
        out.setdefault((int(n), int(r)), {}).setdefault(seed, acc)
    return out


def _config_columns(trials: pl.DataFrame, exclude) -> list[str]:
    """The searched params that tell configurations apart (the seed and `exclude` aside)."""
    return [c for c in trials.columns if c.startswith(SEARCHED) and c[len(SEARCHED) :] not in exclude]


def _axis_values(by: dict, axes: list[str]) -> dict:
    """A configuration's searched values by their short names (axes first)."""
    short = {k[len(SEARCHED) :]: v for k, v in by.items()}
    return {**{a: short.get(a) for a in axes}, **{k: v for k, v in short.items() if k not in axes}}


def _interval_columns(name: str, interval: Interval) -> dict:
    return {"effect": name, "mean": interval.mean, "low": interval.low, "high": interval.high, "n": interval.n}


def effects(points: pl.DataFrame, axes: list[str]) -> pl.DataFrame:
    """The scan's effect table: holes when its trials are gated, else loops."""
    trials = trial_measures(points)
    gated = trials["method"].is_in([OURO, CHASE]).any()
    return hole_effects(trials, axes) if gated else loop_effects(trials, axes)


# ---- lines along the axes ------------------------------------------------------------------------


def lines(table: pl.DataFrame, axes: list[str]) -> list[tuple[str, dict, pl.DataFrame]]:
    """(axis, the other axes' values, the line's rows) for every line with ≥ 2 values of
    its axis: rows that agree on every other axis (and on the looped model, for loops)."""
    present = [a for a in axes if a in table.columns]
    # The other searched values (a scan's stage steps, hole range) derive from the axes; the
    # loops effect's looped model tells lines apart.
    rest = [c for c in ("model",) if c in table.columns]
    out = []
    for axis in present:
        others = [a for a in present if a != axis] + rest
        groups = table.group_by(others, maintain_order=True) if others else [((), table)]
        for values, part in groups:
            if part[axis].n_unique() >= 2:
                out.append((axis, dict(zip(others, values)), part))
    return out


def scan_charts(table: pl.DataFrame, axes: list[str]) -> list[ChartSpec]:
    """One chart per line: each effect against the axis, with its seed interval."""
    charts = []
    for axis, fixed, part in lines(table, axes):
        xs, label = _numeric(part[axis].to_list(), axis)
        part = part.with_columns(pl.Series("_x", xs, dtype=pl.Float64))
        series = []
        for i, (effect,) in enumerate(part.select("effect").unique(maintain_order=True).iter_rows()):
            rows = part.filter(pl.col("effect") == effect).sort("_x")
            pts = [
                Point(x, m, f"{effect} at {axis}={v}", lo, hi)
                for x, v, m, lo, hi in rows.select("_x", axis, "mean", "low", "high").iter_rows()
                if m is not None
            ]
            series.append(
                Series(effect, PALETTE[i % len(PALETTE)], pts, line=[(p.x, p.y) for p in pts], shape="linear")
            )
        unit = "points of %" if GAP in part["effect"].to_list() else "points"
        kept = ", ".join(f"{k}={v}" for k, v in fixed.items() if v is not None)
        charts.append(
            ChartSpec(
                name=f"scan_{axis}",
                title=f"effect against {axis} ({kept})",
                x_label=label,
                y_label=f"effect ({unit}; 95 % interval over seeds)",
                series=series,
                hlines=[(0.0, "no effect")],
            )
        )
    return charts


def _numeric(values: list, axis: str) -> tuple[list[float], str]:
    """An axis's values as x positions: numbers as they are, anything else by its rank."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return [float(v) for v in values], axis
    order = sorted(set(map(str, values)))
    return [
        float(order.index(str(v))) for v in values
    ], f"{axis} ({', '.join(f'{i}: {v}' for i, v in enumerate(order))})"


def scan_markdown(table: pl.DataFrame, axes: list[str]) -> str:
    """The effect table as markdown: one block of rows per line of the scan (its axis first,
    by increasing value; the centre appears in every block), one column per effect."""
    present = [a for a in axes if a in table.columns]
    keys = present + [c for c in ("model", "loops") if c in table.columns]
    effects_ = table["effect"].unique(maintain_order=True).to_list()
    header = ["axis", *keys, *effects_] + (["verdict"] if "verdict" in table.columns else [])
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    blocks = lines(table, present) or [("-", {}, table)]
    for axis, _, part in blocks:
        order = part.select(keys).unique(maintain_order=True)
        if axis in part.columns:
            x, _ = _numeric(order[axis].to_list(), axis)
            order = order.with_columns(pl.Series("_x", x)).sort("_x").drop("_x")
        for values in order.iter_rows():
            rows = part.filter(pl.all_horizontal([pl.col(k).eq_missing(v) for k, v in zip(keys, values)]))
            cells = [axis, *(_fmt(v) for v in values)]
            for effect in effects_:
                row = rows.filter(pl.col("effect") == effect)
                cells.append(_interval_text(row.row(0, named=True)) if row.height else "")
            if "verdict" in table.columns:
                verdicts = rows["verdict"].drop_nulls().to_list()
                cells.append(verdicts[0] if verdicts else "")
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _interval_text(row: dict) -> str:
    if row["mean"] is None:
        return "n/a"
    if row["low"] is None or not math.isfinite(row["low"]):
        return f"{row['mean']:+.1f}"
    return f"{row['mean']:+.1f} [{row['low']:+.1f}, {row['high']:+.1f}]"


def write_scan(
    points: pl.DataFrame, axes: list[str], out_dir: str | Path
) -> tuple[dict[str, Path], pl.DataFrame, list[ChartSpec]]:
    """scan.csv, scan.md, scan_<axis>.png per line and scan.png with every line's panel;
    returns the paths, the effect table and the charts."""
    from analysis.plots import render_panels, render_png

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = effects(points, axes)
    paths = {"scan.csv": out / "scan.csv", "scan.md": out / "scan.md"}
    table.write_csv(paths["scan.csv"])
    paths["scan.md"].write_text(scan_markdown(table, axes) + "\n")
    charts = scan_charts(table, axes)
    for spec in charts:
        paths[f"{spec.name}.png"] = render_png(spec, out / f"{spec.name}.png")
    if charts:
        paths["scan.png"] = render_panels(charts, out / "scan.png")
    return paths, table, charts
