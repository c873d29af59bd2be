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
    some_of(*names) comma-separated names among the given ones, each once
    finite          a finite number (a float field's default type)
    given(allowed)  any text but an empty one, for flags where "" would quietly mean the
                    default or the current folder (an unset shell variable, usually)

A command's options are a dataclass whose fields are declared with `flag(...)`: the
field's name, type, default and help are written once, and `add_flags` makes them the
command's flags (`--field-name`), `flags_of` the typed options from what was parsed.

    @dataclass(frozen=True)
    class Timing:
        warmup: int = flag(2, "untimed runs first", type=at_least(0))
        device: str = flag("auto", "cpu | cuda | auto")
        json: str | None = flag(None, "write the records (a JSON list) here")

    add_flags(parser, Timing)            # --warmup, --device, --json
    timing = flags_of(Timing, parser.parse_args())
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from looplab.errors import allowed_names, did_you_mean

T = TypeVar("T")
_FLAG = "looplab.flag"
_SAME = object()  # a Flag's `unset`: the field's own default


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a dataclass field reads from the command line (see `flag`)."""

    help: str = ""
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    name: str | None = None
    unset: Any = _SAME
    repeat: bool = False
    positional: bool = False
    argument: bool = False


def flag(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    type: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    name: str | None = None,
    unset: Any = _SAME,
    repeat: bool = False,
    positional: bool = False,
    argument: bool = False,
) -> Any:
    """A dataclass field that is also a command-line flag.

    default     the field's default; none: the flag is required
    help        what the flag does; " (default X)" is added unless the help says it
    type        an argparse type parsing one value (by default: the field's type, a
                Literal's choices, store_true for a bool)
    name        the flag, when not --field-name
    unset       what the command line gives when the flag is left out, when not the
                field's default (None: its reader supplies one that depends on another flag)
    repeat      the flag may be given several times; the field holds the list
    positional  the field takes the command's remaining words (nargs="*")
    argument    the field is one required word of the command line (e.g. OUT_DIR), not a
                --flag; declare it before the fields with defaults
    """
    how = Flag(help, type, metavar, name, unset, repeat, positional, argument)
    if repeat or positional:  # a list: one per instance
        return dataclasses.field(default_factory=list, metadata={_FLAG: how})
    if argument:
        return dataclasses.field(metadata={_FLAG: how})
    return dataclasses.field(default=default, metadata={_FLAG: how})


def add_flags(parser: argparse.ArgumentParser | Any, *options: type) -> None:
    """Every `flag` field of each options dataclass as `parser`'s argument."""
    for cls in options:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            how = field.metadata.get(_FLAG)
            if how is not None:
                _add(parser, field, how, hints[field.name])


def _add(parser, field: dataclasses.Field, how: Flag, hint: Any) -> None:
    if how.positional or how.argument:
        words = {"nargs": "*"} if how.positional else {"type": how.type, "metavar": how.metavar or field.name.upper()}
        parser.add_argument(field.name, help=how.help, **words)
        return
    kwargs: dict[str, Any] = {"dest": field.name}
    default = field.default if how.unset is _SAME else how.unset
    if how.repeat:
        kwargs.update(action="append", default=[], type=how.type)
    elif hint is bool:
        kwargs.update(action="store_true", default=False)
    elif field.default is dataclasses.MISSING:
        kwargs.update(required=True, type=how.type)
    else:
        kwargs.update(default=default, type=how.type or _parser_of(hint))
    choices = _choices(hint)
    if choices and how.type is None and not how.repeat:
        kwargs.update(type=one_of(*choices), metavar=how.metavar or "{" + ",".join(choices) + "}")
    elif how.metavar:
        kwargs["metavar"] = how.metavar
    kwargs["help"] = _help(how, hint, default)
    parser.add_argument(how.name or "--" + field.name.replace("_", "-"), **kwargs)


def _choices(hint: Any) -> tuple[str, ...]:
    """A Literal type's choices (also inside `Literal[...] | None`)."""
    for arm in (hint, *typing.get_args(hint)):
        if typing.get_origin(arm) is Literal:
            return tuple(str(c) for c in typing.get_args(arm))
    return ()


def _parser_of(hint: Any) -> Callable[[str], Any] | None:
    """The argparse type of a plain field type (int, float, str, and each `X | None`): a
    float is a finite one (NaN would compare false with every bound a reader checks)."""
    for kind in (int, float, str):
        if hint is kind or kind in typing.get_args(hint):
            return finite if kind is float else kind
    return None


def finite(text: str) -> float:
    """An argparse type: a finite number (not nan, not inf)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a finite number")
    return value


def _help(how: Flag, hint: Any, default: Any) -> str | None:
    """The flag's help with its default, unless it is a switch, a required flag, an unset
    (None) one, or the help says it already: "(grid runs each point once; default 8)"."""
    if (
        hint is bool
        or default is None
        or default is dataclasses.MISSING
        or default in ("", (), [])
        or "default" in how.help
    ):
        return how.help or None
    shown = f"default {_shown(default)}"
    if how.help.endswith(")"):
        return f"{how.help[:-1]}; {shown})"
    return f"{how.help} ({shown})" if how.help else shown


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def flags_of(options: type[T], args: argparse.Namespace, **given: Any) -> T:
    """The options dataclass from parsed arguments: each field from its flag, unless
    `given` sets it (a value derived from several flags)."""
    names = [f.name for f in dataclasses.fields(typing.cast(Any, options))]
    return options(**({name: getattr(args, name) for name in names if name in vars(args)} | given))


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `<prog>: error: <what>` and exit status 2, like
    every other bad input of looplab's commands (argparse prints the usage first)."""

    def error(self, message: str):
        # argparse echoes what was typed ("unrecognized arguments: ..."): escaped, so a
        # pasted control character neither redraws the terminal nor breaks the line
        self.exit(2, f"{self.prog}: error: {printable(message)}{_did_you_mean(message)} (see --help)\n")


def _did_you_mean(message: str) -> str:
    """For argparse's "invalid choice: 'trian' (choose from 'train', ...)": the nearest
    choice offered (Python 3.11's argparse does not)."""
    typed = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if typed is None:
        return ""
    return did_you_mean(typed.group(1), re.findall(r"'([^']*)'", typed.group(2)))


def printable(text: str) -> str:
    """The text with every character a terminal would act on (control characters, line
    and paragraph separators, bidirectional overrides) written as its escape."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


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
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {allowed_names(text, choices)}")
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


def some_of(*allowed: str):
    """An argparse type: comma-separated names among `allowed`, each once, in the order given."""

    def parse(text: str) -> tuple[str, ...]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: comma-separated {' | '.join(allowed)}")
        return tuple(dict.fromkeys(names))

    return parse


def has_control_characters(text: str) -> bool:
    """Escape sequences, newlines, tabs (C0, DEL, C1): in a path a pasting accident, and
    echoed on a terminal they would redraw the screen."""
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def given(allowed: str):
    """An argparse type: the text as given, unless empty (or blank). Its flag's default
    must not be "" (argparse passes a string default through the type): None, and the
    flag's reader supplies the default."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(
                f"{text!r} is invalid; allowed: {allowed} (leave the flag out for its default)"
            )
        if has_control_characters(text):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {allowed}, without control characters")
        return text

    return parse
