"""The platform commands' options dataclasses (looplab/arguments.py flag): each flag
declared once and read back typed; the grids' override flags each set the grid field
of their name, and none is left unread."""

from __future__ import annotations

import dataclasses

import pytest


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_grid_flag_overrides_the_grid_field_of_its_name():
    from sweeps.bench_grid import (
        ARRIVAL_READERS,
        SPEED_READERS,
        ArrivalFlags,
        ArrivalGrid,
        SpeedFlags,
        SpeedGrid,
    )

    assert set(SPEED_READERS) == _fields(SpeedFlags) - {"grid"} and set(SPEED_READERS) <= _fields(SpeedGrid)
    assert set(ARRIVAL_READERS) == _fields(ArrivalFlags) - {"arrivals"} and set(ARRIVAL_READERS) <= _fields(ArrivalGrid)


def test_bench_flags_read_back_as_the_grids():
    from looplab.arguments import flags_of
    from sweeps.bench import Bench, parser
    from sweeps.bench_grid import GRIDS, ArrivalFlags, SpeedFlags, arrival_grid_of, speed_grid_of

    argv = ["--experiment", "x", "--grid", "table6", "--batches", "2,8", "--arrivals", "--slots", "4", "--cpus", "2"]
    args = parser().parse_args(argv)
    options, speed = flags_of(Bench, args), flags_of(SpeedFlags, args)
    assert (options.experiment, options.cpus, options.tracking_uri, options.dry_run) == ("x", "2", None, False)
    grid = speed_grid_of(speed)
    assert grid == dataclasses.replace(GRIDS["table6"], batches=(2, 8))
    arrivals = arrival_grid_of(flags_of(ArrivalFlags, args), speed.grid)
    assert arrivals is not None and arrivals.slots == (4,) and arrivals.requests == 64


def test_evaluation_flags_default_to_the_grids_resources():
    from sweeps.evaluate import EvalFlags, eval_grid
    from trainables.evaluation import EvalGrid

    flags = EvalFlags()
    assert (flags.eval_cpus, flags.eval_gpus, flags.eval_batch_size, flags.eval_device) == (
        EvalGrid.cpus,
        EvalGrid.gpus,
        EvalGrid.batch_size,
        EvalGrid.device,
    )
    assert eval_grid(flags) is None  # no --eval-tasks: nothing to evaluate


def test_depth_sweeps_level_flag_is_the_tasks():
    from looplab.arguments import Parser, flags_of
    from sweeps import mano, phop
    from sweeps.depth_grid import PairFlags

    for task, flag in ((mano, "--levels"), (phop, "--hops")):
        p = Parser(prog="t")
        task.add_flags(p)
        flags = flags_of(PairFlags, p.parse_args(["--pairs", "1x2", flag, "3,5"]))
        assert (flags.pairs, flags.archs, flags.level) == ("1x2", "", "3,5")
        assert task.PAPER_PAIRS in "".join(p.format_help().split())  # --pairs' help: the task's


@pytest.mark.parametrize(
    "given, env, expected", [([], "sqlite:///env.db", "sqlite:///env.db"), (["--tracking-uri", "x"], "y", "x")]
)
def test_analysis_tracking_uri_defaults_to_the_environment_when_run(given, env, expected, monkeypatch):
    from analysis.__main__ import Report, parser

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
    options = Report.from_args(parser().parse_args([*given, "--out", "o", "--experiment", "a", "--experiment", "b"]))
    assert (options.tracking_uri, options.experiment, options.scope, options.series_by) == (
        expected,
        ["a", "b"],
        "experiment",
        [],
    )
