"""The arguments several commands share: argparse types for exit policies and
schedules, and the options (looplab/arguments.py flag) of every command that computes
(Threads: --threads), decodes (Compile: --compile) or times (Timing: --warmup,
--repeats, --device, --json)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from looplab.arguments import add_flags, at_least, flag, int_in, some_of
from looplab.config import ConfigError


def policy_type(text: str):
    """An argparse type: one exit policy (ExitPolicy.parse), its error said as argparse's."""
    from looplab.policy import ExitPolicy

    try:
        return ExitPolicy.parse(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("policy ")) from None


def policies_type(text: str):
    """An argparse type: a list of exit policies (parse_policies: 'full;skip:0.2,0.4')."""
    from looplab.policy import parse_policies

    try:
        return parse_policies(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("policies ").removeprefix("policy ")) from None


def schedules_type(text: str) -> list[str]:
    """An argparse type: comma-separated decoding schedules (lockstep, depth), each once."""
    from looplab.inference.depth_batching import SCHEDULES

    return list(some_of(*SCHEDULES)(text))


def threads_type(text: str) -> int:
    """An argparse type: a thread count in [1, the CPUs this process may use]."""
    from looplab.threads import usable_cpus

    return int_in(1, usable_cpus(), "the CPUs this process may use")(text)


@dataclass(frozen=True)
class Threads:
    """--threads, on every command that computes: main() sets torch's threads from it
    (looplab/threads.py), and from the CPUs the process was given without it (the default,
    0, is not a value to give). More threads than CPUs only wait on each other, and
    torch crashes at some 10⁵."""

    threads: int = flag(
        0,
        "torch threads, at most this process's CPUs (default: Ray's allocation inside Ray, else the "
        "machine's free cores)",
        type=threads_type,
    )


DEVICE_HELP = "auto | cpu | cuda | cuda:N"  # what looplab/destinations.py device allows
CompileSetting = Literal["on", "off", "cuda-graphs"]
COMPILE_HELP = (
    "decode with the compiled one-token step (looplab/models/compiled.py; the first steps compile for "
    "seconds), the eager one, or the compiled one captured in CUDA graphs (a GPU; on a CPU the same as on)"
)


@dataclass(frozen=True)
class Compile:
    """--compile, on every command that decodes: the compiled one-token step (the
    default), eager, or CUDA graphs. A command that decodes eagerly by default
    subclasses it with its own default."""

    compile: CompileSetting = flag("on", COMPILE_HELP)


@dataclass(frozen=True)
class Device:
    """--device, on every command that computes on a chosen device."""

    device: str = flag("auto", DEVICE_HELP)


@dataclass(frozen=True)
class Timing(Device):
    """The flags every timing command shares (with Threads): the device, warm-ups,
    repeats, JSON out. A command with other counts subclasses it with its own defaults."""

    warmup: int = flag(2, "untimed runs first", type=at_least(0))
    repeats: int = flag(5, "timed runs", type=at_least(1))
    json: str | None = flag(None, "write the records (a JSON list) here")


def command(sub, name: str, run, *options: type) -> None:
    """One `looplab` subcommand: its flags from the options dataclasses, its help the first
    paragraph of the first one's docstring, `run` what it does with the parsed arguments."""
    p = sub.add_parser(name, help=" ".join((options[0].__doc__ or "").split("\n\n")[0].split()))
    add_flags(p, *options)
    p.set_defaults(fn=run)
