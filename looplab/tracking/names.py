"""The tracking contract's names: every MLflow experiment, run, tag, param and metric
name the platform writes and analysis reads, and the functions that compose and parse
them (looplab/tracking/__init__.py says how the tree of runs is laid out). No such name
is spelled anywhere else (tests/test_names_contract.py)."""

from __future__ import annotations

import math
import re
from typing import Any

from looplab.errors import ConfigError
from looplab.keys import keyed_name, stage_folder
from looplab.policy import PREFIX_PATTERN, ExitPolicy

# ---- experiments and runs ------------------------------------------------------------
SWEEP, TRIAL, STAGE, EVAL, BENCH = "sweep", "trial", "stage", "eval", "bench"  # values of the tag `level`
BENCH_EXPERIMENT = "looplab-bench"
# MLflow's own tags the platform sets.
PARENT_RUN_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
NOTE_TAG = "mlflow.note.content"  # the run's description in the dashboard (Markdown)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
# MLflow 3's kind for training experiments: the value its UI's kind selector writes for
# "Machine learning" (the enum ExperimentKind in mlflow/server/js/build/static/js/main.*.js).
# MLflow 3.17's UI does not choose its GenAI or Model-training mode by it: the dashboard's
# URLs carry the mode (looplab/dashboard.py).
MODEL_TRAINING = "custom_model_development"
# The metric the UI's run charts lead with (an experiment tag the runs page reads).
PRIMARY_METRIC_TAG = "mlflow.experiment.primaryMetric.name"
# A saved view of the runs page: the experiment tag SHARED_VIEW_TAG + <id> (looplab/dashboard.py).
SHARED_VIEW_TAG = "mlflow.sharedViewState."


def experiment_name(sweep: str, preset: str) -> str:
    return f"{sweep}-{preset}"


# Run names follow the output-path rule of looplab/keys.py (`<name>-<key>`); a sweep's
# run name is also its Ray Tune folder, and a stage's its stage folder.
def sweep_run_name(sweep: str, sweep_key: str) -> str:
    return keyed_name(sweep, sweep_key)


def trial_run_name(stage_key: str) -> str:
    return keyed_name("trial", stage_key)


def stage_run_name(stage: str, stage_key: str) -> str:
    return stage_folder(stage, stage_key)


def eval_run_name(task: str, policy: ExitPolicy, eval_key: str) -> str:
    return keyed_name(f"eval-{task}-{policy.spec}", eval_key)


def speed_run_name(batch: int, seq_len: int, policy: str, speed_key: str) -> str:
    return keyed_name(f"speed-b{batch}-L{seq_len}-{policy}", speed_key[:6])


def arrivals_run_name(slots: int, schedule: str, policy: str, arrival_key: str) -> str:
    return keyed_name(f"arrivals-s{slots}-{schedule}-{policy}", arrival_key[:6])


# ---- tags ------------------------------------------------------------------------------
LEVEL = "level"
STAGE_KEY = "stage_key"  # the stage's key; a trial carries its final stage's
CONFIG_HASH = "config_hash"  # the same without the seed: seeds of one configuration share it
STAGE_TAG = "stage"
METHOD = "method"  # fixed | Ouro | CHASE (looplab/stages.py)
LINEAGE = "lineage"  # the stages the model went through, e.g. pretrain+stage1+chase
PARENT_CHECKPOINT = "parent_checkpoint"
PRESET = "preset"
GIT_SHA = "git_sha"
# Where a stage trained: the CPU and torch's kernel path (another machine's kernels round
# differently, which moves a trained model's figures like another seed: issue 33, C1).
HARDWARE = "hardware"
SWEEP_KEY = "sweep_key"
SWEEP_TAG = "sweep"  # the experiment a trial belongs to
COMMAND = "command"
SPEED_KEY = "speed_key"  # a prefill speed point's content key (trainables/bench.py)
# On a sweep run: its trials' final stage keys, comma-separated, those it reused whole from
# another sweep's run too (MLflow records no link to them), so its report can be read again
SWEEP_TRIALS = "sweep_trial_keys"
SCAN_AXES = "scan_axes"  # on a sweep run: its axes, comma-separated (the searched params the others derive from)
TRIAL_RUN = "trial_run"  # a stage run's trial (part of its lookup key)
REUSED = "reused"  # "true" when a stage run reports a stage trained by another trial
REUSED_FROM = "reused_from"  # the run that trained it
CHECKPOINT = "checkpoint"
KILLED_BY = "killed_by"  # on a run closed as KILLED: why (its process gone, or the user stopped the sweep)
RAY_NODE = "ray_node_id"
HOSTNAME = "hostname"
# An evaluation run's own tags (beside its checkpoint's stage_key, config_hash, stage, method,
# lineage, checkpoint and preset): its content key, its exit policy (spec) and lm-eval task.
EVAL_KEY = "eval_key"
POLICY_TAG = "policy"
TASK_TAG = "task"
ERROR_TAG = "error"  # a FAILED run's exception, one line
EVAL_PARAM = "eval."  # an evaluation's settings as params: eval.task, eval.policy, eval.limit, ...
# Tags analysis turns into columns.
CONTENT_TAGS = (
    LEVEL,
    CONFIG_HASH,
    STAGE_KEY,
    STAGE_TAG,
    METHOD,
    LINEAGE,
    PARENT_CHECKPOINT,
    PRESET,
    GIT_SHA,
    SWEEP_KEY,
    SWEEP_TAG,
    REUSED,
    REUSED_FROM,
    CHECKPOINT,
    COMMAND,
    TRIAL_RUN,
    EVAL_KEY,
    POLICY_TAG,
    TASK_TAG,
    SCAN_AXES,
    SPEED_KEY,
)
SEARCH_PARAM = "search."  # trial params: the searched values, e.g. search.beta, search.seed
# A sweep run's params: what it searched and what it held fixed (sweep_params): grid.<axis>
# (the axis' values, e.g. grid.beta = [0.05, 0.25]), points (paired values, e.g. N⊗R pairs),
# range.<param> (--search optuna: [low, high, scale]) and sweep.<setting> (sweep.preset,
# sweep.stages, sweep.seeds, sweep.search, sweep.searched.beta = exit.beta, sweep.set.<key>,
# sweep.stage_set.<stage>.<key>: the keyed overrides).
GRID_PARAM, POINTS_PARAM, RANGE_PARAM, SWEEP_PARAM = "grid.", "points", "range.", "sweep."
BEST = "best."  # a sweep run's metrics: the best trial's summary columns, e.g. best.val_ppl
BEST_TRIAL = "best_trial"  # on a sweep run: the run name of its best trial (by the sweep's metric)
# A speed point's params (trainables/bench.py): the point (speed.batch, speed.seq_len,
# speed.policy, speed.dtype, speed.packing, speed.repeats) and the machine that timed it
# (machine.processor, machine.cpus, machine.threads, machine.device).
SPEED_PARAM = "speed."
MACHINE_PARAM = "machine."

# ---- metrics ---------------------------------------------------------------------------
# The quantities, each named once: an evaluation logs them under its policy's prefix
# (policy_metric), and analysis names its points' columns after them.
EXECUTED_LOOPS = "executed_loops"  # loops a token ran, on average (the compute axis)
MEAN_EXIT_STEP = "mean_exit_step"  # the readout step, on average (below executed loops under dense)
ACCURACY, PPL, LOSS = "accuracy", "ppl", "loss"
BACKBONE_FLOPS = "backbone_flops_per_token"
EVAL_QUANTITIES = (EXECUTED_LOOPS, MEAN_EXIT_STEP, ACCURACY, PPL, LOSS, BACKBONE_FLOPS)
# A training step's figures (LOSS is the training loss there); GRAD_NORM is also a per-loop quantity.
EXIT_ENTROPY, EXPECTED_EXIT_STEP = "exit_entropy", "expected_exit_step"  # the gate's (the β diagnostics)
LR, GRAD_NORM, TOKENS_PER_S = "lr", "grad_norm", "tokens_per_s"
TRAIN_METRICS = (LOSS, EXIT_ENTROPY, EXPECTED_EXIT_STEP, LR, GRAD_NORM, TOKENS_PER_S)
# A stage's own diagnostics beside them (looplab/training/objectives.py): whether a step took
# the hole branch, its threshold q, the loops it executed there, and the gate's exit probability.
HOLE_BRANCH, HOLE_Q, EXIT_PROB = "hole_branch", "hole_q", "exit_prob"
LM_EVAL = "lm_eval."  # quantity prefix of an lm-eval task score: lm_eval.<task>
LM_EVAL_AVG = "lm_eval_avg"  # the suite's average accuracy
# Downstream quantities beside a task's accuracy: <family>.<task> per task, <family> for the
# suite's mean over its tasks (see the module docstring).
LM_EVAL_LOOPS = "lm_eval_loops"  # executed loops per token on the task's requests
LM_EVAL_FLOPS = "lm_eval_flops"  # backbone FLOPs per token there
LM_EVAL_SECONDS = "lm_eval_seconds"  # the model's time on them
LM_EVAL_PPL = "lm_eval_ppl"  # the task's perplexity, where it reports one
LM_EVAL_FAMILIES = (LM_EVAL_LOOPS, LM_EVAL_FLOPS, LM_EVAL_SECONDS, LM_EVAL_PPL)
# What the sweep run records about its evaluation step (the summary says it too).
EVALS_RAN, EVALS_REUSED, EVALS_FAILED = "evaluations_ran", "evaluations_reused", "evaluations_failed"
STAGE_SECONDS = "stage_seconds"
MLFLOW_SECONDS = "mlflow_seconds"
REPORT_SECONDS = "report_seconds"
# The prefill benchmark's figures (looplab/costs/timing.py's BenchRecord fields), those analysis
# reads by name first: the measured speedup, the loop bound R/d̄, d̄, the two times.
SPEEDUP, LOOP_BOUND, MEAN_LOOPS = "speedup", "ideal_speedup", "mean_executed_loops"
TIME_FULL, TIME_SKIP = "time_full_s", "time_skip_s"
# A timed figure's spread over its repeats (the figure itself is their median): each
# repeat's skip against the same repeat's full (the runs alternate).
SPEEDUP_MIN, SPEEDUP_MAX = "speedup_min", "speedup_max"
# Each time's fastest and slowest repeat (the tokens/s bars of the speed chart).
TIME_FULL_MIN, TIME_FULL_MAX = "time_full_min_s", "time_full_max_s"
TIME_SKIP_MIN, TIME_SKIP_MAX = "time_skip_min_s", "time_skip_max_s"
BENCH_METRICS = (
    SPEEDUP,
    LOOP_BOUND,
    MEAN_LOOPS,
    "batch_max_survivor_ratio",
    TIME_FULL,
    TIME_SKIP,
    "peak_mem_full",
    "peak_mem_skip",
    "peak_mem_abs_full",
    "peak_mem_abs_skip",
    SPEEDUP_MIN,
    SPEEDUP_MAX,
    TIME_FULL_MIN,
    TIME_FULL_MAX,
    TIME_SKIP_MIN,
    TIME_SKIP_MAX,
)
# A speed point's run (trainables/bench.py) logs BENCH_METRICS and the FLOP ratio of its
# speedup, (F0 + R·Fr)/(F0 + d̄·Fr) (looplab/costs/resources.py: flop_ratio).
FLOP_RATIO = "flop_ratio"
SPEED_METRICS = (*BENCH_METRICS, FLOP_RATIO)
# The decode benchmark's figures (looplab/costs/timing.py's DecodeRecord, records with kind "decode").
DECODE = "decode"
TOKENS_PER_S_FULL, TOKENS_PER_S_SKIP = f"{TOKENS_PER_S}_full", f"{TOKENS_PER_S}_skip"  # also analysis' prefill rates
DECODE_BENCH_METRICS = (
    SPEEDUP,
    LOOP_BOUND,
    MEAN_LOOPS,
    TIME_FULL,
    TIME_SKIP,
    TOKENS_PER_S_FULL,
    TOKENS_PER_S_SKIP,
    "loops_time_full_s",
    "loops_time_skip_s",
    "loops_speedup",
    "peak_mem_full",
    "peak_mem_skip",
    "peak_mem_abs_full",
    "peak_mem_abs_skip",
    "cache_bytes",
    "steps_skip",
)
# Decoding under continuous arrivals (looplab/costs/arrival_bench.py's ArrivalRecord; the speed
# sweep's --arrivals runs): decode tokens/s beside the overall tokens/s and the bounds.
DECODE_TOKENS_PER_S = f"{DECODE}_{TOKENS_PER_S}"
DECODE_TOKENS_PER_S_MIN, DECODE_TOKENS_PER_S_MAX = f"{DECODE_TOKENS_PER_S}_min", f"{DECODE_TOKENS_PER_S}_max"
ARRIVAL_METRICS = (
    TOKENS_PER_S,
    DECODE_TOKENS_PER_S,
    MEAN_LOOPS,
    LOOP_BOUND,
    FLOP_RATIO,
    SPEEDUP,
    DECODE_TOKENS_PER_S_MIN,
    DECODE_TOKENS_PER_S_MAX,
    SPEEDUP_MIN,
    SPEEDUP_MAX,
)

_QUANTITY = "|".join(re.escape(q) for q in EVAL_QUANTITIES)
_FAMILY = "|".join(re.escape(f) for f in LM_EVAL_FAMILIES)
# One regular expression for every evaluation metric name (analysis runs it in polars
# too): the policy prefix's groups (val, depth, execution, rule, q) and the quantity.
METRIC_PATTERN = re.compile(
    rf"^{PREFIX_PATTERN.pattern}(?P<quantity>{_QUANTITY}|{re.escape(LM_EVAL_AVG)}|{re.escape(LM_EVAL)}\S+"
    rf"|(?:{_FAMILY})(?:\.\S+)?)$"
)


def policy_metric(policy: ExitPolicy, quantity: str) -> str:
    """The name of a policy's evaluation quantity, e.g. skip_q0.4_ppl, val_lm_eval.piqa:
    policy_metric(ExitPolicy.skip(0.4), EXECUTED_LOOPS) == "skip_q0.4_executed_loops"."""
    return policy.metric_prefix + quantity


# The full-depth point (every token runs all R loops): the quality a sweep optimizes and
# its summary shows, named once here.
FULL_DEPTH = ExitPolicy.full()
VAL_PPL = policy_metric(FULL_DEPTH, PPL)
VAL_ACCURACY = policy_metric(FULL_DEPTH, ACCURACY)
VAL_LOSS = policy_metric(FULL_DEPTH, LOSS)


def lm_eval_quantity(task: str, family: str | None = None) -> str:
    """A task's downstream quantity: its accuracy lm_eval.<task>, or <family>.<task> for one
    of LM_EVAL_FAMILIES, e.g. lm_eval_loops.piqa."""
    if family is None:
        return LM_EVAL + task
    if family not in LM_EVAL_FAMILIES:
        raise ValueError(f"family={family!r} is invalid; allowed: None (accuracy) | {' | '.join(LM_EVAL_FAMILIES)}")
    return f"{family}.{task}"


def parse_metric(name: str) -> tuple[ExitPolicy, str] | None:
    """'skip_q0.4_ppl' -> (skip:0.4, 'ppl'); 'skip_entropy2.5_ppl' -> (skip-entropy:2.5, 'ppl');
    'val_lm_eval.piqa' -> (full, 'lm_eval.piqa'); anything that is not an evaluation
    metric of a policy this build knows -> None."""
    m = METRIC_PATTERN.match(name)
    if m is None:
        return None
    try:
        policy = ExitPolicy.from_prefix(name[: m.start("quantity")])
    except ConfigError:  # the shape of a prefix with a value no policy takes (skip_stable2.5_)
        return None
    return None if policy is None else (policy, m["quantity"])


# The kinds of looplab/training/train.py's records: a training window, an evaluation, the per-loop instruments.
TRAIN_RECORD, EVAL_RECORD, LOOP = "train", "eval", "loops"
# The per-loop instruments' quantities (looplab/training/instruments.py says what each measures).
HIDDEN_NORM, ACTIVE, STATE_GAP = "hidden_norm", "active", "state_gap"
LOOP_QUANTITIES = (HIDDEN_NORM, GRAD_NORM, ACTIVE, STATE_GAP)
LOOP_PATTERN = re.compile(
    rf"^(?P<prefix>{PREFIX_PATTERN.pattern})?loop(?P<loop>[1-9][0-9]*)_"
    rf"(?P<quantity>{'|'.join(LOOP_QUANTITIES)})$"
)


def loop_metric(quantity: str, loop: int, policy: ExitPolicy | None = None) -> str:
    """A per-loop instrument's name: loop2_hidden_norm; under a policy skip_q0.4_loop2_active."""
    if quantity not in LOOP_QUANTITIES:
        raise ValueError(f"quantity={quantity!r} is invalid; allowed: {' | '.join(LOOP_QUANTITIES)}")
    return (policy.metric_prefix if policy is not None else "") + f"loop{loop}_{quantity}"


def parse_loop_metric(name: str) -> tuple[ExitPolicy | None, int, str] | None:
    """'skip_q0.4_loop2_state_gap' -> (skip:0.4, 2, 'state_gap'); 'loop1_hidden_norm' ->
    (None, 1, 'hidden_norm'); anything else -> None."""
    m = LOOP_PATTERN.match(name)
    if m is None:
        return None
    if not m["prefix"]:
        return None, int(m["loop"]), m["quantity"]
    try:
        policy = ExitPolicy.from_prefix(m["prefix"])
    except ConfigError:
        return None
    return None if policy is None else (policy, int(m["loop"]), m["quantity"])


def record_metrics(record: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics of one looplab training record (looplab/training/train.py): a training
    record's quantities, or an evaluation record's per-policy quantities."""
    kind = record.get("kind")
    if kind == TRAIN_RECORD:
        out = {k: record[k] for k in TRAIN_METRICS if k in record}
        # Hole-branch and other stage diagnostics keep their own names.
        out.update(
            {
                k: v
                for k, v in record.items()
                if k not in out and k not in ("kind", "step", "stage") and isinstance(v, (int, float))
            }
        )
    elif kind == EVAL_RECORD:
        out = {}
        for rec in record["policies"]:
            policy = ExitPolicy.parse(rec["policy"])
            out.update({policy_metric(policy, q): rec[q] for q in EVAL_QUANTITIES if q in rec})
    elif kind == LOOP:
        out = {k: v for k, v in record["metrics"].items() if parse_loop_metric(k) is not None}
    else:
        return {}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
