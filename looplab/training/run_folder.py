"""A stage's run folder: what it holds, and how a run starts, checkpoints, stops and
resumes in it.

    OUT/checkpoint/     the newest complete checkpoint (CHECKPOINT_DIR; looplab/checkpoint.py)
    OUT/metrics.jsonl   one JSON record per line: training, evaluation, per loop, resume
    OUT/diverged.json   left by a run that diverged: its restart stops at once

`looplab train` and the platform's stage workers read the same layout.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

from looplab.checkpoint import (
    PARENT_WEIGHTS,
    TRAINER,
    load_training_state,
    save_training_state,
    settle_checkpoint,
    verify_checkpoint,
)
from looplab.config import ConfigError, ExperimentConfig
from looplab.errors import CheckpointNotWritten, TrainingDiverged
from looplab.tracking import EVAL_RECORD, LOOP
from looplab.training.steps import first_non_finite

CHECKPOINT_DIR = "checkpoint"
METRICS_FILE = "metrics.jsonl"
DIVERGED = "diverged.json"  # left by a run that diverged: its restart stops at once (start_step)


def start_step(
    out: Path,
    cfg: ExperimentConfig,
    model,
    optimizer,
    parent_weights: str | None,
    log: MetricsLog,
    *,
    resume: bool,
    main: bool,
    stop_at: int | None,
) -> int:
    """The step a run in `out` starts from, with the model and AdamW restored to it: 0
    for a fresh start (metrics.jsonl begun anew), the checkpoint's step on a resume.
    Refused in one line: a config that diverged here before (it would again), a
    checkpoint of another stage key, or one that continued other parent weights."""
    tc = cfg.train
    ckpt, marker = out / CHECKPOINT_DIR, out / DIVERGED
    if resume and marker.is_file():  # it diverged before: the same config diverges again at the same step
        before = json.loads(marker.read_text())
        if before.get("stage_key") == cfg.stage_key():
            state = json.loads((ckpt / TRAINER).read_text()) if (ckpt / TRAINER).is_file() else {}
            raise TrainingDiverged(
                diverged_message(before["step"], before["reason"], state.get("step", 0), ckpt, marker, again=True)
            )
    if main and marker.is_file():
        marker.unlink()  # another config in this folder, or a fresh start
    if resume and main:
        settle_checkpoint(ckpt)  # a crash mid-save leaves the newest complete checkpoint in place
    if not (resume and (ckpt / TRAINER).is_file()):
        if main:
            log.start_over()
        return 0
    recover = f"start the run over (looplab train --no-resume, or delete {ckpt})"
    verify_checkpoint(ckpt, training=True, recover=recover)
    state = json.loads((ckpt / TRAINER).read_text())
    if state.get("stage_key") != cfg.stage_key():
        raise ConfigError(
            f"{ckpt} holds a checkpoint of stage key {state.get('stage_key')!r}, not "
            f"{cfg.stage_key()!r}; allowed: another --out, or --no-resume to start over"
        )
    started_from = state.get(PARENT_WEIGHTS, parent_weights)  # (none recorded before this was)
    if cfg.parent is not None and started_from != parent_weights:  # the parent trained again, or replaced
        raise ConfigError(
            f"{ckpt} continues the parent weights {str(started_from)[:19]}..., but the parent "
            f"checkpoint {cfg.parent.checkpoint} now holds {str(parent_weights)[:19]}... (trained "
            f"again or replaced); allowed: {recover} to train this stage from the parent as it "
            "is, or the parent's checkpoint as it was"
        )
    start = load_training_state(ckpt, model, optimizer, recover)["step"]
    log.resumed(start, evaluates_again=start == tc.steps and (stop_at is None or stop_at >= tc.steps))
    log.say(f"resumed from {ckpt} at step {start}")
    return start


class Checkpointer:
    """The run's checkpoints and its divergence stop. A checkpoint is written aside and
    swapped in (looplab/checkpoint.py), never with a non-finite weight; a diverged run
    leaves DIVERGED so that a restart (a sweep retries a failed trial) stops at once.
    Rank 0 alone writes; every rank keeps the same count."""

    def __init__(
        self,
        out: Path,
        cfg: ExperimentConfig,
        model,
        optimizer,
        parent_weights: str | None,
        start: int,
        on_checkpoint: Callable[[int, Path], None] | None,
        main: bool,
    ):
        self.ckpt, self.marker = out / CHECKPOINT_DIR, out / DIVERGED
        self.cfg, self.model, self.optimizer, self.parent_weights = cfg, model, optimizer, parent_weights
        self.on_checkpoint, self.main = on_checkpoint, main
        self.saved_step = start  # the step of the checkpoint that is current (0: none)
        self.last_saved = time.monotonic()

    def due(self, done: int, shard) -> bool:
        """Every ckpt_every steps, and every ckpt_minutes of wall clock: a killed run
        loses minutes, not the stage. Ranks decide alike (rank 0's clock, broadcast)."""
        tc = self.cfg.train
        due = bool(tc.ckpt_every) and done % tc.ckpt_every == 0
        if tc.ckpt_minutes:
            due = shard.broadcast(due or time.monotonic() - self.last_saved >= 60.0 * tc.ckpt_minutes)
        return due

    def save(self, step: int) -> None:
        bad = first_non_finite(self.model)
        if bad is not None:  # finite steps can still overflow: a non-finite weight is never saved
            self.diverged(step, f"the weight {bad} is not finite")
        if self.main:
            state = {
                "step": step,
                "stage_key": self.cfg.stage_key(),
                **({PARENT_WEIGHTS: self.parent_weights} if self.parent_weights is not None else {}),
            }
            try:
                save_training_state(self.ckpt, self.model, self.optimizer, state)
            except OSError as e:  # a full disk: the previous checkpoint stays current (written aside first)
                raise CheckpointNotWritten(
                    e.errno,
                    f"could not write the checkpoint of step {step} into "
                    f"{self.ckpt} ({e.strerror or e}); the checkpoint of step "
                    f"{self.saved_step} stays current: free space and run again to "
                    "resume",
                ) from None
            if self.on_checkpoint is not None:
                self.on_checkpoint(step, self.ckpt)
        self.saved_step, self.last_saved = step, time.monotonic()

    def diverged(self, step: int, what: str) -> None:
        """Stop before non-finite values reach the weights or a checkpoint."""
        if self.main:
            self.marker.write_text(json.dumps({"step": step, "stage_key": self.cfg.stage_key(), "reason": what}))
        raise TrainingDiverged(diverged_message(step, what, self.saved_step, self.ckpt, self.marker))


def diverged_message(step: int, what: str, saved_step: int, ckpt: Path, marker: Path, again: bool = False) -> str:
    current = f"the checkpoint of step {saved_step} stays current" if saved_step else "no checkpoint was written"
    return (
        f"training diverged at step {step}{' (before this run: ' + str(marker) + ')' if again else ''}: {what}; "
        f"{current}; lower train.lr or train.grad_clip (a new config trains in a new folder), or delete "
        f"{marker} to run this config again"
    )


def read_records(path: Path, torn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A last line that is not whole JSON is what an append
    cut short leaves (a full disk, a kill mid-write): it is dropped and handed to `torn`
    (a resumed run says what that loses: torn_warning). A bad line before the last is
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
                raise ConfigError(
                    f"{path} line {i} is not a JSON record; allowed: a metrics.jsonl this run wrote "
                    f"(start over with --no-resume, or remove the line)"
                ) from None
            if torn is not None:
                torn(line)
    return records


def torn_warning(path: Path, line: str, step: int, evaluates_again: bool) -> str:
    """What dropping a torn last line loses, for a run resumed at `step`. A record of a
    later step is written again by the resumed run (batches and holes are functions of
    (seed, step)). One of `step` or before cannot be: a training record averages the
    losses of weights the checkpoint no longer holds and times steps not run again. The
    exception is the final evaluation, which a finished run repeats (evaluates_again)."""
    kind, at = re.search(r'"kind":\s*"(\w+)"', line), re.search(r'"step":\s*(\d+)', line)
    what = f"the {kind.group(1)} record of step {at.group(1)}" if kind and at else "a record of an unknown step"
    if at is None:
        fate = f"{what}: written again if it was after step {step}, else lost"
    elif int(at.group(1)) > step or (
        evaluates_again and int(at.group(1)) == step and kind and kind.group(1) in (EVAL_RECORD, LOOP)
    ):
        fate = f"{what}, which the resumed run writes again"
    else:
        fate = (
            f"{what} is lost (the run resumes after it, from the checkpoint of step {step}, and cannot "
            "compute it again)"
        )
    return f"warning: {path}: dropped a torn last line ({len(line)} characters; a write cut short): {fate}"


class MetricsLog:
    """Progress lines on stderr and one JSON record per line in metrics.jsonl.

    A resumed run continues metrics.jsonl from its checkpoint's step: the records an
    interrupted run wrote after that step are dropped (the resumed run writes them
    again, with the same values: batches and holes are functions of (seed, step)), so
    every step appears once. A torn last line of the checkpoint's step or before is
    lost, and the warning says so (torn_warning)."""

    def __init__(self, path: Path, callback, quiet: bool, write: bool = True):
        self.path, self.callback, self.quiet, self.write = path, callback, quiet, write
        self.last_line = time.monotonic()

    def start_over(self) -> None:
        if self.write and self.path.exists():
            self.path.unlink()

    def resumed(self, step: int, evaluates_again: bool = False) -> None:
        if self.write and self.path.exists():
            records = read_records(
                self.path, torn=lambda line: self.say_always(torn_warning(self.path, line, step, evaluates_again))
            )
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
