"""The thin MLflow helpers the writers use (trainables/, sweeps/, the benchmarks): a
client, experiments and their artifact roots, params, tags and metrics of a run, a run
opened and closed, a benchmark's records logged. Every name they write comes from
looplab/tracking/names.py; mlflow is imported inside the functions."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, Iterator

from looplab.errors import Interrupted
from looplab.policy import ExitPolicy
from looplab.tracking.names import (
    BENCH,
    BENCH_EXPERIMENT,
    BENCH_METRICS,
    BEST,
    CHECKPOINT,
    CONFIG_HASH,
    DECODE,
    DECODE_BENCH_METRICS,
    ERROR_TAG,
    EVAL,
    EVAL_KEY,
    EXPERIMENT_KIND_TAG,
    GIT_SHA,
    GRID_PARAM,
    HARDWARE,
    KILLED_BY,
    LEVEL,
    LINEAGE,
    LM_EVAL_FLOPS,
    LM_EVAL_LOOPS,
    LM_EVAL_PPL,
    LM_EVAL_SECONDS,
    METHOD,
    MODEL_TRAINING,
    NOTE_TAG,
    PARENT_CHECKPOINT,
    PARENT_RUN_TAG,
    POINTS_PARAM,
    POLICY_TAG,
    PRESET,
    RANGE_PARAM,
    RUN_NAME_TAG,
    SEARCH_PARAM,
    SHARED_VIEW_TAG,
    STAGE_KEY,
    STAGE_TAG,
    SWEEP_PARAM,
    TASK_TAG,
    TRAIN_RECORD,
    lm_eval_quantity,
    policy_metric,
    record_metrics,
)

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
        # Why it failed, on the dashboard: the exception's one line (a divergence, a full
        # disk). Where the store cannot take it (a full disk holds the database too), the
        # run stays RUNNING until the next invocation closes it as KILLED, and the error
        # that stopped the block is the one raised, not the store's.
        with contextlib.suppress(Exception):
            mlflow_client.set_tag(run_id, ERROR_TAG, f"{type(error).__name__}: {reason}"[:500])
        with contextlib.suppress(Exception):
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
