"""What every sweep script shares: the flags, the checks that run before Ray starts,
the dry-run plan, the Tune run and the summary table.

A sweep script declares a `Sweep` (a pipeline on a preset plus the values to search)
and calls `main(sweep_factory)`. Every input is checked before Ray starts; a bad one
is a single line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python sweeps/x.py` from anywhere: trainables/ must import
    sys.path.insert(0, str(REPO))

from looplab.config import ConfigError  # noqa: E402
from looplab.presets import PRESETS  # noqa: E402
from trainables.pipeline import PipelineSpec, stage_configs  # noqa: E402
from trainables.trial import WAITING_TRIAL_CPU  # noqa: E402

RAY_TRAIN_ENV = {  # Ray Train settings for every stage (an environment value of the same name wins)
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",  # a worker group that cannot be placed fails, not hangs
    # The controller polls its workers this often (default 2 s); each poll it waits on
    # adds to a stage's start and end, which dominate short stages.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}
DEFAULT_PRESET = "debug" if "debug" in PRESETS else "phop-debug"


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
    metric: str = "val_ppl"
    mode: str = "min"
    columns: tuple[str, ...] = ("val_ppl", "val_accuracy")  # summary-table metrics

    def __post_init__(self) -> None:
        # A threshold column must name a q the evaluation runs, or its cells stay empty.
        from looplab.evaluate import DEFAULT_QS

        for column in self.columns:
            found = re.match(r"(dense|skip)_q([0-9.]+)_", column)
            if found and float(found.group(2)) not in DEFAULT_QS:
                raise ValueError(f"Sweep.columns: {column!r} names q={found.group(2)}, which the threshold "
                                 f"evaluation does not run; allowed q: {', '.join(map(str, DEFAULT_QS))}")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"base preset (default {DEFAULT_PRESET})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every stage, e.g. train.steps=50 (repeatable)")
    p.add_argument("--tracking-uri", default="", help="MLflow URI (default sqlite:///STORAGE/mlflow.db)")
    p.add_argument("--storage-path", default="looplab-runs", help="stage checkpoints, Ray results, artifacts")
    p.add_argument("--address", default="", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep (Tuner.restore)")
    p.add_argument("--max-concurrent-trials", type=int, default=0, help="default: what the CPUs/GPUs fit")
    p.add_argument("--num-workers", type=int, default=0,
                   help="Ray Train workers per stage; 0 (default): Ray Train's local mode, the stage trains "
                        "in the trial's own process (no worker group to start); K: K data-parallel worker actors")
    p.add_argument("--cpus-per-worker", type=float, default=0.0, help="default: the CPUs left, shared evenly")
    p.add_argument("--gpus-per-worker", type=float, default=0.0)
    p.add_argument("--search", choices=("grid", "optuna"), default="grid")
    p.add_argument("--num-samples", type=int, default=8, help="Optuna trials (grid runs each point once)")
    p.add_argument("--scheduler", choices=("none", "asha"), default="none")
    p.add_argument("--seeds", default="0", help="comma-separated training seeds, e.g. 0,1,2")
    p.add_argument("--dry-run", action="store_true", help="print trials, resources and compute; start no Ray")
    return p


# ---- validation (before Ray) -----------------------------------------------------

def fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{name}={value!r} is invalid; allowed: {allowed}")


def check_preset(name: str) -> None:
    if name not in PRESETS:
        fail("--preset", name, " | ".join(sorted(PRESETS)))


def is_server(uri: str) -> bool:
    """An MLflow tracking server, as opposed to a store this process opens itself."""
    return uri.startswith(("http://", "https://"))


def check_tracking_server(uri: str, timeout: float = 10.0) -> None:
    """An http(s) tracking URI must answer MLflow's /health now: MLflow's client
    would otherwise retry each call for minutes before it fails, with Ray started."""
    if not is_server(uri):
        return
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            if response.status == 200:
                return
            problem = f"HTTP {response.status}"
    except OSError as e:  # refused, unresolvable, timed out, HTTP errors
        problem = str(getattr(e, "reason", e))
    fail("--tracking-uri", uri, f"a reachable MLflow server (GET /health: {problem}), or sqlite:///PATH")


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds):
        fail("--seeds", text, "comma-separated integers >= 0, e.g. 0,1,2")
    return seeds


def parse_list(flag: str, text: str, kind: type = float, example: str = "0.1,0.5") -> list[Any]:
    """A comma-separated flag value: one-line error naming the flag when malformed."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        fail(flag, text, f"comma-separated {kind.__name__}s, e.g. {example}")
    return values


def parse_pairs(flag: str, text: str) -> tuple[dict[str, int], ...]:
    """N⊗R pairs written NxR, e.g. "4x1,4x6" -> ({"n_layers": 4, "n_loops": 1}, ...)."""
    pairs = []
    for item in text.split(","):
        n, x, r = item.strip().lower().partition("x")
        if not (x and n.isdigit() and r.isdigit() and int(n) >= 1 and int(r) >= 1):
            fail(flag, text, "comma-separated NxR pairs with N, R >= 1, e.g. 4x1,4x6,24x1")
        pairs.append({"n_layers": int(n), "n_loops": int(r)})
    return tuple(pairs)


def parse_sets(items: list[str]) -> dict[str, Any]:
    from looplab.config import parse_value

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            fail("--set", item, "KEY=VALUE, e.g. train.steps=50")
        out[key] = parse_value(value)
    return out


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


def plan_resources(args, local: bool, n_trials: int) -> Resources:
    """Trial and worker CPU shares that add up. In local mode (--num-workers 0) a
    trial trains in its own process and holds the worker's share. With K worker
    actors a trial holds a sliver and waits on its worker group, so
    max_concurrent × (sliver + K × worker_cpu) ≤ CPUs; otherwise the worker groups
    never start and Ray retries forever."""
    if args.num_workers < 0:
        fail("--num-workers", args.num_workers, "an integer >= 0 (0: train in the trial's own process)")
    if args.gpus_per_worker < 0:
        fail("--gpus-per-worker", args.gpus_per_worker, "a number >= 0")
    cpus = float(os.cpu_count() or 1)
    gpus = _local_gpus()
    if local and args.gpus_per_worker > 0 and gpus == 0:
        fail("--gpus-per-worker", args.gpus_per_worker, "0 here (no CUDA device on this machine)")
    if local and args.num_workers > cpus:
        fail("--num-workers", args.num_workers, f"an integer in [0, {int(cpus)}] (CPUs on this machine)")
    if args.max_concurrent_trials < 0:
        fail("--max-concurrent-trials", args.max_concurrent_trials, "an integer >= 1 (0: what fits)")
    if args.cpus_per_worker < 0:
        fail("--cpus-per-worker", args.cpus_per_worker, "a number > 0 (0: the CPUs left, shared evenly)")
    if not local:  # a cluster's resources are Ray's (and its autoscaler's) to place
        return Resources(cpus, gpus, args.max_concurrent_trials, args.cpus_per_worker or 1.0)
    workers, waiting = max(1, args.num_workers), waiting_cpu(args)
    if args.gpus_per_worker > 0:
        fits = int(gpus // (args.gpus_per_worker * workers)) or 1
    else:
        fits = max(1, int(cpus // workers))
    concurrent = args.max_concurrent_trials or min(fits, n_trials)  # no CPUs held for trials that never come
    worker_cpu = args.cpus_per_worker or cpu_share(cpus, concurrent, workers, waiting)
    need = concurrent * (waiting + workers * worker_cpu)
    if worker_cpu <= 0 or need > cpus + 1e-9:
        fail("--max-concurrent-trials", concurrent,
             f"at most {fits} here: {concurrent} × ({waiting} + {workers} × {worker_cpu}) CPUs "
             f"= {need:.2f} > {cpus:g}")
    return Resources(cpus, gpus, concurrent, worker_cpu)


def waiting_cpu(args) -> float:
    """CPUs a trial holds beside its workers: none in local mode (it is the worker)."""
    return WAITING_TRIAL_CPU if args.num_workers else 0.0


def cpu_share(cpus: float, concurrent: int, workers: int, waiting: float) -> float:
    """The CPUs left after the waiting trials, split evenly over the workers,
    rounded down to 1/100 so the shares never add up to more than the machine."""
    return math.floor(100 * (cpus - concurrent * waiting) / (concurrent * workers)) / 100


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def validate(sweep: Sweep, args) -> tuple[list[dict[str, Any]], Resources]:
    """Every check that can run before Ray: returns the trial params and the plan."""
    check_preset(args.preset)
    seeds = parse_seeds(args.seeds)
    if args.search == "grid":
        for name, values in sweep.grid.items():
            if not values:
                fail(f"grid.{name}", values, "a non-empty list of values")
        if not sweep.grid and not sweep.points:
            fail("grid", {}, "at least one point")
        points = [{**p, "seed": seed} for p in grid_points(sweep) for seed in seeds]
    else:
        if args.num_samples < 1:
            fail("--num-samples", args.num_samples, "an integer >= 1")
        if not sweep.ranges:
            fail("--search", args.search, f"grid (the {sweep.name} sweep declares no ranges)")
        for name, (low, high, scale) in sweep.ranges.items():
            if not low <= high or (scale == "log" and low <= 0):
                fail(f"range.{name}", (low, high), "low <= high (and low > 0 on a log scale)")
        # The range's corners stand for every sample in the config checks below.
        points = [dict(zip(sweep.ranges, corner), seed=seeds[0])
                  for corner in itertools.product(*((lo, hi) for lo, hi, _ in sweep.ranges.values()))]
    if not points:
        fail("grid", {}, "at least one point")
    for point in points:  # each stage's config validates itself: β < 0, hp > 1, depth outside [1, R], ...
        for cfg in stage_configs(sweep.spec, point, args.storage_path):
            if args.num_workers >= 1 and cfg.train.batch_size % args.num_workers:
                fail("--num-workers", args.num_workers, f"a divisor of {cfg.stage}'s batch size "
                     f"{cfg.train.batch_size} (every worker trains an equal share)")
    n_trials = len(points) if args.search == "grid" else args.num_samples
    return points, plan_resources(args, local=not args.address, n_trials=n_trials)


# ---- naming ----------------------------------------------------------------------

def short_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def sweep_key(sweep: Sweep, args) -> str:
    """Names the sweep's Ray Tune run: its declaration, never a timestamp."""
    return short_hash({"spec": sweep.spec.to_dict(), "grid": sweep.grid, "points": sweep.points,
                       "ranges": sweep.ranges,
                       "search": args.search, "num_samples": args.num_samples, "seeds": args.seeds,
                       "scheduler": args.scheduler})


def trial_name(params: dict[str, Any]) -> str:
    return "trial-" + "-".join(f"{k}{v}" for k, v in sorted(params.items()))[:80] + "-" + short_hash(params)[:6]


# ---- dry run -----------------------------------------------------------------------

def describe(sweep: Sweep, args, points: list[dict[str, Any]], res: Resources) -> str:
    """The trial list, the resource plan and a compute estimate."""
    lines = [f"sweep {sweep.name} on preset {args.preset} ({args.search} search)", "", "trials:"]
    gpu = f", {args.gpus_per_worker} GPU" if args.gpus_per_worker else ""
    unique: dict[str, Any] = {}
    for point in points:
        stages = stage_configs(sweep.spec, point, args.storage_path)
        keys = " → ".join(f"{c.stage}:{c.trial_key()}" for c in stages)
        lines.append(f"  {json.dumps(point, sort_keys=True)}  {keys}")
        for c in stages:
            unique.setdefault(f"{c.stage}-{c.trial_key()}", c)
    if args.search == "optuna":
        lines.append(f"  (Optuna samples {args.num_samples} trials within {sweep.ranges}; corners shown)")
    shared = sum(len(sweep.spec.stages_of(p)) for p in points) - len(unique)
    lines += ["", f"stages: {len(unique)} to train ({shared} reused across trials)"]
    total_flops = total_tokens = 0.0
    for name, c in unique.items():
        tokens = c.train.steps * c.train.batch_size * c.train.seq_len
        flops = _training_flops(c)
        total_flops, total_tokens = total_flops + flops, total_tokens + tokens
        lines.append(f"  {name}: {c.train.steps} steps × {c.train.batch_size} × {c.train.seq_len} tokens "
                     f"≈ {flops:.2e} training FLOPs")
    lines += ["", f"compute: {total_tokens:,.0f} training tokens, ≈ {total_flops:.2e} FLOPs (3 × forward, looplab's FLOP count)",
              "resources: " + (f"local Ray, {res.cpus:g} CPUs, {res.gpus} GPUs" if not args.address
                               else f"Ray cluster at {args.address}"),
              f"  {res.max_concurrent or 'as many'} concurrent trial(s) × " + (
                  f"{res.cpus_per_worker} CPU{gpu} (Ray Train local mode: each trial trains in its own process)"
                  if not args.num_workers else
                  f"({WAITING_TRIAL_CPU} CPU trial + {args.num_workers} worker(s) × {res.cpus_per_worker} CPU{gpu})"),
              "  plus Ray's own start per sweep, and per stage " + (
                  "a few seconds of MLflow" if not args.num_workers else
                  "about 15-25 s on 2 cores to start its worker group")]
    if args.search == "grid":
        from trainables.trial import shared_prefixes

        jobs = shared_prefixes(sweep.spec, points, args.storage_path)
        if jobs:
            lines.append(f"  first: {len(jobs)} shared stage chain(s) not yet trained, each with an even share "
                         "of the machine, then the trials (which reuse them)")
    return "\n".join(lines)


def _training_flops(cfg) -> float:
    """3 × forward FLOPs × training tokens (backward ≈ 2 × forward), with looplab's
    own per-token accounting (backbone R times, LM head once). Built on the meta
    device, so even the paper presets cost no memory."""
    import torch

    from looplab.models.looped import LoopedLM

    with torch.device("meta"):
        model = LoopedLM(cfg.model)
    tokens = cfg.train.steps * cfg.train.batch_size * cfg.train.seq_len
    return 3.0 * model.flops_per_token(cfg.train.seq_len)["total"] * tokens


# ---- the run -----------------------------------------------------------------------

def run_sweep(sweep: Sweep, args, points: list[dict[str, Any]], res: Resources) -> list[dict[str, Any]]:
    """Start (or join) Ray, run the trials under Tune, return one row per trial."""
    import ray

    from looplab import tracking
    from trainables.trial import PlatformSettings, trial_params

    storage = Path(args.storage_path).expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    uri = args.tracking_uri or f"sqlite:///{storage / 'mlflow.db'}"
    key = sweep_key(sweep, args)
    experiment = f"{sweep.name}-{args.preset}"
    run_name = f"{sweep.name}-{key}"

    mc = tracking.client(uri)
    experiment_id = tracking.ensure_experiment(mc, experiment, storage / "mlflow")
    # One parent run per invocation; --resume continues the interrupted invocation's run.
    sweep_tags = {"level": tracking.SWEEP, "sweep_key": key, "preset": args.preset,
                  "git_sha": tracking.git_sha(), "command": " ".join(sys.argv)}
    if args.resume:
        sweep_run, _ = tracking.open_run(mc, experiment_id, name=run_name, tags=sweep_tags,
                                         key={"level": tracking.SWEEP, "sweep_key": key})
    else:
        sweep_run = mc.create_run(experiment_id, tags={**sweep_tags, "mlflow.runName": run_name},
                                  run_name=run_name).info.run_id
    platform = PlatformSettings(tracking_uri=uri, storage_path=str(storage), experiment=experiment,
                                sweep_run_id=sweep_run, num_workers=args.num_workers,
                                cpus_per_worker=res.cpus_per_worker, gpus_per_worker=args.gpus_per_worker)

    env = {name: os.environ.get(name, default) for name, default in RAY_TRAIN_ENV.items()}
    env["PYTHONPATH"] = str(REPO)
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    for name in ("LOOPLAB_TEST_KILL_WORKER_AT_STEP",):  # test hooks reach the workers too
        if name in os.environ:
            env[name] = os.environ[name]
    ray.init(address=args.address or None, runtime_env={"env_vars": env}, include_dashboard=None,
             log_to_driver=False, configure_logging=False)
    try:
        with tracking.terminated_on_exit(mc, sweep_run):
            if args.search == "grid":
                _fit_shared_prefixes(sweep, args, platform, points, res, storage / "ray_tune", run_name)
            results = _fit(sweep, args, platform, points, res, storage / "ray_tune", run_name)
        rows = []
        for result in results:
            params = trial_params(result.config)
            metrics = result.metrics or {}
            key = stage_configs(sweep.spec, params, str(storage))[-1].trial_key()
            stopped = not result.error and "trial_key" not in metrics  # a scheduler (ASHA) ended it early
            if stopped:
                close_stopped_trial(mc, experiment_id, key)
            rows.append({**params, **{k: metrics.get(k) for k in sweep.columns}, "trial_key": key,
                         "status": "error" if result.error else "stopped" if stopped
                         else ("reused" if metrics.get("skipped") else "done")})
        report = write_report(uri, experiment, sweep_run, storage / "analysis" / run_name)
        print_summary(sweep, rows, uri, experiment, sweep_run, storage, run_name, report)
        return rows
    finally:
        ray.shutdown()


def _fit_shared_prefixes(sweep: Sweep, args, platform, points, res: Resources, tune_path: Path,
                         run_name: str) -> None:
    """Train the stages several trials share (e.g. the β ablation's pre-training)
    before the trials, each job with an even share of the whole machine: otherwise
    one trial trains them on its share while the CPUs of the waiting trials idle."""
    from dataclasses import replace

    from ray import tune

    from trainables.trial import run_shared_prefix, shared_prefixes

    jobs = shared_prefixes(sweep.spec, points, platform.storage_path)
    if not jobs:
        return
    concurrent = min(len(jobs), res.max_concurrent or len(jobs))
    if not args.address and not args.cpus_per_worker:  # locally: the machine, split over the jobs
        share = cpu_share(res.cpus, concurrent, max(1, args.num_workers), waiting_cpu(args))
        platform = replace(platform, cpus_per_worker=max(share, res.cpus_per_worker))
    print(f"training {len(jobs)} shared stage chain(s) first, {concurrent} at a time, "
          f"{max(1, platform.num_workers)} worker(s) × {platform.cpus_per_worker} CPU each", file=sys.stderr)
    tuner = tune.Tuner(
        tune.with_resources(run_shared_prefix, platform.trial_resources()),
        param_space={"spec": sweep.spec.to_dict(), "platform": platform.to_dict(), "job": tune.grid_search(jobs)},
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrent),
        run_config=tune.RunConfig(name=f"{run_name}-shared", storage_path=str(tune_path),
                                  failure_config=trial_failures(platform), verbose=0))
    failed = [r for r in tuner.fit() if r.error]
    if failed:
        raise RuntimeError(f"a shared stage failed: {failed[0].error}")


def _fit(sweep: Sweep, args, platform, points, res: Resources, tune_path: Path, run_name: str):
    from ray import tune

    from trainables.trial import run_trial, trial_params

    trainable = tune.with_resources(run_trial, platform.trial_resources())
    path = tune_path / run_name
    if args.resume and tune.Tuner.can_restore(str(path)):
        tuner = tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True)
        return tuner.fit()
    space: dict[str, Any] = {"spec": sweep.spec.to_dict(), "platform": platform.to_dict()}
    search_alg, scheduler, samples = None, None, 1
    if args.search == "grid":
        # One grid_search over whole points: paired values stay paired.
        space["point"] = tune.grid_search(grid_points(sweep))
        space["seed"] = tune.grid_search(parse_seeds(args.seeds))
    else:
        from ray.tune.search.optuna import OptunaSearch

        for name, (low, high, scale) in sweep.ranges.items():
            space[name] = tune.loguniform(low, high) if scale == "log" else tune.uniform(low, high)
        space["seed"] = parse_seeds(args.seeds)[0]
        # Define-by-run searchers take metric/mode themselves, not via TuneConfig.
        search_alg = OptunaSearch(metric=sweep.metric, mode=sweep.mode, seed=0)
        samples = args.num_samples
    if args.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(metric=sweep.metric, mode=sweep.mode, grace_period=1)

    def name_of(trial) -> str:
        return trial_name(trial_params(trial.config))

    tuner = tune.Tuner(
        trainable, param_space=space,
        tune_config=tune.TuneConfig(num_samples=samples, search_alg=search_alg, scheduler=scheduler,
                                    max_concurrent_trials=res.max_concurrent or None,
                                    trial_name_creator=name_of, trial_dirname_creator=name_of),
        run_config=tune.RunConfig(name=run_name, storage_path=str(tune_path),
                                  failure_config=trial_failures(platform), verbose=0))
    return tuner.fit()


def trial_failures(platform):
    """Tune's restarts of a failed trial; the restarted trial resumes its stage from
    the checkpoint folder. In local mode they are the only restarts there are, so
    they get the worker retries; a worker group retries on its own first."""
    from ray import tune

    return tune.FailureConfig(max_failures=platform.worker_retries if platform.num_workers == 0 else 1)


def close_stopped_trial(mc, experiment_id: str, trial_key: str) -> None:
    """A trial the scheduler stopped was killed mid-stage: its MLflow runs (the
    trial and its unfinished stages) end KILLED instead of staying RUNNING."""
    from looplab import tracking

    trial = tracking.find_run(mc, experiment_id, level=tracking.TRIAL, trial_key=trial_key)
    if trial is None or trial.info.status != "RUNNING":
        return
    children = mc.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{trial.info.run_id}' "
                                                             "and attributes.status = 'RUNNING'")
    for run in [*children, trial]:
        mc.set_terminated(run.info.run_id, status="KILLED")


def write_report(uri: str, experiment: str, sweep_run: str, out: Path) -> dict[str, Path]:
    """The analysis report of the sweep (frontiers, tables, report.html), logged to
    its parent run. A sweep's results never depend on it: without the analysis
    extra, or when the runs support no plot, it says so and the sweep still succeeds."""
    try:
        from analysis.report import build_report
    except ImportError as e:
        print(f"analysis skipped ({e}); install the analysis extra: pip install -e '.[analysis]'", file=sys.stderr)
        return {}
    try:
        return build_report(uri, [experiment], out, sweep_run_id=sweep_run)
    except Exception as e:  # noqa: BLE001 - the sweep finished; a report problem is reported, not raised
        print(f"analysis failed: {type(e).__name__}: {e}", file=sys.stderr)
        return {}


def print_summary(sweep: Sweep, rows: list[dict[str, Any]], uri: str, experiment: str, sweep_run: str,
                  storage: Path, run_name: str, report: dict[str, Path] | None = None) -> None:
    params = [k for k in rows[0] if k not in (*sweep.columns, "trial_key", "status")] if rows else []
    header = [*params, *sweep.columns, "trial_key", "status"]
    table = [[_cell(r.get(h)) for h in header] for r in sorted(rows, key=lambda r: [str(r.get(p)) for p in params])]
    widths = [max(len(h), *(len(row[i]) for row in table)) if table else len(h) for i, h in enumerate(header)]
    print("\n" + "  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print(f"\nMLflow:      {uri}  experiment {experiment!r}, sweep run {sweep_run}")
    print(f"dashboard:   {uri}" if is_server(uri) else f"dashboard:   mlflow ui --backend-store-uri {uri}")
    print(f"checkpoints: {storage / 'stages'}")
    print(f"Ray results: {storage / 'ray_tune' / run_name}")
    if report:
        for name in ("frontier.png", "report.html"):
            if name in report:
                print(f"{name + ':':13s}{report[name]}")
    print(f"re-plot:     python {REPO / 'analysis' / 'frontier.py'} --tracking-uri {uri} --experiment {experiment} "
          f"--out {storage / 'analysis' / run_name}")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def main(make_sweep: Callable[[argparse.Namespace], Sweep], description: str, argv: list[str] | None = None,
         add_flags: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Parse the common flags (and the sweep's own, via add_flags, which may also
    change the common defaults), check everything, then dry-run or run."""
    p = parser(description)
    if add_flags is not None:
        add_flags(p)
    args = p.parse_args(argv)
    try:
        sweep = make_sweep(args)
        points, res = validate(sweep, args)
        if not args.dry_run:  # planning a cluster sweep from a laptop needs no server
            check_tracking_server(args.tracking_uri)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(describe(sweep, args, points, res))
        return 0
    rows = run_sweep(sweep, args, points, res)
    return 0 if rows and all(r["status"] != "error" for r in rows) else 1
