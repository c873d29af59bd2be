"""Executing a looped model under an exit policy (looplab/policy.py).

full / forced:d  every token runs exactly R / d steps.
dense            every token runs all R steps; the policy's exit step only picks the
                 readout step (the threshold rule z(q), a zoo rule on the steps'
                 next-token distributions, or given exit steps).
skip             at step r only the active tokens A_r run: each sequence's survivors
                 are packed in their original causal order, stepped with their true
                 positions, and scattered back. Exited tokens keep their frozen hidden
                 state and are absent from every deeper conv window, SSM scan and
                 attention. Readout: the frozen state.

Skip packs survivors in one of two layouts: "padded" (each row's survivors,
right-padded to the batch's largest count: B × max survivors of work; works for
every backbone) or "varlen" (all survivors of the batch in one row, separated by a
per-token sequence index: work follows the total survivor count, which closes the
ragged-halting gap; Mamba-2-only backbones). "auto" picks varlen where it applies.

With an InferenceCache (models/cache.py) the same pass is a prefill: loop r's
Mamba-2 states and attention keys hold exactly the real tokens that ran loop r.
attention_fill="exit_state" lets an exited token's frozen state supply its keys and
values to the deeper loops' attention instead of leaving a hole (skip only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from looplab.config import ConfigError
from looplab.models.cache import EXIT_STATE, HOLE, InferenceCache, Layout, check_fill
from looplab.policy import DENSE, EXIT_RULES, GATE_LOGITS, GIVEN, STEP_LOGITS, ExitPolicy, exit_rule

StepHook = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
FULL_DEPTH = ExitPolicy.full()


@dataclass
class Execution:
    logits: (
        torch.Tensor | None
    )  # (B, L, V) readout of each token's state at its exit step; (B, 1, V) for readout="last"; None for readout="none"
    hidden: torch.Tensor  # (B, L, d): that state
    exit_step: torch.Tensor  # (B, L) int64 in 1..R
    executed_loops: float  # mean over real tokens of the steps each token ran
    backbone_flops: int  # backbone forward FLOPs actually run, padding included
    step_hidden: list[torch.Tensor] | None = None  # h^(r), r = 1..R (frozen after exit under skip)
    gate_logits: torch.Tensor | None = None  # (R-1, B, L) gate logits on h^(1..R-1)
    step_logits: list[torch.Tensor] | None = None  # logits of h^(r), when asked for


class _Exits:
    """Where a policy sends tokens out: after step r < R, which tokens (B, L) reach
    their exit. A rule decides step by step (looplab/policy.py: the gate's threshold
    rule reads the gate's logits; the zoo's zero-shot rules read the step's
    next-token logits, which _Exits computes from h with the model's head); given and
    forced exits are fixed steps."""

    def __init__(self, policy: ExitPolicy, like: torch.Tensor, n_loops: int, model=None):
        self._rule = exit_rule(policy) if policy.rule in EXIT_RULES else None
        self.needs_gate = self._rule is not None and self._rule.reads == GATE_LOGITS
        self._head: Callable[[torch.Tensor], torch.Tensor] | None = None
        if self._rule is not None and self._rule.reads == STEP_LOGITS:
            if model is None:
                raise ConfigError(f"policy {policy.spec!r} reads each step's logits, which needs the model")
            self._head = model.logits
        if self._rule is None and policy.rule == GIVEN:
            self._steps = policy.exit_at.to(like.device)
        elif self._rule is None:
            loops = policy.loops_run(n_loops)
            assert loops is not None  # no rule, none given: full or forced, which fix every token's loops
            self._steps = torch.full_like(like, loops)

    def reached(self, r: int, gate_logit: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
        if self._rule is None:
            return self._steps == r
        if self.needs_gate:
            assert gate_logit is not None  # the callers compute the gate whenever a rule reads it
            return self._rule.update(gate_logit)
        assert self._head is not None  # a rule that reads no gate reads the step's logits (__init__)
        with torch.no_grad():  # a decision, not a loss: no graph through the head
            return self._rule.update(self._head(h))


def pack_indices(active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For active (B, L) bool: idx (B, Lmax), each row the active positions in
    order followed by inactive ones (padding), and valid (B, Lmax) marking the
    active part. A stable sort of the inactive flag keeps the causal order."""
    counts = active.sum(dim=1)
    width = int(counts.max())
    idx = torch.sort((~active).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=active.device) < counts[:, None]
    return idx, valid


def pack(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Gather rows of x (B, L, ...) at idx (B, W) → (B, W, ...)."""
    if x.dim() == 2:
        return x.gather(1, idx)
    return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def scatter(h: torch.Tensor, packed: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Write the survivors' new states back to their positions; padding slots write
    back the state already there, so exited tokens stay frozen. Out of place and
    differentiable; idx holds distinct positions per row, so the scatter is exact."""
    packed = torch.where(valid.unsqueeze(-1), packed, pack(h, idx))
    return h.scatter(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]), packed)


def execute(  # noqa: PLR0913 - the one forward's optional inputs and hooks, keyword-only
    model,
    ids: torch.Tensor,
    policy: ExitPolicy = FULL_DEPTH,
    *,
    positions: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    gate_grad: bool = True,
    keep_steps: bool = False,
    on_step: StepHook | None = None,
    packing: str = "auto",
    readout: str = "all",
    cache: InferenceCache | None = None,
    attention_fill: str | None = None,
) -> Execution:
    """Run `model` (a LoopedLM) on ids (B, L) under `policy` (module docstring).

    positions  (B, L) true positions (default 0..L-1), used by attention's RoPE.
    mask       (B, L) real tokens, for the executed-loops mean (default: all).
    gate_grad  False puts the gate under stop-gradient (CHASE's hole branch).
    keep_steps keep every step's hidden state and gate logits (training objectives).
    on_step    hook(r, h, active) -> h after step r's exits are decided (forced/skip);
               researchers use it to inspect or perturb states, tests to prove exited
               tokens are invisible to deeper steps.
    packing    auto | padded | varlen: the survivor layout of skip (module docstring).
    readout    all: logits at every position; last: only at the last one (prefill,
               which needs the next-token distribution of the prompt's end only);
               none: no logits (losses read the hidden states through a lean head).
    cache      an empty InferenceCache to prefill (looplab/inference/generate.py): it receives
               each loop's states of the real tokens that ran it; mask must be right
               padding (each row's real tokens first).
    attention_fill  hole | exit_state: what an exited token leaves in the deeper loops'
               attention layers (models/cache.py); default: the cache's, else hole.
    """
    R = model.cfg.n_loops
    bsz, seqlen = ids.shape
    if not isinstance(policy, ExitPolicy):
        raise ConfigError(f"policy={policy!r} is invalid; allowed: an ExitPolicy (e.g. ExitPolicy.parse('skip:0.4'))")
    policy.check(R, tuple(ids.shape))
    if positions is None:
        positions = torch.arange(seqlen, device=ids.device).expand(bsz, seqlen)
    if mask is None:
        mask = torch.ones(bsz, seqlen, dtype=torch.bool, device=ids.device)
    mamba_only = model.cfg.arch == "mamba2"
    if packing not in ("auto", "padded", "varlen") or (packing == "varlen" and not mamba_only):
        raise ConfigError(
            f"packing={packing!r} is invalid; allowed: auto | padded"
            + (" | varlen" if mamba_only else " (varlen needs arch='mamba2')")
        )
    varlen = packing == "varlen" or (packing == "auto" and mamba_only)
    if readout not in ("all", "last", "none"):
        raise ConfigError(f"readout={readout!r} is invalid; allowed: all | last | none")
    fill = check_fill(attention_fill or (cache.attention_fill if cache is not None else HOLE))
    if cache is not None:
        if cache.attention_fill != fill or cache.batch != bsz:
            raise ConfigError(
                f"cache is invalid; allowed: an InferenceCache of batch {bsz} with attention_fill={fill!r}"
            )
        if not torch.equal(mask, torch.arange(seqlen, device=mask.device) < mask.sum(1, keepdim=True)):
            raise ConfigError("mask is invalid with a cache; allowed: right padding (each row's real tokens first)")
    elif fill == EXIT_STATE and model.cfg.arch != "mamba2":
        # The deeper loops' attention reads exited tokens' keys from a key/value store.
        cache = InferenceCache(model, bsz, seqlen, attention_fill=fill, attention_only=True)

    h = model.embed(ids)
    exits = _Exits(policy, ids, R, model)
    if policy.execution == DENSE:
        out = _dense(model, h, positions, mask, exits, keep_steps, gate_grad, cache)
    else:
        out = _packed(model, h, positions, mask, exits, keep_steps, gate_grad, on_step, varlen, cache)
    if readout != "none":
        out.logits = model.logits(out.hidden if readout == "all" else out.hidden[:, -1:])
    return out


def _gate(model, h: torch.Tensor, exits: _Exits, gate_grad: bool, gates: list | None) -> torch.Tensor | None:
    """The gate's logits at h where the exit rule reads them or `gates` (kept steps)
    collects them; None where neither wants them (no gate computed)."""
    if not (exits.needs_gate or gates is not None):
        return None
    with torch.set_grad_enabled(gate_grad and torch.is_grad_enabled()):
        a = model.exit_logit(h)
    if gates is not None:
        gates.append(a)
    return a


def _dense(model, h, positions, mask, exits: _Exits, keep_steps, gate_grad, cache) -> Execution:
    """All R steps for every token; the readout buffer takes h^(r) for the tokens
    whose exit step is r, so memory stays O(1) in the number of loops (the same
    readout policy as skip; only the deeper steps of exited tokens differ)."""
    R = model.cfg.n_loops
    bsz, seqlen = h.shape[:2]
    steps: list[torch.Tensor] = []
    gates: list[torch.Tensor] = []
    exit_step = torch.full((bsz, seqlen), R, dtype=torch.long, device=h.device)
    readout = h
    for r in range(1, R + 1):
        h = model.step(h, positions, cache=None if cache is None else cache.at(r, Layout.padded(mask.sum(1))))
        if keep_steps:
            steps.append(h)
        if r < R:
            a = _gate(model, h, exits, gate_grad, gates if keep_steps else None)
            undecided = exit_step == R  # a token's first step reaching its exit is its exit
            exit_step = torch.where(exits.reached(r, a, h) & undecided, r, exit_step)
        readout = torch.where((exit_step == r).unsqueeze(-1), h, readout)
    return Execution(
        logits=None,
        hidden=readout,
        exit_step=exit_step,
        executed_loops=float(R),
        backbone_flops=R * bsz * seqlen * model.step_flops(seqlen),
        step_hidden=steps if keep_steps else None,
        gate_logits=torch.stack(gates) if gates else None,
    )


def _packed(model, h, positions, mask, exits: _Exits, keep_steps, gate_grad, on_step, varlen, cache) -> Execution:
    """Forced depth (every token leaves at the same step) and skip execution."""
    R = model.cfg.n_loops
    bsz, seqlen = h.shape[:2]
    active = torch.ones(bsz, seqlen, dtype=torch.bool, device=h.device)
    exit_step = torch.full((bsz, seqlen), R, dtype=torch.long, device=h.device)
    steps: list[torch.Tensor] = []
    gates: list[torch.Tensor] = []
    flops = 0
    # A cache stores the real survivors of each row: in every layout they come first in
    # the row's packed order (right padding), followed by padding tokens and pads.
    view = (lambda r, layout: cache.at(r, layout)) if cache is not None else (lambda r, layout: None)
    for r in range(1, R + 1):
        if bool(active.all()):
            h = model.step(h, positions, cache=view(r, Layout.padded(mask.sum(1))))
            flops += bsz * seqlen * model.step_flops(seqlen)
        elif varlen and bool(active.any()):
            # Row-major order keeps each sequence contiguous and in causal order.
            rows, cols = active.nonzero(as_tuple=True)
            out = model.step(
                h[rows, cols][None],
                positions[rows, cols][None],
                seq_idx=rows[None],
                cache=view(r, Layout.varlen(active, mask)),
            )
            h = h.index_put((rows, cols), out[0])
            flops += rows.numel() * model.step_flops(rows.numel())
        elif bool(active.any()):
            idx, valid = pack_indices(active)
            out = model.step(pack(h, idx), pack(positions, idx), cache=view(r, Layout.padded((active & mask).sum(1))))
            h = scatter(h, out, idx, valid)
            flops += bsz * idx.shape[1] * model.step_flops(idx.shape[1])
        # else: every token has exited; only frozen states remain (kept for keep_steps)
        if keep_steps:
            steps.append(h)
        if r < R:
            a = _gate(model, h, exits, gate_grad, gates if keep_steps else None)
            leaving = active & exits.reached(r, a, h)
            exit_step = torch.where(leaving, r, exit_step)
            active = active & ~leaving
            if on_step is not None:
                h = on_step(r, h, active)
            if cache is not None:  # (also when nobody is left: a later decoded token reads the deeper loops)
                rows, cols = (leaving & mask).nonzero(as_tuple=True)  # row-major: each row's in causal order
                cache.fill_exited(model, h[rows, cols], rows, positions[rows, cols], r)
        if not keep_steps and not bool(active.any()):
            break  # nobody left to run and nothing more to record
    executed = float(exit_step[mask].float().mean()) if bool(mask.any()) else 0.0
    return Execution(
        logits=None,
        hidden=h,
        exit_step=exit_step,
        executed_loops=executed,
        backbone_flops=flops,
        step_hidden=steps if keep_steps else None,
        gate_logits=torch.stack(gates) if gates else None,
    )
