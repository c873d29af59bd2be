"""The paper's downstream suite: seven lm-eval multiple-choice tasks at its shot counts.

    run_suite("runs/lm/checkpoint", policy="skip:0.4", limit=100)
    run_suite(model, local_data_dir="data/lm_eval")      # offline, see below

Each task runs from lm-eval's own built-in YAML (prompt, choices, splits, metrics)
with only these fields replaced: num_fewshot, and with local_data_dir the dataset,
which then comes from local parquet files DIR/<task>/<split>.parquet. Write those
once on a machine that reaches the HuggingFace hub:

    python -m looplab.evaluation.paper_tasks export DIR

The suite's score is the mean over the seven tasks of one accuracy each
(SUITE_METRICS). The paper does not say which of lm-eval's two accuracies it
reports, so we take length-normalised accuracy (acc_norm) wherever lm-eval reports
one, since raw log-likelihoods favour short choices, and plain accuracy for boolq and
winogrande, whose YAMLs define only acc (their choices are single words or have
equal-length continuations). Mamba-style tables instead use acc for piqa and
arc_easy: pass metrics= to compare.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looplab.arguments import flag
from looplab.config import ConfigError
from looplab.tracking import EXECUTED_LOOPS

# Task name → shots, as in the paper's tables.
PAPER_SHOTS: dict[str, int] = {
    "piqa": 5,
    "boolq": 5,
    "winogrande": 5,
    "openbookqa": 5,
    "hellaswag": 10,
    "arc_challenge": 25,
    "arc_easy": 8,
}
PAPER_TASKS = tuple(PAPER_SHOTS)

# The accuracy that enters the average (see the module docstring).
SUITE_METRICS: dict[str, str] = {
    "piqa": "acc_norm",
    "boolq": "acc",
    "winogrande": "acc",
    "openbookqa": "acc_norm",
    "hellaswag": "acc_norm",
    "arc_challenge": "acc_norm",
    "arc_easy": "acc_norm",
}

# Where each task's YAML lives inside lm-eval's tasks directory (0.4.13); indexing
# these folders alone is instant, the full index takes seconds.
_TASK_DIRS = {
    "piqa": "piqa",
    "boolq": "super_glue/boolq",
    "winogrande": "winogrande",
    "openbookqa": "openbookqa",
    "hellaswag": "hellaswag",
    "arc_challenge": "arc",
    "arc_easy": "arc",
}
SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


def _check_tasks(tasks) -> list[str]:
    tasks = list(PAPER_TASKS if tasks is None else tasks)
    unknown = [t for t in tasks if t not in PAPER_SHOTS]
    if unknown or not tasks:
        raise ConfigError(
            f"suite tasks {unknown or tasks} are invalid; allowed: a non-empty subset of {', '.join(PAPER_TASKS)}"
        )
    return tasks


def builtin_yaml_paths(tasks) -> dict[str, Path]:
    """The installed lm-eval's YAML file of each task."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    dirs = sorted({str(root / _TASK_DIRS[t]) for t in tasks if (root / _TASK_DIRS[t]).is_dir()})
    index = TaskManager(include_path=dirs, include_defaults=False).task_index if dirs else {}
    if any(t not in index for t in tasks):  # a later lm-eval moved them: search everything
        index = TaskManager().task_index
    paths = {}
    for task in tasks:
        entry = index.get(task)
        if entry is None or entry.yaml_path is None:
            raise ConfigError(
                f"task {task!r} is not a YAML task of the installed lm-eval; allowed: lm-eval 0.4.x's "
                f"{', '.join(PAPER_TASKS)}"
            )
        paths[task] = Path(entry.yaml_path)
    return paths


def builtin_config(task: str, path: Path | None = None) -> dict[str, Any]:
    """lm-eval's own config of a task, `include:`s merged and `!function`s resolved."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(path or builtin_yaml_paths([task])[task], resolve_func=True)


def required_splits(config: dict[str, Any]) -> list[str]:
    """The dataset splits a task config reads (eval docs and few-shot docs)."""
    return sorted({config[k] for k in SPLIT_KEYS if config.get(k)})


def suite_configs(
    tasks=None, local_data_dir: str | os.PathLike | None = None, shots: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """Task config dicts for simple_evaluate: the built-in YAML of each task with
    num_fewshot set to the paper's shots (or `shots`), and with local_data_dir its
    dataset read from DIR/<task>/<split>.parquet."""
    tasks = _check_tasks(tasks)
    shots = {**PAPER_SHOTS, **(shots or {})}
    configs = []
    for task, path in builtin_yaml_paths(tasks).items():
        config = builtin_config(task, path)
        config["num_fewshot"] = shots[task]
        if local_data_dir is not None:
            config.update(_local_dataset(task, config, Path(local_data_dir)))
        configs.append(config)
    return configs


def _local_dataset(task: str, config: dict[str, Any], root: Path) -> dict[str, Any]:
    files = {split: root / task / f"{split}.parquet" for split in required_splits(config)}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise ConfigError(
            f"local data for {task} is missing {missing}; allowed: a directory written by "
            "`python -m looplab.evaluation.paper_tasks export DIR`"
        )
    return {
        "dataset_path": "parquet",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {split: str(p) for split, p in files.items()}},
    }


def run_suite(
    checkpoint_or_model,
    policy=None,
    limit: int | float | None = None,
    local_data_dir: str | os.PathLike | None = None,
    *,
    tasks=None,
    metrics: dict[str, str] | None = None,
    shots: dict[str, int] | None = None,
    **model_args,
) -> dict[str, Any]:
    """Evaluate a checkpoint path, a LoopedLM or a LoopLabLM on the suite.

    Returns {"tasks": {task: {"metric", "accuracy", "executed_loops", "num_fewshot",
    "n_samples", "results"}}, "average", "executed_loops", "config", "lm_eval"}, where
    "lm_eval" is simple_evaluate's whole results dict (configs, n-shot, ...)."""
    from looplab.evaluation.harness import evaluate_tasks, make_task_manager

    tasks = _check_tasks(tasks)
    metrics = {**SUITE_METRICS, **(metrics or {})}
    configs = suite_configs(tasks, local_data_dir, shots)
    results = evaluate_tasks(
        checkpoint_or_model, configs, limit=limit, manager=make_task_manager(), policy=policy, **model_args
    )
    return summarize(results, tasks, metrics)


def summarize(results: dict[str, Any], tasks: list[str], metrics: dict[str, str]) -> dict[str, Any]:
    per_task = {}
    for task in tasks:
        row = results["results"][task]
        key = f"{metrics[task]},none"
        if key not in row:
            raise ConfigError(
                f"metric {metrics[task]!r} is not reported for {task}; allowed: "
                f"{sorted(k.split(',')[0] for k in row if ',' in k)}"
            )
        per_task[task] = {
            "metric": metrics[task],
            "accuracy": row[key],
            EXECUTED_LOOPS: row.get(EXECUTED_LOOPS),
            "num_fewshot": results.get("n-shot", {}).get(task),
            "n_samples": results.get("n-samples", {}).get(task, {}).get("effective"),
            "results": row,
        }
    return {
        "tasks": per_task,
        "average": sum(t["accuracy"] for t in per_task.values()) / len(per_task),
        EXECUTED_LOOPS: results.get(EXECUTED_LOOPS),
        "config": results.get("config", {}),
        "lm_eval": results,
    }


# ---- offline copies of the datasets ------------------------------------------------
def export_suite_data(out_dir: str | os.PathLike, tasks=None) -> dict[str, dict[str, int]]:
    """Download each task's dataset (the hub path and subset its lm-eval YAML names)
    and write the splits the task reads to OUT/<task>/<split>.parquet, plus
    OUT/manifest.json (sources and row counts). Needs the HuggingFace hub."""
    import datasets

    out = Path(out_dir)
    manifest = {}
    for task, path in builtin_yaml_paths(_check_tasks(tasks)).items():
        config = builtin_config(task, path)
        splits = required_splits(config)
        data = datasets.load_dataset(
            config["dataset_path"], config.get("dataset_name"), **copy.deepcopy(config.get("dataset_kwargs") or {})
        )
        (out / task).mkdir(parents=True, exist_ok=True)
        rows = {}
        for split in splits:
            data[split].to_parquet(str(out / task / f"{split}.parquet"))
            rows[split] = data[split].num_rows
        manifest[task] = {
            "dataset_path": config["dataset_path"],
            "dataset_name": config.get("dataset_name"),
            "rows": rows,
        }
        print(f"{task}: {rows}", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


@dataclass(frozen=True)
class _Export:
    """`python -m looplab.evaluation.paper_tasks export`'s arguments."""

    out_dir: str = flag(help="the folder the datasets go to, DIR/<task>/<split>.parquet", argument=True)
    tasks: str = flag(",".join(PAPER_TASKS), "comma-separated subset of the suite")


def _main(argv: list[str] | None = None) -> int:
    from looplab.arguments import Parser, add_flags

    parser = Parser(
        prog="python -m looplab.evaluation.paper_tasks",
        description="Write the paper suite's datasets as local parquet files.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_flags(
        sub.add_parser("export", help="download the datasets (needs the hub) into DIR/<task>/<split>.parquet"), _Export
    )
    args = parser.parse_args(argv)
    try:
        export_suite_data(args.out_dir, [t for t in args.tasks.split(",") if t])
    except ConfigError as e:
        print(f"looplab: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
