"""`looplab doctor` (looplab/doctor.py): each check's pass and fail paths. A kernel that
computes the wrong thing must fail its correctness check, a memory model off by 2× must
fail the plan check, a decode that drifts from the full forward must fail, and a check
that raises fails alone while the others run on."""

from __future__ import annotations

import json

import pytest
import torch

import looplab.doctor as doctor
import looplab.models.mamba2 as mamba2
from causal_conv1d_standin import CausalConv1dStandIn
from looplab.cli import main as looplab_main
from looplab.models.ops import dispatch
from looplab.models.ops.reference import mamba_chunk_scan_combined_ref

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def wrong_scan(*args, **kwargs):
    y = mamba_chunk_scan_combined_ref(*args, **kwargs)
    return y + 1e-2 * y.detach().abs().max()  # off by 1 % of the output's scale


def kernels_on_cpu(monkeypatch, scan) -> None:
    """Route CPU tensors through the kernel dispatch with these stand-ins."""
    standin = CausalConv1dStandIn()
    monkeypatch.setattr(dispatch, "cuda_scan_kernels", lambda: (standin, scan))
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t: not dispatch.torch_forced())
    monkeypatch.setattr(doctor, "_mixer", lambda device, dtype, seed=0: _mixer64(device, dtype))


def _mixer64(device, dtype):
    torch.manual_seed(0)  # in_proj width 2·128 + 2·16 + 8 = 296: a multiple of 8, as causal-conv1d needs
    return mamba2.Mamba2(d_model=64, d_state=16, headdim=16, chunk_size=16).to(device=device, dtype=dtype)


def test_the_scan_check_passes_a_right_kernel_and_fails_a_wrong_one(monkeypatch):
    assert doctor.scan_check(CPU, torch.float32)[0].status == doctor.SKIP  # no kernels on a CPU: said why
    kernels_on_cpu(monkeypatch, mamba_chunk_scan_combined_ref)  # a right kernel
    checks = doctor.scan_check(CPU, torch.float32)
    assert [c.status for c in checks] == [doctor.PASS, doctor.PASS] and "seq_idx" in checks[1].name
    kernels_on_cpu(monkeypatch, wrong_scan)
    bad = doctor.scan_check(CPU, torch.float32)
    assert all(c.status == doctor.FAIL for c in bad)
    assert "output is off by" in bad[0].reason or "is off by" in bad[0].reason


def test_the_step_check_fails_a_wrong_step_kernel(monkeypatch):
    assert doctor.step_check(CPU, torch.float32, kernel="cuda")[0].status == doctor.SKIP
    calls = []

    def wrong_step(self, xBC, dt, A, state, rows):  # the torch step, nudged
        calls.append(1)
        return mamba2.Mamba2._step_torch(self, xBC, dt, A, state, rows) + 1e-2

    monkeypatch.setattr(dispatch, "use_cuda_step_kernels", lambda t: not dispatch.torch_forced())
    monkeypatch.setattr(mamba2.Mamba2, "_step_cuda", wrong_step)
    (check,) = doctor.step_check(CPU, torch.float32, kernel="cuda")
    assert calls and check.status == doctor.FAIL and "outputs" in check.reason + check.figure


def test_generation_must_match_the_full_forward(monkeypatch):
    assert all(c.status == doctor.PASS for c in doctor.generation_check(CPU))
    import looplab.inference.generate as generate

    original = generate.decode_step

    def drifting(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits + 1e-2
        return out

    monkeypatch.setattr(generate, "decode_step", drifting)
    assert all(c.status == doctor.FAIL for c in doctor.generation_check(CPU))


def test_memory_against_the_plan():
    assert doctor.memory_check("m", 100 * 2**20, 100 * 2**20).status == doctor.PASS
    off = doctor.memory_check("m", 200 * 2**20, 100 * 2**20)  # the model predicts half of what a step takes
    assert off.status == doctor.FAIL and "ratio 2.00 is outside" in off.reason


@pytest.mark.slow  # 12-13 s on 2 cores: .ci/run's slow tier keeps the suite under 10 minutes
def test_the_training_probe_measures_a_step_beside_its_plan(monkeypatch):
    checks = {c.name: c for c in doctor.training_probe(CPU, "debug", 1, peak_flops=1e11)}
    memory = checks["training debug memory vs plan"]
    assert memory.status == doctor.PASS, memory.reason
    assert checks["training debug tokens/s"].value > 0
    monkeypatch.setattr(doctor, "predicted_peak", lambda plan: (plan.memory.peak - plan.memory.persistent) // 2)
    halved = {c.name: c for c in doctor.training_probe(CPU, "debug", 1, peak_flops=1e11)}
    assert halved["training debug memory vs plan"].status == doctor.FAIL


def test_a_check_that_raises_fails_alone():
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access\nmore")

    (check,) = doctor.guarded("scan", broken)
    assert check.status == doctor.FAIL and check.reason == "RuntimeError: CUDA error: an illegal memory access"


def test_the_command_writes_every_check_and_exits_by_them(tmp_path, capsys, monkeypatch):
    assert (
        looplab_main(["doctor", "--quick", "--json", str(tmp_path / "d.json"), "--markdown", str(tmp_path / "d.md")])
        == 0
    )
    report = json.loads((tmp_path / "d.json").read_text())
    names = {c["name"]: c for c in report["checks"]}
    assert report["failed"] == 0 and names["python"]["status"] == "pass"
    assert (
        names["scan kernel vs torch (float32)"]["status"] == "skip"
        and names["scan kernel vs torch (float32)"]["reason"]
    )
    assert all(set(c) >= {"name", "status", "figure", "value", "unit", "reason"} for c in report["checks"])
    assert "| check | status |" in (tmp_path / "d.md").read_text()
    kernels_on_cpu(monkeypatch, wrong_scan)
    assert looplab_main(["doctor", "--quick"]) == 1
    assert "first failure: scan kernel vs torch" in capsys.readouterr().err
    assert looplab_main(["doctor", "--preset", "nope"]) == 2


def test_nodes_report():
    from sweeps.nodes import check_nodes, report

    text, ok = report(
        [
            ("a", [{"name": "x", "status": "pass", "reason": ""}]),
            ("b", [{"name": "gemm", "status": "fail", "reason": "slow"}]),
        ]
    )
    assert not ok and "doctor b: FAIL gemm: slow" in text and "doctor a: ok" in text
    assert report([])[1]
    ((host, checks),) = check_nodes("")  # no cluster: this machine
    assert host and not [c for c in checks if c["status"] == "fail"]


def test_device_check_registers_a_triton_only_mamba_ssm(tmp_path, monkeypatch):
    """scripts/device_check.py on a source tree whose package __init__ cannot import (its
    CUDA extension was not built): the Triton kernels still import from it."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("device_check", doctor_script())
    device_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_check)
    package = tmp_path / "mamba_ssm"
    (package / "ops" / "triton").mkdir(parents=True)
    (package / "__init__.py").write_text("import selective_scan_cuda  # not built\n")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "triton" / "__init__.py").write_text("")
    (package / "ops" / "triton" / "ssd_combined.py").write_text("def mamba_chunk_scan_combined():\n    return 1\n")
    saved = {n: m for n, m in sys.modules.items() if n.startswith("mamba_ssm")}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        said = device_check.register_triton_only(tmp_path)
        assert "Triton kernels from" in said and "selective_scan_cuda" in said
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        assert mamba_chunk_scan_combined() == 1
    finally:  # the fake package leaves no trace for the tests after this one
        for name in [n for n in sys.modules if n.startswith("mamba_ssm")]:
            del sys.modules[name]
        sys.modules.update(saved)


def doctor_script():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "scripts" / "device_check.py"


@pytest.mark.slow
def test_device_check_on_a_machine_without_a_gpu(tmp_path):
    import subprocess

    root = doctor_script().parents[1]
    done = subprocess.run(
        ["bash", str(root / "scripts" / "device_check.sh"), str(tmp_path / "out")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "0 failed" in report and (tmp_path / "out" / "doctor.json").is_file()
