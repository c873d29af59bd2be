"""Table 4 complete: adaptive_pipeline.py --baselines trains the paper's ungated rows
with iso_flops.py's stage keys, and the report's table4 lays every row out in the
paper's order (missing rows shown, a hybrid's skip labelled an extension)."""

from __future__ import annotations

import csv

import pytest

from sweeps import adaptive_pipeline, iso_flops
from sweeps.flags import Common
from trainables.pipeline import stage_configs

GPUS = ["--num-workers", "8", "--gpus-per-worker", "1", "--gpu-memory", "80", "--address", "auto", "--dry-run"]


@pytest.mark.slow  # 16 s of paper-scale planning on 2 cores: .ci/run runs it after the suite
def test_baselines_dry_run_lists_the_ungated_rows_with_gpu_hours(capsys):
    from sweeps.launch import main

    assert (
        main(
            "test",
            adaptive_pipeline.add_flags,
            adaptive_pipeline.from_args,
            ["--preset", "paper-140m", "--baselines", *GPUS],
        )
        == 0
    )
    out = capsys.readouterr().out
    trials = [line for line in out.splitlines() if '"arm": "baseline"' in line]
    # 140M: LLaMA-2 baseline and loop4, Mamba-2 baseline, loop2 and loop4 (the arms' own pre-training)
    assert [(('"transformer"' in t), t.split('"n_loops": ')[1][0]) for t in trials] == [
        (True, "1"),
        (True, "4"),
        (False, "1"),
        (False, "2"),
        (False, "4"),
    ]
    arms_pretrain = next(line for line in out.splitlines() if '"arm": "ouro"' in line).split("  ")[2].split(" → ")[0]
    assert trials[-1].endswith(arms_pretrain)  # loop4 fixed is the gated arms' pre-training, trained once
    for key in {t.rsplit("pretrain:", 1)[1] for t in trials}:
        assert f"pretrain-{key}:" in out and "GPU-hours" in out.split(f"pretrain-{key}:")[1].splitlines()[0]


@pytest.mark.parametrize(
    "preset,archs,pairs",
    [
        ("paper-140m", ["transformer", "mamba2"], ["24x1", "24x2", "24x4"]),
        ("paper-370m", ["mamba2"], ["48x1", "48x4"]),
        ("paper-140m-hybrid", ["hybrid"], ["24x1", "24x4"]),
    ],
)
def test_baselines_share_iso_flops_stage_keys(preset, archs, pairs):
    from sweeps.flags import parse_pairs

    common = Common(preset)
    mine = adaptive_pipeline.adaptive_pipeline(common, ["ouro", "chase"], baselines=True)
    iso = iso_flops.iso_flops(common, "text", parse_pairs("--pairs", ",".join(pairs)), archs=archs)

    def keys(sweep, points):
        return {c.stage_key() for p in points for c in stage_configs(sweep.spec, {**p, "seed": 3407}, "/unused")}

    baselines = [p for p in mine.points if p["arm"] == "baseline"]
    iso_points = [{**pair, "arch": arch} for arch in archs for pair in iso.points]
    assert keys(mine, baselines) <= keys(iso, iso_points)
    assert len(keys(mine, baselines)) == len(baselines)
    # the loop4 baseline is the gated arms' pre-training
    (ouro_pretrain, *_) = stage_configs(mine.spec, {"arm": "ouro", "seed": 3407}, "/unused")
    assert ouro_pretrain.stage_key() in keys(mine, baselines)


def test_baselines_on_a_preset_without_table4_rows_is_one_line(capsys):
    from sweeps.launch import main

    assert (
        main(
            "test",
            adaptive_pipeline.add_flags,
            adaptive_pipeline.from_args,
            ["--preset", "debug", "--baselines", "--dry-run"],
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--baselines" in err and "paper-140m" in err


@pytest.mark.slow  # 12-13 s on 2 cores: .ci/run's slow tier keeps the suite under 10 minutes
def test_table4_rows_in_the_papers_order_missing_shown_hybrid_skip_labelled(tmp_path):
    pytest.importorskip("polars")
    pytest.importorskip("mlflow")
    import analysis_fixture as fx

    from analysis.report import ReportOptions, build_report
    from analysis.tables import HYBRID_SKIP

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for experiment, preset in (("t4-mamba2", "paper-140m"), ("t4-hybrid", "paper-140m-hybrid")):
        logged = fx.log_sweep(uri, tmp_path, experiment, seeds=(0,), preset=preset)
        # one task: the fixture's cost is its evaluation runs
        fx.log_evaluations(uri, tmp_path, experiment, logged, tasks=("piqa",))
    fx.log_sweep(uri, tmp_path, "t4-370m", seeds=(0,), preset="paper-370m", arms=("Ouro",))  # trained, not evaluated
    build_report(uri, ["t4-mamba2", "t4-hybrid", "t4-370m"], tmp_path / "report", ReportOptions(log_artifacts=False))
    with open(tmp_path / "report" / "tables" / "table4.csv") as f:
        rows = list(csv.DictReader(f))
    got = [(r["block"], r["row"], r["policy"], r["q"], r["choice"], r["missing"]) for r in rows]
    both = "q=0.8 and best Avg."
    assert got == [
        ("140M LLaMA-2", "baseline", "", "", "", "no run"),
        ("140M LLaMA-2", "loop4", "", "", "", "no run"),
        ("140M Mamba-2", "baseline", "", "", "", "no run"),
        ("140M Mamba-2", "loop2", "", "", "", "no run"),
        ("140M Mamba-2", "loop4", "full", "", "", ""),
        ("140M Mamba-2", "loop4-Ouro", "dense", "0.8", both, ""),
        ("140M Mamba-2", "loop4-CHASE", "skip", "0.6", "best Avg.", ""),
        ("140M Mamba-2", "loop4-CHASE", "skip", "0.8", "q=0.8 (the paper's)", ""),
        ("140M Mamba-2 Hybrid", "baseline", "", "", "", "no run"),
        ("140M Mamba-2 Hybrid", "loop4", "full", "", "", ""),
        ("140M Mamba-2 Hybrid", "loop4-Ouro", "dense", "0.8", both, ""),
        ("140M Mamba-2 Hybrid", "loop4-Ouro · skip", "skip", "0.8", both, ""),
        ("140M Mamba-2 Hybrid", "loop4-CHASE · skip", "skip", "0.6", "best Avg.", ""),
        ("140M Mamba-2 Hybrid", "loop4-CHASE · skip", "skip", "0.8", "q=0.8 (the paper's)", ""),
        ("370M Mamba-2", "baseline", "", "", "", "no run"),
        ("370M Mamba-2", "loop4", "", "", "", "not evaluated downstream"),
        ("370M Mamba-2", "loop4-Ouro", "", "", "", "not evaluated downstream"),
        ("370M Mamba-2", "loop4-CHASE", "", "", "", "no run"),
        ("370M Mamba-2 Hybrid", "baseline", "", "", "", "no run"),
        ("370M Mamba-2 Hybrid", "loop4", "", "", "", "no run"),
        ("370M Mamba-2 Hybrid", "loop4-Ouro", "", "", "", "no run"),
    ]
    # skip on a hybrid is labelled, and only there; the pure Mamba-2 CHASE row is the paper's own
    assert {r["row"] for r in rows if r["note"] == HYBRID_SKIP} == {"loop4-Ouro · skip", "loop4-CHASE · skip"}
    assert all(r["note"] == "" for r in rows if r["block"] != "140M Mamba-2 Hybrid" or "·" not in r["row"])
    # exit_gate (every gated pick, per experiment) labels a hybrid's skip rows too
    with open(tmp_path / "report" / "tables" / "exit_gate.csv") as f:
        gate = list(csv.DictReader(f))
    assert {(r["experiment"], r["policy"]) for r in gate if r["note"] == HYBRID_SKIP} == {("t4-hybrid", "skip")}
    assert all(r["note"] == "" for r in gate if r["experiment"] != "t4-hybrid" or r["policy"] != "skip")
    md = (tmp_path / "report" / "tables" / "table4.md").read_text()
    assert f"loop4-CHASE · skip ({HYBRID_SKIP})" in md and "| missing (no run) |" in md
    # the pre-trained model at full depth: 0.25 + 0.02 · 4 (seed 0, task index 0)
    assert float(rows[4]["lm_eval_avg"]) == pytest.approx(0.33)
