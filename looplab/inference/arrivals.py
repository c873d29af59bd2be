"""Decoding under continuous arrivals: a stream of requests of different lengths
served by a fixed number of cache rows ("slots"), each finished request's row taken
at once by the next waiting one, so rows at different points of different requests
decode together (issue 27, item 6a). Measured as tokens/s against the FLOP ratio of
the policy's mean executed loops (looplab/costs/resources.py).

    requests = make_requests(model, task, RequestStream(requests=64, prompt_len=(16, 128),
                                                         new_tokens=(8, 64), seed=0))
    served = serve(model, requests, ExitPolicy.parse("skip:0.4"), slots=8, schedule="depth")
    served.tokens[i]                   # request i's greedy continuation, as generate gives it alone

The stream: per request a prompt length and a number of new tokens, drawn uniformly
from their (inclusive) ranges by a seeded generator; the prompts are consecutive cuts
of the task's held-out text (bench.heldout_ids; random ids without a task). Requests
are served in stream order; every request is waiting at the start (a saturated
server: the figure is throughput, not latency).

Serving: a row whose request is done takes the next waiting request: its prompt is
prefilled alone (generate.prefill, batch 1, under the policy) and the prefilled
states are written into that row of the running cache (InferenceCache.write_row),
so the row's next token continues the new request. The first new token comes from
the prefill's logits, each later one from decoding the one before (greedy: argmax),
until the request has its new tokens (no <eos>: a request's length is its draw).
Two schedules:
    depth     depth batching (looplab/inference/depth_batching.py): one backbone step advances
              every running token by one loop; a finished token's row starts its next
              token (or the next request's) in the next step.
    lockstep  generate.decode_step over the running rows: each step's tokens run
              their loops together, the batch paying its deepest token's loops.
Both compute every token as generate does alone, so each request's tokens are the
ones generate gives it alone under the same policy (tests/test_arrivals.py).

The benchmark (`bench_arrivals`, `looplab bench-arrivals`): the same stream under each
policy and schedule, full execution always among them (the baseline), alternating
runs after warm-ups, median times. Per run: tokens generated, wall seconds (prefills
included) and tokens/s, the decode seconds (the wall less the prefills) and decode
tokens/s, backbone steps, d̄ (mean loops of the decoded tokens), the FLOP ratio
(F0 + R·Fr)/(F0 + d̄·Fr) with F0 the LM head per token plus what the exit rule reads
(resources.prefill_flops, readout "all": decoding reads out every token) at the
stream's mean context, and the realised speedup: decode tokens/s over full's in the
same schedule and slots, and its share of the bound.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from looplab.config import ConfigError
from looplab.inference.depth_batching import DEPTH, SCHEDULES, DepthBatch, check_schedule
from looplab.errors import check
from looplab.fields import is_int
from looplab.models.cache import HOLE, InferenceCache, check_fill
from looplab.policy import FULL, GIVEN, ExitPolicy


# ---- the request stream -----------------------------------------------------------------

def _check_range(name: str, value) -> tuple[int, int]:
    ok = (isinstance(value, (tuple, list)) and len(value) == 2
          and all(is_int(v) for v in value) and 1 <= value[0] <= value[1])
    check(ok, name, value, "(low, high) integers with 1 <= low <= high")
    return int(value[0]), int(value[1])


def parse_range(name: str, text: str) -> tuple[int, int]:
    """'16-128' (inclusive) or '32' (every request the same) as (low, high)."""
    low, dash, high = str(text).partition("-")
    try:
        value = (int(low), int(high) if dash else int(low))
    except ValueError:
        value = None
    check(value is not None and 1 <= value[0] <= value[1], name, text, "LOW-HIGH or N, integers with 1 <= LOW <= HIGH")
    return value


@dataclass(frozen=True)
class RequestStream:
    """What the stream draws: `requests` requests, each with a prompt length and a
    number of new tokens uniform on their inclusive ranges, from `seed`."""

    requests: int = 64
    prompt_len: tuple[int, int] = (16, 128)
    new_tokens: tuple[int, int] = (8, 64)
    seed: int = 0

    def __post_init__(self) -> None:
        check(is_int(self.requests) and self.requests >= 1,
              "requests", self.requests, "an integer >= 1")
        object.__setattr__(self, "prompt_len", _check_range("prompt_len", self.prompt_len))
        object.__setattr__(self, "new_tokens", _check_range("new_tokens", self.new_tokens))
        check(is_int(self.seed) and self.seed >= 0,
              "seed", self.seed, "an integer >= 0")

    @property
    def mean_context(self) -> float:
        """The mean context a decoded token sees: a mean prompt plus half the mean new tokens."""
        return sum(self.prompt_len) / 2 + sum(self.new_tokens) / 4


@dataclass(frozen=True)
class Request:
    index: int  # its place in the stream (the serving order)
    prompt: torch.Tensor  # (L,) token ids
    new_tokens: int


def make_requests(model, task, stream: RequestStream) -> list[Request]:
    """The stream's requests (module docstring): the same for the same seed."""
    from looplab.costs.timing import heldout_ids

    rng = np.random.default_rng([stream.seed, 27])
    lengths = rng.integers(stream.prompt_len[0], stream.prompt_len[1] + 1, size=stream.requests).tolist()
    new = rng.integers(stream.new_tokens[0], stream.new_tokens[1] + 1, size=stream.requests).tolist()
    text = heldout_ids(model, task, 1, sum(lengths), stream.seed)[0]
    ends = np.cumsum(lengths).tolist()
    return [Request(i, text[end - n:end].clone(), k) for i, (n, k, end) in enumerate(zip(lengths, new, ends))]


# ---- serving ------------------------------------------------------------------------------

@dataclass
class Served:
    """One run over a stream: per request (stream order) its new tokens and, for each,
    the loops run by the position that predicted it (as generate.Generation.loops: the
    first by the prompt's last token in the prefill, the others decoded)."""

    tokens: list[list[int]]
    loops: list[list[int]]
    steps: int  # backbone steps of the decoding
    wall_s: float  # the whole run, prefills included
    prefill_s: float  # the prefills alone

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def decoded_tokens(self) -> int:
        """Tokens that ran through decoding: every new token but each request's last."""
        return sum(max(len(t) - 1, 0) for t in self.tokens)

    @property
    def mean_executed_loops(self) -> float:
        """d̄: the mean loops of the decoded tokens (nan when nothing was decoded)."""
        loops = sum(sum(x[1:]) for x in self.loops)
        return loops / self.decoded_tokens if self.decoded_tokens else float("nan")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_serving(model, requests: list[Request], policy: ExitPolicy, slots: int, schedule: str,
                   attention_fill: str) -> None:
    if not isinstance(policy, ExitPolicy):
        raise ConfigError(f"policy={policy!r} is invalid; allowed: an ExitPolicy (e.g. ExitPolicy.parse('skip:0.4'))")
    # Given exits are steps by (row, position) of a fixed batch; a stream has no such batch.
    check(policy.rule != GIVEN, "policy", policy.spec, "full | forced:D | dense:Q | skip:Q | a zoo rule "
          "(skip-entropy:T, ...); given exits need a fixed batch")
    policy.check(model.cfg.n_loops)
    check(is_int(slots) and slots >= 1, "slots", slots, "an integer >= 1")
    check_schedule(schedule)
    check_fill(attention_fill)
    check(bool(requests) and all(isinstance(r, Request) and r.new_tokens >= 1 and r.prompt.numel() >= 1
                                 for r in requests), "requests", f"{len(requests)} items",
          "Requests with a non-empty prompt and new_tokens >= 1 (make_requests)")


class _Server:
    """Which request each cache row serves, and what every request has generated.
    `load` writes a prefilled one-row cache into a row (the depth schedule routes it
    through its DepthBatch, which keeps the rows' lengths)."""

    def __init__(self, model, requests: list[Request], policy: ExitPolicy, slots: int, attention_fill: str):
        self.model, self.policy, self.attention_fill = model, policy, attention_fill
        self.device = next(model.parameters()).device
        capacity = max(r.prompt.numel() + r.new_tokens for r in requests)  # attention never regrows
        self.cache = InferenceCache(model, slots, capacity, attention_fill=attention_fill)
        self.load: Callable[[int, InferenceCache], None] = self.cache.write_row
        self.waiting = deque(requests)
        self.serving: list[Request | None] = [None] * slots
        self.tokens: list[list[int]] = [[] for _ in requests]
        self.loops: list[list[int]] = [[] for _ in requests]
        self.prefill_s = 0.0

    def admit(self, row: int) -> int | None:
        """The next waiting request takes the idle row: its prompt prefilled alone and
        written into the row. Returns its first new token, to be fed next; None when
        no request is left (the row stays idle). A request wanting one token is done
        by its prefill, and the next one is taken."""
        from looplab.inference.generate import prefill

        while self.waiting:
            request = self.waiting.popleft()
            _synchronize(self.device)
            start = time.perf_counter()
            pre = prefill(self.model, request.prompt[None].to(self.device), self.policy,
                          attention_fill=self.attention_fill)
            self.load(row, pre.cache)
            token = int(pre.logits[0].argmax())  # a host read: the prefill and the copy are over
            self.prefill_s += time.perf_counter() - start  # admission: the prefill and its copy into the row
            self.serving[row] = request
            if self._record(row, token, int(pre.loops[0])):
                return token
        self.serving[row] = None
        return None

    def _record(self, row: int, token: int, loops: int) -> bool:
        """Row's request gets its next token; True while it wants more."""
        request = self.serving[row]
        self.tokens[request.index].append(token)
        self.loops[request.index].append(loops)
        return len(self.tokens[request.index]) < request.new_tokens

    def admit_all(self) -> list[tuple[int, int]]:
        """Every row takes a request: (row, first token) for the rows that got one."""
        return [(row, token) for row in range(len(self.serving)) if (token := self.admit(row)) is not None]

    def accept(self, rows: list[int], logits: torch.Tensor, loops: list[int]) -> list[tuple[int, int]]:
        """The decoded rows' next tokens (greedy): (row, token to feed next) for every
        row that goes on, with its own request or the next one."""
        going = []
        for row, token, ran in zip(rows, logits.argmax(-1).tolist(), loops):
            nxt = token if self._record(row, token, ran) else self.admit(row)
            if nxt is not None:
                going.append((row, nxt))
        return going


def _serve_depth(server: _Server) -> int:
    """Depth batching: returns the backbone steps."""
    batch = DepthBatch(server.model, server.cache, server.policy)
    server.load = batch.load_row  # the batch keeps each row's length on the host
    going = server.admit_all()
    while going or batch.running:
        if going:
            batch.start(np.array([row for row, _ in going]),
                        torch.tensor([token for _, token in going], device=server.device))
        done = batch.advance()
        going = server.accept(done.rows.tolist(), done.logits, done.loops.tolist()) if done.rows.numel() else []
    return batch.steps


def _serve_lockstep(server: _Server) -> int:
    """decode_step over the running rows: returns the backbone steps (per call, the
    loops of its deepest token)."""
    from looplab.inference.generate import decode_step

    steps, slots = 0, server.cache.batch
    going = server.admit_all()
    while going:
        going.sort()  # rows in order: every row at once needs no row list
        rows = [row for row, _ in going]
        tokens = torch.tensor([token for _, token in going], device=server.device)
        out = decode_step(server.model, server.cache, tokens, server.policy,
                          rows=None if len(rows) == slots else torch.tensor(rows, device=server.device))
        loops = out.loops.tolist()
        steps += max(loops)
        going = server.accept(rows, out.logits, loops)
    return steps


@torch.no_grad()
def serve(model, requests: list[Request], policy: ExitPolicy, *, slots: int, schedule: str = DEPTH,
          attention_fill: str = HOLE) -> Served:
    """Serve the requests in order with `slots` cache rows (module docstring), greedy."""
    _check_serving(model, requests, policy, slots, schedule, attention_fill)
    server = _Server(model, requests, policy, slots, attention_fill)
    _synchronize(server.device)
    start = time.perf_counter()
    steps = _serve_depth(server) if schedule == DEPTH else _serve_lockstep(server)
    _synchronize(server.device)
    return Served(server.tokens, server.loops, steps, time.perf_counter() - start, server.prefill_s)


# ---- the benchmark ----------------------------------------------------------------------

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
        check(bool(self.slots) and all(is_int(s) and s >= 1 for s in self.slots),
              "slots", self.slots, "integers >= 1")
        check(bool(self.policies) and all(isinstance(p, ExitPolicy) and p.rule != GIVEN for p in self.policies),
              "policies", self.policies, "ExitPolicy values other than given exits (e.g. skip:0.4)")
        check(bool(self.schedules) and all(s in SCHEDULES for s in self.schedules), "schedules", self.schedules,
              " | ".join(SCHEDULES))
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
    kind: str = "arrivals"


def _bound(model, stream: RequestStream, policy: ExitPolicy, executed_loops: float) -> float:
    from looplab.costs.resources import flop_ratio, prefill_flops

    f0, fr = prefill_flops(model.cfg, max(1, round(stream.mean_context)), policy, readout="all")
    return flop_ratio(f0, fr, model.cfg.n_loops, executed_loops)


def _timed_runs(model, requests: list[Request], slots: int, settings: ArrivalBench,
                progress: Callable[[str], None]) -> tuple[dict, dict]:
    """Every (schedule, policy) run at `slots`, alternating (drifting load hits all
    alike): the last Served of each, and its timed (wall, prefill) pairs."""
    runs = settings.runs
    served, times = {}, {run: [] for run in runs}
    total = settings.warmup + settings.repeats
    for repeat in range(total):
        for schedule, policy in runs:
            s = serve(model, requests, policy, slots=slots, schedule=schedule,
                      attention_fill=settings.attention_fill)
            served[schedule, policy] = s
            if repeat >= settings.warmup:
                times[schedule, policy].append((s.wall_s, s.prefill_s))
        kind = "warm-up" if repeat < settings.warmup else "repeat"
        progress(f"slots {slots}: {kind} {repeat + 1}/{total} done ({len(runs)} runs)")
    return served, times


def _record(model, settings: ArrivalBench, slots: int, schedule: str, policy: ExitPolicy, s: Served,
            timed: list[tuple[float, float]], full: tuple[Served, list[tuple[float, float]]] | None
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
        slots=slots, schedule=schedule, policy=policy.spec, requests=len(s.tokens),
        generated_tokens=s.generated_tokens, decoded_tokens=s.decoded_tokens, wall_s=wall, prefill_s=prefill_s,
        decode_s=decode_s, tokens_per_s=s.generated_tokens / wall, decode_tokens_per_s=decode_tps, steps=s.steps,
        paid_loops=s.steps * slots / max(s.decoded_tokens, 1), mean_executed_loops=d_bar, flop_ratio=bound,
        speedup=speedup, of_flop_ratio=speedup / bound, n_loops=model.cfg.n_loops,
        device=str(next(model.parameters()).device), decode_tokens_per_s_min=min(each),
        decode_tokens_per_s_max=max(each), speedup_min=min(ratios), speedup_max=max(ratios))


def bench_arrivals(model, task, settings: ArrivalBench = ArrivalBench(), *,
                   on_record: Callable[[ArrivalRecord], None] | None = None,
                   progress: Callable[[str], None] | None = None) -> list[ArrivalRecord]:
    """The grid of `settings` on one stream (module docstring), in the model's device."""
    check(isinstance(settings, ArrivalBench), "settings", settings, "an ArrivalBench")
    model = model.eval()
    requests = make_requests(model, task, settings.stream)
    for schedule, policy in settings.runs:  # every bad argument before the first timed run
        _check_serving(model, requests, policy, settings.slots[0], schedule, settings.attention_fill)
    records = []
    for slots in dict.fromkeys(settings.slots):
        served, times = _timed_runs(model, requests, slots, settings, progress or (lambda _: None))
        for schedule, policy in settings.runs:
            baseline = (schedule, ExitPolicy.full())  # full runs first in each schedule (ArrivalBench.runs)
            full = None if policy.execution == FULL else (served[baseline], times[baseline])
            record = _record(model, settings, slots, schedule, policy, served[schedule, policy],
                             times[schedule, policy], full)
            records.append(record)
            if on_record:
                on_record(record)
    return records


HEADER = ("slots  schedule  policy          d̄     paid  steps   tok/s  decode tok/s  speedup [min, max]     "
          "FLOP ratio  of it  prefill s  wall s")


def format_record(r: ArrivalRecord) -> str:
    return (f"{r.slots:5d}  {r.schedule:8s}  {r.policy:14s}  {r.mean_executed_loops:4.2f}  {r.paid_loops:4.2f}  "
            f"{r.steps:5d}  {r.tokens_per_s:6.0f}  {r.decode_tokens_per_s:12.0f}  {r.speedup:6.2f}x "
            f"[{r.speedup_min:4.2f}, {r.speedup_max:4.2f}]  {r.flop_ratio:10.2f}  {r.of_flop_ratio:6.1%}  "
            f"{r.prefill_s:9.3f}  {r.wall_s:6.3f}")


def records_as_dicts(records: list[ArrivalRecord]) -> list[dict]:
    return [asdict(r) for r in records]
