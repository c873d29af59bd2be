"""The names this layer reads, from the tracking contract (looplab/tracking.py), which
the platform writes with: run levels, tags, metric quantities and how a metric name
parses into an evaluation point (policy, q, depth) and a quantity (a zoo rule's point:
policy skip-entropy, dense-kl, ... with its threshold τ or window k in q). Only what is the
analysis' own lives here: column headers of the paper's tables, orderings, and which
way a quality improves.

lm-eval scores are the quantity lm_eval.<task> (the task's suite accuracy, a fraction
in [0, 1], as lm-eval reports it; looplab.lm_eval_suite.SUITE_METRICS says which
accuracy) under a policy's prefix, e.g. val_lm_eval.piqa (full depth) or
skip_q0.4_lm_eval.arc_easy; tables show percent, as the paper does. Beside them, the
downstream families <family>.<task> (lm_eval_loops: executed loops on the task's
requests, lm_eval_flops, lm_eval_seconds, lm_eval_ppl), and their suite means.

A policy column holds the execution (full | forced | dense | skip) for the learned gate,
and <execution>-<rule> for a zero-shot exit rule (skip-entropy, dense-kl, skip-stable),
whose threshold is in the q column: the rule/execution its metric prefix names.
"""

from __future__ import annotations

from looplab.lm_eval_suite import PAPER_TASKS
from looplab.policy import DENSE, FORCED, FULL, SKIP, STABLE, ZOO_KINDS, ZOO_LABELS, ZOO_RULES, number_name, zoo_kind
from looplab.stages import STAGE_NAMES as STAGES
from looplab.tracking import (CONTENT_TAGS, EVAL, EVAL_QUANTITIES, LM_EVAL, LM_EVAL_AVG, LM_EVAL_FAMILIES,
                              LM_EVAL_FLOPS, LM_EVAL_LOOPS, LM_EVAL_PPL, LM_EVAL_SECONDS, METRIC_PATTERN,
                              PARENT_RUN_TAG, SCAN_AXES, SEARCH_PARAM, STAGE, STAGE_SECONDS, SWEEP, TRAIN_METRICS,
                              TRIAL, parse_metric)

__all__ = ["CONTENT_TAGS", "DENSE", "EVAL", "EVAL_QUANTITIES", "FORCED", "FULL", "LM_EVAL", "LM_EVAL_AVG",
           "LM_EVAL_FAMILIES", "LM_EVAL_FLOPS", "LM_EVAL_LOOPS", "LM_EVAL_PPL", "LM_EVAL_SECONDS", "METRIC_PATTERN",
           "PAPER_TASKS", "PARENT_RUN_TAG", "SCAN_AXES", "SEARCH_PARAM", "SKIP", "STABLE", "STAGE", "STAGES", "STAGE_SECONDS",
           "SWEEP", "TRAIN_METRICS", "TRIAL", "ZOO_KINDS", "ZOO_LABELS", "ZOO_RULES", "parse_metric", "zoo_kind"]

# The suite means over tasks analysis computes beside lm_eval_avg (the paper's Avg.):
# downstream executed loops, backbone FLOPs and model seconds per token; a mean of task
# perplexities means nothing, so lm_eval_ppl has none.
SUITE_MEANS = (LM_EVAL_LOOPS, LM_EVAL_FLOPS, LM_EVAL_SECONDS)

# Column headers of the paper's tables (Table 3, App. E/F), by lm-eval task name.
TASK_HEADERS = {"piqa": "PIQA", "boolq": "BoolQ", "winogrande": "WG", "openbookqa": "OBQA",
                "hellaswag": "HS", "arc_challenge": "ARC-C", "arc_easy": "ARC-E"}
POLICY_ORDER = (FULL, FORCED, DENSE, SKIP, *ZOO_KINDS)  # zoo kinds: dense-entropy, skip-entropy, ...

# Training histories the β diagnostics draw (App. D, Figs. 4 and 5).
BETA_DIAGNOSTICS = ("exit_entropy", "expected_exit_step")


q_name = number_name  # 0.4 -> '0.4', 1.0 -> '1.0': q as policy labels print it


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
    if LM_EVAL in quantity or quantity == LM_EVAL_AVG or name in ("accuracy", "acc"):
        return True
    if name in ("ppl", "loss", "perplexity"):
        return False
    return None


def is_rule_policy(policy: str | None) -> bool:
    """A zero-shot exit rule's policy value (skip-entropy, ...), as opposed to the gate's."""
    return policy is not None and "-" in policy


def task_columns(columns, family: str | None = None) -> list[str]:
    """The per-task columns of one downstream family (None: accuracy, lm_eval.<task>), in
    the paper's task order."""
    head = LM_EVAL if family is None else family + "."
    tasks = [c[len(head):] for c in columns
             if c.startswith(head) and not c.endswith(("_std", "_ci_low", "_ci_high"))]
    return [head + t for t in ordered_tasks(tasks)]


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
