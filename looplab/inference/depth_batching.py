"""Depth batching: decoding where one backbone step advances every running row by one
loop, rows at different loops together.

Lockstep decoding (generate.decode_step) runs loop r for the rows whose token is still
running, then loop r + 1: a batch pays, per new token, the deepest exit among its rows,
and at a small batch a loop costs about as much for one row as for all of them (the
weights are read once, the per-operation overhead is fixed). The backbone is shared
by every loop, so one step can run row a's token at loop 1 and row b's at loop 3: each
row reads and writes its own loop's states, cache slot (loop − 1)·batch + row
(models/cache.py). A row whose token is done (its exit under skip, its last loop
otherwise) is read out and starts its next token at loop 1 in the next step, so the
steps follow each row's own loops (their mean), not the batch's deepest exit.

Every token computes what decode_step computes: the same states, the same exit rule on
its own per-token state, the same readout; only which rows share a step changes (so
its logits equal the full forward's, tests/test_depth_batching.py). Under full,
forced and dense execution the rows stay in step, as in lockstep.

    batch = DepthBatch(model, cache, policy)      # a prefilled cache (generate.prefill)
    batch.start(rows, tokens)                     # those rows begin a new token
    while batch.running:
        done = batch.advance()                    # one backbone step
        ...                                       # done.rows' logits: sample, start again
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from looplab.config import ConfigError
from looplab.models.cache import HOLE, InferenceCache, Layout, StepCache
from looplab.policy import DENSE, EXIT_RULES, GATE_LOGITS, GIVEN, ExitPolicy, exit_rule

LOCKSTEP, DEPTH = "lockstep", "depth"  # generation's schedules (looplab/inference/generate.py)
SCHEDULES = (LOCKSTEP, DEPTH)
IDLE = -1  # a row's depth (loop − 1) when it runs no token
# Discarded loops a fused call may run for idle rows before a step a call is cheaper:
# about what one host round trip of a step costs on a CPU core (~0.25 ms at ~20 GFLOP/s).
SPARE_FLOPS = 5e6
# Reading out every row of a fused step: between `debug`'s 8 rows (0.27 MFLOP of head,
# where the gather's own operations cost more) and `local`'s (66 MFLOP, most of it for
# rows whose token goes on). gathered_readout.
GATHER_FLOPS = 2e6


def check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule={schedule!r} is invalid; allowed: {' | '.join(SCHEDULES)}")


@dataclass
class Done:
    """The tokens a step finished: their cache rows (m,), exit steps, loops run and,
    with the readout, next-token logits (m, V)."""

    rows: torch.Tensor
    exit_step: torch.Tensor
    loops: torch.Tensor
    logits: torch.Tensor | None


def _take(state, idx: torch.Tensor):
    """Rows idx of a rule state (a tensor or a tuple of them; None stays None)."""
    if state is None:
        return None
    return tuple(t[idx] for t in state) if isinstance(state, tuple) else state[idx]


def _put(store, rows: torch.Tensor, state, batch: int):
    """Write a rule state of rows (m,) into the per-row store (allocated on first use;
    a stateless rule's None stays None)."""
    if state is None:
        return store
    parts = state if isinstance(state, tuple) else (state,)
    if store is None:
        store = tuple(t.new_zeros((batch, *t.shape[1:])) for t in parts)
        store = store if isinstance(state, tuple) else store[0]
    for full, part in zip(store if isinstance(store, tuple) else (store,), parts):
        full.index_copy_(0, rows, part)
    return store


def gate_loop(model, rule, h: torch.Tensor, positions: torch.Tensor | None, cache, *state):
    """One loop for every row of a depth batch, each at its own slot of `cache` (a
    StepCache of the storage), and the gate's decision after it: (h (B, d), exit now (B,)
    bool, *the rule's next state). Every row decides, those at their last loop too: their
    decision is not read, and their next token's start() resets their state. So every
    step of a full batch has one shape, and compiled it is one graph
    (CompiledDecodeStep.gate_loop)."""
    h = model.backbone(h[:, None], positions, None, cache)[:, 0]
    statistic, state = rule.statistic(model.exit_logit(h), state)
    return (h, rule.decide(statistic), *state)


def depth_steps(
    model, rule, last: int, n_steps: int, gather: bool, storage: list, h: torch.Tensor, depth: torch.Tensor, *state
):
    """n_steps steps of a depth batch in which every row runs, greedy, as one function
    (so compiled it is one call: CompiledDecodeStep.storage_steps). Per step: one loop for
    each row at its slot of `storage` (InferenceCache.storage), the gate's decision
    (rule None: fixed exits alone), and for the rows whose token is done (the gate's exit,
    or depth `last`: the last loop the policy runs) their readout, greedy next token and
    that token's embedding, started at loop 1 with a fresh rule state. No host round
    trip between steps: the bookkeeping is tensor arithmetic on the device.

    gather: the head runs on the finished rows alone (a data-dependent gather), else on
    every row, the unfinished rows' logits unused. At a large vocabulary the head
    outweighs a loop (`local`: 32,000 × 128 against a d-128 loop's ~0.4 MFLOP), and
    reading out every row every step would cost d̄ heads a token instead of one; at a
    small one the gather's own operations cost more than the head they save (`debug`,
    8 rows, ahead of time: 46 µs a step gathered, 40 µs reading out every row):
    gathered_readout chooses.

    Returns (h, depth, tokens (n_steps, B): each step's greedy tokens, -1 where a row's
    token went on, loops (n_steps, B): the loops its finished token ran, else 0, *the
    rule's state)."""
    batch = h.shape[0]
    rows = torch.arange(batch, device=h.device)
    tokens, loops = [], []
    for _ in range(n_steps):
        h = model.backbone(h[:, None], None, None, StepCache(storage, Layout.one_token(rows + depth * batch)))[:, 0]
        done = depth == last
        if rule is not None:
            statistic, state = rule.statistic(model.exit_logit(h), state)
            done = done | rule.decide(statistic)
            fresh = rule.initial_state(batch, h.device)
            state = tuple(torch.where(done, f, s) for f, s in zip(fresh, state))
        if gather:
            at = done.nonzero()[:, 0]
            token = model.logits(h[at]).argmax(-1)
            h = h.index_copy(0, at, model.embed(token))
            tokens.append(torch.full_like(depth, -1).index_copy(0, at, token))
        else:
            token = model.logits(h).argmax(-1)
            h = torch.where(done[:, None], model.embed(token), h)
            tokens.append(torch.where(done, token, -1))
        loops.append(torch.where(done, depth + 1, 0))
        depth = torch.where(done, 0, depth + 1)
    return (h, depth, torch.stack(tokens), torch.stack(loops), *state)


def gathered_readout(model, rows: int) -> bool:
    """Whether depth_steps reads out the finished rows alone (gather), at `rows` rows:
    where reading out every row would cost more than GATHER_FLOPS (depth_steps'
    docstring)."""
    return model.flops_per_token(1)["head"] * rows > GATHER_FLOPS


class DepthBatch:
    """The running tokens of a prefilled cache's rows (module docstring). readout=False
    skips the final norm and head (benchmarks time the loops alone; Done.logits is
    None then).

    Per row it keeps the running token's state h and its rule's state on the model's
    device, and on the host its depth (loop − 1; IDLE: no token), position and exit
    step so far: a scheduler's bookkeeping, a few array operations per step, where
    tensor operations would cost about as much as a small model's loop (and on a GPU
    a synchronisation each). The device sees a step's slots and positions; the host
    reads back its exit decisions once per step (none for given or fixed exits)."""

    def __init__(self, model, cache: InferenceCache, policy: ExitPolicy, *, readout: bool = True):
        if not isinstance(policy, ExitPolicy):
            raise ConfigError(
                f"policy={policy!r} is invalid; allowed: an ExitPolicy (e.g. ExitPolicy.parse('skip:0.4'))"
            )
        policy.check(model.cfg.n_loops)
        self.model, self.cache, self.policy, self.readout = model, cache, policy, readout
        self.R, B = model.cfg.n_loops, cache.batch
        self.device = cache.length.device
        self.rule = exit_rule(policy) if policy.rule in EXIT_RULES else None
        self.rule_state: Any = None  # per-row state of the rule, (B, ...) on the device (a tensor or a tuple)
        # A rule with an initial state updates every live row in one call (a token's
        # first step reads the state its start() wrote); without one, first steps and
        # later ones take a call each.
        self.one_call = self.rule is not None and self.rule.initial_state(0, self.device) is not NotImplemented
        self.given = policy.exit_at.cpu().numpy() if policy.rule == GIVEN else None
        self.skip = policy.execution != DENSE
        # The gate's skip policy: a step of a full batch is one call of gate_loop (loop and decision).
        self.gate_steps = self.skip and self.one_call and self.rule is not None and self.rule.reads == GATE_LOGITS
        self.fill = self.skip and cache.attention_fill != HOLE
        self.depth = np.full(B, IDLE, dtype=np.int64)  # loop − 1 of each row's running token
        self.position = np.zeros(B, dtype=np.int64)
        self.retired = np.zeros(B, dtype=bool)  # rows whose states are spent until load_row (retire)
        self._loop_flops = model.step_flops(1)  # one row's loop (a recurrent step's cost does not grow)
        compiled = model.compiled_decode
        # A CUDA graph replays fixed shapes: there the readout runs on every row.
        self._gather = gathered_readout(model, B) and not (compiled is not None and compiled.cuda_graphs)
        self.exit_step = np.full(B, self.R, dtype=np.int64)
        # Exit steps known when a token starts (given, or fixed by full / forced), as depths.
        self.exit_depth = np.full(B, (policy.loops_run(self.R) or self.R) - 1, dtype=np.int64)
        self.h: torch.Tensor | None = None  # (B, d) each running token's state (from the first start)
        self.readout_h: torch.Tensor | None = None  # dense: the state at each token's exit step
        self.steps = 0  # backbone steps run
        self.n_running = 0  # rows with a running token
        self._on_host = self.device.type == "cpu"
        # Each row's tokens so far: on the host, cache.length's own memory (one update
        # serves both); on a device, a copy kept in step with index_add_.
        self.length = cache.length.numpy() if self._on_host else cache.length.cpu().numpy().copy()
        self._ones = None if self._on_host else torch.ones(B, dtype=cache.length.dtype, device=self.device)
        self._attention = cache.has_keys  # attention layers: room to reserve, positions to pass (RoPE)
        # Greedy steps in one call (depth_steps, advance_greedy): a skip or fixed-depth
        # policy (dense keeps each token's readout state beside it; given exits are per
        # position) whose rule is the gate's or none, on recurrent states (attention's
        # buffers grow and its exited tokens fill deeper loops: a step of its own).
        self.fusable = (
            readout
            and self.skip
            and self.given is None
            and not self._attention
            and (self.rule is None or self.gate_steps)
            and (compiled is None or compiled.whole_steps or compiled.cuda_graphs)
        )

    @property
    def running(self) -> bool:
        return self.n_running > 0

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t if self._on_host else t.to(self.device)

    def start(self, rows: torch.Tensor | np.ndarray, tokens: torch.Tensor) -> None:
        """Idle rows (m,) begin new tokens (m,) at their next positions. rows may be a
        host array (a scheduler's own bookkeeping: no device round trip)."""
        if torch.is_grad_enabled():  # a check, not a decorator: at a small batch every µs of a step shows
            with torch.no_grad():
                return self.start(rows, tokens)
        at = rows if isinstance(rows, np.ndarray) else rows.cpu().numpy()
        if at.shape[0] == 0:
            return
        if (self.depth[at] != IDLE).any() or self.retired[at].any():
            raise ConfigError(
                "rows is invalid; allowed: rows whose previous token is done (a retired row after load_row)"
            )
        rows_t = self._tensor(at)
        positions = self.length[at]
        self.length[at] += 1
        if self._ones is not None:  # on a device (on the host, self.length is cache.length's memory)
            self.cache.length.index_add_(0, rows_t, self._ones[: at.shape[0]])
        self.n_running += at.shape[0]
        if self._attention:
            self.cache.reserve(int(positions.max()) + 1)
        h = self.model.embed(tokens)
        if self.h is None:
            self.h = h.new_zeros(self.cache.batch, h.shape[-1])
            self.readout_h = torch.zeros_like(self.h)
        self.h.index_copy_(0, rows_t, h)
        if self.one_call:
            assert self.rule is not None  # one_call: a rule with an initial state
            self.rule_state = _put(
                self.rule_state, rows_t, self.rule.initial_state(at.shape[0], self.device), self.cache.batch
            )
        self.depth[at] = 0
        self.position[at] = positions
        self.exit_step[at] = self.R
        if self.given is not None:
            self.exit_depth[at] = self.given[at, positions] - 1

    @property
    def fused(self) -> bool:
        """Whether advance_greedy may run: a fusable batch (__init__) with a running row
        and every idle row retired, whose idle rows' discarded loops (they run in the call
        too) cost no more than the running rows' own or SPARE_FLOPS, about what the
        calls saved cost (at a stream's end: `debug` always fuses, a paper-size model
        only while half its rows or more run)."""
        idle = self.depth == IDLE
        if not (self.fusable and self.n_running and self.retired[idle].all()):
            return False
        wasted = (self.cache.batch - self.n_running) * self._loop_flops
        return wasted <= max(self.n_running * self._loop_flops, SPARE_FLOPS)

    def advance_greedy(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """n_steps backbone steps in one call (depth_steps): each finished token is read
        out greedily and its row's next token started with it. Returns tokens and loops,
        (n_steps, B) host arrays: per step and row the greedy token of the token that
        finished and the loops it ran; -1 and 0 where none did (idle rows: never). A
        caller that wants no more tokens from a row retire()s it."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self.advance_greedy(n_steps)
        if not self.fused or self.h is None:
            raise ConfigError(
                "advance_greedy is invalid here; allowed: a running row, the idle ones retired and cheap enough "
                "to run (DepthBatch.fused), readout on, a skip or fixed-depth policy with the gate's rule or none, "
                "recurrent states (otherwise advance())"
            )
        idle = self.depth == IDLE
        state = tuple(self.rule_state) if self.rule is not None else ()
        depth = self._tensor(np.where(idle, 0, self.depth))  # a retired row runs from loop 1, discarded
        last = int(self.exit_depth[0])  # the same for every row: no given exits here
        compiled = self.model.compiled_decode
        if compiled is None:
            out = depth_steps(
                self.model, self.rule, last, n_steps, self._gather, self.cache.storage, self.h, depth, *state
            )
        else:
            constants = (self.rule, last, n_steps, self._gather)
            out = compiled.storage_steps(depth_steps, self.model, constants, self.cache, (self.h, depth, *state))
        self.h, depth, tokens_t, loops_t, *state_out = out
        if self.rule is not None:
            self.rule_state = tuple(state_out)
        self.steps += n_steps
        # One read back a call: the depths, tokens and loops.
        self.depth[:] = np.where(idle, IDLE, depth.cpu().numpy())
        tokens, loops = tokens_t.cpu().numpy(), loops_t.cpu().numpy()
        tokens[:, idle], loops[:, idle] = -1, 0
        started = (loops > 0).sum(0)  # each finished token started its row's next one
        self.length += started  # on the host, cache.length's own memory
        if self._ones is not None:
            self.cache.length.add_(torch.from_numpy(started).to(self.device))
        self.position += started
        return tokens, loops

    def retire(self, rows) -> None:
        """Rows give up their running tokens, if any, and their states: advance_greedy
        may run them as discarded steps, so they serve again only after load_row()
        (a request that ended within a call, or a row with no request left)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.n_running -= int((self.depth[rows] != IDLE).sum())
        self.depth[rows] = IDLE
        self.retired[rows] = True

    def load_row(self, row: int, source: InferenceCache) -> None:
        """An idle row takes over a prefilled one-row cache (a new request joining the
        running batch as another finishes: looplab/inference/arrivals.py); its next start()
        continues that request's prompt."""
        if self.depth[row] != IDLE:
            raise ConfigError(f"row={row} is invalid; allowed: a row whose previous token is done")
        self.cache.write_row(row, source)
        self.retired[row] = False
        if not self._on_host:  # on the host, self.length is cache.length's own memory
            self.length[row] = int(source.length[0])

    def advance(self) -> Done:
        """One backbone step: every running row's token runs its next loop; returns the
        tokens that are done."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self.advance()
        if self.h is None or self.readout_h is None or not self.running:  # h: set by the first start()
            raise ConfigError("advance is invalid with no running token; allowed: after start() of an idle row")
        R, B, model = self.R, self.cache.batch, self.model
        rows = (self.depth != IDLE).nonzero()[0]
        every = rows.shape[0] == B  # every row runs: nothing of the rows' own to gather
        rows_t = None if every else self._tensor(rows)
        depth = self.depth[rows]
        slots = self._tensor(rows + depth * B)  # (loop − 1)·batch + row
        h_in = self.h if rows_t is None else self.h[rows_t]
        positions = self._tensor(self.position[rows])[:, None] if self._attention else None
        fused = self._gate_loop(h_in, positions, slots) if every and self.gate_steps else None
        if fused is not None:  # the loop and the gate's decision in one call
            h, exits, *state = fused
            self.rule_state, reached = tuple(state), exits.cpu().numpy()
        else:
            h = model.step(h_in[:, None], positions, cache=self.cache.at_slots(slots))[:, 0]
            reached = None
        if rows_t is None:  # every row
            self.h = h
        else:
            self.h.index_copy_(0, rows_t, h)
        self.steps += 1
        exit_step = self.exit_step[rows]
        if reached is None:
            reached = self._reached(rows, rows_t, depth, h)
        # A token's first step reaching its exit is its exit (under dense it runs on).
        leaving = reached & (depth < R - 1) & (exit_step == R)
        exit_step = np.where(leaving, depth + 1, exit_step)
        self.exit_step[rows] = exit_step
        last = depth == R - 1
        if self.skip:
            done = leaving | last
            if self.fill and leaving.any():
                self._fill(rows[leaving], h[self._tensor(leaving.nonzero()[0])], depth[leaving] + 1)
            out_h = h
        else:  # dense: every loop runs
            done, out_h = last, self._dense_readout(rows_t, leaving, exit_step, h)
        self.depth[rows] = np.where(done, IDLE, depth + 1)
        at = done.nonzero()[0]
        self.n_running -= at.shape[0]
        ends = torch.from_numpy(exit_step[at])
        logits = model.logits(out_h[self._tensor(at)]) if self.readout and at.shape[0] else None
        return Done(torch.from_numpy(rows[at]), ends, self.policy.loops_of(ends, R), logits)

    def _dense_readout(self, rows_t, leaving, exit_step, h: torch.Tensor) -> torch.Tensor:
        """Under dense execution the readout state is the one at the exit step: kept from
        the step a row's token leaves at, read out when its last loop has run."""
        assert self.readout_h is not None
        old = self.readout_h if rows_t is None else self.readout_h[rows_t]
        readout_h = torch.where(self._tensor(leaving)[:, None], h, old)
        if rows_t is None:
            self.readout_h = readout_h
        else:
            self.readout_h.index_copy_(0, rows_t, readout_h)
        return torch.where(self._tensor(exit_step == self.R)[:, None], h, readout_h)

    def _gate_loop(self, h: torch.Tensor, positions: torch.Tensor | None, slots: torch.Tensor):
        """gate_loop's outputs for every row: eager, or compiled where the model's decoding
        compiles whole steps; None where it compiles the one-loop step alone (the caller
        runs that, then the rule)."""
        assert isinstance(self.rule_state, tuple)  # the gate's (survival, F), every row's since its start()
        compiled = self.model.compiled_decode
        if compiled is None:
            return gate_loop(self.model, self.rule, h, positions, self.cache.at_slots(slots), *self.rule_state)
        if not compiled.whole_steps:
            return None
        return compiled.gate_loop(gate_loop, self.model, self.rule, h, positions, slots, self.cache, self.rule_state)

    def _reached(self, rows: np.ndarray, rows_t: torch.Tensor | None, depth: np.ndarray, h: torch.Tensor) -> np.ndarray:
        """Where each token's exit rule says exit after its loop (False at loop R)."""
        if self.rule is None:  # given or fixed exit steps
            return depth == self.exit_depth[rows]
        # Only tokens before their last loop decide (as in decode_step): a zoo rule's
        # head is not run for the others.
        live = (depth < self.R - 1).nonzero()[0]
        reached = np.zeros(rows.shape[0], dtype=bool)
        if live.shape[0] == 0:
            return reached
        if self.one_call and live.shape[0] == self.cache.batch:  # every row decides: no rows to gather
            value = self._rule_value(h)
            stat, self.rule_state = self.rule.statistic(value, self.rule_state)
            return self.rule.decide(stat).cpu().numpy()
        token_rows = (self._tensor(rows) if rows_t is None else rows_t)[self._tensor(live)]
        h = h[self._tensor(live)]
        value = self._rule_value(h)
        if self.one_call:
            stat, state = self.rule.statistic(value, _take(self.rule_state, token_rows))
            self.rule_state = _put(self.rule_state, token_rows, state, self.cache.batch)
            reached[live] = self.rule.decide(stat).cpu().numpy()
            return reached
        fresh = depth[live] == 0  # a token's first step: its rule starts afresh
        parts = []
        for group, first in ((fresh, True), (~fresh, False)):
            sub = self._tensor(group.nonzero()[0])
            if sub.numel():
                state = None if first else _take(self.rule_state, token_rows[sub])
                s, state = self.rule.statistic(value[sub], state)
                self.rule_state = _put(self.rule_state, token_rows[sub], state, self.cache.batch)
                parts.append((sub, s))
        stat = parts[0][1].new_empty(live.shape[0])
        for sub, s in parts:
            stat[sub] = s
        reached[live] = self.rule.decide(stat).cpu().numpy()
        return reached

    def _rule_value(self, h: torch.Tensor) -> torch.Tensor:
        """What the exit rule reads of states h: the gate's logits or the next-token logits."""
        assert self.rule is not None  # _reached asks only with a rule
        return self.model.exit_logit(h) if self.rule.reads == GATE_LOGITS else self.model.logits(h)

    def _fill(self, rows: np.ndarray, h: torch.Tensor, loop: np.ndarray) -> None:
        """attention_fill="exit_state": exited tokens leave their keys and values in the
        deeper loops (models/cache.py), per exit loop."""
        for r in np.unique(loop).tolist():
            at = loop == r
            self.cache.fill_exited(
                self.model,
                h[self._tensor(at.nonzero()[0])],
                self._tensor(rows[at]),
                self._tensor(self.position[rows[at]]),
                r,
            )


@torch.no_grad()
def decode_given_tokens(
    model,
    cache: InferenceCache,
    ids: torch.Tensor,
    first: int | torch.Tensor,
    policy: ExitPolicy,
    *,
    readout: bool = True,
    on_done: Callable[[Done], None] | None = None,
) -> DepthBatch:
    """Feed each row's tokens ids[b, first:] (teacher forcing: the next token is known,
    as in the decode benchmark), each as soon as the row's previous token is done;
    first is one position or one per row (B,) (ragged prompts). Returns the batch
    (its `steps`); on_done sees every step's finished tokens."""
    batch = DepthBatch(model, cache, policy, readout=readout)
    bsz, width = ids.shape
    flat = ids.reshape(-1)
    # Each row's next position (host bookkeeping, as the batch's).
    nxt = np.broadcast_to(np.asarray(first, dtype=np.int64), (bsz,)).copy()
    rows = np.arange(bsz)
    while True:
        rows = rows[nxt[rows] < width]
        batch.start(rows, flat.index_select(0, torch.from_numpy(rows * width + nxt[rows]).to(ids.device)))
        nxt[rows] += 1
        if not batch.running:
            return batch
        done = batch.advance()
        if on_done is not None:
            on_done(done)
        rows = done.rows.numpy()
