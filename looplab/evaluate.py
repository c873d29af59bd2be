"""Evaluation of a looped model on a task's fixed evaluation set, under dense,
skip and forced-depth execution, and threshold sweeps over q."""

from __future__ import annotations

import contextlib
import math

import torch

from looplab.models.execution import ExitTracker, execute
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
    """One record per (mode, q) and, with forced, per forced depth 1..R.

    Dense execution runs every step for every token whatever q is, and forced depth
    d reads out the state every token has after step d: all of them are readouts of
    one dense pass, so they come from one (evaluate_readouts). Skip execution changes
    the states themselves and runs once per q."""
    dense_qs = list(qs) if "dense" in modes else []
    shared = evaluate_readouts(model, batch, qs=dense_qs, forced=forced, **kw) if (dense_qs or forced) else []
    skip = [evaluate_execution(model, batch, mode="skip", q=q, **kw) for q in qs] if "skip" in modes else []
    dense = [r for r in shared if r["mode"] == "dense"]
    return dense + skip + [r for r in shared if r["mode"] == "forced"]


@torch.no_grad()
def evaluate_readouts(model, batch: Batch, *, qs=DEFAULT_QS, forced: bool = True, batch_size: int = 64,
                      device: torch.device | str = "cpu", precision: str = "auto") -> list[dict[str, float]]:
    """The records evaluate_execution gives for dense execution at each q and for
    forced depths 1..R, from one dense pass that keeps every step: per step, each
    target's CE and correctness; a policy then picks one step per token."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    R = model.cfg.n_loops
    policies = [("dense", q) for q in qs] + ([("forced", d) for d in range(1, R + 1)] if forced else [])
    sums = {p: {"correct": 0, "loss": 0.0, "exit": 0.0} for p in policies}
    total = 0
    for start in range(0, len(batch), batch_size):
        part = batch.slice(start, start + batch_size).to(device)
        with autocast_context(device, precision):
            out = execute(model, part.ids, mode="dense", keep_steps=True, readout="last")
            mask = part.targets != IGNORE_INDEX
            per_step_loss, per_step_correct = [], []
            for h in out.step_hidden:  # one LM-head pass per step, reduced at once: no (R, B, L, V) buffer
                logits = model.logits(h)
                per_step_loss.append(token_losses(logits, part.targets).float())
                per_step_correct.append(logits.argmax(dim=-1) == part.targets)
        losses, corrects = torch.stack(per_step_loss), torch.stack(per_step_correct)  # (R, B, L)
        for policy in policies:
            mode, value = policy
            if mode == "forced":
                exit_step = torch.full_like(part.ids, value)
            else:
                exit_step = dense_exit_steps(out.gate_logits, value, R)
            pick = (exit_step - 1).unsqueeze(0)
            acc = sums[policy]
            acc["loss"] += float(losses.gather(0, pick)[0][mask].sum())
            acc["correct"] += int(corrects.gather(0, pick)[0][mask].sum())
            acc["exit"] += float(exit_step[mask].float().sum())
        total += int(mask.sum())
    model.train(was_training)
    if total == 0:
        raise ValueError("evaluation set has no target positions")
    # Every token of a policy runs the same loops: dense all R (its exit only picks the
    # readout), forced d its d; every sequence of the batch has the same length.
    step_flops = model.step_flops(batch.ids.shape[1])
    records = []
    for (mode, value), acc in sums.items():
        loops = value if mode == "forced" else R
        loss = acc["loss"] / total
        records.append({"mode": mode, "q": value if mode == "dense" else None,
                        "depth": value if mode == "forced" else None, "accuracy": acc["correct"] / total,
                        "loss": loss, "ppl": math.exp(min(loss, 50.0)), "mean_exit_step": acc["exit"] / total,
                        "executed_loops": float(loops), "backbone_flops_per_token": float(loops * step_flops),
                        "n": total})
    return records


def dense_exit_steps(gate_logits: torch.Tensor, q: float, n_loops: int) -> torch.Tensor:
    """Each token's exit step under threshold q from its gate logits (R-1, B, L):
    the first step whose exit CDF reaches q, else R (the rule ExitTracker applies)."""
    tracker = ExitTracker(gate_logits[0], q)
    exit_step = torch.full(gate_logits.shape[1:], n_loops, dtype=torch.long, device=gate_logits.device)
    for r in range(1, n_loops):
        exit_step = torch.where(tracker.update(gate_logits[r - 1]) & (exit_step == n_loops), r, exit_step)
    return exit_step


def format_table(records: list[dict]) -> str:
    rows = ["mode    q     depth  exit   loops  ppl        acc", "-" * 52]
    for r in records:
        q = "" if r["q"] is None else f"{r['q']:.2f}"
        depth = "" if r.get("depth") is None else str(r["depth"])
        rows.append(f"{r['mode']:7s} {q:5s} {depth:6s} {r['mean_exit_step']:5.2f}  {r['executed_loops']:5.2f}  "
                    f"{r['ppl']:9.4f}  {r['accuracy']:.4f}")
    return "\n".join(rows)
