"""The skip-vs-full benchmark: oracle exits, survivor accounting, record fields."""

import numpy as np
import pytest
import torch

from looplab import load_model
from looplab.bench import bench_point, oracle_exit_steps, run_grid, survivor_ratio
from looplab.config import ConfigError
from looplab.policy import ExitPolicy


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


def test_bench_point_reports_consistent_figures():
    model = load_model("phop-debug", n_loops=4, d_model=32, chunk_size=16)
    ids = torch.randint(0, model.cfg.vocab_size, (4, 64))
    exit_at = oracle_exit_steps(np.random.default_rng(1), (4, 64), 2.0, 4)
    r = bench_point(model, ids, ExitPolicy.given(exit_at), warmup=0, repeats=1, oracle_mean=2.0)
    assert r.mean_executed_loops == pytest.approx(float(exit_at.float().mean()))
    assert r.ideal_speedup == pytest.approx(4 / r.mean_executed_loops)
    assert r.batch_max_survivor_ratio >= 1.0 and r.packing == "varlen"
    assert r.time_full_s > 0 and r.time_skip_s > 0 and r.speedup == pytest.approx(r.time_full_s / r.time_skip_s)


def test_grid_needs_a_policy():
    model = load_model("phop-debug", n_loops=4)
    with pytest.raises(ConfigError, match="oracle"):
        run_grid(model, None, batches=[1], seq_lens=[8])
    with pytest.raises(ConfigError, match="allowed: skip policies"):
        bench_point(model, torch.zeros(1, 8, dtype=torch.long), ExitPolicy.dense(0.5))


def test_bench_command_writes_records_and_logs_to_mlflow(tmp_path, capsys):
    pytest.importorskip("mlflow")
    import json

    from looplab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["bench", "--preset", "phop-debug", "--batch", "2", "--seq-len", "32", "--oracle-mean", "2.0",
                 "--repeats", "1", "--warmup", "0", "--json", str(tmp_path / "b.json"), "--tracking-uri", uri,
                 "n_loops=4"]) == 0
    records = json.loads((tmp_path / "b.json").read_text())
    assert len(records) == 1 and records[0]["batch"] == 2 and records[0]["oracle_mean"] == 2.0
    for key in ("batch", "seq_len", "policy", "mean_executed_loops", "ideal_speedup", "speedup", "peak_mem_full",
                "peak_mem_skip"):
        assert key in records[0]
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("looplab-bench").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert "b2_L32_oracle2.0.speedup" in runs[0].data.metrics


def test_decode_point_reports_consistent_figures():
    from looplab.bench import bench_decode_point

    model = load_model("phop-debug", n_loops=4, d_model=32, chunk_size=16)
    ids = torch.randint(0, model.cfg.vocab_size, (3, 40))
    exit_at = oracle_exit_steps(np.random.default_rng(1), (3, 40), 2.0, 4)
    r = bench_decode_point(model, ids, 32, ExitPolicy.given(exit_at), warmup=0, repeats=1, oracle_mean=2.0)
    assert (r.batch, r.seq_len, r.new_tokens, r.kind) == (3, 32, 8, "decode")
    assert r.mean_executed_loops == pytest.approx(float(exit_at[:, 32:].float().mean()))  # the new tokens' exits
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
    assert main(["bench", "--decode", "--preset", "phop-debug", "--batch", "2", "--seq-len", "16,48",
                 "--new-tokens", "4", "--oracle-mean", "2.0", "--repeats", "1", "--warmup", "0",
                 "--json", str(tmp_path / "d.json"), "--tracking-uri", uri, "n_loops=4"]) == 0
    records = json.loads((tmp_path / "d.json").read_text())
    assert [(r["seq_len"], r["new_tokens"], r["kind"]) for r in records] == [(16, 4, "decode"), (48, 4, "decode")]
    assert records[0]["cache_bytes"] == records[1]["cache_bytes"]  # Mamba-2 states: no growth with the context
    assert "per-token time at context 48 / 16" in capsys.readouterr().err
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("looplab-bench").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert {"decode_b2_L16_oracle2.0.tokens_per_s_skip", "decode_b2_L48_oracle2.0.loops_speedup"} <= set(
        runs[0].data.metrics)
