"""Command-line argument types with looplab's one-line errors, for every command: the
library's (`looplab`, looplab/cli/) and the platform's (sweeps/, `python -m analysis`).
A module of its own, torch-free, so that the platform reads it without importing the
library's command line (and so without reaching up into it).

    Parser          argparse with `<prog>: error: <what> (see --help)` and exit status 2
    at_least(n)     an integer >= n
    int_in(a, b)    an integer in [a, b] (a count the machine bounds, e.g. --threads)
    one_of(*c)      one of the choices, worded like every other bad value
    number_in(a, b) a finite number in [a, b] (or (a, b])
    ints_at_least(n) comma-separated integers >= n
    given(allowed)  any text but an empty one, for flags where "" would quietly mean the
                    default or the current folder (an unset shell variable, usually)
"""

from __future__ import annotations

import argparse
import math


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `<prog>: error: <what>` and exit status 2, like
    every other bad input of looplab's commands (argparse prints the usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def at_least(minimum: int):
    """An argparse type: an integer >= minimum (a one-line error otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: an integer >= {minimum}")
        return value

    return parse


def int_in(low: int, high: int, why: str = ""):
    """An argparse type: an integer in [low, high]; `why` says where high comes from."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is invalid; allowed: an integer in [{low}, {high}]" + (f" ({why})" if why else "")
            )
        return value

    return parse


def one_of(*choices: str):
    """An argparse type: one of `choices`, with the one-line "is invalid; allowed:"
    error of every other flag (argparse's own choices= words it differently)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {' | '.join(choices)}")
        return text

    return parse


def number_in(low: float, high: float = float("inf"), *, low_open: bool = False):
    """An argparse type: a number in [low, high] (or (low, high] with low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        # inf is no setting (NaN fails every comparison below, inf passes "<= ∞")
        if value is None or not math.isfinite(value) or not (value > low if low_open else value >= low) or value > high:
            span = f"{'(' if low_open else '['}{low:g}, {high:g}{']' if math.isfinite(high) else ')'}"
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a number in {span.replace('inf', '∞')}")
        return value

    return parse


def ints_at_least(minimum: int):
    """An argparse type: comma-separated integers >= minimum, e.g. 1,8,16."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: comma-separated integers >= {minimum}")
        return values

    return parse


def given(allowed: str):
    """An argparse type: the text as given, unless empty (or blank). Its flag's default
    must not be "" (argparse passes a string default through the type): None, and the
    flag's reader supplies the default."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(
                f"{text!r} is invalid; allowed: {allowed} (leave the flag out for its default)"
            )
        return text

    return parse
