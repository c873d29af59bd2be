"""`looplab options [PREFIX]`: every config override key, its default, type and whether
it enters the run's key, with the comment its field is declared with
(looplab/config/reference.py; docs/options.md is the same as a page)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from looplab.arguments import flag, flags_of
from looplab.cli.shared_flags import command


@dataclass(frozen=True)
class Options:
    """the config keys an override sets (KEY=VALUE), their defaults and meaning

    `looplab options`'s arguments."""

    prefix: list[str] = flag(
        help="the keys to list by their start, e.g. train. or exit.beta (default: all)", positional=True
    )


def add_options(sub) -> None:
    command(sub, "options", cmd_options, Options)


def cmd_options(parsed: argparse.Namespace) -> int:
    from looplab.config.reference import describe

    args = flags_of(Options, parsed)
    print("".join(describe(prefix) for prefix in args.prefix or [""]), end="")
    return 0
