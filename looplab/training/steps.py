"""One optimizer step of a stage: the learning-rate schedule, AdamW, the gradient
accumulated over micro-batches and ranks, and a step on its own for what measures one
(the dry run's probe, looplab doctor, the benchmarks).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from looplab.checkpoint import model_from_config
from looplab.config import ExperimentConfig, TrainConfig
from looplab.devices import autocast_context
from looplab.models.compiled import compile_backbone, compiles
from looplab.stages import get_stage
from looplab.tasks.base import IGNORE_INDEX, Batch
from looplab.training import objectives  # noqa: F401 - the built-in stages' losses register themselves on import
from looplab.training.distributed import Shard


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup to cfg.lr
    over warmup_steps, then cosine decay to min_lr_ratio·lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    span = max(1, cfg.steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: norms, biases and the SSM's
    A_log / D / dt_bias (flagged _no_weight_decay, as in mamba-ssm) are not decayed.
    A compiled run (train.compile on `device`) takes torch's fused AdamW kernel: one
    pass over each parameter instead of the multi-tensor loop's several (4x faster on a
    CPU: docs/benchmarks.md), the same update to float rounding. Eager runs
    keep the loop: the miniature's protocol was fixed with its floats."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = compiles(cfg.compile, device) or None  # None: torch's default, the multi-tensor loop
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=fused)


def ready_to_train(model, cfg: ExperimentConfig, device: torch.device) -> None:
    """The model on its device as its stage trains it: activation checkpointing, the
    backbone compiled where train.compile says so, and gradients for the parameters the
    stage trains alone (Stage-2: the gate)."""
    model.to(device)
    model.checkpoint_steps = cfg.train.activation_checkpointing
    compile_backbone(model, cfg.train.compile, device)
    stage = get_stage(cfg.stage)
    for name, p in model.named_parameters():
        p.requires_grad_(stage.trainable(name))


def accumulate_gradients(
    model, stage, batch: Batch, cfg: ExperimentConfig, step: int, shard: Shard, device
) -> tuple[float, dict[str, float]]:
    """Forward and backward this rank's rows of the global batch, micro_batch_size rows
    at a time, into the parameters' .grad. Each part's loss (a mean over its target
    tokens) weighs by its share of the global batch's target tokens, times the world
    size that Shard.average_gradients divides by: the gradient is that of the whole
    batch's token mean, whatever the split into ranks and micro-batches. Returns this
    rank's weighted loss and diagnostics, which Shard.average turns into the batch's."""
    n_global = max(int((batch.targets != IGNORE_INDEX).sum()), 1)
    loss_sum, diag_sum = 0.0, dict[str, float]()
    for rows in shard.rows(len(batch)).split(cfg.train.micro_batch_size):
        part = batch.slice(rows.start, rows.stop).to(device)
        weight = shard.world * int((part.targets != IGNORE_INDEX).sum()) / n_global
        with autocast_context(device, cfg.train.precision):
            loss, diag = stage.minibatch_loss(model, part, cfg, step, rows)
        (loss * weight).backward()
        loss_sum += weight * loss.item()
        for k, v in diag.items():
            diag_sum[k] = diag_sum.get(k, 0.0) + weight * float(v)
    return loss_sum, diag_sum


def first_non_finite(model, grads: bool = False) -> str | None:
    """The name of the first parameter whose values (or gradient) hold inf or NaN."""
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is not None and not bool(torch.isfinite(t).all()):
            return name
    return None


def optimizer_step(cfg: ExperimentConfig, device, batch: Batch | None = None) -> tuple[Callable[[], float], Any]:
    """(step, model): a closure running one optimizer step of cfg's stage as train() does
    (its micro-batches, the parameters the stage trains, AdamW) on a fixed batch (default:
    random tokens of the batch's shape), from fresh weights, returning the loss. What
    measures a step's time or memory uses it: a step costs the same whatever the weights
    and tokens hold (the dry run's estimate, looplab doctor, benchmarks/train_memory.py)."""
    device = torch.device(device)
    model = model_from_config(cfg.model, cfg.train.seed)
    ready_to_train(model, cfg, device)
    stage = get_stage(cfg.stage)
    optimizer = make_optimizer(model, cfg.train, device)
    if batch is None:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.train.seq_len + 1), generator=g)
        batch = Batch(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
    shard = Shard.current()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss, _ = accumulate_gradients(model, stage, batch, cfg, 0, shard, device)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # gradients freed: the next step starts where this one did
        return loss

    return step, model
