"""A stage's cost on this machine, measured: what a sweep's dry run turns into its time
estimate (sweeps/estimate.py).
"""

from __future__ import annotations

import time

from looplab.config import ExperimentConfig
from looplab.costs.machine import check_training
from looplab.devices import resolve_device
from looplab.stages import get_stage
from looplab.tasks import make_task
from looplab.training.instruments import diagnostic_batch, loop_instruments
from looplab.training.stage_evaluation import evaluation_records
from looplab.training.steps import optimizer_step


def probe_seconds(cfg: ExperimentConfig, *, steps: int = 2) -> tuple[float, float]:
    """(seconds per training step, seconds per evaluation) of cfg on this machine, with
    the threads torch has: the median of `steps` optimizer steps after a warm-up, and
    one evaluation as train() runs it (the stage's policies and the per-loop
    instruments). A sweep's dry run turns these into its time estimate (sweeps/estimate.py)."""
    from looplab.costs.timing import median_seconds

    device = resolve_device(cfg.train.device)
    check_training(cfg, device)  # the probe allocates what a step of the run does
    task = make_task(cfg.task, cfg.train.seq_len)
    step, model = optimizer_step(
        cfg, device, task.train_batch(0, cfg.train.batch_size, cfg.train.seq_len, cfg.train.seed)
    )
    seconds = median_seconds(step, steps, warmup=1, device=device)
    t = time.perf_counter()
    evaluation_records(model, task, cfg, device)
    loop_instruments(model, get_stage(cfg.stage), diagnostic_batch(task.eval_batch()), cfg, 0, device)
    return seconds, time.perf_counter() - t
