"""Decoding under continuous arrivals, timed (`bench_arrivals`, `looplab bench-arrivals`):
the serving of looplab/inference/arrivals.py measured as tokens/s against the FLOP
ratio of the policy's mean executed loops (looplab/costs/resources.py).

The same stream under each policy and schedule, full execution always among them
(the baseline), alternating runs after warm-ups, median times. Per run: tokens generated, wall seconds (prefills
included) and tokens/s, the decode seconds (the wall less the prefills) and decode
tokens/s, backbone steps, d̄ (mean loops of the decoded tokens), the FLOP ratio
(F0 + R·Fr)/(F0 + d̄·Fr) with F0 the LM head per token plus what the exit rule reads
(resources.prefill_flops, readout "all": decoding reads out every token) at the
stream's mean context, and the realised speedup: decode tokens/s over full's in the
same schedule and slots, and its share of the bound.

A schedule's own full is not what a researcher would serve instead: the best full
schedule at these slots is (lockstep full beat depth batching's full 4x on `debug`).
So each run is also read against it: `vs_best_full`, decode tokens/s over the fastest
full run at the same slots in the same invocation, and `realised`, that speedup's
share of the FLOP ratio (1.0: the FLOPs saved are all time saved; below 1/ratio:
slower than full). Full's own realised share is 1/1 at the best schedule and below
it elsewhere.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from looplab.costs.resources import flop_ratio, prefill_flops
from looplab.errors import check
from looplab.fields import is_int
from looplab.inference.arrivals import Request, RequestStream, Served, check_serving, make_requests, serve
from looplab.inference.depth_batching import SCHEDULES
from looplab.models.cache import HOLE, check_fill
from looplab.policy import FULL, GIVEN, ExitPolicy


@dataclass(frozen=True)
class ArrivalBench:
    """The benchmark's grid: slots × schedule × policy (full added as the baseline)."""

    stream: RequestStream = RequestStream()
    slots: tuple[int, ...] = (8, 32)
    policies: tuple[ExitPolicy, ...] = (ExitPolicy.skip(0.4),)
    schedules: tuple[str, ...] = SCHEDULES
    warmup: int = 1
    repeats: int = 3
    attention_fill: str = HOLE

    def __post_init__(self) -> None:
        check(isinstance(self.stream, RequestStream), "stream", self.stream, "a RequestStream")
        check(bool(self.slots) and all(is_int(s) and s >= 1 for s in self.slots), "slots", self.slots, "integers >= 1")
        check(
            bool(self.policies) and all(isinstance(p, ExitPolicy) and p.rule != GIVEN for p in self.policies),
            "policies",
            self.policies,
            "ExitPolicy values other than given exits (e.g. skip:0.4)",
        )
        check(
            bool(self.schedules) and all(s in SCHEDULES for s in self.schedules),
            "schedules",
            self.schedules,
            " | ".join(SCHEDULES),
        )
        check(is_int(self.warmup) and self.warmup >= 0, "warmup", self.warmup, "an integer >= 0")
        check(is_int(self.repeats) and self.repeats >= 1, "repeats", self.repeats, "an integer >= 1")
        check_fill(self.attention_fill)

    @property
    def runs(self) -> list[tuple[str, ExitPolicy]]:
        """(schedule, policy) pairs, full first in each schedule."""
        policies = list(dict.fromkeys([ExitPolicy.full(), *self.policies]))
        return [(schedule, policy) for schedule in dict.fromkeys(self.schedules) for policy in policies]


@dataclass
class ArrivalRecord:
    slots: int
    schedule: str
    policy: str
    requests: int
    generated_tokens: int
    decoded_tokens: int
    wall_s: float  # median over repeats, prefills included
    prefill_s: float  # median
    decode_s: float  # median of the wall less the prefills
    tokens_per_s: float  # generated tokens / wall_s
    decode_tokens_per_s: float  # decoded tokens / decode_s
    steps: int  # backbone steps of the decoding
    # Loops paid per decoded token: steps × slots / decoded tokens. d̄ when every row
    # always runs a token (depth); lockstep pays each step's deepest token, and a
    # stream's tail runs with idle rows.
    paid_loops: float
    mean_executed_loops: float  # d̄ of the decoded tokens
    flop_ratio: float  # (F0 + R·Fr)/(F0 + d̄·Fr)
    speedup: float  # decode tokens/s over full's (same slots and schedule)
    of_flop_ratio: float  # speedup / flop_ratio
    n_loops: int
    device: str
    # The spread over repeats (min, max): decode tokens/s of each repeat, and the speedup of
    # each repeat over full's same repeat (the runs alternate, so a repeat's pair shares
    # the machine's load).
    decode_tokens_per_s_min: float = math.nan
    decode_tokens_per_s_max: float = math.nan
    speedup_min: float = math.nan
    speedup_max: float = math.nan
    # Against the best full schedule at these slots (module docstring): decode tokens/s
    # over its decode tokens/s, and that over the FLOP ratio.
    vs_best_full: float = math.nan
    realised: float = math.nan
    kind: str = "arrivals"


def spread_gate(model, std: float, seed: int = 0):
    """Fresh weights' gate, spread: its weights drawn from N(0, std²) (seeded), its bias 0.
    A fresh gate's small weights and -2 bias exit no token (d̄ = R: skip has nothing to
    save); a spread one exits tokens at varied loops, as a trained gate does, so a
    fresh model can time what exits save. Returns the model."""
    check(math.isfinite(std) and std > 0, "gate_spread", std, "a finite number > 0")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        gate = model.exit_gate
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * std)
        gate.bias.zero_()
    return model


def _bound(model, stream: RequestStream, policy: ExitPolicy, executed_loops: float) -> float:
    f0, fr = prefill_flops(model.cfg, max(1, round(stream.mean_context)), policy, readout="all")
    return flop_ratio(f0, fr, model.cfg.n_loops, executed_loops)


def _timed_runs(
    model, requests: list[Request], slots: int, settings: ArrivalBench, progress: Callable[[str], None]
) -> tuple[dict, dict]:
    """Every (schedule, policy) run at `slots`, alternating (drifting load hits all
    alike): the last Served of each, and its timed (wall, prefill) pairs."""
    runs = settings.runs
    served: dict[tuple[str, ExitPolicy], Served] = {}
    times: dict[tuple[str, ExitPolicy], list[tuple[float, float]]] = {run: [] for run in runs}
    total = settings.warmup + settings.repeats
    for repeat in range(total):
        for schedule, policy in runs:
            s = serve(model, requests, policy, slots=slots, schedule=schedule, attention_fill=settings.attention_fill)
            served[schedule, policy] = s
            if repeat >= settings.warmup:
                times[schedule, policy].append((s.wall_s, s.prefill_s))
        kind = "warm-up" if repeat < settings.warmup else "repeat"
        progress(f"slots {slots}: {kind} {repeat + 1}/{total} done ({len(runs)} runs)")
    return served, times


def _record(
    model,
    settings: ArrivalBench,
    slots: int,
    schedule: str,
    policy: ExitPolicy,
    s: Served,
    timed: list[tuple[float, float]],
    full: tuple[Served, list[tuple[float, float]]] | None,
) -> ArrivalRecord:
    """One run's record from its timed repeats; full: full's run and repeats in the same
    slots and schedule (None for full itself)."""
    wall = statistics.median(w for w, _ in timed)
    prefill_s = statistics.median(p for _, p in timed)
    decode_s = statistics.median(w - p for w, p in timed)
    d_bar = s.mean_executed_loops
    decode_tps = s.decoded_tokens / decode_s
    each = [s.decoded_tokens / (w - p) for w, p in timed]
    if full is None:
        speedup, ratios = 1.0, [1.0]
    else:
        full_served, full_timed = full
        full_each = [full_served.decoded_tokens / (w - p) for w, p in full_timed]
        speedup = decode_tps / (full_served.decoded_tokens / statistics.median(w - p for w, p in full_timed))
        ratios = [mine / theirs for mine, theirs in zip(each, full_each)]
    bound = _bound(model, settings.stream, policy, d_bar)
    return ArrivalRecord(
        slots=slots,
        schedule=schedule,
        policy=policy.spec,
        requests=len(s.tokens),
        generated_tokens=s.generated_tokens,
        decoded_tokens=s.decoded_tokens,
        wall_s=wall,
        prefill_s=prefill_s,
        decode_s=decode_s,
        tokens_per_s=s.generated_tokens / wall,
        decode_tokens_per_s=decode_tps,
        steps=s.steps,
        paid_loops=s.steps * slots / max(s.decoded_tokens, 1),
        mean_executed_loops=d_bar,
        flop_ratio=bound,
        speedup=speedup,
        of_flop_ratio=speedup / bound,
        n_loops=model.cfg.n_loops,
        device=str(next(model.parameters()).device),
        decode_tokens_per_s_min=min(each),
        decode_tokens_per_s_max=max(each),
        speedup_min=min(ratios),
        speedup_max=max(ratios),
    )


def bench_arrivals(
    model,
    task,
    settings: ArrivalBench = ArrivalBench(),
    *,
    on_record: Callable[[ArrivalRecord], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[ArrivalRecord]:
    """The grid of `settings` on one stream (module docstring), in the model's device."""
    check(isinstance(settings, ArrivalBench), "settings", settings, "an ArrivalBench")
    model = model.eval()
    requests = make_requests(model, task, settings.stream)
    for schedule, policy in settings.runs:  # every bad argument before the first timed run
        check_serving(model, requests, policy, settings.slots[0], schedule, settings.attention_fill)
    records = []
    for slots in dict.fromkeys(settings.slots):
        served, times = _timed_runs(model, requests, slots, settings, progress or (lambda _: None))
        for schedule, policy in settings.runs:
            baseline = (schedule, ExitPolicy.full())  # full runs first in each schedule (ArrivalBench.runs)
            full = None if policy.execution == FULL else (served[baseline], times[baseline])
            record = _record(
                model, settings, slots, schedule, policy, served[schedule, policy], times[schedule, policy], full
            )
            records.append(record)
        at_slots = [r for r in records if r.slots == slots]
        for record in against_best_full(at_slots):
            if on_record:
                on_record(record)
    return records


def against_best_full(records: list[ArrivalRecord]) -> list[ArrivalRecord]:
    """The records of one slot count, each with `vs_best_full` and `realised` set from
    the fastest full run among them (decode tokens/s); unchanged without a full run."""
    fulls = [r.decode_tokens_per_s for r in records if r.policy == ExitPolicy.full().spec]
    if fulls:
        best = max(fulls)
        for r in records:
            r.vs_best_full = r.decode_tokens_per_s / best
            r.realised = r.vs_best_full / r.flop_ratio
    return records


HEADER = (
    "slots  schedule  policy          d̄     paid  steps   tok/s  decode tok/s  speedup [min, max]     "
    "FLOP ratio  of it  vs best full  realised  prefill s  wall s"
)


def format_record(r: ArrivalRecord) -> str:
    """One row of the table; `speedup` and `of it` read the run against its own
    schedule's full, `vs best full` and `realised` against the fastest full."""
    return (
        f"{r.slots:5d}  {r.schedule:8s}  {r.policy:14s}  {r.mean_executed_loops:4.2f}  {r.paid_loops:4.2f}  "
        f"{r.steps:5d}  {r.tokens_per_s:6.0f}  {r.decode_tokens_per_s:12.0f}  {r.speedup:6.2f}x "
        f"[{r.speedup_min:4.2f}, {r.speedup_max:4.2f}]  {r.flop_ratio:10.2f}  {r.of_flop_ratio:6.1%}  "
        f"{r.vs_best_full:11.2f}x  {r.realised:8.1%}  {r.prefill_s:9.3f}  {r.wall_s:6.3f}"
    )


def records_as_dicts(records: list[ArrivalRecord]) -> list[dict]:
    return [asdict(r) for r in records]
