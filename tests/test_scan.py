"""The scale scan: its declaration (points, scopes, hole ranges) and its analysis
(analysis/scan.py: effects per configuration, lines along the axes, the table and
figures), read from an MLflow store shaped like the platform's."""

from __future__ import annotations

import analysis_fixture as fx
import polars as pl
import pytest

from analysis.claims import REPRODUCED
from analysis.load import load_runs
from analysis.points import evaluation_points
from analysis.scan import (
    GAP,
    LOOPED_GAIN,
    effects,
    lines,
    loop_effects,
    scan_axes,
    scan_charts,
    scan_markdown,
    write_scan,
)
from looplab import tracking
from looplab.config import ConfigError
from sweeps.flags import Common, Launch
from sweeps.scale_scan import HOLE_AXES, HOLE_CENTRE, hole_points, hole_range, holes_scan, loops_scan
from sweeps.sweep import validate
from trainables.pipeline import PipelineSpec, stage_configs


def test_hole_range_keeps_app_e_fractions():
    assert hole_range(4) == (1.85, 3.45)
    lo, hi = hole_range(6)
    assert (lo - 1) / 5 == pytest.approx(0.85 / 3, abs=1e-3) and (hi - 1) / 5 == pytest.approx(2.45 / 3, abs=1e-3)


def test_scan_points_vary_one_axis_at_a_time():
    points = hole_points(list(HOLE_AXES))
    centre = points[0]
    assert {k: centre[k] for k in HOLE_CENTRE} == HOLE_CENTRE and centre["stage_steps"] == 200
    for p in points[1:]:
        differs = {k for k in HOLE_CENTRE if p[k] != centre[k]}
        assert len(differs) == 1 or differs == {"tokenizer", "pretrain_steps"}
        assert p["stage_steps"] == p["pretrain_steps"] // 4 and (p["lo"], p["hi"]) == hole_range(p["n_loops"])


def test_scopes_send_each_param_to_its_stages(tmp_path):
    sweep = holes_scan(Common("debug"), ["pretrain_steps"])
    point = {**hole_points(["pretrain_steps"])[1], "arm": "chase", "seed": 0}  # 200 pre-training steps
    configs = {c.stage: c for c in stage_configs(sweep.spec, point, tmp_path)}
    assert configs["pretrain"].train.steps == 200
    assert all(configs[s].train.steps == 50 for s in ("stage1", "chase", "stage2"))
    assert all(c.train.seq_len == 512 for c in configs.values())
    assert configs["chase"].hole.lo == 1.85 and configs["chase"].hole.sampler == "depth"
    with pytest.raises(ConfigError, match="PipelineSpec.scopes"):
        PipelineSpec(preset="debug", stages=("pretrain",), searched={"a": "train.lr"}, scopes={"b": ("pretrain",)})
    with pytest.raises(ConfigError, match=r"PipelineSpec.scopes\['a'\]"):
        PipelineSpec(preset="debug", stages=("pretrain",), searched={"a": "train.lr"}, scopes={"a": ("chase",)})
    # A --stage-set of a field a param reaches in that stage is refused; elsewhere it is not.
    clash = holes_scan(Common("debug", stage_overrides={"stage1": {"train.steps": 9}}), ["seq_len"])
    with pytest.raises(ConfigError, match="--stage-set"):
        validate(clash, Launch(storage_path=str(tmp_path)))


def test_scan_declarations_check_their_flags():
    with pytest.raises(ConfigError, match="--axes"):
        holes_scan(Common("debug"), ["bogus"])
    sweep = loops_scan(
        Common("phop-debug"), ({"n_layers": 1, "n_loops": 1}, {"n_layers": 1, "n_loops": 4}), ("p", [2, 4])
    )
    assert sweep.axes == ("p",) and sweep.spec.overrides["task.n"] == 16


@pytest.fixture(scope="module")
def beta_scan(tmp_path_factory):
    """Two configurations (β 0.25 and 0.5), each with both arms and two seeds."""
    root = tmp_path_factory.mktemp("scan")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    fx.log_sweep(uri, root, "scan-debug", seeds=(0, 1), betas=(0.25, 0.5))
    runs = load_runs(uri, ["scan-debug"])
    return root, runs, evaluation_points(runs)


def test_hole_effects_along_an_axis(beta_scan):
    root, runs, points = beta_scan
    table = effects(points, ["beta"])
    assert set(table["beta"]) == {0.25, 0.5} and set(table["effect"]) == {"Ouro", "CHASE", GAP}
    gap = table.filter(pl.col("effect") == GAP)
    # The fixture at 2.0 loops: Ouro 50 + s, CHASE 11.3 + s, full 6.25 + s (see tests/test_claims.py).
    want = sum(100 * ((50 + s) - (11.3 + s)) / (6.25 + s) for s in (0, 1)) / 2
    assert gap["mean"].to_list() == pytest.approx([want, want]) and (gap["verdict"] == REPRODUCED).all()
    ((axis, fixed, line),) = lines(table, ["beta"])
    assert axis == "beta" and line.height == 6
    (chart,) = scan_charts(table, ["beta"])
    assert [s.name for s in chart.series] == ["Ouro", "CHASE", GAP] and len(chart.series[2].points) == 2
    markdown = scan_markdown(table, ["beta"])
    assert markdown.count("\n") == 3 and "| beta |" in markdown
    paths, _, _ = write_scan(points, ["beta"], root / "out")
    assert all(p.is_file() for p in paths.values()) and "scan.png" in paths


def test_scan_axes_come_from_the_sweep_run(beta_scan):
    _, runs, _ = beta_scan
    assert scan_axes(runs.runs) == []
    tagged = runs.runs.with_columns(
        pl.when(pl.col("level") == tracking.SWEEP)
        .then(pl.lit("seq_len,d_model"))
        .otherwise(None)
        .alias(tracking.SCAN_AXES)
    )
    assert scan_axes(tagged) == ["seq_len", "d_model"]


def test_loop_effects_by_hand():
    rows = []
    for p, accs in ((2, (0.9, 0.5, 0.95)), (4, (0.6, 0.3, 0.7))):
        for seed, jitter in enumerate((0.0, 0.02, -0.02)):
            for (n, r), acc in zip(((1, 4), (1, 1), (4, 1)), accs):
                rows.append(
                    {
                        "method": "fixed",
                        "params.search.p": p,
                        "n_layers": n,
                        "n_loops": r,
                        "seed": seed,
                        "full_accuracy": acc + jitter * (n == 1 and r == 4),
                    }
                )
    table = loop_effects(pl.DataFrame(rows), ["p"])
    gain = table.filter((pl.col("effect") == LOOPED_GAIN)).sort("p")
    assert gain["mean"].to_list() == pytest.approx([40.0, 30.0]) and gain["model"].to_list() == ["1⊗4", "1⊗4"]
    assert (gain["verdict"] == REPRODUCED).all()
    ((axis, fixed, line),) = lines(table, ["p"])  # one looped model: one line, both effects on it
    assert fixed == {"model": "1⊗4"} and line.height == 4


def test_a_scans_report_leads_with_its_effects(beta_scan, tmp_path):
    from analysis.report import ReportOptions, build_report

    root, runs, _ = beta_scan
    mc = tracking.client(runs.tracking_uri)
    (sweep_run,) = runs.runs.filter(pl.col("level") == tracking.SWEEP)["run_id"].to_list()
    mc.set_tag(sweep_run, tracking.SCAN_AXES, "beta")
    paths = build_report(runs.tracking_uri, ["scan-debug"], tmp_path / "report", ReportOptions(log_artifacts=False))
    assert {"scan.md", "scan.csv", "scan.png", "scan_beta.png"} <= set(paths)
    page = paths["report.html"].read_text()
    assert page.index("Effect against scale") < page.index("Per-loop instruments")


@pytest.mark.slow  # 12-13 s on 2 cores: .ci/run's slow tier keeps the suite under 10 minutes
def test_the_scans_dry_runs_plan_every_point(capsys):
    from sweeps import scale_scan
    from sweeps.launch import main

    assert main("scan", scale_scan.add_flags, scale_scan.from_args, ["--dry-run"]) == 0
    out = capsys.readouterr().out
    points = len(hole_points(list(HOLE_AXES)))
    assert out.count('"arm": "chase"') == points * 3 and out.count('"arm": "ouro"') == points * 3  # seeds 0, 1, 2
    assert main("scan", scale_scan.add_flags, scale_scan.from_args, ["--effect", "loops", "--dry-run"]) == 0
    assert "sweep scale_scan_loops on preset phop-debug" in capsys.readouterr().out
    assert main("scan", scale_scan.add_flags, scale_scan.from_args, ["--effect", "nope", "--dry-run"]) == 2
