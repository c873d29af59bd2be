"""`looplab options [PREFIX]`: every config override key, its default, type and whether
it enters the run's key, with the comment its field is declared with
(looplab/config/reference.py; docs/options.md is the same as a page)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from looplab.arguments import add_flags, flag, flags_of


@dataclass(frozen=True)
class Options:
    """`looplab options`'s arguments."""

    prefix: list[str] = flag(
        help="the keys to list by their start, e.g. train. or exit.beta (default: all)", positional=True
    )


def add_options(sub) -> None:
    o = sub.add_parser("options", help="the config keys an override sets (KEY=VALUE), their defaults and meaning")
    add_flags(o, Options)
    o.set_defaults(fn=cmd_options)


def cmd_options(parsed: argparse.Namespace) -> int:
    from looplab.config.reference import describe

    args = flags_of(Options, parsed)
    print("".join(describe(prefix) for prefix in args.prefix or [""]), end="")
    return 0
