"""Which runs a report covers, said first in its page's header: one sweep (its run, the
trials under it, those it reused whole from another sweep's run), or every run of the
experiments with each sweep run listed. Sweeps that share a storage and a preset share
one experiment, so a whole-experiment page may pool a grid, a search and an extension;
it says so, and how to read one of them alone."""

from __future__ import annotations

import json
import math

import polars as pl

from analysis.load import RunSet
from analysis.names import PARAM
from analysis.report.wording import counted
from looplab import tracking

ONE_SWEEP_HINT = "python -m analysis --sweep-run ID reports one of them alone"


def coverage_lines(runs: RunSet, sweep_run_id: str | None, scope: str) -> list[str]:
    """The header's lines on what the page covers (see the module docstring)."""
    table = runs.runs
    sweeps = table.filter(pl.col("level") == tracking.SWEEP).sort("start_time", "run_id")
    trials = table.filter(pl.col("level") == tracking.TRIAL)
    if scope == "sweep" and sweep_run_id:
        return [_one_sweep(sweeps, trials, sweep_run_id)]
    where = ", ".join(repr(e) for e in runs.experiments.values())
    said = [
        f"sweep {_sweep_name(row)}: {_of_declared(_under(trials, row['run_id']), declared_trials(row))}"
        for row in sweeps.rows(named=True)
    ]
    loose = trials.filter(
        ~pl.col("parent_run_id").is_in(sweeps["run_id"].implode()) | pl.col("parent_run_id").is_null()
    )
    said += [f"{counted(loose.height, 'trial')} under no sweep run"] if loose.height else []
    if sweeps.height > 1:
        head = f"covers every run of {where}: {sweeps.height} sweeps pooled ({ONE_SWEEP_HINT}):"
        return [head, *(f"  {line}" for line in said)]
    if sweeps.height == 1:
        return [f"covers every run of {where}: one {said[0]}", *said[1:]]
    return [f"covers every run of {where} (no sweep run)", *said]


def _one_sweep(sweeps: pl.DataFrame, trials: pl.DataFrame, sweep_run_id: str) -> str:
    """'covers sweep NAME (key K, run ID) alone: N trials under its run[, M it reused whole
    from run X]'."""
    own = sweeps.filter(pl.col("run_id") == sweep_run_id)
    row = own.row(0, named=True) if own.height else None
    name = _sweep_name(row) if row else f"run {sweep_run_id}"
    line = f"covers sweep {name} alone: {counted(_under(trials, sweep_run_id), 'trial')} under its run"
    elsewhere = trials.filter(pl.col("parent_run_id") != sweep_run_id)
    if elsewhere.height:
        owners = ", ".join(sorted(set(elsewhere["parent_run_id"].drop_nulls().to_list()))) or "no sweep run"
        line += f", {counted(elsewhere.height, 'trial')} it reused whole from run {owners}"
    declared = declared_trials(row) if row else None
    if declared is not None and declared > trials.height:
        line += (
            f"; of the {declared} trials it declares, {declared - trials.height} are not read: never run, or "
            "reused whole from another sweep's run (the report the sweep wrote at its end has those)"
        )
    return line


def declared_trials(row: dict) -> int | None:
    """How many trials a sweep run declares in its params (tracking.sweep_params): a grid's
    points (the product of its axes, times its paired points) times its seeds, a search's
    samples; None when its params do not say (a run logged by hand, a param cut short)."""
    try:
        if row.get(PARAM + tracking.SWEEP_PARAM + "search") == "grid":
            axes = [json.loads(v) for c, v in row.items() if c.startswith(PARAM + tracking.GRID_PARAM) and v]
            points = json.loads(row.get(PARAM + tracking.POINTS_PARAM) or "[]")
            seeds = json.loads(row[PARAM + tracking.SWEEP_PARAM + "seeds"])
            return math.prod(len(a) for a in axes) * max(1, len(points)) * len(seeds)
        samples = row.get(PARAM + tracking.SWEEP_PARAM + "num_samples")
        return int(samples) if samples is not None else None
    except (KeyError, TypeError, ValueError):  # json.JSONDecodeError is a ValueError
        return None


def _of_declared(found: int, declared: int | None) -> str:
    """'2 trials', or '1 trial of the 3 it declares' when the store holds fewer under its run."""
    said = counted(found, "trial")
    return f"{said} of the {declared} it declares" if declared is not None and declared > found else said


def _sweep_name(row: dict) -> str:
    """'beta_ablation-215417f050 (key 215417f050, run 0a1b…)': what --sweep-run and the dashboard name it by."""
    return f"{row['run_name']} (key {row[tracking.SWEEP_KEY] or '?'}, run {row['run_id']})"


def _under(trials: pl.DataFrame, sweep_run_id: str) -> int:
    return trials.filter(pl.col("parent_run_id") == sweep_run_id).height
