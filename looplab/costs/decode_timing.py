"""Decode cost of skip execution against full execution, one token at a time.

Decode (`--decode`, DecodeRecord): after a prompt of seq_len tokens is prefilled
into the per-(loop, layer) cache (looplab/inference/generate.py), new_tokens held-out tokens
are decoded one at a time for every row (teacher-forced, so full and skip see the
same inputs), from copies of the same prefilled caches, alternating, after
warm-ups. Reported: the median time per decode step and tokens/s (with the readout,
final norm + LM head, as generation runs it), the same without the readout (the
loops and gates alone: what skipping changes, against the ideal R / mean loops),
the mean executed loops of the new tokens, peak memory of the decoding (delta and
absolute, as above) and the cache's size. Under bf16 the prompt's prefill and each
decoding run are under autocast. Work follows the running tokens: each loop runs
only the rows whose token is still active.

Skip decodes in a schedule (`--schedule`, a column; full always runs in lockstep):
lockstep (each new token of every row runs its loops together: the batch takes its
deepest token's loops in backbone steps) or depth (looplab/inference/depth_batching.py: a row
feeds its next token as soon as its last one is done, rows at different loops share
a step). `steps` is the backbone steps per new token; with the readout, depth reads
out whichever rows finish at each step, so it runs the head more often on fewer rows.
`mamba step` says which Mamba-2 single-token step ran: torch, cpu-kernel (the
compiled CPU step, LOOPLAB_CPU_STEP_KERNEL=1: models/cpu/cpu_step.py) or cuda.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from looplab.config import ConfigError
from looplab.costs.measured_memory import Peak, peak_memory
from looplab.costs.timing import (
    MEMORY_HEADER,
    BenchGrid,
    check_dtype,
    measured_peaks,
    memory_columns,
    mib,
    policy_label,
    time_grid,
    timed_seconds,
    under_dtype,
)
from looplab.inference.depth_batching import DEPTH, LOCKSTEP, check_schedule
from looplab.models.mamba2 import Mamba2
from looplab.models.ops.dispatch import step_implementation
from looplab.policy import DENSE, SKIP, ExitPolicy


@dataclass
class DecodeRecord:
    batch: int
    seq_len: int  # the prompt (context) before decoding
    new_tokens: int
    policy: str  # the skip policy's spec (skip:q), or "oracle"
    oracle_mean: float | None
    attention_fill: str
    mean_executed_loops: float  # over the decoded tokens under skip
    ideal_speedup: float  # R / mean_executed_loops
    time_full_s: float  # median seconds per decode step (one new token for every row), readout included
    time_skip_s: float
    speedup: float
    tokens_per_s_full: float
    tokens_per_s_skip: float
    loops_time_full_s: float  # the same without the readout: loops and gates alone
    loops_time_skip_s: float
    loops_speedup: float
    peak_mem_full: int  # bytes above the level before the decoding (module docstring)
    peak_mem_skip: int
    peak_mem_abs_full: int  # absolute peak bytes during the decoding
    peak_mem_abs_skip: int
    cache_bytes: int  # the prefilled cache (Mamba-2 states: independent of seq_len)
    dtype: str  # fp32, or bf16 (autocast)
    device: str
    schedule: str = LOCKSTEP  # skip's decode schedule (full decodes in lockstep: every row runs every loop)
    steps_skip: float = 0.0  # backbone steps per new token under skip (lockstep: loops run by the batch)
    mamba_step: str = "torch"  # the Mamba-2 single-token step that ran: torch | cpu-kernel | cuda ("-": no Mamba-2)
    kind: str = "decode"


@dataclass
class Probe:
    """What one decoding ran: each new token's loops, and the backbone steps in all."""

    loops: list[torch.Tensor] = field(default_factory=list)
    steps: int = 0


def _decode_runs(
    model,
    ids: torch.Tensor,
    seq_len: int,
    policy: ExitPolicy,
    attention_fill: str,
    dtype: str,
    schedule: str = LOCKSTEP,
):
    """The prefilled caches of `policy` and its dense twin, and decoding(p, readout,
    probe) -> a call that decodes ids[:, seq_len:] from a copy of p's cache (the dense
    twin in lockstep, `policy` under `schedule`); a Probe receives the new tokens'
    loops and the backbone steps they took."""
    from looplab.inference.depth_batching import decode_given_tokens
    from looplab.inference.generate import decode_step, prefill

    device, dense = ids.device, replace(policy, execution=DENSE)

    def prefilled(p: ExitPolicy):
        return prefill(model, ids[:, :seq_len], p, capacity=ids.shape[1], attention_fill=attention_fill).cache

    caches = {p: under_dtype(partial(prefilled, p), device, dtype)() for p in (dense, policy)}

    def decoding(p: ExitPolicy, readout: bool = True, probe: Probe | None = None):
        cache = caches[p].clone()  # every run decodes from the same prefilled state

        def run():
            if schedule == DEPTH and p is policy:
                batch = decode_given_tokens(
                    model,
                    cache,
                    ids,
                    seq_len,
                    p,
                    readout=readout,
                    on_done=None if probe is None else lambda done: probe.loops.append(done.loops),
                )
                if probe is not None:
                    probe.steps = batch.steps
                return
            for t in range(seq_len, ids.shape[1]):
                out = decode_step(model, cache, ids[:, t], p, readout=readout)
                if probe is not None:
                    probe.loops.append(out.loops)
                    probe.steps += out.batch_loops()  # lockstep: its deepest token's loops, or a fused call's

        return under_dtype(run, device, dtype)  # one autocast region per decoding, as a generate call

    return dense, caches, decoding


@torch.no_grad()
def decode_peaks(
    model,
    ids: torch.Tensor,
    seq_len: int,
    policy: ExitPolicy,
    attention_fill: str = "hole",
    dtype: str = "fp32",
    schedule: str = LOCKSTEP,
) -> tuple[Peak, Peak]:
    """Peak memory of decoding under the dense twin and under `policy`, each after a warm-up decoding."""
    dense, _, decoding = _decode_runs(model, ids, seq_len, policy, attention_fill, dtype, schedule)
    decoding(dense)(), decoding(policy)()
    return peak_memory(decoding(dense), ids.device), peak_memory(decoding(policy), ids.device)


def _check_decode_point(
    ids: torch.Tensor, seq_len: int, policy: ExitPolicy, dtype: str, schedule: str = LOCKSTEP
) -> None:
    check_schedule(schedule)
    if policy.execution != SKIP:
        raise ConfigError(
            f"bench policy {policy.spec!r} is invalid; allowed: skip policies (skip:Q), which "
            "it compares with full execution"
        )
    check_dtype(dtype)
    if ids.shape[1] - seq_len < 1:
        raise ConfigError(f"new_tokens={ids.shape[1] - seq_len} is invalid; allowed: an integer >= 1")


@torch.no_grad()
def bench_decode_point(  # noqa: PLR0913 - one decode point's knobs, keyword-only, from run_decode_grid
    model,
    ids: torch.Tensor,
    seq_len: int,
    policy: ExitPolicy,
    *,
    warmup: int = 1,
    repeats: int = 3,
    oracle_mean: float | None = None,
    attention_fill: str = "hole",
    dtype: str = "fp32",
    schedule: str = LOCKSTEP,
    peaks: tuple[Peak, Peak] | None = None,
) -> DecodeRecord:
    """Decode ids[:, seq_len:] one token at a time after prefilling ids[:, :seq_len],
    under `policy` (skip: gate threshold or given exits; in `schedule`) and its dense
    twin. peaks: the two decodings' memory, measured beforehand (run_decode_grid);
    None measures it here."""
    _check_decode_point(ids, seq_len, policy, dtype, schedule)
    if peaks is None:
        peaks = measured_peaks(
            decode_peaks,
            [
                dict(
                    model=model,
                    ids=ids,
                    seq_len=seq_len,
                    policy=policy,
                    attention_fill=attention_fill,
                    dtype=dtype,
                    schedule=schedule,
                )
            ],
        )[0]
    device, n_new = ids.device, ids.shape[1] - seq_len
    dense, caches, decoding = _decode_runs(model, ids, seq_len, policy, attention_fill, dtype, schedule)
    probe = Probe()
    decoding(policy, False, probe)()  # the probe: executed loops of the new tokens, and the steps they took
    mean_loops = float(torch.cat(probe.loops).float().mean())
    steps = probe.steps / n_new
    variants: dict[tuple[ExitPolicy, bool], list[float]] = {
        (p, readout): [] for readout in (True, False) for p in (dense, policy)
    }
    for repeat in range(warmup + repeats):
        for (p, readout), times in variants.items():  # alternate: drifting background load hits all alike
            run = decoding(p, readout)
            elapsed = timed_seconds(run, device) / n_new
            if repeat >= warmup:
                times.append(elapsed)
    t = {key: statistics.median(times) for key, times in variants.items()}
    bsz, R = ids.shape[0], model.cfg.n_loops
    mem_full, mem_skip = peaks
    return DecodeRecord(
        batch=bsz,
        seq_len=seq_len,
        new_tokens=n_new,
        policy="oracle" if oracle_mean is not None else policy.spec,
        oracle_mean=oracle_mean,
        attention_fill=attention_fill,
        mean_executed_loops=mean_loops,
        ideal_speedup=R / mean_loops,
        time_full_s=t[dense, True],
        time_skip_s=t[policy, True],
        speedup=t[dense, True] / t[policy, True],
        tokens_per_s_full=bsz / t[dense, True],
        tokens_per_s_skip=bsz / t[policy, True],
        loops_time_full_s=t[dense, False],
        loops_time_skip_s=t[policy, False],
        loops_speedup=t[dense, False] / t[policy, False],
        peak_mem_full=mem_full.delta,
        peak_mem_skip=mem_skip.delta,
        peak_mem_abs_full=mem_full.absolute,
        peak_mem_abs_skip=mem_skip.absolute,
        cache_bytes=caches[policy].nbytes(),
        dtype=dtype,
        device=str(device),
        schedule=schedule,
        steps_skip=steps,
        mamba_step=_mamba_step(model, device, dtype),
    )


def _mamba_step(model, device: torch.device, dtype: str) -> str:
    """Which Mamba-2 step decoding runs (models/mamba2.py), "-" for a model without
    Mamba-2 mixers, with "+compiled" where the one-token step runs under torch.compile
    (models/compiled.py). Under bf16 autocast the step's inputs are bf16."""
    compiled = "+compiled" if getattr(model, "compiled_decode", None) is not None else ""
    if not any(isinstance(m, Mamba2) for m in model.modules()):
        return "-" + compiled
    param = next(model.parameters())
    dtype_ = torch.bfloat16 if dtype == "bf16" else param.dtype
    return step_implementation(torch.empty(0, device=device, dtype=dtype_)) + compiled


def run_decode_grid(
    model,
    task,
    grid: BenchGrid,
    *,
    new_tokens: int = 32,
    attention_fill: str = "hole",
    schedules=(LOCKSTEP,),
    device: torch.device | str = "cpu",
    on_record=None,
) -> list[DecodeRecord]:
    """Every point of the grid × schedule, decoding `new_tokens` per row after its
    seq_len-token prompt (module docstring)."""
    device = torch.device(device)
    model = model.to(device).eval()
    points = [
        dict(point, schedule=schedule)
        for point in grid.points(model, task, device, new_tokens)
        for schedule in schedules
    ]
    for p in points:
        _check_decode_point(p["ids"], p["seq_len"], p["policy"], grid.dtype, p["schedule"])
    return time_grid(model, grid, points, decode_peaks, bench_decode_point, on_record, attention_fill=attention_fill)


DECODE_HEADER = (
    "batch  context  policy      schedule  mamba step  dtype  loops  steps  ideal  full ms  skip ms  "
    "tok/s full  tok/s skip  speedup  loops only: full ms  skip ms  speedup  of ideal  " + MEMORY_HEADER + "      cache"
)


def format_decode_record(r: DecodeRecord) -> str:
    return (
        f"{r.batch:5d}  {r.seq_len:7d}  {policy_label(r):10s}  {r.schedule:8s}  {r.mamba_step:10s}  {r.dtype:5s}  "
        f"{r.mean_executed_loops:5.2f}  {r.steps_skip:5.2f}  "
        f"{r.ideal_speedup:5.2f}  {r.time_full_s * 1e3:7.2f}  {r.time_skip_s * 1e3:7.2f}  "
        f"{r.tokens_per_s_full:10.0f}  {r.tokens_per_s_skip:10.0f}  {r.speedup:6.2f}x  "
        f"{r.loops_time_full_s * 1e3:19.2f}  {r.loops_time_skip_s * 1e3:7.2f}  {r.loops_speedup:6.2f}x  "
        f"{r.loops_speedup / r.ideal_speedup:7.1%}  {memory_columns(r)}  {mib(r.cache_bytes)}"
    )


def context_scaling(records: list[DecodeRecord]) -> list[str]:
    """Per-token decode time at the longest context ÷ at the shortest, per batch and
    policy: constant-cost decoding keeps it near 1 (Mamba-2 states do not grow)."""
    lines = []
    groups: dict[tuple, list[DecodeRecord]] = {}
    for r in records:
        groups.setdefault((r.batch, r.policy, r.oracle_mean, r.schedule), []).append(r)
    for (batch, _, _, schedule), rs in groups.items():
        if len(rs) > 1:
            short, long = min(rs, key=lambda r: r.seq_len), max(rs, key=lambda r: r.seq_len)
            lines.append(
                f"batch {batch} ({schedule}): per-token time at context {long.seq_len} / {short.seq_len}: "
                f"full {long.time_full_s / short.time_full_s:.2f}, skip {long.time_skip_s / short.time_skip_s:.2f}"
            )
    return lines
