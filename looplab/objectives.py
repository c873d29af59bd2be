"""Exit distributions and training objectives (paper §3, App. A, App. E).

Shapes: per-step quantities are stacked on dim 0, so λ is (R-1, B, L) for the
non-final steps, π, survival and CDF are (R, B, L), and per-step token losses ℓ are
(R, B, L). `mask` (B, L) marks the positions that count (a target exists); every
mean is over those positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from looplab.tasks.base import IGNORE_INDEX


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


def threshold_exit_step(cdf: torch.Tensor, q: float) -> torch.Tensor:
    """z(q) = min{r : F^(r) ≥ q}, and R if no step reaches q: (B, L) in 1..R."""
    reached = cdf >= q
    reached[-1] = True  # the final step takes whatever is left
    return reached.float().argmax(dim=0) + 1  # argmax returns the first True


# ---- losses ------------------------------------------------------------------------

def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token CE (B, L); 0 where there is no target."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten().clamp(min=0), reduction="none")
    return ce.view(targets.shape) * (targets != IGNORE_INDEX)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (…, B, L) over masked positions (0 with a graph when none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def final_loop_loss(losses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Pre-training: mean next-token CE at step R only, from that step's per-token
    losses (B, L) (token_losses of its logits, or models/head.py's chunked head)."""
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


def stage1_loss(step_losses: torch.Tensor, lam: torch.Tensor, mask: torch.Tensor, beta: float,
                eps: float = 1e-8) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Stage-1: mean over tokens of Σ_r π^(r) ℓ^(r) − β H(π). Returns the loss and
    diagnostics (exit entropy, expected exit step) as detached scalars."""
    pi = exit_distribution(lam)
    entropy = exit_entropy(pi, eps)
    expected = (pi * step_losses).sum(dim=0)
    loss = masked_mean(expected - beta * entropy, mask)
    return loss, {"exit_entropy": masked_mean(entropy, mask).detach(),
                  "expected_exit_step": masked_mean(expected_exit_step(pi), mask).detach()}


def stage2_targets(step_losses: torch.Tensor, kappa: float = 50.0, gamma: float = 0.005) -> torch.Tensor:
    """w^(r) = σ(κ (max(0, ℓ^(r) − ℓ^(r+1)) − γ)) for r < R, from detached losses:
    close to 1 where another step still pays (continue), close to 0 where not."""
    losses = step_losses.detach()
    improvement = (losses[:-1] - losses[1:]).clamp(min=0)
    return torch.sigmoid(kappa * (improvement - gamma))


def stage2_loss(step_losses: torch.Tensor, gate_logits: torch.Tensor, mask: torch.Tensor, kappa: float = 50.0,
                gamma: float = 0.005) -> torch.Tensor:
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
