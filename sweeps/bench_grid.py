"""What the bench sweep times, as typed grids: prefill points (`SpeedGrid`: batches ×
prefill lengths × skip policies, a dtype and a packing; the paper's Tables 5 and 6 as
named grids) and decoding under continuous arrivals (`ArrivalGrid`), each read from the
command line with every value checked before anything is timed."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

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


def bench_grid_from_args(args: argparse.Namespace) -> SpeedGrid:
    """The named grid with the flags' overrides; a bad value is a ConfigError naming its flag."""
    if args.grid not in GRIDS:
        fail("--grid", args.grid, " | ".join(GRIDS))
    grid = GRIDS[args.grid]
    if args.batches:
        grid = replace(grid, batches=_distinct_ints("--batches", args.batches))
    if args.seq_lens:
        grid = replace(grid, seq_lens=_distinct_ints("--seq-lens", args.seq_lens))
    if args.policies:
        check_skip_policies(args.policies)
        grid = replace(grid, policies=args.policies)
    if args.dtype:
        if args.dtype not in DTYPES:
            fail("--dtype", args.dtype, " | ".join(DTYPES))
        grid = replace(grid, dtype=args.dtype)
    if args.packing:
        if args.packing not in PACKINGS:
            fail("--packing", args.packing, " | ".join(PACKINGS))
        grid = replace(grid, packing=args.packing)
    if args.repeats:
        repeats = _ints("--repeats", args.repeats, "an integer >= 1")
        if len(repeats) != 1:
            fail("--repeats", args.repeats, "an integer >= 1")
        grid = replace(grid, repeats=repeats[0])
    return grid


ARRIVAL_FLAGS = ("--slots", "--requests", "--prompt-len", "--new-tokens", "--schedules")


def arrival_grid_from_args(args: argparse.Namespace) -> ArrivalGrid | None:
    """The grid's arrivals settings with the flags' overrides when --arrivals is given,
    else None; an arrivals flag without --arrivals is a mistake worth a line."""
    given = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in ARRIVAL_FLAGS}
    if not args.arrivals:
        for flag, text in given.items():
            if text:
                fail(flag, text, f"{flag} together with --arrivals")
        return None
    grid = ARRIVAL_GRIDS.get(args.grid, ArrivalGrid())
    if given["--slots"]:
        grid = replace(grid, slots=_distinct_ints("--slots", given["--slots"]))
    if given["--requests"]:
        requests = _ints("--requests", given["--requests"], "an integer >= 1")
        if len(requests) != 1:
            fail("--requests", given["--requests"], "an integer >= 1")
        grid = replace(grid, requests=requests[0])
    if given["--prompt-len"]:
        grid = replace(grid, prompt_len=_tokens_flag("--prompt-len", given["--prompt-len"]))
    if given["--new-tokens"]:
        grid = replace(grid, new_tokens=_tokens_flag("--new-tokens", given["--new-tokens"]))
    if given["--schedules"]:
        grid = replace(grid, schedules=_schedules_flag(given["--schedules"]))
    return grid


def _tokens_flag(flag: str, text: str) -> tuple[int, int]:
    from looplab.inference.arrivals import parse_range

    try:
        return parse_range(flag, text)
    except ConfigError:
        fail(flag, text, "LOW-HIGH or N, integers with 1 <= LOW <= HIGH")


def _schedules_flag(text: str) -> tuple[str, ...]:
    from looplab.inference.depth_batching import SCHEDULES

    schedules = [s.strip() for s in text.split(",") if s.strip()]
    if not schedules or any(s not in SCHEDULES for s in schedules):
        fail("--schedules", text, f"comma-separated: {' | '.join(SCHEDULES)}")
    return tuple(distinct("--schedules", text, schedules))


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
