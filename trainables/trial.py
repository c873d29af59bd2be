"""The Tune function trainable: one trial = one pipeline of stages.

Each stage is a Ray Train TorchTrainer (Train V2: a Tune function launches the
trainer; `Tuner(trainer)` is deprecated). With num_workers=0 the trainer runs in
Ray Train's local mode: the stage trains in this trial's own process, which holds
the trial's CPUs (and GPU); no controller or worker actors are started, which on
2 cores saves 12-17 s per stage (five Ray processes, each importing Ray, some
torch). With num_workers=K >= 1 a worker group of K actors trains data-parallel.
A stage whose folder already holds a "done" marker is reused, not retrained, and its MLflow run says so (`reused_from`).
A trial whose MLflow run is FINISHED reports its recorded metrics and returns: a
rerun or resumed sweep never trains a finished trial twice.

config (Tune's param space, resolved):
  spec:     PipelineSpec.to_dict()
  point:    a grid point's values, e.g. {"beta": 0.1} (grid search)
  <name>:   a searcher's sampled values, and "seed"
  platform: PlatformSettings as a dict (tracking, storage, resources, run ids)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from looplab import dashboard, tracking
from looplab.checkpoint import TRAINER
from looplab.config import ExperimentConfig
from looplab.errors import Interrupted
from looplab.keys import stage_folder
from trainables.keyed_step import STAGE_STEP, open_step_run, record_of, set_aside, stage_record
from trainables.pipeline import PipelineSpec, checkpoint_of, stage_configs, stage_dir
from trainables.progress import Reporter
from trainables.shared_stage import stage_lock, stored_json, write_done
from trainables.stage_worker import StageJob, stage_worker_loop
from trainables.storage import Storage

WAITING_TRIAL_CPU = 0.01  # a trial that only waits on its worker group; {"cpu": 0} is rejected
INTERRUPTED = "interrupted"  # what a trial the user's stop ended reports to Tune instead of its figures


@dataclass(frozen=True)
class PlatformSettings:
    tracking_uri: str
    storage_path: str
    experiment: str  # MLflow experiment (one per sweep)
    sweep_run_id: str  # the parent run of this sweep invocation
    num_workers: int = 0  # 0: Ray Train local mode (the trial's process trains); K: K worker actors
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    worker_retries: int = 2  # restarts of a failed worker group per stage (in local mode: of the trial)
    quiet: bool = True
    progress_board: str = ""  # the named Ray actor the driver prints progress from ("" = none)
    # What a trial run logs of its last stage's evaluations: the sweep's metric and columns
    # and the description's figures (sweeps/launch.py); () logs every figure. The rest
    # stays on the stage run, where the analysis reads it.
    headline: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def trial_resources(self) -> dict[str, float]:
        """What Tune reserves for one trial: in local mode the worker's share (the
        trial's process trains); otherwise a sliver (it waits on its worker group,
        which reserves its own)."""
        if self.num_workers == 0:
            return {"cpu": self.cpus_per_worker, **({"gpu": self.gpus_per_worker} if self.gpus_per_worker else {})}
        return {"cpu": WAITING_TRIAL_CPU}


def trial_params(config: dict[str, Any]) -> dict[str, Any]:
    """The sampled values of a resolved Tune config: a grid point's values (under
    "point") or a searcher's samples, and the seed."""
    params = {k: v for k, v in config.items() if k not in ("spec", "platform", "point", "job")}
    return {**config.get("point", {}), **params}


def trial_label(params: dict[str, Any]) -> str:
    """How progress lines name a trial: its searched values, e.g. 'beta=0.1 seed=0'."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))


def run_trial(config: dict[str, Any]) -> None:
    from ray import tune

    spec, platform, mc, experiment_id, sha = _open(config)
    params = trial_params(config)
    stages = stage_configs(spec, params, platform.storage_path)
    final = stages[-1]
    lineage = [c.stage for c in stages]
    progress = Reporter(platform.progress_board, trial_label(params))
    if progress.stop_requested():  # the sweep was stopped before this trial started: no run for it
        tune.report({INTERRUPTED: 1, tracking.STAGE_KEY: final.stage_key()})
        return
    trial_run_args: dict[str, Any] = dict(
        name=tracking.trial_run_name(final.stage_key()),
        tags=tracking.config_tags(
            final, level=tracking.TRIAL, git=sha, lineage=lineage, **{tracking.SWEEP_TAG: platform.experiment}
        ),
        key={tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: final.stage_key()},
        parent_run_id=platform.sweep_run_id,
        params={**tracking.config_params(final), **tracking.search_params(params)},
    )
    trial_run, status = tracking.open_run(mc, experiment_id, **trial_run_args)
    stale = _stale(mc, experiment_id, trial_run, stages, platform.storage_path) if status == "FINISHED" else ""
    if status == "FINISHED" and not stale:  # trained by an earlier invocation of this sweep
        summary = _summary(mc, trial_run)
        progress.post("trial_end", status="reused", summary=_headline(summary))
        tune.report({**summary, tracking.STAGE_KEY: final.stage_key(), "skipped": 1})
        return
    if stale:  # its record outlived its files: retired (MLflow's delete), the trial runs afresh
        progress.post("trial_stale", why=stale)
        _retire(mc, experiment_id, trial_run)
        trial_run, _ = tracking.open_run(mc, experiment_id, **trial_run_args)

    try:
        with tracking.terminated_on_exit(mc, trial_run):
            for index, cfg in enumerate(stages):
                last = index == len(stages) - 1
                _run_stage(
                    StageInTrial(cfg, platform, mc, experiment_id, trial_run, sha, lineage[: index + 1], progress, last)
                )
            summary = _summary(mc, trial_run)
            tracking.set_description(mc, trial_run, dashboard.trial_description(trial_label(params), lineage, summary))
    except Interrupted:  # its runs are KILLED, the stage that trained has its checkpoint
        progress.post("trial_end", status="stopped")
        tune.report({INTERRUPTED: 1, tracking.STAGE_KEY: final.stage_key()})
        return
    progress.post("trial_end", status="done", summary=_headline(summary))
    tune.report({**summary, tracking.STAGE_KEY: final.stage_key(), "skipped": 0})


def _stale(mc, experiment_id: str, trial_run: str, stages: list[ExperimentConfig], storage_path: str) -> str:
    """Why a FINISHED trial no longer stands ("" when it does): a stage of it is not whole
    in the store, or was trained again since (its done marker names another run than the
    one the trial's stage run trained or reused)."""
    runs = mc.search_runs(
        [experiment_id],
        filter_string=f"tags.{tracking.LEVEL} = '{tracking.STAGE}' and tags.{tracking.TRIAL_RUN} = '{trial_run}'",
        max_results=len(stages) * 4 + 10,
    )
    trained_by = {
        r.data.tags.get(tracking.STAGE_KEY): r.data.tags.get(tracking.REUSED_FROM) or r.info.run_id for r in runs
    }
    for cfg in stages:
        record = record_of(storage_path, cfg)
        name = stage_folder(cfg.stage, cfg.stage_key())
        if not record.finished or record.done is None:
            return f"{name}: {record.problem or 'not in the store'}"
        if trained_by.get(cfg.stage_key()) != record.done["run_id"]:
            return f"{name}: trained again since this trial ran"
    return ""


def _retire(mc, experiment_id: str, trial_run: str) -> None:
    """Delete (MLflow's delete, which can be undone) a trial run and its stage runs."""
    children = mc.search_runs([experiment_id], filter_string=f"tags.{tracking.TRIAL_RUN} = '{trial_run}'")
    for run in children:
        mc.delete_run(run.info.run_id)
    mc.delete_run(trial_run)


def _headline(summary: dict[str, float]) -> dict[str, float]:
    """What a trial's final progress line shows: full-depth quality."""
    return {k: summary[k] for k in (tracking.VAL_PPL, tracking.VAL_ACCURACY) if k in summary}


def shared_prefixes(spec: PipelineSpec, points: list[dict[str, Any]], storage_path: str) -> list[dict[str, Any]]:
    """The stage chains several trials share and no one has trained yet, as jobs
    {"params": a trial's params, "n": how many of its first stages}: the sweep
    trains them first, with the whole machine, instead of letting one trial train
    them on its share while the others wait on the stage lock."""
    per_point = [stage_configs(spec, p, storage_path) for p in points]
    configs = {stage_dir(storage_path, cfg): cfg for cfgs in per_point for cfg in cfgs}
    chains = [[stage_dir(storage_path, cfg) for cfg in cfgs] for cfgs in per_point]
    uses = Counter(d for chain in chains for d in chain)
    jobs: dict[str, tuple[dict[str, Any], int, list[str]]] = {}  # last shared stage -> job
    for params, chain in zip(points, chains):
        n = 0
        while n < len(chain) and uses[chain[n]] > 1:
            n += 1
        if n:
            jobs.setdefault(chain[n - 1], (params, n, chain[:n]))
    # A chain that is the prefix of a longer one is trained by the longer one.
    inner = {d for _, _, chain in jobs.values() for d in chain[:-1]}
    return [
        {"params": params, "n": n}
        for last, (params, n, _) in jobs.items()
        if last not in inner and not record_of(storage_path, configs[last]).finished
    ]


def run_shared_prefix(config: dict[str, Any]) -> None:
    """The Tune function of a shared-prefix job: its stages, as runs under the sweep run."""
    from ray import tune

    spec, platform, mc, experiment_id, sha = _open(config)
    job = config["job"]
    stages = stage_configs(spec, job["params"], platform.storage_path)[: job["n"]]
    progress = Reporter(platform.progress_board, "shared " + "+".join(c.stage for c in stages))
    try:
        for index, cfg in enumerate(stages):
            lineage = [c.stage for c in stages[: index + 1]]
            _run_stage(
                StageInTrial(cfg, platform, mc, experiment_id, platform.sweep_run_id, sha, lineage, progress, False)
            )
    except Interrupted:
        tune.report({INTERRUPTED: 1})
        return
    tune.report({"stages": len(stages)})


def _open(config: dict[str, Any]) -> tuple[PipelineSpec, PlatformSettings, Any, str, str]:
    """What every Tune function of a sweep starts from: its pipeline, the platform
    settings, an MLflow client, the sweep's experiment id and the code's commit."""
    spec = PipelineSpec.from_dict(config["spec"])
    platform = PlatformSettings(**config["platform"])
    mc = tracking.client(platform.tracking_uri)
    experiment_id = tracking.ensure_experiment(mc, platform.experiment, Storage(platform.storage_path).path("mlflow"))
    return spec, platform, mc, experiment_id, tracking.git_sha()


def _summary(mc, run_id: str) -> dict[str, float]:
    """The trial's last value of every metric (its last stage's): searchers and
    schedulers read `Sweep.metric`, the summary table `Sweep.columns`."""
    return tracking.latest_metrics(mc, run_id)


@dataclass(frozen=True)
class StageInTrial:
    """One stage of one trial: its config, where it reports (the MLflow client, the
    sweep's experiment, the trial's run, progress) and its place in the trial."""

    cfg: ExperimentConfig
    platform: PlatformSettings
    mc: Any
    experiment_id: str
    trial_run: str  # the trial's run, or the sweep's for a shared chain's stage
    sha: str  # the code's commit
    lineage: list[str]  # the stages up to this one
    progress: Reporter
    last: bool  # the trial's last stage: its figures are the trial's

    @property
    def run_key(self) -> dict[str, str]:
        """The tags that find this trial's run of the stage."""
        return {
            tracking.LEVEL: tracking.STAGE,
            tracking.STAGE_KEY: self.cfg.stage_key(),
            tracking.TRIAL_RUN: self.trial_run,
        }

    def open_run(self, params: dict[str, str] | None = None, **tags: str) -> str:
        """This trial's run of the stage, found by its key or created, with the stage's tags."""
        cfg, platform = self.cfg, self.platform
        checkpoint = checkpoint_of(platform.storage_path, cfg)
        run_id, _ = open_step_run(
            self.mc,
            self.experiment_id,
            STAGE_STEP,
            cfg.stage_key(),
            name=tracking.stage_run_name(cfg.stage, cfg.stage_key()),
            parent_run_id=self.trial_run,
            tags=tracking.config_tags(
                cfg,
                level=tracking.STAGE,
                git=self.sha,
                lineage=self.lineage,
                **{tracking.CHECKPOINT: checkpoint},
                **tags,
            ),
            params=params,
            key_tags={tracking.TRIAL_RUN: self.trial_run},
        )
        return run_id


def _run_stage(stage: StageInTrial) -> None:
    """One stage of a trial as a keyed step: reused when the store holds it whole, trained
    again (said in one line) when its done marker vouches for files that are missing or
    damaged, else trained."""
    cfg, platform, progress = stage.cfg, stage.platform, stage.progress
    stop = progress.stop_requested()
    if stop:  # the sweep is stopping: no stage starts
        raise Interrupted(f"{cfg.stage} not started: the sweep was stopped ({stop})")
    storage = Storage(platform.storage_path)
    directory = stage_dir(platform.storage_path, cfg)
    checkpoint = checkpoint_of(platform.storage_path, cfg)
    with stage_lock(storage, directory):
        record = stage_record(storage, directory, checkpoint, cfg.train.steps, cfg.init_from)
        if record.broken:  # its files, or the parent it followed, are not what its marker vouched for
            progress.post("retrain", stage=cfg.stage, why=record.problem)
            set_aside(storage, directory, checkpoint)
            _supersede(stage.mc, stage.experiment_id, stage.run_key)
        elif record.finished and record.done is not None:
            _reuse_stage(stage, record.done)
            return
        run_id = _train_stage(stage)
        write_done(
            storage,
            directory,
            {
                "run_id": run_id,
                tracking.STAGE_KEY: cfg.stage_key(),
                "stage": cfg.stage,
                "metrics": tracking.latest_metrics(stage.mc, run_id),
            },
        )


def _reuse_stage(stage: StageInTrial, done: dict[str, Any]) -> None:
    """A stage the store holds whole: a run of this trial that names the run which
    trained it, with that run's figures (none at all when this trial trained it itself
    before a crash restarted the trial: its run already holds them)."""
    cfg, mc = stage.cfg, stage.mc
    own = tracking.find_run(mc, stage.experiment_id, **stage.run_key)
    if own is not None and own.info.run_id == done["run_id"]:
        # Logging the figures again would repeat the final step.
        stage.progress.post("resumed_done", stage=cfg.stage)
        return
    run_id = stage.open_run(**{tracking.REUSED_FROM: done["run_id"], tracking.REUSED: "true"})
    tracking.log_metrics(mc, run_id, done["metrics"], step=cfg.train.steps)
    if stage.last:
        shown = tracking.headline_metrics(done["metrics"], stage.platform.headline)
        tracking.log_metrics(mc, stage.trial_run, shown, step=cfg.train.steps)
    tracking.close_run(mc, run_id, ok=True)
    stage.progress.post("reused", stage=cfg.stage)


def _train_stage(stage: StageInTrial) -> str:
    """Train the stage under its own run (resuming its checkpoint, if one is there);
    Interrupted when the sweep's stop ended it early. Returns the run's id."""
    cfg, platform, progress = stage.cfg, stage.platform, stage.progress
    run_id = stage.open_run(params=tracking.config_params(cfg), **{tracking.REUSED: "false"})
    with tracking.terminated_on_exit(stage.mc, run_id):
        run_ids = [run_id] + ([stage.trial_run] if stage.last else [])
        _fit_stage(cfg, platform, run_ids, progress.trial, report_to_tune=stage.last)
        checkpoint = checkpoint_of(platform.storage_path, cfg)
        trainer = stored_json(Storage(platform.storage_path), f"{checkpoint}/{TRAINER}")
        step = trainer.get("step", 0)  # the checkpoint it left
        if step < cfg.train.steps:  # it stopped on the sweep's request (stage_worker.py)
            raise Interrupted(
                f"{cfg.stage} stopped at step {step}/{cfg.train.steps} "
                f"({progress.stop_requested() or 'stop requested'}); its checkpoint resumes it"
            )
    return run_id


def _supersede(mc, experiment_id: str, key: dict[str, str]) -> None:
    """Retire this trial's FINISHED run of a stage being trained again (MLflow's delete,
    which can be undone): its figures describe files that are gone, and the retraining
    logs its own from step 1 under a fresh run."""
    run = tracking.find_run(mc, experiment_id, **key)
    if run is not None and run.info.status == "FINISHED":
        mc.delete_run(run.info.run_id)


def _fit_stage(
    cfg: ExperimentConfig, platform: PlatformSettings, run_ids: list[str], label: str, *, report_to_tune: bool
) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from trainables.worker_watch import worker_watch

    local = platform.num_workers == 0
    use_gpu = platform.gpus_per_worker > 0
    folder = stage_folder(cfg.stage, cfg.stage_key())
    loop_config = StageJob(
        experiment=cfg,
        storage=platform.storage_path,
        stage_folder=folder,
        tracking_uri=platform.tracking_uri,
        run_ids=tuple(run_ids),
        threads=max(1, round(platform.cpus_per_worker)),
        local=local,
        trial_headline=platform.headline,
        report_to_tune=report_to_tune,
        quiet=platform.quiet,
        progress_board=platform.progress_board,
        trial_label=label,
    ).loop_config()
    # The name is the stage's key: a relaunched trainer finds its own run.
    name, storage = folder, Storage(platform.storage_path).path("ray_train")
    if local:
        # Local mode: the loop runs here; it reports to Tune itself (no callbacks run),
        # and a crash restarts the whole trial (Tune's FailureConfig), which resumes
        # the stage from its checkpoint folder like a restarted worker group would.
        TorchTrainer(
            stage_worker_loop,
            train_loop_config=loop_config,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name=name, storage_path=storage),
        ).fit()
        return
    resources = {"CPU": platform.cpus_per_worker, **({"GPU": platform.gpus_per_worker} if use_gpu else {})}
    trainer = TorchTrainer(
        stage_worker_loop,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=platform.num_workers, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            # Train V2's FailureConfig and callbacks (ray.train hands out V2's classes at
            # run time; the type checker reads V1's declarations).
            failure_config=FailureConfig(  # type: ignore[call-arg]
                max_failures=platform.worker_retries, controller_failure_limit=platform.worker_retries
            ),
            callbacks=[
                worker_watch(platform.progress_board, label, cfg.stage, platform.worker_retries),
                *([TuneReportCallback()] if report_to_tune else []),  # type: ignore[list-item]
            ],
        ),
    )
    trainer.fit()
