"""The Ray Train worker loop of one stage: looplab's train() in this worker.

Fault tolerance: train() checkpoints into a folder named by the stage's stage_key
and resumes from it, so when Ray Train restarts the worker group (FailureConfig)
the relaunched loop continues from the last checkpoint. The folder lives in the
sweep's storage path, which a cluster must share between nodes.

Several workers train data-parallel (looplab/distributed.py: each rank its rows of
every global batch, gradients averaged over the gloo/NCCL group Ray Train set up).
Only rank 0 logs to MLflow; every rank reports the same records to Ray Train,
whose report is a barrier all workers must reach equally often.

In Ray Train's local mode (config["local"]) this loop runs inside the Tune trial's
process: it is rank 0 of one, and reports to Tune directly (ray.train's calls are
refused inside a Tune function, and local mode runs no Train callbacks).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

FAIL_AT_STEP_ENV = "LOOPLAB_TEST_KILL_WORKER_AT_STEP"  # tests: SIGKILL the worker once at this step


def stage_worker_loop(config: dict[str, Any]) -> None:
    import ray.train
    from ray import tune

    from looplab import tracking
    from looplab.config import ExperimentConfig
    from looplab.train import train
    from trainables.progress import Reporter

    import torch

    # Threads = the worker's CPU share, set explicitly: Ray's OMP_NUM_THREADS default
    # does not follow fractional shares, and a worker must not use CPUs it did not get.
    torch.set_num_threads(config.get("threads", 1))
    cfg = ExperimentConfig.from_dict(config["experiment"])
    local = config.get("local", False)
    rank = 0 if local else ray.train.get_context().get_world_rank()
    report = tune.report if local else ray.train.report
    mlflow_client = tracking.client(config["tracking_uri"]) if rank == 0 else None
    run_ids: list[str] = config["run_ids"]
    if mlflow_client is not None:  # where the stage ran: which node of the cluster, which host
        mlflow_client.set_tag(run_ids[0], tracking.RAY_NODE, ray.get_runtime_context().get_node_id())
        mlflow_client.set_tag(run_ids[0], tracking.HOSTNAME, socket.gethostname())
    progress = Reporter(config.get("progress_board") if rank == 0 else None, config.get("trial_label", ""))
    kill_at = int(os.environ.get(FAIL_AT_STEP_ENV, "0") or 0)
    kill_marker = os.path.join(config["out_dir"], ".killed_once")

    # Time this worker spends in MLflow and Ray Train calls (the overhead benchmark reads it).
    mlflow_seconds = report_seconds = 0.0

    def on_metrics(record: dict[str, Any]) -> None:
        nonlocal mlflow_seconds, report_seconds
        if mlflow_client is not None:
            t = time.perf_counter()
            for run_id in run_ids:
                tracking.log_record(mlflow_client, run_id, record)
            mlflow_seconds += time.perf_counter() - t
        # Tune gets the evaluations: every result then carries the sweep's metric
        # (val_ppl / val_accuracy), which schedulers such as ASHA require of each one.
        if config["report_to_tune"] and record["kind"] == "eval":
            t = time.perf_counter()
            report({"stage": cfg.stage, "step": record["step"], **tracking.record_metrics(record)})
            report_seconds += time.perf_counter() - t
        if kill_at and record.get("step") == kill_at and not os.path.exists(kill_marker):
            open(kill_marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # a crashed worker (in local mode: trial), for the tests

    start = time.perf_counter()
    progress.post("start", stage=cfg.stage, steps=cfg.train.steps)
    train(cfg, config["out_dir"], resume=True, on_metrics=on_metrics, on_progress=progress.training(cfg.stage),
          quiet=config.get("quiet", True))
    seconds = time.perf_counter() - start
    progress.post("end", stage=cfg.stage, seconds=seconds)
    if mlflow_client is not None:
        for run_id in run_ids:
            tracking.log_metrics(mlflow_client, run_id, {tracking.STAGE_SECONDS: seconds,
                                                         tracking.MLFLOW_SECONDS: mlflow_seconds,
                                                         tracking.REPORT_SECONDS: report_seconds},
                                 step=cfg.train.steps)
