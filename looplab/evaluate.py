"""Evaluation of a looped model on a task's fixed evaluation set."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from looplab.tasks.base import IGNORE_INDEX, Batch, exact_match_counts


def autocast_context(device: torch.device, precision: str):
    """bf16 autocast on CUDA by default, plain fp32 on CPU; 'bf16' forces it."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def masked_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions with a target (0 with a graph if none)."""
    if not (targets != IGNORE_INDEX).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


@torch.no_grad()
def evaluate_exact_match(model, batch: Batch, *, batch_size: int = 64, device: torch.device | str = "cpu",
                         precision: str = "auto") -> dict[str, float]:
    """Exact match and mean CE at the target positions, final-step readout."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for start in range(0, len(batch), batch_size):
        part = batch.slice(start, start + batch_size).to(device)
        with autocast_context(device, precision):
            logits = model(part.ids).logits
        c, n = exact_match_counts(logits, part.targets)
        correct, total = correct + c, total + n
        loss_sum += float(masked_ce(logits, part.targets)) * n
    model.train(was_training)
    if total == 0:
        raise ValueError("evaluation set has no target positions")
    return {"accuracy": correct / total, "loss": loss_sum / total, "n": total}
