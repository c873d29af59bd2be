"""The order a grid's trials start in and what the wait for shared stages costs: the
most training FLOPs still to do first (`longest_first`, from `owned_costs`), where the
shared stage chains train (`chains_in_trials`), and the wall time of that schedule
replayed on a number of slots (`makespan`, `replay`; sweeps/estimate.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sweeps.sweep import Sweep
from trainables.pipeline import stage_configs


def makespan(durations, slots: int) -> float:
    """The wall time of jobs started in order, each on the first of `slots` to free up
    (how Ray Tune fills max_concurrent_trials)."""
    return replay([[(None, d)] for d in durations], slots)


def replay(trials: list[list[tuple[str | None, float | None]]], slots: int) -> float:
    """The wall time of trials started in order, each on the first of `slots` to free
    up, each running its stages in order: (folder, seconds) it trains, or (folder, None)
    for a stage an earlier trial trains, which it waits for (the stage lock). A folder
    no earlier trial trains is already there (waits nothing)."""
    free = [0.0] * max(1, slots)
    done_at: dict[str | None, float] = {}
    for stages in trials:
        i = free.index(min(free))
        t = free[i]
        for folder, seconds in stages:
            if seconds is None:
                t = max(t, done_at.get(folder, 0.0))
            else:
                t += seconds
                done_at[folder] = t
        free[i] = t
    return max(free)


def chains_in_trials(n_chains: int, slots: int) -> bool:
    """Whether a grid's shared stage chains train inside trials (each in the trial that
    needs it with the most work of its own, which longest_first starts before the others
    that need it) rather than in a phase of their own before the trials. The phase pays
    when the chains are fewer than the trial slots: each then trains on more than one
    slot's CPUs, where the trials waiting for it would hold their slots idle. With as many
    chains as slots or more, each gets one slot's share either way, and the phase's last
    round leaves slots idle that trials needing no chain could fill (paper_mini: five
    chains on two slots left one slot idle for 2 of the phase's 7 minutes). One slot
    leaves nothing idle to fill, so the phase stays; slots 0: no cap (a cluster), where
    the phase keeps waiting trials from holding devices."""
    return slots > 1 and n_chains >= slots


def longest_first(sweep: Sweep, points: list[dict[str, Any]], storage_path: str, trained_before=()) -> list[dict]:
    """The trial points (seeds included) in the order Tune is to start them: the most
    training FLOPs still to do first (owned_costs). Started in grid order, a long trial
    that happens to come last runs alone while the other slots idle (paper_mini's p-hop
    sweep lost 2 of its 13 minutes so); longest first, the short trials fill the slots at
    the end. Among equal costs, the trials whose shared stages are owned earlier start
    first (they wait least), then the grid's order."""
    cost, waits_on = owned_costs(sweep, points, storage_path, trained_before)
    order = sorted(range(len(points)), key=lambda i: (-cost[i], waits_on[i], i))
    return [points[i] for i in order]


def owned_costs(
    sweep: Sweep, points: list[dict[str, Any]], storage_path: str, trained_before=()
) -> tuple[list[float], list[int]]:
    """Per point, the training FLOPs it is to do, and the rank of the latest owner among
    the stages it reuses (-1: none). Stages the store holds, or in `trained_before`
    (folders the shared chains train first), cost nothing. A stage several trials need
    counts for one of them, its owner: the one with the most work of its own, which so
    starts before the others that need it (they reuse it)."""
    from looplab.costs.resources import flops_per_token, row_length
    from trainables.keyed_step import record_of
    from trainables.pipeline import stage_dir

    per_token = {}
    trained = dict.fromkeys(trained_before, True)  # folder -> whether it costs nothing; a folder read once

    def stages(point: dict[str, Any]) -> list[tuple[str, float]]:
        out = []
        for cfg in stage_configs(sweep.spec, point, storage_path):
            folder = stage_dir(storage_path, cfg)
            if folder not in trained:
                trained[folder] = record_of(storage_path, cfg).finished
            if trained[folder]:
                continue
            shape = (cfg.model, cfg.stage, row_length(cfg))
            if shape not in per_token:
                per_token[shape] = flops_per_token(cfg)
            out.append((folder, per_token[shape] * cfg.train.steps * cfg.train.batch_size * row_length(cfg)))
        return out

    todo = [stages(p) for p in points]
    uses = Counter(folder for chain in todo for folder, _ in chain)
    own = [sum(c for f, c in chain if uses[f] == 1) for chain in todo]
    claiming = sorted(range(len(points)), key=lambda i: -own[i])  # ties: the grid's order
    owner: dict[str, int] = {}  # folder -> the point that trains it
    for i in claiming:
        for folder, _ in todo[i]:
            owner.setdefault(folder, i)
    cost = [sum(c for f, c in chain if owner[f] == i) for i, chain in enumerate(todo)]
    claim_order = {i: rank for rank, i in enumerate(claiming)}
    waits_on = [  # the latest-claiming owner among the stages a point reuses
        max((claim_order[owner[f]] for f, _ in todo[i] if owner[f] != i), default=-1) for i in range(len(points))
    ]
    return cost, waits_on
