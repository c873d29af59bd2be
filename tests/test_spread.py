"""Honest timing figures (looplab/costs/spread.py) and the performance suite that
reports them (benchmarks/suite.py): no time that is not > 0, and a figure whose repeats
spread wider than its bound, or that ran beside other work, is not reported as a result."""

import math

import pytest
from test_benchmark_scripts import run_script

from looplab.costs.spread import Figure, Load, Timing

QUIET = Load(before=0.1, after=1.1, cpus=2, threads=1)


@pytest.mark.parametrize("bad", [0.0, -0.003, math.nan, math.inf])
def test_a_time_is_finite_and_positive(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        Timing((0.01, bad))
    with pytest.raises(ValueError, match="at least one repeat"):
        Timing(())


def test_median_min_max_and_spread_by_hand():
    t = Timing((0.30, 0.10, 0.20))
    assert (t.median, t.min, t.max) == (0.20, 0.10, 0.30)
    assert t.spread == pytest.approx((0.30 - 0.10) / 0.20)
    assert Timing((0.5,)).spread == 0.0


def test_a_figure_spread_wider_than_its_bound_is_noisy_and_not_a_result():
    steady, swinging = Timing((1.0, 1.05, 1.1)), Timing((1.0, 1.4, 2.0))
    fine = Figure("ratio", 1.33, "x", (steady, steady), QUIET, bound=0.25)
    assert not fine.noisy and fine.shown() == "1.33" and fine.row()["value"] == 1.33
    noisy = Figure("ratio", 1.33, "x", (steady, swinging), QUIET, bound=0.25)  # 1.0 → 2.0 around 1.4: 71 %
    assert noisy.noisy and noisy.noisy_because == "spread 71% > 25%"
    assert noisy.shown() == "noisy" and noisy.row()["value"] is None and noisy.row()["measured"] == 1.33
    with pytest.raises(ValueError, match="finite and > 0"):
        Figure("difference", -0.2, "s", (steady,))


def test_a_figure_measured_beside_other_work_is_noisy():
    steady = Timing((1.0, 1.0))
    # One thread of two CPUs: other work up to 1.5 is tolerated (the free core and slack).
    assert not Figure("x", 1.0, "x", (steady,), Load(1.4, 2.3, cpus=2, threads=1)).noisy
    busy = Figure("x", 1.0, "x", (steady,), Load(2.1, 2.0, cpus=2, threads=1))
    assert busy.noisy and "machine busy" in busy.noisy_because
    # After the run, this run's own threads are not counted as other work.
    assert not Figure("x", 1.0, "x", (steady,), Load(0.2, 2.4, cpus=2, threads=1)).noisy


def test_a_figure_another_measurement_contradicts_is_no_result():
    """A steady figure whose divisor another figure of the run outran (a GEMM above the
    GEMM peak) is noisy, with that reason, and its row carries no value."""
    steady = Timing((1.0, 1.01, 1.02))
    doubt = "the head's products ran at 115 % of the GEMM peak: the peak is under-measured"
    figure = Figure("mfu", 62.8, "%", (steady,), contradicted=doubt)
    assert figure.noisy and figure.noisy_because == doubt and figure.shown() == "noisy"
    assert figure.row()["value"] is None and figure.row()["measured"] == 62.8
    assert not Figure("mfu", 62.8, "%", (steady,)).noisy


def test_the_suite_marks_a_figure_over_a_tight_bound_noisy(tmp_path):
    """Its machine section end to end, once with a bound no repeats can meet."""
    record = run_script(
        "suite.py",
        "--only",
        "machine",
        "--repeats",
        "3",
        "--bound",
        "1e-9",
        "--threads",
        "1",
        json_file=tmp_path / "suite.json",
    )
    figures = record["figures"]
    assert [f["unit"] for f in figures] == ["GFLOP/s", "GB/s"] and record["threads"] == 1
    assert all(f["value"] is None and f["measured"] > 0 and "spread" in f["noisy"] for f in figures)
