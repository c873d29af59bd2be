"""MLflow conventions: which experiment, which run, which names.

One experiment per sweep (absolute artifact location, so trial processes with
another working directory write to the same place); one parent run per sweep
invocation; one child run per trial; one nested run per pipeline stage. Every run
is tagged so it can be found again by content (`trial_key` + `stage` + `level`),
which is how a resumed sweep reuses its runs instead of duplicating them.

The analysis layer reads these names; keep them stable. mlflow is imported inside
the functions: the library runs without it.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

# Run levels, in the tag `level`: the tree is sweep > trial > stage.
SWEEP, TRIAL, STAGE = "sweep", "trial", "stage"

# Per-step training quantities that keep their record names in MLflow.
TRAIN_METRICS = ("loss", "exit_entropy", "expected_exit_step", "lr", "grad_norm", "tokens_per_s")
# Per-(mode, q) evaluation quantities, logged as e.g. skip_q0.4_executed_loops; forced
# depths as forced_d2_executed_loops.
EXIT_METRICS = ("executed_loops", "mean_exit_step", "accuracy", "ppl", "loss", "backbone_flops_per_token")
PARAM_BATCH = 100  # MLflow accepts at most 100 params per log_batch call


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
    """The id of experiment `name`, created with an absolute artifact location."""
    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            mlflow_client.restore_experiment(found.experiment_id)
        return found.experiment_id
    try:
        return mlflow_client.create_experiment(name, artifact_location=artifact_location(artifact_root, name))
    except Exception:  # another process created it between our lookup and create
        found = mlflow_client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def git_sha(repo: str | Path | None = None) -> str:
    """The commit of the code that ran (the repo of this file by default)."""
    where = Path(repo) if repo else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


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


def config_params(cfg) -> dict[str, str]:
    """An ExperimentConfig as MLflow params, with `beta` (β) at top level: the
    ablation's x-axis should not need a dotted name."""
    params = flatten(cfg.to_dict())
    params["beta"] = str(cfg.exit.beta)
    return params


def config_tags(cfg, *, level: str, git: str | None = None, **extra: str) -> dict[str, str]:
    """The content tags of a run of cfg (a stage, or a trial named by its last stage)."""
    tags = {"level": level, "config_hash": cfg.config_hash(), "trial_key": cfg.trial_key(), "stage": cfg.stage,
            "parent_checkpoint": cfg.init_from, "preset": cfg.preset, "git_sha": git or git_sha()}
    tags.update({k: str(v) for k, v in extra.items()})
    return tags


def q_name(q: float) -> str:
    """0.4 -> '0.4', 1.0 -> '1.0', 0.25 -> '0.25': short and stable metric names."""
    text = f"{q:.4f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def record_metrics(record: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics of one looplab training record (see looplab.train)."""
    kind = record.get("kind")
    if kind == "train":
        out = {k: record[k] for k in TRAIN_METRICS if k in record}
        # Hole-branch and other stage diagnostics keep their own names.
        out.update({k: v for k, v in record.items()
                    if k not in out and k not in ("kind", "step", "stage") and isinstance(v, (int, float))})
    elif kind == "eval":
        out = {"val_ppl": record["ppl"], "val_accuracy": record["accuracy"], "val_loss": record["loss"]}
    elif kind == "eval_exit":
        prefix = (f"forced_d{record['depth']}_" if record["mode"] == "forced"
                  else f"{record['mode']}_q{q_name(record['q'])}_")
        out = {prefix + k: record[k] for k in EXIT_METRICS if k in record}
    else:
        return {}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


def log_record(mlflow_client, run_id: str, record: dict[str, Any]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    step = int(record.get("step", 0))
    metrics = [Metric(k, v, now, step) for k, v in record_metrics(record).items()]
    if metrics:
        mlflow_client.log_batch(run_id, metrics=metrics)


def log_metrics(mlflow_client, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
    if batch:
        mlflow_client.log_batch(run_id, metrics=batch)


def log_params(mlflow_client, run_id: str, params: dict[str, str]) -> None:
    """Log params, skipping those the run already has (params are immutable, and a
    resumed run logs the same values again)."""
    from mlflow.entities import Param

    have = mlflow_client.get_run(run_id).data.params
    todo = [Param(k, v) for k, v in params.items() if k not in have]
    for i in range(0, len(todo), PARAM_BATCH):
        mlflow_client.log_batch(run_id, params=todo[i:i + PARAM_BATCH])


def find_run(mlflow_client, experiment_id: str, **tags: str):
    """The newest run of the experiment carrying all these tags, or None."""
    clauses = [f"tags.{k} = '{v}'" for k, v in tags.items()]
    runs = mlflow_client.search_runs([experiment_id], filter_string=" and ".join(clauses), max_results=1,
                                     order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def open_run(mlflow_client, experiment_id: str, *, name: str, tags: dict[str, str], key: dict[str, str],
             parent_run_id: str | None = None, params: dict[str, str] | None = None) -> tuple[str, str]:
    """Reuse the run identified by the tags `key`, or create it. Returns (run_id,
    status before this call: FINISHED, FAILED, RUNNING, ... or NEW). A reopened
    unfinished run is set RUNNING again; a FINISHED one is left as it is."""
    existing = find_run(mlflow_client, experiment_id, **key)
    if existing is not None:
        run_id, status = existing.info.run_id, existing.info.status
        if status != "FINISHED":
            mlflow_client.update_run(run_id, status="RUNNING")
    else:
        all_tags = {**tags, **key, "mlflow.runName": name}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run_id, status = mlflow_client.create_run(experiment_id, tags=all_tags, run_name=name).info.run_id, "NEW"
    if params:
        log_params(mlflow_client, run_id, params)
    return run_id, status


def close_run(mlflow_client, run_id: str, ok: bool) -> None:
    mlflow_client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")


@contextlib.contextmanager
def terminated_on_exit(mlflow_client, run_id: str) -> Iterator[str]:
    """FINISHED when the block completes, FAILED when it raises (then re-raise),
    KILLED when it exits through sys.exit(0): a deliberate stop, which is how Ray
    Tune ends a trial its scheduler (ASHA) stops while the trial reports."""
    try:
        yield run_id
    except SystemExit as stop:
        mlflow_client.set_terminated(run_id, status="KILLED" if stop.code in (None, 0) else "FAILED")
        raise
    except BaseException:
        close_run(mlflow_client, run_id, ok=False)
        raise
    close_run(mlflow_client, run_id, ok=True)


def latest_metrics(mlflow_client, run_id: str) -> dict[str, float]:
    return dict(mlflow_client.get_run(run_id).data.metrics)


BENCH_METRICS = ("speedup", "ideal_speedup", "mean_executed_loops", "batch_max_survivor_ratio", "time_full_s",
                 "time_skip_s", "peak_mem_full", "peak_mem_skip")


def log_benchmark(tracking_uri: str, records: list[dict[str, Any]], *, name: str,
                  experiment: str = "looplab-bench", artifact_root: str | Path = "looplab-runs/mlflow") -> str:
    """One FINISHED run per benchmark invocation: each grid point's figures as
    metrics named by the point (e.g. `b8_L512_oracle2.0.speedup`) and the records
    as `bench.json`. Returns the run id."""
    mc = client(tracking_uri)
    experiment_id = ensure_experiment(mc, experiment, artifact_root)
    run_id = mc.create_run(experiment_id, run_name=name, tags={"level": "bench", "git_sha": git_sha()}).info.run_id
    with terminated_on_exit(mc, run_id):
        for r in records:
            policy = f"q{r['q']}" if r.get("q") is not None else f"oracle{r['oracle_mean']}"
            point = f"b{r['batch']}_L{r['seq_len']}_{policy}"
            log_metrics(mc, run_id, {f"{point}.{k}": float(r[k]) for k in BENCH_METRICS})
        mc.log_text(run_id, json.dumps(records, indent=2), "bench.json")
    return run_id
