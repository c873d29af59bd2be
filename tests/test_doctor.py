"""`looplab doctor` (looplab/doctor/): each check's pass and fail paths. A kernel that
computes the wrong thing must fail its correctness check, a memory model off by 2× must
fail the plan check, a decode that drifts from the full forward must fail, and a check
that raises fails alone while the others run on."""

from __future__ import annotations

import json

import pytest
import torch
from causal_conv1d_standin import CausalConv1dStandIn

import looplab.doctor as doctor
import looplab.models.mamba2 as mamba2
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
    monkeypatch.setattr(doctor.kernels, "_mixer", lambda device, dtype, seed=0: _mixer64(device, dtype))


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
    monkeypatch.setattr(doctor.probe, "predicted_peak", lambda plan: (plan.memory.peak - plan.memory.persistent) // 2)
    halved = {c.name: c for c in doctor.training_probe(CPU, "debug", 1, peak_flops=1e11)}
    assert halved["training debug memory vs plan"].status == doctor.FAIL
    assert halved["training debug compiled tokens/s"].status == doctor.SKIP  # auto: off on a CPU


@pytest.mark.slow  # a compilation (aot_eager: no Inductor build) and two probes
def test_where_training_compiles_the_probe_times_it_beside_eager(monkeypatch):
    import dataclasses

    from looplab.costs import resources
    from looplab.models import compiled

    monkeypatch.setattr(compiled, "compiles", lambda setting, device: True)  # as auto does on a GPU
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    plan_stage = resources.plan_stage  # a plan that micro-batches: the probe's step holds two of its micro-batches
    monkeypatch.setattr(
        resources, "plan_stage", lambda *a, **k: dataclasses.replace(plan_stage(*a, **k), micro_batch=3)
    )
    checks = {c.name: c for c in doctor.training_probe(CPU, "debug", 1, peak_flops=1e11)}
    check = checks["training debug compiled tokens/s"]
    assert check.status == doctor.PASS and check.value > 0 and "× eager's; first step" in check.figure
    assert "fp32, steps of 6 × 128 tokens in micro-batches of 3" in checks["training debug tokens/s"].figure


def test_a_check_that_raises_fails_alone():
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access\nmore")

    (check,) = doctor.guarded("scan", broken)
    assert check.status == doctor.FAIL and check.reason == "RuntimeError: CUDA error: an illegal memory access"


def test_where_two_generations_part():
    from types import SimpleNamespace as G

    eager = G(tokens=[[1, 2, 3], [4, 5, 6]], loops=[[3, 3, 3], [1, 2, 3]])
    assert doctor.first_difference(eager, G(tokens=[[1, 2, 3], [4, 5, 6]], loops=[[3, 3, 3], [1, 2, 3]])) is None
    moved = G(tokens=[[1, 2, 3], [4, 5, 6]], loops=[[3, 3, 3], [1, 3, 3]])
    assert doctor.first_difference(eager, moved) == "row 1, token 1: tokens 5 vs 5, loops 2 vs 3"
    short = G(tokens=[[1, 2], [4, 5, 6]], loops=[[3, 3], [1, 2, 3]])
    assert doctor.first_difference(eager, short) == "row 0, token 2: tokens 3 vs None, loops 3 vs None"


def test_ray_missing_is_a_skip_and_groups_carry_their_seconds(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    (check,) = doctor.ray_check(CPU)
    assert check.status == doctor.SKIP and "not installed" in check.reason
    checks = doctor.run(quick=True)
    timed = [c for c in checks if c.seconds is not None]
    assert timed and all(c.seconds >= 0 for c in timed)
    names = [c.name for c in timed]  # each group's first check: the environment's, the peaks'
    assert "python" in names and any(n.startswith("gemm") for n in names), names


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
    assert all(set(c) >= {"name", "status", "figure", "value", "unit", "reason", "seconds"} for c in report["checks"])
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
    import sys

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
    # The second pass a GPU machine runs once causal-conv1d is built: the doctor's quick
    # checks, no CUDA tests.
    quick = tmp_path / "quick"
    done = subprocess.run(
        [sys.executable, str(doctor_script()), str(quick), "--quick"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "not run (--quick)" in (quick / "report.md").read_text() and not (quick / "cuda-tests.xml").exists()


def test_causal_conv1d_is_built_for_this_gpus_architecture_alone(tmp_path):
    """scripts/device_check.sh's only_this_gpu: of setup.py's -gencode pairs, this GPU's
    stays and the others become `pass`; an architecture not listed leaves the file whole."""
    import os
    import subprocess
    import sys

    pairs = "".join(
        f'    cc_flag.append("-gencode")\n    cc_flag.append("arch=compute_{a},code=sm_{a}")\n' for a in (80, 90, 100)
    )
    setup = tmp_path / "setup.py"
    original = f"cc_flag = []\nif True:\n{pairs}"
    script = doctor_script().parent / "device_check.sh"

    def run(arch):
        shell = f'source <(sed -n "/^only_this_gpu()/,/^}}/p" {script}); only_this_gpu {setup} {arch}'
        env = {"PY": sys.executable, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True)

    setup.write_text(original)
    said = run(90)
    assert "sm_90 only" in said.stdout, said.stderr
    namespace: dict = {}
    exec(setup.read_text(), namespace)
    assert namespace["cc_flag"] == ["-gencode", "arch=compute_90,code=sm_90"]
    setup.write_text(original)
    assert "building them all" in run(61).stdout and setup.read_text() == original


def test_the_decoding_speed_check_times_compiled_beside_eager_and_leaves_the_model_eager(monkeypatch):
    from looplab.checkpoint import load_model
    from looplab.models import compiled

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")  # no Inductor build: the check's arithmetic is tested
    monkeypatch.setattr(doctor.decoding, "TIMED_TOKENS", 4)
    model = load_model("debug", seed=0).eval()
    (check,) = doctor.decoding_speed(model, [[1, 2, 3], [4, 5, 6]], CPU)  # no CUDA-graph arm on a CPU
    assert check.status == doctor.PASS and check.value > 0
    assert "ms a token compiled" in check.figure and "batch 2, 4 tokens after a 3-token prompt" in check.figure
    assert model.compiled_decode is None
