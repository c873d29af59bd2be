"""Prefill speed as a step keyed by content: full against skip execution on a trained
checkpoint (paper §5.4; looplab/bench.py measures).

A point is (checkpoint, batch, seq_len, skip policy, dtype, packing). Its key,
`speed_key`, hashes the checkpoint's stage key, the point, the repeats and the machine
that times it (processor, CPU count, threads, device): a wall-clock figure belongs to its
hardware, so another machine measures again while a re-run here reuses. Each point is
one MLflow run (level bench, tags stage_key, config_hash, method, policy and speed_key;
params speed.* and machine.*; metrics tracking.SPEED_METRICS: the benchmark's figures
and the FLOP bound of the speedup, looplab/resources.py); a FINISHED run with the key is
never measured again.

Timing wants the machine to itself: sweeps/paper_mini.py runs this step in the driver
after every trial has finished; sweeps/speed.py runs one job per checkpoint, each with
the whole machine (or one GPU) to itself.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from typing import Any, Callable

from looplab import tracking
from looplab.keys import digest
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
    return digest({"stage_key": stage_key, "point": point.__dict__, "machine": host, "repeats": repeats})


def finished_speed_keys(mc, experiment_id: str) -> set[str]:
    """The speed keys the experiment holds as FINISHED runs."""
    return tracking.finished_tag_values(mc, experiment_id, tracking.BENCH, tracking.SPEED_KEY)


def host_of(threads: int) -> dict[str, Any]:
    """This process's machine() as measure() records it: the CUDA device when there is
    one (the benchmark then runs on it), else the CPU."""
    import torch

    return machine("cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(), threads)


def bound_of(model_cfg, point: SpeedPoint, executed_loops: float) -> float:
    """The point's FLOP bound (looplab/resources.py) at its measured executed loops: a
    prefill reads out at the last position only."""
    from looplab.policy import ExitPolicy
    from looplab.resources import flop_bound, prefill_flops

    f0, fr = prefill_flops(model_cfg, point.seq_len, ExitPolicy.parse(point.policy), readout="last")
    return flop_bound(f0, fr, model_cfg.n_loops, executed_loops)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def measure(mc, experiment_id: str, parent_run_id: str, *, checkpoint: str, stage_key: str, config_hash: str,
            method: str, points: list[SpeedPoint], repeats: int = 5, threads: int | None = None,
            label: str = "", progress: Callable[[str], None] | None = None) -> list[dict]:
    """The benchmark record (looplab/bench.py's BenchRecord as a dict) of every point on
    this checkpoint: read from its FINISHED run when there is one, else measured here and
    logged. A line per measured point goes to `progress` (default: stderr)."""
    import torch

    from looplab.bench import bench_point, heldout_ids, measured_peaks, prefill_peaks
    from looplab.checkpoint import load_model
    from looplab.policy import ExitPolicy
    from looplab.tasks import make_task

    threads = threads or os.cpu_count() or 1
    host = host_of(threads)
    keys = {p: speed_key(stage_key, p, host, repeats) for p in points}
    records, todo = [], []
    for p in points:
        run = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: tracking.BENCH, SPEED_KEY: keys[p]})
        if run is not None and run.info.status == "FINISHED":
            values = {k: run.data.metrics[k] for k in tracking.SPEED_METRICS if k in run.data.metrics}
            if tracking.FLOP_BOUND not in values and tracking.MEAN_LOOPS in values:
                # a run logged before the bound was: computed from the model's config, no timing
                from looplab.checkpoint import read_model_config

                values[tracking.FLOP_BOUND] = bound_of(read_model_config(checkpoint), p,
                                                       values[tracking.MEAN_LOOPS])
                tracking.log_metrics(mc, run.info.run_id, {tracking.FLOP_BOUND: values[tracking.FLOP_BOUND]})
            records.append({**p.__dict__, **values, "reused": True})
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
        calls = [dict(model=model, ids=heldout_ids(model, task, p.batch, p.seq_len).to(device),
                     policy=ExitPolicy.parse(p.policy), packing=p.packing, dtype=p.dtype) for p in todo]
        # Every point's memory first, in one child process on a CPU (looplab/bench.py): one
        # process start per checkpoint, not per point; then the timing, here.
        for p, call, peaks in zip(todo, calls, measured_peaks(prefill_peaks, calls)):
            ids, policy = call["ids"], call["policy"]
            record = bench_point(model, ids, policy, repeats=repeats, packing=p.packing, dtype=p.dtype, peaks=peaks)
            values = {**record.__dict__, tracking.FLOP_BOUND: bound_of(model.cfg, p, record.mean_executed_loops)}
            run_id, _ = tracking.open_run(
                mc, experiment_id, name=tracking.speed_run_name(p.batch, p.seq_len, p.policy, keys[p]),
                tags={tracking.STAGE_KEY: stage_key, tracking.CONFIG_HASH: config_hash, tracking.METHOD: method,
                      tracking.CHECKPOINT: checkpoint, tracking.GIT_SHA: tracking.git_sha(),
                      tracking.POLICY_TAG: p.policy},
                key={tracking.LEVEL: tracking.BENCH, SPEED_KEY: keys[p]}, parent_run_id=parent_run_id,
                params={**{tracking.SPEED_PARAM + k: str(v) for k, v in {**p.__dict__, "repeats": repeats}.items()},
                        **{tracking.MACHINE_PARAM + k: str(v) for k, v in host.items()}})
            with tracking.terminated_on_exit(mc, run_id):
                tracking.log_metrics(mc, run_id, {k: float(values[k]) for k in tracking.SPEED_METRICS})
            (progress or _to_stderr)(
                f"speed{' ' + label if label else ''} batch {p.batch} × {p.seq_len} {p.policy}: full {record.time_full_s:.4f} s, "
                f"skip {record.time_skip_s:.4f} s, {record.speedup:.2f}x (loops {record.ideal_speedup:.2f}x, "
                f"FLOPs {values[tracking.FLOP_BOUND]:.2f}x)")
            records.append({**p.__dict__, **{k: values[k] for k in tracking.SPEED_METRICS}, "reused": False})
    finally:
        torch.set_num_threads(previous)
    return records


# ---- jobs: one per checkpoint (sweeps/speed.py) ------------------------------------------------
@dataclass(frozen=True)
class SpeedJob:
    """One checkpoint's points and where to record them; threads: the CPUs the job holds
    (they enter the speed key through the machine)."""

    checkpoint: Any  # trainables/evaluation.py's Checkpoint
    points: tuple[SpeedPoint, ...]
    repeats: int
    threads: int
    tracking_uri: str
    experiment: str
    artifact_root: str
    board: str = ""  # the progress board the driver prints (trainables/progress.py); "": stderr

    @property
    def label(self) -> str:
        return tracking.stage_run_name(self.checkpoint.stage, self.checkpoint.stage_key)

    @property
    def method(self) -> str:
        from looplab.stages import method_of

        return method_of(self.checkpoint.lineage)


def run_job(job: SpeedJob) -> list[dict]:
    """measure() on the job's checkpoint (nested under the run that trained it); each
    record with the checkpoint's label, method and R."""
    from trainables.progress import Reporter
    from trainables.storage import local_checkpoint

    ck = job.checkpoint
    mc = tracking.client(job.tracking_uri)
    experiment_id = tracking.ensure_experiment(mc, job.experiment, job.artifact_root)
    # A Ray task's stderr reaches the driver late or not at all: its lines go to the board.
    board = Reporter(job.board, job.label, min_seconds=0.0) if job.board else None
    records = measure(mc, experiment_id, ck.run_id or None, checkpoint=str(local_checkpoint(ck.path)),
                      stage_key=ck.stage_key, config_hash=ck.config_hash, method=job.method, points=list(job.points),
                      repeats=job.repeats, threads=job.threads, label="" if board else job.label,
                      progress=(lambda line: board.post("speed", wait=True, line=line)) if board else None)
    return [{"checkpoint": job.label, "method": job.method, "n_loops": ck.n_loops, **r} for r in records]


def execute(jobs: list[SpeedJob], *, cpus: float, gpus: float, inline: bool):
    """(job, its records or the exception that ended it) as each job finishes. inline:
    one after another in this process; otherwise one Ray task per job with these CPUs
    and GPUs (Ray must be initialised), so that Ray runs no more of them at once than
    the resources allow: with a whole machine's CPUs per job, one at a time."""
    if inline:
        for job in jobs:
            try:
                yield job, run_job(job)
            except Exception as e:  # noqa: BLE001 - one checkpoint's failure must not cost the others
                yield job, e
        return
    import ray

    remote = ray.remote(num_cpus=cpus, num_gpus=gpus)(run_job)
    pending = {remote.remote(job): job for job in jobs}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(done[0])
        try:
            yield job, ray.get(done[0])
        except Exception as e:  # noqa: BLE001 - a task that died (RayTaskError wraps the cause)
            yield job, e
