"""The benchmark scripts run end to end at toy sizes: their figures come from the
library's current API, so a rename there must fail here, not in a researcher's hands
(generate_until.py once imported stage_config from a module it had left)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from looplab.presets import get_preset

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, json_file: Path | None = None) -> dict:
    """Run benchmarks/<name> and return its JSON record: the last line of its stdout,
    or json_file, passed to it as --json."""
    extra = ["--json", str(json_file)] if json_file else []
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(json_file.read_text() if json_file else out.stdout.strip().splitlines()[-1])


def test_generate_until_benchmark_trains_a_checkpoint_and_gets_the_uncached_outputs():
    record = run_script(
        "generate_until.py",
        "--train-steps",
        "2",
        "--prompt-len",
        "16",
        "--new-tokens",
        "4",
        "--requests",
        "2",
        "--repeats",
        "1",
    )
    assert record["same_outputs"] is True and record["generated_tokens"] > 0


@pytest.mark.slow  # 12-13 s on 2 cores: .ci/run's slow tier keeps the suite under 10 minutes
def test_lean_head_benchmark_reports_both_arms_with_memory_from_its_child_process(tmp_path):
    result = run_script(
        "lean_head.py",
        "--preset",
        "debug",
        "--batch",
        "2",
        "--seq-len",
        "32",
        "--repeats",
        "1",
        "--threads",
        "1",
        json_file=tmp_path / "lean.json",
    )
    assert {(r["stage"], r["arm"]) for r in result["rows"]} == {
        (s, a) for s in ("pretrain", "stage1") for a in ("before", "after")
    }
    for row in result["rows"]:
        assert row["step_s"] > 0 and row["model_gflop"] > 0
        assert row["peak_mem_above_model"] == -1 or row["peak_rss"] >= row["peak_mem_above_model"]
    assert set(result["ratios"]) == {"before", "after"}
    # Stage-1 reads out all R steps where pre-training reads the last: more model
    # FLOPs, but fewer than R times as many (the backbone's share is the same).
    assert 1 < result["ratios"]["after"]["flops"] < get_preset("debug").model.n_loops


def test_head_products_benchmark_reports_each_product_against_the_gemm_peak(tmp_path):
    result = run_script(
        "head_products.py",
        "--preset",
        "debug",
        "--chunks",
        "16,64",
        "--repeats",
        "1",
        "--threads",
        "1",
        json_file=tmp_path / "head.json",
    )
    assert result["gemm_flops"] > 0 and [r["chunk"] for r in result["rows"]] == [16, 64]
    assert all(r[k] > 0 for r in result["rows"] for k in ("logits", "grad_x", "grad_w", "softmax"))


def test_miniature_steps_covers_every_stage_shape_of_the_protocol():
    """benchmarks/miniature_steps.py times each distinct stage the miniature trains: the
    LM's eight (pre-training at 1⊗4, 1⊗1 and 4⊗1, the continued 1⊗4 stages) and each
    synthetic task's looped model and its N⊗1."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from miniature_steps import stage_shapes, timed_steps

    from looplab.config import apply_overrides

    shapes = stage_shapes(0)
    names = [(sweep, cfg.stage, cfg.model.n_layers, cfg.model.n_loops) for sweep, cfg in shapes]
    assert len(names) == len(set(names)) == 12
    assert ("paper_mini_lm", "pretrain", 4, 1) in names and ("paper_mini_mano", "pretrain", 1, 1) in names
    _, cfg = shapes[0]
    first, median = timed_steps(apply_overrides(cfg, {"train.compile": "off", "train.batch_size": 2}), 1)
    assert first > 0 and median > 0


def test_the_skip_scan_reads_each_point_against_the_best_full(tmp_path):
    """benchmarks/skip_scan.py at one tiny point, eager: its figures are the best skip
    schedule's decode tokens/s over the best full's, and that over the FLOP ratio."""
    result = run_script(
        "skip_scan.py",
        "--widths",
        "64",
        "--slots",
        "4",
        "--requests",
        "4",
        "--repeats",
        "1",
        "--compile",
        "off",
        "--png",
        str(tmp_path / "scan.png"),
        json_file=tmp_path / "scan.json",
    )
    (p,) = result["points"]
    assert (p["width"], p["slots"]) == (64, 4) and 1 <= p["mean_executed_loops"] < 4  # the spread gate exits tokens
    assert p["realised"] == pytest.approx(p["vs_best_full"] / p["flop_ratio"])
    assert p["pays"] == (p["vs_best_full"] > 1.0) and (tmp_path / "scan.png").stat().st_size > 0
