"""A sweep: its declaration (`Sweep`), the trial points, the checks that run before Ray
starts, the resource plan and the names derived from its content. Its dry run is
sweeps/dry_run.py, the order its trials start in sweeps/schedule.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from looplab.config import ConfigError, config_key, is_keyed
from looplab.config.paths import field_key
from looplab.costs.resources import StagePlan, plan_stage
from looplab.keys import LENIENT, SWEEP_KEY_LENGTH, TRIAL_NAME_KEY_LENGTH, digest, keyed_name, stage_folder
from looplab.policy import DEFAULT_QS, ExitPolicy
from looplab.tracking import EXECUTED_LOOPS, PPL, VAL_ACCURACY, VAL_PPL, parse_metric, policy_metric
from sweeps.flags import Launch, check_preset, fail
from sweeps.runtime import local_gpus
from trainables.pipeline import PipelineSpec, stage_configs
from trainables.trial import WAITING_TRIAL_CPU

# The gated point a summary table shows beside full depth: skip at q = 0.4, one of the
# DEFAULT_QS every gated stage's own evaluation logs, so its cells are filled.
SUMMARY_SKIP = ExitPolicy.skip(0.4)
SKIP_COLUMNS = (policy_metric(SUMMARY_SKIP, EXECUTED_LOOPS), policy_metric(SUMMARY_SKIP, PPL))


@dataclass(frozen=True)
class Sweep:
    """A sweep declaration.

    grid: param -> the values the grid takes (the params of PipelineSpec.searched);
      the grid is their product.
    points: param dicts taken together, e.g. paired N⊗R values [{"n_layers": 4,
      "n_loops": 6}, ...]; crossed with the grid's product when both are given.
    ranges: param -> (low, high, "log" | "linear") for --search optuna.
    """

    name: str
    spec: PipelineSpec
    grid: dict[str, list[Any]] = field(default_factory=dict)
    points: tuple[dict[str, Any], ...] = ()
    ranges: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    metric: str = VAL_PPL
    mode: str = "min"
    columns: tuple[str, ...] = (VAL_PPL, VAL_ACCURACY)  # summary-table metrics
    # The command-line flag behind a searched param or a config key the declaration
    # sets, e.g. {"hp": "--hps", "hole.lo": "--depth-range"}: a bad value is reported
    # in the user's terms, not as the config field it reached.
    flags: dict[str, str] = field(default_factory=dict)
    # A scan's axes: the searched params it varies one at a time (others, such as a
    # scan's hole range, derive from them). Recorded on the sweep run (tag scan_axes);
    # analysis/scan.py draws each effect along each axis. Not part of sweep_key.
    axes: tuple[str, ...] = ()
    # Downstream evaluation after training (trainables/evaluation.EvalGrid, sweeps/evaluate.py).
    # Not part of sweep_key: evaluations are keyed on their own, so a grown grid reuses the sweep.
    evaluation: Any = None

    def __post_init__(self) -> None:
        for axis in self.axes:
            if axis not in self.spec.searched:
                raise ConfigError(
                    f"Sweep.axes={axis!r} is invalid; allowed: searched params ({' | '.join(self.spec.searched)})"
                )
        # A threshold column must name a q the evaluation runs, or its cells stay empty.
        for column in self.columns:
            parsed = parse_metric(column)
            if parsed and parsed[0].q is not None and parsed[0].q not in DEFAULT_QS:
                raise ConfigError(
                    f"Sweep.columns={column!r} names q={parsed[0].q}, which the stages' evaluation "
                    f"does not run; allowed q: {', '.join(map(str, DEFAULT_QS))}"
                )


INIT_FROM = "init_from"  # the searched param of --init-from: train.init_from, in the pre-training only


def compare_initialisations(sweep: Sweep, checkpoints: tuple[str, ...]) -> Sweep:
    """The sweep with one more axis, how pre-training starts: for each Hugging Face
    checkpoint folder, its shape freshly initialised (hf-shape:PATH, "scratch") and its
    weights (hf:PATH, "retrofit"), so the two arms differ in the initial weights alone.
    Continued stages follow their parent; only the pre-training reads the param."""
    if not checkpoints:
        return sweep
    if INIT_FROM in sweep.spec.searched:
        raise ConfigError(f"--init-from is invalid for {sweep.name}: it already searches {INIT_FROM}")
    values = [f"{kind}:{path}" for path in checkpoints for kind in ("hf-shape", "hf")]
    spec = dataclasses.replace(
        sweep.spec,
        searched={**sweep.spec.searched, INIT_FROM: field_key(lambda c: c.train.init_from)},
        scopes={**sweep.spec.scopes, INIT_FROM: ("pretrain",)},
    )
    return dataclasses.replace(
        sweep, spec=spec, grid={**sweep.grid, INIT_FROM: values}, flags={**sweep.flags, INIT_FROM: "--init-from"}
    )


def grid_points(sweep: Sweep) -> list[dict[str, Any]]:
    """Every grid point (seed aside): the grid's product, crossed with the paired points."""
    names = list(sweep.grid)
    product = [dict(zip(names, values)) for values in itertools.product(*(sweep.grid[n] for n in names))]
    return [{**p, **q} for p in product for q in (sweep.points or ({},))]


@dataclass(frozen=True)
class Resources:
    cpus: float  # CPUs of the local machine (or of the cluster when known)
    gpus: int
    max_concurrent: int  # 0: no cap (a cluster: as many trials as Ray can place)
    cpus_per_worker: float


def plan_resources(launch: Launch, local: bool, n_trials: int) -> Resources:
    """Trial and worker CPU shares that add up. In local mode (--num-workers 0) a
    trial trains in its own process and holds the worker's share. With K worker
    actors a trial holds a sliver and waits on its worker group, so
    max_concurrent × (sliver + K × worker_cpu) ≤ CPUs; otherwise the worker groups
    never start and Ray retries forever."""
    if launch.num_workers < 0:
        fail("--num-workers", launch.num_workers, "an integer >= 0 (0: train in the trial's own process)")
    if launch.gpus_per_worker < 0:
        fail("--gpus-per-worker", launch.gpus_per_worker, "a number >= 0")
    cpus = float(os.cpu_count() or 1)
    gpus = local_gpus()
    if local and launch.gpus_per_worker > 0 and gpus == 0:
        fail("--gpus-per-worker", launch.gpus_per_worker, "0 here (no CUDA device on this machine)")
    if local and launch.num_workers > cpus:
        fail("--num-workers", launch.num_workers, f"an integer in [0, {int(cpus)}] (CPUs on this machine)")
    if launch.max_concurrent_trials < 0:
        fail("--max-concurrent-trials", launch.max_concurrent_trials, "an integer >= 1 (0: what fits)")
    if launch.cpus_per_worker < 0:
        fail("--cpus-per-worker", launch.cpus_per_worker, "a number > 0 (0: the CPUs left, shared evenly)")
    if local and launch.cpus_per_worker > cpus:  # Ray would wait for a node that never comes
        fail("--cpus-per-worker", launch.cpus_per_worker, f"a number in (0, {cpus:g}] (CPUs on this machine)")
    if not local:  # a cluster's resources are Ray's (and its autoscaler's) to place
        return Resources(cpus, gpus, launch.max_concurrent_trials, launch.cpus_per_worker or 1.0)
    workers, waiting = max(1, launch.num_workers), waiting_cpu(launch)
    if launch.gpus_per_worker > 0:
        fits = int(gpus // (launch.gpus_per_worker * workers)) or 1
    else:
        fits = max(1, int(cpus // workers))
    concurrent = launch.max_concurrent_trials or min(fits, n_trials)  # no CPUs held for trials that never come
    worker_cpu = launch.cpus_per_worker or cpu_share(cpus, concurrent, workers, waiting)
    need = concurrent * (waiting + workers * worker_cpu)
    if worker_cpu <= 0 or need > cpus + 1e-9:
        fail(
            "--max-concurrent-trials",
            concurrent,
            f"at most {fits} here: {concurrent} × ({waiting} + {workers} × {worker_cpu}) CPUs = {need:.2f} > {cpus:g}",
        )
    return Resources(cpus, gpus, concurrent, worker_cpu)


def waiting_cpu(launch: Launch) -> float:
    """CPUs a trial holds beside its workers: none in local mode (it is the worker)."""
    return WAITING_TRIAL_CPU if launch.num_workers else 0.0


def cpu_share(cpus: float, concurrent: int, workers: int, waiting: float) -> float:
    """The CPUs left after the waiting trials, split evenly over the workers,
    rounded down to 1/100 so the shares never add up to more than the machine."""
    return math.floor(100 * (cpus - concurrent * waiting) / (concurrent * workers)) / 100


def validate(sweep: Sweep, launch: Launch) -> tuple[list[dict[str, Any]], Resources]:
    """Every check that can run before Ray: returns the trial params and the plan."""
    check_preset(sweep.spec.preset)
    _check_stage_sets(sweep.spec)
    points = _trial_points(sweep, launch)
    _check_stage_configs(sweep, launch, points)
    _check_plan_flags(launch)
    n_trials = len(points) if launch.search == "grid" else launch.num_samples
    return points, plan_resources(launch, local=not launch.address, n_trials=n_trials)


def _check_stage_sets(spec) -> None:
    """--stage-set never sets a key the sweep searches, in a stage it searches it in."""
    for stage, overrides in spec.stage_overrides.items():
        for key in overrides:
            if any(
                target == key and stage in spec.scopes.get(param, spec.searched_stages or (stage,))
                for param, target in spec.searched.items()
            ):
                fail(
                    "--stage-set",
                    f"{stage}:{key}={overrides[key]}",
                    f"keys the sweep does not search ({key} is one of its axes: set its values with its own flag)",
                )


def _trial_points(sweep: Sweep, launch: Launch) -> list[dict[str, Any]]:
    """The trials' params, seeds included: a grid's points, or a search's range corners
    (which stand for every sample in the config checks)."""
    seeds = list(launch.seeds)
    if launch.search == "grid":
        for name, values in sweep.grid.items():
            if not values:
                fail(f"grid.{name}", values, "a non-empty list of values")
        if not sweep.grid and not sweep.points:
            fail("grid", {}, "at least one point")
        points = [{**p, "seed": seed} for p in grid_points(sweep) for seed in seeds]
    else:
        if launch.num_samples < 1:
            fail("--num-samples", launch.num_samples, "an integer >= 1")
        if not sweep.ranges:
            fail("--search", launch.search, f"grid (the {sweep.name} sweep declares no ranges)")
        for name, (low, high, scale) in sweep.ranges.items():
            if not low <= high or (scale == "log" and low <= 0):
                fail(f"range.{name}", (low, high), "low <= high (and low > 0 on a log scale)")
        points = [
            dict(zip(sweep.ranges, corner), seed=seeds[0])
            for corner in itertools.product(*((lo, hi) for lo, hi, _ in sweep.ranges.values()))
        ]
    if not points:
        fail("grid", {}, "at least one point")
    return points


def _check_stage_configs(sweep: Sweep, launch: Launch, points: list[dict[str, Any]]) -> None:
    """Each stage's config validates itself (β < 0, hp > 1, depth outside [1, R], ...),
    said in the flags' terms; the workers split every batch evenly."""
    for point in points:
        try:
            configs = stage_configs(sweep.spec, point, launch.storage_path)
        except ConfigError as e:
            raise in_flag_terms(e, sweep, point) from None
        for cfg in configs:
            if launch.num_workers >= 1 and cfg.train.batch_size % launch.num_workers:
                fail(
                    "--num-workers",
                    launch.num_workers,
                    f"a divisor of {cfg.stage}'s batch size "
                    f"{cfg.train.batch_size} (every worker trains an equal share)",
                )


def _check_plan_flags(launch: Launch) -> None:
    """The plan's own settings: device memory, its margin, MFU and the GPU's peak."""
    if launch.gpu_memory < 0:
        fail("--gpu-memory", launch.gpu_memory, "GiB per GPU > 0 (0: each stage's own micro-batching)")
    if not 0 <= launch.memory_margin < (launch.gpu_memory or float("inf")):
        fail("--memory-margin", launch.memory_margin, "GiB >= 0, less than --gpu-memory")
    if not 0 < launch.mfu <= 1:
        fail("--mfu", launch.mfu, "a fraction in (0, 1], e.g. 0.4")
    if launch.gpu_tflops <= 0:
        fail("--gpu-tflops", launch.gpu_tflops, "a peak in TFLOP/s > 0, e.g. 989")


# ---- devices: micro-batches and the per-stage plan --------------------------------------


def fit_devices(sweep: Sweep, launch: Launch, points: list[dict[str, Any]]) -> tuple[Sweep, dict[str, StagePlan]]:
    """Each distinct stage's plan (looplab/costs/resources.py) on the sweep's devices, keyed
    "stage-key". With --gpu-memory, every stage trains with the largest micro-batch
    that fits (the smallest any of its trials needs, so one setting per stage name),
    written into the sweep's per-stage overrides: those fields are unkeyed, so stage
    keys, reuse and the sweep's own key stay what they were."""
    ranks = max(1, launch.num_workers)
    path = "cuda" if launch.gpus_per_worker > 0 or launch.gpu_memory > 0 else "torch"
    budget = launch.gpu_memory or None
    unique = _unique_stages(sweep, launch, points)
    plans = {name: _plan_or_fail(cfg, ranks, path, budget, launch.memory_margin) for name, cfg in unique.items()}
    if budget is None:
        return sweep, plans
    chosen: dict[str, dict[str, Any]] = {}
    for plan in plans.values():
        mine = chosen.setdefault(
            plan.cfg.stage, {"train.micro_batch_size": plan.micro_batch, "train.activation_checkpointing": False}
        )
        mine["train.micro_batch_size"] = min(mine["train.micro_batch_size"], plan.micro_batch)
        mine["train.activation_checkpointing"] |= plan.checkpointing
    stage_overrides = {s: dict(v) for s, v in sweep.spec.stage_overrides.items()}
    for stage, values in chosen.items():
        stage_overrides.setdefault(stage, {}).update(values)
    fitted = dataclasses.replace(sweep, spec=dataclasses.replace(sweep.spec, stage_overrides=stage_overrides))
    unique = _unique_stages(fitted, launch, points)
    return fitted, {name: _plan_or_fail(cfg, ranks, path, None, launch.memory_margin) for name, cfg in unique.items()}


def _unique_stages(sweep: Sweep, launch: Launch, points: list[dict[str, Any]]) -> dict[str, Any]:
    unique: dict[str, Any] = {}
    for point in points:
        for c in stage_configs(sweep.spec, point, launch.storage_path):
            unique.setdefault(stage_folder(c.stage, c.stage_key()), c)
    return unique


def _plan_or_fail(cfg, ranks: int, path: str, budget: float | None, margin: float) -> StagePlan:
    return plan_stage(cfg, ranks=ranks, path=path, device_memory_gib=budget, margin_gib=margin)


def check_machine(sweep: Sweep, launch: Launch, points: list[dict[str, Any]]) -> None:
    """Each distinct stage against the machine (looplab/costs/machine.py), said about the
    flag that set the value: its time on its devices always; its memory when its trials
    train here on CPUs (a local sweep that runs, no --gpu-memory planning another device;
    a GPU trial checks its own device when it starts, as every train() does). Each stage
    alone: trials that run at once and do not fit together are refused as they start."""
    from looplab.costs.machine import check_training

    here = not launch.address and not launch.dry_run and not launch.gpu_memory and not launch.gpus_per_worker
    seen: set[str] = set()
    for point in points:
        for cfg in stage_configs(sweep.spec, point, launch.storage_path):
            folder = stage_folder(cfg.stage, cfg.stage_key())
            if folder not in seen:
                seen.add(folder)
                try:
                    check_training(cfg, "cpu", ranks=max(1, launch.num_workers), memory=here)
                except ConfigError as e:
                    raise in_flag_terms(e, sweep, point) from None


def in_flag_terms(error: ConfigError, sweep: Sweep, point: dict[str, Any]) -> ConfigError:
    """A config error raised by one trial point, said about the flag that set the
    value: a searched param's flag, the sweep's own flag for a key it declared, or
    --set / --stage-set for the user's overrides. Other errors pass unchanged."""
    if error.name is None:
        return error
    key = config_key(error.name)
    spec = sweep.spec
    for param, target in spec.searched.items():
        if target == key and param in point:
            flag = sweep.flags.get(param, f"--{param}")
            shown = point[param]
            if flag in ("--ranges", "--q-ranges", "--depth-range", "--pairs"):  # a pair of params: show both
                shown = "-".join(str(point[p]) for p, f in sweep.flags.items() if f == flag and p in point)
                shown = shown if flag != "--pairs" else shown.replace("-", "x")
            return error.renamed(flag, shown)
    if key in sweep.flags:
        return error.renamed(sweep.flags[key], error.value)
    for stage, values in spec.stage_overrides.items():
        if key in values:
            return error.renamed("--stage-set", f"{stage}:{key}={values[key]}")
    if key in spec.overrides:
        return error.renamed("--set", f"{key}={spec.overrides[key]}")
    # A preset's own value that a grid point made invalid (the hybrid's attention layers
    # at a smaller N): say which point, and that --set can give the field a value.
    swept = ", ".join(f"{sweep.flags.get(k, '--' + k)} {k}={v}" for k, v in point.items() if k != "seed")
    return ConfigError(
        f"{error} (at the grid point {swept}; set it with --set {key}=...)",
        name=error.name,
        value=error.value,
        allowed=error.allowed,
    )


# ---- naming --------------------------------------------------------------------------


def keyed_declaration(sweep: Sweep, launch: Launch) -> dict[str, Any]:
    """What names a sweep: its declaration with the keyed overrides only (micro-batching
    and cadence name the same sweep), the search and the seeds. sweep_key hashes it; the
    sweep run's params show it (sweeps/sweep_record.sweep_params)."""
    spec = sweep.spec.to_dict()
    spec["overrides"] = {k: v for k, v in spec["overrides"].items() if is_keyed(k)}
    spec["stage_overrides"] = {
        s: {k: v for k, v in o.items() if is_keyed(k)} for s, o in spec["stage_overrides"].items()
    }
    spec["stage_overrides"] = {s: o for s, o in spec["stage_overrides"].items() if o}
    return {
        "spec": spec,
        "grid": sweep.grid,
        "points": sweep.points,
        "ranges": sweep.ranges,
        "search": launch.search,
        "num_samples": launch.num_samples,
        "seeds": launch.seeds,
        "scheduler": launch.scheduler,
    }


def sweep_key(sweep: Sweep, launch: Launch) -> str:
    """Names the sweep's Ray Tune run: its declaration, never a timestamp. LENIENT: the
    JSON form stored sweep keys were made in (looplab/keys.py)."""
    return digest(keyed_declaration(sweep, launch), SWEEP_KEY_LENGTH, LENIENT)


def trial_name(params: dict[str, Any]) -> str:
    """A trial's name and Ray Tune folder: its params, readable (cut at 80 characters),
    then their digest, which tells apart trials the cut leaves alike."""
    readable = "trial-" + "-".join(f"{k}{v}" for k, v in sorted(params.items()))[:80]
    # A value may be a path (--init-from): the name is also a folder, so no path
    # separators (names without one, every name before --init-from, stay as they were).
    readable = re.sub(r"[/\\]", "_", readable)
    return keyed_name(readable, digest(params, TRIAL_NAME_KEY_LENGTH, LENIENT))
