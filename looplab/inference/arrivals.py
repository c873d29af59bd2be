"""Decoding under continuous arrivals: a stream of requests of different lengths
served by a fixed number of cache rows ("slots"), each finished request's row taken
at once by the next waiting one, so rows at different points of different requests
decode together (issue 27, item 6a).

    requests = make_requests(model, task, RequestStream(requests=64, prompt_len=(16, 128),
                                                         new_tokens=(8, 64), seed=0))
    served = serve(model, requests, ExitPolicy.parse("skip:0.4"), slots=8, schedule="depth")
    served.tokens[i]                   # request i's greedy continuation, as generate gives it alone

The stream: per request a prompt length and a number of new tokens, drawn uniformly
from their (inclusive) ranges by a seeded generator; the prompts are consecutive cuts
of the task's held-out text (tasks/base.heldout_ids; random ids without a task). Requests
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
              their loops together, the batch paying its deepest token's loops
              (compiled, where a batch's loop is cheap, every loop up to the
              policy's last in one call: generate._fused_token_step).
Both compute every token as generate does alone, so each request's tokens are the
ones generate gives it alone under the same policy (tests/test_arrivals.py).

The benchmark that times this against the FLOP ratio: looplab/costs/arrival_bench.py.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from looplab.config import ConfigError
from looplab.errors import check, invalid
from looplab.fields import is_int
from looplab.inference.depth_batching import DEPTH, DepthBatch, check_schedule
from looplab.models.cache import HOLE, InferenceCache, check_fill
from looplab.policy import GIVEN, ExitPolicy
from looplab.tasks.base import heldout_ids

# ---- the request stream -----------------------------------------------------------------


def _check_range(name: str, value) -> tuple[int, int]:
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(is_int(v) for v in value)
        and 1 <= value[0] <= value[1]
    )
    check(ok, name, value, "(low, high) integers with 1 <= low <= high")
    return int(value[0]), int(value[1])


def parse_range(name: str, text: str) -> tuple[int, int]:
    """'16-128' (inclusive) or '32' (every request the same) as (low, high)."""
    low, dash, high = str(text).partition("-")
    try:
        value = (int(low), int(high) if dash else int(low))
    except ValueError:
        value = None
    if value is None or not 1 <= value[0] <= value[1]:
        raise invalid(name, text, "LOW-HIGH or N, integers with 1 <= LOW <= HIGH")
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
        check(is_int(self.requests) and self.requests >= 1, "requests", self.requests, "an integer >= 1")
        object.__setattr__(self, "prompt_len", _check_range("prompt_len", self.prompt_len))
        object.__setattr__(self, "new_tokens", _check_range("new_tokens", self.new_tokens))
        check(is_int(self.seed) and self.seed >= 0, "seed", self.seed, "an integer >= 0")

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
    rng = np.random.default_rng([stream.seed, 27])
    lengths = rng.integers(stream.prompt_len[0], stream.prompt_len[1] + 1, size=stream.requests).tolist()
    new = rng.integers(stream.new_tokens[0], stream.new_tokens[1] + 1, size=stream.requests).tolist()
    text = heldout_ids(model, task, 1, sum(lengths), stream.seed)[0]
    ends = np.cumsum(lengths).tolist()
    return [Request(i, text[end - n : end].clone(), k) for i, (n, k, end) in enumerate(zip(lengths, new, ends))]


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


def check_serving(
    model, requests: list[Request], policy: ExitPolicy, slots: int, schedule: str, attention_fill: str
) -> None:
    if not isinstance(policy, ExitPolicy):
        raise ConfigError(f"policy={policy!r} is invalid; allowed: an ExitPolicy (e.g. ExitPolicy.parse('skip:0.4'))")
    # Given exits are steps by (row, position) of a fixed batch; a stream has no such batch.
    check(
        policy.rule != GIVEN,
        "policy",
        policy.spec,
        "full | forced:D | dense:Q | skip:Q | a zoo rule (skip-entropy:T, ...); given exits need a fixed batch",
    )
    policy.check(model.cfg.n_loops)
    check(is_int(slots) and slots >= 1, "slots", slots, "an integer >= 1")
    check_schedule(schedule)
    check_fill(attention_fill)
    check(
        bool(requests)
        and all(isinstance(r, Request) and r.new_tokens >= 1 and r.prompt.numel() >= 1 for r in requests),
        "requests",
        f"{len(requests)} items",
        "Requests with a non-empty prompt and new_tokens >= 1 (make_requests)",
    )


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
            pre = prefill(
                self.model, request.prompt[None].to(self.device), self.policy, attention_fill=self.attention_fill
            )
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
        assert request is not None  # admit() gave the row its request
        self.tokens[request.index].append(token)
        self.loops[request.index].append(loops)
        return len(self.tokens[request.index]) < request.new_tokens

    def admit_all(self) -> list[tuple[int, int]]:
        """Every row takes a request: (row, first token) for the rows that got one."""
        return [(row, token) for row in range(len(self.serving)) if (token := self.admit(row)) is not None]

    def accept(self, rows: list[int], logits: torch.Tensor | None, loops: list[int]) -> list[tuple[int, int]]:
        """The decoded rows' next tokens (greedy): (row, token to feed next) for every
        row that goes on, with its own request or the next one."""
        assert logits is not None  # the readout is on: every decoded row has its logits
        going = []
        for row, token, ran in zip(rows, logits.argmax(-1).tolist(), loops):
            nxt = token if self._record(row, token, ran) else self.admit(row)
            if nxt is not None:
                going.append((row, nxt))
        return going

    def accept_steps(self, tokens: np.ndarray, loops: np.ndarray) -> np.ndarray:
        """Several steps' finished tokens, (steps, rows) (DepthBatch.advance_greedy: -1
        and 0 where none finished), recorded step by step; the rows whose request
        ended (their later tokens discarded)."""
        ended: list[int] = []
        for step_tokens, step_loops in zip(tokens.tolist(), loops.tolist()):
            for row, (token, ran) in enumerate(zip(step_tokens, step_loops)):
                if ran and row not in ended and not self._record(row, token, ran):
                    ended.append(row)
        return np.array(ended, dtype=np.int64)


def _serve_depth(server: _Server, steps_per_call: int) -> int:
    """Depth batching: returns the backbone steps. Where DepthBatch.fused says so,
    steps_per_call steps run as one call (DepthBatch.advance_greedy), each finished
    token read out and its next one started on the device; a request that ends within a
    call has its row's later steps discarded (at most steps_per_call − 1 of them), and
    rows with no request left run discarded steps. Otherwise (near the stream's end, on
    a large model) a step a call (DepthBatch.advance)."""
    batch = DepthBatch(server.model, server.cache, server.policy)
    server.load = batch.load_row  # the batch keeps each row's length on the host
    going = server.admit_all()
    while going or batch.running:
        if going:
            batch.start(
                np.array([row for row, _ in going]), torch.tensor([token for _, token in going], device=server.device)
            )
        if batch.fused:
            ended = server.accept_steps(*batch.advance_greedy(steps_per_call))
            batch.retire(ended)
            going = [(row, token) for row in ended.tolist() if (token := server.admit(row)) is not None]
            continue
        done = batch.advance()
        rows = done.rows.tolist()
        going = server.accept(rows, done.logits, done.loops.tolist()) if rows else []
        batch.retire(sorted(set(rows) - {row for row, _ in going}))  # no request left for them
    return batch.steps


def _serve_lockstep(server: _Server) -> int:
    """decode_step over the running rows: returns the backbone steps (per call, the
    loops of its deepest token, or every loop a fused call ran: Decoded.batch_loops)."""
    from looplab.inference.generate import decode_step

    steps, slots = 0, server.cache.batch
    going = server.admit_all()
    while going:
        going.sort()  # rows in order: every row at once needs no row list
        rows = [row for row, _ in going]
        tokens = torch.tensor([token for _, token in going], device=server.device)
        out = decode_step(
            server.model,
            server.cache,
            tokens,
            server.policy,
            rows=None if len(rows) == slots else torch.tensor(rows, device=server.device),
        )
        loops = out.loops.tolist()
        steps += out.batch_loops()
        going = server.accept(rows, out.logits, loops)
    return steps


# Depth batching's steps per call where they fuse (DepthBatch.advance_greedy):
# a call costs about what one step did before it (the host's part is per call), and a
# request ending within one wastes at most this many steps less one of its row's.
STEPS_PER_CALL = 4


@torch.no_grad()
def serve(
    model,
    requests: list[Request],
    policy: ExitPolicy,
    *,
    slots: int,
    schedule: str = DEPTH,
    attention_fill: str = HOLE,
    steps_per_call: int = STEPS_PER_CALL,
) -> Served:
    """Serve the requests in order with `slots` cache rows (module docstring), greedy."""
    check_serving(model, requests, policy, slots, schedule, attention_fill)
    check(is_int(steps_per_call) and steps_per_call >= 1, "steps_per_call", steps_per_call, "an integer >= 1")
    server = _Server(model, requests, policy, slots, attention_fill)
    _synchronize(server.device)
    start = time.perf_counter()
    steps = _serve_depth(server, steps_per_call) if schedule == DEPTH else _serve_lockstep(server)
    _synchronize(server.device)
    return Served(server.tokens, server.loops, steps, time.perf_counter() - start, server.prefill_s)
