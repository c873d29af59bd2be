"""Compute–quality Pareto frontiers, the area between two of them, and the best point
under a compute budget. (`python analysis/frontier.py` runs the command line,
`python -m analysis`.)

Compute is always minimised (executed loops, backbone FLOPs per token, seconds);
quality is maximised (accuracy, lm-eval scores) or minimised (perplexity, loss).
A point is on the frontier when no other point has at most its compute and better
quality. Determinism with ties: points are ranked by compute, then quality (best
first), then the tie-break columns (default label and point, when present), then
input order; walking that order, a point joins the frontier when its quality is
strictly better than every cheaper-or-equal point before it. So of two points with
equal compute the better stays; of exact duplicates the first in that order stays;
of equal quality the cheaper stays.

Area between two frontiers (frontier_area) is over their shared compute range,
[max of their smallest computes, min of their largest], and its sign says which is
better: positive when the first frontier has the better quality (higher accuracy,
lower perplexity). Each frontier is read as a step function by default, quality(c)
= the best quality of a frontier point with compute <= c: exactly what a budget c
buys by choosing one configuration, with no assumption about configurations
between the measured ones. interpolation="linear" joins frontier points by straight
lines instead (what mixing two configurations token by token would give in
expectation for accuracy or loss, not for perplexity); both are exact integrals of
piecewise-constant or piecewise-linear functions.
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import polars as pl

from analysis.errors import AnalysisError

DEFAULT_TIE_BREAK = ("label", "point")


def _clean(df: pl.DataFrame, x: str, y: str) -> pl.DataFrame:
    for c in (x, y):
        if c not in df.columns:
            raise AnalysisError(f"no column {c!r} to build a frontier from; columns: {', '.join(df.columns)}")
    return df.filter(
        pl.col(x).is_not_null() & pl.col(y).is_not_null() & pl.col(x).is_not_nan() & pl.col(y).is_not_nan()
    )


def frontier_mask(xs: list[float], ys: list[float], keys: list[tuple], maximize: bool) -> list[bool]:
    """Which points are on the Pareto frontier: by increasing x (ties by y, then keys),
    a point is on it when its y beats every point before it."""
    sign = 1.0 if maximize else -1.0
    order = sorted(range(len(xs)), key=lambda i: (xs[i], -sign * ys[i], keys[i], i))
    on = [False] * len(xs)
    best = -math.inf
    for i in order:
        if sign * ys[i] > best:
            on[i], best = True, sign * ys[i]
    return on


def pareto_frontier(
    df: pl.DataFrame, x: str, y: str, *, maximize: bool = True, by=None, tie_break=DEFAULT_TIE_BREAK
) -> pl.DataFrame:
    """df (rows with null/NaN x or y dropped) with a boolean column `on_frontier`,
    computed within each group of `by` (e.g. the series: method and policy).

    Raises AnalysisError when no row has both x and y."""
    clean = _clean(df, x, y)
    if clean.is_empty():
        raise AnalysisError(f"no points to build a frontier from: {df.height} rows, none with both {x} and {y}")
    by = [by] if isinstance(by, str) else list(by or [])
    ties = [c for c in tie_break if c in clean.columns]
    clean = clean.with_row_index("_row")
    flags: dict[int, bool] = {}  # row index -> on the frontier
    groups = clean.partition_by(by, as_dict=False, maintain_order=True) if by else [clean]
    for group in groups:
        keys = (
            list(zip(*(group[c].cast(pl.String).fill_null("").to_list() for c in ties)))
            if ties
            else [()] * group.height
        )
        mask = frontier_mask(group[x].cast(pl.Float64).to_list(), group[y].cast(pl.Float64).to_list(), keys, maximize)
        flags.update(zip(group["_row"].to_list(), mask))
    on = pl.Series("on_frontier", [flags[i] for i in clean["_row"].to_list()], dtype=pl.Boolean)
    return clean.with_columns(on).drop("_row")


def frontier(df: pl.DataFrame, x: str, y: str, *, maximize: bool = True, tie_break=DEFAULT_TIE_BREAK) -> pl.DataFrame:
    """Only the frontier's points, by increasing compute (quality improves along it)."""
    return pareto_frontier(df, x, y, maximize=maximize, tie_break=tie_break).filter("on_frontier").sort(x)


def _points(f, x: str, y: str, maximize: bool) -> list[tuple[float, float]]:
    """Frontier points as (compute, goodness) with goodness = quality, negated when lower is better."""
    if isinstance(f, pl.DataFrame):
        f = frontier(f, x, y, maximize=maximize)
        pts = list(zip(f[x].to_list(), f[y].to_list()))
    else:
        pts = [(float(a), float(b)) for a, b in f]
        if not pts:
            raise AnalysisError("no points to build a frontier from: empty input")
        keep = frontier_mask([p[0] for p in pts], [p[1] for p in pts], [()] * len(pts), maximize)
        pts = sorted(p for p, k in zip(pts, keep) if k)
    sign = 1.0 if maximize else -1.0
    return [(float(a), sign * float(b)) for a, b in pts]


def _value(pts: list[tuple[float, float]], c: float, interpolation: str) -> float:
    """The frontier's goodness at compute c (c within its range)."""
    below = [p for p in pts if p[0] <= c]
    x0, g0 = below[-1]
    if interpolation == "step" or x0 == c:
        return g0
    x1, g1 = next(p for p in pts if p[0] > c)
    return g0 + (g1 - g0) * (c - x0) / (x1 - x0)


def frontier_gap(a, b, x: str = "x", y: str = "y", *, maximize: bool = True, interpolation: str = "step") -> dict:
    """The area between frontiers a and b over their shared compute range, with its
    range and the mean quality gap (area / range width; 0 for a zero-width range).
    a, b: DataFrames (their frontier is taken) or lists of (compute, quality) pairs.
    Positive: a is better. See the module docstring for the interpolation."""
    if interpolation not in ("step", "linear"):
        raise AnalysisError(f"interpolation={interpolation!r} is invalid; allowed: step | linear")
    pa, pb = _points(a, x, y, maximize), _points(b, x, y, maximize)
    lo, hi = max(pa[0][0], pb[0][0]), min(pa[-1][0], pb[-1][0])
    if lo > hi:
        raise AnalysisError(
            f"the frontiers share no compute range: one covers [{pa[0][0]:g}, {pa[-1][0]:g}], "
            f"the other [{pb[0][0]:g}, {pb[-1][0]:g}]"
        )
    cuts = sorted({lo, hi, *(p[0] for p in pa + pb if lo < p[0] < hi)})
    area = 0.0
    for c0, c1 in itertools.pairwise(cuts):
        d0 = _value(pa, c0, interpolation) - _value(pb, c0, interpolation)
        if interpolation == "step":
            area += d0 * (c1 - c0)
        else:  # both are linear on [c0, c1]: the trapezoid is exact
            d1 = _value(pa, c1, interpolation) - _value(pb, c1, interpolation)
            area += 0.5 * (d0 + d1) * (c1 - c0)
    return {"area": area, "lo": lo, "hi": hi, "mean_gap": area / (hi - lo) if hi > lo else 0.0}


def frontier_area(a, b, x: str = "x", y: str = "y", *, maximize: bool = True, interpolation: str = "step") -> float:
    """The signed area between frontiers a and b (positive: a is better); see frontier_gap."""
    return frontier_gap(a, b, x, y, maximize=maximize, interpolation=interpolation)["area"]


def best_under_budget(
    df: pl.DataFrame, x: str, y: str, budget: float, *, maximize: bool = True, tie_break=DEFAULT_TIE_BREAK
) -> dict:
    """The row with the best quality among those with compute <= budget (ties: less
    compute, then the tie-break columns). Raises AnalysisError when none fits."""
    clean = _clean(df, x, y)
    if clean.is_empty():
        raise AnalysisError(f"no points with both {x} and {y}")
    fits = clean.filter(pl.col(x) <= budget)
    if fits.is_empty():
        cheapest = cast(float, clean[x].min())  # x is numeric, its nulls and NaNs dropped by _clean
        raise AnalysisError(f"no configuration within the budget {x} <= {budget:g}; the cheapest needs {cheapest:g}")
    ties = [c for c in tie_break if c in fits.columns]
    ranked = fits.sort([y, x, *ties], descending=[maximize, False, *([False] * len(ties))], nulls_last=True)
    return ranked.row(0, named=True)


if __name__ == "__main__":  # `python analysis/frontier.py`: the one entry point, `python -m analysis`
    import runpy

    runpy.run_module("analysis", run_name="__main__")
