"""sweeps/gpu_claims.py on a CPU: the plumbing run end to end at a tiny size, the refusal
without CUDA, the verdicts on planted speedups, and scripts/device_check.sh's step that
runs it (skipped without a GPU; an error, not a verdict, fails it)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.claims import NOT_REPRODUCED, REPRODUCED
from looplab.errors import ConfigError
from looplab.policy import ExitPolicy
from looplab.tasks.base import heldout_ids
from sweeps import gpu_claims
from sweeps.protocol import PROTOCOL

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
DECLARED = PROTOCOL.gpu_speed
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def test_the_cpu_plumbing_run_writes_both_files_and_says_it_is_no_verdict(tmp_path, capsys):
    assert gpu_claims.main([str(tmp_path), "--cpu-plumbing"]) == 0
    out, err = capsys.readouterr()
    text = (tmp_path / gpu_claims.MARKDOWN).read_text()
    assert out.strip() == text.strip()
    first = text.splitlines()[0]
    assert "plumbing" in first and "not a verdict" in first
    assert "**C4-batch1**" in text and "**C4-growth**" in text and "Holm-compatible" in text
    assert PROTOCOL.digest() in text and "preset debug's shape" in text
    with (tmp_path / gpu_claims.RECORDS).open() as f:
        rows = list(csv.DictReader(f))
    plumbing = gpu_claims.PLUMBING
    expected = [(s, b) for s in plumbing["seeds"] for b in plumbing["batches"]]
    assert [(int(r["seed"]), int(r["batch"])) for r in rows] == expected
    assert {r["packing"] for r in rows} == {DECLARED.packing} and {r["policy"] for r in rows} == {DECLARED.policy}
    assert all(float(r["speedup"]) > 0 and 1 <= float(r["mean_executed_loops"]) <= 4 for r in rows)
    # a progress line per seed and batch as each finishes
    assert err.count("[gpu_claims] seed ") == len(expected)


@torch.no_grad()
def test_the_same_seed_is_the_same_model_and_its_gate_spreads_exits():
    """The seed fixes the weights and the spread gate (one stream); the spread gate
    exits tokens at every loop under the declared policy."""
    gpu = gpu_claims.setting(PROTOCOL, gpu_claims.PLUMBING)
    a, b = (gpu_claims.fresh_model(gpu, 3, torch.device("cpu")) for _ in range(2))
    other = gpu_claims.fresh_model(gpu, 4, torch.device("cpu"))
    assert torch.equal(a.exit_gate.weight, b.exit_gate.weight) and torch.equal(a.embedding.weight, b.embedding.weight)
    assert not torch.equal(a.exit_gate.weight, other.exit_gate.weight)
    assert float(a.exit_gate.weight.std()) > 2.0 and float(a.exit_gate.bias) == 0.0 and not a.training
    ids = heldout_ids(a, None, 4, 64, 3)
    exits = a(ids, ExitPolicy.parse(gpu.policy), packing=gpu.packing, readout="last").exit_step
    assert set(exits.unique().tolist()) == set(range(1, a.cfg.n_loops + 1))


@no_cuda
def test_without_cuda_it_refuses_in_one_line_naming_the_device(tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        gpu_claims.judge_on_device(tmp_path / "out")
    message = str(e.value)
    assert "\n" not in message and message.startswith("device='cuda' is invalid here: this machine has no CUDA device")
    assert not (tmp_path / "out").exists()
    assert gpu_claims.main([str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_a_cpu_device_is_refused_without_overrides(tmp_path):
    with pytest.raises(ConfigError, match=r"^device='cpu' is invalid here: .*allowed: a CUDA device"):
        gpu_claims.judge_on_device(tmp_path, device="cpu")


@pytest.mark.parametrize(
    "overrides, name",
    [
        ({"batch": (1, 4)}, "overrides="),
        ({"batches": (4, 64)}, "GpuSpeed.batches="),
        ({"seeds": (0,)}, "GpuSpeed.seeds="),
        ({"claims": ("C4",)}, "GpuSpeed.claims="),
    ],
)
def test_a_bad_setting_is_one_line_before_anything_runs(overrides, name):
    with pytest.raises(ConfigError) as e:
        gpu_claims.setting(PROTOCOL, overrides)
    assert str(e.value).startswith(name) and "\n" not in str(e.value)


def planted(one: list[float], big: list[float]) -> list[dict]:
    """Records as bench_point's, by seed: batch 1's speedups, then batch 64's in the
    reverse seed order (pairing must follow the seed, not the position)."""
    seeds = range(len(one))
    return [{"seed": s, "batch": 1, "speedup": v} for s, v in zip(seeds, one)] + [
        {"seed": s, "batch": 64, "speedup": v} for s, v in reversed(list(zip(seeds, big)))
    ]


def verdicts(records: list[dict]) -> dict:
    return {r.claim.id: r for r in gpu_claims.gpu_verdicts(records, DECLARED, PROTOCOL.confidence)}


def test_the_papers_figures_reproduce_both_claims():
    """Table 5's 140M row, spread over five seeds: 0.95-0.97x at batch 1, 1.70-1.75x at 64."""
    out = verdicts(planted([0.95, 0.96, 0.97, 0.955, 0.965], [1.70, 1.72, 1.75, 1.71, 1.73]))
    assert list(out) == ["C4-batch1", "C4-growth"]
    assert out["C4-batch1"].verdict == REPRODUCED and out["C4-growth"].verdict == REPRODUCED
    assert out["C4-batch1"].interval.high < 1.0
    assert out["C4-growth"].interval.mean == pytest.approx(0.762, abs=1e-9)
    assert all(r.p_adjusted is not None and r.p_adjusted >= r.p for r in out.values())  # Holm over the two


def test_a_batch_1_speedup_above_1_does_not_reproduce_c4_batch1():
    out = verdicts(planted([1.02, 1.03, 1.05, 1.04, 1.03], [1.70, 1.72, 1.75, 1.71, 1.73]))
    assert out["C4-batch1"].verdict == NOT_REPRODUCED
    assert out["C4-growth"].verdict == REPRODUCED


def test_growth_is_paired_by_seed():
    """Speedups that differ widely between seeds but grow by about 0.1 within each:
    paired, the growth is clear; compared as two independent arms it would not be."""
    one = [0.5, 0.9, 1.3, 0.7, 1.1]
    grown = [v + d for v, d in zip(one, [0.10, 0.11, 0.09, 0.10, 0.105])]
    growth = verdicts(planted(one, grown))["C4-growth"]
    assert growth.verdict == REPRODUCED and growth.interval.mean == pytest.approx(0.101, abs=1e-9)
    assert verdicts(planted(one, list(reversed(grown))))["C4-growth"].verdict != REPRODUCED


def judge_step(tmp_path: Path, gpu: str) -> subprocess.CompletedProcess:
    """scripts/device_check.sh's judge_gpu_claims, alone, as the script calls it."""
    script = ROOT / "scripts" / "device_check.sh"
    shell = (
        f'say() {{ echo "[device_check] $*"; }}; source <(sed -n "/^judge_gpu_claims()/,/^}}/p" {script}); '
        "judge_gpu_claims"
    )
    env = {
        **os.environ,
        "GPU": gpu,
        "PY": sys.executable,
        "REPO": str(ROOT),
        "OUT": str(tmp_path),
        "LOG": str(tmp_path / "log"),
        "WHEELS": str(tmp_path / "wheels"),
        "MAMBA_SRC": "",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True, timeout=300)


def test_the_device_check_skips_the_gpu_claims_without_a_gpu(tmp_path):
    done = judge_step(tmp_path, "0")
    assert done.returncode == 0 and "GPU claims: skipped, no GPU" in done.stdout, done.stderr
    assert not (tmp_path / "gpu_claims").exists()


@no_cuda
def test_the_device_checks_gpu_claims_step_fails_on_an_error(tmp_path):
    """Told it has a GPU where there is none, the step runs device_check.py --gpu-claims,
    whose refusal is an error: exit status 2, one line, and the step returns it."""
    done = judge_step(tmp_path, "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: device='cuda' is invalid here" in done.stdout and "GPU claims done (exit 2)" in done.stdout
    assert "Traceback" not in done.stdout


def test_the_gpu_claims_import_nothing_the_gpu_image_lacks():
    """The lent GPU machine's image has scipy and pyarrow but no polars, MLflow or Ray:
    the GPU claims, the protocol and the claims' verdicts must import without them."""
    code = (
        "import sys, sweeps.gpu_claims, sweeps.protocol, analysis.claims; "
        "missing = [m for m in ('polars', 'mlflow', 'ray') if m in sys.modules]; "
        "print(missing); sys.exit(1 if missing else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
