"""The one content-keyed step: a unit of work named by a digest of what can change its
result, done once and reused after.

Stage training (trainables/trial.py), downstream evaluation (trainables/evaluation.py)
and speed measurement (trainables/bench.py) are each a specification of it:

    kind        which runs hold the step: an MLflow level and the tag carrying its key
                (STAGE_STEP, EVAL_STEP, BENCH_STEP);
    finished    the step's outputs exist and verify. An evaluation's or a speed point's
                outputs are its metrics, logged before its run is closed FINISHED, so a
                FINISHED run is the output. A stage's outputs are files: its checkpoint
                counts only when the files are there and agree with each other
                (`stage_record`), whatever MLflow says, so a deleted or damaged
                checkpoint is trained again rather than reported reused;
    run         inline, one job after another, or as Ray tasks of given CPUs and GPUs
                (`run_jobs`);
    tracked     one MLflow run per step, found again by its key (`open_step_run`).

Twins of a stage (two trials needing it at once) are kept apart by the stage lock
(trainables/shared_stage.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from looplab import tracking
from looplab.errors import ConfigError
from trainables.shared_stage import DONE, read_done, stored_json
from trainables.storage import Storage

Job = TypeVar("Job")
Result = TypeVar("Result")


# ---- which runs hold a step -------------------------------------------------------------
@dataclass(frozen=True)
class StepKind:
    """A kind of keyed step: the MLflow level of its runs and the tag holding its key."""

    level: str
    key_tag: str

    def finished_keys(self, mc, experiment_id: str) -> set[str]:
        """The keys the experiment holds as FINISHED runs of this kind (one query per 5,000 runs)."""
        return tracking.finished_tag_values(mc, experiment_id, self.level, self.key_tag)

    def finished_run(self, mc, experiment_id: str, key: str):
        """The FINISHED run of this key, else None."""
        run = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: self.level, self.key_tag: key})
        return run if run is not None and run.info.status == "FINISHED" else None


def weights_key(stage_key: str, weights: str) -> str:
    """What an evaluation or a speed point of a checkpoint is of: the stage's key and the
    digest of the weights it holds (config.json's weights_sha256). A stage trained again
    into the same weights (training is deterministic on one machine) keeps its results;
    one trained again into other weights (other hardware, a replaced checkpoint) is
    evaluated and timed again rather than credited with its predecessor's figures."""
    from looplab.keys import digest

    return digest({"stage_key": stage_key, "weights": weights})


def stored_weights(storage: Storage, checkpoint: str) -> str:
    """The weights' digest a stored checkpoint's config.json records ("" when none)."""
    from looplab.checkpoint import CONFIG, WEIGHTS_DIGEST

    return str(stored_json(storage, f"{checkpoint}/{CONFIG}").get(WEIGHTS_DIGEST) or "")


STAGE_STEP = StepKind(tracking.STAGE, tracking.STAGE_KEY)
EVAL_STEP = StepKind(tracking.EVAL, tracking.EVAL_KEY)
BENCH_STEP = StepKind(tracking.BENCH, tracking.SPEED_KEY)


def open_step_run(
    mc,
    experiment_id: str,
    kind: StepKind,
    key: str,
    *,
    name: str,
    parent_run_id: str | None,
    tags: dict[str, str],
    params: dict[str, str] | None = None,
    key_tags: dict[str, str] | None = None,
) -> tuple[str, str]:
    """The step's run, found by its key (and `key_tags`: a stage's run is one per trial)
    or created under `parent_run_id`, with the code's commit among its tags: (run_id, its
    status before: FINISHED means done)."""
    return tracking.open_run(
        mc,
        experiment_id,
        name=name,
        key={tracking.LEVEL: kind.level, kind.key_tag: key, **(key_tags or {})},
        parent_run_id=parent_run_id,
        tags=tags if tracking.GIT_SHA in tags else {tracking.GIT_SHA: tracking.git_sha(), **tags},
        params=params,
    )


# ---- a stage's outputs --------------------------------------------------------------------
@dataclass(frozen=True)
class StageRecord:
    """What the store holds of one stage: its done marker (None: never finished) and,
    when the marker is there, what is wrong with the outputs it vouches for ("" when
    they are whole)."""

    done: dict[str, Any] | None
    problem: str = ""

    @property
    def finished(self) -> bool:
        return self.done is not None and not self.problem

    @property
    def broken(self) -> bool:
        """Marked done, but its outputs are missing or damaged: to be trained again."""
        return self.done is not None and bool(self.problem)


def stage_record(storage: Storage, directory: str, checkpoint: str, steps: int, parent: str = "") -> StageRecord:
    """The stage at `directory` as the store holds it: finished only when its checkpoint
    exists, holds `steps` steps and its files agree (trainer.json names the weights
    config.json names; locally, the weights' bytes are the ones saved and have the
    config's shapes), and, for a continued stage, while its parent's checkpoint at
    `parent` still holds the weights it started from. On an object store the bytes are
    not read (that would mean a download): presence and the records' agreement are
    checked."""
    done = read_done(storage, directory)
    if done is None:
        return StageRecord(None)
    problem = _checkpoint_problem(storage, checkpoint, steps)
    return StageRecord(done, problem or (parent and parent_problem(storage, checkpoint, parent)))


def record_of(storage_path: str, cfg) -> StageRecord:
    """stage_record of an ExperimentConfig's stage in the store at storage_path."""
    from trainables.pipeline import checkpoint_of, stage_dir  # here: the pipeline brings torch

    checkpoint = checkpoint_of(storage_path, cfg)
    return stage_record(Storage(storage_path), stage_dir(storage_path, cfg), checkpoint, cfg.train.steps, cfg.init_from)


def parent_problem(storage: Storage, checkpoint: str, parent: str) -> str:
    """Why a continued stage no longer follows its parent ("" while it does): its
    trainer.json records the digest of the parent weights it started from, and the
    parent's checkpoint now holds others (trained again after a loss, on other hardware,
    or replaced by hand). Such a child is trained again with its parent, its old
    checkpoint kept beside as checkpoint.broken. A parent with no weights to compare
    (itself about to be trained again) and stages trained before the digest was
    recorded pass."""
    from looplab.checkpoint import PARENT_WEIGHTS, TRAINER

    started_from = stored_json(storage, f"{checkpoint}/{TRAINER}").get(PARENT_WEIGHTS)
    now = stored_weights(storage, parent)
    if started_from is None or not now or started_from == now:
        return ""
    return f"trained from parent weights {str(started_from)[:12]}, but its parent now holds {str(now)[:12]}"


def _checkpoint_problem(storage: Storage, checkpoint: str, steps: int) -> str:
    # looplab.checkpoint brings torch: imported here, so that the sweeps' --help and dry
    # runs that import this module do not wait for it.
    from looplab.checkpoint import CONFIG, TRAINER, WEIGHTS, WEIGHTS_DIGEST

    if not storage.exists(checkpoint):
        return "checkpoint missing"
    for name in (CONFIG, WEIGHTS, TRAINER):
        if not storage.exists(f"{checkpoint}/{name}"):
            return f"checkpoint's {name} missing"
    try:
        config = stored_json(storage, f"{checkpoint}/{CONFIG}")
        trainer = stored_json(storage, f"{checkpoint}/{TRAINER}")
    except ConfigError:
        return "checkpoint's records damaged"
    step = trainer.get("step")
    if step != steps:
        return f"checkpoint at step {step} of {steps}"
    if trainer.get(WEIGHTS_DIGEST) and trainer.get(WEIGHTS_DIGEST) != config.get(WEIGHTS_DIGEST):
        return f"checkpoint's {TRAINER} and {CONFIG} name different weights"
    return "" if storage.remote else _local_problem(checkpoint)


def _local_problem(checkpoint: str) -> str:
    """verify_checkpoint's verdict on a local checkpoint ("" when whole). One sweep asks
    of each stage several times (the dry run, the schedule, each trial that uses it), and
    the check reads every byte of the weights: a verdict stands while the checkpoint's
    files keep their inode, size and modification time (a new checkpoint is a new
    folder: checkpoint.save_training_state replaces it whole)."""
    files = sorted(p for p in Path(checkpoint).iterdir() if p.is_file())
    return _verified(checkpoint, tuple((p.name, *_identity(p.stat())) for p in files))


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=256)
def _verified(checkpoint: str, files: tuple) -> str:
    from looplab.checkpoint import verify_checkpoint

    try:
        verify_checkpoint(checkpoint, training=True)
    except ConfigError as e:
        return "checkpoint damaged: " + str(e).split(";")[0]
    return ""


def set_aside(storage: Storage, directory: str, checkpoint: str) -> None:
    """Clear a broken stage for its retraining: the done marker goes, and what is left of
    the checkpoint is kept beside it as checkpoint.broken (replacing an older one), so the
    retraining starts afresh and the damaged files stay for a look."""
    if storage.exists(checkpoint):
        storage.move(checkpoint, checkpoint + ".broken")
    if storage.exists(f"{directory}/{DONE}"):
        storage.delete_file(f"{directory}/{DONE}")


# ---- running jobs ----------------------------------------------------------------------------
def run_jobs(
    work: Callable[[Job], Result], jobs: Iterable[Job], *, cpus: float, gpus: float, inline: bool
) -> Iterator[tuple[Job, Result | Exception]]:
    """(job, work(job) or the exception that ended it) for each job. inline: one after
    another in this process, in order; otherwise one Ray task per job with these CPUs and
    GPUs (Ray must be initialised), yielded as each finishes, so that Ray runs no more of
    them at once than the resources allow. One job's failure never costs the others."""
    if inline:
        for job in jobs:
            try:
                yield job, work(job)
            except Exception as e:  # noqa: BLE001 - one job's failure must not cost the others
                yield job, e
        return
    import ray

    remote = ray.remote(num_cpus=cpus, num_gpus=gpus)(work)
    pending = {remote.remote(job): job for job in jobs}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(done[0])
        try:
            yield job, ray.get(done[0])
        except Exception as e:  # noqa: BLE001 - a task that died (RayTaskError wraps the cause)
            yield job, e
