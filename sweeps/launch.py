"""Running a sweep: check everything, then dry-run or start (or join) Ray, run the
trials under Tune with live progress, and end with the summary table and the
analysis report.

A sweep script declares its own flags and a typed factory returning a `Sweep`, and
calls `main(description, add_flags, build)`. Every input is checked before Ray
starts; a bad one is a single line on stderr and exit status 2.

One sweep run per sweep: the parent MLflow run is keyed by the sweep's content
(`sweep_key`), so running the same command again, with or without --resume, adopts
it and its trial runs; runs of an earlier invocation whose process died (still
RUNNING) are closed as KILLED, with a pointer to the invocation that reopened them,
before the trials run (and reopen them). One invocation of a sweep runs at a time
(sweeps/lock.py): a second is refused before it touches MLflow, so the runs it would
close as orphans are provably the dead invocation's.

Ctrl-C or SIGTERM stops it (sweeps/stop.py): the first lets training stages checkpoint
and closes every run as KILLED, the second exits at once; the same command resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from looplab import dashboard, tracking
from looplab.config import ConfigError, config_key
from looplab.console import quiet_libraries
from looplab.costs.machine import MEMORY_CHECK_ENV
from looplab.errors import StorageFull, is_disk_full
from sweeps.dry_run import describe
from sweeps.flags import Common, Launch, parser
from sweeps.lock import SweepBusy, sweep_lock
from sweeps.runtime import check_ray_address, check_storage_path, check_tracking_uri, console_to_log, write_report
from sweeps.schedule import chains_in_trials, longest_first
from sweeps.stop import StopOnSignal, SweepStopped, resume_line
from sweeps.sweep import (
    Resources,
    Sweep,
    check_machine,
    compare_initialisations,
    cpu_share,
    fit_devices,
    sweep_key,
    trial_name,
    validate,
    waiting_cpu,
)
from sweeps.sweep_record import (
    SweepView,
    close_orphans,
    close_stopped_trial,
    describe_sweep_run,
    log_headline,
    open_sweep_run,
    print_summary,
    summary_table,
    sweep_params,
)
from sweeps.trial_watch import make_watch, stop_if_full, storage_full_line
from trainables.pipeline import stage_configs

RAY_TRAIN_ENV = {  # Ray Train settings for every stage (an environment value of the same name wins)
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",  # a worker group that cannot be placed fails, not hangs
    # The controller polls its workers this often (default 2 s); each poll it waits on
    # adds to a stage's start and end, which dominate short stages.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}
TEST_HOOKS = ("LOOPLAB_TEST_KILL_WORKER_AT_STEP",)  # test hooks reach the trials too

Build = Callable[[Common, argparse.Namespace], Sweep]


def main(
    description: str,
    add_flags: Callable[[argparse.ArgumentParser], None] | None,
    build: Build,
    argv: list[str] | None = None,
) -> int:
    """Parse the common flags and the sweep's own (add_flags may also change the
    common defaults), build the sweep, check everything, then dry-run or run."""
    p = parser(description)
    if add_flags is not None:
        add_flags(p)
    args = p.parse_args(argv)
    try:
        common, launch = Common.from_args(args), Launch.from_args(args)
        try:
            sweep = compare_initialisations(build(common, args), common.init_from)
        except ConfigError as e:  # an override the declaration applied: say it as the flag
            raise overrides_in_flag_terms(e, common) from None
        sweep, points, res, plans = prepare(sweep, launch)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if launch.dry_run:
        print(describe(sweep, launch, points, res, plans))
        if launch.doctor:  # the quick health check on every GPU node (sweeps/nodes.py)
            from sweeps.nodes import check_nodes, report

            text, ok = report(check_nodes(launch.address))
            print("\n" + text)
            return 0 if ok else 1
        return 0
    try:
        rows = run_sweep(sweep, launch, points, res)
    except SweepBusy as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except StorageFull as e:  # a trial's, or the driver's own write (sweeps/trial_watch.py)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except SweepStopped as e:  # the first Ctrl-C or SIGTERM (sweeps/stop.py)
        print(resume_line(e.reason), file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:  # the second: out at once
        print(resume_line("exited at once on a second signal"), file=sys.stderr)
        return 130
    except Exception as e:  # last: any other error is itself, unless it is a full disk
        if not is_disk_full(e):
            raise
        print(f"error: {storage_full_line(launch.storage_path)}", file=sys.stderr)
        return 1
    return 0 if rows and all(r["status"] != "error" for r in rows) else 1


def prepare(sweep: Sweep, launch: Launch):
    """Every check before Ray: the trial points, the storage and the tracking store
    (a dry run checks them as the run does, before anything is measured), the resources
    and each stage's plan (micro-batches fitted for --gpu-memory). Returns (sweep,
    points, resources, plans); raises ConfigError."""
    points, res = validate(sweep, launch)
    check_tracking_uri(launch.tracking_uri, launch.storage_path)  # first: it creates nothing, the storage's does
    check_storage_path(launch.storage_path)
    check_ray_address("--address", launch.address)  # the cluster answers, as Ray's does (a dry run too)
    sweep, plans = fit_devices(sweep, launch, points)
    check_machine(sweep, launch, points)  # each stage's time, and its memory where it trains here
    return sweep, points, res, plans


def overrides_in_flag_terms(error: ConfigError, common: Common) -> ConfigError:
    key = config_key(error.name) if error.name else None
    if key in common.overrides:
        return error.renamed("--set", f"{key}={common.overrides[key]}")
    return error


# ---- checks that need the outside world ------------------------------------------------


# ---- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRun:
    """One invocation of a sweep: what it runs (the sweep, its launch settings, the trial
    points, the resource plan) and where what it writes goes."""

    sweep: Sweep
    launch: Launch
    points: list[dict[str, Any]]
    res: Resources
    store: Any  # trainables.storage.Storage (imported lazily: pyarrow)
    local: Path  # the storage itself, or a local folder beside an object store
    uri: str  # the MLflow tracking URI
    key: str  # the sweep's content key

    @classmethod
    def of(cls, sweep: Sweep, launch: Launch, points: list[dict[str, Any]], res: Resources) -> "SweepRun":
        from trainables.storage import Storage

        store = Storage(launch.storage_path)
        local = store.scratch()
        uri = store.tracking_uri(launch.tracking_uri)
        return cls(sweep, launch, points, res, store, local, uri, sweep_key(sweep, launch))

    @property
    def experiment(self) -> str:  # the MLflow experiment: one per sweep and preset
        return tracking.experiment_name(self.sweep.name, self.sweep.spec.preset)

    @property
    def run_name(self) -> str:  # the sweep's MLflow run, and its Tune experiment's folder
        return tracking.sweep_run_name(self.sweep.name, self.key)

    @property
    def logs(self) -> Path:
        return self.local / "logs"

    @property
    def tune_path(self) -> str:
        return self.store.path("ray_tune")


def run_sweep(sweep: Sweep, launch: Launch, points: list[dict[str, Any]], res: Resources) -> list[dict[str, Any]]:
    """Start (or join) Ray, run the trials under Tune, return one row per trial."""
    run = SweepRun.of(sweep, launch, points, res)
    run.logs.mkdir(parents=True, exist_ok=True)
    with sweep_lock(run.store, run.key, sweep.name):  # SweepBusy: another invocation of this sweep runs now
        return _run_locked(run)


def headline(sweep: Sweep, launch: Launch, key: str, points: list[dict[str, Any]], log: Path) -> str:
    """The sweep's first console line: its name and key, the trials it will run, and where
    Ray's output goes. A grid runs its points (seeds included); an Optuna search runs
    --num-samples trials, whatever the count of the range corners the checks ran on."""
    if launch.search == "grid":
        trials = f"{len(points)} trial point(s)"
    else:
        ranges = ", ".join(f"{name} in [{lo:g}, {hi:g}] ({scale})" for name, (lo, hi, scale) in sweep.ranges.items())
        trials = f"{launch.num_samples} trial(s): Optuna samples within {ranges}"
    return f"sweep {sweep.name} [{key}]: {trials}; Ray's own output goes to {log}"


def _run_locked(run: SweepRun) -> list[dict[str, Any]]:
    """The sweep under its lock: its MLflow run, Ray, the shared stages and the trials,
    the downstream evaluation, then the summary and the report."""
    import ray

    # MLflow's and Optuna's INFO lines (a new database's tables, a new study) to the log
    quiet_libraries(run.logs / "ray.log", verbose=run.launch.verbose)
    mc = tracking.client(run.uri)
    # Its database errors (a full disk: "database or disk is full") are raised as well, and
    # the sweep says them in one line; the log's copy would be a traceback on the console.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    experiment_id = tracking.ensure_experiment(mc, run.experiment, run.store.path("mlflow"))
    sweep, launch = run.sweep, run.launch
    sweep_run = open_sweep_run(
        mc, experiment_id, run.run_name, run.key, sweep.spec.preset, axes=sweep.axes, params=sweep_params(sweep, launch)
    )
    view = SweepView(mc, experiment_id, sweep, launch, sweep_run, run.run_name, run.uri)
    links = view.publish()
    platform = _platform(run, sweep_run)
    print(headline(sweep, launch, run.key, run.points, run.logs / "ray.log"), file=sys.stderr)
    print(links, file=sys.stderr)
    _start_ray(run)
    at_once = ""  # why the trials' processes are gone, when the sweep ends before they do
    try:
        results, evaluation = _train_and_evaluate(run, platform, mc, sweep_run)
        rows = _rows(run, results, mc, experiment_id)
        # The report reads this sweep's trials alone, those it reused from another sweep's run too
        trial_keys = [r[tracking.STAGE_KEY] for r in rows]
        mc.set_tag(sweep_run, tracking.SWEEP_TRIALS, ",".join(trial_keys))  # python -m analysis --sweep-run reads it
        report = write_report(run.uri, run.experiment, sweep_run, run.local / "analysis" / run.run_name, trial_keys)
        table = summary_table(sweep, rows)
        log_headline(mc, sweep_run, sweep, rows)
        links = view.publish_summary(rows) or links
        describe_sweep_run(mc, sweep_run, sweep, table, report, experiment_id=experiment_id, view=run.run_name)
        print_summary(table, run.uri, run.experiment, sweep_run, run.store, run.local, run.run_name, report, links)
        if evaluation is not None:  # how many evaluations ran, how many the store already had
            print(evaluation.line())
        return rows
    except KeyboardInterrupt:
        at_once = "a second signal: the sweep exited at once"
        raise
    except StorageFull:
        at_once = "the storage filled up: the sweep stopped"
        raise
    finally:
        with console_to_log(run.logs / "ray.log"):
            ray.shutdown()
        if at_once:  # the trials' processes are gone now: their runs end KILLED, not RUNNING
            with contextlib.suppress(Exception):  # (a full disk may hold the database too)
                close_orphans(mc, experiment_id, sweep_run, reason=at_once)


def _platform(run: SweepRun, sweep_run: str):
    """What every trial of this sweep is told about the platform (trainables/trial.py)."""
    from trainables.progress import board_name
    from trainables.trial import PlatformSettings

    sweep = run.sweep
    return PlatformSettings(
        tracking_uri=run.uri,
        storage_path=run.store.root,
        experiment=run.experiment,
        sweep_run_id=sweep_run,
        num_workers=run.launch.num_workers,
        cpus_per_worker=run.res.cpus_per_worker,
        gpus_per_worker=run.launch.gpus_per_worker,
        progress_board=board_name(run.run_name),
        headline=tuple(dict.fromkeys([sweep.metric, *sweep.columns, *(key for key, _ in dashboard.TRIAL_FIGURES)])),
    )


def _start_ray(run: SweepRun) -> None:
    """ray.init with the environment every trial needs (Ray Train's settings, the test
    hooks and the memory check's override), its console output into the sweep's log."""
    import ray

    env = {name: os.environ.get(name, default) for name, default in RAY_TRAIN_ENV.items()}
    os.environ.update(env)
    env.update({name: os.environ[name] for name in TEST_HOOKS if name in os.environ})
    if MEMORY_CHECK_ENV in os.environ:  # the memory check's override reaches every trial's train()
        env[MEMORY_CHECK_ENV] = os.environ[MEMORY_CHECK_ENV]
    with console_to_log(run.logs / "ray.log"):
        ray.init(
            address=run.launch.address or None,
            runtime_env={"env_vars": env},
            include_dashboard=None,
            log_to_driver=False,
            configure_logging=False,
        )


def _train_and_evaluate(run: SweepRun, platform, mc, sweep_run: str):
    """The shared stages, the trials and the downstream evaluation, printing progress and
    stopping between them on Ctrl-C or SIGTERM: (Tune's results, the evaluation summary)."""
    from trainables.progress import Printer
    from trainables.trial import trial_params

    with (
        tracking.terminated_on_exit(mc, sweep_run),
        Printer(platform.progress_board) as printer,
        StopOnSignal(printer.request_stop) as stop,
    ):
        if run.launch.search == "grid":
            _fit_shared_prefixes(run, platform)
        stop.check()  # a stop during the shared stages: the trials never start
        results = _fit(run, platform)
        stop.check()
        # Downstream evaluation of the trained checkpoints, what the store lacks (sweeps/evaluate.py;
        # imported here: lm-eval's machinery is needed only after training).
        from sweeps.evaluate import evaluate_trials

        evaluation = evaluate_trials(run.sweep, platform, [trial_params(r.config) for r in results])
        stop.check()
    return results, evaluation


def _rows(run: SweepRun, results, mc, experiment_id: str) -> list[dict[str, Any]]:
    """One summary row per trial: its values, the sweep's columns, its final stage key
    and how it ended (done, reused, stopped by a scheduler, error)."""
    from trainables.trial import trial_params

    rows = []
    for result in results:
        params = trial_params(result.config)
        metrics = result.metrics or {}
        final_key = stage_configs(run.sweep.spec, params, run.store.root)[-1].stage_key()
        stopped = not result.error and tracking.STAGE_KEY not in metrics  # a scheduler (ASHA) ended it early
        if stopped:
            close_stopped_trial(mc, experiment_id, final_key)
        status = "error" if result.error else "stopped" if stopped else ("reused" if metrics.get("skipped") else "done")
        rows.append(
            {
                **params,
                **{k: metrics.get(k) for k in run.sweep.columns},
                tracking.STAGE_KEY: final_key,
                "status": status,
            }
        )
    return rows


def _fit_shared_prefixes(run: SweepRun, platform) -> None:
    """Train the stages several trials share (e.g. the β ablation's pre-training)
    before the trials, each job with an even share of the whole machine: otherwise
    one trial trains them on its share while the CPUs of the waiting trials idle. Where
    the chains are as many as the trial slots or more, the trials train them instead
    (sweeps/schedule.chains_in_trials)."""
    from dataclasses import replace

    from ray import tune

    from trainables.trial import run_shared_prefix, shared_prefixes

    sweep, launch, res = run.sweep, run.launch, run.res
    jobs = shared_prefixes(sweep.spec, run.points, platform.storage_path)
    if not jobs or chains_in_trials(len(jobs), res.max_concurrent):  # as many as the slots: each in a trial
        return
    concurrent = min(len(jobs), res.max_concurrent or len(jobs))
    if not launch.address and not launch.cpus_per_worker:  # locally: the machine, split over the jobs
        share = cpu_share(res.cpus, concurrent, max(1, launch.num_workers), waiting_cpu(launch))
        platform = replace(platform, cpus_per_worker=max(share, res.cpus_per_worker))
    print(
        f"training {len(jobs)} shared stage chain(s) first, {concurrent} at a time, "
        f"{max(1, platform.num_workers)} worker(s) × {platform.cpus_per_worker} CPU each",
        file=sys.stderr,
    )
    errors = _tune(
        run,
        platform,
        f"{run.run_name}-shared",
        tune.with_resources(run_shared_prefix, platform.trial_resources()),
        param_space={"spec": sweep.spec.to_dict(), "platform": platform.to_dict(), "job": tune.grid_search(jobs)},
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrent, reuse_actors=True),
    ).errors
    if errors:
        raise RuntimeError(f"a shared stage failed: {errors[0]}")


def _fit(run: SweepRun, platform):
    """The trials under Tune: a grid in the order longest_first gives, or an Optuna
    search (with ASHA where asked); Tune's results."""
    from ray import tune

    from trainables.trial import run_trial, trial_params

    sweep, launch, res = run.sweep, run.launch, run.res
    # No Tuner.restore, even with --resume: it unpickles tuner.pkl from the storage, so
    # anyone who can write there could run code here. A fresh Tuner is the resume: the
    # trials find their finished stages and runs by content key.
    trainable = tune.with_resources(run_trial, platform.trial_resources())
    space: dict[str, Any] = {"spec": sweep.spec.to_dict(), "platform": platform.to_dict()}
    search_alg, scheduler, samples = None, None, 1
    if launch.search == "grid":
        # One grid_search over whole points, seeds included: paired values stay paired, and
        # Tune starts the trials in this order (longest first).
        space["point"] = tune.grid_search(longest_first(sweep, run.points, platform.storage_path))
    else:
        from ray.tune.search.optuna import OptunaSearch

        quiet_libraries(run.logs / "ray.log", verbose=launch.verbose)  # the handler Optuna's import installed
        for name, (low, high, scale) in sweep.ranges.items():
            space[name] = tune.loguniform(low, high) if scale == "log" else tune.uniform(low, high)
        space["seed"] = launch.seeds[0]
        # Define-by-run searchers take metric/mode themselves, not via TuneConfig.
        search_alg = OptunaSearch(metric=sweep.metric, mode=sweep.mode, seed=0)
        samples = launch.num_samples
    if launch.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(metric=sweep.metric, mode=sweep.mode, grace_period=1)

    def name_of(trial) -> str:
        return trial_name(trial_params(trial.config))

    return _tune(
        run,
        platform,
        run.run_name,
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            num_samples=samples,
            search_alg=search_alg,
            scheduler=scheduler,
            max_concurrent_trials=res.max_concurrent or None,
            trial_name_creator=name_of,
            trial_dirname_creator=name_of,
            # A new trial process costs ~7 s on 2 cores (Ray's worker start, then torch, MLflow
            # and looplab imported again): over the 45 short trials of paper_mini, minutes. A
            # trial reads everything it needs from its config and seeds its own generators, so
            # a reused process gives the same numbers (tests/test_determinism.py).
            reuse_actors=True,
        ),
    )


def _tune(run: SweepRun, platform, name: str, trainable, **tuner: Any):
    """Tune's run of `trainable` (its results under STORAGE/ray_tune/<name>), with Ray's
    console in ray.log, the trial restarts Ray's FailureConfig allows said on the console,
    and a full disk stopping it (StorageFull)."""
    from ray import tune

    watch = make_watch(platform)
    config = tune.RunConfig(
        name=name,
        storage_path=run.tune_path,
        failure_config=trial_failures(platform),
        verbose=0,
        callbacks=[watch],
        stop=watch.stopper,
    )
    with console_to_log(run.logs / "ray.log"):
        results = tune.Tuner(trainable, run_config=config, **tuner).fit()
    stop_if_full(watch, run.launch.storage_path)
    return results


def trial_failures(platform):
    """Tune's restarts of a failed trial; the restarted trial resumes its stage from
    the checkpoint folder. In local mode they are the only restarts there are, so
    they get the worker retries; a worker group retries on its own first."""
    from ray import tune

    return tune.FailureConfig(max_failures=platform.worker_retries if platform.num_workers == 0 else 1)


# ---- the end of a sweep ---------------------------------------------------------------------
