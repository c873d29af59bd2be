"""The lm-eval tasks an evaluation step reads, and what of each enters its key.

A task is one of the paper's seven at its shots (`paper_task`, looplab/evaluation/paper_tasks.py),
a task YAML of --eval-include (`include_task`) or a task of lm-eval's own index
(`builtin_task`). Each is built on the driver, where its key needs no model: its name,
shots, the accuracy it logs, a digest of its parsed YAML (`config_version`) and its data
(SHA-256 over the local files it reads, or hub:<dataset path>/<name>).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looplab.keys import LENIENT, digest, files_digest, keyed_name

PAPER, INCLUDE, BUILTIN = "paper", "include", "builtin"  # where a task's config comes from
# The accuracy an evaluation logs: the first of these the task reports (paper tasks: SUITE_METRICS).
ACCURACY_METRICS = ("acc_norm", "acc", "exact_match")


@dataclass(frozen=True)
class EvalTask:
    """One lm-eval task as an evaluation reads it. Built on the driver (the checks and
    the key need no model); the worker rebuilds its lm-eval config from `location`."""

    name: str
    source: str  # paper: lm-eval's YAML at the paper's shots | include: a task YAML | builtin: lm-eval's YAML
    num_fewshot: int | None
    metric: str  # the accuracy logged as lm_eval.<task> ("" for tasks without one, e.g. perplexity only)
    data: str  # the data's content: "sha256:..." over local files, or "hub:<path>[/<name>][@<revision>]"
    version: str = ""  # a digest of the task's parsed YAML config (config_version)
    location: str = ""  # paper: the local data folder ("" = the hub); include / builtin: the YAML

    def key_payload(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "num_fewshot": self.num_fewshot,
            "metric": self.metric,
            "data": self.data,
            "version": self.version,
        }

    def config(self) -> dict[str, Any]:
        """The config dict lm-eval's simple_evaluate takes (no task index needed)."""
        from looplab.evaluation.paper_tasks import builtin_config, suite_configs

        if self.source == PAPER:
            return suite_configs([self.name], self.location or None)[0]
        if self.source == INCLUDE:
            return include_config(Path(self.location))
        return builtin_config(self.name, Path(self.location))

    def describe(self) -> str:
        shots = "?" if self.num_fewshot is None else self.num_fewshot
        return f"{self.name} ({shots}-shot, {self.metric or 'no accuracy'}, {self.data[:19]})"


def paper_task(name: str, data_dir: str | None) -> EvalTask:
    """One of the paper's seven at its shots (looplab.evaluation.paper_tasks), from DIR/<task>/<split>.parquet
    or the hub. Raises ConfigError when a local file is missing."""
    from looplab.evaluation.paper_tasks import SUITE_METRICS, builtin_yaml_paths, suite_configs

    (config,) = suite_configs([name], None)
    data = hub_source(config)
    if data_dir:
        (local,) = suite_configs([name], data_dir)
        data = files_digest(_data_files(local))
    return EvalTask(
        name,
        PAPER,
        config.get("num_fewshot"),
        SUITE_METRICS[name],
        data,
        config_version(builtin_yaml_paths([name])[name]),
        str(Path(data_dir).resolve()) if data_dir else "",
    )


def include_task(name: str, yaml_path: str | os.PathLike) -> EvalTask:
    """A task YAML of --eval-include: its data files may be relative to the YAML's folder."""
    path = Path(yaml_path).resolve()
    config = include_config(path)
    files = _data_files(config)
    data = files_digest(files) if files else hub_source(config)
    return EvalTask(
        name, INCLUDE, config.get("num_fewshot"), accuracy_metric(config), data, config_version(path), str(path)
    )


def config_version(path: Path) -> str:
    """A task's version: a digest of its YAML config as parsed (includes merged), so a
    new prompt, metric or split (a custom task's edit, or another lm-eval's) is a new
    evaluation while comments and layout are not;
    without its data's paths (their content is the data digest) and without the folder
    its !function references resolve in (a moved task folder keeps its key)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    folder = str(path.resolve().parent) + os.sep

    def portable(value):
        if isinstance(value, dict):
            return {k: portable(v) for k, v in value.items()}
        if isinstance(value, list):
            return [portable(v) for v in value]
        return value[len(folder) :] if isinstance(value, str) and value.startswith(folder) else value

    config = portable(load_yaml(path, resolve_func=False))
    kwargs = dict(config.get("dataset_kwargs") or {})
    kwargs.pop("data_files", None)
    config["dataset_kwargs"] = kwargs
    if config.get("dataset_path") and (path.parent / str(config["dataset_path"])).exists():
        config.pop("dataset_path")
    return keyed_name("cfg", digest(config, form=LENIENT))  # LENIENT: the form stored versions were made in


def builtin_task(name: str, yaml_path: str | os.PathLike) -> EvalTask:
    """A task of lm-eval's own index, with its YAML's shots and the hub's data."""
    from looplab.evaluation.paper_tasks import builtin_config

    config = builtin_config(name, Path(yaml_path))
    return EvalTask(
        name,
        BUILTIN,
        config.get("num_fewshot"),
        accuracy_metric(config),
        hub_source(config),
        config_version(Path(yaml_path)),
        str(Path(yaml_path).resolve()),
    )


def include_config(path: Path) -> dict[str, Any]:
    """A task YAML as a config dict, its local data paths made absolute against the YAML's
    folder: `datasets` resolves relative paths against the working directory, which is
    another one in every Ray worker."""
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(path, resolve_func=True)
    base = path.parent
    kwargs = dict(config.get("dataset_kwargs") or {})
    if "data_files" in kwargs:
        kwargs["data_files"] = _map_paths(kwargs["data_files"], base)
        config["dataset_kwargs"] = kwargs
    local = base / str(config.get("dataset_path", ""))
    if config.get("dataset_path") and not Path(config["dataset_path"]).is_absolute() and local.exists():
        config["dataset_path"] = str(local.resolve())
    return config


def _map_paths(files, base: Path):
    """data_files (a path, a list, or a dict of either) with relative paths that exist under base made absolute."""
    if isinstance(files, dict):
        return {k: _map_paths(v, base) for k, v in files.items()}
    if isinstance(files, (list, tuple)):
        return [_map_paths(v, base) for v in files]
    path = Path(str(files))
    return str((base / path).resolve()) if not path.is_absolute() and (base / path).exists() else str(files)


def _data_files(config: dict[str, Any]) -> dict[str, list[Path]]:
    """The local files a config reads, by split (or position), that exist."""
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    out: dict[str, list[Path]] = {}
    items: Iterable[tuple[str, Any]]
    if isinstance(files, dict):
        items = files.items()
    elif files:
        items = [("", files)]
    else:
        items = []
    for split, value in items:
        paths = [value] if isinstance(value, (str, os.PathLike)) else list(value)
        out[split] = [Path(p) for p in paths if Path(p).is_file()]
    local = Path(str(config.get("dataset_path", "")))
    if config.get("dataset_path") and local.is_absolute() and local.exists():
        out["dataset_path"] = sorted(p for p in ([local] if local.is_file() else local.rglob("*")) if p.is_file())
    return {k: v for k, v in out.items() if v}


def hub_source(config: dict[str, Any]) -> str:
    revision = (config.get("dataset_kwargs") or {}).get("revision")
    name = config.get("dataset_name")
    return f"hub:{config.get('dataset_path')}" + (f"/{name}" if name else "") + (f"@{revision}" if revision else "")


def accuracy_metric(config: dict[str, Any]) -> str:
    """Which accuracy a task's evaluation logs: acc_norm where the task reports it (as the
    paper suite does; raw log-likelihoods favour short choices), else acc, else
    exact_match; "" for a task without one (perplexity tasks). Without a metric_list,
    lm-eval's defaults per output type."""
    listed = [m["metric"] if isinstance(m, dict) else str(m) for m in config.get("metric_list") or []]
    if not listed:
        listed = {
            "multiple_choice": ["acc", "acc_norm"],
            "loglikelihood": ["acc"],
            "generate_until": ["exact_match"],
        }.get(config.get("output_type", "generate_until"), [])
    return next((m for m in ACCURACY_METRICS if m in listed), "")
