"""The prefill speed sweep (sweeps/speed.py, trainables/speed.py, analysis/speed.py): the
FLOP bound by hand, the paper's grids in the dry run, bad flags as one line, and the
sweep end to end in this process on tiny checkpoints of a logged pipeline: one run per
point with the machine, a re-run that measures nothing, and the report's join of speed
to the stage's validation perplexity."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mlflow")
pytest.importorskip("polars")

import analysis_fixture as fx  # noqa: E402
import looplab  # noqa: E402
from looplab import tracking  # noqa: E402
from looplab.checkpoint import experiment_metadata  # noqa: E402
from looplab.policy import ExitPolicy  # noqa: E402
from looplab.resources import flop_bound, prefill_flops  # noqa: E402
from sweeps import speed  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the FLOP bound ------------------------------------------------------------------------------
def test_flop_bound_by_hand():
    from looplab.models.looped import LoopedLM
    from looplab.presets import get_preset

    cfg = get_preset("debug").model  # Mamba-2 d 64, vocab 259, R 4
    d, V, R, L = cfg.d_model, cfg.vocab_size, cfg.n_loops, 32
    f0, fr = prefill_flops(cfg, L)
    # the head once per sequence (2·d·V / L per token), the gate's logit (2·d) on every token after steps 1..R-1
    assert f0 == pytest.approx(2 * d * V / L + (R - 1) * 2 * d)
    with torch.device("meta"):
        step = LoopedLM(cfg).step_flops(L)
    assert fr == step  # one loop application: the backbone step, the mixers' own count (models/flops.py)
    # every position read out: the head per token; a zoo rule reads the head after each step instead of the gate
    assert prefill_flops(cfg, L, readout="all")[0] == pytest.approx(2 * d * V + (R - 1) * 2 * d)
    assert prefill_flops(cfg, L, ExitPolicy.parse("skip-entropy:2.0"))[0] == pytest.approx(2 * d * V / L
                                                                                          + (R - 1) * 2 * d * V)
    # (F0 + R·Fr)/(F0 + d̄·Fr), hand-computed: (100 + 4·50)/(100 + 2·50) = 1.5, below the loop bound 4/2
    assert flop_bound(100.0, 50.0, 4, 2.0) == 1.5
    assert flop_bound(0.0, 50.0, 4, 2.0) == 2.0 and flop_bound(100.0, 50.0, 4, 4.0) == 1.0


# ---- a logged pipeline with tiny checkpoints ---------------------------------------------------------
EXPERIMENT = "speed-debug"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The analysis fixture's two arms (Ouro, CHASE; one seed), logged as the platform
    does, with a debug checkpoint (a random gate, so tokens exit at different steps)
    in STORAGE/stages/<stage>-<key>/checkpoint for every stage, as a store moved with
    its folder has them."""
    root = tmp_path_factory.mktemp("speed")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    logged = fx.log_sweep(uri, root, EXPERIMENT, seeds=(0,))
    saved = {}
    for configs in logged["configs"].values():
        for cfg in configs:
            if cfg.stage_key() in saved:
                continue
            model = looplab.load_model("debug", seed=0)
            model.metadata = experiment_metadata(cfg)  # its lineage, and its task's held-out text
            with torch.no_grad():
                model.exit_gate.weight.copy_(10 * torch.randn(model.exit_gate.weight.shape,
                                                              generator=torch.Generator().manual_seed(1)))
                model.exit_gate.bias.fill_(1.0)
            path = root / "stages" / f"{cfg.stage}-{cfg.stage_key()}" / "checkpoint"
            model.save(path)
            saved[cfg.stage_key()] = cfg
    finals = {arm: configs[-1] for (arm, _, _), configs in logged["configs"].items()}
    return {"root": root, "uri": uri, "finals": finals}


def speed_runs(uri: str) -> list:
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name(EXPERIMENT).experiment_id
    return mc.search_runs([exp], filter_string=f"tags.{tracking.LEVEL} = '{tracking.BENCH}'", max_results=1000)


TINY = ["--batches", "2", "--seq-lens", "32", "--policies", "skip:0.2,0.6", "--repeats", "1", "--cpus", "1"]


def test_speed_sweep_end_to_end_inline(store, capsys):
    """Default stages: each arm's stage2; one run per (checkpoint, point) with the
    machine; the same command again measures nothing; the report puts each timed q
    beside the stage's validation perplexity under it and at full depth."""
    argv = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), "--no-ray", *TINY]
    assert speed.main(argv + ["--no-report"]) == 0
    out = capsys.readouterr().out
    runs = speed_runs(store["uri"])
    finals = {cfg.stage_key(): arm for arm, cfg in store["finals"].items()}
    assert len(runs) == 2 * 2 and {r.data.tags[tracking.STAGE_KEY] for r in runs} == set(finals)
    assert len({r.data.tags[tracking.SPEED_KEY] for r in runs}) == 4
    for r in runs:
        assert r.info.status == "FINISHED"
        assert r.data.tags[tracking.METHOD] == finals[r.data.tags[tracking.STAGE_KEY]]  # CHASE / Ouro
        params = r.data.params
        assert params[tracking.MACHINE_PARAM + "device"] == "cpu" and params[tracking.MACHINE_PARAM + "threads"] == "1"
        assert params[tracking.SPEED_PARAM + "batch"] == "2" and params[tracking.SPEED_PARAM + "seq_len"] == "32"
        m = r.data.metrics
        assert set(tracking.SPEED_METRICS) <= set(m)
        # the FLOP bound sits just below the loop bound (the head is read once per sequence)
        assert 1.0 <= m[tracking.FLOP_BOUND] <= m[tracking.LOOP_BOUND] + 1e-9
    assert "speedup / FLOP bound" in out and out.count(" no\n") == 4

    # again: everything is in the store; nothing is measured, and the runs are untouched
    ends = {r.info.run_id: r.info.end_time for r in runs}
    assert speed.main(argv) == 0
    captured = capsys.readouterr()
    assert "0 measured, 2 reused" in captured.err and captured.out.count(" yes\n") == 4
    again = speed_runs(store["uri"])
    assert {r.info.run_id: r.info.end_time for r in again} == ends

    # the report joined speed to quality by stage key (analysis_fixture's closed forms:
    # full depth ppl 100/R² = 6.25; skip at q: CHASE 10.5 + (1 - q), Ouro 10 + 50 (1 - q))
    import polars as pl

    folder = store["root"] / "analysis" / f"{EXPERIMENT}-speed"
    table = pl.read_csv(folder / "speed.csv")
    assert table.height == 4 and (folder / "speed.png").is_file()
    assert "Prefill speed against quality" in (folder / "report.html").read_text()
    for row in table.iter_rows(named=True):
        q = ExitPolicy.parse(row["policy"]).q
        expected = 10.5 + (1 - q) if row["method"] == "CHASE" else 10.0 + 50.0 * (1 - q)
        assert row["ppl"] == pytest.approx(expected) and row["ppl_full"] == pytest.approx(6.25)
        assert row["stage"] == "stage2" and row["tokens_per_s_skip"] == pytest.approx(2 * 32 / row["time_skip_s"])
        assert row["val_executed_loops"] == pytest.approx(fx.skip_loops(q))


def test_dry_run_lists_the_paper_grids(store, capsys):
    base = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), "--dry-run"]
    expected = {"table5-140m": "batch 1, 4, 8, 16, 64 × L 2048 × skip:0.2 skip:0.4 skip:0.6; bf16, packing padded",
                "table5-370m": "batch 4, 8, 16, 32, 64 × L 2048 × skip:0.2 skip:0.4 skip:0.6; bf16, packing padded",
                "table6": "batch 16 × L 256, 512, 1024, 2048, 3584 × skip:0.2 skip:0.4 skip:0.6; bf16, packing padded"}
    for grid, line in expected.items():
        assert speed.main(base + ["--grid", grid]) == 0
        out = capsys.readouterr().out
        assert line in out, out
        assert "2 checkpoint(s) × 15 point(s) = 30 measurement(s)" in out and "to measure now: 30" in out
    # the named stages instead of the default, and what the store has on this machine
    assert speed.main(base + ["--stages", "stage1,chase", *TINY]) == 0
    out = capsys.readouterr().out
    assert "2 checkpoint(s) × 2 point(s)" in out and "stage1-" in out and "chase-" in out and "stage2-" not in out


@pytest.mark.parametrize("extra, expected", [
    (["--grid", "table7"], "--grid='table7' is invalid; allowed: table5-140m | table5-370m | table6 | debug"),
    (["--batches", "0,4"], "--batches='0,4' is invalid"),
    (["--seq-lens", "x"], "--seq-lens='x' is invalid"),
    (["--policies", "dense:0.4"], "--policies='dense:0.4' is invalid; allowed: skip policies"),
    (["--policies", "skip:2"], "--policies='skip:2' is invalid"),
    (["--dtype", "fp16"], "--dtype='fp16' is invalid; allowed: fp32 | bf16"),
    (["--packing", "ragged"], "--packing='ragged' is invalid; allowed: auto | padded | varlen"),
    (["--repeats", "0"], "--repeats='0' is invalid; allowed: an integer >= 1"),
    (["--cpus", "0"], "--cpus='0' is invalid"),
    (["--cpus", "100000"], "--cpus='100000' is invalid; allowed: at most"),
    (["--gpus", "1"], "--gpus='1' is invalid; allowed: 0 here"),
    (["--stages", "stage9"], "--stages='stage9' is invalid"),
    (["--stages", "stage3,stage1"], "--stages='stage3,stage1' is invalid"),
    (["--stages", "pretrain", "--policies", "skip:0.4"], "--policies='skip:0.4' is invalid; allowed: policies that "
                                                         "apply to stage pretrain"),
    (["--experiment", "nope"], "--experiment='nope' is invalid"),
])
def test_bad_flags_are_one_line(store, extra, expected, capsys):
    import ray

    if extra[0] == "--gpus" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    argv = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), *extra]
    assert speed.main(argv) == 2  # not --dry-run: a missed check would measure
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {expected}"), err
    assert not ray.is_initialized()
