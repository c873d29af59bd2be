"""Prefill speed as a step keyed by content: full against skip execution on a trained
checkpoint (paper §5.4; looplab/costs/timing.py measures).

A point is (checkpoint, batch, seq_len, skip policy, dtype, packing). Its key,
`speed_key`, hashes the checkpoint's stage key and weights, the point, the repeats and the machine
that times it (processor, CPU count, threads, device): a wall-clock figure belongs to its
hardware, so another machine measures again while a re-run here reuses. Each point is
one MLflow run (level bench, tags stage_key, config_hash, method, policy and speed_key;
params speed.* and machine.*; metrics tracking.SPEED_METRICS: the benchmark's figures
and the FLOP ratio of the speedup, looplab/costs/resources.py); a FINISHED run with the key is
never measured again.

Decoding under continuous arrivals (looplab/inference/arrivals.py; issue 27, item 6a) is the same
step for decoding: an `ArrivalPoint` is (checkpoint, slots, schedule, policy, request
stream), keyed the same way (`arrival_key`: the stage key, the point, the machine, the
warm-ups and repeats), one MLflow run each (level bench, the same tags; params speed.*
and machine.*; metrics `arrival_metrics`: tokens/s, decode tokens/s, d̄, the loop and
FLOP ratios and the speedup over full in the same schedule and slots). Full execution is
a point of its own (the baseline every speedup divides by), measured beside whichever
policies are missing, so a policy's speedup always comes from one invocation.

Timing wants the machine to itself: sweeps/paper_mini.py runs this step in the driver
after every trial has finished; sweeps/bench.py runs one job per checkpoint, each with
the whole machine (or one GPU) to itself.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

from looplab import tracking
from looplab.keys import digest
from trainables.keyed_step import BENCH_STEP, open_step_run, stored_weights, weights_key
from trainables.storage import Storage


@dataclass(frozen=True)
class SpeedPoint:
    batch: int
    seq_len: int
    policy: str  # a skip policy, e.g. skip:0.2
    dtype: str = "fp32"
    packing: str = "auto"


def machine(device: str, threads: int) -> dict[str, Any]:
    """What a wall-clock figure depends on beside the model and the point."""
    return {
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "device": device,
    }


ARRIVALS = "arrivals"  # an arrivals point's kind (looplab/costs/arrival_bench.py's ArrivalRecord.kind)


@dataclass(frozen=True)
class ArrivalPoint:
    """One served configuration of the arrivals benchmark (looplab/costs/arrival_bench.py): a
    request stream (requests, prompt_len and new_tokens inclusive ranges, seed) served
    by `slots` cache rows under one schedule and policy (full is a point too)."""

    slots: int
    schedule: str  # depth | lockstep
    policy: str  # a policy spec; full is the baseline
    requests: int
    prompt_len: tuple[int, int]
    new_tokens: tuple[int, int]
    seed: int = 0
    attention_fill: str = "hole"  # looplab.models.cache.HOLE (which brings torch)
    kind: str = ARRIVALS  # in the key and the params: an arrivals point never shares a prefill point's key

    def params(self) -> dict[str, str]:
        """The point as run params (ranges as LOW-HIGH, as the command line writes them)."""
        text = lambda v: f"{v[0]}-{v[1]}" if isinstance(v, tuple) else str(v)  # noqa: E731
        return {tracking.SPEED_PARAM + k: text(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ArrivalPlan:
    """A checkpoint's arrivals points and how each is timed (warm-up and timed runs)."""

    points: tuple[ArrivalPoint, ...]
    warmup: int = 1
    repeats: int = 3


def speed_key(weights: str, point: SpeedPoint, host: dict[str, Any], repeats: int) -> str:
    """A speed point's key; `weights` is the checkpoint's weights_key (trainables/keyed_step.py)."""
    return digest({"weights": weights, "point": point.__dict__, "machine": host, "repeats": repeats})


def arrival_key(weights: str, point: ArrivalPoint, host: dict[str, Any], warmup: int, repeats: int) -> str:
    """speed_key's payload for an arrivals point: the warm-ups join the repeats, since a
    cold first run is part of what a median over few repeats measures."""
    return digest(
        {
            "weights": weights,
            "point": point.__dict__,
            "machine": host,
            "repeats": {"warmup": warmup, "repeats": repeats},
        }
    )


def plan_keys(weights: str, plan: ArrivalPlan, host: dict[str, Any]) -> dict[ArrivalPoint, str]:
    return {p: arrival_key(weights, p, host, plan.warmup, plan.repeats) for p in plan.points}


def host_of(threads: int) -> dict[str, Any]:
    """This process's machine() as measure() records it: the CUDA device when there is
    one (the benchmark then runs on it), else the CPU."""
    import torch

    return machine("cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(), threads)


def bound_of(model_cfg, point: SpeedPoint, executed_loops: float) -> float:
    """The point's FLOP ratio (looplab/costs/resources.py) at its measured executed loops: a
    prefill reads out at the last position only."""
    from looplab.costs.resources import flop_ratio, prefill_flops
    from looplab.policy import ExitPolicy

    f0, fr = prefill_flops(model_cfg, point.seq_len, ExitPolicy.parse(point.policy), readout="last")
    return flop_ratio(f0, fr, model_cfg.n_loops, executed_loops)


def timed_model_and_task(checkpoint: str):
    """The checkpoint's model in eval mode on the device the benchmarks time (CUDA when
    there is one), and its task (for held-out text; None without an experiment)."""
    import torch

    from looplab.checkpoint import experiment_task, load_model

    model = load_model(checkpoint).eval()
    model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return model, experiment_task(model)


def machine_params(host: dict[str, Any]) -> dict[str, str]:
    return {tracking.MACHINE_PARAM + k: str(v) for k, v in host.items()}


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BenchTarget:
    """The checkpoint a bench step times, and what its runs are tagged with."""

    checkpoint: str  # a local checkpoint folder
    stage_key: str
    config_hash: str
    method: str

    @functools.cached_property
    def weights_key(self) -> str:
        """Its points' keys read the stage's key and the weights it holds (keyed_step.weights_key)."""
        return weights_key(self.stage_key, stored_weights(Storage(self.checkpoint), self.checkpoint))

    def tags(self, policy: str) -> dict[str, str]:
        """A bench run's tags: the checkpoint it times and the policy."""
        return {
            tracking.STAGE_KEY: self.stage_key,
            tracking.CONFIG_HASH: self.config_hash,
            tracking.METHOD: self.method,
            tracking.CHECKPOINT: self.checkpoint,
            tracking.POLICY_TAG: policy,
        }


@dataclass(frozen=True)
class _BenchRuns:
    """Where a bench step's measured points go: each a FINISHED bench run (the keyed
    step's output) under the parent run, tagged with the checkpoint and its policy,
    with the machine's params beside the point's."""

    mc: Any
    experiment_id: str
    parent_run_id: str | None
    target: BenchTarget
    host: dict[str, Any]

    def record(self, key: str, name: str, policy: str, params: dict[str, str], metrics: dict[str, float]) -> None:
        run_id, _ = open_step_run(
            self.mc,
            self.experiment_id,
            BENCH_STEP,
            key,
            name=name,
            parent_run_id=self.parent_run_id,
            tags=self.target.tags(policy),
            params={**params, **machine_params(self.host)},
        )
        with tracking.terminated_on_exit(self.mc, run_id):
            tracking.log_metrics(self.mc, run_id, metrics)


def measure(
    mc,
    experiment_id: str,
    parent_run_id: str | None,
    target: BenchTarget,
    *,
    points: list[SpeedPoint],
    repeats: int = 5,
    threads: int | None = None,
    label: str = "",
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """The benchmark record (looplab/costs/timing.py's BenchRecord as a dict) of every point on
    this checkpoint: read from its FINISHED run when there is one, else measured here and
    logged. A line per measured point goes to `progress` (default: stderr)."""
    from looplab.costs.timing import bench_point, measured_peaks, prefill_peaks
    from looplab.policy import ExitPolicy
    from looplab.tasks.base import heldout_ids

    threads = threads or os.cpu_count() or 1
    host = host_of(threads)
    runs = _BenchRuns(mc, experiment_id, parent_run_id, target, host)
    keys = {p: speed_key(target.weights_key, p, host, repeats) for p in points}
    records, todo = _stored_points(mc, experiment_id, keys, target.checkpoint)
    if not todo:
        return records
    with _torch_threads(threads):
        model, task = timed_model_and_task(target.checkpoint)
        device = next(model.parameters()).device
        calls = [
            dict(
                model=model,
                ids=heldout_ids(model, task, p.batch, p.seq_len).to(device),
                policy=ExitPolicy.parse(p.policy),
                packing=p.packing,
                dtype=p.dtype,
            )
            for p in todo
        ]
        # Every point's memory first, in one child process on a CPU (looplab/costs/timing.py): one
        # process start per checkpoint, not per point; then the timing, here.
        for p, call, peaks in zip(todo, calls, measured_peaks(prefill_peaks, calls)):
            ids, policy = call["ids"], call["policy"]
            record = bench_point(model, ids, policy, repeats=repeats, packing=p.packing, dtype=p.dtype, peaks=peaks)
            values = {**record.__dict__, tracking.FLOP_RATIO: bound_of(model.cfg, p, record.mean_executed_loops)}
            runs.record(
                keys[p],
                tracking.speed_run_name(p.batch, p.seq_len, p.policy, keys[p]),
                p.policy,
                params={tracking.SPEED_PARAM + k: str(v) for k, v in {**p.__dict__, "repeats": repeats}.items()},
                metrics={k: float(values[k]) for k in tracking.SPEED_METRICS},
            )
            (progress or _to_stderr)(
                f"speed{' ' + label if label else ''} batch {p.batch} × {p.seq_len} {p.policy}: full {record.time_full_s:.4f} s, "
                f"skip {record.time_skip_s:.4f} s, {record.speedup:.2f}x (loops {record.ideal_speedup:.2f}x, "
                f"FLOPs {values[tracking.FLOP_RATIO]:.2f}x)"
            )
            records.append({**p.__dict__, **{k: values[k] for k in tracking.SPEED_METRICS}, "reused": False})
    return records


def _stored_points(
    mc, experiment_id: str, keys: dict[SpeedPoint, str], checkpoint: str
) -> tuple[list[dict], list[SpeedPoint]]:
    """(the record of each point the store holds FINISHED, the points it lacks). A run
    logged before the FLOP ratio was gets it now, from the model's config (no timing)."""
    records, todo = [], []
    for p, key in keys.items():
        run = BENCH_STEP.finished_run(mc, experiment_id, key)
        if run is None:
            todo.append(p)
            continue
        values = {k: run.data.metrics[k] for k in tracking.SPEED_METRICS if k in run.data.metrics}
        if tracking.FLOP_RATIO not in values and tracking.MEAN_LOOPS in values:
            from looplab.checkpoint import read_model_config

            values[tracking.FLOP_RATIO] = bound_of(read_model_config(checkpoint), p, values[tracking.MEAN_LOOPS])
            tracking.log_metrics(mc, run.info.run_id, {tracking.FLOP_RATIO: values[tracking.FLOP_RATIO]})
        records.append({**p.__dict__, **values, "reused": True})
    return records, todo


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """torch's threads set to the job's CPUs for the block (timing depends on them)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ---- decoding under continuous arrivals -----------------------------------------------------------


def arrival_metrics(record) -> dict[str, float]:
    """An ArrivalRecord's logged figures (tracking.ARRIVAL_METRICS): its tokens/s, d̄, the loop
    bound R/d̄, the FLOP ratio of d̄ (as bench_arrivals computed it) and the speedup."""
    d_bar = record.mean_executed_loops
    return {
        tracking.TOKENS_PER_S: record.tokens_per_s,
        tracking.DECODE_TOKENS_PER_S: record.decode_tokens_per_s,
        tracking.MEAN_LOOPS: d_bar,
        tracking.LOOP_BOUND: record.n_loops / d_bar if d_bar else float("nan"),
        tracking.FLOP_RATIO: record.flop_ratio,
        tracking.SPEEDUP: record.speedup,
        tracking.DECODE_TOKENS_PER_S_MIN: record.decode_tokens_per_s_min,
        tracking.DECODE_TOKENS_PER_S_MAX: record.decode_tokens_per_s_max,
        tracking.SPEEDUP_MIN: record.speedup_min,
        tracking.SPEEDUP_MAX: record.speedup_max,
    }


def _missing_bench(plan: ArrivalPlan, todo: list[ArrivalPoint]):
    """The smallest ArrivalBench that measures every missing point: their slots,
    schedules and policies (bench_arrivals adds full, the baseline, to each schedule).
    Its cross product may time a stored point again; only the missing ones are logged."""
    from looplab.costs.arrival_bench import ArrivalBench
    from looplab.inference.arrivals import RequestStream
    from looplab.policy import ExitPolicy

    first = todo[0]  # one stream and fill per plan
    policies = tuple(dict.fromkeys(ExitPolicy.parse(p.policy) for p in todo))  # full alone: full's run only
    return ArrivalBench(
        RequestStream(first.requests, first.prompt_len, first.new_tokens, first.seed),
        slots=tuple(dict.fromkeys(p.slots for p in todo)),
        policies=policies,
        schedules=tuple(dict.fromkeys(p.schedule for p in todo)),
        warmup=plan.warmup,
        repeats=plan.repeats,
        attention_fill=first.attention_fill,
    )


def _stored_arrivals(
    mc, experiment_id: str, keys: dict[ArrivalPoint, str]
) -> tuple[dict[ArrivalPoint, dict], list[ArrivalPoint]]:
    """(the record of each point the store holds FINISHED, the points it lacks)."""
    records, todo = {}, []
    for p, key in keys.items():
        run = BENCH_STEP.finished_run(mc, experiment_id, key)
        if run is not None:
            values = {k: run.data.metrics[k] for k in tracking.ARRIVAL_METRICS if k in run.data.metrics}
            records[p] = {**p.__dict__, **values, "reused": True}
        else:
            todo.append(p)
    return records, todo


def measure_arrivals(
    mc,
    experiment_id: str,
    parent_run_id: str | None,
    target: BenchTarget,
    *,
    plan: ArrivalPlan,
    threads: int | None = None,
    label: str = "",
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Every arrivals point of the plan on this checkpoint, as a dict of the point and
    its tracking.ARRIVAL_METRICS: read from its FINISHED run when there is one, else measured
    (looplab.costs.arrival_bench.bench_arrivals, once for all missing points) and logged, a line
    per measured point to `progress` (default: stderr)."""

    from looplab.costs.arrival_bench import bench_arrivals

    threads = threads or os.cpu_count() or 1
    host = host_of(threads)
    runs = _BenchRuns(mc, experiment_id, parent_run_id, target, host)
    keys = plan_keys(target.weights_key, plan, host)
    records, todo = _stored_arrivals(mc, experiment_id, keys)
    if not todo:
        return [records[p] for p in keys]
    wanted = {(p.slots, p.schedule, p.policy): p for p in todo}
    say = progress or _to_stderr
    tag = f" {label}" if label else ""

    def log(record) -> None:
        point = wanted.get((record.slots, record.schedule, record.policy))
        if point is None:  # timed only as the cross product's by-product; its stored run stands
            return
        values = arrival_metrics(record)
        runs.record(
            keys[point],
            tracking.arrivals_run_name(point.slots, point.schedule, point.policy, keys[point]),
            point.policy,
            params={
                **point.params(),
                tracking.SPEED_PARAM + "warmup": str(plan.warmup),
                tracking.SPEED_PARAM + "repeats": str(plan.repeats),
            },
            metrics={k: v for k, v in values.items() if math.isfinite(v)},
        )
        say(
            f"arrivals{tag} slots {point.slots} {point.schedule} {point.policy}: {record.tokens_per_s:.0f} tok/s, "
            f"decode {record.decode_tokens_per_s:.0f} tok/s, d̄ {record.mean_executed_loops:.2f}, "
            f"{record.speedup:.2f}x (FLOPs {record.flop_ratio:.2f}x)"
        )
        records[point] = {**point.__dict__, **values, "reused": False}

    with _torch_threads(threads):
        model, task = timed_model_and_task(target.checkpoint)
        bench_arrivals(model, task, _missing_bench(plan, todo), on_record=log)
    return [records[p] for p in keys]  # the plan's order, stored and measured alike


# ---- jobs: one per checkpoint (sweeps/bench.py runs them with keyed_step.run_jobs) -----------
@dataclass(frozen=True)
class BenchJob:
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
    arrivals: ArrivalPlan | None = None  # the decode benchmark under continuous arrivals too (opt-in)

    @property
    def label(self) -> str:
        return tracking.stage_run_name(self.checkpoint.stage, self.checkpoint.stage_key)

    @property
    def method(self) -> str:
        from looplab.stages import method_of

        return method_of(self.checkpoint.lineage)


def run_bench_job(job: BenchJob) -> list[dict]:
    """measure() on the job's checkpoint (nested under the run that trained it); each
    record with the checkpoint's label, method and R."""
    from trainables.progress import Reporter
    from trainables.storage import local_checkpoint

    ck = job.checkpoint
    mc = tracking.client(job.tracking_uri)
    experiment_id = tracking.ensure_experiment(mc, job.experiment, job.artifact_root)
    # A Ray task's stderr reaches the driver late or not at all: its lines go to the board.
    board = Reporter(job.board, job.label, min_seconds=0.0) if job.board else None
    # One local copy of the checkpoint and one progress sink for both benchmarks.
    target = BenchTarget(str(local_checkpoint(ck.path)), ck.stage_key, ck.config_hash, job.method)
    common: dict[str, Any] = dict(
        threads=job.threads,
        label="" if board else job.label,
        progress=(lambda line: board.post("speed", wait=True, line=line)) if board else None,
    )
    parent = ck.run_id or None
    records = measure(mc, experiment_id, parent, target, points=list(job.points), repeats=job.repeats, **common)
    if job.arrivals is not None:
        records += measure_arrivals(mc, experiment_id, parent, target, plan=job.arrivals, **common)
    return [{"checkpoint": job.label, "method": job.method, "n_loops": ck.n_loops, **r} for r in records]
