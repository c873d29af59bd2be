"""Generation: prefill a batch of prompts into the per-(loop, layer) cache, then
decode one token at a time from it, under any exit policy (looplab/policy.py).

    prefill      the full forward (models/execution.py) over the prompts with an
                 InferenceCache attached: loop r's states hold the real tokens that
                 ran loop r. Returns the next-token logits at each row's last token.
    decode_step  one new token per row: for r = 1..R the token runs the backbone's
                 single-token form on loop r's states, then the policy's exit rule (the
                 gate's threshold rule, or a zero-shot rule of the zoo; each starts
                 afresh for every token) decides after each non-final loop. skip: an exited token updates no deeper loop's
                 state (the cache holes CHASE trains with); dense: it runs every loop,
                 read out at its exit step; forced:d: d loops. Rows still running at
                 loop r are packed together, so the work follows the active tokens.
                 Compiled, a token step is one call: every loop for every row under
                 full (_full_depth_step), and under the gate's skip or dense policy
                 or forced (_fused_token_step) every row runs each loop up to the
                 policy's last, under skip an exited token's later loops writing
                 the cache's scratch slot (fixed shapes, no read back between loops:
                 the work is the batch's last loop's, whoever exited).
    generate     prefill, then sample (greedy, or temperature / top-k / top-p with a
                 seed) and decode until <eos>, a stop string or max_new_tokens, per row;
                 it records the loops behind every new token.

Exactness: prefill of tokens 1..t−1 then decode_step of token t gives token t the
logits and exit step of the full forward over 1..t in the same policy (tests/test_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from looplab.config import ConfigError
from looplab.inference.depth_batching import DEPTH, LOCKSTEP, DepthBatch, check_schedule
from looplab.inference.rows import GenerationRows, per_row, stop_lists
from looplab.inference.sampling import Sampler, check_sampling, sampling_generator
from looplab.inference.sampling import sample as sample  # its home before sampling.py; callers import it here
from looplab.models.cache import HOLE, InferenceCache, Layout, StepCache, loop_slots
from looplab.models.execution import FULL_DEPTH
from looplab.policy import DENSE, EXIT_RULES, FULL, GATE_LOGITS, GIVEN, ExitPolicy, ExitRule, exit_rule

StepHook = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Prefilled:
    cache: InferenceCache
    logits: torch.Tensor  # (B, V) next-token logits at each row's last real token
    exit_step: torch.Tensor  # (B,) that token's exit step
    loops: torch.Tensor  # (B,) the loops it ran
    executed_loops: float  # mean over the prompts' real tokens
    row_loops: torch.Tensor  # (B,) Σ over each prompt's real tokens of the loops they ran


@dataclass
class Decoded:
    logits: torch.Tensor | None  # (n, V) for the rows that ran, in the order of `rows`
    exit_step: torch.Tensor  # (n,) the step each token was read out at
    loops: torch.Tensor  # (n,) the loops each token ran
    fused_loops: int | None = None  # loops run for every row by one fused call (_fused_token_step)

    def batch_loops(self) -> int:
        """The backbone steps the batch ran for these tokens: its deepest token's loops,
        or under a fused call every loop it ran, whoever exited before."""
        return self.fused_loops if self.fused_loops is not None else int(self.loops.max())


@dataclass
class Generation:
    """What generate returns, per row: the new tokens (without <eos>), for each the
    loops run by the position that predicted it (its readout step in `exit_step`;
    they differ under dense, which runs every loop), why the row stopped (eos | stop
    | length), and with a decode callable the text, cut before the first stop string."""

    tokens: list[list[int]]
    loops: list[list[int]]
    exit_step: list[list[int]]
    finish: list[str]
    texts: list[str] | None = None
    prompt_executed_loops: float = 0.0  # mean loops over the prompts' real tokens
    # The work done per row: positions run through the model (prompt and fed-back new
    # tokens) and the loops they ran in all.
    ran_tokens: list[int] = field(default_factory=list)
    ran_loops: list[int] = field(default_factory=list)
    cache_bytes: int = 0

    @property
    def executed_loops(self) -> float | None:
        """Mean loops per new token over all rows."""
        n = sum(len(x) for x in self.loops)
        return sum(sum(x) for x in self.loops) / n if n else None


def _as_batch(ids, lengths, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids (a right-padded (B, L) tensor with lengths, or lists of
    different lengths) as a right-padded tensor and the real lengths."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ConfigError(f"ids of shape {tuple(ids.shape)} is invalid; allowed: (B, L) token ids, L >= 1")
        ids = ids.to(device)
        lengths = (
            torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)
            if lengths is None
            else torch.as_tensor(lengths, dtype=torch.long)
        ).to(device)
    else:
        rows = [list(map(int, row)) for row in ids]
        if not rows or any(len(row) == 0 for row in rows):
            raise ConfigError("ids is invalid; allowed: non-empty rows of token ids")
        width = max(len(row) for row in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
        ids, lengths = ids.to(device), lengths.to(device)
    if lengths.shape != (ids.shape[0],) or int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]:
        raise ConfigError(f"lengths is invalid; allowed: (B,) = ({ids.shape[0]},) integers in [1, {ids.shape[1]}]")
    return ids, lengths


def _check_policy(model, policy: ExitPolicy) -> None:
    if not isinstance(policy, ExitPolicy):
        raise ConfigError(f"policy={policy!r} is invalid; allowed: an ExitPolicy (e.g. ExitPolicy.parse('skip:0.4'))")
    policy.check(model.cfg.n_loops)


def prefill(
    model,
    ids,
    policy: ExitPolicy = FULL_DEPTH,
    *,
    lengths=None,
    capacity: int | None = None,
    attention_fill: str = HOLE,
    packing: str = "auto",
) -> Prefilled:
    """Run the prompts (ids (B, L) right-padded with lengths (B,), or rows of token
    ids) under `policy`, returning the cache and the next-token logits. capacity: the
    attention buffers' size (default L; generate adds the new tokens). Given exits
    (ExitPolicy.given) are (B, ≥ L) steps by absolute position: the prompt reads its
    first L columns, decode_step the column of each new token's position."""
    _check_policy(model, policy)
    device = next(model.parameters()).device
    ids, lengths = _as_batch(ids, lengths, device)
    bsz, seqlen = ids.shape
    prompt_policy = policy
    if policy.rule == GIVEN:
        if policy.exit_at.dim() != 2 or policy.exit_at.shape[0] != bsz or policy.exit_at.shape[1] < seqlen:
            raise ConfigError(f"policy exit_at is invalid; allowed: (B, T) = ({bsz}, >= {seqlen}) exit steps")
        prompt_policy = ExitPolicy.given(policy.exit_at[:, :seqlen].to(device), policy.execution)
    cache = InferenceCache(model, bsz, max(capacity or seqlen, seqlen), attention_fill=attention_fill)
    mask = torch.arange(seqlen, device=device) < lengths[:, None]
    with torch.no_grad():
        out = model(ids, prompt_policy, mask=mask, readout="none", cache=cache, packing=packing)
        last = (lengths - 1)[:, None]
        h = out.hidden.gather(1, last[..., None].expand(-1, -1, out.hidden.shape[-1]))[:, 0]
        logits = model.logits(h)
    cache.length.copy_(lengths)
    exit_step = out.exit_step.gather(1, last)[:, 0]
    loops = policy.loops_of(out.exit_step, model.cfg.n_loops)
    return Prefilled(cache, logits, exit_step, loops.gather(1, last)[:, 0], out.executed_loops, (loops * mask).sum(1))


@torch.no_grad()
def decode_step(
    model,
    cache: InferenceCache,
    tokens: torch.Tensor,
    policy: ExitPolicy = FULL_DEPTH,
    *,
    rows: torch.Tensor | None = None,
    readout: bool = True,
    on_step: StepHook | None = None,
) -> Decoded:
    """Append one token to each row in `rows` (default: every row; tokens (n,) in
    that order) and return its logits, exit step and loops (module docstring).
    readout=False skips the final norm and head (benchmarks time the loops alone).
    on_step(r, h, active) -> h runs after loop r's exits are decided (h (n, d) the
    tokens' states, active (n,) who runs on): tests use it to show that an exited
    token's state reaches no deeper loop."""
    R = model.cfg.n_loops
    n = tokens.shape[0]
    if rows is None and n != cache.batch:
        raise ConfigError(f"tokens of shape {tuple(tokens.shape)} is invalid; allowed: ({cache.batch},) or rows=")
    positions = cache.length.clone() if rows is None else cache.length[rows]  # each row's next position
    if cache.has_keys:
        cache.reserve(int(positions.max()) + 1)
    compiled = _whole_step(model, policy, on_step)
    if compiled is not None:  # every row runs every loop: the token step compiled as one graph
        exit_step = torch.full_like(positions, R)
        logits = compiled.whole(_full_depth_step, model, cache, tokens, rows, readout)
        return Decoded(logits, exit_step, policy.loops_of(exit_step, R))
    fused = _fused_step(model, cache, policy, n, on_step)
    if fused is not None:  # skip, dense or forced: the token step as one call of fixed shapes
        compiled, rule = fused
        last = policy.loops_run(R) or R
        constants = (rule, last, policy.execution == DENSE, cache.batch, readout)
        row_ids = torch.arange(n, device=tokens.device) if rows is None else rows
        logits, exit_step = compiled.storage_steps(
            _fused_token_step, model, constants, cache, (tokens, row_ids), every_row=rows is None
        )
        _count_token(cache, rows)
        return Decoded(logits if readout else None, exit_step, policy.loops_of(exit_step, R), fused_loops=last)
    token = _TokenStep(model, cache, policy, rows, positions, on_step, tokens.device)
    readout_h, exit_step = token.run(model.embed(tokens))
    _count_token(cache, rows)
    logits = model.logits(readout_h) if readout else None
    return Decoded(logits, exit_step, policy.loops_of(exit_step, R))


class _TokenStep:
    """One new token per row through loops 1..R under a policy (decode_step's general
    case): which tokens still run, when each exits, and the state it is read out from.
    Rows still running at loop r are packed together, so the work follows the active
    tokens."""

    def __init__(self, model, cache: InferenceCache, policy: ExitPolicy, rows, positions, on_step, device) -> None:
        self.model, self.cache, self.policy, self.on_step = model, cache, policy, on_step
        self.rows, self.positions = rows, positions
        self.row_ids = torch.arange(positions.shape[0], device=device) if rows is None else rows
        self.rule: ExitRule | None = None
        if policy.rule in EXIT_RULES:  # the gate's threshold rule or a zoo rule, per token, from zero:
            self.rule = exit_rule(policy)  # each new token decides afresh
        elif policy.rule == GIVEN:
            self.steps = policy.exit_at.to(device)[self.row_ids, positions]
        else:
            loops = policy.loops_run(model.cfg.n_loops)
            assert loops is not None  # no rule, none given: full or forced, which fix every token's loops
            self.steps = torch.full_like(positions, loops)

    def run(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens' embeddings h (n, d) through the loops: (the states to read out, exit steps)."""
        R, policy, n = self.model.cfg.n_loops, self.policy, h.shape[0]
        skip = policy.execution != DENSE  # exited tokens stop running (under full nobody exits before R)
        fill = skip and self.cache.attention_fill != HOLE
        exit_step = torch.full_like(self.positions, R)
        readout_h = h
        active = torch.ones(n, dtype=torch.bool, device=h.device)
        idx = None  # the running tokens, when not all of them
        for r in range(1, R + 1):
            h, a_in = self.loop(r, h, idx)
            if r == R:
                break
            leaving = active & self.reached(r, h, a_in, idx) & (exit_step == R)  # a first step reaching the exit
            exit_step = torch.where(leaving, r, exit_step)
            if policy.execution == DENSE:
                readout_h = torch.where((exit_step == r)[:, None], h, readout_h)
            elif skip:
                active = active & ~leaving
                if self.on_step is not None:
                    h = self.on_step(r, h, active)
                if fill and bool(leaving.any()):
                    out_rows = leaving.nonzero()[:, 0]
                    self.cache.fill_exited(self.model, h[out_rows], self.row_ids[out_rows], self.positions[out_rows], r)
                if not bool(active.any()):
                    break
                idx = None if bool(active.all()) else active.nonzero()[:, 0]
        if policy.execution == DENSE:
            return torch.where((exit_step == R)[:, None], h, readout_h), exit_step
        return h, exit_step  # exited tokens' states stayed frozen

    def loop(self, r: int, h: torch.Tensor, idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Loop r on the running tokens (idx; None: all): every token's state, and the
        running ones' new states (what the gate reads)."""
        model, cache = self.model, self.cache
        if idx is None:
            h = model.step(h[:, None], self.positions[:, None], cache=cache.at(r, Layout.one_token(self.rows)))[:, 0]
            return h, h
        out = model.step(
            h[idx][:, None], self.positions[idx][:, None], cache=cache.at(r, Layout.one_token(self.row_ids[idx]))
        )[:, 0]
        return h.index_copy(0, idx, out), out

    def reached(self, r: int, h: torch.Tensor, a_in: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
        """(n,) whether each token's exit is reached after loop r."""
        if self.rule is None:
            return self.steps == r
        if self.rule.reads == GATE_LOGITS:
            a = self.model.exit_logit(a_in)
            if idx is not None:  # the rule's arithmetic is elementwise: exited tokens' entries are never read
                a = torch.zeros(h.shape[0], dtype=a.dtype, device=a.device).index_copy(0, idx, a)
            return self.rule.update(a)
        return self.rule.update(
            self.model.logits(h)
        )  # a zoo rule reads the step's next-token logits (every row's state)


def _whole_step(model, policy: ExitPolicy, on_step: StepHook | None):
    """The model's compiled decoding (models/compiled.compile_decoding), where decode_step
    may run its whole token step (_full_depth_step) through it: whole steps on, a policy
    under which every token runs every loop (full), and no hook between loops; else None."""
    compiled = getattr(model, "compiled_decode", None)
    if compiled is None or not compiled.whole_steps or policy.execution != FULL or on_step is not None:
        return None
    return compiled


# Under the gate's skip policy the fused token step runs every row through every loop,
# where the packed step runs the running rows alone at a host round trip a loop (~0.2 ms
# on `debug`'s CPU core): decode_step fuses while one loop of all its rows costs at most
# this. With tokens exiting about halfway (R − d̄ ≈ (R − 1)/2) the loops wasted then cost
# about the round trips saved, at a core's ~100 GFLOP/s. Measured: `local` at 32 slots
# (20 MFLOP a loop) decoded 1.00× the best full fused and 0.88-0.95× packed; paper-140m at
# 8 slots (1.9 GFLOP) 1.10× packed, more than a call doing full's FLOPs can
# (docs/benchmarks.md, "Lockstep skip in one call").
FUSED_LOOP_FLOPS = 4e7


def _count_token(cache: InferenceCache, rows: torch.Tensor | None) -> None:
    """One more token in each of `rows` (None: every row) of the cache."""
    if rows is None:
        cache.length += 1
    else:
        cache.length[rows] += 1


def _fused_step(model, cache: InferenceCache, policy: ExitPolicy, n: int, on_step: StepHook | None):
    """(The model's compiled decoding, the policy's exit rule or None), where
    decode_step may run its token step of n rows
    under a skip, dense or forced policy as one call (_fused_token_step): compiled whole
    steps (or CUDA graphs), the gate's rule (under skip with n rows' loop within
    FUSED_LOOP_FLOPS; dense runs every loop of every row anyway) or none (forced:
    nothing to waste), not a zoo rule (it reads the head every loop) nor given
    exits (per position), recurrent states (attention's buffers grow, and its exited
    tokens may fill deeper loops) and no hook between loops; else None."""
    compiled = getattr(model, "compiled_decode", None)
    if compiled is None or not (compiled.whole_steps or compiled.cuda_graphs):
        return None
    if policy.execution == FULL or policy.rule == GIVEN or cache.has_keys or on_step is not None:
        return None
    if policy.rule not in EXIT_RULES:
        return compiled, None
    rule = exit_rule(policy)
    if rule.reads != GATE_LOGITS or rule.initial_state(0, cache.length.device) is NotImplemented:
        return None
    if policy.execution != DENSE and n * compiled.loop_flops(model) > FUSED_LOOP_FLOPS:
        return None
    return compiled, rule


def _fused_token_step(model, rule, last: int, dense: bool, batch: int, readout: bool, storage: list, tokens, rows):
    """decode_step under skip, dense or forced as one function of fixed shapes
    (compiled, one call: CompiledDecodeStep.storage_steps): tokens (n,) of cache rows
    `rows` (n,) run loops 1..last (forced's depth, else R), each at its row's slot of
    `storage` (a cache of `batch` rows), and after every loop before the last the gate's
    rule (None: no exits) decides. Under skip a token that exits keeps its state, and
    its row's later loops point at the scratch slot (models/cache.py): they compute and
    write only there, so the deeper states keep the holes _TokenStep leaves by running
    the others alone. Under dense it runs on and is read out from its state at its exit
    step. Under forced every token runs `last` loops. Returns (logits (n, V), or an empty
    tensor without the readout (benchmarks time the loops alone), exit steps (n,));
    the caller counts the tokens in cache.length (tests/test_decode.py holds it to the
    full forward token by token, and catches a row that writes past the scratch slot)."""
    h = model.embed(tokens)
    exit_step = torch.full_like(rows, last)
    running = torch.ones_like(rows, dtype=torch.bool)
    state = () if rule is None else rule.initial_state(rows.shape[0], h.device)
    R = model.cfg.n_loops
    readout_h = h
    for r in range(1, last + 1):
        slots = loop_slots(rows, r, R, batch, None if rule is None or dense else running)
        out = model.backbone(h[:, None], None, None, StepCache(storage, Layout.one_token(slots)))[:, 0]
        if rule is None or dense:
            h = out
        else:
            h = torch.where(running[:, None], out, h)  # an exited token's state stays frozen
        if rule is not None and r < last:
            statistic, state = rule.statistic(model.exit_logit(out), state)
            leaving = running & rule.decide(statistic)
            exit_step = torch.where(leaving, r, exit_step)
            running = running & ~leaving
            if dense:
                readout_h = torch.where(leaving[:, None], h, readout_h)
    if dense:
        h = torch.where(running[:, None], h, readout_h)  # who never exited reads out loop R's state
    return (model.logits(h) if readout else h.new_empty(0)), exit_step


def _full_depth_step(model, cache: InferenceCache, tokens, rows, readout: bool):
    """decode_step under a full-depth policy, as one function for torch.compile to
    trace whole: every row in `rows` (None: all) runs loops 1..R on its token and none
    exits, so the general loop's exit bookkeeping reduces to this. Returns the logits
    (None without readout); tests/test_compile.py holds it to the general loop's tokens."""
    positions = (cache.length if rows is None else cache.length[rows]).clone()[:, None]
    h = model.embed(tokens)[:, None]
    for r in range(1, model.cfg.n_loops + 1):
        h = model.backbone(h, positions, None, cache.at(r, Layout.one_token(rows)))
    if rows is None:
        cache.length += 1
    else:
        cache.length[rows] += 1
    return model.logits(h[:, 0]) if readout else None


def generate(  # noqa: PLR0913 - the generation API's sampling and serving knobs, keyword-only
    model,
    ids,
    max_new_tokens,
    policy: ExitPolicy = FULL_DEPTH,
    *,
    lengths=None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_id: int | None = None,
    stop=None,
    decode: Callable[[list[int]], str] | None = None,
    attention_fill: str = HOLE,
    packing: str = "auto",
    schedule: str = LOCKSTEP,
) -> Generation:
    """Continue each prompt (ids: a right-padded (B, L) tensor with lengths, or rows
    of different lengths) by up to max_new_tokens (one number, or one per row).

    temperature 0 is greedy; otherwise samples with top_k / top_p from a generator
    seeded with `seed`. A row stops at eos_id (not included), at a stop string (needs
    `decode`, ids → text; the text is cut before it) or at its max_new_tokens.
    attention_fill: what exited tokens leave in deeper attention layers (hole |
    exit_state, models/cache.py). Finished rows leave the batch: only the rows still
    generating run. schedule: lockstep (decode_step: each new token of every row runs
    its loops together, a step per loop) or depth (looplab/inference/depth_batching.py: a row
    starts its next token as soon as its last one is done, rows at different loops
    share a step). Greedy outputs are the same; sampled draws come in another order."""
    _check_policy(model, policy)
    check_schedule(schedule)
    check_sampling(temperature, top_k, top_p)
    device = next(model.parameters()).device
    ids, lengths = _as_batch(ids, lengths, device)
    bsz = ids.shape[0]
    limits = per_row(max_new_tokens, bsz, "max_new_tokens", int)
    if min(limits) < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} is invalid; allowed: integers >= 0")
    stops = stop_lists(stop, bsz)
    if any(stops) and decode is None:
        raise ConfigError("stop strings need decode=; allowed: a callable from token ids to text")
    sampler = Sampler(temperature, top_k, top_p, sampling_generator(temperature, seed, device))
    capacity = ids.shape[1] + max(limits)
    if policy.rule == GIVEN and policy.exit_at.shape[1] < capacity:
        raise ConfigError(
            f"policy exit_at is invalid; allowed: (B, T) exit steps with T >= prompt + max_new_tokens = {capacity}"
        )
    pre = prefill(
        model, ids, policy, lengths=lengths, capacity=capacity, attention_fill=attention_fill, packing=packing
    )
    rows = GenerationRows.start(limits, stops, eos_id, decode, lengths.tolist(), pre.row_loops.tolist())
    live = [b for b in range(bsz) if not rows.finish[b]]
    loops_now, exit_now = pre.loops.tolist(), pre.exit_step.tolist()
    going = rows.draw(sampler, live, pre.logits[live], [loops_now[b] for b in live], [exit_now[b] for b in live])
    run_schedule = _decode_by_depth if schedule == DEPTH else _decode_in_lockstep
    run_schedule(model, pre.cache, policy, rows, sampler, going, device)
    return Generation(
        rows.tokens,
        rows.loops,
        rows.exits,
        rows.finish,
        rows.texts,
        pre.executed_loops,
        rows.ran_tokens,
        rows.ran_loops,
        pre.cache.nbytes(),
    )


def _decode_in_lockstep(model, cache, policy, rows: GenerationRows, sampler: Sampler, going, device) -> None:
    """The lockstep schedule: every going row's next token runs its loops together
    (decode_step), until no row goes on."""
    bsz = len(rows.limits)
    while going:
        live = [b for b, _ in going]
        out = decode_step(
            model,
            cache,
            torch.tensor([t for _, t in going], device=device),
            policy,
            rows=None if len(live) == bsz else torch.tensor(live, device=device),
        )
        loops_now = out.loops.tolist()
        rows.ran(live, loops_now)
        going = rows.draw(sampler, live, out.logits, loops_now, out.exit_step.tolist())


def _decode_by_depth(model, cache, policy, rows: GenerationRows, sampler: Sampler, going, device) -> None:
    """The depth schedule (depth_batching.py): a row starts its next token as soon as
    its last one is done, until no row goes on or runs."""
    batch = DepthBatch(model, cache, policy)
    while going or batch.running:
        if going:
            batch.start(
                torch.tensor([b for b, _ in going], device=device),
                torch.tensor([t for _, t in going], device=device),
            )
        done = batch.advance()
        done_rows, loops_done = done.rows.tolist(), done.loops.tolist()
        rows.ran(done_rows, loops_done)
        going = rows.draw(sampler, done_rows, done.logits, loops_done, done.exit_step.tolist()) if done_rows else []
