"""The names this layer reads: run levels, tags, and how an MLflow metric name maps to
an evaluation point (policy, q, depth) and a quantity.

looplab.tracking writes the names; the constants that live there are imported, not
copied. What looplab does not log yet is settled here:

lm-eval scores (the paper's seven tasks or any other lm-eval task):
  lm_eval.<task>                 the full model (all R loops, readout at R), e.g. lm_eval.piqa
  <mode>_q<q>_lm_eval.<task>     under an exit policy, e.g. skip_q0.4_lm_eval.arc_easy
  forced_d<r>_lm_eval.<task>     at a forced depth r, e.g. forced_d2_lm_eval.hellaswag
The value is the task's suite accuracy (looplab.lm_eval_suite.SUITE_METRICS: acc_norm
where lm-eval reports it, else acc) as a fraction in [0, 1], as lm-eval reports it;
tables show percent, as the paper does. Log them on the trial run and on the stage
run they evaluate, at the stage's last step, e.g.
  tracking.log_metrics(client, run_id, {"skip_q0.4_lm_eval.piqa": 0.5285}, step=steps)
"""

from __future__ import annotations

import re

from looplab.config import STAGES
from looplab.lm_eval_suite import PAPER_TASKS
from looplab.tracking import EXIT_METRICS, STAGE, SWEEP, TRAIN_METRICS, TRIAL, q_name

__all__ = ["EXIT_METRICS", "PAPER_TASKS", "STAGE", "STAGES", "SWEEP", "TRAIN_METRICS", "TRIAL", "q_name"]

LM_EVAL = "lm_eval."  # metric-name prefix of an lm-eval task score
# Column headers of the paper's tables (Table 3, App. F/G), by lm-eval task name.
TASK_HEADERS = {"piqa": "PIQA", "boolq": "BoolQ", "winogrande": "WG", "openbookqa": "OBQA",
                "hellaswag": "HS", "arc_challenge": "ARC-C", "arc_easy": "ARC-E"}
LM_EVAL_AVG = "lm_eval_avg"  # points column: mean over the tasks the table shows

# Evaluation policies. full: val_* (every token runs all R loops, readout at R);
# forced: forced_d<r>_* (every token stops at depth r); dense / skip: the exit gate at
# threshold q, reading out at the exit step after running all R loops (dense, the
# Ouro gate) or skipping the loops after it (skip, CHASE).
FULL, FORCED, DENSE, SKIP = "full", "forced", "dense", "skip"
POLICY_ORDER = (FULL, FORCED, DENSE, SKIP)

# Tags the loader turns into columns (looplab.tracking.config_tags and the sweep/stage extras).
CONTENT_TAGS = ("level", "config_hash", "trial_key", "stage", "parent_checkpoint", "preset", "git_sha",
                "sweep_key", "sweep", "reused", "reused_from", "checkpoint", "command", "trial_run")
PARENT_TAG = "mlflow.parentRunId"

# Per-stage timing metrics (trainables/trial.py): seconds of one stage's training.
STAGE_SECONDS = "stage_seconds"
WALL_TIME_SUFFIX = "_wall_time_s"  # {stage}_wall_time_s, the fallback when stage_seconds is absent

# Training histories the β diagnostics draw (App. E, Figs. 6 and 7).
BETA_DIAGNOSTICS = ("exit_entropy", "expected_exit_step")

_EXIT = "|".join(re.escape(m) for m in EXIT_METRICS)
_QUANTITY = rf"(?:{_EXIT}|{re.escape(LM_EVAL)}[^\s]+)"
# One regular expression for every evaluation metric; exactly one alternative matches.
POINT_METRIC = re.compile(
    rf"^(?:(?P<mode>[a-z]+)_q(?P<q>[0-9]+(?:\.[0-9]+)?)_(?P<gated>{_QUANTITY})"
    rf"|forced_d(?P<depth>[0-9]+)_(?P<forced>{_QUANTITY})"
    rf"|val_(?P<val>ppl|accuracy|loss)"
    rf"|(?P<lm>{re.escape(LM_EVAL)}[^\s]+))$")


def parse_point_metric(name: str) -> tuple[str, float | None, int | None, str] | None:
    """'skip_q0.4_ppl' -> ('skip', 0.4, None, 'ppl'); 'forced_d2_accuracy' ->
    ('forced', None, 2, 'accuracy'); 'val_ppl' -> ('full', None, None, 'ppl');
    'lm_eval.piqa' -> ('full', None, None, 'lm_eval.piqa'); anything else -> None."""
    m = POINT_METRIC.match(name)
    if m is None:
        return None
    if m["gated"]:
        return m["mode"], float(m["q"]), None, m["gated"]
    if m["forced"]:
        return FORCED, None, int(m["depth"]), m["forced"]
    return FULL, None, None, m["val"] or m["lm"]


def higher_is_better(quantity: str) -> bool | None:
    """The direction of a quality metric, or None when 'best' means nothing (lr, loops,
    throughput). Accuracy-like (accuracy, lm-eval scores) is max; loss and perplexity
    are min."""
    name = quantity.rsplit("_", 1)[-1] if not quantity.startswith(LM_EVAL) else "lm_eval"
    if LM_EVAL in quantity or quantity == LM_EVAL_AVG or name in ("accuracy", "acc"):
        return True
    if name in ("ppl", "loss", "perplexity"):
        return False
    return None


def task_of(quantity: str) -> str | None:
    """'lm_eval.piqa' -> 'piqa'; anything else -> None."""
    return quantity[len(LM_EVAL):] if quantity.startswith(LM_EVAL) else None


def ordered_tasks(tasks) -> list[str]:
    """The paper's seven in its column order first, then any others alphabetically."""
    tasks = set(tasks)
    return [t for t in PAPER_TASKS if t in tasks] + sorted(tasks - set(PAPER_TASKS))


def ordered_stages(stages) -> list[str]:
    """The pipeline's stages among these (nulls dropped), in pipeline order."""
    present = {s for s in stages if s is not None}
    return [s for s in STAGES if s in present]


def task_header(task: str) -> str:
    return TASK_HEADERS.get(task, task)
