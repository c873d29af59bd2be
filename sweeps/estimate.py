"""A sweep's wall time on this machine, measured before it runs (the dry run's estimate).

Every distinct stage the sweeps would train (by stage key; a stage several trials share
counts once, a stage the storage already holds counts nothing) is probed here:
looplab.train.probe_seconds times a few training steps and one evaluation with the
threads a trial gets. A stage's time is steps × step time + evaluations × evaluation
time. The trials run `concurrency` at a time on an even share of the cores, so the
training part is the sum over stages divided by the concurrency; Ray's start per sweep
and each stage's MLflow bookkeeping are added as fixed costs (measured on 2 cores).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from sweeps.flags import Launch
from sweeps.plan import Sweep

RAY_START_S = 15.0  # ray.init, the progress board and the first trial's start, per sweep
PER_STAGE_S = 4.0  # a stage's MLflow runs, done marker and Ray Train's local-mode start
PROBE_STEPS = 2


@dataclass
class Estimate:
    seconds: float
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        minutes, seconds = divmod(round(self.seconds), 60)
        return "\n".join(["time estimate (probed on this machine):", *self.lines,
                          f"  total ≈ {minutes} min {seconds:02d} s"])


def evaluations(cfg) -> int:
    """How many evaluations a stage runs: every eval_every steps and at its end."""
    tc = cfg.train
    return (tc.steps - 1) // tc.eval_every + 1 if tc.eval_every else 1


def estimate(sweeps: list[tuple[Sweep, list[dict[str, Any]]]], launch: Launch, *, concurrency: int | None = None,
             extra_seconds: float = 0.0) -> Estimate:
    """The time of running these (sweep, trial points) pairs one after the other."""
    import os

    import torch

    from looplab.train import probe_seconds
    from trainables.pipeline import stage_configs, stage_dir
    from trainables.shared_stage import read_done
    from trainables.storage import Storage

    cpus = os.cpu_count() or 1
    concurrency = concurrency or max(1, min(cpus, launch.max_concurrent_trials or cpus))
    threads = max(1, cpus // concurrency)
    storage = Storage(launch.storage_path)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    total, lines, probed = 0.0, [], {}
    try:
        for sweep, points in sweeps:
            unique = {}
            for point in points:
                for cfg in stage_configs(sweep.spec, point, launch.storage_path):
                    unique.setdefault(stage_dir(launch.storage_path, cfg), cfg)
            todo = {d: c for d, c in unique.items() if read_done(storage, d) is None}
            work = 0.0
            for cfg in todo.values():
                shape = (cfg.stage, cfg.model, cfg.task, cfg.train.batch_size, cfg.train.seq_len, cfg.train.eval_qs)
                if shape not in probed:  # the seeds of one shape cost alike: probe once
                    t0 = time.perf_counter()
                    probed[shape] = probe_seconds(cfg, steps=PROBE_STEPS)
                    probed[shape] += (time.perf_counter() - t0,)
                step_s, eval_s, _ = probed[shape]
                work += cfg.train.steps * step_s + evaluations(cfg) * eval_s + PER_STAGE_S
            seconds = (work / concurrency + RAY_START_S) if todo else 0.0
            total += seconds
            lines.append(f"  {sweep.name}: {len(todo)} of {len(unique)} stages to train, {concurrency} at a time × "
                         f"{threads} thread(s): ≈ {seconds / 60:.1f} min")
    finally:
        torch.set_num_threads(previous)
    if extra_seconds:
        total += extra_seconds
        lines.append(f"  after training: ≈ {extra_seconds / 60:.1f} min (timing, analysis)")
    if not math.isfinite(total):
        total = 0.0
    return Estimate(total, lines)
