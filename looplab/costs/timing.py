"""Prefill cost of skip execution against full execution (paper §5.4, Tables 4–5).

For each (batch, seq_len, exit policy) the same held-out inputs run twice in one
process, alternately, after warm-ups:
    full  every token runs all R loops; readout at its exit step (dense mode)
    skip  exited tokens leave the deeper loops (skip mode)
Both use the same readout policy (O(1) in loops) and, as a prefill does, compute
next-token logits only at the last position, so they differ only in whether
exited tokens run the deeper loops. Reported per point: median wall time of each,
the measured speedup, the mean executed loops, the ideal speedup R / mean loops,
the batch-max survivor ratio (padded work / real work in the padded layout; 1.0
means no ragged-halting loss) and peak memory of each. Every record names its
dtype and (prefill) its packing.

Dtype (--dtype): fp32 runs as stored; bf16 runs every timed call under bfloat16
autocast (looplab/devices.autocast_context: CUDA's, as training on CUDA runs, or CPU's on
a CPU).

Packing (prefill): the layout skip's survivors are packed in (models/execution.py).
"padded" pads each row's survivors to the batch's largest count, so a batch pays for
its slowest row: this reproduces the paper's ragged-halting measurement. "varlen"
(looplab's; Mamba-2 backbones only, the default there) puts the batch's survivors
in one row, so work follows the real survivor count.

Peak memory, two numbers per run (looplab/costs/measured_memory.py; -1 where they cannot
be measured):
    peak_mem_full / _skip          the peak above what was in use before the call:
                                   what the call itself needed
    peak_mem_abs_full / _skip      the absolute peak during the call: weights,
                                   inputs, (CPU) the process's own footprint included
On CUDA they are measured in this process after the timing. On CPU every point's
memory is measured first, in one child process whose resident set follows live
tensors, after a warm-up call of each run; the timing runs here, under the
allocator's normal behaviour (the child's setting slows CPU steps).

Exits come from the gate and a threshold q (a trained checkpoint), from a zero-shot
rule of the exit-policy zoo (skip-entropy:T, skip-kl:T, skip-stable:K; any
checkpoint, no gate needed: both runs then also pay the rule's LM head at every
step), or from an oracle (--oracle-mean M): per-token depths drawn uniformly from an
interval centred on M and stochastically rounded, so the cost model is measured
without training.

Decoding's cost is looplab/costs/decode_timing.py's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, TypeVar

import numpy as np
import torch

from looplab.config import ConfigError
from looplab.costs.measured_memory import Peak, in_rss_process, peak_memory
from looplab.devices import autocast_context
from looplab.errors import check, invalid
from looplab.policy import DENSE, SKIP, ExitPolicy, round_depth
from looplab.tasks.base import heldout_ids


@dataclass
class BenchRecord:
    batch: int
    seq_len: int
    policy: str  # the skip policy's spec (skip:0.4, skip-entropy:2.0, ...), or "oracle"
    oracle_mean: float | None
    packing: str  # the layout skip ran: padded (the paper's) or varlen (looplab's)
    dtype: str  # fp32, or bf16 (autocast)
    mean_executed_loops: float
    ideal_speedup: float
    batch_max_survivor_ratio: float
    time_full_s: float
    time_skip_s: float
    speedup: float
    peak_mem_full: int  # bytes above the level before the call (module docstring)
    peak_mem_skip: int
    peak_mem_abs_full: int  # absolute peak bytes during the call
    peak_mem_abs_skip: int
    device: str
    # The speedup of each repeat's skip over the same repeat's full (they alternate): the
    # spread of the median above.
    speedup_min: float = float("nan")
    speedup_max: float = float("nan")
    # Each time's fastest and slowest repeat.
    time_full_min_s: float = float("nan")
    time_full_max_s: float = float("nan")
    time_skip_min_s: float = float("nan")
    time_skip_max_s: float = float("nan")


DTYPES = ("fp32", "bf16")
T = TypeVar("T")


def check_dtype(dtype: str) -> None:
    check(dtype in DTYPES, "dtype", dtype, " | ".join(DTYPES))


def under_dtype(fn: Callable[[], T], device: torch.device, dtype: str) -> Callable[[], T]:
    """`fn` under the benchmark's dtype (looplab/devices.autocast_context). A bf16 kernel
    the device lacks becomes a one-line ConfigError naming the dtype, not a traceback
    from deep inside the model."""

    def run() -> T:
        try:
            with autocast_context(device, dtype):
                return fn()
        except RuntimeError as e:
            if dtype != "bf16" or "BFloat16" not in str(e):
                raise
            reason = str(e).strip().splitlines()[0]
            raise invalid("dtype", dtype, f"fp32 (bf16 autocast fails on {device.type}: {reason})") from None

    return run


def oracle_exit_steps(rng: np.random.Generator, shape: tuple[int, int], mean: float, n_loops: int) -> torch.Tensor:
    """Per-token exit steps in 1..R with expected value `mean`: depths uniform on
    the widest interval inside [1, R] centred on the mean, stochastically rounded."""
    if not 1.0 <= mean <= n_loops:
        raise ValueError(f"oracle_mean={mean!r} is invalid; allowed: a float in [1, R={n_loops}]")
    half = min(mean - 1.0, n_loops - mean)
    depth = rng.uniform(mean - half, mean + half, size=shape)
    return torch.from_numpy(np.clip(round_depth(depth, "stochastic", rng), 1, n_loops))


def timed_seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def median_seconds(fn, repeats: int, *, warmup: int = 0, device: torch.device | None = None) -> float:
    """The median wall time of `repeats` calls of fn, after `warmup` untimed calls (on a
    CUDA device, synchronised around each call; the CPU when none is named)."""
    device = device or torch.device("cpu")
    for _ in range(warmup):
        fn()
    return statistics.median(timed_seconds(fn, device) for _ in range(repeats))


def survivor_ratio(exit_step: torch.Tensor, n_loops: int) -> float:
    """Σ_r B · max_b n_{b,r} / Σ_r Σ_b n_{b,r}: the padded layout's work over the
    real work (n_{b,r}: survivors of row b at step r)."""
    padded = real = 0
    for r in range(1, n_loops + 1):
        n = (exit_step >= r).sum(dim=1)
        padded += int(n.max()) * n.numel()
        real += int(n.sum())
    return padded / real


def _prefill_runs(model, ids: torch.Tensor, policy: ExitPolicy, packing: str, dtype: str):
    """The point's two calls: `policy` (skip) and its dense twin (full)."""
    dense = replace(policy, execution=DENSE)
    full = under_dtype(lambda: model(ids, dense, readout="last"), ids.device, dtype)
    skip = under_dtype(lambda: model(ids, policy, packing=packing, readout="last"), ids.device, dtype)
    return full, skip


@torch.no_grad()
def prefill_peaks(
    model, ids: torch.Tensor, policy: ExitPolicy, packing: str = "auto", dtype: str = "fp32"
) -> tuple[Peak, Peak]:
    """Peak memory of the point's full and skip calls, each after a warm-up call."""
    full, skip = _prefill_runs(model, ids, policy, packing, dtype)
    full(), skip()
    return peak_memory(full, ids.device), peak_memory(skip, ids.device)


def _each(measure: Callable[..., T], points: list[dict]) -> list[T]:
    return [measure(**point) for point in points]


def measured_peaks(measure: Callable[..., T], points: list[dict]) -> list[T]:
    """measure(**point) for every point: in this process on CUDA, in one child
    process on CPU, whose resident set follows live tensors (module docstring)."""
    on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for point in points for v in point.values())
    return _each(measure, points) if on_cuda else in_rss_process(_each, measure, points)


def _check_prefill_point(policy: ExitPolicy, dtype: str) -> None:
    if policy.execution != SKIP:
        raise ConfigError(
            f"bench policy {policy.spec!r} is invalid; allowed: skip policies (skip:Q, "
            "skip-entropy:T, skip-kl:T, skip-stable:K), which it compares with full execution"
        )
    check_dtype(dtype)


@torch.no_grad()
def bench_point(
    model,
    ids: torch.Tensor,
    policy: ExitPolicy,
    *,
    warmup: int = 2,
    repeats: int = 5,
    packing: str = "auto",
    oracle_mean: float | None = None,
    dtype: str = "fp32",
    peaks: tuple[Peak, Peak] | None = None,
) -> BenchRecord:
    """Time `policy` (skip execution: gate threshold, zoo rule or given exits) against
    its dense twin, which runs every loop for every token with the same rule and readout.
    peaks: the two runs' memory, measured beforehand (run_grid); None measures it here."""
    _check_prefill_point(policy, dtype)
    device = ids.device
    if peaks is None:
        peaks = measured_peaks(
            prefill_peaks, [dict(model=model, ids=ids, policy=policy, packing=packing, dtype=dtype)]
        )[0]
    full, skip = _prefill_runs(model, ids, policy, packing, dtype)
    probe = skip()
    R = model.cfg.n_loops
    mean_loops = float(probe.exit_step.float().mean())
    for _ in range(warmup):
        full(), skip()
    t_full, t_skip = [], []
    for _ in range(repeats):  # alternate so that drifting background load hits both alike
        t_full.append(timed_seconds(full, device))
        t_skip.append(timed_seconds(skip, device))
    tf, ts = statistics.median(t_full), statistics.median(t_skip)
    resolved = packing if packing != "auto" else ("varlen" if model.cfg.arch == "mamba2" else "padded")
    mem_full, mem_skip = peaks
    return BenchRecord(
        batch=ids.shape[0],
        seq_len=ids.shape[1],
        policy="oracle" if oracle_mean is not None else policy.spec,
        oracle_mean=oracle_mean,
        packing=resolved,
        dtype=dtype,
        mean_executed_loops=mean_loops,
        ideal_speedup=R / mean_loops,
        batch_max_survivor_ratio=survivor_ratio(probe.exit_step, R),
        time_full_s=tf,
        time_skip_s=ts,
        speedup=tf / ts,
        speedup_min=min(f / s for f, s in zip(t_full, t_skip)),
        speedup_max=max(f / s for f, s in zip(t_full, t_skip)),
        time_full_min_s=min(t_full),
        time_full_max_s=max(t_full),
        time_skip_min_s=min(t_skip),
        time_skip_max_s=max(t_skip),
        peak_mem_full=mem_full.delta,
        peak_mem_skip=mem_skip.delta,
        peak_mem_abs_full=mem_full.absolute,
        peak_mem_abs_skip=mem_skip.absolute,
        device=str(device),
    )


def bench_grid_points(
    model,
    task,
    batches,
    seq_lens,
    policies,
    oracle_mean: float | None,
    seed: int,
    device: torch.device,
    new_tokens: int = 0,
) -> list[dict]:
    """Every (batch, seq_len) × policy point: held-out ids of seq_len + new_tokens
    tokens, and each skip policy, or given exits drawn for the oracle's mean."""
    points = []
    for batch in batches:
        for seq_len in seq_lens:
            ids = heldout_ids(model, task, batch, seq_len + new_tokens, seed).to(device)
            if oracle_mean is not None:
                rng = np.random.default_rng([seed, batch, seq_len] + ([new_tokens] if new_tokens else []))
                exit_at = oracle_exit_steps(rng, (ids.shape[0], ids.shape[1]), oracle_mean, model.cfg.n_loops).to(
                    device
                )
                point_policies = [ExitPolicy.given(exit_at)]
            else:
                point_policies = policies
            points += [dict(ids=ids, seq_len=seq_len, policy=p, oracle_mean=oracle_mean) for p in point_policies]
    return points


@dataclass(frozen=True)
class BenchGrid:
    """The points a benchmark times, prefill or decode: (batch, seq_len) × policy (skip
    policies, e.g. skip:0.4 or skip-entropy:2.0, or the oracle with `oracle_mean`
    executed loops on average), each timed `repeats` times after `warmup` untimed runs
    under `dtype`; `seed` draws the inputs and the oracle's exits."""

    batches: tuple[int, ...]
    seq_lens: tuple[int, ...]
    policies: tuple[ExitPolicy, ...] = ()
    oracle_mean: float | None = None
    warmup: int = 2
    repeats: int = 5
    dtype: str = "fp32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.oracle_mean is None and not self.policies:
            raise ConfigError(
                "bench needs skip policies or an oracle mean; allowed: --policies skip:0.2,0.4 (or "
                "skip-entropy:2.0) or --oracle-mean 2.0"
            )
        check_dtype(self.dtype)

    def points(self, model, task, device: torch.device, new_tokens: int = 0) -> list[dict]:
        """Each point's inputs and policy (bench_grid_points), drawn on `device`."""
        return bench_grid_points(
            model, task, self.batches, self.seq_lens, self.policies, self.oracle_mean, self.seed, device, new_tokens
        )


def run_grid(
    model,
    task,
    grid: BenchGrid,
    *,
    packing: str = "auto",
    device: torch.device | str = "cpu",
    on_record=None,
) -> list[BenchRecord]:
    """Every point of the grid's prefill, with `packing`'s survivor layout."""
    device = torch.device(device)
    model = model.to(device).eval()
    points = [
        {k: v for k, v in p.items() if k != "seq_len"}  # a prefill's length is its ids'
        for p in grid.points(model, task, device)
    ]
    for p in points:
        _check_prefill_point(p["policy"], grid.dtype)
    return time_grid(model, grid, points, prefill_peaks, bench_point, on_record, packing=packing)


def time_grid(model, grid: BenchGrid, points: list[dict], peaks_of, time_point, on_record=None, **settings) -> list:
    """Each point's memory first (`peaks_of`, every point in one child process on a CPU:
    measured_peaks), then its timing (`time_point`), in order, each record handed to
    `on_record` as it comes. settings: what every point shares (packing, attention fill)."""
    shared = dict(dtype=grid.dtype, **settings)
    peaks = measured_peaks(
        peaks_of, [dict(model=model, **shared, **{k: v for k, v in p.items() if k != "oracle_mean"}) for p in points]
    )
    records = []
    for point, point_peaks in zip(points, peaks):
        record = time_point(model, warmup=grid.warmup, repeats=grid.repeats, peaks=point_peaks, **shared, **point)
        records.append(record)
        if on_record:
            on_record(record)
    return records


# Memory columns: Δmem is the peak above the level before the call, peak the absolute
# peak during it (module docstring).
MEMORY_HEADER = "Δmem full  peak full  Δmem skip  peak skip"


def mib(nbytes: int, width: int = 9) -> str:
    return f"{nbytes / 2**20:{width - 1}.1f}M" if nbytes >= 0 else f"{'?':>{width}}"


def memory_columns(r) -> str:
    """A prefill's or a decode record's four memory columns (MEMORY_HEADER)."""
    return "  ".join(mib(b) for b in (r.peak_mem_full, r.peak_mem_abs_full, r.peak_mem_skip, r.peak_mem_abs_skip))


HEADER = (
    "batch  seq_len  policy            dtype  packing  loops  ideal  max/real  full s    skip s    speedup  "
    "of ideal  " + MEMORY_HEADER
)


def policy_label(r) -> str:
    """A record's policy as a table shows it: its spec, or the oracle's mean loops."""
    return r.policy if r.oracle_mean is None else f"oracle {r.oracle_mean:.2f}"


def format_record(r: BenchRecord) -> str:
    return (
        f"{r.batch:5d}  {r.seq_len:7d}  {policy_label(r):16s}  {r.dtype:5s}  {r.packing:7s}  "
        f"{r.mean_executed_loops:5.2f}  {r.ideal_speedup:5.2f}  {r.batch_max_survivor_ratio:8.3f}  "
        f"{r.time_full_s:8.4f}  {r.time_skip_s:8.4f}  {r.speedup:6.2f}x  {r.speedup / r.ideal_speedup:7.1%}  "
        f"{memory_columns(r)}"
    )


def records_as_dicts(records: list) -> list[dict]:  # prefill's BenchRecords or decode's DecodeRecords
    return [asdict(r) for r in records]
