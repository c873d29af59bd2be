"""C4's GPU claims, judged where they live: a GPU at the paper's setting.

    python -m sweeps.gpu_claims OUT_DIR                  # on a CUDA machine: the verdicts
    python -m sweeps.gpu_claims OUT_DIR --cpu-plumbing   # anywhere: the code end to end, tiny, no verdict

C4-batch1 (skip's prefill speedup at batch 1 is below 1: a latency-bound prefill) and
C4-growth (the speedup at the largest batch minus at batch 1, paired by model) are a
GPU's regime, which two CPU cores do not have; the protocol shows them on a CPU,
outside its family, and declares where they are judged: PROTOCOL.gpu_speed
(sweeps/protocol.GpuSpeed). For each of its seeds this builds a fresh model of the
declared preset's shape, spreads its exit gate so that tokens exit across the loops,
and times prefill full against skip at each declared batch (looplab/costs/timing.py's
bench_point: the declared policy, packing, dtype and context). The two claims are
judged from those records by analysis/claims.py's rules, with Holm's correction over
gpu_speed.claims alone. OUT_DIR receives gpu_claims.md (the protocol, the machine, the
setting, each seed's speedups and the verdicts) and gpu_speed_records.csv (one row per
seed and batch). scripts/device_check.sh runs it on a lent GPU machine.

A verdict is a result, not a fault: the exit status is 0 whatever the verdicts, 2 on a
bad input (one line: no CUDA device, say).
"""

from __future__ import annotations

import csv
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import torch

from analysis.claims import ClaimResult, batch_claims, correct, verdict_markdown
from looplab.arguments import Parser, add_flags, flag, flags_of
from looplab.checkpoint import seeded
from looplab.costs.measured_memory import UNKNOWN_PEAK
from looplab.costs.timing import BenchRecord, bench_point, check_dtype
from looplab.devices import resolve_device
from looplab.errors import ConfigError, check, invalid
from looplab.models.looped import LoopedLM
from looplab.models.ops.dispatch import kernel_path
from looplab.policy import ExitPolicy
from looplab.presets import get_preset
from looplab.tasks.base import heldout_ids
from looplab.tracking import hardware
from sweeps.protocol import PROTOCOL, GpuSpeed, Protocol

MARKDOWN, RECORDS = "gpu_claims.md", "gpu_speed_records.csv"
JUDGED = ("C4-batch1", "C4-growth")  # the claims gpu_verdicts computes
# Enough to leave the first calls' autotuning and allocation out of the median, which a
# GPU's low noise then needs few repeats for; scripts/device_check.sh's comment estimates
# what they cost on an H200.
WARMUP, REPEATS = 2, 5
# --cpu-plumbing: the same code at a size two CPU cores run in seconds. Not a verdict: a
# CPU has no latency-bound batch 1, and this is not the declared setting.
PLUMBING: dict[str, Any] = {"preset": "debug", "seq_len": 32, "batches": (1, 4), "seeds": (0, 1, 2), "dtype": "fp32"}


def setting(protocol: Protocol, overrides: dict[str, Any] | None) -> GpuSpeed:
    """The protocol's declared GPU setting, with `overrides` replacing its fields,
    checked before anything is built: its claims (those this module computes), its names
    (preset, policy, dtype) by their homes, batch 1 and a larger batch (both claims read
    the two), and two seeds (an interval)."""
    if protocol.gpu_speed is None:
        raise invalid("protocol", protocol.name, "a protocol that declares gpu_speed (v5 on)")
    names = [f.name for f in fields(GpuSpeed)]
    for key in overrides or {}:
        check(key in names, "overrides", key, " | ".join(names))
    gpu = replace(protocol.gpu_speed, **(overrides or {}))
    check(set(gpu.claims) <= set(JUDGED), "GpuSpeed.claims", gpu.claims, f"some of {' | '.join(JUDGED)}")
    check(1 in gpu.batches and max(gpu.batches) > 1, "GpuSpeed.batches", gpu.batches, "batch 1 and a larger batch")
    check(len(set(gpu.seeds)) >= 2, "GpuSpeed.seeds", gpu.seeds, "two distinct seeds or more")
    get_preset(gpu.preset)
    ExitPolicy.parse(gpu.policy)
    check_dtype(gpu.dtype)
    return gpu


def judged_device(device: str, plumbing: bool) -> torch.device:
    """The device the prefills run on: a CUDA device, or any device for a plumbing run.
    Refused in one line before anything is built or timed."""
    if plumbing:
        return resolve_device(device)
    if not torch.cuda.is_available():
        why = "this machine has no CUDA device"
    elif (resolved := resolve_device(device)).type != "cuda":
        why = f"it runs on {resolved.type}"
    else:
        return resolved
    allowed = (
        "a CUDA device (C4-batch1 and C4-growth are a GPU's regime: on a CPU they are descriptive, and "
        "--cpu-plumbing checks this code there without a verdict)"
    )
    raise ConfigError(f"device={device!r} is invalid here: {why}; allowed: {allowed}", name="device", value=device)


@torch.no_grad()
def fresh_model(gpu: GpuSpeed, seed: int, device: torch.device) -> torch.nn.Module:
    """A fresh model of the preset's shape whose exit gate is spread: a fresh gate's
    bias of -2 exits almost no token, so its weights are drawn at gate_spread and its
    bias zeroed, and tokens exit across the loops. Built on the CPU under the seed
    (looplab.checkpoint.seeded), the gate drawn from the same stream after the weights:
    one seed is the same model on every machine. Eval mode, on `device`."""
    with seeded(seed):
        model = LoopedLM(get_preset(gpu.preset).model)
        model.exit_gate.weight.normal_(0.0, gpu.gate_spread)
    model.exit_gate.bias.zero_()
    return model.to(device).eval()


def time_seed(
    gpu: GpuSpeed, seed: int, device: torch.device, warmup: int, repeats: int, progress: Callable[[str], None]
) -> list[BenchRecord]:
    """One seed's records: its model's prefill, full against skip, at each declared
    batch, on held-out ids drawn under the seed."""
    model = fresh_model(gpu, seed, device)
    records = []
    for batch in gpu.batches:
        started = time.perf_counter()
        ids = heldout_ids(model, None, batch, gpu.seq_len, seed).to(device)
        # Memory is not what these claims judge, and measuring it would cost four more
        # prefills a point (a child process on a CPU): the records say -1.
        r = bench_point(
            model,
            ids,
            ExitPolicy.parse(gpu.policy),
            warmup=warmup,
            repeats=repeats,
            packing=gpu.packing,
            dtype=gpu.dtype,
            peaks=(UNKNOWN_PEAK, UNKNOWN_PEAK),
        )
        records.append(r)
        progress(
            f"[gpu_claims] seed {seed} batch {batch}: full {r.time_full_s * 1e3:.1f} ms, skip "
            f"{r.time_skip_s * 1e3:.1f} ms, speedup {r.speedup:.3f}x, {r.mean_executed_loops:.2f} loops "
            f"({time.perf_counter() - started:.1f} s)"
        )
    return records


def gpu_verdicts(records: list[dict], gpu: GpuSpeed, confidence: float) -> list[ClaimResult]:
    """C4-batch1 and C4-growth from the records ({"seed", "batch", "speedup", ...}) by
    analysis/claims.batch_claims, corrected by Holm over gpu.claims alone. Not through
    speed_claims: it reads packing "padded" records as the separate C4-padded claim."""
    where = f"seq_len {gpu.seq_len}, {gpu.policy}, {gpu.packing} {gpu.dtype}, {gpu.preset}'s shape, spread gate"
    return correct(batch_claims(records, where, confidence), gpu.claims, confidence)


def seeds_table(timed: dict[int, list[BenchRecord]]) -> str:
    """Each seed's timed points, as markdown."""
    lines = [
        "| seed | batch | full ms | skip ms | speedup (repeats' range) | executed loops | ideal | survivor ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, records in timed.items():
        for r in records:
            lines.append(
                f"| {seed} | {r.batch} | {r.time_full_s * 1e3:.2f} | {r.time_skip_s * 1e3:.2f} | "
                f"{r.speedup:.3f}x ({r.speedup_min:.3f}-{r.speedup_max:.3f}) | {r.mean_executed_loops:.2f} | "
                f"{r.ideal_speedup:.2f}x | {r.batch_max_survivor_ratio:.2f} |"
            )
    return "\n".join(lines)


def report_markdown(
    protocol: Protocol,
    gpu: GpuSpeed,
    device: torch.device,
    timed: dict[int, list[BenchRecord]],
    results: list[ClaimResult],
    *,
    warmup: int,
    repeats: int,
    seconds: float,
) -> str:
    """gpu_claims.md. Its first line says what the run is: the verdicts, a plumbing check
    on a CPU, or an exploratory setting on a GPU."""
    declared = gpu == protocol.gpu_speed
    if device.type != "cuda":
        first = "**A plumbing check on a CPU, not a verdict**: this code end to end at a tiny setting"
    elif not declared:
        first = "**Exploratory, not a verdict**: a setting other than the protocol's declared one"
    else:
        first = f"# GPU claims: {', '.join(gpu.claims)} at the protocol's declared setting"
    path, why = kernel_path(torch.zeros(1, device=device))
    return "\n".join(
        [
            first,
            "",
            f"Protocol **{protocol.name}**, digest `{protocol.digest()}` (sweeps/protocol.py); "
            f"{protocol.confidence:.0%} Student-t intervals over seeds, Holm's correction over "
            f"{', '.join(gpu.claims)} alone.",
            "",
            f"- machine: {hardware()}, device {device}",
            f"- prefill scan: {path} ({why})",
            f"- setting{'' if declared else ' (not the declared one)'}: preset {gpu.preset}'s shape, a fresh model "
            f"per seed with its exit gate spread at {gpu.gate_spread:g}; context {gpu.seq_len}, batches "
            f"{', '.join(map(str, gpu.batches))}, {gpu.policy}, {gpu.packing} survivors, {gpu.dtype}; seeds "
            f"{', '.join(map(str, gpu.seeds))}",
            f"- timing: full and skip alternate, {warmup} warm-ups then the median of {repeats} repeats of each "
            f"(looplab/costs/timing.py); {seconds:.0f} s in all",
            "",
            seeds_table(timed),
            "",
            verdict_markdown(results),
            "",
        ]
    )


def write_records(records: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def judge_on_device(
    out_dir: str | Path,
    protocol: Protocol = PROTOCOL,
    *,
    device: str = "cuda",
    overrides: dict[str, Any] | None = None,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> list[ClaimResult]:
    """Time every declared seed, judge the GPU claims, write gpu_claims.md and
    gpu_speed_records.csv to out_dir; return the corrected results. Without CUDA it
    refuses (a ConfigError naming the device) unless `overrides` makes it a plumbing run."""
    gpu = setting(protocol, overrides)
    on = judged_device(device, plumbing=overrides is not None)
    check(warmup >= 0, "warmup", warmup, "an integer >= 0")
    check(repeats >= 1, "repeats", repeats, "an integer >= 1")
    started = time.perf_counter()
    timed = {seed: time_seed(gpu, seed, on, warmup, repeats, progress) for seed in gpu.seeds}
    records = [{"seed": seed, **asdict(r)} for seed, rs in timed.items() for r in rs]
    results = gpu_verdicts(records, gpu, protocol.confidence)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_records(records, out / RECORDS)
    text = report_markdown(
        protocol, gpu, on, timed, results, warmup=warmup, repeats=repeats, seconds=time.perf_counter() - started
    )
    (out / MARKDOWN).write_text(text)
    return results


@dataclass(frozen=True)
class GpuClaims:
    """The command's arguments: OUT_DIR, and --cpu-plumbing."""

    out_dir: str = flag(help="where the claims' runs, verdicts and report go", argument=True)
    cpu_plumbing: bool = flag(False, "the code end to end on a CPU, tiny: no verdict")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m sweeps.gpu_claims", description=__doc__.splitlines()[0])
    add_flags(p, GpuClaims)
    options = flags_of(GpuClaims, p.parse_args(argv))
    try:
        if options.cpu_plumbing:
            judge_on_device(options.out_dir, device="cpu", overrides=PLUMBING)
        else:
            judge_on_device(options.out_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((Path(options.out_dir) / MARKDOWN).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
