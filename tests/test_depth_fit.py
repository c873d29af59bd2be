"""analysis/depth_fit.py: the effective-depth exponent γ of loss ≈ a + b·log(N·R^γ)."""

import math

import numpy as np
import polars as pl
import pytest

from analysis.depth_fit import ARCH, N_LAYERS, PRETRAIN, fit_depth, fit_groups, write_depth_fit
from analysis.names import PARAM
from looplab import tracking
from looplab.policy import FULL

PAIRS = [(6, 1), (6, 4), (12, 1), (12, 2), (24, 1), (3, 4), (6, 2)]  # the paper's pairs and two more


def _points(gamma: float, pairs=PAIRS, seeds=(0, 1, 2), noise=0.004, a=4.0, b=-0.35) -> pl.DataFrame:
    rng = np.random.default_rng(7)
    rows = [
        {
            "experiment": "iso",
            ARCH: "mamba2",
            N_LAYERS: n,
            "n_loops": r,
            "seed": s,
            "stage": PRETRAIN,
            "policy": FULL,
            "stage_key": f"{n}x{r}-{s}-{gamma}",
            "loss": a + b * math.log(n * r**gamma) + rng.normal(0, noise),
        }
        for n, r in pairs
        for s in seeds
    ]
    return pl.DataFrame(rows)


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_fit_recovers_gamma_within_its_interval(gamma):
    pts = _points(gamma)
    fit = fit_depth(pts[N_LAYERS], pts["n_loops"], pts["loss"])
    assert fit.low <= gamma <= fit.high
    assert abs(fit.gamma - gamma) < 0.1
    assert fit.high - fit.low < 0.3  # small noise: a tight interval, not the whole search range
    assert fit.b < 0 and not fit.at_bound


def test_one_loop_count_is_skipped_with_a_note(tmp_path):
    pts = _points(1.0, pairs=[(6, 4), (12, 4), (24, 4)])
    written, table, spec, notes = write_depth_fit(pts, tmp_path)
    assert table is None and spec is None and written == {}
    assert len(notes) == 1 and "one loop count" in notes[0]


def test_collinear_pairs_are_skipped():
    # every pair at N·R = 24: only b·(γ−1) is identified
    _, _, notes = fit_groups(_points(1.0, pairs=[(24, 1), (12, 2), (6, 4)]))
    assert "collinear" in notes[0]


def test_fit_writes_csv_and_chart_per_architecture(tmp_path):
    pts = pl.concat([_points(1.0), _points(0.5).with_columns(pl.lit("transformer").alias(ARCH))])
    written, table, spec, notes = write_depth_fit(pts, tmp_path)
    assert notes == [] and table.height == 2 and written["depth_fit.csv"].exists()
    assert table.sort("arch")["gamma"].to_list() == pytest.approx([1.0, 0.5], abs=0.1)
    assert any(s.dashed for s in spec.series)


def test_report_section_writes_png_and_csv(tmp_path):
    pytest.importorskip("matplotlib")
    from analysis.report.context import ReportContext
    from analysis.report.depth import depth_section

    notes = []
    ctx = ReportContext(runs=None, out=tmp_path, notes=notes)
    sections = depth_section(ctx, _points(0.5))
    paths, charts = ctx.paths, ctx.charts
    assert [title for title, _ in sections] == ["Effective depth of a loop"] and notes == []
    assert paths["depth_fit.png"].stat().st_size > 0 and paths["depth_fit.csv"].exists()
    assert [c.name for c in charts] == ["depth_fit"]
    assert (
        depth_section(ReportContext(runs=None, out=tmp_path, notes=notes), _points(0.5, pairs=[(6, 4), (12, 4)])) == []
    )
    assert "one loop count (R = 4)" in notes[0]


def test_interval_covers_a_known_gamma_at_its_confidence():
    # Table 3's five pairs at one seed: the smallest design the report fits. The profile
    # interval's nominal 95 % should hold (a bootstrap's covered ~80 % here).
    rng = np.random.default_rng(11)
    pairs = [(6, 1), (6, 4), (12, 1), (12, 2), (24, 1)]
    n, r = [p[0] for p in pairs], [p[1] for p in pairs]
    hits = 0
    for _ in range(200):
        loss = [3.0 - 0.3 * math.log(a * b**0.6) + rng.normal(0, 0.01) for a, b in pairs]
        fit = fit_depth(n, r, loss)
        hits += fit.low <= 0.6 <= fit.high
    assert hits >= 0.88 * 200


def test_the_report_page_draws_the_points_and_the_fitted_line(tmp_path):
    pytest.importorskip("plotly")
    from analysis.page import figure

    _, _, spec, _ = write_depth_fit(_points(0.5), tmp_path)
    kinds = sorted(t.mode for t in figure(spec).data)
    assert "lines" in kinds and "markers" in kinds


def test_a_shared_pretraining_counts_once_and_other_searched_values_split_the_fit(tmp_path):
    pts = _points(1.0)
    shared = pl.concat([pts, pts])  # two arms' trials reading one pre-training stage run
    table, fitted, _ = fit_groups(shared)
    assert table["n_points"].to_list() == [pts.height]
    hops = PARAM + tracking.SEARCH_PARAM + "hops"
    scan = pl.concat(
        [
            _points(1.0).with_columns(pl.lit(16).alias(hops)),
            _points(0.5, a=2.0).with_columns(pl.lit(32).alias(hops), pl.col("stage_key") + "-p32"),
        ]
    )
    table, _, notes = fit_groups(scan)
    assert notes == [] and table.sort("setting")["setting"].to_list() == ["hops=16", "hops=32"]
    assert table.sort("setting")["gamma"].to_list() == pytest.approx([1.0, 0.5], abs=0.1)
