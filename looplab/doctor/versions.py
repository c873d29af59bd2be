"""The environment checks: Python, torch, the CUDA devices, the optional packages' versions,
and which Mamba-2 scan and decode step run on this node, and why."""

from __future__ import annotations

import platform
from importlib import metadata

from looplab.doctor.checks import Check, passed, skipped

PACKAGES = ("torch", "mamba-ssm", "causal-conv1d", "triton", "ray", "mlflow")


def environment(device) -> list[Check]:
    import torch

    from looplab.models.cpu import cpu_step
    from looplab.models.ops import dispatch

    out = [
        passed("python", platform.python_version()),
        passed("torch", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})"),
    ]
    for name in PACKAGES[1:]:
        try:
            out.append(passed(f"version {name}", metadata.version(name)))
        except metadata.PackageNotFoundError:
            out.append(skipped(f"version {name}", "not installed"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(
                passed(f"cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB", p.total_memory / 2**30, "GiB")
            )
    else:
        out.append(skipped("cuda devices", "torch sees no CUDA device"))
    probe = torch.zeros(1, device=device)
    path, why = dispatch.kernel_path(probe)
    out.append(passed("mamba-2 scan path", f"{path}: {why}"))
    step = dispatch.step_implementation(probe)
    reason = (
        f"mamba-ssm's selective_state_update + {dispatch.conv_implementation(step=True)}"
        if step == "cuda"
        else "compiled (LOOPLAB_CPU_STEP_KERNEL=1)"
        if step == "cpu-kernel"
        else "torch ops"
        + ("" if cpu_step.requested() or device.type == "cuda" else " (LOOPLAB_CPU_STEP_KERNEL=1 compiles a CPU step)")
    )
    out.append(passed("mamba-2 decode step", f"{step}: {reason}"))
    if device.type == "cpu":
        out.append(cpu_sequence_kernels())
    return out


def cpu_sequence_kernels() -> Check:
    """Whether a compiled CPU run (train.compile=on) can run the Mamba-2 conv and scan as
    C++ kernels: built here (the first time; its time: docs/benchmarks.md), or why not (a
    skip: the torch ops serve)."""
    from looplab.models.cpu import cpu_sequence, native
    from looplab.models.ops import dispatch

    name = "mamba-2 compiled CPU conv and scan"
    if dispatch.torch_forced():
        return skipped(name, f"torch ops ({dispatch.FORCE_TORCH_ENV}=1)")
    try:
        cpu_sequence.kernel()
    except Exception as e:  # noqa: BLE001 - a toolchain problem is what the doctor reports
        return skipped(name, f"did not build ({native.first_line(e)}); compiled runs use the torch ops")
    return passed(name, "C++ kernels (looplab/models/cpu/cpu_sequence.py) under train.compile=on")
