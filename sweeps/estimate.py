"""A sweep's wall time on this machine, measured before it runs (the dry run's estimate).

Every distinct stage the sweeps would train (by stage key; a stage several trials share
counts once, a stage the storage already holds counts nothing) is probed here:
looplab.training.probe.probe_seconds times a few training steps and one evaluation with the
threads a trial gets. A stage's time is steps × step time + evaluations × evaluation
time. The estimate then replays the sweep's schedule rather than dividing the work by
the concurrency, because the work does not pack evenly:

  shared chains  where they are fewer than the slots, the stage chains several trials
                 share train first (sweeps/launch.py), each on an even share of the
                 cores; otherwise each trains in the trial that owns it
                 (sweeps/schedule.chains_in_trials)
  trials         then the trials, longest first (sweeps/schedule.longest_first, the order
                 launch starts them in), each on the first slot that frees up (Ray
                 Tune's max_concurrent_trials), each training its stages that neither a
                 shared chain nor an earlier trial trains, and waiting for those an
                 earlier trial is still training (sweeps/schedule.replay)

Each trial (and shared chain) adds TRIAL_S of its own bookkeeping, and each sweep
RAY_START_S; both measured on 2 cores (docs/paper-mini.md's timing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sweeps.flags import Launch
from sweeps.schedule import chains_in_trials, longest_first, makespan, replay
from sweeps.sweep import Sweep

RAY_START_S = 15.0  # ray.init, the progress board and the first trial's start, per sweep
# A trial's (or shared chain's) own costs beside its probed steps: its start (under a second in a
# reused process), its stages' MLflow runs, parent loads, checkpoints and done markers. 6 s put
# paper_mini v4's estimate at 35 min 6 s against 36 min 36 s measured (docs/paper-mini.md).
TRIAL_S = 6.0
PROBE_STEPS = 2


@dataclass
class Estimate:
    seconds: float
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        minutes, seconds = divmod(round(self.seconds), 60)
        from looplab.tracking import hardware

        return "\n".join(
            [
                f"time estimate (probed on this machine: {hardware()}):",
                *self.lines,
                f"  total ≈ {minutes} min {seconds:02d} s",
            ]
        )


def evaluations(cfg) -> int:
    """How many evaluations a stage runs: every eval_every steps and at its end."""
    tc = cfg.train
    return (tc.steps - 1) // tc.eval_every + 1 if tc.eval_every else 1


def estimate(
    sweeps: list[tuple[Sweep, list[dict[str, Any]]]],
    launch: Launch,
    *,
    concurrency: int | None = None,
    extra_seconds: float = 0.0,
) -> Estimate:
    """The time of running these (sweep, trial points) pairs one after the other."""
    import os

    import torch

    cpus = os.cpu_count() or 1
    concurrency = concurrency or max(1, min(cpus, launch.max_concurrent_trials or cpus))
    probe = _StageProbe()
    total, lines = 0.0, []
    previous = torch.get_num_threads()
    try:
        for sweep, points in sweeps:
            seconds, line = _sweep_seconds(sweep, points, launch, probe, concurrency, cpus)
            total += seconds
            lines.append(line)
    finally:
        torch.set_num_threads(previous)
    if extra_seconds:
        total += extra_seconds
        lines.append(f"  after training: ≈ {extra_seconds / 60:.1f} min (timing, analysis)")
    if not math.isfinite(total):
        total = 0.0
    return Estimate(total, lines)


class _StageProbe:
    """A stage's seconds from a few probed steps; the seeds of one shape cost alike, so
    each (shape, threads) is probed once."""

    def __init__(self) -> None:
        self.probed: dict[tuple, tuple[float, float]] = {}

    def seconds(self, cfg, threads: int) -> float:
        import torch

        from looplab.training.probe import probe_seconds

        shape = (cfg.stage, cfg.model, cfg.task, cfg.train.batch_size, cfg.train.seq_len, cfg.train.eval_qs, threads)
        if shape not in self.probed:
            torch.set_num_threads(threads)
            self.probed[shape] = probe_seconds(cfg, steps=PROBE_STEPS)
        step_s, eval_s = self.probed[shape]
        return cfg.train.steps * step_s + evaluations(cfg) * eval_s


def _sweep_seconds(
    sweep: Sweep, points: list[dict[str, Any]], launch: Launch, probe: _StageProbe, concurrency: int, cpus: int
) -> tuple[float, str]:
    """One sweep's seconds as launch runs it (shared chains first, then the trials longest
    first on `concurrency` slots; stored stages cost nothing), and its line."""
    from trainables.keyed_step import record_of
    from trainables.pipeline import stage_configs, stage_dir
    from trainables.trial import shared_prefixes

    chains = {id(p): stage_configs(sweep.spec, p, launch.storage_path) for p in points}
    claimed: set[str] = set()  # stage folders a shared chain or an earlier trial trains

    def todo(cfgs) -> list:
        """The stages of cfgs that this job trains: neither stored nor claimed."""
        mine = []
        for cfg in cfgs:
            folder = stage_dir(launch.storage_path, cfg)
            if folder not in claimed and not record_of(launch.storage_path, cfg).finished:
                claimed.add(folder)
                mine.append(cfg)
        return mine

    jobs = shared_prefixes(sweep.spec, points, launch.storage_path)
    if chains_in_trials(len(jobs), concurrency):
        jobs = []  # each chain trains in the first trial that needs it
    job_slots = min(len(jobs), concurrency)
    job_threads = max(1, cpus // max(1, job_slots))
    shared = [
        TRIAL_S
        + sum(
            probe.seconds(c, job_threads)
            for c in todo(stage_configs(sweep.spec, j["params"], launch.storage_path)[: j["n"]])
        )
        for j in jobs
    ]
    threads = max(1, cpus // concurrency)
    ordered = longest_first(sweep, points, launch.storage_path, trained_before=claimed)  # as launch starts them
    trials = []
    for p in ordered:  # each stage trained (seconds), awaited (None) or stored (left out)
        stages: list[tuple[str | None, float | None]] = [(None, TRIAL_S)]
        for c in chains[id(p)]:
            folder = stage_dir(launch.storage_path, c)
            if folder in claimed:  # a shared chain's (done before the trials) or an earlier trial's
                stages.append((folder, None))
            elif todo([c]):
                stages.append((folder, probe.seconds(c, threads)))
        trials.append(stages)
    n_stages = len(claimed)
    seconds = RAY_START_S + makespan(shared, job_slots) + replay(trials, concurrency) if n_stages else 0.0
    unique = {stage_dir(launch.storage_path, c) for cfgs in chains.values() for c in cfgs}
    line = (
        f"  {sweep.name}: {n_stages} of {len(unique)} stages to train"
        + (f" ({len(jobs)} shared chain(s) first)" if jobs else "")
        + f", {concurrency} trial(s) at a time × {threads} thread(s): ≈ {seconds / 60:.1f} min"
    )
    return seconds, line
