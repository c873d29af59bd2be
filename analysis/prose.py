"""Sentences that summarise a table, held to the table (tests/test_prose.py).

A sentence such as "grows with training", "level with 4⊗1" or "every paired interval
above zero" is a statistical claim about a table of means with intervals over seeds,
and is only as true as its test:

  trend        "grows" / "falls": the least-squares slope of the means against log2 of
               the axis (per doubling), with its interval from the cells' own standard
               errors (Welch–Satterthwaite degrees of freedom); grows only when the
               whole interval lies above zero
  equivalent   "level with": two one-sided tests at a stated margin, each at
               (1 − confidence)/2: the difference's interval lies inside ±margin
  apart        a difference of two cells from independent trainings, Welch
  cell         "+9.3 [+5.3, +13.2]" read back as (mean, low, high)

Every phrase in PHRASES found in the README or docs/ must be one that a registered check
covers (tests/test_prose.py); a new summary sentence either comes with its check or is
generated from its table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from analysis.claims import CONFIDENCE, Interval, t_quantile

# Phrases that state a statistical summary: each occurrence in the documents needs a check.
PHRASES = (
    r"grows with",
    r"grow with",
    r"level with",
    r"every paired interval",
    r"excludes zero",
    r"[+−-]\d+(?:\.\d+)? to [+−-]\d+(?:\.\d+)? points",
)
SUMMARY = re.compile("|".join(PHRASES))
_NUMBER = r"[+−-]?\d+(?:\.\d+)?"
CELL = re.compile(rf"({_NUMBER})[^\[\]0-9]*?\[({_NUMBER}),\s*({_NUMBER})\]")  # words may sit between


def number(text: str) -> float:
    return float(text.replace("−", "-"))


@dataclass(frozen=True)
class Cell:
    """A table cell's mean and interval over n seeds at the given confidence."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE

    @property
    def se(self) -> float:
        """The standard error the interval was built from: its half-width over t."""
        return (self.high - self.low) / 2 / t_quantile(0.5 + self.confidence / 2, self.n - 1)


def cell(text: str, n: int, confidence: float = CONFIDENCE) -> Cell:
    match = CELL.search(text)
    if match is None:
        raise ValueError(f"no 'mean [low, high]' in {text!r}")
    return Cell(*(number(g) for g in match.groups()), n=n, confidence=confidence)


def tables(markdown: str) -> list[list[dict[str, str]]]:
    """Every markdown table in the text, as rows keyed by the header's cells."""
    out, block = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) > 2:
            head = block[0]
            out.append([dict(zip(head, row)) for row in block[2:]])
        block = []
    return out


def table_with(markdown: str, *columns: str) -> list[dict[str, str]]:
    """The first table whose header has all these columns."""
    for rows in tables(markdown):
        if rows and all(c in rows[0] for c in columns):
            return rows
    raise LookupError(f"no table with columns {columns}")


def trend(xs: list[float], cells: list[Cell], *, log2: bool = True, confidence: float = CONFIDENCE) -> Interval:
    """The slope of the cells' means against x (log2 x: per doubling) with its interval:
    slope = Σ c_i m_i with c_i = (x_i − x̄)/Σ(x − x̄)², Var = Σ c_i² se_i² (the points
    are independent trainings), Welch–Satterthwaite degrees of freedom."""
    if len(xs) != len(cells) or len(xs) < 2:
        raise ValueError("a trend needs two or more (x, cell) pairs")
    x = [math.log2(v) if log2 else float(v) for v in xs]
    mean_x = sum(x) / len(x)
    sxx = sum((v - mean_x) ** 2 for v in x)
    weights = [(v - mean_x) / sxx for v in x]
    slope = sum(w * c.mean for w, c in zip(weights, cells))
    parts = [w**2 * c.se**2 for w, c in zip(weights, cells)]
    var = sum(parts)
    df = var**2 / sum(p**2 / (c.n - 1) for p, c in zip(parts, cells))
    half = t_quantile(0.5 + confidence / 2, df) * math.sqrt(var)
    return Interval(slope, slope - half, slope + half, min(c.n for c in cells), se=math.sqrt(var), df=df)


def apart(a: Cell, b: Cell, confidence: float = CONFIDENCE) -> Interval:
    """a − b for two independent trainings' cells, Welch."""
    va, vb = a.se**2, b.se**2
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    se = math.sqrt(va + vb)
    half = t_quantile(0.5 + confidence / 2, df) * se
    d = a.mean - b.mean
    return Interval(d, d - half, d + half, min(a.n, b.n), se=se, df=df)


def equivalent(interval: Interval | Cell, margin: float) -> bool:
    """Two one-sided tests at `margin`: the interval (each side at (1 − confidence)/2)
    lies inside [−margin, +margin]."""
    return interval.low is not None and -margin <= interval.low and interval.high <= margin


def grows(interval: Interval) -> bool:
    return interval.low is not None and interval.low > 0
