"""The skip-vs-full benchmark: oracle exits, survivor accounting, record fields,
dtypes (bf16 autocast on a CPU) and peak memory."""

import math
import os

import numpy as np
import pytest
import torch
from test_models import ARCHS, tiny

from looplab import load_model
from looplab.config import ConfigError
from looplab.costs.decode_timing import bench_decode_point
from looplab.costs.measured_memory import UNKNOWN_PEAK, in_rss_process, peak_memory
from looplab.costs.timing import (
    BenchGrid,
    bench_point,
    oracle_exit_steps,
    survivor_ratio,
    under_dtype,
)
from looplab.models.looped import LoopedLM
from looplab.policy import ExitPolicy

CPU = torch.device("cpu")


def test_oracle_exit_steps_have_the_requested_mean_and_range():
    for mean in (1.0, 1.6, 2.0, 3.3, 4.0):
        steps = oracle_exit_steps(np.random.default_rng(0), (64, 512), mean, n_loops=4)
        assert steps.min() >= 1 and steps.max() <= 4
        assert float(steps.float().mean()) == pytest.approx(mean, abs=0.02)
    with pytest.raises(ValueError, match="oracle_mean"):
        oracle_exit_steps(np.random.default_rng(0), (2, 2), 4.5, n_loops=4)


def test_survivor_ratio_by_hand():
    exit_step = torch.tensor([[1, 1, 4, 4], [2, 2, 2, 2]])
    # survivors per row at r = 1..4: (4, 4), (2, 4), (2, 0), (2, 0)
    # padded work: 2·(4 + 4 + 2 + 2) = 24; real work: 8 + 6 + 2 + 2 = 18
    assert survivor_ratio(exit_step, 4) == pytest.approx(24 / 18)


UNMEASURED = (UNKNOWN_PEAK, UNKNOWN_PEAK)  # for tests not about memory: no child process to measure it


def test_bench_point_reports_consistent_figures():
    model = load_model("phop-debug", n_loops=4, d_model=32, chunk_size=16)
    ids = torch.randint(0, model.cfg.vocab_size, (4, 64))
    exit_at = oracle_exit_steps(np.random.default_rng(1), (4, 64), 2.0, 4)
    r = bench_point(model, ids, ExitPolicy.given(exit_at), warmup=0, repeats=1, oracle_mean=2.0, peaks=UNMEASURED)
    assert r.mean_executed_loops == pytest.approx(float(exit_at.float().mean()))
    assert r.ideal_speedup == pytest.approx(4 / r.mean_executed_loops)
    assert r.batch_max_survivor_ratio >= 1.0 and r.packing == "varlen" and r.dtype == "fp32"
    assert r.time_full_s > 0 and r.time_skip_s > 0 and r.speedup == pytest.approx(r.time_full_s / r.time_skip_s)
    padded = bench_point(model, ids, ExitPolicy.given(exit_at), warmup=0, repeats=1, packing="padded", peaks=UNMEASURED)
    assert padded.packing == "padded"  # the paper's layout, as asked


def measured_peaks_hold(r) -> bool:
    """The absolute peak is at least the delta peak; both -1 where unmeasurable."""
    pairs = [(r.peak_mem_full, r.peak_mem_abs_full), (r.peak_mem_skip, r.peak_mem_abs_skip)]
    return all(pair == (-1, -1) or abs_ >= delta >= 0 for pair in pairs for delta, abs_ in [pair])


def test_peak_memory_sees_an_allocation_and_its_absolute_peak_is_at_least_the_delta():
    peak = peak_memory(lambda: torch.ones(16, 2**20), CPU)  # 64 MiB, touched
    if peak.delta == -1:
        pytest.skip("no RSS peak on this platform")
    assert peak.delta >= 60 * 2**20 and peak.absolute > peak.delta  # the process held memory before the call


def _rss_setting_and_peak():
    return os.environ.get("MALLOC_MMAP_THRESHOLD_"), peak_memory(lambda: torch.ones(16, 2**20), CPU)


def test_cpu_memory_is_measured_in_a_child_with_a_fixed_mmap_threshold_and_the_caller_keeps_its_allocator():
    before = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    setting, peak = in_rss_process(_rss_setting_and_peak)
    assert setting == str(128 * 1024)  # the child's glibc maps every large block from its start
    assert os.environ.get("MALLOC_MMAP_THRESHOLD_") == before  # timing here stays under the default allocator
    if peak.delta != -1:
        assert peak.delta >= 60 * 2**20


def test_under_dtype_runs_bf16_autocast_on_cpu():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    assert under_dtype(lambda: layer(x), CPU, "bf16")().dtype == torch.bfloat16
    assert under_dtype(lambda: layer(x), CPU, "fp32")().dtype == torch.float32


@pytest.mark.parametrize("arch", ["mamba2", "transformer", "hybrid"])
def test_bf16_prefill_and_decode_run_on_cpu_with_the_fp32_exits(arch, monkeypatch):
    """Every backbone runs under CPU bf16 autocast; given (oracle) exits make skip run
    exactly the loops it runs in fp32, so the records' loops agree."""
    monkeypatch.delenv("LOOPLAB_CPU_STEP_KERNEL", raising=False)
    torch.manual_seed(0)
    model = LoopedLM(tiny(n_loops=4, **ARCHS[arch])).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 24))
    exit_at = oracle_exit_steps(np.random.default_rng(2), (2, 24), 2.0, 4)
    policy = ExitPolicy.given(exit_at)
    peaks = None if arch == "mamba2" else UNMEASURED  # memory in both dtypes once (a child process each)
    prefill = {
        dtype: bench_point(model, ids, policy, warmup=0, repeats=1, oracle_mean=2.0, dtype=dtype, peaks=peaks)
        for dtype in ("fp32", "bf16")
    }
    decode = {
        dtype: bench_decode_point(
            model, ids, 16, policy, warmup=0, repeats=1, oracle_mean=2.0, dtype=dtype, peaks=peaks
        )
        for dtype in ("fp32", "bf16")
    }
    for records in (prefill, decode):
        assert [r.dtype for r in records.values()] == ["fp32", "bf16"]
        assert records["bf16"].mean_executed_loops == records["fp32"].mean_executed_loops
        for r in records.values():
            assert all(
                math.isfinite(x) and x > 0 for x in (r.time_full_s, r.time_skip_s, r.speedup, r.mean_executed_loops)
            )
            assert measured_peaks_hold(r)
    assert prefill["bf16"].mean_executed_loops == pytest.approx(float(exit_at.float().mean()))
    # Which Mamba-2 step decoding ran: the torch one (the compiled CPU step is opt-in), none for a Transformer.
    assert {r.mamba_step for r in decode.values()} == {"-" if arch == "transformer" else "torch"}
    assert prefill["bf16"].packing == ("varlen" if arch == "mamba2" else "padded")


def test_a_missing_bf16_kernel_is_a_one_line_dtype_error(monkeypatch, capsys):
    """Where the device lacks a bf16 kernel the model needs, bench says so about
    --dtype instead of a traceback; fp32 runs never have theirs rewritten."""
    from looplab.cli import main

    def no_bf16(self, *args, **kwargs):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'BFloat16'\nmore detail")

    monkeypatch.setattr(LoopedLM, "forward", no_bf16)
    model = load_model("phop-debug", n_loops=4)
    ids, policy = torch.zeros(1, 8, dtype=torch.long), ExitPolicy.given(torch.full((1, 8), 2))
    with pytest.raises(ConfigError, match="dtype='bf16' is invalid; allowed: fp32 .*addmm_impl_cpu_"):
        bench_point(model, ids, policy, warmup=0, repeats=1, dtype="bf16", peaks=UNMEASURED)
    with pytest.raises(RuntimeError, match="BFloat16"):
        bench_point(model, ids, policy, warmup=0, repeats=1, dtype="fp32", peaks=UNMEASURED)
    with pytest.raises(ConfigError, match="dtype='fp16' is invalid; allowed: fp32 | bf16"):
        bench_point(model, ids, policy, dtype="fp16")
    assert (
        main(
            [
                "bench",
                "--preset",
                "phop-debug",
                "--batch",
                "1",
                "--seq-len",
                "8",
                "--oracle-mean",
                "2",
                "--dtype",
                "bf16",
                "n_loops=4",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("looplab: error: --dtype='bf16' is invalid; allowed: fp32 (bf16 autocast fails on cpu")


def test_grid_needs_a_policy():
    model = load_model("phop-debug", n_loops=4)
    with pytest.raises(ConfigError, match="oracle"):
        BenchGrid((1,), (8,))
    with pytest.raises(ConfigError, match="allowed: skip policies"):
        bench_point(model, torch.zeros(1, 8, dtype=torch.long), ExitPolicy.dense(0.5))


def test_bench_command_writes_records_and_logs_to_mlflow(tmp_path, capsys):
    pytest.importorskip("mlflow")
    import json

    from looplab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert (
        main(
            [
                "bench",
                "--preset",
                "phop-debug",
                "--batch",
                "2",
                "--seq-len",
                "32",
                "--oracle-mean",
                "2.0",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--json",
                str(tmp_path / "b.json"),
                "--tracking-uri",
                uri,
                "n_loops=4",
            ]
        )
        == 0
    )
    records = json.loads((tmp_path / "b.json").read_text())
    assert len(records) == 1 and records[0]["batch"] == 2 and records[0]["oracle_mean"] == 2.0
    for key in (
        "batch",
        "seq_len",
        "policy",
        "mean_executed_loops",
        "ideal_speedup",
        "speedup",
        "peak_mem_full",
        "peak_mem_skip",
        "peak_mem_abs_full",
        "peak_mem_abs_skip",
    ):
        assert key in records[0]
    assert (records[0]["dtype"], records[0]["packing"]) == ("fp32", "varlen")
    notice, header, row = capsys.readouterr().err.splitlines()[:3]
    assert "peak memory first, in a separate process" in notice
    assert "dtype  packing" in header and "Δmem full  peak full  Δmem skip  peak skip" in header
    assert " fp32 " in row and " varlen " in row
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("looplab-bench").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert {"b2_L32_oracle2.0.speedup", "b2_L32_oracle2.0.peak_mem_abs_skip"} <= set(runs[0].data.metrics)
    assert runs[0].info.run_name == "bench-phop-debug-fp32"


def test_decode_point_reports_consistent_figures():
    from looplab.costs.decode_timing import bench_decode_point

    model = load_model("phop-debug", n_loops=4, d_model=32, chunk_size=16)
    ids = torch.randint(0, model.cfg.vocab_size, (3, 40))
    exit_at = oracle_exit_steps(np.random.default_rng(1), (3, 40), 2.0, 4)
    r = bench_decode_point(
        model, ids, 32, ExitPolicy.given(exit_at), warmup=0, repeats=1, oracle_mean=2.0, peaks=UNMEASURED
    )
    assert (r.batch, r.seq_len, r.new_tokens, r.kind) == (3, 32, 8, "decode")
    assert r.mean_executed_loops == pytest.approx(float(exit_at[:, 32:].float().mean()))  # the new tokens' exits
    # Lockstep: each new token costs the batch its deepest token's loops; depth: no row
    # ever waits, so the steps are the busiest row's loops.
    assert r.steps_skip == pytest.approx(float(exit_at[:, 32:].max(0).values.float().mean()))
    d = bench_decode_point(
        model,
        ids,
        32,
        ExitPolicy.given(exit_at),
        warmup=0,
        repeats=1,
        oracle_mean=2.0,
        peaks=UNMEASURED,
        schedule="depth",
    )
    assert d.schedule == "depth" and d.mean_executed_loops == r.mean_executed_loops
    assert d.steps_skip == pytest.approx(float(exit_at[:, 32:].sum(1).max()) / 8)
    assert r.ideal_speedup == pytest.approx(4 / r.mean_executed_loops)
    assert r.speedup == pytest.approx(r.time_full_s / r.time_skip_s)
    assert r.tokens_per_s_skip == pytest.approx(3 / r.time_skip_s)
    assert r.loops_speedup == pytest.approx(r.loops_time_full_s / r.loops_time_skip_s) and r.cache_bytes > 0
    with pytest.raises(ConfigError, match="new_tokens=0 is invalid"):
        bench_decode_point(model, ids, 40, ExitPolicy.given(exit_at))


def test_bench_decode_command_writes_records_and_logs_to_mlflow(tmp_path, capsys):
    pytest.importorskip("mlflow")
    import json

    from looplab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert (
        main(
            [
                "bench",
                "--decode",
                "--preset",
                "phop-debug",
                "--batch",
                "2",
                "--seq-len",
                "16,48",
                "--new-tokens",
                "4",
                "--oracle-mean",
                "2.0",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--dtype",
                "bf16",
                "--schedule",
                "lockstep,depth",
                "--compile",
                "off",
                "--json",
                str(tmp_path / "d.json"),
                "--tracking-uri",
                uri,
                "n_loops=4",
            ]
        )
        == 0
    )
    records = json.loads((tmp_path / "d.json").read_text())
    assert [(r["seq_len"], r["schedule"], r["kind"]) for r in records] == [
        (16, "lockstep", "decode"),
        (16, "depth", "decode"),
        (48, "lockstep", "decode"),
        (48, "depth", "decode"),
    ]
    assert records[0]["cache_bytes"] == records[2]["cache_bytes"]  # Mamba-2 states: no growth with the context
    # The same exits: the same mean loops; depth batching never takes more steps than lockstep.
    for lock, depth in (records[:2], records[2:]):
        assert lock["mean_executed_loops"] == depth["mean_executed_loops"]
        assert depth["steps_skip"] <= lock["steps_skip"] <= 4
    assert all(r["dtype"] == "bf16" and r["peak_mem_abs_skip"] >= r["peak_mem_skip"] for r in records)
    err = capsys.readouterr().err
    assert "per-token time at context 48 / 16" in err
    assert "peak full" in err.splitlines()[1] and " bf16 " in err.splitlines()[2]
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("looplab-bench").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert {
        "decode_b2_L16_oracle2.0.tokens_per_s_skip",
        "decode_b2_L48_oracle2.0.loops_speedup",
        "decode_b2_L48_oracle2.0_depth.steps_skip",
    } <= set(runs[0].data.metrics)
