"""Exit distributions and training objectives (paper §3, App. A, App. D), and the loss
of one minibatch in each training stage (each registers itself as its stage's loss
in looplab/stages.py with @stage_loss):

pretrain  CE at the final step R (the fixed-loop objective).
stage1    Σ_r π^(r) ℓ^(r) − β H(π) on the dense forward; trains backbone and gate.
chase     with probability ρ the cache-hole branch, else the dense Stage-1 branch:
            threshold holes: skip forward at q ~ D_hole, gate under stop-gradient,
                             CE at each token's realized exit depth;
            depth holes:     a fraction hp of positions exits at a sampled depth
                             (packed out of deeper steps), Stage-1 loss on it.
stage2    only the gate trains (everything else frozen), on detached step losses:
          BCE between 1 − λ^(r) and σ(κ(max(0, ℓ^(r) − ℓ^(r+1)) − γ)).

Shapes: per-step quantities are stacked on dim 0, so λ is (R-1, B, L) for the
non-final steps, π, survival and CDF are (R, B, L), and per-step token losses ℓ are
(R, B, L). `mask` (B, L) marks the positions that count (a target exists); every
mean is over those positions.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from looplab.models.head import attach_gradient, head_weighted_loss, step_token_losses
from looplab.policy import ExitPolicy
from looplab.stages import stage_loss
from looplab.tasks.base import IGNORE_INDEX
from looplab.tracking import EXECUTED_LOOPS, EXIT_ENTROPY, EXIT_PROB, EXPECTED_EXIT_STEP, HOLE_BRANCH, HOLE_Q
from looplab.training.distributed import Rows
from looplab.training.holes import sample_depth_holes, sample_threshold, take_hole_branch

# ---- exit distribution -------------------------------------------------------------


def exit_distribution(lam: torch.Tensor) -> torch.Tensor:
    """π from the instantaneous exit probabilities λ^(1..R-1):
    π^(r) = λ^(r) ∏_{j<r} (1 − λ^(j)) for r < R, π^(R) = ∏_{j<R} (1 − λ^(j))."""
    survival = survival_probs(lam)  # S^(0..R-1)
    return torch.cat([lam * survival[:-1], survival[-1:]], dim=0)


def survival_probs(lam: torch.Tensor) -> torch.Tensor:
    """S^(r) = ∏_{j≤r} (1 − λ^(j)) for r = 0..R-1 (S^(0) = 1): (R, B, L)."""
    ones = torch.ones_like(lam[:1])
    return torch.cat([ones, torch.cumprod(1 - lam, dim=0)], dim=0)


def exit_cdf(pi: torch.Tensor) -> torch.Tensor:
    """F^(r) = Σ_{j≤r} π^(j)."""
    return torch.cumsum(pi, dim=0)


def exit_entropy(pi: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """H(π) = −Σ_r π^(r) log(π^(r) + ε), per token: (B, L)."""
    return -(pi * torch.log(pi + eps)).sum(dim=0)


def expected_exit_step(pi: torch.Tensor) -> torch.Tensor:
    """E[z] = Σ_r r π^(r), per token: (B, L)."""
    steps = torch.arange(1, pi.shape[0] + 1, dtype=pi.dtype, device=pi.device)
    return (pi * steps.view(-1, *([1] * (pi.dim() - 1)))).sum(dim=0)


# ---- losses ------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (…, B, L) over masked positions (0 with a graph when none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def final_loop_loss(losses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Pre-training: mean next-token CE at step R only, from that step's per-token
    losses (B, L) (models/head.py: token_losses of its logits, or the chunked head)."""
    return masked_mean(losses, targets != IGNORE_INDEX)


def final_loop_weights(targets: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """∂final_loop_loss/∂ℓ per token (the loss is linear in ℓ): 1/M at the M
    positions with a target, 0 elsewhere, in the losses' dtype. The chunked head
    (models/head.py) takes these coefficients up front."""
    mask = targets != IGNORE_INDEX
    return mask.to(dtype) / mask.sum().clamp(min=1)


def stage1_weights(lam: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """∂stage1_loss/∂ℓ^(r) per step and token (the loss is linear in ℓ):
    π^(r) / M at the M masked positions, 0 elsewhere: (R, B, L)."""
    return exit_distribution(lam) * (mask.to(lam.dtype) / mask.sum().clamp(min=1))


def stage1_loss(
    step_losses: torch.Tensor, lam: torch.Tensor, mask: torch.Tensor, beta: float, eps: float = 1e-8
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Stage-1: mean over tokens of Σ_r π^(r) ℓ^(r) − β H(π). Returns the loss and
    diagnostics (exit entropy, expected exit step) as detached scalars."""
    pi = exit_distribution(lam)
    entropy = exit_entropy(pi, eps)
    expected = (pi * step_losses).sum(dim=0)
    loss = masked_mean(expected - beta * entropy, mask)
    return loss, {
        EXIT_ENTROPY: masked_mean(entropy, mask).detach(),
        EXPECTED_EXIT_STEP: masked_mean(expected_exit_step(pi), mask).detach(),
    }


def stage2_targets(step_losses: torch.Tensor, kappa: float = 50.0, gamma: float = 0.005) -> torch.Tensor:
    """w^(r) = σ(κ (max(0, ℓ^(r) − ℓ^(r+1)) − γ)) for r < R, from detached losses:
    close to 1 where another step still pays (continue), close to 0 where not."""
    losses = step_losses.detach()
    improvement = (losses[:-1] - losses[1:]).clamp(min=0)
    return torch.sigmoid(kappa * (improvement - gamma))


def stage2_loss(
    step_losses: torch.Tensor, gate_logits: torch.Tensor, mask: torch.Tensor, kappa: float = 50.0, gamma: float = 0.005
) -> torch.Tensor:
    """Stage-2: BCE between the continuation probability 1 − λ^(r) and w^(r),
    averaged over tokens and over the R − 1 non-final steps. Takes the gate's
    logits a (λ = σ(a), so 1 − λ = σ(−a)) to stay finite where λ saturates."""
    w = stage2_targets(step_losses, kappa, gamma)
    bce = F.binary_cross_entropy_with_logits(-gate_logits.float(), w.float(), reduction="none")
    return masked_mean(bce.mean(dim=0), mask)


def hole_loss(losses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cache-hole branch: mean CE of the readout at each token's realized exit depth,
    from its per-token losses (B, L) (a skip execution's hidden state is exactly
    that readout's input)."""
    return final_loop_loss(losses, targets)


# ---- the loss of one minibatch, per stage -----------------------------------------------
# Each takes (model, batch, cfg, step, rows) and returns (loss, diagnostics as scalars):
# the mean over the minibatch's target tokens. Deterministic in (cfg.train.seed, step).
# `batch` is rows [start, stop) of the step's global batch (distributed.Rows: a rank's
# share under data parallelism, a micro-batch of it with accumulation): every part draws
# the same hole branch and the global batch's depth holes, then keeps its rows (rows None:
# the minibatch is the whole global batch).
#
# Every loss reads hidden states through models/head.py's chunked head (readout="none":
# the execution computes no logits), so no stage holds full (B, L, V) logits, let alone
# R of them. The trained losses are linear in the per-token CE with coefficients known
# before the head runs (1/M; π^(r)/M), so the head takes them up front and forms its
# gradient while each chunk's softmax exists; the loss's value comes from the functions
# above on the detached per-token losses, and attach_gradient adds the head's gradient.


def step_losses(model, out, targets: torch.Tensor) -> torch.Tensor:
    """ℓ^(r) per token for every step of an execution run with all_steps: (R, B, L)."""
    return step_token_losses(model, out.step_hidden, targets)


def _final_step(model, out, targets: torch.Tensor, objective) -> torch.Tensor:
    """objective(per-token losses, targets) of the readout of out.hidden, with the
    head's gradient (objective: final_loop_loss or hole_loss, both mean CE)."""
    weights = final_loop_weights(targets, torch.promote_types(out.hidden.dtype, torch.float32))
    weighted, losses = head_weighted_loss(model, out.hidden, targets, weights)
    return attach_gradient(objective(losses, targets), weighted)


@stage_loss("pretrain")
def pretrain_minibatch(model, batch, cfg, step, rows):
    return _final_step(model, model(batch.ids, readout="none"), batch.targets, final_loop_loss), {}


stage_loss("pretrain_more")(pretrain_minibatch)  # the step-matched control: the same loss, more steps


def _stage1(model, batch, cfg, policy: ExitPolicy):
    out = model(batch.ids, policy, all_steps=True, readout="none")
    mask = batch.targets != IGNORE_INDEX
    lam = torch.sigmoid(out.gate_logits)
    weighted, losses = head_weighted_loss(model, out.step_hidden, batch.targets, stage1_weights(lam.detach(), mask))
    loss, diag = stage1_loss(losses, lam, mask, cfg.exit.beta, cfg.exit.entropy_eps)  # π's gradient
    return attach_gradient(loss, weighted), diag


# What a progress line of the losses that train the gate under Stage-1 prints beside the loss.
EXIT_SHOWN = (EXIT_ENTROPY, EXPECTED_EXIT_STEP)


@stage_loss("stage1", shows=EXIT_SHOWN)
def stage1_minibatch(model, batch, cfg, step, rows):
    # The dense forward: every token runs all R steps, and the loss weighs every step by π.
    return _stage1(model, batch, cfg, ExitPolicy.full())


stage_loss("stage1_more", shows=EXIT_SHOWN)(stage1_minibatch)  # Ouro's step-matched control: Stage-1 without holes


@stage_loss("chase", shows=EXIT_SHOWN)
def chase_minibatch(model, batch, cfg, step, rows):
    rng = np.random.default_rng([cfg.train.seed, step, 1])
    if not take_hole_branch(rng, cfg.hole):
        loss, diag = stage1_minibatch(model, batch, cfg, step, rows)
        return loss, {**diag, HOLE_BRANCH: 0.0}
    if cfg.hole.sampler == "threshold":
        q = sample_threshold(rng, cfg.hole)
        out = model(batch.ids, ExitPolicy.skip(q), gate_grad=False, readout="none")
        loss = _final_step(model, out, batch.targets, hole_loss)
        return loss, {HOLE_BRANCH: 1.0, HOLE_Q: q, EXECUTED_LOOPS: out.executed_loops}
    rows = rows or Rows.whole(len(batch))
    exit_at = sample_depth_holes(rng, cfg.hole, (rows.total, batch.ids.shape[1]), cfg.model.n_loops)
    exit_at = exit_at[rows.start : rows.stop].to(batch.ids.device)
    loss, diag = _stage1(model, batch, cfg, ExitPolicy.given(exit_at))
    return loss, {**diag, HOLE_BRANCH: 1.0, EXECUTED_LOOPS: float(exit_at.float().mean())}


@stage_loss("stage2")
def stage2_minibatch(model, batch, cfg, step, rows):
    with torch.no_grad():  # frozen model: losses and states carry no graph
        out = model(batch.ids, ExitPolicy.full(), all_steps=True, readout="none")
        losses = step_losses(model, out, batch.targets)
    gate_logits = torch.stack([model.exit_logit(h) for h in out.step_hidden[:-1]])
    mask = batch.targets != IGNORE_INDEX
    loss = stage2_loss(losses, gate_logits, mask, cfg.exit.kappa, cfg.exit.gamma)
    return loss, {EXIT_PROB: float(torch.sigmoid(gate_logits.detach())[:, mask].mean())}
