"""What the bench sweep times, as typed grids: prefill points (`SpeedGrid`: batches ×
prefill lengths × skip policies, a dtype and a packing; the paper's Tables 5 and 6 as
named grids) and decoding under continuous arrivals (`ArrivalGrid`), each read from its
flags (`SpeedFlags`, `ArrivalFlags`) with every value checked before anything is timed."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from looplab.arguments import flag
from looplab.config import ConfigError
from looplab.policy import SKIP, parse_policies
from sweeps.flags import distinct, fail
from trainables.bench import ArrivalPlan, ArrivalPoint, SpeedPoint

PACKINGS = ("auto", "padded", "varlen")


DTYPES = ("fp32", "bf16")


PAPER_POLICIES = "skip:0.2,0.4,0.6"  # Tables 5 and 6: q 0.2 / 0.4 / 0.6


@dataclass(frozen=True)
class SpeedGrid:
    batches: tuple[int, ...]
    seq_lens: tuple[int, ...]
    policies: str  # a parse_policies text of skip policies
    dtype: str = "fp32"
    packing: str = "auto"
    repeats: int = 5

    def points(self) -> list[SpeedPoint]:
        """Every (length, batch, policy), in that order."""
        return [
            SpeedPoint(b, length, p.spec, self.dtype, self.packing)
            for length in self.seq_lens
            for b in self.batches
            for p in parse_policies(self.policies)
        ]

    def describe(self) -> str:
        return (
            f"batch {', '.join(map(str, self.batches))} × L {', '.join(map(str, self.seq_lens))} × "
            f"{' '.join(p.spec for p in parse_policies(self.policies))}; {self.dtype}, packing {self.packing}, "
            f"{self.repeats} repeats"
        )


GRIDS = {
    "table5-140m": SpeedGrid((1, 4, 8, 16, 64), (2048,), PAPER_POLICIES, "bf16", "padded"),
    "table5-370m": SpeedGrid((4, 8, 16, 32, 64), (2048,), PAPER_POLICIES, "bf16", "padded"),
    "table6": SpeedGrid((16,), (256, 512, 1024, 2048, 3584), PAPER_POLICIES, "bf16", "padded"),
    "debug": SpeedGrid((1, 4), (128,), PAPER_POLICIES, "fp32", "auto", repeats=3),
}


@dataclass(frozen=True)
class ArrivalGrid:
    """The arrivals benchmark's settings: the stream, the slots and schedules (the
    policies are the speed grid's, full added as the baseline)."""

    slots: tuple[int, ...] = (8, 32)
    requests: int = 64
    prompt_len: tuple[int, int] = (16, 128)
    new_tokens: tuple[int, int] = (8, 64)
    schedules: tuple[str, ...] = (
        "lockstep",
        "depth",
    )  # looplab.inference.depth_batching.SCHEDULES (which brings torch)
    warmup: int = 1
    repeats: int = 3

    def plan(self, policies: str) -> ArrivalPlan:
        """Every (slots, schedule, policy), full first, in that order."""
        from looplab.policy import ExitPolicy

        specs = list(dict.fromkeys([ExitPolicy.full().spec, *(p.spec for p in parse_policies(policies))]))
        points = tuple(
            ArrivalPoint(s, schedule, spec, self.requests, self.prompt_len, self.new_tokens)
            for s in self.slots
            for schedule in self.schedules
            for spec in specs
        )
        return ArrivalPlan(points, self.warmup, self.repeats)

    def describe(self) -> str:
        return (
            f"slots {', '.join(map(str, self.slots))} × {' '.join(self.schedules)}; {self.requests} requests, "
            f"prompts {self.prompt_len[0]}-{self.prompt_len[1]}, {self.new_tokens[0]}-{self.new_tokens[1]} new "
            f"tokens; {self.warmup} warm-up(s), {self.repeats} repeats"
        )


# The paper's grids take looplab bench-arrivals' defaults; debug serves a few short
# requests so that a CPU measures it in seconds.
ARRIVAL_GRIDS = {"debug": ArrivalGrid(slots=(2,), requests=6, prompt_len=(8, 16), new_tokens=(4, 8), repeats=1)}


def _ints(flag: str, text: str, allowed: str = "comma-separated integers >= 1, e.g. 1,4,16") -> tuple[int, ...]:
    values = []
    for part in (t.strip() for t in text.split(",")):
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            fail(flag, text, allowed)
        values.append(value)
    return tuple(values)


def _distinct_ints(flag: str, text: str) -> tuple[int, ...]:
    """A list of integers >= 1, each once (a repeated batch size would be timed twice)."""
    return tuple(distinct(flag, text, list(_ints(flag, text))))


def parse_number(flag: str, text: str, minimum: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        fail(flag, text, what)
    return value


def _one_int(flag: str, text: str) -> int:
    values = _ints(flag, text, "an integer >= 1")
    if len(values) != 1:
        fail(flag, text, "an integer >= 1")
    return values[0]


def _one_of(*choices: str) -> Callable[[str, str], str]:
    def read(flag: str, text: str) -> str:
        if text not in choices:
            fail(flag, text, " | ".join(choices))
        return text

    return read


def _skip_policies(flag: str, text: str) -> str:
    check_skip_policies(text)
    return text


# The grids' flags are text ("": the named grid's value), read after parsing so that a
# bad value is a ConfigError naming its flag (one line, before the store is read). Each
# reader, by the grid field its flag sets and is named after (seq_lens: --seq-lens), in
# the order they are checked:
Reader = Callable[[str, str], Any]
SPEED_READERS: dict[str, Reader] = {
    "batches": _distinct_ints,
    "seq_lens": _distinct_ints,
    "policies": _skip_policies,
    "dtype": _one_of(*DTYPES),
    "packing": _one_of(*PACKINGS),
    "repeats": _one_int,
}


@dataclass(frozen=True)
class SpeedFlags:
    """The speed grid's flags: --grid names one (GRIDS), each other flag overrides the
    named grid's field of its name (SPEED_READERS reads it)."""

    grid: str = flag(
        "debug",
        "a named grid (default debug): table5-140m, table5-370m, table6 are the paper's",
        metavar="|".join(GRIDS),
    )
    batches: str = flag("", "batch sizes (default: the grid's)", metavar="B,...")
    seq_lens: str = flag("", "prefill lengths (default: the grid's)", metavar="L,...")
    policies: str = flag(
        "",
        "skip policies, e.g. skip:0.2,0.4,0.6 or 'skip:0.4;skip-entropy:2.0' (default: the grid's)",
        metavar="GRID",
    )
    dtype: str = flag("", "default: the grid's", metavar="|".join(DTYPES))
    packing: str = flag(
        "",
        "skip's survivor layout: padded (the paper's), varlen (Mamba-2), auto (default: the grid's)",
        metavar="|".join(PACKINGS),
    )
    repeats: str = flag("", "timed repeats per point (default: the grid's)", metavar="N")


def speed_grid_of(flags: SpeedFlags) -> SpeedGrid:
    """The named grid with the flags' overrides; a bad value is a ConfigError naming its flag."""
    if flags.grid not in GRIDS:
        fail("--grid", flags.grid, " | ".join(GRIDS))
    return replace(GRIDS[flags.grid], **_overrides(flags, SPEED_READERS))


def _overrides(flags: Any, readers: dict[str, Reader]) -> dict[str, Any]:
    """The grid fields the given flags set, each value read by its reader."""
    return {name: read(_flag(name), text) for name, read in readers.items() if (text := getattr(flags, name))}


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _tokens_flag(flag: str, text: str) -> tuple[int, int]:
    from looplab.inference.arrivals import parse_range

    try:
        return parse_range(flag, text)
    except ConfigError:
        fail(flag, text, "LOW-HIGH or N, integers with 1 <= LOW <= HIGH")


def _schedules_flag(flag: str, text: str) -> tuple[str, ...]:
    from looplab.inference.depth_batching import SCHEDULES

    schedules = [s.strip() for s in text.split(",") if s.strip()]
    if not schedules or any(s not in SCHEDULES for s in schedules):
        fail(flag, text, f"comma-separated: {' | '.join(SCHEDULES)}")
    return tuple(distinct(flag, text, schedules))


ARRIVAL_READERS: dict[str, Reader] = {
    "slots": _distinct_ints,
    "requests": _one_int,
    "prompt_len": _tokens_flag,
    "new_tokens": _tokens_flag,
    "schedules": _schedules_flag,
}


@dataclass(frozen=True)
class ArrivalFlags:
    """--arrivals, and the flags that override the named grid's arrivals settings
    (ARRIVAL_GRIDS; ARRIVAL_READERS reads them)."""

    arrivals: bool = flag(
        False,
        "also benchmark decoding under continuous arrivals (looplab/inference/arrivals.py), one run per "
        "(checkpoint, slots, schedule, policy, stream)",
    )
    slots: str = flag("", "with --arrivals: cache rows served at once", metavar="S,...")
    requests: str = flag("", "with --arrivals: requests in the stream", metavar="N")
    prompt_len: str = flag(
        "", "with --arrivals: each request's prompt length, drawn uniformly (LOW-HIGH or N)", metavar="LOW-HIGH"
    )
    new_tokens: str = flag(
        "", "with --arrivals: each request's new tokens, drawn uniformly (LOW-HIGH or N)", metavar="LOW-HIGH"
    )
    schedules: str = flag("", "with --arrivals: the schedules", metavar="lockstep,depth")


def arrival_grid_of(flags: ArrivalFlags, grid: str) -> ArrivalGrid | None:
    """The named grid's arrivals settings with the flags' overrides when --arrivals is
    given, else None; an arrivals flag without --arrivals is a mistake worth a line."""
    if not flags.arrivals:
        for name in ARRIVAL_READERS:
            if text := getattr(flags, name):
                fail(_flag(name), text, f"{_flag(name)} together with --arrivals")
        return None
    return replace(ARRIVAL_GRIDS.get(grid, ArrivalGrid()), **_overrides(flags, ARRIVAL_READERS))


def check_skip_policies(text: str) -> None:
    """Skip policies only: each is timed against its dense twin (looplab/costs/timing.py)."""
    try:
        policies = parse_policies(text)
    except ConfigError as e:
        fail("--policies", text, f"skip policies such as skip:0.2,0.4,0.6 or 'skip:0.4;skip-entropy:2.0' ({e})")
    for policy in policies:
        if policy.execution != SKIP:
            fail(
                "--policies",
                policy.spec,
                "skip policies (skip:Q, skip-entropy:T, skip-kl:T, skip-stable:K), "
                "which the benchmark compares with full execution",
            )
