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

Prose says more than its tables in other ways too: "gains nothing" (an equivalence with
no margin), "comes from" (a cause nothing tested), "compute-bound" (a regime nothing
measured), "nothing learns" (a universal the table contradicts). KINDS declares each
kind of statement, its phrases and what a check must do to hold one. Every phrase in
PHRASES found in the README or docs/ must sit in a registered sentence whose check tests
that kind, or one registered as no result claim with a reason (tests/test_prose.py); a
new summary sentence either comes with its check or is generated from its table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from analysis.stats import CONFIDENCE, Interval, t_quantile


@dataclass(frozen=True)
class Kind:
    """A kind of statement about results: the phrases that make one (each with why it
    marks the kind) and what a registered check must do to hold the sentence to its page."""

    name: str
    needs: str
    phrases: dict[str, str]  # regex (no capturing groups) → why it is a statement of this kind


_CITED = (
    "cite on its page an interval, a named test or a measurement, which the check finds there "
    "(the figure it quotes must be the page's table's); a design explanation is registered as "
    "no result claim, with a reason"
)

# The documents' vocabulary of claims about results, in one place. Each phrase found in
# the README or docs/ (outside generated blocks) needs a registered sentence whose check
# tests its kind. Phrases are narrow on purpose: one that also fits prose about code
# ("the same config as", "within a function", "names come from tracking.py") would bury
# the claims among registrations that only give a reason.
KINDS = (
    Kind(
        "summary",
        "recompute the figures it quotes from the page's table: a trend's slope interval, a range, a cell",
        {
            r"grows? with": "a trend: only when its slope interval lies above zero",
            r"every paired interval": "a statement about every row's interval",
            r"excludes zero": "an interval's position, read from the table",
            r"[+−-]\d+(?:\.\d+)? to [+−-]\d+(?:\.\d+)? points": "a range: the table's extremes",
        },
    ),
    Kind(
        "equivalence",
        "two one-sided tests at a margin the sentence states (equivalent), on the page's table; "
        "otherwise say what the interval shows and what it does not exclude",
        {
            r"level with": "two results equal: only at a margin their difference's interval fits in",
            r"gain(?:s|ed)? nothing": "an effect of zero, which no interval shows without a margin",
            r"about (?:as much|the same)": "two effects equal (the review's Mistral row: the gap excluded zero)",
            r"no different": "two results equal",
            r"(?:do|does|did) not (?:separate|move)": "no difference, or no change, asserted rather than tested",
            r"agreed? to\b": "two runs' figures equal to a digit: every figure, not the ones looked at",
            r"within [+±]?\d+(?:\.\d+)? ?(?:%|points?\b)": "a bound: the whole interval inside it, not the mean",
            r"the same (?:figures|numbers|results|scores|verdicts) as": "two runs' results equal (results only)",
        },
    ),
    Kind(
        "causal",
        _CITED,
        {
            # singular only: the docs' plural "come from" says where names and data come from
            r"comes from": "an effect attributed to a cause",
            r"because": "a cause",
            r"due to": "a cause",
            r"caused by": "a cause",
            r"explain(?:s|ed by)": "a cause",
        },
    ),
    Kind(
        "regime",
        _CITED,
        {
            r"(?:compute|memory|latency|bandwidth|overhead)-bound": "what limits a speed: true only as measured",
        },
    ),
    Kind(
        "universal",
        "hold for every row or seed of the page's table, recomputed there",
        {
            r"(?:nothing|no model) learns|learns nothing": "no model above chance: every seed's score against it",
            r"every (?:arm|model)\b[^.;:]{0,80}?\b(?:trained|learn\w*|reach\w*)": "every arm or model, one by one",
        },
    ),
)
KIND = {k.name: k for k in KINDS}
PHRASES = tuple(phrase for k in KINDS for phrase in k.phrases)  # each found in the documents must be covered
CLAIM = re.compile(
    "|".join(rf"(?P<{k.name}>(?<!\w)(?:{'|'.join(k.phrases)}))" for k in KINDS), re.IGNORECASE
)  # a phrase starts a word ("due to", not "residue to"); lastgroup names the kind


def claims(text: str) -> list[tuple[str, re.Match]]:
    """Each claim phrase in the text, with its kind."""
    return [(m.lastgroup or "", m) for m in CLAIM.finditer(text)]


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
    mean, low, high = (number(g) for g in match.groups())  # CELL has three groups
    return Cell(mean, low, high, n=n, confidence=confidence)


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
    if interval.low is None:
        return False
    assert interval.high is not None  # an interval has both bounds or neither
    return -margin <= interval.low and interval.high <= margin


def grows(interval: Interval) -> bool:
    return interval.low is not None and interval.low > 0


# ---- the report's "What this sweep found" (analysis/report/findings.py): sentences generated from its tables ----

FLAT = 0.01  # a measure is "flat" across an axis when its means span at most this share of their mean


@dataclass(frozen=True)
class Arm:
    """One value of the searched axis on one measure: its mean over n seeds and the
    seed interval (None with one seed)."""

    name: str  # as the report writes it: "β=0.25"
    mean: float
    low: float | None
    high: float | None
    n: int


def value_text(v: float) -> str:
    return f"{v:.5g}"


def difference_text(d: float, like: float) -> str:
    """A difference of two values written as value_text writes `like`, to the same
    decimals: 272.16 − 262.67 is 9.49, not 9.4923."""
    decimals = max(0, 4 - math.floor(math.log10(abs(like)))) if like and math.isfinite(like) else 4
    return f"{d:.{decimals}f}"


def _ranked(arms: list[Arm], higher_is_better: bool) -> list[Arm]:
    """Best first."""
    return sorted(arms, key=lambda a: -a.mean if higher_is_better else a.mean)


def best_and_worst(arms: list[Arm], measure: str, axis: str, higher_is_better: bool) -> str:
    if len(arms) < 2:
        only = "; ".join(f"{a.name}: {value_text(a.mean)}" for a in arms) or "none"
        return f"One {axis} value has a {measure} ({only}): nothing to compare."
    best, *_, worst = _ranked(arms, higher_is_better)
    if best.mean == worst.mean:
        return f"Every {axis} value has the same {measure} ({value_text(best.mean)})."
    return (
        f"Best {axis} on {measure}: {best.name} ({value_text(best.mean)}); "
        f"worst: {worst.name} ({value_text(worst.mean)})."
    )


def _cell(arm: Arm, confidence: float) -> Cell:
    """An arm as a Cell, for an arm the caller has checked has a seed interval."""
    assert arm.low is not None and arm.high is not None
    return Cell(arm.mean, arm.low, arm.high, arm.n, confidence)


def spread(arms: list[Arm], measure: str, axis: str, higher_is_better: bool, confidence: float = CONFIDENCE) -> str:
    """Whether best − worst lies beyond the seed noise (Welch); with one seed, that nothing can be concluded."""
    if len(arms) < 2:
        return ""
    best, *_, worst = _ranked(arms, higher_is_better)
    gap = abs(best.mean - worst.mean)
    n = min(a.n for a in arms)
    if n < 2 or any(a.low is None or a.high is None for a in (best, worst)):
        return (
            f"With n={n} seed per {axis} value there is no seed interval, so nothing can be concluded from the "
            f"spread of {difference_text(gap, worst.mean)} in {measure} between them."
        )
    d = apart(_cell(best, confidence), _cell(worst, confidence), confidence=confidence)
    assert d.low is not None and d.high is not None
    beyond = d.low > 0 or d.high < 0
    return (
        f"{best.name} − {worst.name}: {d.mean:+.4g} [{d.low:+.4g}, {d.high:+.4g}] ({confidence:.0%} Welch "
        f"interval, n={n} seeds or more): "
        + (
            f"the spread across {axis} is larger than the seed noise."
            if beyond
            else f"the interval includes zero, so the spread across {axis} is within the seed noise."
        )
    )


def against_baseline(
    baseline: Arm, arms: list[Arm], measure: str, axis: str, higher_is_better: bool, result: str = "result"
) -> str:
    """The model before the searched stages against every arm's result, on means."""
    if not arms:
        return ""
    sign = 1.0 if higher_is_better else -1.0
    beaten = [a for a in arms if sign * baseline.mean > sign * a.mean]
    improved = [a for a in arms if sign * a.mean > sign * baseline.mean]
    lo, hi = min(a.mean for a in arms), max(a.mean for a in arms)
    results = value_text(lo) if lo == hi else f"{value_text(lo)}–{value_text(hi)}"
    head = f"{baseline.name} ({measure} {value_text(baseline.mean)})"
    lead = head[:1].upper() + head[1:]
    if len(beaten) == len(arms):
        return f"{lead} beats every {axis} value's {result} ({results}): no {axis} recovers it."
    if len(improved) == len(arms):
        return f"Every {axis} value's {result} ({results}) improves on {head}."
    return (
        f"{lead} beats {len(beaten)} and is beaten by {len(improved)} of {len(arms)} {axis} values' "
        f"{result}s ({results})."
    )


def flatness(arms: list[Arm], measure: str, axis: str) -> str:
    """'flat' when the means span at most FLAT of their mean, else their range."""
    if len(arms) < 2:
        return ""
    lo, hi = min(arms, key=lambda a: a.mean), max(arms, key=lambda a: a.mean)
    centre = sum(a.mean for a in arms) / len(arms)
    share = (hi.mean - lo.mean) / abs(centre) if centre else math.inf
    if share <= FLAT:
        return (
            f"{measure.capitalize()} is flat across {axis}: {value_text(lo.mean)}–{value_text(hi.mean)}, "
            f"a spread of {share:.1%} of its mean (at most {FLAT:.0%})."
        )
    return (
        f"{measure.capitalize()} varies across {axis}: from {value_text(lo.mean)} ({lo.name}) "
        f"to {value_text(hi.mean)} ({hi.name})."
    )


def findings(
    arms: list[Arm],
    *,
    measure: str,
    axis: str,
    higher_is_better: bool,
    baseline: Arm | None = None,
    others: tuple[tuple[str, list[Arm]], ...] = (),
    confidence: float = CONFIDENCE,
    result: str = "result",
) -> list[str]:
    """The report's "What this sweep found": best and worst on the headline measure,
    whether their spread exceeds the seed noise, the baseline (the model the searched
    stages start from) against every arm, and whether each other measure is flat across
    the axis."""
    sentences = [
        best_and_worst(arms, measure, axis, higher_is_better),
        spread(arms, measure, axis, higher_is_better, confidence),
        against_baseline(baseline, arms, measure, axis, higher_is_better, result) if baseline is not None else "",
        *(flatness(other, name, axis) for name, other in others),
    ]
    return [s for s in sentences if s]
