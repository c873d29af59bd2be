"""The Ray Train worker loop of one stage: looplab's train() in this worker.

Fault tolerance: train() checkpoints into a folder named by the stage's stage_key
and resumes from it, so when Ray Train restarts the worker group (FailureConfig)
the relaunched loop continues from the last checkpoint. The folder lives in the
sweep's storage path, which a cluster must share between nodes.

Several workers train data-parallel (looplab/training/distributed.py: each rank its rows of
every global batch, gradients averaged over the gloo/NCCL group Ray Train set up).
Only rank 0 logs to MLflow; every rank reports the same records to Ray Train,
whose report is a barrier all workers must reach equally often.

In Ray Train's local mode (StageJob.local) this loop runs inside the Tune trial's
process: it is rank 0 of one, and reports to Tune directly (ray.train's calls are
refused inside a Tune function, and local mode runs no Train callbacks).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looplab import tracking
from looplab.keys import STAGES_DIR
from trainables.storage import Storage, check_room

FAIL_AT_STEP_ENV = "LOOPLAB_TEST_KILL_WORKER_AT_STEP"  # tests: SIGKILL the worker once at this step


@dataclass(frozen=True)
class StageJob:
    """What one stage's worker loop is given: it crosses into Ray Train whole, as the
    only entry of the loop's config dict (`loop_config`), and is read back typed."""

    experiment: Any  # looplab.config.ExperimentConfig (imported lazily: it brings torch)
    storage: str  # the sweep's storage root
    stage_folder: str  # stages/<stage>-<key> under it
    tracking_uri: str
    run_ids: tuple[str, ...]  # the stage's run, then the trial's when this is its last stage
    threads: int = 1  # torch threads: the worker's CPU share
    local: bool = False  # Ray Train's local mode: the loop runs in the Tune trial's process
    trial_headline: tuple[str, ...] = ()  # what the trial run logs (PlatformSettings.headline)
    report_to_tune: bool = False
    quiet: bool = True
    progress_board: str = ""
    trial_label: str = ""

    def loop_config(self) -> dict[str, Any]:
        return {"job": self}


def worker_threads(job: StageJob):
    """torch's threads for the worker, set explicitly (looplab/threads.py): the free cores
    within its CPU share. Ray's OMP_NUM_THREADS default does not follow fractional shares,
    a worker must not use CPUs it did not get, and of those it uses only the ones a
    neighbour outside Ray leaves free."""
    from looplab import threads

    return threads.use(within=job.threads)


def stage_worker_loop(config: dict[str, Any]) -> None:
    import ray.train
    from ray import tune

    from trainables.progress import Reporter

    job: StageJob = config["job"]
    chosen = worker_threads(job)
    cfg = job.experiment
    rank = 0 if job.local else ray.train.get_context().get_world_rank()
    report = tune.report if job.local else ray.train.report
    mlflow_client = tracking.client(job.tracking_uri) if rank == 0 else None
    run_ids = job.run_ids
    trial_headline = job.trial_headline
    if mlflow_client is not None:  # where the stage ran: which node of the cluster, which host
        mlflow_client.set_tag(run_ids[0], tracking.RAY_NODE, ray.get_runtime_context().get_node_id())
        mlflow_client.set_tag(run_ids[0], tracking.HOSTNAME, socket.gethostname())
    progress = Reporter(job.progress_board if rank == 0 else None, job.trial_label)
    storage = Storage(job.storage)
    folder = job.stage_folder
    kill_at = int(os.environ.get(FAIL_AT_STEP_ENV, "0") or 0)
    kill_marker = storage.scratch(STAGES_DIR, folder) / ".killed_once"

    # Time this worker spends in MLflow and Ray Train calls (the overhead benchmark reads it).
    mlflow_seconds = report_seconds = 0.0
    # A restarted worker resumes from its checkpoint and replays the steps after it; what
    # an earlier attempt already logged up to some step is not logged again, so every
    # step appears once in MLflow's history (train() does the same for metrics.jsonl).
    logged_through = _last_logged_step(mlflow_client, run_ids[0]) if mlflow_client is not None else -1

    def on_metrics(record: dict[str, Any]) -> None:
        nonlocal mlflow_seconds, report_seconds
        if record["kind"] == "resume":  # an earlier attempt (a killed worker, a rerun) saved this step
            progress.post("resumed", stage=cfg.stage, step=record["step"], steps=cfg.train.steps)
        if mlflow_client is not None and record.get("step", 0) > logged_through:
            t = time.perf_counter()
            # The stage's run gets every figure; the trial's (the others) its headline.
            for i, run_id in enumerate(run_ids):
                tracking.log_record(mlflow_client, run_id, record, headline=trial_headline if i else None)
            mlflow_seconds += time.perf_counter() - t
        # Tune gets the evaluations: every result then carries the sweep's metric
        # (val_ppl / val_accuracy), which schedulers such as ASHA require of each one.
        if job.report_to_tune and record["kind"] == tracking.EVAL_RECORD:
            t = time.perf_counter()
            report({"stage": cfg.stage, "step": record["step"], **tracking.record_metrics(record)})
            report_seconds += time.perf_counter() - t
        _kill_once_at(record.get("step"), kill_at, kill_marker)

    start = time.perf_counter()
    progress.post("start", stage=cfg.stage, steps=cfg.train.steps, threads=chosen.line())
    result = train_stage(
        cfg,
        storage,
        folder,
        on_metrics=on_metrics,
        on_progress=progress.training(cfg.stage),
        should_stop=progress.stop_requested,
        quiet=job.quiet,
    )
    if result.stopped:  # the sweep was asked to stop: the checkpoint holds this step (trial.py closes the run)
        progress.post("stopped", stage=cfg.stage, step=result.step, steps=cfg.train.steps)
        return
    seconds = time.perf_counter() - start
    progress.post("end", stage=cfg.stage, seconds=seconds)
    if mlflow_client is not None:  # the stage's own timing, on its run (one point: not the trial's)
        timing = {
            tracking.STAGE_SECONDS: seconds,
            tracking.MLFLOW_SECONDS: mlflow_seconds,
            tracking.REPORT_SECONDS: report_seconds,
        }
        tracking.log_metrics(mlflow_client, run_ids[0], timing, step=cfg.train.steps)


def _kill_once_at(step, kill_at: int, marker) -> None:
    """The tests' crash: SIGKILL this worker (in local mode: the trial) once, at step
    kill_at (FAIL_AT_STEP_ENV), the marker saying a restart has been through it."""
    if kill_at and step == kill_at and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


def _last_logged_step(mlflow_client, run_id: str) -> int:
    """The highest step the run has logged (-1: none). Every training record logs
    `loss` and every evaluation full depth's `val_loss`, so their histories say it."""
    keys = (tracking.LOSS, tracking.VAL_LOSS)
    return max((m.step for key in keys for m in mlflow_client.get_metric_history(run_id, key)), default=-1)


# Beside a stage's checkpoints: its metrics.jsonl and its share of the MLflow database
LOG_ROOM = 4 * 2**20


def _check_room(cfg, work: Path) -> None:
    """Room for the stage before it trains: a checkpoint is written beside the current one
    before it replaces it, so two of them at once, less what its current one holds."""
    from looplab.costs.memory import training_state_bytes
    from looplab.training.run_folder import CHECKPOINT_DIR

    current = work / CHECKPOINT_DIR
    held = sum(f.stat().st_size for f in current.rglob("*") if f.is_file()) if current.is_dir() else 0
    check_room(work, 2 * training_state_bytes(cfg.model) + LOG_ROOM - held, f"the {cfg.stage} stage's checkpoints")


def train_stage(cfg, storage: Storage, folder: str, **train_kwargs):
    """looplab's train() for the stage whose folder is stages/<folder> in `storage`.
    On a file system it trains in that folder. On an object store it trains in a local
    scratch folder: the stage's newest checkpoint (its resume point) and its parent's
    checkpoint are downloaded first, and every checkpoint (with metrics.jsonl) is
    uploaded as it is written, so a restart on any node resumes from the store."""
    from looplab.checkpoint import TRAINER
    from looplab.config import ConfigError
    from looplab.training.run_folder import CHECKPOINT_DIR, METRICS_FILE
    from looplab.training.train import train

    location = storage.path(STAGES_DIR, folder)
    work = Path(location) if not storage.remote else storage.scratch(STAGES_DIR, folder)
    _check_room(cfg, work)
    if not storage.remote:
        return train(cfg, location, resume=True, **train_kwargs)
    checkpoint = storage.path(STAGES_DIR, folder, CHECKPOINT_DIR)
    if storage.download_dir(checkpoint, work / CHECKPOINT_DIR, TRAINER):  # the resume point and its history
        history = storage.read_text(storage.path(STAGES_DIR, folder, METRICS_FILE))
        (work / METRICS_FILE).write_text(history or "")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)  # nothing stored: a fresh start, not a stale scratch copy
    parent_dir = None
    if cfg.parent is not None and "://" in cfg.parent.checkpoint:
        parent_dir = storage.scratch("parents", cfg.parent.key)
        if not storage.download_dir(cfg.parent.checkpoint, parent_dir, TRAINER):
            raise ConfigError(
                f"parent checkpoint {cfg.parent.checkpoint} is missing or incomplete; "
                "allowed: a parent stage that finished training (retrain it)"
            )

    def upload(step: int, path) -> None:
        storage.upload_dir(path, checkpoint, TRAINER)
        storage.write_text(storage.path(STAGES_DIR, folder, METRICS_FILE), (work / METRICS_FILE).read_text())

    return train(cfg, work, resume=True, parent_dir=parent_dir, on_checkpoint=upload, **train_kwargs)
