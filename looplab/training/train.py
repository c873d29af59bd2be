"""One training run of one stage (one process, or data-parallel ranks: see
looplab/training/distributed.py): AdamW, linear warmup then cosine decay to a floor,
gradient clipping, the stage's loss and trained parameters (its entry in
looplab/stages.py), periodic evaluation, and resumable checkpoints.

Batches are a pure function of (seed, step), so a resumed run sees exactly the
batches the uninterrupted run would have seen; with the model and AdamW moments
restored, the loss trajectory continues unchanged. The loop is here; a step is
training/steps.py, the run folder (checkpoints, metrics.jsonl, resuming, divergence)
training/run_folder.py, the evaluation it runs training/stage_evaluation.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from looplab import threads
from looplab.checkpoint import (
    PARENT_WEIGHTS,
    describe_parent,
    experiment_metadata,
    load_weights,
    model_from_config,
    parent_ref,
    read_model_config,
    verify_checkpoint,
    weights_digest,
)
from looplab.config import ConfigError, ExperimentConfig
from looplab.costs.machine import check_training
from looplab.devices import resolve_device
from looplab.models.looped import LoopedLM
from looplab.retrofit import initialise, loads_weights
from looplab.stages import get_stage
from looplab.tasks import make_task
from looplab.tracking import GRAD_NORM, LOSS, LR, TOKENS_PER_S, TRAIN_RECORD
from looplab.training.distributed import Shard
from looplab.training.run_folder import METRICS_FILE, Checkpointer, MetricsLog, start_step
from looplab.training.stage_evaluation import evaluate_stage
from looplab.training.steps import accumulate_gradients, first_non_finite, lr_at, make_optimizer, ready_to_train

PROGRESS_SECONDS = 30.0  # a console progress line at least this often, whatever log_every is


@dataclass
class TrainResult:
    out_dir: Path
    step: int  # optimizer steps completed
    losses: list[float] = field(default_factory=list)  # training loss of each step run in this call
    eval: dict[str, float] = field(default_factory=dict)  # the last evaluation
    stopped: bool = False  # should_stop asked for it before the last step (a checkpoint holds `step`)


def train(
    cfg: ExperimentConfig,
    out_dir: str | Path,
    *,
    resume: bool = True,
    stop_at: int | None = None,
    on_metrics: Callable[[dict[str, Any]], None] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    parent_dir: str | Path | None = None,
    should_stop: Callable[[], bool] | None = None,
    quiet: bool = False,
) -> TrainResult:
    """Train cfg's model on cfg's task with the objective of cfg.stage (the stage
    registry, looplab/stages.py; the losses in looplab/training/objectives.py).

    Resumes from out_dir/checkpoint when it holds a checkpoint of the same config.
    stop_at ends the run after that many optimizer steps (checkpointing first) while
    the schedule still spans cfg.train.steps: an interruption on purpose.
    on_metrics receives every logged record (training and evaluation), on every rank.
    on_progress receives {step, steps, loss, tokens_per_s, eta_s} after every step
    (the sweep's live progress throttles it); on_checkpoint(step, directory) runs after
    each checkpoint is written (rank 0; a sweep uploads it to object storage).
    should_stop is asked after every step (rank 0's answer holds for every rank): when
    it says so, the run checkpoints and returns with result.stopped (a sweep stopped
    by Ctrl-C); running it again resumes from that step.
    parent_dir: where the parent's weights are when not at cfg.parent.checkpoint (a
    local copy of a checkpoint in object storage). Under an initialised torch.distributed
    process group each rank trains its share of every batch; rank 0 alone evaluates and
    writes files (the folder's layout: looplab/training/run_folder.py).
    """
    tc, shard, out = cfg.train, Shard.current(), Path(out_dir)
    shard.check_batch_size(tc.batch_size)
    device = resolve_device(tc.device)
    check_training(cfg, device, ranks=shard.world)  # its time and memory against this machine, before allocating
    task = make_task(cfg.task, tc.seq_len)
    model, parent_weights = _start_model(cfg, parent_dir)
    out.mkdir(parents=True, exist_ok=True)  # only once the task, the model and its parent are fine
    ready_to_train(model, cfg, device)
    optimizer = make_optimizer(model, tc, device)
    log = MetricsLog(out / METRICS_FILE, on_metrics, quiet or not shard.main, write=shard.main)
    start = start_step(out, cfg, model, optimizer, parent_weights, log, resume=resume, main=shard.main, stop_at=stop_at)
    end = tc.steps if stop_at is None else min(tc.steps, stop_at)
    saver = Checkpointer(out, cfg, model, optimizer, parent_weights, start, on_checkpoint, shard.main)
    result, speed, window = TrainResult(out_dir=out, step=start), _Speed(start, end), []
    stage = get_stage(cfg.stage)
    trainable: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]  # fixed (ready_to_train)
    _announce(log, cfg, model, device)
    model.train()
    for step in range(start, end):
        t_step = time.perf_counter()
        batch = task.train_batch(step, tc.batch_size, tc.seq_len, tc.seed, start=tc.data_start)
        loss, means, grad_norm = _optimizer_step(
            model, stage, trainable, optimizer, batch, cfg, step, shard, device, saver
        )
        done = speed.step_done(time.perf_counter() - t_step, batch.ids.numel())  # evaluation, checkpoints excluded
        result.losses.append(loss)
        window.append({LOSS: loss, **means})
        if on_progress is not None:
            on_progress({"step": done, "steps": tc.steps, LOSS: loss, TOKENS_PER_S: speed.rate, "eta_s": speed.eta})
        if done % tc.log_every == 0 or done == end:
            _log_window(log, window, stage, cfg, step, grad_norm, speed)
            window = []
        elif time.monotonic() - log.last_line >= PROGRESS_SECONDS:
            log.say(f"step {done}/{tc.steps} | loss {loss:.4f} | {speed.rate:,.0f} tok/s | eta {speed.eta_text}")
        if tc.eval_every and done % tc.eval_every == 0 and done != tc.steps:
            result.eval = evaluate_stage(model, task, cfg, device, shard, log, done)
        if saver.due(done, shard) and done != end:
            saver.save(done)
        result.step = done
        if should_stop is not None and done != end and shard.broadcast(bool(should_stop())):
            _stop_on_request(saver, log, done, tc.steps)
            result.stopped = True
            return result
    if end == tc.steps:
        result.eval = evaluate_stage(model, task, cfg, device, shard, log, tc.steps)
    if end > start:
        saver.save(end)
        log.say(f"checkpoint: {saver.ckpt}")
    return result


def _announce(log: MetricsLog, cfg: ExperimentConfig, model, device: torch.device) -> None:
    """The run's first lines: what trains, how big, on which device (and a CPU's threads)."""
    log.say(
        f"{cfg.preset or 'custom'} {cfg.stage} [{cfg.stage_key()}]: {cfg.model.arch} {cfg.model.n_layers}⊗"
        f"{cfg.model.n_loops}, {model.num_parameters():,} params, {cfg.train.steps} steps on {device}"
    )
    if device.type == "cpu":
        log.say(threads.current().line())


def _stop_on_request(saver: Checkpointer, log: MetricsLog, done: int, steps: int) -> None:
    """A stop asked for (should_stop): the step checkpointed, unless it just was, and said."""
    if saver.saved_step != done:
        saver.save(done)
    log.say(f"stopped at step {done}/{steps} on request; checkpoint: {saver.ckpt} (running again resumes here)")


def _start_model(cfg: ExperimentConfig, parent_dir: str | Path | None) -> tuple[Any, str | None]:
    """The stage's model at its start, with the weights it starts from (its parent's, a
    Hugging Face checkpoint's, or fresh ones of the seed) and its metadata; and the
    parent weights' digest (None without a parent)."""
    tc = cfg.train
    model = model_from_config(cfg.model, tc.seed)
    retrofitted, parent_weights = None, None
    if cfg.parent is not None:
        parent_weights = load_parent(model, cfg, parent_dir)
    elif tc.init_from and loads_weights(tc.init_from):  # pre-training from a Hugging Face checkpoint's weights
        retrofitted = initialise(model, cfg.model, tc.init_from, tc.init_layers)  # (a continued stage has its parent's)
    model.metadata = experiment_metadata(cfg)
    if retrofitted is not None:  # the source's layers and files' digest: a changed source shows afterwards
        model.metadata["retrofit"] = retrofitted
    if parent_weights is not None:  # which weights it continued: a parent trained again later is told apart
        model.metadata[PARENT_WEIGHTS] = parent_weights
    return model, parent_weights


def _optimizer_step(
    model,
    stage,
    trainable: list[torch.Tensor],
    optimizer,
    batch,
    cfg: ExperimentConfig,
    step: int,
    shard: Shard,
    device,
    saver: Checkpointer,
) -> tuple[float, dict[str, float], float]:
    """One step of the run: (the batch's loss, its diagnostics, the gradient's norm).
    Every rank has the same (averaged) loss and gradients, so every rank stops together
    when one is not finite, before the weights take it."""
    tc = cfg.train
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, tc)
    optimizer.zero_grad(set_to_none=True)
    loss, diag = accumulate_gradients(model, stage, batch, cfg, step, shard, device)
    shard.average_gradients(trainable)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, tc.grad_clip if tc.grad_clip > 0 else math.inf))
    means = shard.average({LOSS: loss, **diag})
    loss_value = means.pop(LOSS)
    if not math.isfinite(loss_value):
        saver.diverged(step, f"the loss is {loss_value}")
    if not math.isfinite(grad_norm):
        saver.diverged(step, f"the gradient of {first_non_finite(model, grads=True)} is not finite")
    optimizer.step()  # only a finite step: the weights (and the next checkpoint) stay finite
    return loss_value, means, grad_norm


class _Speed:
    """Training tokens/s and the time left, over the steps this call ran."""

    def __init__(self, start: int, end: int):
        self.start, self.end, self.done = start, end, start
        self.seconds, self.tokens = 0.0, 0

    def step_done(self, seconds: float, tokens: int) -> int:
        self.seconds, self.tokens, self.done = self.seconds + seconds, self.tokens + tokens, self.done + 1
        return self.done

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def eta(self) -> float:
        return (self.end - self.done) * self.seconds / (self.done - self.start)

    @property
    def eta_text(self) -> str:
        seconds = int(self.eta)
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _log_window(
    log: MetricsLog,
    window: list[dict[str, float]],
    stage,
    cfg: ExperimentConfig,
    step: int,
    grad_norm: float,
    speed: _Speed,
) -> None:
    """The record of a log window (its steps' means) and its line, which shows the
    diagnostics the stage's loss names (Stage.shows)."""
    means, lr = _window_means(window), lr_at(step, cfg.train)
    extra = "".join(f" | {k} {means[k]:.3f}" for k in stage.shows if k in means)
    log.record(
        {
            "kind": TRAIN_RECORD,
            "step": step + 1,
            "stage": cfg.stage,
            **means,
            LR: lr,
            GRAD_NORM: grad_norm,
            TOKENS_PER_S: speed.rate,
        },
        f"step {step + 1}/{cfg.train.steps} | loss {means[LOSS]:.4f}{extra} | lr {lr:.2e}"
        f" | {speed.rate:,.0f} tok/s | eta {speed.eta_text}",
    )


def _window_means(window: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each logged quantity over the steps of a log window that have it
    (the hole-branch diagnostics exist only on holed minibatches)."""
    keys = {k for rec in window for k in rec}
    return {k: sum(rec[k] for rec in window if k in rec) / sum(k in rec for rec in window) for k in sorted(keys)}


def load_parent(model: LoopedLM, cfg: ExperimentConfig, directory: str | Path | None = None) -> str:
    """Start from the parent stage's weights (at `directory`, default cfg.parent's
    checkpoint) and return their digest (the stage records it: PARENT_WEIGHTS). The
    architecture must match, and the checkpoint must be the parent the stage's key
    names (cfg.parent.key): a sweep keys a stage on its parent finished, so a parent
    stopped early, or weights copied without their trainer.json, are refused rather
    than continued under the finished parent's key."""
    parent = cfg.parent
    assert parent is not None, "load_parent continues a stage from its parent (cfg.parent)"
    directory = directory or parent.checkpoint
    verify_checkpoint(directory, argument="parent checkpoint", recover="train the parent stage again")
    if read_model_config(directory) != cfg.model:
        raise ConfigError(
            f"parent checkpoint {str(directory)!r} holds a different architecture than model=...; "
            "allowed: a checkpoint of the same model config"
        )
    found = parent_ref(directory)
    if found.key != parent.key:
        raise ConfigError(
            f"parent checkpoint {str(directory)!r} holds {describe_parent(found)}, not the parent this "
            f"stage is keyed on ({parent.key}); allowed: that parent's checkpoint as its training "
            "wrote it (train the parent stage to its end again)"
        )
    load_weights(model, directory)
    return weights_digest(directory)
