"""The prefill speed sweep (sweeps/bench.py, trainables/bench.py, analysis/bench.py): the
FLOP ratio by hand, the paper's grids in the dry run, bad flags as one line, and the
sweep end to end in this process on tiny checkpoints of a logged pipeline: one run per
point with the machine, a re-run that measures nothing, and the report's join of speed
to the stage's validation perplexity; with --arrivals, decoding under continuous arrivals:
one run per (checkpoint, slots, schedule, policy, stream), its FLOP ratio the library's
for the measured d̄, nothing re-measured on a re-run, and arrivals.csv beside speed.csv."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mlflow")
pytest.importorskip("polars")

import analysis_fixture as fx

import looplab
from looplab import tracking
from looplab.checkpoint import experiment_metadata, read_model_config, save_model
from looplab.costs.resources import flop_ratio, prefill_flops
from looplab.policy import ExitPolicy
from sweeps import bench

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the FLOP ratio ------------------------------------------------------------------------------
def test_flop_ratio_by_hand():
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
    assert prefill_flops(cfg, L, ExitPolicy.parse("skip-entropy:2.0"))[0] == pytest.approx(
        2 * d * V / L + (R - 1) * 2 * d * V
    )
    # (F0 + R·Fr)/(F0 + d̄·Fr), hand-computed: (100 + 4·50)/(100 + 2·50) = 1.5, below the loop bound 4/2
    assert flop_ratio(100.0, 50.0, 4, 2.0) == 1.5
    assert flop_ratio(0.0, 50.0, 4, 2.0) == 2.0 and flop_ratio(100.0, 50.0, 4, 4.0) == 1.0


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
                model.exit_gate.weight.copy_(
                    10 * torch.randn(model.exit_gate.weight.shape, generator=torch.Generator().manual_seed(1))
                )
                model.exit_gate.bias.fill_(1.0)
            path = root / "stages" / f"{cfg.stage}-{cfg.stage_key()}" / "checkpoint"
            save_model(model, path)
            saved[cfg.stage_key()] = cfg
    finals = {arm: configs[-1] for (arm, _, _), configs in logged["configs"].items()}
    return {"root": root, "uri": uri, "finals": finals}


def speed_runs(uri: str) -> list:
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name(EXPERIMENT).experiment_id
    return mc.search_runs([exp], filter_string=f"tags.{tracking.LEVEL} = '{tracking.BENCH}'", max_results=1000)


TINY = ["--batches", "2", "--seq-lens", "32", "--policies", "skip:0.2,0.6", "--repeats", "1", "--cpus", "1"]


@pytest.mark.slow  # 14 s on 2 cores (the arrivals sweep's end-to-end test stays in the suite)
def test_speed_sweep_end_to_end_inline(store, capsys):
    """Default stages: each arm's stage2; one run per (checkpoint, point) with the
    machine; the same command again measures nothing; the report puts each timed q
    beside the stage's validation perplexity under it and at full depth."""
    argv = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), "--no-ray", *TINY]
    assert bench.main(argv + ["--no-report"]) == 0
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
        # the FLOP ratio sits just below the loop bound (the head is read once per sequence)
        assert 1.0 <= m[tracking.FLOP_RATIO] <= m[tracking.LOOP_BOUND] + 1e-9
    assert "speedup / FLOP ratio" in out and out.count(" no\n") == 4

    # again: everything is in the store; nothing is measured, and the runs are untouched
    ends = {r.info.run_id: r.info.end_time for r in runs}
    assert bench.main(argv) == 0
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
    expected = {
        "table5-140m": "batch 1, 4, 8, 16, 64 × L 2048 × skip:0.2 skip:0.4 skip:0.6; bf16, packing padded",
        "table5-370m": "batch 4, 8, 16, 32, 64 × L 2048 × skip:0.2 skip:0.4 skip:0.6; bf16, packing padded",
        "table6": "batch 16 × L 256, 512, 1024, 2048, 3584 × skip:0.2 skip:0.4 skip:0.6; bf16, packing padded",
    }
    for grid, line in expected.items():
        assert bench.main(base + ["--grid", grid]) == 0
        out = capsys.readouterr().out
        assert line in out, out
        assert "2 checkpoint(s) × 15 point(s) = 30 measurement(s)" in out and "to measure now: 30" in out
    # the named stages instead of the default, and what the store has on this machine
    assert bench.main(base + ["--stages", "stage1,chase", *TINY]) == 0
    out = capsys.readouterr().out
    assert "2 checkpoint(s) × 2 point(s)" in out and "stage1-" in out and "chase-" in out and "stage2-" not in out


@pytest.mark.parametrize(
    "extra, expected",
    [
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
        (
            ["--stages", "pretrain", "--policies", "skip:0.4"],
            "--policies='skip:0.4' is invalid; allowed: policies that apply to stage pretrain",
        ),
        (["--experiment", "nope"], "--experiment='nope' is invalid"),
        (["--slots", "2"], "--slots='2' is invalid; allowed: --slots together with --arrivals"),
        (["--arrivals", "--slots", "0"], "--slots='0' is invalid"),
        (["--arrivals", "--requests", "x"], "--requests='x' is invalid; allowed: an integer >= 1"),
        (["--arrivals", "--prompt-len", "8-4"], "--prompt-len='8-4' is invalid; allowed: LOW-HIGH or N"),
        (["--arrivals", "--new-tokens", "0"], "--new-tokens='0' is invalid; allowed: LOW-HIGH or N"),
        (
            ["--arrivals", "--schedules", "eager"],
            "--schedules='eager' is invalid; allowed: comma-separated: lockstep | depth",
        ),
    ],
)
def test_bad_flags_are_one_line(store, extra, expected, capsys):
    import ray

    if extra[0] == "--gpus" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    argv = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), *extra]
    assert bench.main(argv) == 2  # not --dry-run: a missed check would measure
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {expected}"), err
    assert not ray.is_initialized()


# ---- decoding under continuous arrivals (--arrivals) --------------------------------------------------
ARRIVALS = [
    "--arrivals",
    "--slots",
    "2",
    "--requests",
    "3",
    "--prompt-len",
    "4-8",
    "--new-tokens",
    "2-4",
    "--schedules",
    "lockstep,depth",
]


def arrival_runs(uri: str) -> list:
    return [r for r in speed_runs(uri) if tracking.SPEED_PARAM + "slots" in r.data.params]


@pytest.mark.slow  # 16 s on 2 cores: .ci/run's slow tier
def test_arrivals_sweep_end_to_end_inline(store, capsys, monkeypatch):
    """Per checkpoint, full and each policy under each schedule: one FINISHED run per
    point with the machine, its FLOP ratio flop_ratio(prefill_flops(..., readout all)) at
    the stream's mean context for the logged d̄; the same command again measures nothing
    and leaves the runs as they were; the report folder gets arrivals.csv, and speed.csv
    keeps the prefill points only."""
    from looplab.inference.arrivals import RequestStream
    from looplab.tracking import ARRIVAL_METRICS, DECODE_TOKENS_PER_S

    argv = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), "--no-ray", *TINY, *ARRIVALS]
    assert bench.main(argv + ["--no-report"]) == 0
    out = capsys.readouterr().out
    runs = arrival_runs(store["uri"])
    finals = {cfg.stage_key(): arm for arm, cfg in store["finals"].items()}
    assert len(runs) == 2 * 2 * 3  # checkpoints × schedules × (full, skip:0.2, skip:0.6)
    assert len({r.data.tags[tracking.SPEED_KEY] for r in runs}) == len(runs)
    points = {
        (
            r.data.tags[tracking.STAGE_KEY],
            r.data.params[tracking.SPEED_PARAM + "schedule"],
            r.data.tags[tracking.POLICY_TAG],
        )
        for r in runs
    }
    assert points == {
        (k, schedule, p) for k in finals for schedule in ("lockstep", "depth") for p in ("full", "skip:0.2", "skip:0.6")
    }
    stream = RequestStream(3, (4, 8), (2, 4))
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags[tracking.LEVEL] == tracking.BENCH
        assert r.data.tags[tracking.METHOD] == finals[r.data.tags[tracking.STAGE_KEY]]
        params = r.data.params
        assert params[tracking.MACHINE_PARAM + "device"] == "cpu" and params[tracking.MACHINE_PARAM + "threads"] == "1"
        assert (
            params[tracking.SPEED_PARAM + "slots"],
            params[tracking.SPEED_PARAM + "prompt_len"],
            params[tracking.SPEED_PARAM + "new_tokens"],
        ) == ("2", "4-8", "2-4")
        m = r.data.metrics
        assert set(ARRIVAL_METRICS) <= set(m) and m[DECODE_TOKENS_PER_S] > 0
        policy = ExitPolicy.parse(r.data.tags[tracking.POLICY_TAG])
        cfg = read_model_config(r.data.tags[tracking.CHECKPOINT])
        f0, fr = prefill_flops(cfg, round(stream.mean_context), policy, readout="all")
        assert m[tracking.FLOP_RATIO] == pytest.approx(flop_ratio(f0, fr, cfg.n_loops, m[tracking.MEAN_LOOPS]))
        assert m[tracking.LOOP_BOUND] == pytest.approx(cfg.n_loops / m[tracking.MEAN_LOOPS])
        if policy.spec == "full":  # the baseline: every loop, its own speedup
            assert m[tracking.MEAN_LOOPS] == cfg.n_loops and m[tracking.SPEEDUP] == 1.0
    arrivals_summary = out.split("decoding under continuous arrivals")[1]
    assert arrivals_summary.count(" no\n") == 12 and "speedup / FLOP ratio" in arrivals_summary
    dry = ["--experiment", EXPERIMENT, "--storage-path", str(store["root"]), "--dry-run", *TINY, *ARRIVALS]
    assert bench.main(dry) == 0
    plan = capsys.readouterr().out
    assert "2 checkpoint(s) × 8 point(s) = 16 measurement(s); 16 in the store" in plan and "to measure now: 0" in plan

    # again: nothing is measured (the benchmark is never called) and the runs are untouched
    def not_again(*args, **kwargs):
        raise AssertionError("an arrivals point was measured again")

    monkeypatch.setattr("looplab.costs.arrival_bench.bench_arrivals", not_again)
    ends = {r.info.run_id: r.info.end_time for r in runs}
    assert bench.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("0 measured, 8 reused") == 2 and captured.out.count(" yes\n") == 4 + 12, captured.err
    assert {r.info.run_id: r.info.end_time for r in arrival_runs(store["uri"])} == ends

    import polars as pl

    folder = store["root"] / "analysis" / f"{EXPERIMENT}-speed"
    assert (folder / "arrivals.csv").is_file(), captured.err
    table = pl.read_csv(folder / "arrivals.csv")
    assert table.height == 12 and (folder / "arrivals.png").is_file()
    assert pl.read_csv(folder / "speed.csv").height == 4  # the prefill points alone
    by_run = {
        (
            r.data.tags[tracking.STAGE_KEY],
            r.data.params[tracking.SPEED_PARAM + "schedule"],
            r.data.tags[tracking.POLICY_TAG],
        ): r.data.metrics
        for r in runs
    }
    for row in table.iter_rows(named=True):
        m = by_run[row["stage_key"], row["schedule"], row["policy"]]
        assert row["flop_ratio"] == pytest.approx(m[tracking.FLOP_RATIO])
        assert row["of_flop_ratio"] == pytest.approx(m[tracking.SPEEDUP] / m[tracking.FLOP_RATIO])
        assert row[DECODE_TOKENS_PER_S] == pytest.approx(m[DECODE_TOKENS_PER_S])
        # against the fastest full of the checkpoint's stream (one slot count here), whichever schedule
        best = max(
            metrics[DECODE_TOKENS_PER_S]
            for (key, _, policy), metrics in by_run.items()
            if key == row["stage_key"] and policy == "full"
        )
        assert row["vs_best_full"] == pytest.approx(m[DECODE_TOKENS_PER_S] / best)
        assert row["realised"] == pytest.approx(m[DECODE_TOKENS_PER_S] / best / m[tracking.FLOP_RATIO])


def test_an_arrivals_key_is_its_own():
    """An arrivals point never shares a prefill point's key, and the machine and the
    timing settings enter it."""
    from trainables.bench import ArrivalPoint, SpeedPoint, arrival_key, machine, speed_key

    point = ArrivalPoint(2, "depth", "skip:0.4", 3, (4, 8), (2, 4))
    host = machine("cpu", 1)
    key = arrival_key("abc", point, host, 1, 1)
    assert key != speed_key("abc", SpeedPoint(2, 8, "skip:0.4"), host, 1)
    assert key != arrival_key("abc", point, machine("cpu", 2), 1, 1)
    assert key != arrival_key("abc", point, host, 0, 1) != arrival_key("abc", point, host, 1, 3)
    assert key == arrival_key("abc", ArrivalPoint(2, "depth", "skip:0.4", 3, (4, 8), (2, 4)), host, 1, 1)


def test_the_report_says_in_one_sentence_where_skipping_pays():
    """where_skipping_pays names every policy faster than the best full schedule, or
    the closest one where none is, and nothing without a policy read against full."""
    import polars as pl

    from analysis.bench import where_skipping_pays

    def table(rows):
        cols = ("checkpoint", "slots", "schedule", "policy", "vs_best_full", "realised")
        return pl.DataFrame([dict(zip(cols, r)) for r in rows], orient="row")

    full = [("ck", 8, "lockstep", "full", 1.0, 1.0), ("ck", 8, "depth", "full", 0.76, 0.76)]
    pays = table([*full, ("ck", 8, "depth", "skip:0.4", 1.04, 0.69), ("ck", 8, "lockstep", "skip:0.4", 0.24, 0.16)])
    assert where_skipping_pays(pays) == (
        "Skipping beats the best full schedule at skip:0.4 on depth at 8 slots "
        "(ck: 1.04× the best full, 69% of its FLOP ratio)."
    )
    slower = table([*full, ("ck", 32, "depth", "skip:0.4", 0.5, 0.3), ("ck", 32, "lockstep", "skip:0.4", 0.7, 0.4)])
    assert where_skipping_pays(slower) == (
        "Skipping decodes slower than the best full schedule everywhere here; closest: skip:0.4 on lockstep at "
        "32 slots (ck: 0.70× the best full, 40% of its FLOP ratio)."
    )
    assert where_skipping_pays(table(full)) is None
