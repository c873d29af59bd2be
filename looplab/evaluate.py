"""Evaluation of a looped model on a task's fixed evaluation set, under dense,
skip and forced-depth execution, and threshold sweeps over q."""

from __future__ import annotations

import contextlib
import math

import torch

from looplab.objectives import token_losses
from looplab.tasks.base import IGNORE_INDEX, Batch, exact_match_counts

DEFAULT_QS = (0.2, 0.4, 0.6, 0.8, 1.0)


def autocast_context(device: torch.device, precision: str):
    """bf16 autocast on CUDA by default, plain fp32 on CPU; 'bf16' forces it."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()



@torch.no_grad()
def evaluate_execution(model, batch: Batch, *, mode: str = "forced", q: float | None = None,
                       depth: int | None = None, batch_size: int = 64, device: torch.device | str = "cpu",
                       precision: str = "auto") -> dict[str, float]:
    """Exact match, mean CE and perplexity at the target positions under one
    execution mode, with the mean exit step (at target positions), the executed
    loops (mean over all tokens) and the backbone FLOPs run per token."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = exit_sum = 0.0
    loops_sum = flops = tokens = 0
    for start in range(0, len(batch), batch_size):
        part = batch.slice(start, start + batch_size).to(device)
        with autocast_context(device, precision):
            out = model(part.ids, mode=mode, q=q, depth=depth)
        mask = part.targets != IGNORE_INDEX
        c, n = exact_match_counts(out.logits, part.targets)
        correct, total = correct + c, total + n
        loss_sum += float(token_losses(out.logits, part.targets).sum())
        exit_sum += float(out.exit_step[mask].float().sum())
        loops_sum += out.executed_loops * part.ids.numel()
        flops += out.backbone_flops
        tokens += part.ids.numel()
    model.train(was_training)
    if total == 0:
        raise ValueError("evaluation set has no target positions")
    loss = loss_sum / total
    forced_depth = (depth or model.cfg.n_loops) if mode == "forced" else None
    return {"mode": mode, "q": q, "depth": forced_depth, "accuracy": correct / total,
            "loss": loss, "ppl": math.exp(min(loss, 50.0)), "mean_exit_step": exit_sum / total,
            "executed_loops": loops_sum / tokens, "backbone_flops_per_token": flops / tokens, "n": total}


def evaluate_exact_match(model, batch: Batch, **kw) -> dict[str, float]:
    """The fixed-loop evaluation: every token runs all R steps, readout at R."""
    return evaluate_execution(model, batch, mode="forced", **kw)


def threshold_sweep(model, batch: Batch, *, qs=DEFAULT_QS, modes=("dense", "skip"), forced: bool = True,
                    **kw) -> list[dict[str, float]]:
    """One record per (mode, q) and, with forced, per forced depth 1..R."""
    records = [evaluate_execution(model, batch, mode=mode, q=q, **kw) for mode in modes for q in qs]
    if forced:
        records += [evaluate_execution(model, batch, mode="forced", depth=r, **kw)
                    for r in range(1, model.cfg.n_loops + 1)]
    return records


def format_table(records: list[dict]) -> str:
    rows = ["mode    q     depth  exit   loops  ppl        acc", "-" * 52]
    for r in records:
        q = "" if r["q"] is None else f"{r['q']:.2f}"
        depth = "" if r.get("depth") is None else str(r["depth"])
        rows.append(f"{r['mode']:7s} {q:5s} {depth:6s} {r['mean_exit_step']:5.2f}  {r['executed_loops']:5.2f}  "
                    f"{r['ppl']:9.4f}  {r['accuracy']:.4f}")
    return "\n".join(rows)
