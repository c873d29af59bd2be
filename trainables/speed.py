"""Prefill speed as a step keyed by content: full against skip execution on a trained
checkpoint (paper §5.4; looplab/bench.py measures).

A point is (checkpoint, batch, seq_len, skip policy, dtype, packing). Its key,
`speed_key`, hashes the checkpoint's stage key, the point and the machine that times it
(processor, CPU count, threads, device): a wall-clock figure belongs to its hardware, so
another machine measures again while a re-run here reuses. Each point is one MLflow run
(level bench, tags stage_key, config_hash, method and speed_key; metrics
tracking.BENCH_METRICS); a FINISHED run with the key is never measured again.

Timing wants the machine to itself: the step runs in the driver after every trial has
finished, one point at a time.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

from looplab import tracking
from looplab.config import content_key
from looplab.tracking import SPEED_KEY


@dataclass(frozen=True)
class SpeedPoint:
    batch: int
    seq_len: int
    policy: str  # a skip policy, e.g. skip:0.2
    dtype: str = "fp32"
    packing: str = "auto"


def machine(device: str, threads: int) -> dict[str, Any]:
    """What a wall-clock figure depends on beside the model and the point."""
    return {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": threads,
            "device": device}


def speed_key(stage_key: str, point: SpeedPoint, host: dict[str, Any], repeats: int) -> str:
    return content_key({"stage_key": stage_key, "point": point.__dict__, "machine": host, "repeats": repeats})


def measure(mc, experiment_id: str, parent_run_id: str, *, checkpoint: str, stage_key: str, config_hash: str,
            method: str, points: list[SpeedPoint], repeats: int = 5, threads: int | None = None,
            label: str = "") -> list[dict]:
    """The benchmark record (looplab/bench.py's BenchRecord as a dict) of every point on
    this checkpoint: read from its FINISHED run when there is one, else measured here and
    logged. Progress goes to stderr."""
    import torch

    from looplab.bench import bench_point, heldout_ids, measured_peaks, prefill_peaks
    from looplab.checkpoint import load_model
    from looplab.policy import ExitPolicy
    from looplab.tasks import make_task

    threads = threads or os.cpu_count() or 1
    host = machine("cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(), threads)
    keys = {p: speed_key(stage_key, p, host, repeats) for p in points}
    records, todo = [], []
    for p in points:
        run = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: tracking.BENCH, SPEED_KEY: keys[p]})
        if run is not None and run.info.status == "FINISHED":
            records.append({**p.__dict__, **{k: run.data.metrics[k] for k in tracking.BENCH_METRICS
                                              if k in run.data.metrics}, "reused": True})
        else:
            todo.append(p)
    if not todo:
        return records
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = load_model(checkpoint).eval()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.to(device)
        cfg = model.metadata.get("experiment", {})
        task = None
        if cfg:
            from looplab.config import ExperimentConfig

            exp = ExperimentConfig.from_dict(cfg)
            task = make_task(exp.task, exp.train.seq_len)
        for p in todo:
            ids = heldout_ids(model, task, p.batch, p.seq_len).to(device)
            policy = ExitPolicy.parse(p.policy)
            peaks = measured_peaks(prefill_peaks, [dict(model=model, ids=ids, policy=policy, packing=p.packing,
                                                        dtype=p.dtype)])[0]
            record = bench_point(model, ids, policy, repeats=repeats, packing=p.packing, dtype=p.dtype, peaks=peaks)
            values = record.__dict__
            run_id, _ = tracking.open_run(
                mc, experiment_id, name=f"speed-b{p.batch}-L{p.seq_len}-{p.policy}-{keys[p][:6]}",
                tags={tracking.STAGE_KEY: stage_key, tracking.CONFIG_HASH: config_hash, tracking.METHOD: method,
                      tracking.CHECKPOINT: checkpoint, tracking.GIT_SHA: tracking.git_sha(),
                      tracking.POLICY_TAG: p.policy},
                key={tracking.LEVEL: tracking.BENCH, SPEED_KEY: keys[p]}, parent_run_id=parent_run_id,
                params={**{f"speed.{k}": str(v) for k, v in p.__dict__.items()},
                        **{f"machine.{k}": str(v) for k, v in host.items()}})
            with tracking.terminated_on_exit(mc, run_id):
                tracking.log_metrics(mc, run_id, {k: float(values[k]) for k in tracking.BENCH_METRICS})
            print(f"speed {label} batch {p.batch} × {p.seq_len} {p.policy}: full {record.time_full_s:.4f} s, "
                  f"skip {record.time_skip_s:.4f} s, {record.speedup:.2f}x (ideal {record.ideal_speedup:.2f}x)",
                  file=sys.stderr, flush=True)
            records.append({**p.__dict__, **{k: values[k] for k in tracking.BENCH_METRICS}, "reused": False})
    finally:
        torch.set_num_threads(previous)
    return records
