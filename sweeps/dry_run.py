"""The dry run: what a sweep would train and on what, without starting Ray: the trials
and their stage keys, each stage stored (reused), broken (to train again) or to train
with its plan (steps, tokens, FLOPs, micro-batching, peak memory, GPU-hours), the
resources, where the shared chains train, and the downstream evaluation grid."""

from __future__ import annotations

import json
from typing import Any

from looplab.costs.resources import StagePlan
from looplab.keys import stage_folder
from sweeps.flags import Launch
from sweeps.schedule import chains_in_trials
from sweeps.sweep import Resources, Sweep
from trainables.pipeline import stage_configs
from trainables.trial import WAITING_TRIAL_CPU


def describe(
    sweep: Sweep, launch: Launch, points: list[dict[str, Any]], res: Resources, plans: dict[str, StagePlan]
) -> str:
    """The dry run: the trial list, each stage's plan (steps, tokens, FLOPs,
    micro-batching, peak memory, GPU-hours; stored, or to train again) and the resources."""
    lines = [f"sweep {sweep.name} on preset {sweep.spec.preset} ({launch.search} search)", "", "trials:"]
    unique: dict[str, Any] = {}
    for point in points:
        stages = stage_configs(sweep.spec, point, launch.storage_path)
        keys = " → ".join(f"{c.stage}:{c.stage_key()}" for c in stages)
        lines.append(f"  {json.dumps(point, sort_keys=True)}  {keys}")
        for c in stages:
            unique.setdefault(stage_folder(c.stage, c.stage_key()), c)
    if launch.search == "optuna":
        lines.append(f"  (Optuna samples {launch.num_samples} trials within {sweep.ranges}; corners shown)")
    shared = sum(len(sweep.spec.stages_of(p)) for p in points) - len(unique)
    lines += _stage_lines(launch, unique, shared, plans)
    lines += _resource_lines(launch, res)
    if launch.search == "grid":
        lines += _shared_chain_lines(sweep, launch, points, res)
    if sweep.evaluation is not None:  # the downstream grid (sweeps/evaluate.py)
        lines += describe_evaluation(sweep, points, launch.storage_path)
    return "\n".join(lines)


def _stage_lines(launch: Launch, unique: dict[str, Any], shared: int, plans: dict[str, StagePlan]) -> list[str]:
    """Each stage the sweep needs, once: stored (reused), broken (to train again) or to
    train, with its plan; and the compute of those it trains."""
    records = stored_stages(unique, launch.storage_path)
    stored = {name for name, record in records.items() if record.finished}
    broken = {name: record.problem for name, record in records.items() if record.broken}
    left = len(unique) - len(stored)
    if records:
        again = f", {len(broken)} of them to train again" if broken else ""
        counts = f"{len(unique)} ({len(stored)} stored, {left} to train{again}; {shared} reused across trials)"
    else:
        counts = f"{len(unique)} to train ({shared} reused across trials)"
    lines = ["", f"stages: {counts}"]
    total_flops = total_tokens = hours = 0.0
    retrained_parent = _parents_to_train(unique, stored, launch.storage_path)
    for name in unique:
        if name in retrained_parent:  # it follows its parent's weights (trainables/keyed_step.parent_problem)
            lines.append(
                f"  {name}: stored; its parent {retrained_parent[name]} trains again first, then it is reused "
                "if the parent's weights come out the same (training is deterministic on one machine), else retrained"
            )
            continue
        if name in stored:
            lines.append(f"  {name}: stored, reused as it is (not trained again)")
            continue
        if name in broken:
            lines.append(f"  {name}: {broken[name]} → retrain")
        plan = plans[name]
        total_flops, total_tokens = total_flops + plan.flops, total_tokens + plan.tokens
        hours += plan.gpu_hours(launch.mfu, launch.gpu_tflops)
        lines.append(f"  {name}: {plan.line(launch.mfu, launch.gpu_tflops)}")
    scope = f" for the {left} stage(s) to train" if stored else ""  # the stored ones cost nothing
    return lines + [
        "",
        f"compute{scope}: {total_tokens:,.0f} training tokens, ≈ {total_flops:.2e} FLOPs (looplab's FLOP count, "
        f"looplab/costs/resources.py), ≈ {hours:,.1f} GPU-hours at {launch.mfu:.0%} MFU of "
        f"{launch.gpu_tflops:g} TFLOP/s",
    ]


def _resource_lines(launch: Launch, res: Resources) -> list[str]:
    """The memory model's scope, the Ray resources and what each trial holds."""
    gpu = f", {launch.gpus_per_worker} GPU" if launch.gpus_per_worker else ""
    device = "GPU" if launch.gpus_per_worker > 0 or launch.gpu_memory > 0 else "device (CPU run: GPU figures for scale)"
    return [
        f"memory: peak per {device} from looplab/costs/memory.py's model"
        + (
            f", micro-batches fitted to --gpu-memory {launch.gpu_memory:g} GiB less a "
            f"{launch.memory_margin:g} GiB margin (--memory-margin)"
            if launch.gpu_memory
            else ""
        ),
        "resources: "
        + (
            f"local Ray, {res.cpus:g} CPUs, {res.gpus} GPUs"
            if not launch.address
            else f"Ray cluster at {launch.address}"
        ),
        f"  {res.max_concurrent or 'as many'} concurrent trial(s) × "
        + (
            f"{res.cpus_per_worker} CPU{gpu} (Ray Train local mode: each trial trains in its own process)"
            if not launch.num_workers
            else f"({WAITING_TRIAL_CPU} CPU trial + {launch.num_workers} worker(s) × {res.cpus_per_worker} CPU{gpu})"
        ),
        "  plus Ray's own start per sweep, and per stage "
        + (
            "a few seconds of MLflow"
            if not launch.num_workers
            else "about 15-25 s on 2 cores to start its worker group"
        ),
        _threads_line(),
    ]


def _threads_line() -> str:
    """What a stage's torch threads will be: the free cores within its CPUs, decided as
    it starts (looplab/threads.py; its first progress line says the count and why)."""
    from looplab import threads

    cpus, busy = threads.usable_cpus(), threads.machine_load()
    free = threads.choose(load=busy).count
    return (
        f"torch threads: each stage takes the free cores within its CPUs as it starts (now {free} of "
        f"{cpus} free, {busy:.1f} busy); its first progress line says how many"
    )


def _shared_chain_lines(sweep: Sweep, launch: Launch, points: list[dict[str, Any]], res: Resources) -> list[str]:
    """Where the stage chains several trials share train: first, or in the trials."""
    from trainables.trial import shared_prefixes

    jobs = shared_prefixes(sweep.spec, points, launch.storage_path)
    if jobs and chains_in_trials(len(jobs), res.max_concurrent):
        return [
            f"  {len(jobs)} shared stage chain(s) not yet trained, each in the first trial that needs it "
            "(the others start after it and reuse it)"
        ]
    if jobs:
        return [
            f"  first: {len(jobs)} shared stage chain(s) not yet trained, each with an even share "
            "of the machine, then the trials (which reuse them)"
        ]
    return []


def _parents_to_train(unique: dict[str, Any], stored: set[str], storage_path: str) -> dict[str, str]:
    """The stored stages whose parent the sweep trains (again): child folder -> parent folder."""
    from trainables.pipeline import checkpoint_of

    folder_of = {checkpoint_of(storage_path, cfg): name for name, cfg in unique.items()}
    parents = {name: folder_of.get(cfg.init_from, "") for name, cfg in unique.items() if name in stored}
    return {name: parent for name, parent in parents.items() if parent and parent not in stored}


def stored_stages(unique: dict[str, Any], storage_path: str) -> dict[str, Any]:
    """What the store holds of the stages (of unique: folder name -> config) it has a done
    marker for, as trainables/keyed_step.py's StageRecord: a finished one is reused, a
    broken one (its files missing or damaged) trained again, the check a trial makes
    (trainables/trial.py's _run_stage)."""
    from trainables.keyed_step import record_of

    records = {name: record_of(storage_path, cfg) for name, cfg in unique.items()}
    return {name: record for name, record in records.items() if record.done is not None}


def describe_evaluation(sweep: Sweep, points: list[dict[str, Any]], storage_path: str) -> list[str]:
    """The dry run's evaluation lines: the grid over every stage the trials would train
    (no store is read: reuse is decided when it runs)."""
    from trainables.evaluation import Checkpoint, describe_grid

    checkpoints = []
    for params in points:
        configs = stage_configs(sweep.spec, params, storage_path)
        checkpoints += [
            Checkpoint(
                "",
                c.stage,
                c.stage_key(),
                c.config_hash(),
                tuple(x.stage for x in configs[: i + 1]),
                c.model.n_loops,
                "",
            )
            for i, c in enumerate(configs)
        ]
    return describe_grid(sweep.evaluation, checkpoints)
