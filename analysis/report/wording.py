"""Counts in words for captions and the page's header."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """'1 trial', '5 trials': a count with its noun in the number it takes."""
    return f"{n} {noun}{'s' if n != 1 else ''}"


def seed_phrase(seeds: list[int]) -> str:
    """'3 seeds (0, 1, 2)', '1 seed (0)': a count, never a bare list that reads '0 seeds'."""
    if not seeds:
        return "the seeds"
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})"


def mean_over(counts: list[int]) -> str:
    """What a curve per group is, from its runs per group: 'one run each', 'mean over 3 seeds'."""
    if not counts or max(counts) == 1:
        return "one run each, no mean"
    low, high = min(counts), max(counts)
    return f"mean over {low} seeds" if low == high else f"mean over {low}–{high} seeds"
