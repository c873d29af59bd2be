"""Curves through (executed loops, mean CE) points: a value at given loops, the mean gap
between two curves, and a perplexity increase from mean CEs.

Mean CE (loss), not perplexity, is interpolated: a token-level mixture of two policies has
the mixture's mean CE at the mixture's mean loops, so a straight line in (loops, loss) is
what mixing two measured policies achieves; perplexity is exp(loss) at the end.
"""

from __future__ import annotations

import math
from typing import Sequence


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float | None:
    """The piecewise-linear curve through (xs, ys) at x; None when x lies outside
    [min xs, max xs] or there are no points. Points at the same x are averaged first."""
    pts: dict[float, list[float]] = {}
    for a, b in zip(xs, ys):
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
            pts.setdefault(float(a), []).append(float(b))
    if not pts:
        return None
    curve = sorted((a, sum(b) / len(b)) for a, b in pts.items())
    if not curve[0][0] - 1e-9 <= x <= curve[-1][0] + 1e-9:
        return None
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[0][1] if abs(x - curve[0][0]) <= 1e-9 else curve[-1][1]


def mean_difference(
    a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]]
) -> float | None:
    """The mean of curve a minus curve b (each piecewise-linear through its (xs, ys)) over
    the x range both cover; exact: the difference is linear between the union of the
    two curves' breakpoints, so the trapezoid rule over them is its integral. None when
    the ranges do not overlap or meet in a point."""

    def points(xs, ys):
        return sorted(
            {
                float(x)
                for x, y in zip(xs, ys)
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
            }
        )

    pa, pb = points(*a), points(*b)
    if not pa or not pb:
        return None
    lo, hi = max(pa[0], pb[0]), min(pa[-1], pb[-1])
    if hi - lo <= 1e-9:
        return None
    cuts = sorted({lo, hi, *(x for x in pa + pb if lo < x < hi)})

    def inside(curve: tuple[Sequence[float], Sequence[float]], x: float) -> float:
        """The curve at an x in [lo, hi], which both curves cover: never None."""
        y = interpolate(*curve, x)
        assert y is not None, f"x={x} lies outside a curve that covers [{lo}, {hi}]"
        return y

    diff = [inside(a, x) - inside(b, x) for x in cuts]
    area = sum((x1 - x0) * (d0 + d1) / 2 for x0, x1, d0, d1 in zip(cuts, cuts[1:], diff, diff[1:]))
    return area / (hi - lo)


def increase_pct(loss: float | None, reference: float | None) -> float | None:
    """Perplexity increase over a reference in percent, from mean CEs: 100 (e^(l − l_ref) − 1)."""
    if loss is None or reference is None:
        return None
    return 100.0 * math.expm1(loss - reference)


def loss_gap_pct(loss_gap: float | None) -> float | None:
    """A mean CE gap as a perplexity ratio's percent: 100 (e^gap − 1)."""
    return None if loss_gap is None else 100.0 * math.expm1(loss_gap)
