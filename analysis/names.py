"""The analysis' own names: the columns it adds to the evaluation points and to its
tables and claims, the tables' column headers and orderings, and which way a quality
improves. What the platform writes (run levels, tags, metric quantities, how a metric
name parses into a policy and a quantity) is the tracking contract's: analysis reads
it from looplab.tracking, the pipeline's stages from looplab.stages and a policy's
kind, label and metric prefix from looplab.policy's ExitPolicy, never from here.

lm-eval scores are the quantity lm_eval.<task> (the task's suite accuracy, a fraction
in [0, 1], as lm-eval reports it; looplab.evaluation.paper_tasks.SUITE_METRICS says which
accuracy) under a policy's prefix, e.g. val_lm_eval.piqa (full depth) or
skip_q0.4_lm_eval.arc_easy; tables show percent, as the paper does. Beside them, the
downstream families <family>.<task> (lm_eval_loops: executed loops on the task's
requests, lm_eval_flops, lm_eval_seconds, lm_eval_ppl), and their suite means.

A policy column holds the policy's kind (ExitPolicy.kind): the execution (full |
forced | dense | skip) for the learned gate, and <execution>-<rule> for a zero-shot
exit rule (skip-entropy, dense-kl, skip-stable), whose threshold is in the q column.

Some of these names look like MLflow metrics (ppl_full, skip_increase) without being
any; tests/test_names_contract.py checks that none is one.
"""

from __future__ import annotations

from looplab import tracking
from looplab.evaluation.paper_tasks import PAPER_TASKS
from looplab.policy import DENSE, FORCED, FULL, SKIP, ZOO_KINDS
from looplab.stages import STAGE_NAMES
from looplab.tracking import (
    ACCURACY,
    EXIT_ENTROPY,
    EXPECTED_EXIT_STEP,
    LM_EVAL,
    LM_EVAL_AVG,
    LM_EVAL_FAMILIES,
    LM_EVAL_FLOPS,
    LM_EVAL_LOOPS,
    LM_EVAL_PPL,
    LM_EVAL_SECONDS,
    LOSS,
    PPL,
)

# The columns that name a point of a sweep, in the order every table leads with them
# (analysis/points.py orders its columns so; analysis/aggregate.py carries them over seeds).
POINT_NAME = (
    "experiment",
    tracking.METHOD,
    "label",
    "model",
    "pipeline",
    tracking.STAGE_TAG,
    "is_final_stage",
    tracking.POLICY_TAG,
    "q",
    "depth",
    "point",
)
PARAM = "params."  # the prefix of a run's params as columns of the runs table (analysis/load.py)

# The suite means over tasks analysis computes beside lm_eval_avg (the paper's Avg.):
# downstream executed loops, backbone FLOPs and model seconds per token; a mean of task
# perplexities means nothing, so lm_eval_ppl has none.
SUITE_MEANS = (LM_EVAL_LOOPS, LM_EVAL_FLOPS, LM_EVAL_SECONDS)

# Column headers of the paper's tables (Table 3, App. E/F), by lm-eval task name.
TASK_HEADERS = {
    "piqa": "PIQA",
    "boolq": "BoolQ",
    "winogrande": "WG",
    "openbookqa": "OBQA",
    "hellaswag": "HS",
    "arc_challenge": "ARC-C",
    "arc_easy": "ARC-E",
}
POLICY_ORDER = (FULL, FORCED, DENSE, SKIP, *ZOO_KINDS)  # zoo kinds: dense-entropy, skip-entropy, ...

# Training histories the β diagnostics draw (App. D, Figs. 4 and 5).
BETA_DIAGNOSTICS = (EXIT_ENTROPY, EXPECTED_EXIT_STEP)

# Column names the analysis makes: a quantity's best value over a stage's evaluations
# (points), its spread over seeds (aggregated), and a quantity of another point of the
# same configuration joined beside a row (ppl_full, accuracy_dense: the skip table, speed).
BEST_SUFFIX, STD_SUFFIX = "_best", "_std"
TRAIN_LOSS = "train_loss"  # the stage's last training loss (the metric `loss`), beside the validation one


def best_of(quantity: str) -> str:
    """ppl -> ppl_best: the best value over the stage's evaluations."""
    return quantity + BEST_SUFFIX


def std_of(column: str) -> str:
    """ppl -> ppl_std: the standard deviation over seeds (analysis/aggregate.py)."""
    return column + STD_SUFFIX


def with_std(*columns: str) -> list[str]:
    """Each column followed by its standard deviation over seeds: ppl, ppl_std, ..."""
    return [name for column in columns for name in (column, std_of(column))]


def interval_of(column: str) -> tuple[str, str]:
    """ppl -> (ppl_ci_low, ppl_ci_high): the t-interval over seeds (analysis/aggregate.py)."""
    return f"{column}_ci_low", f"{column}_ci_high"


def at_point(quantity: str, kind: str) -> str:
    """(ppl, full) -> ppl_full: the quantity at the configuration's point of that policy kind."""
    return f"{quantity}_{kind}"


# The speed table's quality beside a timed policy: the validation set's executed loops
# under it (analysis/bench.py). Its name predates the contract and is spelled like the
# full-depth metric val_executed_loops, which it is not (it is any timed policy's).
SPEED_VALIDATION_LOOPS = "val_executed_loops"

# The claims' per-trial measures (analysis/claims.py's trial_measures; analysis/scan.py
# reads them): a point's quality at the target loops and the comparisons built on them.
FULL_LOSS, FULL_PPL, FULL_ACCURACY = "full_loss", "full_ppl", "full_accuracy"
SKIP_LOSS, FORCED_LOSS, FIXED_LOSS = "skip_loss", "forced_loss", "fixed_loss"
SKIP_INCREASE = "skip_increase"  # skip_loss's perplexity increase over full_loss, %
SKIP_MIN_LOOPS = "skip_min_loops"  # the fewest loops the skip sweep executed
FIXED_OVER_SKIP, FORCED_OVER_SKIP = "fixed_over_skip", "forced_over_skip"
# A trial's curves themselves, (executed loops, mean CE) lists, for claims that compare two
# trials' curves (a step-matched comparator is another trial): the final stage's skip
# sweep with full compute at R, and its own fixed-depth curve.
SKIP_X, SKIP_Y, FORCED_X, FORCED_Y = "skip_x", "skip_y", "forced_x", "forced_y"

# Outputs named after what they show.
SKIP_PPL_CHART = "skip_ppl"  # perplexity under skip as compute falls (skip_ppl.png)
SKIP_VS_FULL = "skip_vs_full"  # the table of skip against full compute (tables/skip_vs_full.csv)


def higher_is_better(quantity: str) -> bool | None:
    """The direction of a quality metric, or None when 'best' means nothing (lr, loops,
    throughput). Accuracy-like (accuracy, lm-eval scores) is max; loss and perplexity
    are min."""
    family = quantity.split(".", 1)[0]
    if family == LM_EVAL_PPL:
        return False
    if family in LM_EVAL_FAMILIES:  # loops, FLOPs, seconds: compute, not quality
        return None
    name = quantity.rsplit("_", 1)[-1] if not quantity.startswith(LM_EVAL) else "lm_eval"
    if LM_EVAL in quantity or quantity == LM_EVAL_AVG or name in (ACCURACY, "acc"):
        return True
    if name in (PPL, LOSS, "perplexity"):
        return False
    return None


def is_rule_policy(policy: str | None) -> bool:
    """A zero-shot exit rule's policy value (skip-entropy, ...), as opposed to the gate's."""
    return policy is not None and "-" in policy


def task_columns(columns, family: str | None = None) -> list[str]:
    """The per-task columns of one downstream family (None: accuracy, lm_eval.<task>), in
    the paper's task order."""
    head = LM_EVAL if family is None else family + "."
    tasks = [c[len(head) :] for c in columns if c.startswith(head) and not c.endswith(("_std", "_ci_low", "_ci_high"))]
    return [head + t for t in ordered_tasks(tasks)]


def task_of(quantity: str) -> str | None:
    """'lm_eval.piqa' -> 'piqa'; anything else -> None."""
    return quantity[len(LM_EVAL) :] if quantity.startswith(LM_EVAL) else None


def ordered_tasks(tasks) -> list[str]:
    """The paper's seven in its column order first, then any others alphabetically."""
    tasks = set(tasks)
    return [t for t in PAPER_TASKS if t in tasks] + sorted(tasks - set(PAPER_TASKS))


def ordered_stages(stages) -> list[str]:
    """The pipeline's stages among these (nulls dropped), in pipeline order."""
    present = {s for s in stages if s is not None}
    return [s for s in STAGE_NAMES if s in present]


def task_header(task: str) -> str:
    return TASK_HEADERS.get(task, task)
