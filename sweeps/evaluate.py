"""Downstream evaluation for sweeps: the --eval-* flags and the grid they declare, its
checks before Ray starts, the step a sweep runs after training, and the command that
evaluates the finished checkpoints of an existing sweep:

    python -m sweeps.evaluate --experiment adaptive_pipeline-debug --storage-path runs/table4 \\
        --eval-tasks paper --eval-data /data/lm_eval --eval-policies "dense:0.2,0.4;skip:0.2,0.4;forced:1-4"

The grid (trainables/evaluation.py) is tasks × policies × the sweep's checkpoints; every
evaluation is keyed by content, so running the same command (or the sweep) again with
one more q, task, policy or stage evaluates only what is new, and trains nothing.

Tasks (--eval-tasks): `paper` is the paper's seven (looplab.evaluation.paper_tasks: lm-eval's own
YAMLs at the paper's shots), read from --eval-data DIR/<task>/<split>.parquet when given,
else from the hub; other names are tasks of --eval-include DIR (task YAMLs whose data
files may be relative to the YAML's folder), else lm-eval's built-in tasks (their hub
data). Every name is checked against these indexes before any model loads.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from looplab import destinations, tracking
from looplab.arguments import add_flags, flag, flags_of
from looplab.config import ConfigError
from looplab.policy import GATE, parse_policies
from looplab.stages import STAGE_NAMES, get_stage
from sweeps.flags import Store, distinct, fail, store_parser
from sweeps.runtime import check_ray_address, console_to_log, local_gpus, write_report
from trainables.checkpoints import pipeline_checkpoints, store_checkpoints
from trainables.eval_tasks import builtin_task, include_task, paper_task
from trainables.evaluation import (
    EvalGrid,
    EvalSummary,
    applies,
    default_policies,
    describe_grid,
    evaluate,
)
from trainables.storage import Storage

POLICY_EXAMPLE = "dense:0.2,0.4;skip:0.2,0.4;forced:1-4"


@dataclass(frozen=True)
class EvalFlags:
    """The downstream evaluation flags every training sweep gets (and python -m
    sweeps.evaluate), each field its flag; eval_grid() checks them and resolves the
    EvalGrid they declare (its resources default to EvalGrid's own)."""

    eval_tasks: str = flag(
        "",
        "lm-eval tasks to evaluate every trained checkpoint on: paper (the seven of Table 3) "
        "and/or task names (the paper's, those of --eval-include, or lm-eval's own)",
        metavar="paper|TASK,...",
    )
    eval_policies: str = flag(
        "",
        f"exit policies, e.g. '{POLICY_EXAMPLE}' (default: forced 1..R on a stage without a gate, "
        "App. E; dense and skip at q 0.2..1.0 on gated stages, App. F); gate policies go to gated "
        "stages, the others to every stage",
        metavar="GRID",
    )
    eval_data: str = flag(
        "",
        "the paper tasks' data from DIR/<task>/<split>.parquet (python -m looplab.evaluation.paper_tasks "
        "export DIR), offline; default: the hub",
        metavar="DIR",
    )
    eval_include: str = flag("", "a folder of custom task YAMLs", metavar="DIR")
    eval_limit: str = flag("", "documents per task (default: all)", metavar="N")
    eval_stages: str = flag("", "evaluate only these stages (default: all)", metavar="STAGE,...")
    eval_cpus: float = flag(EvalGrid.cpus, "CPUs of each evaluation job")
    eval_gpus: float = flag(EvalGrid.gpus, "GPUs of each evaluation job")
    eval_batch_size: int = flag(EvalGrid.batch_size, "lm-eval requests per forward")
    eval_device: str = flag(EvalGrid.device, "auto | cpu | cuda")


EVAL_GROUP = "downstream evaluation (after training; keyed by content, never recomputed)"


def add_eval_flags(p: argparse.ArgumentParser) -> None:
    add_flags(p.add_argument_group(EVAL_GROUP), EvalFlags)


def with_eval_flags(options: type):
    """A training sweep's add_flags: its own options' flags, then the downstream evaluation's."""

    def add(p: argparse.ArgumentParser) -> None:
        add_flags(p, options)
        add_eval_flags(p)

    return add


def evaluation_of(args: argparse.Namespace) -> EvalGrid | None:
    """A training sweep's evaluation grid from its parsed flags (add_eval_flags' and --address)."""
    return eval_grid(flags_of(EvalFlags, args), args.address)


def eval_grid(flags: EvalFlags, address: str = "") -> EvalGrid | None:
    """The grid the flags declare, every task checked against its index; None without
    --eval-tasks. address: the Ray cluster's (none: this machine must have the GPUs
    asked for). A bad value is a ConfigError naming its flag."""
    given = [
        f for f in ("eval_policies", "eval_data", "eval_include", "eval_limit", "eval_stages") if getattr(flags, f)
    ]
    if not flags.eval_tasks:
        if given:
            fail("--eval-tasks", "", f"paper | TASK,... (--{given[0].replace('_', '-')} needs tasks to evaluate)")
        return None
    if flags.eval_policies:
        check_eval_policies(flags.eval_policies)
    if flags.eval_cpus <= 0:
        fail("--eval-cpus", flags.eval_cpus, "a number > 0")
    if flags.eval_gpus < 0:
        fail("--eval-gpus", flags.eval_gpus, "a number >= 0")
    if flags.eval_gpus > 0 and not address and not local_gpus():
        # Ray would wait forever for a GPU this machine does not have
        fail("--eval-gpus", flags.eval_gpus, "0 here (no CUDA device on this machine)")
    if flags.eval_batch_size < 1:
        fail("--eval-batch-size", flags.eval_batch_size, "an integer >= 1")
    if flags.eval_device not in ("auto", "cpu", "cuda") and not flags.eval_device.startswith("cuda:"):
        fail("--eval-device", flags.eval_device, "auto | cpu | cuda | cuda:N")
    stages = [s.strip() for s in flags.eval_stages.split(",") if s.strip()]
    return EvalGrid(
        tasks=resolve_tasks(flags.eval_tasks, flags.eval_include, flags.eval_data),
        policies=flags.eval_policies,
        limit=parse_limit(flags.eval_limit),
        stages=tuple(distinct("--eval-stages", flags.eval_stages, stages)),
        cpus=flags.eval_cpus,
        gpus=flags.eval_gpus,
        batch_size=flags.eval_batch_size,
        device=flags.eval_device,
    )


def check_eval_policies(text: str) -> None:
    try:
        parse_policies(text)
    except ConfigError as e:
        fail("--eval-policies", text, f"';'-separated groups such as '{POLICY_EXAMPLE}' ({e})")


def parse_limit(text: str) -> int | float | None:
    """lm-eval's limit: N documents per task, or a fraction in (0, 1)."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0 or (value >= 1 and value != int(value)):
        fail("--eval-limit", text, "a count of documents >= 1, or a fraction in (0, 1)")
    return value if value < 1 else int(value)


def resolve_tasks(text: str, include: str, data: str) -> tuple:
    """--eval-tasks as EvalTasks, in order, each once: checked against --eval-include's
    index, the paper's seven, then lm-eval's own index (built only when a name is
    neither: it takes seconds)."""
    from looplab.evaluation.paper_tasks import PAPER_TASKS

    names = []
    for name in distinct("--eval-tasks", text, [n.strip() for n in text.split(",") if n.strip()]):
        names += list(PAPER_TASKS) if name == "paper" else [name]  # paper,piqa: piqa once
    names = list(dict.fromkeys(names))
    if not names:
        fail("--eval-tasks", text, "paper | comma-separated lm-eval task names")
    if data and not Path(data).is_dir():
        fail(
            "--eval-data",
            data,
            "a folder with <task>/<split>.parquet files (python -m looplab.evaluation.paper_tasks export)",
        )
    local = _include_index(include)
    builtin = None
    tasks = []
    for name in names:
        if name in local:
            entry = local[name]
            if entry.yaml_path is None or entry.kind.name != "TASK":
                fail("--eval-tasks", name, f"a task, not a {entry.kind.name.lower()} (evaluate its tasks by name)")
            tasks.append(include_task(name, entry.yaml_path))
        elif name in PAPER_TASKS:
            try:
                tasks.append(paper_task(name, data or None))
            except ConfigError as e:
                fail("--eval-data", data, f"the splits every asked-for suite task reads ({e})")
        else:
            if builtin is None:
                from lm_eval.tasks import TaskManager

                builtin = TaskManager().task_index
            tasks.append(_builtin(name, builtin, local, include))
    return tuple(tasks)


def _include_index(include: str) -> dict:
    """--eval-include's task index ({} without one)."""
    if not include:
        return {}
    if not Path(include).is_dir():
        fail("--eval-include", include, "a folder of lm-eval task YAMLs")
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(Path(include).resolve()), include_defaults=False).task_index


def _builtin(name: str, builtin: dict, local: dict, include: str):
    """A task of lm-eval's own index, or the one line listing what a name may be."""
    from looplab.evaluation.paper_tasks import PAPER_TASKS

    entry = builtin.get(name)
    if entry is None or entry.yaml_path is None or entry.kind.name != "TASK":
        where = f", tasks of --eval-include ({', '.join(sorted(local)) or 'none'})" if include else ""
        fail("--eval-tasks", name, f"paper | {', '.join(PAPER_TASKS)}{where} | a task of lm-eval's own index")
    return builtin_task(name, entry.yaml_path)


# ---- the grid against a sweep's stages -----------------------------------------------------
def check_grid(grid: EvalGrid, stages) -> None:
    """stages: (stage, R, task kind) of the checkpoints the grid would evaluate. Every
    policy must apply to some of them, every --eval-stages name must be one of them, and
    they must be language models (lm-eval reads text)."""
    present = {s for s, _, _ in stages}
    for stage in grid.stages:
        if stage not in present:
            fail("--eval-stages", ",".join(grid.stages), f"stages of this sweep: {', '.join(sorted(present))}")
    chosen = [(s, r, kind) for s, r, kind in stages if grid.evaluates(s)]
    kinds = {kind for _, _, kind in chosen}
    if kinds - {"text"}:
        fail(
            "--eval-tasks",
            ",".join(t.name for t in grid.tasks),
            f"none for a sweep of {'/'.join(sorted(kinds - {'text'}))} models (lm-eval needs language models: "
            "task.kind=text)",
        )
    if grid.policies:
        for policy in parse_policies(grid.policies):
            if not any(applies(policy, s, r) for s, r, _ in chosen):
                gated = ", ".join(name for name in STAGE_NAMES if get_stage(name).gated)
                why = (
                    f"a gated stage ({gated}) to read its gate"
                    if policy.rule == GATE
                    else f"a depth <= R (at most {max(r for _, r, _ in chosen)} here)"
                )
                fail(
                    "--eval-policies",
                    policy.spec,
                    f"policies that apply to this sweep's stages "
                    f"({', '.join(sorted({s for s, _, _ in chosen}))}); "
                    f"{policy.spec} needs {why}",
                )
    elif not any(default_policies(s, r) for s, r, _ in chosen):
        fail("--eval-policies", "", "a policy grid (no stage has default policies)")


def sample_stages(sweep) -> list[tuple[str, int, str]]:
    """(stage, R, task kind) of every stage a sweep's trials would train (seed 0; the
    range corners stand for an Optuna search)."""
    import itertools

    from sweeps.sweep import grid_points  # here: the plan imports torch, which --help should not wait for
    from trainables.pipeline import stage_configs

    if sweep.grid or sweep.points:
        points = grid_points(sweep)
    else:
        points = [
            dict(zip(sweep.ranges, corner))
            for corner in itertools.product(*((lo, hi) for lo, hi, _ in sweep.ranges.values()))
        ] or [{}]
    return [
        (c.stage, c.model.n_loops, c.task.kind) for p in points for c in stage_configs(sweep.spec, {**p, "seed": 0}, "")
    ]


def with_evaluation(sweep, grid: EvalGrid | None):
    """The sweep with its evaluation grid, checked against its stages (None: unchanged)."""
    if grid is None:
        return sweep
    check_grid(grid, sample_stages(sweep))
    return replace(sweep, evaluation=grid)


# ---- the step of a sweep --------------------------------------------------------------------
def evaluate_trials(sweep, platform, trial_params: list[dict[str, Any]]) -> EvalSummary | None:
    """After training (sweeps/launch.py, Ray up): the grid on the trials' trained stages,
    what the store lacks only; the counts go to the sweep run and its summary."""
    grid = getattr(sweep, "evaluation", None)
    if grid is None:
        return None
    checkpoints = pipeline_checkpoints(sweep.spec, trial_params, platform.storage_path)
    summary = evaluate(
        grid,
        checkpoints,
        tracking_uri=platform.tracking_uri,
        experiment=platform.experiment,
        artifact_root=Storage(platform.storage_path).path("mlflow"),
        board=platform.progress_board,
    )
    log_counts(platform.tracking_uri, platform.sweep_run_id, summary)
    return summary


def log_counts(uri: str, run_id: str | None, summary: EvalSummary) -> None:
    if run_id:
        tracking.log_metrics(
            tracking.client(uri),
            run_id,
            {
                tracking.EVALS_RAN: summary.ran,
                tracking.EVALS_REUSED: summary.reused,
                tracking.EVALS_FAILED: summary.failed,
            },
        )


# ---- python -m sweeps.evaluate ------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluate(Store):
    """python -m sweeps.evaluate's options beside the evaluation flags (EvalFlags)."""

    dry_run: bool = flag(False, "print what would be evaluated and what is reused")


def parser() -> argparse.ArgumentParser:
    return store_parser(
        "evaluate",
        "Evaluate the finished checkpoints of an existing sweep on lm-eval tasks (what the store lacks only).",
        Evaluate,
        {EVAL_GROUP: EvalFlags},
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options, flags = flags_of(Evaluate, args), flags_of(EvalFlags, args)
    try:
        storage, uri = options.located()
        grid = eval_grid(flags, options.address)
        if grid is None:
            fail("--eval-tasks", "", "paper | TASK,... (what to evaluate the checkpoints on)")
        mc, experiment_id, checkpoints, notes = experiment_checkpoints(options, storage, uri, dry_run=options.dry_run)
        check_grid(grid, [(c.stage, c.n_loops, c.task_kind) for c in checkpoints])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if options.dry_run:
        from trainables.evaluation import grid_evaluations
        from trainables.keyed_step import EVAL_STEP

        done = EVAL_STEP.finished_keys(mc, experiment_id)
        todo = [ev for ev in grid_evaluations(grid, checkpoints) if ev.key not in done]
        print("\n".join(describe_grid(grid, checkpoints)).strip("\n"))
        print(f"  to evaluate now: {len(todo)} (the others are in the store)")
        return 0
    summary, sweep_run = run(grid, checkpoints, uri, options.experiment, storage, options.address)
    print(summary.line())
    report = write_report(
        uri, options.experiment, sweep_run, storage.scratch() / "analysis" / f"{options.experiment}-evaluation"
    )
    if "report.html" in report:
        print(f"report.html: {report['report.html']}")
    return 0 if not summary.failed else 1


def open_experiment(uri: str, name: str, write: bool = True):
    """The MLflow client and the experiment's id; a store that does not exist is not
    created (MLflow would make an empty one), one to write is written now (a probe)."""
    destinations.existing_store("--tracking-uri", uri, write=write)
    mc = tracking.client(uri)
    found = mc.get_experiment_by_name(name)
    if found is None or found.lifecycle_stage != "active":
        names = sorted(e.name for e in mc.search_experiments())
        fail("--experiment", name, f"an experiment of {uri}: {', '.join(names) or 'none'}")
    return mc, found.experiment_id


def experiment_checkpoints(options: Store, storage: Storage, uri: str, *, dry_run: bool, ray: bool = True):
    """(MLflow client, experiment id, the experiment's finished stage checkpoints in the
    store, notes on those left out): the store read, and for a run also its scratch
    folder written (Ray's log and the report go there) and the Ray address asked; an
    experiment without checkpoints is a ConfigError."""

    mc, experiment_id = open_experiment(uri, options.experiment, write=not dry_run)
    if not dry_run:
        destinations.output_dir("--storage-path", storage.scratch())
        if ray:
            check_ray_address("--address", options.address)
    found, notes = store_checkpoints(mc, experiment_id, storage.root)
    if not found:
        fail(
            "--experiment",
            options.experiment,
            "an experiment with FINISHED stage runs whose checkpoints exist" + (f" ({notes[0]})" if notes else ""),
        )
    return mc, experiment_id, found, notes


def run(grid: EvalGrid, checkpoints, uri: str, experiment: str, storage: Storage, address: str):
    """Start (or join) Ray, evaluate with live progress, record the counts on the
    sweep's newest parent run."""
    import ray

    from trainables.progress import Printer, board_name

    logs = storage.scratch() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    mc = tracking.client(uri)
    sweep = tracking.find_run(
        mc, mc.get_experiment_by_name(experiment).experiment_id, **{tracking.LEVEL: tracking.SWEEP}
    )
    board = board_name(f"evaluate-{experiment}")
    with console_to_log(logs / "ray.log"):
        ray.init(address=address or None, include_dashboard=None, log_to_driver=False, configure_logging=False)
    try:
        with Printer(board):
            summary = evaluate(
                grid,
                checkpoints,
                tracking_uri=uri,
                experiment=experiment,
                artifact_root=storage.path("mlflow"),
                board=board,
            )
    finally:
        with console_to_log(logs / "ray.log"):
            ray.shutdown()
    sweep_run = sweep.info.run_id if sweep is not None else None
    log_counts(uri, sweep_run, summary)
    return summary, sweep_run


if __name__ == "__main__":
    sys.exit(main())
