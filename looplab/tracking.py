"""The tracking contract: every MLflow name the platform writes and analysis reads.

The writer (trainables/, sweeps/, the benchmarks) and the reader (analysis/) both
import the names from here; no experiment, run, tag or metric name is spelled
anywhere else. Below the names, the thin MLflow helpers the writers use.

The tree: one experiment per sweep (`experiment_name`: sweep and preset), marked as
a model-training experiment (MLflow 3.17's UI opens its runs rather than its GenAI
overview only through the URL's mode, which looplab/dashboard.py's URLs carry; a saved
view per sweep, SHARED_VIEW_TAG, shows its trials); one parent run per sweep, keyed by
the sweep's content (tag `sweep_key`), with the sweep's params (sweep_params: the grid and
the fixed settings) and its headline metrics (BEST: the best trial's summary columns); one
child run per trial, named by its final stage's key; one nested run per stage, keyed by
its `stage_key`; one nested run per downstream evaluation (level eval), keyed by its
`eval_key` (trainables/evaluation.py) and nested under the run that trained its stage.
Run levels are in the tag `level`.

Metrics:
  training    TRAIN_METRICS per logged step, plus the stage's own diagnostics
              (hole_branch, hole_q, executed_loops, exit_prob) under their own names
  evaluation  <policy prefix><quantity>: the policy's metric prefix (looplab/policy.py:
              val_ for full depth, forced_d<D>_, dense_q<Q>_, skip_q<Q>_, and the zoo's
              <dense|skip>_<entropy|kl|stable><T>_, e.g. skip_entropy2.5_) and one of
              EVAL_QUANTITIES, e.g. val_ppl, skip_q0.4_executed_loops, forced_d2_accuracy;
              lm-eval scores are the quantity lm_eval.<task> (the task's suite accuracy,
              a fraction) and lm_eval_avg, e.g. skip_q0.4_lm_eval.piqa
  downstream  an evaluation run (level eval) logs, under its policy's prefix, for its task:
              lm_eval.<task> (accuracy), lm_eval_loops.<task> (executed loops per token on
              the task's requests: downstream, never the validation set's executed_loops),
              lm_eval_flops.<task> (backbone FLOPs per token there), lm_eval_seconds.<task>
              (the model's time on them) and lm_eval_ppl.<task> where the task reports a
              perplexity, e.g. skip_q0.4_lm_eval_loops.piqa. A family without a task
              (lm_eval_loops, lm_eval_avg) is the suite's mean over its tasks, which
              analysis computes from the runs of one checkpoint and policy
  timing      STAGE_SECONDS (the stage's training, once per stage), MLFLOW_SECONDS and
              REPORT_SECONDS (time the stage spent in MLflow and Ray reports)
  per loop    loop<r>_<quantity> at each evaluation (looplab/training/instruments.py: hidden_norm,
              grad_norm), and under a skip policy's prefix (skip_q0.4_loop2_active,
              skip_q0.4_loop2_state_gap): loop_metric / parse_loop_metric

mlflow is imported inside the functions: the library runs without it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, Iterator

from looplab.errors import ConfigError, Interrupted
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


# ---- writing: the MLflow helpers ------------------------------------------------------------
PARAM_BATCH = 100  # MLflow accepts at most 100 params per log_batch call
PARAM_VALUE_LIMIT = 6000  # characters of a param's value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)


def client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def artifact_location(root: str | Path, experiment: str) -> str:
    """An absolute artifact URI: relative ones resolve against each process's cwd."""
    text = str(root)
    if "://" in text:
        return text.rstrip("/") + "/" + experiment
    return (Path(text).expanduser().resolve() / experiment).as_uri()


def ensure_experiment(mlflow_client, name: str, artifact_root: str | Path) -> str:
    """The id of experiment `name`, created with an absolute artifact location and
    marked as a model-training experiment (EXPERIMENT_KIND_TAG: MODEL_TRAINING, also on
    an existing experiment without it). MLflow 3.17's UI opens an experiment on its
    GenAI overview unless the URL asks for the model-training view (looplab/dashboard.py)."""
    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            mlflow_client.restore_experiment(found.experiment_id)
        experiment_id = found.experiment_id
    else:
        try:
            experiment_id = mlflow_client.create_experiment(
                name,
                artifact_location=artifact_location(artifact_root, name),
                tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING},
            )
        except Exception:  # another process created it between our lookup and create
            found = mlflow_client.get_experiment_by_name(name)
            if found is None:
                raise
            experiment_id = found.experiment_id
    if found is not None and found.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING:
        mlflow_client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return experiment_id


def save_view(mlflow_client, experiment_id: str, view_id: str, value: str) -> None:
    """A saved view of the experiment's runs page (looplab/dashboard.py makes its value)."""
    mlflow_client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + view_id, value)


def git_sha(repo: str | Path | None = None) -> str:
    """The commit of the code that ran (the repo of this file by default)."""
    where = Path(repo) if repo else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def git_dirty(repo: str | Path | None = None) -> bool | None:
    """Whether the checkout that ran has uncommitted changes to tracked files (None: not
    a git checkout): with git_sha, which code a result came from."""
    where = Path(repo) if repo else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


@functools.cache
def hardware() -> str:
    """'AMD EPYC 7B13 · cpu AVX2 · torch 2.13.0' (and the GPU when there is one): what
    decides the bits a training run produces, beside its code and config."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [cpu, f"cpu {torch.backends.cpu.get_cpu_capability()}", f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        parts.append(f"gpu {torch.cuda.get_device_name(0)}")
    return " · ".join(parts)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted names: {"model": {"n_loops": 4}} -> {"model.n_loops": "4"}."""
    flat: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = str(list(value) if isinstance(value, tuple) else value)
    return flat


def sweep_params(grid: dict[str, list], points, ranges: dict[str, tuple], settings: dict[str, Any]) -> dict[str, str]:
    """A sweep run's params (the names above): its grid axes with their values, its paired
    points, its ranges (JSON) and its fixed settings (as config params are, `flatten`);
    each cut at MLflow's 6,000 characters."""

    def cut(text: str) -> str:
        return text if len(text) <= PARAM_VALUE_LIMIT else text[: PARAM_VALUE_LIMIT - 1] + "…"

    params = {GRID_PARAM + name: json.dumps(list(values)) for name, values in grid.items()}
    if points:
        params[POINTS_PARAM] = json.dumps([dict(p) for p in points], sort_keys=True)
    params.update({RANGE_PARAM + name: json.dumps(list(bounds)) for name, bounds in ranges.items()})
    params.update({SWEEP_PARAM + k: v for k, v in flatten(settings).items()})
    return {k: cut(v) for k, v in params.items()}


def best_metrics(rows: list[dict[str, Any]], metric: str, mode: str, columns) -> tuple[dict[str, float], int | None]:
    """The sweep run's headline metrics: the summary columns of the best row (by `metric`,
    min or max; rows without a finite value of it are left out) as best.<column>, and that
    row's index (None when no row has the metric)."""
    scored = [
        (float(r[metric]), i)
        for i, r in enumerate(rows)
        if isinstance(r.get(metric), (int, float)) and math.isfinite(float(r[metric]))
    ]
    if not scored:
        return {}, None
    _, index = (min if mode == "min" else max)(scored)
    row = rows[index]
    return (
        {
            BEST + c: float(row[c])
            for c in columns
            if isinstance(row.get(c), (int, float)) and math.isfinite(float(row[c]))
        },
        index,
    )


def config_params(cfg) -> dict[str, str]:
    """An ExperimentConfig as MLflow params, with dotted names (model.n_loops, exit.beta)."""
    return flatten(cfg.to_dict())


def search_params(params: dict[str, Any]) -> dict[str, str]:
    """A trial's searched values as params a reviewer sorts by: search.beta, search.seed."""
    return {SEARCH_PARAM + k: str(v) for k, v in params.items()}


def config_tags(cfg, *, level: str, git: str | None = None, lineage=None, **extra: str) -> dict[str, str]:
    """The content tags of a run of cfg (a stage, or a trial named by its last stage).
    lineage: the stages in order up to cfg's (its method label derives from them)."""
    from looplab.stages import method_of

    lineage = list(lineage or [cfg.stage])
    tags = {
        LEVEL: level,
        CONFIG_HASH: cfg.config_hash(),
        STAGE_KEY: cfg.stage_key(),
        STAGE_TAG: cfg.stage,
        METHOD: method_of(lineage),
        LINEAGE: "+".join(lineage),
        PARENT_CHECKPOINT: cfg.init_from,
        PRESET: cfg.preset,
        GIT_SHA: git or git_sha(),
        HARDWARE: hardware(),
    }
    tags.update({k: str(v) for k, v in extra.items()})
    return tags


def eval_tags(
    *,
    eval_key: str,
    stage_key: str,
    config_hash: str,
    stage: str,
    lineage,
    checkpoint: str,
    policy: ExitPolicy,
    task: str,
    preset: str = "",
    git: str | None = None,
) -> dict[str, str]:
    """The tags of an evaluation run: its key, what it evaluated (the checkpoint's stage key,
    config hash, stage, method and lineage, the policy and the task) and the code."""
    from looplab.stages import method_of

    lineage = list(lineage)
    return {
        LEVEL: EVAL,
        EVAL_KEY: eval_key,
        STAGE_KEY: stage_key,
        CONFIG_HASH: config_hash,
        STAGE_TAG: stage,
        METHOD: method_of(lineage),
        LINEAGE: "+".join(lineage),
        CHECKPOINT: checkpoint,
        POLICY_TAG: policy.spec,
        TASK_TAG: task,
        PRESET: preset,
        GIT_SHA: git or git_sha(),
    }


def downstream_metrics(
    policy: ExitPolicy,
    task: str,
    *,
    accuracy: float | None,
    loops: float | None,
    flops: float | None = None,
    seconds: float | None = None,
    ppl: float | None = None,
) -> dict[str, float]:
    """The metrics of one downstream evaluation (one task under one policy), by the names
    of the module docstring; a value the task does not give is left out."""
    values = {None: accuracy, LM_EVAL_LOOPS: loops, LM_EVAL_FLOPS: flops, LM_EVAL_SECONDS: seconds, LM_EVAL_PPL: ppl}
    return {
        policy_metric(policy, lm_eval_quantity(task, family)): float(v)
        for family, v in values.items()
        if isinstance(v, (int, float)) and math.isfinite(float(v))
    }


def headline_metrics(metrics: dict[str, float], headline: Collection[str] | None) -> dict[str, float]:
    """The metrics a headline names (a trial run's page: a stage evaluates once or a few
    times, so every other figure would be a chart of one point); no headline (None or
    empty): all of them."""
    return {k: v for k, v in metrics.items() if k in headline} if headline else metrics


def log_record(mlflow_client, run_id: str, record: dict[str, Any], headline: Collection[str] | None = None) -> None:
    """Log a training record's metrics at its step. With a `headline`, an evaluation's or
    the per-loop instruments' metrics only as headline_metrics keeps them; a training
    record's, the curves, whole."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    step = int(record.get("step", 0))
    found = record_metrics(record)
    if record.get("kind") != TRAIN_RECORD:
        found = headline_metrics(found, headline)
    metrics = [Metric(k, v, now, step) for k, v in found.items()]
    if metrics:
        mlflow_client.log_batch(run_id, metrics=metrics)


def log_metrics(mlflow_client, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
    for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
        mlflow_client.log_batch(run_id, metrics=batch[i : i + 1000])


def log_params(mlflow_client, run_id: str, params: dict[str, str]) -> None:
    """Log params, skipping those the run already has (params are immutable, and a
    resumed run logs the same values again)."""
    from mlflow.entities import Param

    have = mlflow_client.get_run(run_id).data.params
    todo = [Param(k, v) for k, v in params.items() if k not in have]
    for i in range(0, len(todo), PARAM_BATCH):
        mlflow_client.log_batch(run_id, params=todo[i : i + PARAM_BATCH])


def finished_tag_values(mlflow_client, experiment_id: str, level: str, tag: str) -> set[str]:
    """The values of `tag` on the experiment's FINISHED runs of this level (an evaluation's
    eval key, a speed point's speed key): what a keyed step need not run again. One query
    per 5,000 runs."""
    values: set[str] = set()
    token = None
    while True:
        page = mlflow_client.search_runs(
            [experiment_id],
            max_results=5000,
            page_token=token,
            filter_string=f"tags.{LEVEL} = '{level}' and attributes.status = 'FINISHED'",
        )
        values.update(r.data.tags[tag] for r in page if tag in r.data.tags)
        token = page.token
        if not token:
            return values - {None}


def find_run(mlflow_client, experiment_id: str, **tags: str):
    """The newest run of the experiment carrying all these tags, or None."""
    clauses = [f"tags.{k} = '{v}'" for k, v in tags.items()]
    runs = mlflow_client.search_runs(
        [experiment_id], filter_string=" and ".join(clauses), max_results=1, order_by=["attributes.start_time DESC"]
    )
    return runs[0] if runs else None


def open_run(
    mlflow_client,
    experiment_id: str,
    *,
    name: str,
    tags: dict[str, str],
    key: dict[str, str],
    parent_run_id: str | None = None,
    params: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Reuse the run identified by the tags `key`, or create it. Returns (run_id,
    status before this call: FINISHED, FAILED, RUNNING, ... or NEW). A reopened
    unfinished run is set RUNNING again; a FINISHED one is left as it is."""
    existing = find_run(mlflow_client, experiment_id, **key)
    if existing is not None:
        run_id, status = existing.info.run_id, existing.info.status
        if status != "FINISHED":
            mlflow_client.update_run(run_id, status="RUNNING")
    else:
        all_tags = {**tags, **key, RUN_NAME_TAG: name}
        if parent_run_id:
            all_tags[PARENT_RUN_TAG] = parent_run_id
        run_id, status = mlflow_client.create_run(experiment_id, tags=all_tags, run_name=name).info.run_id, "NEW"
    if params:
        log_params(mlflow_client, run_id, params)
    return run_id, status


def close_run(mlflow_client, run_id: str, ok: bool) -> None:
    mlflow_client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")


TAG_VALUE_LIMIT = 8000  # characters of a run tag's value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)


def set_description(mlflow_client, run_id: str, markdown: str) -> None:
    """The run's description on its dashboard page (cut at MLflow's limit on a tag's value)."""
    if len(markdown) > TAG_VALUE_LIMIT:
        markdown = markdown[: TAG_VALUE_LIMIT - 2] + "\n…"
    mlflow_client.set_tag(run_id, NOTE_TAG, markdown)


@contextlib.contextmanager
def terminated_on_exit(mlflow_client, run_id: str) -> Iterator[str]:
    """FINISHED when the block completes, FAILED when it raises (the exception's first
    line in the tag `error`; then re-raise),
    KILLED when it exits through sys.exit(0): a deliberate stop, which is how Ray
    Tune ends a trial its scheduler (ASHA) stops while the trial reports; KILLED too
    when the user stopped it (looplab.errors.Interrupted, KeyboardInterrupt), with the
    reason in the tag `killed_by`."""
    try:
        yield run_id
    except SystemExit as stop:
        mlflow_client.set_terminated(run_id, status="KILLED" if stop.code in (None, 0) else "FAILED")
        raise
    except (Interrupted, KeyboardInterrupt) as stop:  # the user stopped it: KILLED, and why
        mlflow_client.set_tag(run_id, KILLED_BY, str(stop) or "a second Ctrl-C (exit at once)")
        mlflow_client.set_terminated(run_id, status="KILLED")
        raise
    except BaseException as error:
        reason = (str(error).strip().splitlines() or [""])[0]
        try:  # why it failed, on the dashboard: the exception's one line (a divergence, a full disk)
            mlflow_client.set_tag(run_id, ERROR_TAG, f"{type(error).__name__}: {reason}"[:500])
        finally:
            close_run(mlflow_client, run_id, ok=False)
        raise
    close_run(mlflow_client, run_id, ok=True)


def latest_metrics(mlflow_client, run_id: str) -> dict[str, float]:
    return dict(mlflow_client.get_run(run_id).data.metrics)


def bench_point_name(record: dict[str, Any]) -> str:
    """A benchmark grid point's metric prefix, e.g. b8_L512_skip:0.4 -> b8_L512_skip_q0.4;
    decode points start with decode_ (decode_b8_L2048_oracle2.0), an exit_state
    attention fill ends with _fill, the depth schedule with _depth."""
    policy = (
        f"oracle{record['oracle_mean']}"
        if record.get("oracle_mean") is not None
        else ExitPolicy.parse(record["policy"]).metric_prefix.rstrip("_")
    )
    name = f"b{record['batch']}_L{record['seq_len']}_{policy}"
    if record.get("kind") == DECODE:
        name = f"{DECODE}_{name}" + ("_fill" if record.get("attention_fill") == "exit_state" else "")
        name += "_depth" if record.get("schedule") == "depth" else ""
    return name


def log_benchmark(
    tracking_uri: str,
    records: list[dict[str, Any]],
    *,
    name: str,
    experiment: str = BENCH_EXPERIMENT,
    artifact_root: str | Path = "looplab-runs/mlflow",
) -> str:
    """One FINISHED run per benchmark invocation: each grid point's figures as
    metrics named by the point (e.g. `b8_L512_oracle2.0.speedup`,
    `decode_b8_L2048_oracle2.0.tokens_per_s_skip`) and the records as `bench.json`.
    Returns the run id."""
    mc = client(tracking_uri)
    experiment_id = ensure_experiment(mc, experiment, artifact_root)
    run_id = mc.create_run(experiment_id, run_name=name, tags={LEVEL: BENCH, GIT_SHA: git_sha()}).info.run_id
    with terminated_on_exit(mc, run_id):
        for r in records:
            names = DECODE_BENCH_METRICS if r.get("kind") == DECODE else BENCH_METRICS
            log_metrics(mc, run_id, {f"{bench_point_name(r)}.{k}": float(r[k]) for k in names})
        mc.log_text(run_id, json.dumps(records, indent=2), "bench.json")
    return run_id
