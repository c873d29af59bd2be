"""The evaluation a stage runs as it trains (every train.eval_every steps and at its
end): one record per exit policy the stage evaluates, the per-loop instruments, and
their console lines.
"""

from __future__ import annotations

from looplab.config import ExperimentConfig
from looplab.evaluation.validation import evaluate_policies
from looplab.stages import get_stage
from looplab.tracking import (
    ACCURACY,
    EVAL_RECORD,
    EXECUTED_LOOPS,
    GRAD_NORM,
    HIDDEN_NORM,
    LOOP,
    LOSS,
    MEAN_EXIT_STEP,
    PPL,
    loop_metric,
)
from looplab.training.instruments import diagnostic_batch, loop_instruments


def evaluate_stage(model, task, cfg: ExperimentConfig, device, shard, log, step: int) -> dict:
    """Rank 0 evaluates and every rank receives its records; the records and the
    per-loop instruments go to the run's log (run_folder.MetricsLog). Returns full
    depth's record."""
    records = shard.broadcast(evaluation_records(model, task, cfg, device) if shard.main else None)
    full = records[0]  # full depth comes first (Stage.eval_policies)
    quality = (
        f"ppl {full[PPL]:.3f}  next-token acc {full[ACCURACY]:.4f}"
        if cfg.task.kind == "text"
        else f"exact match {full[ACCURACY]:.4f}  loss {full[LOSS]:.4f}"
    )
    lines = [f"eval @ {step}: {quality}  (n={full['n']})"]
    lines += [
        f"  {r['policy']:10s} loops {r[EXECUTED_LOOPS]:.2f}  exit {r[MEAN_EXIT_STEP]:.2f}  "
        f"acc {r[ACCURACY]:.4f}  loss {r[LOSS]:.4f}"
        for r in records[1:]
    ]
    log.record({"kind": EVAL_RECORD, "step": step, "policies": records}, "\n".join(lines))
    if shard.main:  # per-loop instruments (looplab/training/instruments.py) on rank 0's diagnostic batch
        loops = loop_instruments(model, get_stage(cfg.stage), diagnostic_batch(task.eval_batch()), cfg, step, device)
        log.record({"kind": LOOP, "step": step, "metrics": loops}, loops_line(loops, cfg.model.n_loops))
    return full


def evaluation_records(model, task, cfg: ExperimentConfig, device) -> list[dict]:
    """One record per policy the stage evaluates (Stage.eval_policies): full depth
    first; gated stages add dense and skip at each q and the forced depths below R,
    the fixed-depth baseline every exit policy is compared with."""
    tc = cfg.train
    eval_set = task.eval_batch()
    if tc.eval_limit:
        eval_set = eval_set.slice(0, tc.eval_limit)
    policies = get_stage(cfg.stage).eval_policies(cfg.model.n_loops, tc.eval_qs)
    return evaluate_policies(
        model, eval_set, policies, batch_size=tc.eval_batch_size, device=device, precision=tc.precision
    )


def loops_line(loops: dict[str, float], n_loops: int) -> str:
    """The per-loop instruments at full depth, one line: ‖h‖ and the gradient per loop."""
    parts = []
    for label, quantity in (("|h| (rms)", HIDDEN_NORM), ("|grad| from", GRAD_NORM)):
        values = [loops.get(loop_metric(quantity, r)) for r in range(1, n_loops + 1)]
        if all(v is not None for v in values):
            parts.append(f"{label} loop 1..{n_loops}: " + " ".join(f"{v:.3g}" for v in values))
    return "  per loop: " + ("  ".join(parts) or "-")
