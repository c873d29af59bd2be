"""The arguments several commands share: argparse types for exit policies and
schedules, and the flags of every command that computes (--threads), decodes
(--compile) or times (--warmup, --repeats, --device, --json)."""

from __future__ import annotations

import argparse

from looplab.arguments import at_least, int_in
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

    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SCHEDULES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: comma-separated {' | '.join(SCHEDULES)}")
    return list(dict.fromkeys(names))


def threads_flag(p) -> None:
    """--threads, on every command that computes: main() sets torch's threads from it
    (looplab/threads.py), and from the CPUs the process was given without it (the default,
    0, is not a value to give). More threads than CPUs only wait on each other, and
    torch crashes at some 10⁵."""
    from looplab.threads import usable_cpus

    p.add_argument(
        "--threads",
        type=int_in(1, usable_cpus(), "the CPUs this process may use"),
        default=0,
        help="torch threads, at most this process's CPUs (default: Ray's allocation inside Ray, else the "
        "machine's free cores)",
    )


def compile_flag(p, default: str) -> None:
    """--compile, on every command that decodes: the compiled one-token step, eager, or CUDA graphs."""
    p.add_argument(
        "--compile",
        choices=("on", "off", "cuda-graphs"),
        default=default,
        help=f"decode with the compiled one-token step (looplab/models/compiled.py; the first steps "
        f"compile for seconds), the eager one, or the compiled one captured in CUDA graphs (a GPU; "
        f"on a CPU the same as on) (default {default})",
    )


def timing_flags(p, *, warmup: int, repeats: int) -> None:
    """The flags every timing command shares: threads, warm-ups, repeats, device, JSON out."""
    threads_flag(p)
    p.add_argument("--warmup", type=at_least(0), default=warmup)
    p.add_argument("--repeats", type=at_least(1), default=repeats)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", help="write the records (a JSON list) here")
