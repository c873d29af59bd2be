"""One training run of one stage (one process, or data-parallel ranks: see
looplab/training/distributed.py): AdamW, linear warmup then
cosine decay to a floor, gradient clipping, the stage's loss and trained parameters
(its entry in looplab/stages.py), periodic evaluation, and resumable checkpoints.

Batches are a pure function of (seed, step), so a resumed run sees exactly the
batches the uninterrupted run would have seen; with the model and AdamW moments
restored, the loss trajectory continues unchanged.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from looplab.checkpoint import (PARENT_WEIGHTS, TRAINER, describe_parent, experiment_metadata, load_training_state,
                                load_weights, model_from_config, parent_ref, read_model_config, save_training_state,
                                settle_checkpoint, verify_checkpoint, weights_digest)
from looplab import threads
from looplab.config import ConfigError, ExperimentConfig, TrainConfig
from looplab.costs.machine import check_training
from looplab.errors import CheckpointNotWritten, TrainingDiverged
from looplab.huggingface.retrofit import initialise, loads_weights
from looplab.models.compiled import compile_backbone
from looplab.training.distributed import Shard
from looplab.evaluation.validation import autocast_context, evaluate_policies
from looplab.training.instruments import diagnostic_batch, loop_instruments
from looplab.training import objectives  # noqa: F401 - the built-in stages' losses register themselves on import
from looplab.stages import get_stage
from looplab.tasks import make_task
from looplab.tasks.base import IGNORE_INDEX, Batch
from looplab.tracking import GRAD_NORM, HIDDEN_NORM, LOOP, loop_metric

CHECKPOINT_DIR = "checkpoint"
METRICS_FILE = "metrics.jsonl"
DIVERGED = "diverged.json"  # left by a run that diverged: its restart stops at once (train())


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup to cfg.lr
    over warmup_steps, then cosine decay to min_lr_ratio·lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    span = max(1, cfg.steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def resolve_device(name: str | torch.device | None) -> torch.device:
    """auto (or None): CUDA when there is one, else CPU; cuda[:N] needs a GPU."""
    name = str(name or "auto")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} is invalid here: no CUDA device; allowed: auto | cpu")
    return torch.device(name)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: norms, biases and the SSM's
    A_log / D / dt_bias (flagged _no_weight_decay, as in mamba-ssm) are not decayed."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


@dataclass
class TrainResult:
    out_dir: Path
    step: int  # optimizer steps completed
    losses: list[float] = field(default_factory=list)  # training loss of each step run in this call
    eval: dict[str, float] = field(default_factory=dict)  # the last evaluation
    stopped: bool = False  # should_stop asked for it before the last step (a checkpoint holds `step`)


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


PROGRESS_SECONDS = 30.0  # a console progress line at least this often, whatever log_every is


def train(cfg: ExperimentConfig, out_dir: str | Path, *, resume: bool = True, stop_at: int | None = None,
          on_metrics: Callable[[dict[str, Any]], None] | None = None,
          on_progress: Callable[[dict[str, Any]], None] | None = None,
          on_checkpoint: Callable[[int, Path], None] | None = None, parent_dir: str | Path | None = None,
          should_stop: Callable[[], bool] | None = None, quiet: bool = False) -> TrainResult:
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
    local copy of a checkpoint in object storage). Under an initialised torch.distributed process group each rank trains its share
    of every batch; rank 0 alone evaluates and writes files.
    """
    tc = cfg.train
    shard = Shard.current()
    shard.check_batch_size(tc.batch_size)
    out = Path(out_dir)
    device = resolve_device(tc.device)
    check_training(cfg, device, ranks=shard.world)  # its time and memory against this machine, before allocating
    task = make_task(cfg.task, tc.seq_len)
    model = model_from_config(cfg.model, tc.seed)
    retrofitted, parent_weights = None, None
    if cfg.parent is not None:
        parent_weights = load_parent(model, cfg, parent_dir)
    elif tc.init_from and loads_weights(tc.init_from):  # pre-training from a Hugging Face checkpoint's weights
        retrofitted = initialise(model, cfg.model, tc.init_from, tc.init_layers)  # (a continued stage has its parent's)
    out.mkdir(parents=True, exist_ok=True)  # only once the task, the model and its parent are fine
    model.to(device)
    model.checkpoint_steps = tc.activation_checkpointing
    compile_backbone(model, tc.compile, device)
    model.metadata = experiment_metadata(cfg)
    if retrofitted is not None:  # the source's layers and files' digest: a changed source shows afterwards
        model.metadata["retrofit"] = retrofitted
    if parent_weights is not None:  # which weights it continued: a parent trained again later is told apart
        model.metadata[PARENT_WEIGHTS] = parent_weights
    stage = get_stage(cfg.stage)
    for name, p in model.named_parameters():  # e.g. Stage-2 trains the gate alone
        p.requires_grad_(stage.trainable(name))
    optimizer = make_optimizer(model, tc)
    log = _Logger(out / METRICS_FILE, on_metrics, quiet or not shard.main, write=shard.main)

    ckpt = out / CHECKPOINT_DIR
    start = 0
    marker = out / DIVERGED
    if resume and marker.is_file():  # it diverged before: the same config diverges again at the same step
        before = json.loads(marker.read_text())
        if before.get("stage_key") == cfg.stage_key():
            state = json.loads((ckpt / TRAINER).read_text()) if (ckpt / TRAINER).is_file() else {}
            raise TrainingDiverged(_diverged_message(before["step"], before["reason"], state.get("step", 0), ckpt,
                                                     marker, again=True))
    if shard.main and marker.is_file():
        marker.unlink()  # another config in this folder, or a fresh start
    if resume and shard.main:
        settle_checkpoint(ckpt)  # a crash mid-save leaves the newest complete checkpoint in place
    if resume and (ckpt / TRAINER).is_file():
        recover = f"start the run over (looplab train --no-resume, or delete {ckpt})"
        verify_checkpoint(ckpt, training=True, recover=recover)
        state = json.loads((ckpt / TRAINER).read_text())
        if state.get("stage_key") != cfg.stage_key():
            raise ConfigError(f"{ckpt} holds a checkpoint of stage key {state.get('stage_key')!r}, not "
                              f"{cfg.stage_key()!r}; allowed: another --out, or --no-resume to start over")
        started_from = state.get(PARENT_WEIGHTS, parent_weights)  # (none recorded before this was)
        if cfg.parent is not None and started_from != parent_weights:  # the parent trained again, or replaced
            raise ConfigError(f"{ckpt} continues the parent weights {str(started_from)[:19]}..., but the parent "
                              f"checkpoint {cfg.parent.checkpoint} now holds {parent_weights[:19]}... (trained "
                              f"again or replaced); allowed: {recover} to train this stage from the parent as it "
                              "is, or the parent's checkpoint as it was")
        start = load_training_state(ckpt, model, optimizer, recover)["step"]
        log.resumed(start, evaluates_again=start == tc.steps and (stop_at is None or stop_at >= tc.steps))
        log.say(f"resumed from {ckpt} at step {start}")
    elif shard.main:
        log.start_over()
    end = tc.steps if stop_at is None else min(tc.steps, stop_at)
    last_saved = time.monotonic()
    saved_step = start  # the step of the checkpoint that is current (0: none)

    def checkpoint(step: int) -> None:
        nonlocal last_saved, saved_step
        bad = _first_non_finite(model)
        if bad is not None:  # finite steps can still overflow: a non-finite weight is never saved
            diverged(step, f"the weight {bad} is not finite")
        if shard.main:
            try:
                save_training_state(ckpt, model, optimizer, {"step": step, "stage_key": cfg.stage_key(), **(
                    {PARENT_WEIGHTS: parent_weights} if parent_weights is not None else {})})
            except OSError as e:  # a full disk: the previous checkpoint stays current (written aside first)
                raise CheckpointNotWritten(e.errno, f"could not write the checkpoint of step {step} into {ckpt} "
                                       f"({e.strerror or e}); the checkpoint of step {saved_step} stays current: "
                                       "free space and run again to resume") from None
            if on_checkpoint is not None:
                on_checkpoint(step, ckpt)
        saved_step, last_saved = step, time.monotonic()

    def diverged(step: int, what: str) -> None:
        """Stop before non-finite values reach the weights or a checkpoint, leaving a
        marker so that a restarted run (a sweep retries a failed trial) stops at once."""
        if shard.main:
            (out / DIVERGED).write_text(json.dumps({"step": step, "stage_key": cfg.stage_key(), "reason": what}))
        raise TrainingDiverged(_diverged_message(step, what, saved_step, ckpt, out / DIVERGED))

    def evaluate(step: int) -> dict[str, float]:
        records = _evaluation_records(model, task, cfg, device) if shard.main else None
        records = shard.broadcast(records)
        full = records[0]  # full depth comes first (Stage.eval_policies)
        quality = (f"ppl {full['ppl']:.3f}  next-token acc {full['accuracy']:.4f}" if cfg.task.kind == "text"
                   else f"exact match {full['accuracy']:.4f}  loss {full['loss']:.4f}")
        lines = [f"eval @ {step}: {quality}  (n={full['n']})"]
        lines += [f"  {r['policy']:10s} loops {r['executed_loops']:.2f}  exit {r['mean_exit_step']:.2f}  "
                  f"acc {r['accuracy']:.4f}  loss {r['loss']:.4f}" for r in records[1:]]
        log.record({"kind": "eval", "step": step, "policies": records}, "\n".join(lines))
        if shard.main:  # per-loop instruments (looplab/training/instruments.py) on rank 0's diagnostic batch
            loops = loop_instruments(model, stage, diagnostic_batch(task.eval_batch()), cfg, step, device)
            log.record({"kind": LOOP, "step": step, "metrics": loops}, _loops_line(loops, cfg.model.n_loops),
                       say=True)
        return full

    result = TrainResult(out_dir=out, step=start)
    n_params = model.num_parameters()
    log.say(f"{cfg.preset or 'custom'} {cfg.stage} [{cfg.stage_key()}]: {cfg.model.arch} {cfg.model.n_layers}⊗"
            f"{cfg.model.n_loops}, {n_params:,} params, {tc.steps} steps on {device}")
    if device.type == "cpu":
        log.say(threads.current().line())
    model.train()
    train_time, tokens, window = 0.0, 0, []
    for step in range(start, end):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, tc)
        t_step = time.perf_counter()
        batch = task.train_batch(step, tc.batch_size, tc.seq_len, tc.seed)
        optimizer.zero_grad(set_to_none=True)
        loss, diag = _accumulate_gradients(model, stage, batch, cfg, step, shard, device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        shard.average_gradients(trainable)
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, tc.grad_clip if tc.grad_clip > 0 else math.inf)
        # Every rank has the same (averaged) loss and gradients, so every rank stops together.
        means_now = shard.average({"loss": loss, **diag})
        loss_value = means_now.pop("loss")
        if not math.isfinite(loss_value):
            diverged(step, f"the loss is {loss_value}")
        if not math.isfinite(float(grad_norm)):
            diverged(step, f"the gradient of {_first_non_finite(model, grads=True)} is not finite")
        optimizer.step()  # only a finite step: the weights (and the next checkpoint) stay finite
        train_time += time.perf_counter() - t_step  # evaluation and checkpoints excluded
        result.losses.append(loss_value)
        window.append({"loss": loss_value, **means_now})
        tokens += batch.ids.numel()
        done = step + 1
        rate = tokens / train_time
        eta = (end - done) * train_time / (done - start)
        if on_progress is not None:
            on_progress({"step": done, "steps": tc.steps, "loss": loss_value, "tokens_per_s": rate, "eta_s": eta})
        if not (done % tc.log_every == 0 or done == end) and time.monotonic() - log.last_line >= PROGRESS_SECONDS:
            log.say(f"step {done}/{tc.steps} | loss {loss_value:.4f} | {rate:,.0f} tok/s | eta {_fmt_time(eta)}")
        if done % tc.log_every == 0 or done == end:
            means = _window_means(window)
            extra = "".join(f" | {k} {means[k]:.3f}" for k in ("exit_entropy", "expected_exit_step") if k in means)
            log.record({"kind": "train", "step": done, "stage": cfg.stage, **means, "lr": lr_at(step, tc),
                        "grad_norm": float(grad_norm), "tokens_per_s": rate},
                       f"step {done}/{tc.steps} | loss {means['loss']:.4f}{extra} | lr {lr_at(step, tc):.2e}"
                       f" | {rate:,.0f} tok/s | eta {_fmt_time(eta)}")
            window = []
        if tc.eval_every and done % tc.eval_every == 0 and done != tc.steps:
            result.eval = evaluate(done)
        # Every ckpt_every steps, and every ckpt_minutes of wall clock: a killed run
        # loses minutes, not the stage. Ranks decide alike (rank 0's clock, broadcast).
        due = bool(tc.ckpt_every) and done % tc.ckpt_every == 0
        if tc.ckpt_minutes:
            due = shard.broadcast(due or time.monotonic() - last_saved >= 60.0 * tc.ckpt_minutes)
        if due and done != end:
            checkpoint(done)
        result.step = done
        if should_stop is not None and done != end and shard.broadcast(bool(should_stop())):
            if saved_step != done:
                checkpoint(done)
            log.say(f"stopped at step {done}/{tc.steps} on request; checkpoint: {ckpt} (running again resumes here)")
            result.stopped = True
            return result

    if end == tc.steps:
        result.eval = evaluate(tc.steps)
    if end > start:
        checkpoint(end)
        log.say(f"checkpoint: {ckpt}")
    return result


def optimizer_step(cfg: ExperimentConfig, device, batch: Batch | None = None) -> tuple[Callable[[], float], Any]:
    """(step, model): a closure running one optimizer step of cfg's stage as train() does
    (its micro-batches, the parameters the stage trains, AdamW) on a fixed batch (default:
    random tokens of the batch's shape), from fresh weights, returning the loss. What
    measures a step's time or memory uses it: a step costs the same whatever the weights
    and tokens hold (the dry run's estimate, looplab doctor, benchmarks/train_memory.py)."""
    device = torch.device(device)
    model = model_from_config(cfg.model, cfg.train.seed).to(device)
    model.checkpoint_steps = cfg.train.activation_checkpointing
    compile_backbone(model, cfg.train.compile, device)
    stage = get_stage(cfg.stage)
    for name, p in model.named_parameters():
        p.requires_grad_(stage.trainable(name))
    optimizer = make_optimizer(model, cfg.train)
    if batch is None:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.train.seq_len + 1), generator=g)
        batch = Batch(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
    shard = Shard.current()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss, _ = _accumulate_gradients(model, stage, batch, cfg, 0, shard, device)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # gradients freed: the next step starts where this one did
        return loss
    return step, model


def probe_seconds(cfg: ExperimentConfig, *, steps: int = 2) -> tuple[float, float]:
    """(seconds per training step, seconds per evaluation) of cfg on this machine, with
    the threads torch has: the median of `steps` optimizer steps after a warm-up, and
    one evaluation as train() runs it (the stage's policies and the per-loop
    instruments). A sweep's dry run turns these into its time estimate (sweeps/estimate.py)."""
    from looplab.costs.timing import median_seconds

    device = resolve_device(cfg.train.device)
    check_training(cfg, device)  # the probe allocates what a step of the run does
    task = make_task(cfg.task, cfg.train.seq_len)
    step, model = optimizer_step(cfg, device, task.train_batch(0, cfg.train.batch_size, cfg.train.seq_len,
                                                               cfg.train.seed))
    seconds = median_seconds(step, steps, warmup=1, device=device)
    t = time.perf_counter()
    _evaluation_records(model, task, cfg, device)
    loop_instruments(model, get_stage(cfg.stage), diagnostic_batch(task.eval_batch()), cfg, 0, device)
    return seconds, time.perf_counter() - t


def _first_non_finite(model, grads: bool = False) -> str | None:
    """The name of the first parameter whose values (or gradient) hold inf or NaN."""
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is not None and not bool(torch.isfinite(t).all()):
            return name
    return None


def _diverged_message(step: int, what: str, saved_step: int, ckpt: Path, marker: Path, again: bool = False) -> str:
    current = f"the checkpoint of step {saved_step} stays current" if saved_step else "no checkpoint was written"
    return (f"training diverged at step {step}{' (before this run: ' + str(marker) + ')' if again else ''}: {what}; "
            f"{current}; lower train.lr or train.grad_clip (a new config trains in a new folder), or delete "
            f"{marker} to run this config again")


def _accumulate_gradients(model, stage, batch: Batch, cfg: ExperimentConfig, step: int, shard: Shard,
                          device) -> tuple[float, dict[str, float]]:
    """Forward and backward this rank's rows of the global batch, micro_batch_size rows
    at a time, into the parameters' .grad. Each part's loss (a mean over its target
    tokens) weighs by its share of the global batch's target tokens, times the world
    size that Shard.average_gradients divides by: the gradient is that of the whole
    batch's token mean, whatever the split into ranks and micro-batches. Returns this
    rank's weighted loss and diagnostics, which Shard.average turns into the batch's."""
    n_global = max(int((batch.targets != IGNORE_INDEX).sum()), 1)
    loss_sum, diag_sum = 0.0, {}
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


def _window_means(window: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each logged quantity over the steps of a log window that have it
    (the hole-branch diagnostics exist only on holed minibatches)."""
    keys = {k for rec in window for k in rec}
    return {k: sum(rec[k] for rec in window if k in rec) / sum(k in rec for rec in window) for k in sorted(keys)}


def _loops_line(loops: dict[str, float], n_loops: int) -> str:
    """The per-loop instruments at full depth, one line: ‖h‖ and the gradient per loop."""
    parts = []
    for label, quantity in (("|h| (rms)", HIDDEN_NORM), ("|grad| from", GRAD_NORM)):
        values = [loops.get(loop_metric(quantity, r)) for r in range(1, n_loops + 1)]
        if all(v is not None for v in values):
            parts.append(f"{label} loop 1..{n_loops}: " + " ".join(f"{v:.3g}" for v in values))
    return "  per loop: " + ("  ".join(parts) or "-")


def _evaluation_records(model, task, cfg: ExperimentConfig, device) -> list[dict]:
    """One record per policy the stage evaluates (Stage.eval_policies): full depth
    first; gated stages add dense and skip at each q and the forced depths below R,
    the fixed-depth baseline every exit policy is compared with."""
    tc = cfg.train
    eval_set = task.eval_batch()
    if tc.eval_limit:
        eval_set = eval_set.slice(0, tc.eval_limit)
    policies = get_stage(cfg.stage).eval_policies(cfg.model.n_loops, tc.eval_qs)
    return evaluate_policies(model, eval_set, policies, batch_size=tc.eval_batch_size, device=device,
                             precision=tc.precision)


def load_parent(model: torch.nn.Module, cfg: ExperimentConfig, directory: str | Path | None = None) -> str:
    """Start from the parent stage's weights (at `directory`, default cfg.parent's
    checkpoint) and return their digest (the stage records it: PARENT_WEIGHTS). The
    architecture must match, and the checkpoint must be the parent the stage's key
    names (cfg.parent.key): a sweep keys a stage on its parent finished, so a parent
    stopped early, or weights copied without their trainer.json, are refused rather
    than continued under the finished parent's key."""
    directory = directory or cfg.init_from
    verify_checkpoint(directory, argument="parent checkpoint", recover="train the parent stage again")
    if read_model_config(directory) != cfg.model:
        raise ConfigError(f"parent checkpoint {str(directory)!r} holds a different architecture than model=...; "
                          "allowed: a checkpoint of the same model config")
    found = parent_ref(directory)
    if found.key != cfg.parent.key:
        raise ConfigError(f"parent checkpoint {str(directory)!r} holds {describe_parent(found)}, not the parent this "
                          f"stage is keyed on ({cfg.parent.key}); allowed: that parent's checkpoint as its training "
                          "wrote it (train the parent stage to its end again)")
    load_weights(model, directory)
    return weights_digest(directory)


def read_records(path: Path, torn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A last line that is not whole JSON is what an append
    cut short leaves (a full disk, a kill mid-write): it is dropped and handed to `torn`
    (a resumed run says what that loses: _torn_warning). A bad line before the last is
    damage of another kind: one line naming the file and the line."""
    lines = path.read_text().splitlines()
    records = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines):
                raise ConfigError(f"{path} line {i} is not a JSON record; allowed: a metrics.jsonl this run wrote "
                                  f"(start over with --no-resume, or remove the line)") from None
            if torn is not None:
                torn(line)
    return records


def _torn_warning(path: Path, line: str, step: int, evaluates_again: bool) -> str:
    """What dropping a torn last line loses, for a run resumed at `step`. A record of a
    later step is written again by the resumed run (batches and holes are functions of
    (seed, step)). One of `step` or before cannot be: a training record averages the
    losses of weights the checkpoint no longer holds and times steps not run again. The
    exception is the final evaluation, which a finished run repeats (evaluates_again)."""
    kind, at = re.search(r'"kind":\s*"(\w+)"', line), re.search(r'"step":\s*(\d+)', line)
    what = f"the {kind.group(1)} record of step {at.group(1)}" if kind and at else "a record of an unknown step"
    if at is None:
        fate = f"{what}: written again if it was after step {step}, else lost"
    elif int(at.group(1)) > step or (evaluates_again and int(at.group(1)) == step and kind
                                     and kind.group(1) in ("eval", LOOP)):
        fate = f"{what}, which the resumed run writes again"
    else:
        fate = (f"{what} is lost (the run resumes after it, from the checkpoint of step {step}, and cannot "
                "compute it again)")
    return f"warning: {path}: dropped a torn last line ({len(line)} characters; a write cut short): {fate}"


class _Logger:
    """Progress lines on stderr and one JSON record per line in metrics.jsonl.

    A resumed run continues metrics.jsonl from its checkpoint's step: the records an
    interrupted run wrote after that step are dropped (the resumed run writes them
    again, with the same values: batches and holes are functions of (seed, step)), so
    every step appears once. A torn last line of the checkpoint's step or before is
    lost, and the warning says so (_torn_warning)."""

    def __init__(self, path: Path, callback, quiet: bool, write: bool = True):
        self.path, self.callback, self.quiet, self.write = path, callback, quiet, write
        self.last_line = time.monotonic()

    def start_over(self) -> None:
        if self.write and self.path.exists():
            self.path.unlink()

    def resumed(self, step: int, evaluates_again: bool = False) -> None:
        if self.write and self.path.exists():
            records = read_records(self.path, torn=lambda line: self.say_always(
                _torn_warning(self.path, line, step, evaluates_again)))
            kept = [json.dumps(r) for r in records if r.get("step", 0) <= step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.record({"kind": "resume", "step": step}, f"resume at step {step}", say=False)

    def say_always(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def say(self, line: str) -> None:
        self.last_line = time.monotonic()
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)

    def record(self, record: dict[str, Any], line: str, say: bool = True) -> None:
        if self.write:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.callback:
            self.callback(record)
        if say:
            self.say(line)
