"""Executing a looped model: dense, skip (survivor packing) and forced depth.

dense   every token runs all R steps; the gate only picks the readout step z(q).
skip    at step r only the active tokens A_r run: each sequence's survivors are
        packed in their original causal order (right-padded to the batch's largest
        survivor count), stepped with their true positions, and scattered back.
        Exited tokens keep their frozen hidden state and are absent from every
        deeper conv window, SSM scan and attention. Readout: the frozen state.
forced  every token runs exactly `depth` steps (the fixed-loop ablation).

Skip packs survivors in one of two layouts: "padded" (each row's survivors,
right-padded to the batch's largest count: B × max survivors of work; works for
every backbone) or "varlen" (all survivors of the batch in one row, separated by a
per-token sequence index: work follows the total survivor count, which closes the
ragged-halting gap; Mamba-2-only backbones). "auto" picks varlen where it applies.

Exits are decided either by the gate and a threshold q (the cumulative exit
probability reaches q) or by a given per-token exit step (`exit_at`: CHASE's depth
holes, oracle patterns for benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

StepHook = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Execution:
    logits: torch.Tensor | None  # (B, L, V) readout of each token's state at its exit step; (B, 1, V) for
    # readout="last"; None for readout="none"
    hidden: torch.Tensor  # (B, L, d): that state
    exit_step: torch.Tensor  # (B, L) int64 in 1..R
    executed_loops: float  # mean over real tokens of the steps each token ran
    backbone_flops: int  # backbone forward FLOPs actually run, padding included
    step_hidden: list[torch.Tensor] | None = None  # h^(r), r = 1..R (frozen after exit under skip)
    gate_logits: torch.Tensor | None = None  # (R-1, B, L) gate logits on h^(1..R-1)
    step_logits: list[torch.Tensor] | None = None  # logits of h^(r), when asked for


class ExitTracker:
    """Accumulates the exit CDF step by step, F^(r) = F^(r-1) + S^(r-1) λ^(r), with
    the same arithmetic in dense and skip execution so both decide alike."""

    def __init__(self, like: torch.Tensor, q: float):
        self.q = q
        self.survival = torch.ones_like(like, dtype=torch.float32)
        self.cdf = torch.zeros_like(like, dtype=torch.float32)

    def update(self, gate_logit: torch.Tensor) -> torch.Tensor:
        lam = torch.sigmoid(gate_logit.detach().float())
        self.cdf = self.cdf + self.survival * lam
        self.survival = self.survival * (1 - lam)
        return self.cdf >= self.q


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


def execute(model, ids: torch.Tensor, *, mode: str = "forced", q: float | None = None, depth: int | None = None,
            exit_at: torch.Tensor | None = None, positions: torch.Tensor | None = None,
            mask: torch.Tensor | None = None, gate_grad: bool = True, keep_steps: bool = False,
            on_step: StepHook | None = None, packing: str = "auto", readout: str = "all") -> Execution:
    """Run `model` (a LoopedLM) on ids (B, L). See the module docstring for modes.

    q        threshold for gate-driven exits (dense: readout step; skip: real exits).
    depth    forced mode: the number of steps every token runs (default R).
    exit_at  (B, L) exit steps in 1..R that replace the gate's decisions (skip/dense).
    mask     (B, L) real tokens, for the executed-loops mean (default: all).
    gate_grad  False puts the gate under stop-gradient (CHASE's hole branch).
    keep_steps keep every step's hidden state and gate logits (training objectives).
    on_step  hook(r, h, active) -> h after step r's exits are decided (skip/forced);
             researchers use it to inspect or perturb states, tests to prove exited
             tokens are invisible to deeper steps.
    packing  auto | padded | varlen: the survivor layout of skip (module docstring).
    readout  all: logits at every position; last: only at the last one (prefill,
             which needs the next-token distribution of the prompt's end only);
             none: no logits (training reads the hidden states through the
             chunked head of models/head.py instead of full logits).
    """
    R = model.cfg.n_loops
    bsz, seqlen = ids.shape
    if positions is None:
        positions = torch.arange(seqlen, device=ids.device).expand(bsz, seqlen)
    if mask is None:
        mask = torch.ones(bsz, seqlen, dtype=torch.bool, device=ids.device)
    _check_args(mode, q, depth, exit_at, R, ids)
    mamba_only = model.cfg.arch == "mamba2"
    if packing not in ("auto", "padded", "varlen") or (packing == "varlen" and not mamba_only):
        raise ValueError(f"packing={packing!r} is invalid; allowed: auto | padded"
                         + (" | varlen" if mamba_only else " (varlen needs arch='mamba2')"))
    varlen = packing == "varlen" or (packing == "auto" and mamba_only)
    if readout not in ("all", "last", "none"):
        raise ValueError(f"readout={readout!r} is invalid; allowed: all | last | none")
    if mode == "forced":
        exit_at = torch.full_like(ids, R if depth is None else depth)

    h = model.embed(ids)
    if mode == "dense":
        out = _dense(model, h, positions, mask, q, exit_at, keep_steps, gate_grad)
    else:
        out = _packed(model, h, positions, mask, q, exit_at, keep_steps, gate_grad, on_step, varlen)
    if readout != "none":
        out.logits = model.logits(out.hidden if readout == "all" else out.hidden[:, -1:])
    return out


def _check_args(mode, q, depth, exit_at, R, ids) -> None:
    if mode not in ("dense", "skip", "forced"):
        raise ValueError(f"mode={mode!r} is invalid; allowed: dense | skip | forced")
    if q is not None and not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r} is invalid; allowed: a float in [0, 1]")
    if mode == "forced" and depth is not None and not (isinstance(depth, int) and 1 <= depth <= R):
        raise ValueError(f"depth={depth!r} is invalid; allowed: an integer in [1, R={R}]")
    if mode == "skip" and q is None and exit_at is None:
        raise ValueError("mode='skip' needs q (gate-driven exits) or exit_at (given exit steps)")
    if exit_at is not None and mode != "forced":
        if exit_at.shape != ids.shape or int(exit_at.min()) < 1 or int(exit_at.max()) > R:
            raise ValueError(f"exit_at must be (B, L) = {tuple(ids.shape)} with steps in [1, R={R}]")


def _gate(model, h: torch.Tensor, gate_grad: bool) -> torch.Tensor:
    with torch.set_grad_enabled(gate_grad and torch.is_grad_enabled()):
        return model.exit_logit(h)


def _dense(model, h, positions, mask, q, exit_at, keep_steps, gate_grad) -> Execution:
    """All R steps for every token; the readout buffer takes h^(r) for the tokens
    whose exit step is r, so memory stays O(1) in the number of loops (the same
    readout policy as skip; only the deeper steps of exited tokens differ)."""
    R = model.cfg.n_loops
    bsz, seqlen = h.shape[:2]
    steps, gates = [], []
    exit_step = exit_at.long() if exit_at is not None else torch.full(
        (bsz, seqlen), R, dtype=torch.long, device=h.device)
    tracker = ExitTracker(exit_step, q) if (q is not None and exit_at is None) else None
    readout = h
    for r in range(1, R + 1):
        h = model.step(h, positions)
        if keep_steps:
            steps.append(h)
        if r < R and (tracker is not None or keep_steps):
            a = _gate(model, h, gate_grad)
            if keep_steps:
                gates.append(a)
            if tracker is not None:
                undecided = exit_step == R  # a token's first step reaching q is its exit
                exit_step = torch.where(tracker.update(a) & undecided, r, exit_step)
        readout = torch.where((exit_step == r).unsqueeze(-1), h, readout)
    return Execution(
        logits=None, hidden=readout, exit_step=exit_step, executed_loops=float(R),
        backbone_flops=R * bsz * seqlen * model.step_flops(seqlen),
        step_hidden=steps if keep_steps else None,
        gate_logits=torch.stack(gates) if gates else None)


def _packed(model, h, positions, mask, q, exit_at, keep_steps, gate_grad, on_step, varlen) -> Execution:
    R = model.cfg.n_loops
    bsz, seqlen = h.shape[:2]
    active = torch.ones(bsz, seqlen, dtype=torch.bool, device=h.device)
    exit_step = torch.full((bsz, seqlen), R, dtype=torch.long, device=h.device)
    tracker = ExitTracker(exit_step, q) if exit_at is None else None
    steps, gates, flops = [], [], 0
    for r in range(1, R + 1):
        if bool(active.all()):
            h = model.step(h, positions)
            flops += bsz * seqlen * model.step_flops(seqlen)
        elif varlen and bool(active.any()):
            # Row-major order keeps each sequence contiguous and in causal order.
            rows, cols = active.nonzero(as_tuple=True)
            out = model.step(h[rows, cols][None], positions[rows, cols][None], seq_idx=rows[None])
            h = h.index_put((rows, cols), out[0])
            flops += rows.numel() * model.step_flops(rows.numel())
        elif bool(active.any()):
            idx, valid = pack_indices(active)
            out = model.step(pack(h, idx), pack(positions, idx))
            h = scatter(h, out, idx, valid)
            flops += bsz * idx.shape[1] * model.step_flops(idx.shape[1])
        # else: every token has exited; only frozen states remain (kept for keep_steps)
        if keep_steps:
            steps.append(h)
        if r < R:
            a = _gate(model, h, gate_grad) if (tracker is not None or keep_steps) else None
            if a is not None and keep_steps:
                gates.append(a)
            leaving = active & (exit_at == r if tracker is None else tracker.update(a))
            exit_step = torch.where(leaving, r, exit_step)
            active = active & ~leaving
            if on_step is not None:
                h = on_step(r, h, active)
        if not keep_steps and not bool(active.any()):
            break  # nobody left to run and nothing more to record
    executed = float(exit_step[mask].float().mean()) if bool(mask.any()) else 0.0
    return Execution(
        logits=None, hidden=h, exit_step=exit_step, executed_loops=executed, backbone_flops=flops,
        step_hidden=steps if keep_steps else None,
        gate_logits=torch.stack(gates) if gates else None)
