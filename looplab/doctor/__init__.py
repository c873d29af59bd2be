"""`looplab doctor`: does this node work? One command that checks a machine before a
sweep schedules on it, and says in one line per check what passed, what failed and why.

    looplab doctor                  every check (its time: docs/benchmarks.md)
    looplab doctor --quick          environment, peaks and kernel correctness (seconds):
                                    what cluster.yaml runs on every worker at `ray up`
    looplab doctor --json FILE      every check as JSON as well (name, status, figure,
                                    value, unit, reason, and the seconds its group took)

Checks, each pass | fail | skip (a skipped check says why; exit status 0 only when none
fails):
  environment   Python, torch (its CUDA build), the CUDA devices and their memory, the
                versions of mamba-ssm, causal-conv1d, triton, ray and mlflow, and which
                Mamba-2 scan and decode step will run on this node, with the reason
                (an import failure is named, not swallowed)
  peaks         GEMM FLOP/s (bf16 and fp32 on a GPU; fp32 on a CPU) and memory
                bandwidth (a device-to-device copy), measured here: MFU divides by them
  correctness   on this node's device, the kernel path against the torch path with a
                tolerance per dtype: the Mamba-2 scan (forward and every gradient, with
                and without seq_idx; float32 at TF32's tolerance on a GPU, where Triton's
                dots round to TF32), the decode step (conv + SSM, states included), the
                compiled CPU step when it is asked for; for every exit policy, a
                prompt prefilled then decoded token by token against the full forward;
                on a GPU, the compiled decode step's tokens against the eager step's,
                and its milliseconds a token against eager's
  training      K steps of a preset (paper-140m on a GPU, local on a CPU) in its
                production dtype with the resource plan's micro-batch, eager: tokens/s,
                MFU against the measured peak, and peak memory against
                looplab/costs/memory.py's prediction for the same plan (the ratio must lie
                in MEMORY_RATIO); then compiled where train.compile compiles (a GPU):
                tokens/s against eager's and the first step's seconds
  ray           the CPUs and GPUs Ray sees, and one Ray Train worker's step on them
                (skipped where Ray is not installed)

The training probe runs right after the production dtype's kernel checks (bf16 on a
GPU), then compiled decoding and generation, and the other dtype's kernel checks last:
on a fresh GPU node Triton's autotuning and Inductor's compilations take minutes, and
each line ends with the seconds its group took.

Every figure is measured in this run: nothing is read from a table.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict
from typing import Callable

from looplab.doctor.checks import (
    FAIL,
    PASS,
    SKIP,
    TF32_TOLERANCE,
    TOLERANCE,
    Check,
    failed,
    guarded,
    max_error,
    passed,
    skipped,
    within,
)
from looplab.doctor.decoding import (
    TIMED_TOKENS,
    compiled_decoding_check,
    decoding_speed,
    first_difference,
    generation_check,
)
from looplab.doctor.kernels import scan_check, step_check
from looplab.doctor.peak_rates import bandwidth, gemm_flops, peaks
from looplab.doctor.probe import (
    MEMORY_RATIO,
    PROBE_MICRO_BATCHES,
    measure_steps,
    memory_check,
    predicted_peak,
    step_peak,
    training_probe,
)
from looplab.doctor.ray_cluster import ray_check
from looplab.doctor.versions import PACKAGES, cpu_sequence_kernels, environment


def run(
    *,
    quick: bool = False,
    preset: str | None = None,
    steps: int = 3,
    device: str = "auto",
    ray: bool = True,
    progress: Callable[[Check], None] | None = None,
) -> list[Check]:
    import torch

    from looplab.devices import resolve_device

    dev = resolve_device(device)
    checks: list[Check] = []

    def add(found: list[Check]) -> None:
        for check in found:
            checks.append(check)
            if progress is not None:
                progress(check)

    def timed(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
        # A group's wall time on its first check: on a fresh GPU node Triton's
        # autotuning and Inductor's compilations take minutes, and the report says where.
        t = time.perf_counter()
        found = guarded(name, fn)
        if found:
            found[0].seconds = time.perf_counter() - t
        return found

    add(timed("environment", lambda: environment(dev)))
    peak_holder: list[float] = []

    def measured_peaks():
        found, peak = peaks(dev, quick)
        peak_holder.append(peak)
        return found

    add(timed("peaks", measured_peaks))
    dtypes = (torch.bfloat16, torch.float32) if dev.type == "cuda" else (torch.float32,)
    name = preset or ("paper-140m" if dev.type == "cuda" else "local")

    def kernel_checks(dtype):
        add(timed("scan kernel vs torch", lambda: scan_check(dev, dtype)))
        add(timed("decode step cuda vs torch", lambda: step_check(dev, dtype, kernel="cuda")))

    # The production dtype's kernels first, then what rests on them: the training probe
    # (what a sweep's plan rests on, reusing their autotuned kernels), compiled decoding
    # and generation; the other dtype's kernel checks last. On a fresh GPU node each
    # dtype's autotuning and each compilation take minutes, and a lent machine's check
    # may end before the last line.
    kernel_checks(dtypes[0])
    if not quick:
        peak = peak_holder[0] if peak_holder else 0.0
        add(timed(f"training {name}", lambda: training_probe(dev, name, steps, peak)))
    add(timed("compiled decoding vs eager", lambda: compiled_decoding_check(dev)))
    add(timed("generation vs full forward", lambda: generation_check(dev)))
    for dtype in dtypes[1:]:
        kernel_checks(dtype)
    add(timed("decode step cpu vs torch", lambda: step_check(dev, torch.float32, kernel="cpu")))
    if quick:
        add([skipped("training probe", "--quick"), skipped("ray", "--quick")])
        return checks
    add(timed("ray", lambda: ray_check(dev)) if ray else [skipped("ray", "--no-ray")])
    return checks


def report_json(checks: list[Check], path: str | os.PathLike) -> None:
    from looplab.destinations import write_text

    write_text(
        path,
        json.dumps(
            {
                "host": platform.node(),
                "checks": [asdict(c) for c in checks],
                "failed": sum(c.status == FAIL for c in checks),
            },
            indent=2,
        )
        + "\n",
    )


def report_markdown(checks: list[Check]) -> str:
    rows = ["| check | status | figure | reason | seconds |", "|---|---|---|---|---|"]
    rows += [
        f"| {c.name} | {c.status} | {c.figure} | {c.reason} | {'' if c.seconds is None else f'{c.seconds:.1f}'} |"
        for c in checks
    ]
    return "\n".join(rows)


def main(args) -> int:
    """The `looplab doctor` command: one line per check as it finishes, then the verdict."""
    started = time.perf_counter()
    checks = run(
        quick=args.quick,
        preset=args.preset,
        steps=args.steps,
        device=args.device,
        ray=not args.no_ray,
        progress=lambda c: print(c.line(), flush=True),
    )
    if args.json:
        report_json(checks, args.json)
    if getattr(args, "markdown", None):
        from looplab.destinations import write_text

        write_text(args.markdown, report_markdown(checks) + "\n")
    bad = [c for c in checks if c.status == FAIL]
    print(
        f"doctor: {len(checks) - len(bad)} of {len(checks)} checks passed or skipped, {len(bad)} failed "
        f"({time.perf_counter() - started:.0f} s)"
        + (f"; first failure: {bad[0].name}: {bad[0].reason}" if bad else ""),
        file=sys.stderr,
    )
    return 1 if bad else 0


# The package's face: the command's entry points and every check, as the single module looplab/doctor.py held them.
__all__ = [
    "Check",
    "FAIL",
    "MEMORY_RATIO",
    "PACKAGES",
    "PASS",
    "PROBE_MICRO_BATCHES",
    "SKIP",
    "TF32_TOLERANCE",
    "TIMED_TOKENS",
    "TOLERANCE",
    "bandwidth",
    "compiled_decoding_check",
    "cpu_sequence_kernels",
    "decoding_speed",
    "environment",
    "failed",
    "first_difference",
    "gemm_flops",
    "generation_check",
    "guarded",
    "main",
    "max_error",
    "measure_steps",
    "memory_check",
    "passed",
    "peaks",
    "predicted_peak",
    "ray_check",
    "report_json",
    "report_markdown",
    "run",
    "scan_check",
    "skipped",
    "step_check",
    "step_peak",
    "training_probe",
    "within",
]
