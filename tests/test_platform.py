"""The platform layer: sweep input checks before Ray, dry runs, the MLflow conventions,
and one tiny β sweep end to end on a local Ray (the cluster files: tests/test_cluster.py).

Tests that start Ray are marked `ray`: the end-to-end β sweep (two data-parallel
workers, stage reuse, a rerun that trains only its new point, in local mode; ~3
minutes on 2 cores) runs by default. The fault-injection, two-node and Optuna/ASHA
tests are also marked `slow` (~6 minutes together): `python -m pytest -m slow`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from looplab import tracking
from looplab.presets import get_preset
from sweeps import beta_ablation as beta
from sweeps.launch import main

REPO = Path(__file__).resolve().parents[1]

TINY = [
    "--preset",
    "phop-debug",
    "--set",
    "train.steps=4",
    "--set",
    "train.eval_limit=16",
    "--set",
    "train.log_every=2",
    "--set",
    "train.eval_every=0",
]


def run_beta(argv, betas=(0.1, 0.5)):
    return main("test", beta.add_flags, lambda common, args: beta.beta_ablation(common, list(betas)), argv)


@pytest.mark.parametrize(
    "argv, betas, field",
    [
        (["--preset", "nope"], (0.1,), "--preset='nope'"),
        (["--preset", "phop-debug"], (), "grid.beta=[]"),
        (["--preset", "phop-debug"], (-0.1, 0.5), "--betas=-0.1"),
        (["--preset", "phop-debug", "--num-workers", "64"], (0.1,), "--num-workers=64"),
        (["--preset", "phop-debug", "--num-workers", "-1"], (0.1,), "--num-workers=-1"),
        (["--preset", "phop-debug", "--gpus-per-worker", "1"], (0.1,), "--gpus-per-worker=1.0"),
        (["--preset", "phop-debug", "--seeds", "a"], (0.1,), "--seeds='a'"),
        (
            ["--preset", "phop-debug", "--cpus-per-worker", "1.5", "--max-concurrent-trials", "2"],
            (0.1,),
            "--max-concurrent-trials=2",
        ),
    ],
)
def test_bad_sweep_input_is_one_line_before_ray(argv, betas, field, capsys):
    import ray

    if field.startswith("--gpus") and __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert run_beta(argv + ["--dry-run"], betas) == 2  # --dry-run: a missed check never launches a sweep
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {field} is invalid; allowed:"), err
    assert not ray.is_initialized()


def test_summary_columns_name_evaluated_thresholds():
    from sweeps.sweep import Sweep
    from trainables.pipeline import PipelineSpec

    spec = PipelineSpec(preset="phop-debug", stages=("pretrain",))
    Sweep(name="ok", spec=spec, grid={"seed": [0]}, columns=("skip_q0.4_ppl", "forced_d2_ppl"))
    with pytest.raises(ValueError, match="q=0.5"):  # not in the evaluation's q grid: an always-empty column
        Sweep(name="bad", spec=spec, grid={"seed": [0]}, columns=("skip_q0.5_ppl",))


def test_unreachable_tracking_server_is_one_line_before_ray(tmp_path, capsys):
    import ray

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = TINY + ["--tracking-uri", f"http://127.0.0.1:{port}", "--storage-path", str(tmp_path)]
    start = time.monotonic()
    assert run_beta(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: --tracking-uri='http://127.0.0.1:{port}' is invalid"), err
    assert not ray.is_initialized() and time.monotonic() - start < 60  # not MLflow's minutes of retries


def test_ray_address_answers_or_is_refused(monkeypatch):
    """HOST:PORT and ray://HOST:PORT pass while a gRPC server answers there (as Ray's GCS
    and Ray Client do; here grpcio's own), and not after; a port that accepts but is a web
    server or says nothing is refused in one line; "" (a local Ray) and "auto" (Ray finds
    the cluster) are left to Ray."""
    import http.server
    import threading
    from concurrent import futures

    import grpc

    from looplab.errors import ConfigError
    from sweeps import runtime
    from sweeps.runtime import check_ray_address

    monkeypatch.setattr(runtime, "RAY_CONNECT_SECONDS", 0.5)
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", "", "auto"):
        check_ray_address("--address", address)
    server.stop(None).wait()
    with pytest.raises(ConfigError, match="connecting to 127.0.0.1"):
        check_ray_address("--address", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_ray_address("--address", "ray://:10001")
    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with pytest.raises(ConfigError, match="answers, but not as a gRPC server would"):
        check_ray_address("--address", f"127.0.0.1:{web.server_port}")
    web.shutdown()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        with pytest.raises(ConfigError, match="says nothing to a gRPC client"):
            check_ray_address("--address", f"127.0.0.1:{silent.getsockname()[1]}")


def test_a_dry_run_checks_the_ray_address_as_the_run_does(tmp_path, capsys):
    """A dry run that passes means the run starts: a port that answers but is not Ray is
    refused by the dry run too, in one line (before: exit 0, and the run then failed)."""
    import http.server
    import threading

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the server's own lines would share stderr with the sweep's
            pass

    web = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        argv = TINY + ["--storage-path", str(tmp_path / "s"), "--address", f"127.0.0.1:{web.server_port}", "--dry-run"]
        assert run_beta(argv) == 2
    finally:
        web.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --address='127.0.0.1:{web.server_port}' is invalid"), err


@pytest.mark.parametrize(
    "address, allowed",
    [
        ("ray://127.0.0.1:{port}", "the address of a running Ray cluster (connecting to 127.0.0.1:{port}:"),
        ("127.0.0.1:http", "auto, HOST:PORT"),
    ],
)
def test_dead_ray_address_is_one_line_before_ray(tmp_path, capsys, address, allowed):
    """A Ray --address nothing answers at: one line before any run is opened (ray.init
    retried it for about 95 s, then a traceback, with the sweep's run left RUNNING)."""
    import ray

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address, allowed = address.format(port=port), allowed.format(port=port)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert run_beta(TINY + ["--address", address, "--storage-path", str(tmp_path), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: --address={address!r} is invalid; allowed: {allowed}"), err
    assert not ray.is_initialized() and not (tmp_path / "mlflow.db").exists()  # no sweep run opened


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--hps", "1.5"], "--hps=1.5"),
        (["--ranges", "1.0-5.0"], "--ranges='1.0-5.0'"),  # deeper than R = 4
        (["--ranges", "0.5-3.0"], "--ranges='0.5-3.0'"),
        (["--ranges", "2-x"], "--ranges='2-x'"),
        (["--sampler", "random"], "--sampler='random'"),
    ],
)
def test_bad_hole_sweep_input_names_the_flag(argv, field, capsys):
    import ray

    from sweeps import hole_sweep

    assert main("test", hole_sweep.add_flags, hole_sweep.from_args, ["--preset", "debug", "--dry-run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {field} is invalid; allowed:"), err
    assert not ray.is_initialized()


def test_paired_grids_and_arms_in_the_dry_run(capsys, tmp_path):
    from sweeps import adaptive_pipeline, mano

    assert (
        main(
            "test",
            mano.add_flags,
            mano.from_args,
            ["--dry-run", "--storage-path", str(tmp_path), "--pairs", "1x1,1x4,4x1", "--seeds", "0,1"],
        )
        == 0
    )
    out = capsys.readouterr().out
    # N and R stay paired: 3 pairs × 2 seeds, never the 3 × 3 product.
    assert out.count('"n_layers": 1, "n_loops": 4') == 2 and out.count('"n_layers": 4, "n_loops": 4') == 0
    assert "stages: 6 to train" in out
    assert (
        main(
            "test",
            adaptive_pipeline.add_flags,
            adaptive_pipeline.from_args,
            ["--dry-run", "--storage-path", str(tmp_path)],
        )
        == 0
    )
    out = capsys.readouterr().out
    # Ouro: pretrain → stage1 → stage2; CHASE: the same pretrain and stage1, then chase → stage2.
    assert "stages: 5 to train (2 reused across trials)" in out


def test_dry_run_starts_no_ray(capsys, tmp_path):
    import ray

    assert run_beta(TINY + ["--dry-run", "--storage-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "trials:" in out and "compute:" in out and "resources:" in out
    assert "stages: 3 to train (1 reused across trials)" in out  # one shared pre-training
    assert not ray.is_initialized()
    assert not (tmp_path / "mlflow.db").exists()


def test_dry_run_counts_the_stages_the_store_holds(capsys, tmp_path):
    """A stored stage (its done marker, written where and as a trial writes it) is reused,
    not trained: the dry run says so and leaves it out of the compute."""
    import re
    import shutil

    from sweeps.beta_ablation import beta_ablation
    from sweeps.flags import Common, parse_sets
    from tests.store_fixture import store_stage
    from trainables.pipeline import stage_configs

    argv = TINY + ["--dry-run", "--storage-path", str(tmp_path)]
    assert run_beta(argv) == 0
    fresh = capsys.readouterr().out
    assert "stages: 3 to train (1 reused across trials)" in fresh
    # The stage folders (stages/<stage>-<key>) and their tokens, as the fresh plan lists them.
    tokens = {
        m[1]: int(m[2].replace(",", "")) for m in re.finditer(r"^  (\S+-[0-9a-f]{12}): .* = ([\d,]+);", fresh, re.M)
    }
    assert len(tokens) == 3
    pretrain = next(f for f in tokens if f.startswith("pretrain-"))
    spec = beta_ablation(Common("phop-debug", parse_sets(TINY[3::2])), [0.1]).spec  # TINY's --set values
    configs = {}  # stage folder -> its config, as the sweep derives them
    for point in ({"beta": b, "seed": 0} for b in (0.1, 0.5)):
        for cfg in stage_configs(spec, point, tmp_path):
            configs[f"{cfg.stage}-{cfg.stage_key()}"] = cfg
    assert set(configs) == set(tokens)

    store_stage(tmp_path, configs[pretrain], "r0")  # the shared pre-training
    assert run_beta(argv) == 0
    out = capsys.readouterr().out
    assert "stages: 3 (1 stored, 2 to train; 1 reused across trials)" in out
    assert f"  {pretrain}: stored, reused" in out and "shared stage chain(s) not yet trained" not in out
    left = sum(n for f, n in tokens.items() if f != pretrain)
    assert f"compute for the 2 stage(s) to train: {left:,} training tokens" in out

    for folder in tokens:
        store_stage(tmp_path, configs[folder], "r1")
    assert run_beta(argv) == 0
    out = capsys.readouterr().out
    assert "stages: 3 (3 stored, 0 to train; 1 reused across trials)" in out
    assert "compute for the 0 stage(s) to train: 0 training tokens" in out

    # A done marker vouches for files: with the checkpoint gone, the stage trains again.
    shutil.rmtree(tmp_path / "stages" / pretrain / "checkpoint")
    assert run_beta(argv) == 0
    out = capsys.readouterr().out
    assert "stages: 3 (2 stored, 1 to train, 1 of them to train again; 1 reused across trials)" in out
    assert f"  {pretrain}: checkpoint missing → retrain" in out
    assert f"compute for the 1 stage(s) to train: {tokens[pretrain]:,} training tokens" in out
    # Its children follow it: reused only if it comes out with the weights they started from
    children = [f for f in tokens if f != pretrain]
    for child in children:
        assert f"  {child}: stored; its parent {pretrain} trains again first, then it is reused if" in out


def test_stage_keys_do_not_depend_on_the_storage_path(tmp_path):
    from trainables.pipeline import PipelineSpec, stage_configs

    spec = PipelineSpec(
        preset="phop-debug",
        stages=("pretrain", "stage1", "stage2"),
        searched={"beta": "exit.beta"},
        searched_stages=("stage1",),
    )
    here = stage_configs(spec, {"beta": 0.1, "seed": 0}, tmp_path / "a")
    there = stage_configs(spec, {"beta": 0.1, "seed": 0}, tmp_path / "b")
    assert [c.stage_key() for c in here] == [c.stage_key() for c in there]
    assert here[1].init_from != there[1].init_from
    # ... but a different parent (another β upstream of stage2) is another key.
    other_beta = stage_configs(spec, {"beta": 0.5, "seed": 0}, tmp_path / "a")
    other_seed = stage_configs(spec, {"beta": 0.1, "seed": 1}, tmp_path / "a")
    assert other_beta[0].stage_key() == here[0].stage_key()
    assert other_beta[2].parent.key != here[2].parent.key
    assert here[2].config_hash() != other_beta[2].config_hash()
    # Seeds of one configuration share its hash at every stage (seed aggregation), not its key.
    assert here[2].config_hash() == other_seed[2].config_hash()
    assert here[2].stage_key() != other_seed[2].stage_key()


def test_a_trial_run_logs_its_curves_and_headline_alone():
    """tracking.log_record with a headline: a training record whole (the curves), an
    evaluation record only the figures the headline names."""

    class Client:
        def __init__(self):
            self.logged = []

        def log_batch(self, run_id, metrics):
            self.logged += [(m.key, m.step) for m in metrics]

    train = {"kind": tracking.TRAIN_RECORD, "step": 5, tracking.LOSS: 2.0, "lr": 1e-3}
    evaluation = {
        "kind": tracking.EVAL_RECORD,
        "step": 5,
        "policies": [{"policy": "full", "ppl": 9.0, "accuracy": 0.5}, {"policy": "dense:0.2", "ppl": 11.0}],
    }
    everything, trial = Client(), Client()
    for record in (train, evaluation):
        tracking.log_record(everything, "stage", record)
        tracking.log_record(trial, "trial", record, headline=(tracking.VAL_PPL,))
    assert {k for k, _ in everything.logged} == {tracking.LOSS, "lr", "val_ppl", "val_accuracy", "dense_q0.2_ppl"}
    assert trial.logged == [(tracking.LOSS, 5), ("lr", 5), ("val_ppl", 5)]


def test_tracking_conventions(tmp_path):
    mc = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = tracking.ensure_experiment(mc, "unit", tmp_path / "artifacts")
    assert mc.get_experiment(exp).artifact_location.startswith("file:///")
    assert tracking.ensure_experiment(mc, "unit", tmp_path / "artifacts") == exp
    cfg = get_preset("phop-debug")
    key = {tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: cfg.stage_key()}
    records = [
        {
            "kind": "train",
            "step": 2,
            "stage": "stage1",
            "loss": 1.5,
            "exit_entropy": 0.7,
            "expected_exit_step": 1.6,
            "lr": 1e-3,
            "tokens_per_s": 100.0,
        },
        {
            "kind": "eval",
            "step": 2,
            "policies": [
                {"policy": "full", "accuracy": 0.5, "loss": 1.2, "ppl": 3.3, "n": 10},
                {
                    "policy": "skip:0.4",
                    "executed_loops": 1.5,
                    "accuracy": 0.4,
                    "ppl": 3.5,
                    "loss": 1.25,
                    "mean_exit_step": 1.4,
                },
                {
                    "policy": "forced:1",
                    "executed_loops": 1.0,
                    "accuracy": 0.3,
                    "ppl": 3.9,
                    "loss": 1.36,
                    "mean_exit_step": 1.0,
                },
            ],
        },
    ]

    run, status = tracking.open_run(
        mc,
        exp,
        name="trial-x",
        tags=tracking.config_tags(cfg, level=tracking.TRIAL),
        key=key,
        params=tracking.config_params(cfg),
    )
    assert status == "NEW"
    with pytest.raises(RuntimeError):
        with tracking.terminated_on_exit(mc, run):
            for r in records:
                tracking.log_record(mc, run, r)
            raise RuntimeError("the trial crashed")
    got = mc.get_run(run)
    assert got.info.status == "FAILED"
    assert got.data.params["exit.beta"] == str(cfg.exit.beta) and got.data.params["model.n_loops"] == "2"
    for tag in ("config_hash", "stage_key", "stage", "method", "parent_checkpoint", "git_sha"):
        assert tag in got.data.tags
    assert mc.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"
    assert got.data.tags["config_hash"] == cfg.config_hash()
    for m in (
        "loss",
        "exit_entropy",
        "expected_exit_step",
        "val_ppl",
        "val_accuracy",
        "skip_q0.4_executed_loops",
        "forced_d1_ppl",
    ):
        assert m in got.data.metrics, m

    # The resumed trial finds its run again: no duplicate, and it can finish.
    again, status = tracking.open_run(mc, exp, name="trial-x", tags={}, key=key, params=tracking.config_params(cfg))
    assert (again, status) == (run, "FAILED")
    tracking.close_run(mc, again, ok=True)
    assert len(mc.search_runs([exp])) == 1
    assert tracking.open_run(mc, exp, name="trial-x", tags={}, key=key)[1] == "FINISHED"

    # A trial Tune stops (sys.exit(0) from its report) ends KILLED; another exit code FAILED.
    for code, status in ((0, "KILLED"), (3, "FAILED")):
        stopped, _ = tracking.open_run(mc, exp, name=f"stopped-{code}", tags={}, key={"level": "trial", "k": str(code)})
        with pytest.raises(SystemExit):
            with tracking.terminated_on_exit(mc, stopped):
                sys.exit(code)
        assert mc.get_run(stopped).info.status == status


@pytest.mark.parametrize(
    "workers, concurrent, trial_cpu, worker_cpu, share_of_three",
    [
        (0, 2, 1.0, 1.0, 0.66),  # local mode: each trial is its own worker and holds its share
        (1, 2, 0.01, 0.99, 0.65),  # a waiting trial holds a sliver beside its worker
        (2, 1, 0.01, 0.99, 0.32),
    ],
)
def test_resource_plan_adds_up_to_the_machine(monkeypatch, workers, concurrent, trial_cpu, worker_cpu, share_of_three):
    from dataclasses import replace

    from sweeps import sweep as plan
    from sweeps.flags import Launch
    from trainables.trial import PlatformSettings

    monkeypatch.setattr(plan.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(plan, "local_gpus", lambda: 0)
    launch = Launch(num_workers=workers)
    res = plan.plan_resources(launch, local=True, n_trials=5)
    assert (res.max_concurrent, res.cpus_per_worker) == (concurrent, worker_cpu)
    platform = PlatformSettings(
        "sqlite:///x", "/tmp/x", "e", "r", num_workers=workers, cpus_per_worker=res.cpus_per_worker
    )
    assert platform.trial_resources() == {"cpu": trial_cpu}
    # Three trials on 2 CPUs: shares rounded down (by hand: (2 - 3 × sliver) / (3 × workers)),
    # so what Tune and Ray Train reserve never passes the machine.
    res = plan.plan_resources(replace(launch, max_concurrent_trials=3), local=True, n_trials=5)
    assert res.cpus_per_worker == share_of_three
    platform = PlatformSettings(
        "sqlite:///x", "/tmp/x", "e", "r", num_workers=workers, cpus_per_worker=res.cpus_per_worker
    )
    assert 3 * (platform.trial_resources()["cpu"] + workers * res.cpus_per_worker) <= 2.0


@pytest.mark.ray
@pytest.mark.slow  # three minutes on 2 cores: .ci/run runs it after the suite
def test_tiny_beta_sweep_end_to_end(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = TINY + ["--tracking-uri", uri, "--storage-path", str(tmp_path / "store")]
    assert run_beta(argv + ["--num-workers", "2"]) == 0  # two data-parallel gloo workers per stage
    out = capsys.readouterr().out
    assert "MLflow:" in out and "dashboard:" in out and "report.html:" in out

    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    trials = mc.search_runs([exp], filter_string="tags.level = 'trial'")
    assert sorted(float(r.data.params["search.beta"]) for r in trials) == [0.1, 0.5]
    for r in trials:
        assert r.info.status == "FINISHED"
        for m in ("exit_entropy", "expected_exit_step", "val_ppl"):
            assert m in r.data.metrics, m
        # The trial's page charts its curves and headline; every policy's one-point figures
        # stay on its last stage's run, where the analysis reads them.
        (stage,) = mc.search_runs([exp], filter_string=f"tags.stage = 'stage1' and tags.trial_run = '{r.info.run_id}'")
        per_policy = [k for k in stage.data.metrics if k.startswith(("dense_q", "skip_q", "forced_d"))]
        assert per_policy and not [k for k in r.data.metrics if k in per_policy], sorted(r.data.metrics)
    pretrains = mc.search_runs([exp], filter_string="tags.stage = 'pretrain'")
    # The shared pre-training is trained once, first, under the sweep run; both trials reuse it.
    assert sorted(r.data.tags["reused"] for r in pretrains) == ["false", "true", "true"]
    (trained,) = [r for r in pretrains if r.data.tags["reused"] == "false"]
    sweep_run = mc.search_runs([exp], filter_string="tags.level = 'sweep'")[0].info.run_id
    assert trained.data.tags["mlflow.parentRunId"] == sweep_run
    assert {r.data.tags["reused_from"] for r in pretrains if r.data.tags["reused"] == "true"} == {trained.info.run_id}
    # The analysis report is logged to the sweep's parent run (visible in the dashboard).
    logged = {a.path for a in mc.list_artifacts(sweep_run, "analysis")}
    assert "analysis/report.html" in logged and "analysis/frontier.png" in logged, logged

    # Rerunning the finished sweep trains nothing and duplicates no trial run; a new β
    # point trains in Ray Train's local mode (the default: in the trial's own process).
    assert run_beta(argv, betas=(0.1, 0.5, 1.0)) == 0
    assert capsys.readouterr().out.count("reused") == 2
    trials = mc.search_runs([exp], filter_string="tags.level = 'trial'")
    assert sorted(float(r.data.params["search.beta"]) for r in trials) == [0.1, 0.5, 1.0]
    (new,) = [r for r in trials if float(r.data.params["search.beta"]) == 1.0]
    assert new.info.status == "FINISHED" and "exit_entropy" in new.data.metrics and "val_ppl" in new.data.metrics
    stage1 = mc.search_runs([exp], filter_string="tags.level = 'stage' and tags.stage = 'stage1'")
    assert len(stage1) == 3 and all(r.data.tags["reused"] == "false" for r in stage1)


@pytest.mark.ray
@pytest.mark.slow  # a sweep of 30 s on 2 cores: .ci/run runs it after the suite
def test_sweep_prints_live_progress_per_trial(tmp_path, capsys):
    """While trials train, the driver prints a line per trial at every stage boundary
    and while it trains (at least every 30 s: PROGRESS_SECONDS), then a final line
    per trial; Ray's own boxes and hints go to the storage path's log instead."""
    argv = [
        "--preset",
        "debug",
        "--set",
        "train.steps=6",
        "--set",
        "train.eval_limit=8",
        "--set",
        "train.eval_every=0",
        "--set",
        "train.log_every=3",
        "--stage1-steps",
        "4",
        "--tracking-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--storage-path",
        str(tmp_path / "store"),
    ]
    assert main("test", beta.add_flags, beta.from_args, argv + ["--betas", "0.1"]) == 0
    err = capsys.readouterr().err
    trial = [line for line in err.splitlines() if line.startswith("[beta=0.1 seed=0] ")]
    # Per stage: its start, its progress while it trains (at least the first and last
    # step), its end; then the trial's final line with its figures.
    compact = []
    for line in trial:
        if not compact or kind(line) != "step" or compact[-1] != "step":
            compact.append(kind(line))
    assert compact == ["start", "step", "done", "start", "step", "done", "trial"], trial
    assert "pretrain  step 6/6" in err and "stage1  step 4/4" in err
    step = next(x for x in trial if kind(x) == "step")
    assert "loss" in step and "tok/s" in step and "eta" in step
    assert "val_ppl" in trial[-1]
    assert "Configuration for experiment" not in err and "tensorboard" not in err.lower()
    assert "Configuration for experiment" in (tmp_path / "store" / "logs" / "ray.log").read_text()
    from trainables.progress import PROGRESS_SECONDS

    assert PROGRESS_SECONDS <= 30


def kind(line: str) -> str:
    """What a progress line says: start | step | done | reused | trial."""
    body = line.split("] ", 1)[1]
    if body.startswith("trial "):
        return "trial"
    words = body.split()
    return {"training": "start", "step": "step", "done": "done", "reused": "reused"}.get(words[1], words[1])


def stage_records(store: Path, stage: str) -> list[dict]:
    (run_dir,) = (store / "stages").glob(f"{stage}-*")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.ray
@pytest.mark.parametrize(
    "workers",
    [
        pytest.param("0", marks=pytest.mark.soak),
        pytest.param("1", marks=pytest.mark.slow),  # about a minute on 2 cores
    ],
)
def test_killed_worker_resumes_from_its_checkpoint(tmp_path, monkeypatch, capsys, workers):
    """One worker actor (Ray Train restarts the worker group) and local mode (the
    trial's own process dies; Tune restarts the trial): both say so on the console,
    resume the stage from its wall-clock checkpoint, and log every step once."""
    store, uri = tmp_path / "store", f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("LOOPLAB_TEST_KILL_WORKER_AT_STEP", "3")  # SIGKILL once, as step 3 is logged
    argv = [
        "--preset",
        "phop-debug",
        "--set",
        "train.steps=4",
        "--set",
        "train.ckpt_minutes=1e-9",
        "--set",
        "train.log_every=1",
        "--set",
        "train.eval_every=0",
        "--set",
        "train.eval_limit=16",
        "--num-workers",
        workers,
        "--tracking-uri",
        uri,
        "--storage-path",
        str(store),
    ]
    assert run_beta(argv, betas=(0.1,)) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[beta=0.1 seed=0] ")]
    # Said once per death, before the restarted stage says where it resumes
    death = "pretrain: worker 0 died (ActorDiedError: " if workers == "1" else "restarted by Ray (attempt 2) after: "
    died = [i for i, line in enumerate(said) if death in line]
    resumed = said.index("[beta=0.1 seed=0] pretrain: resumes after step 2/4, its last checkpoint")
    assert len(died) == 1 and died[0] < resumed, said
    records = stage_records(store, "pretrain")
    # The worker died as it logged step 3, before that step's checkpoint: the restart
    # resumed at step 2 (not from 0), and steps 3-4 replaced nothing.
    assert [r["step"] for r in records if r["kind"] == "resume"] == [2]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    assert list((store / "stages").glob("pretrain-*/.killed_once"))
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    runs = mc.search_runs([exp], filter_string="tags.level != 'sweep'")
    assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs)  # trial, pretrain, stage1: once each
    pretrain = next(r for r in runs if r.data.tags["stage"] == "pretrain")
    assert [m.step for m in mc.get_metric_history(pretrain.info.run_id, "loss")] == [1, 2, 3, 4]
    # Stage-1 was killed at its step 3 too; in local mode the trial restarted after its
    # pre-training had finished, and found that run its own (not a reuse: nothing re-logged).
    stage1 = next(r for r in runs if r.data.tags["stage"] == "stage1")
    assert [m.step for m in mc.get_metric_history(stage1.info.run_id, "loss")] == list(range(1, 21))
    assert pretrain.data.tags[tracking.REUSED] == "false"


def finished_trials(uri: str, experiment: str) -> list:
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return mc.search_runs([exp.experiment_id], filter_string="tags.level = 'trial' and attributes.status = 'FINISHED'")


@pytest.mark.ray
@pytest.mark.soak
@pytest.mark.parametrize("rerun", [["--resume"], []], ids=["resume", "plain-rerun"])
def test_killed_driver_then_rerun_completes_without_orphans_or_duplicates(tmp_path, rerun):
    """Kill the whole driver mid-sweep, then run the same command again (with --resume,
    or without: what most people type). Either way: one sweep run, every trial under
    it once, no run left RUNNING, finished stages not trained again."""
    store, uri = tmp_path / "store", f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = [
        sys.executable,
        str(REPO / "sweeps" / "beta_ablation.py"),
        *TINY,
        "--betas",
        "0.1,0.5,1.0",
        "--max-concurrent-trials",
        "1",
        "--tracking-uri",
        uri,
        "--storage-path",
        str(store),
    ]
    driver = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        while not finished_trials(uri, "beta_ablation-phop-debug"):
            assert driver.poll() is None and time.time() < deadline, "the sweep ended before it could be killed"
            time.sleep(2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and every process it started
        driver.wait()
        subprocess.run(["ray", "stop", "--force"], capture_output=True)
    done_before = {p: p.stat().st_mtime_ns for p in (store / "stages").glob("*/done.json")}
    finished_before = {r.data.tags["stage_key"] for r in finished_trials(uri, "beta_ablation-phop-debug")}
    assert done_before and 0 < len(finished_before) < 3

    assert subprocess.run(argv + rerun, capture_output=True).returncode == 0
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    (sweep,) = mc.search_runs([exp], filter_string="tags.level = 'sweep'")  # one sweep run, adopted
    assert sweep.info.status == "FINISHED"
    trials = mc.search_runs([exp], filter_string="tags.level = 'trial'")
    assert len(trials) == 3 and all(r.info.status == "FINISHED" for r in trials)  # no duplicate trial runs
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {sweep.info.run_id}  # one parent each
    assert not mc.search_runs([exp], filter_string="attributes.status = 'RUNNING'")  # nothing orphaned
    stages = mc.search_runs([exp], filter_string="tags.level = 'stage'")
    keys = [(r.data.tags["stage_key"], r.data.tags["mlflow.parentRunId"]) for r in stages]
    assert len(keys) == len(set(keys)) == 7  # the shared pretrain + one pretrain and one stage1 per trial
    assert sum(r.data.tags["reused"] == "false" for r in stages if r.data.tags["stage"] == "pretrain") == 1
    # Stages finished before the kill were not trained again.
    assert all(p.stat().st_mtime_ns == t for p, t in done_before.items())
    assert len(list((store / "stages").glob("*/done.json"))) == 4  # 1 pretrain + 3 stage1


def _stage_runs(uri: str, experiment: str, stage: str) -> list:
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return mc.search_runs([exp.experiment_id], filter_string=f"tags.level = 'stage' and tags.stage = '{stage}'")


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_saving_the_shared_stage_and_a_rerun_resumes(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the β
    sweep pre-trains its shared stage: the pre-training checkpoints and stops, no trial
    starts, every run ends KILLED (none RUNNING, the sweep not FINISHED), and the driver
    exits 130 saying how to resume; the same command resumes the pre-training from its
    checkpoint and finishes the sweep."""
    store, uri = tmp_path / "store", f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment, steps = "beta_ablation-phop-debug", 1000  # ~40 s of pre-training on 2 cores
    argv = [
        sys.executable,
        str(REPO / "sweeps" / "beta_ablation.py"),
        *TINY,
        "--betas",
        "0.1,0.5",
        "--stage-steps",
        f"pretrain={steps}",
        "--tracking-uri",
        uri,
        "--storage-path",
        str(store),
    ]
    driver = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        while not any(tracking.LOSS in r.data.metrics for r in _stage_runs(uri, experiment, "pretrain")):
            assert driver.poll() is None and time.time() < deadline, "the pre-training never logged a step"
            time.sleep(0.5)
        os.killpg(driver.pid, signal.SIGINT)
        out, _ = driver.communicate(timeout=180)  # within a step, then Ray's shutdown
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        subprocess.run(["ray", "stop", "--force"], capture_output=True)
    assert driver.returncode == 130, out
    assert "SIGINT: stopping the sweep" in out and "to resume, run the same command again" in out, out
    assert "Traceback" not in out, out
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name(experiment).experiment_id
    (sweep,) = mc.search_runs([exp], filter_string="tags.level = 'sweep'")
    assert sweep.info.status == "KILLED"
    assert not mc.search_runs([exp], filter_string="attributes.status = 'RUNNING'")
    (pretrain,) = _stage_runs(uri, experiment, "pretrain")
    assert pretrain.info.status == "KILLED" and "stopped at step" in pretrain.data.tags[tracking.KILLED_BY]
    assert not _stage_runs(uri, experiment, "stage1")  # no trial started its own stages
    (folder,) = (store / "stages").glob("pretrain-*")
    saved = json.loads((folder / "checkpoint" / "trainer.json").read_text())["step"]
    assert 0 < saved < steps and not (folder / "done.json").exists()

    again = subprocess.run(argv, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "resume"] == [saved]  # resumed, not restarted
    (sweep,) = mc.search_runs([exp], filter_string="tags.level = 'sweep'")
    assert sweep.info.status == "FINISHED"
    assert all(r.info.status == "FINISHED" for r in mc.search_runs([exp], filter_string="tags.level != 'sweep'"))


@pytest.mark.ray
@pytest.mark.soak
def test_two_node_cluster_runs_trials_on_both_nodes(tmp_path):
    """A head and a second node started with `ray start` on this machine, one CPU
    each: two concurrent Stage-1 trials can only fit one per node."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # token auth (Ray >= 2.59) off on both sides
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    start = ["ray", "start", "--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([*start, "--head", f"--port={port}"], env=env, check=True, capture_output=True, timeout=180)
        subprocess.run([*start, f"--address={address}"], env=env, check=True, capture_output=True, timeout=180)
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        argv = [
            sys.executable,
            str(REPO / "sweeps" / "beta_ablation.py"),
            *TINY,
            "--betas",
            "0.1,0.5",
            "--address",
            address,
            "--max-concurrent-trials",
            "2",
            "--cpus-per-worker",
            "0.9",
            "--tracking-uri",
            uri,
            "--storage-path",
            str(tmp_path / "store"),
        ]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True)
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    stage1 = mc.search_runs([exp], filter_string="tags.level = 'stage' and tags.stage = 'stage1'")
    assert len(stage1) == 2 and all(r.info.status == "FINISHED" for r in stage1)
    assert len({r.data.tags["ray_node_id"] for r in stage1}) == 2  # one trial on each node


@pytest.mark.ray
@pytest.mark.soak
def test_optuna_search_with_asha_runs_end_to_end(tmp_path):
    """A seeded Optuna search over β with ASHA: every result Tune sees carries the
    metric ASHA needs (the evaluations), and the samples land in MLflow."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = TINY + [
        "--search",
        "optuna",
        "--num-samples",
        "2",
        "--scheduler",
        "asha",
        "--set",
        "train.steps=8",
        "--set",
        "train.eval_every=4",
        "--tracking-uri",
        uri,
        "--storage-path",
        str(tmp_path / "store"),
    ]
    assert run_beta(argv) == 0
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    trials = mc.search_runs([exp], filter_string="tags.level = 'trial'")
    betas = sorted(float(r.data.params["search.beta"]) for r in trials)
    assert len(betas) == 2 and betas[0] != betas[1] and all(0.01 <= b <= 2.0 for b in betas)  # sampled in range
    # ASHA may stop one early: its runs end KILLED, not left RUNNING; a finished one has its metric.
    assert all(r.info.status in ("FINISHED", "KILLED") for r in trials)
    assert all("val_ppl" in r.data.metrics for r in trials if r.info.status == "FINISHED")
    stages = mc.search_runs([exp], filter_string="tags.level = 'stage'")
    assert all(r.info.status in ("FINISHED", "KILLED") for r in stages)


@pytest.mark.slow  # a one-trial sweep and two reruns: about a minute on 2 cores
def test_a_deleted_checkpoint_is_trained_again_not_reported_reused(tmp_path, capsys):
    """Reuse trusts files, not records: with a finished trial's pre-training checkpoint
    deleted, the rerun says so, trains the stage again and runs the trial afresh (the old
    trial run retired), and the stage's checkpoint is there again."""
    import shutil

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = TINY + ["--tracking-uri", uri, "--storage-path", str(tmp_path / "store")]
    assert run_beta(argv, betas=(0.1,)) == 0
    capsys.readouterr()
    (pretrain,) = (tmp_path / "store" / "stages").glob("pretrain-*")
    shutil.rmtree(pretrain / "checkpoint")

    assert run_beta(argv, betas=(0.1,)) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert f"trial finished before, but {pretrain.name}: checkpoint missing → run again" in out
    assert "pretrain: checkpoint missing → retrain" in out and "pretrain: training 4 steps" in out
    # Retrained on the same machine, the parent holds the weights its child started from
    # (training is deterministic), so the child is reused, not refused.
    assert "stage1: reused" in out
    assert (pretrain / "checkpoint" / "model.safetensors").is_file()
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    (trial,) = mc.search_runs([exp], filter_string="tags.level = 'trial'")  # the retired one is deleted
    assert trial.info.status == "FINISHED" and "val_ppl" in trial.data.metrics
    stages = mc.search_runs([exp], filter_string=f"tags.trial_run = '{trial.info.run_id}'")
    assert sorted(r.data.tags["stage"] for r in stages) == ["pretrain", "stage1"]

    # A third run finds everything whole: nothing is trained.
    assert run_beta(argv, betas=(0.1,)) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "retrain" not in out and "run again" not in out and "trial reused" in out


@pytest.mark.ray
@pytest.mark.slow  # two small sweeps: about a minute on 2 cores
def test_a_truncated_checkpoint_is_trained_again_with_the_children_it_moved(tmp_path, capsys):
    """A damaged parent is trained again; when its new weights differ from those its
    child started from (here: micro-batches, which the key leaves out, change the float
    rounding, as other hardware would), the child is trained again too, said in its own
    line, and its old checkpoint is kept beside as checkpoint.broken."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = TINY + ["--tracking-uri", uri, "--storage-path", str(tmp_path / "store")]
    assert run_beta(argv, betas=(0.1,)) == 0
    capsys.readouterr()
    stages = tmp_path / "store" / "stages"
    (pretrain,), (stage1,) = stages.glob("pretrain-*"), stages.glob("stage1-*")
    weights = pretrain / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    assert run_beta(argv + ["--set", "train.micro_batch_size=2"], betas=(0.1,)) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "pretrain: checkpoint damaged: " in out and "pretrain: training 4 steps" in out
    assert "stage1: trained from parent weights " in out and "stage1: training " in out
    assert "stage1: reused" not in out
    assert (stage1 / "checkpoint.broken" / "model.safetensors").is_file()  # the old child, kept for a look
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    (trial,) = mc.search_runs([exp], filter_string="tags.level = 'trial'")
    assert trial.info.status == "FINISHED"
