"""The loss of one minibatch in each training stage (paper §3, App. A, App. E).

pretrain  CE at the final step R (the fixed-loop objective).
stage1    Σ_r π^(r) ℓ^(r) − β H(π) on the dense forward; trains backbone and gate.
chase     with probability ρ the cache-hole branch, else the dense Stage-1 branch:
            threshold holes: skip forward at q ~ D_hole, gate under stop-gradient,
                             CE at each token's realized exit depth;
            depth holes:     a fraction hp of positions exits at a sampled depth
                             (packed out of deeper steps), Stage-1 loss on it.
stage2    only the gate trains (everything else frozen), on detached step losses:
          BCE between 1 − λ^(r) and σ(κ(max(0, ℓ^(r) − ℓ^(r+1)) − γ)).
"""

from __future__ import annotations

import numpy as np
import torch

from looplab.config import ExperimentConfig
from looplab.distributed import Shard
from looplab.holes import sample_depth_holes, sample_threshold, take_hole_branch
from looplab.models.head import attach_gradient, head_weighted_loss, step_token_losses
from looplab.objectives import (final_loop_loss, final_loop_weights, hole_loss, stage1_loss, stage1_weights,
                                stage2_loss)
from looplab.tasks.base import IGNORE_INDEX, Batch


def prepare_model(model: torch.nn.Module, cfg: ExperimentConfig) -> None:
    """Stage-2 freezes everything but the gate; other stages train it all."""
    gate_only = cfg.stage == "stage2"
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("exit_gate.") or not gate_only)


# Every loss below reads hidden states through models/head.py's chunked head
# (readout="none": the execution computes no logits), so no stage holds full
# (B, L, V) logits, let alone R of them. The trained losses are linear in the
# per-token CE with coefficients known before the head runs (1/M; π^(r)/M), so
# the head gets them up front and computes its gradient while each chunk's
# softmax exists; the loss's value comes from objectives.py on the detached
# per-token losses, and attach_gradient adds the head's part of the gradient.

def step_losses(model, out, targets: torch.Tensor) -> torch.Tensor:
    """ℓ^(r) per token for every step of an execution run with all_steps: (R, B, L)."""
    return step_token_losses(model, out.step_hidden, targets)


def _stage1(model, batch: Batch, cfg: ExperimentConfig, **execution) -> tuple[torch.Tensor, dict]:
    out = model(batch.ids, all_steps=True, readout="none", **execution)
    mask = batch.targets != IGNORE_INDEX
    lam = torch.sigmoid(out.gate_logits)
    weighted, losses = head_weighted_loss(model, out.step_hidden, batch.targets, stage1_weights(lam.detach(), mask))
    loss, diag = stage1_loss(losses, lam, mask, cfg.exit.beta, cfg.exit.entropy_eps)  # π's gradient
    return attach_gradient(loss, weighted), diag


def _final_step(model, out, targets: torch.Tensor, objective) -> torch.Tensor:
    """objective(per-token losses, targets) of the readout of out.hidden, with the
    head's gradient (objective: final_loop_loss or hole_loss, both mean CE)."""
    weights = final_loop_weights(targets, torch.promote_types(out.hidden.dtype, torch.float32))
    weighted, losses = head_weighted_loss(model, out.hidden, targets, weights)
    return attach_gradient(objective(losses, targets), weighted)


def minibatch_loss(model, batch: Batch, cfg: ExperimentConfig, step: int,
                   shard: Shard = Shard()) -> tuple[torch.Tensor, dict]:
    """The training loss of `batch` at optimizer step `step`, with diagnostics
    (scalars) to log. Deterministic in (cfg.train.seed, step). Under data
    parallelism `batch` is shard's rows of the global batch: every rank draws the
    same hole branch and the global batch's depth holes, then keeps its rows."""
    if cfg.stage == "pretrain":
        return _final_step(model, model(batch.ids, readout="none"), batch.targets, final_loop_loss), {}
    if cfg.stage == "stage1":
        return _stage1(model, batch, cfg, mode="dense")
    if cfg.stage == "stage2":
        return _stage2(model, batch, cfg)
    # chase
    rng = np.random.default_rng([cfg.train.seed, step, 1])
    if not take_hole_branch(rng, cfg.hole):
        loss, diag = _stage1(model, batch, cfg, mode="dense")
        return loss, {**diag, "hole_branch": 0.0}
    if cfg.hole.sampler == "threshold":
        q = sample_threshold(rng, cfg.hole)
        out = model(batch.ids, mode="skip", q=q, gate_grad=False, readout="none")
        loss = _final_step(model, out, batch.targets, hole_loss)
        return loss, {"hole_branch": 1.0, "hole_q": q, "executed_loops": out.executed_loops}
    rows, seq = batch.ids.shape
    exit_at = sample_depth_holes(rng, cfg.hole, (rows * shard.world, seq), cfg.model.n_loops)
    exit_at = exit_at[shard.rank * rows:(shard.rank + 1) * rows].to(batch.ids.device)
    loss, diag = _stage1(model, batch, cfg, mode="skip", exit_at=exit_at)
    return loss, {**diag, "hole_branch": 1.0, "executed_loops": float(exit_at.float().mean())}


def _stage2(model, batch: Batch, cfg: ExperimentConfig) -> tuple[torch.Tensor, dict]:
    with torch.no_grad():  # frozen model: losses and states carry no graph
        out = model(batch.ids, mode="dense", all_steps=True, readout="none")
        losses = step_losses(model, out, batch.targets)
    gate_logits = torch.stack([model.exit_logit(h) for h in out.step_hidden[:-1]])
    mask = batch.targets != IGNORE_INDEX
    loss = stage2_loss(losses, gate_logits, mask, cfg.exit.kappa, cfg.exit.gamma)
    return loss, {"exit_prob": float(torch.sigmoid(gate_logits.detach())[:, mask].mean())}
