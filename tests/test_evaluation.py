"""Downstream evaluation as a sweep axis (trainables/evaluation.py, sweeps/evaluate.py):
the eval key is content, an evaluation in the store is never recomputed, a grown grid
evaluates only what is new, the MLflow names follow the contract, bad input is one line
before any model loads or Ray starts; and (marked ray, slow) a debug adaptive pipeline
with an evaluation grid, run twice.

Offline: the tasks are tests/data/lm_eval's two tiny multiple-choice sets (10 + 24
documents); their YAMLs name their data relative to their folder, which the
evaluation step resolves."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before lm-eval / datasets read them
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("mlflow")

import looplab
from looplab import tracking
from looplab.checkpoint import experiment_metadata, save_model
from looplab.policy import ExitPolicy
from looplab.presets import (
    get_preset,
    stage_config,
)
from trainables import eval_tasks as tasks
from trainables import evaluation as ev

DATA = Path(__file__).parent / "data" / "lm_eval"
TASKS = ("looplab_toy_mc", "looplab_toy_cloze")
R = 4


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """Offline hub flags and a private datasets cache (as tests/test_lm_eval.py)."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "hf_datasets")


def toy_tasks(folder: Path = DATA) -> tuple:
    from lm_eval.tasks import TaskManager

    index = TaskManager(include_path=str(folder), include_defaults=False).task_index
    return tuple(tasks.include_task(name, index[name].yaml_path) for name in TASKS)


# ---- the key ---------------------------------------------------------------------------------
def test_eval_key_is_the_content_of_the_evaluation(tmp_path):
    mc_task, cloze = toy_tasks()
    key = ev.eval_key("abc123", "skip:0.4", mc_task, 6)
    assert key == ev.eval_key("abc123", "skip:0.4", mc_task, 6) and len(key) == 12
    # each thing that changes the result changes the key
    assert (
        len(
            {
                key,
                ev.eval_key("abc124", "skip:0.4", mc_task, 6),
                ev.eval_key("abc123", "skip:0.6", mc_task, 6),
                ev.eval_key("abc123", "skip:0.4", cloze, 6),
                ev.eval_key("abc123", "skip:0.4", mc_task, 7),
                ev.eval_key("abc123", "skip:0.4", mc_task, None),
                ev.eval_key("abc123", "skip:0.4", replace(mc_task, num_fewshot=5), 6),
                ev.eval_key("abc123", "skip:0.4", replace(mc_task, metric="acc"), 6),
            }
        )
        == 8
    )
    # the data by content: the same files elsewhere give the same key, one changed byte another
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("toy_mc.yaml", "toy_mc.jsonl"):
        (copy / name).write_bytes((DATA / name).read_bytes())
    moved = tasks.include_task("looplab_toy_mc", copy / "toy_mc.yaml")
    assert moved.location != mc_task.location and ev.eval_key("abc123", "skip:0.4", moved, 6) == key
    # a comment is not the task; a prompt is
    (copy / "toy_mc.yaml").write_text("# another comment\n" + (DATA / "toy_mc.yaml").read_text())
    assert ev.eval_key("abc123", "skip:0.4", tasks.include_task("looplab_toy_mc", copy / "toy_mc.yaml"), 6) == key
    (copy / "toy_mc.yaml").write_text((DATA / "toy_mc.yaml").read_text().replace("Answer:", "A:"))
    assert ev.eval_key("abc123", "skip:0.4", tasks.include_task("looplab_toy_mc", copy / "toy_mc.yaml"), 6) != key
    (copy / "toy_mc.yaml").write_bytes((DATA / "toy_mc.yaml").read_bytes())
    (copy / "toy_mc.jsonl").write_text((DATA / "toy_mc.jsonl").read_text().replace("blue", "Blue"))
    assert ev.eval_key("abc123", "skip:0.4", tasks.include_task("looplab_toy_mc", copy / "toy_mc.yaml"), 6) != key
    # forced:R is full depth: one evaluation, one key
    assert ev.canonical(ExitPolicy.forced(R), R) == ExitPolicy.full()
    assert ev.canonical(ExitPolicy.forced(2), R) == ExitPolicy.forced(2)
    # resources and batching are not content
    ck = ev.Checkpoint("x", "stage1", "abc123", "h", ("pretrain", "stage1"), R, "run", weights="sha-1")
    small, big = (ev.EvalGrid((mc_task,), "skip:0.4", 6, batch_size=b, cpus=c) for b, c in ((1, 1.0), (32, 2.0)))
    (one,) = [e.key for e in ev.grid_evaluations(small, [ck])]
    assert one == ev.grid_evaluations(big, [ck])[0].key == ev.eval_key(ck.weights_key, "skip:0.4", mc_task, 6)
    # the checkpoint by its stage and its weights, not its path or run: a stage trained
    # again into other weights (other hardware) is evaluated again, into the same ones not
    assert replace(ck, path="y", run_id="run2").weights_key == ck.weights_key
    assert (
        len({ck.weights_key, replace(ck, weights="sha-2").weights_key, replace(ck, stage_key="abc124").weights_key})
        == 3
    )


def test_policies_per_stage():
    def specs(grid, stage, n_loops=R):
        return [p.spec for p in grid.policies_for(stage, n_loops)]

    defaults = ev.EvalGrid(())
    # App. E on the pre-trained model (forced R as full depth), App. F on gated stages
    assert specs(defaults, "pretrain") == ["forced:1", "forced:2", "forced:3", "full"]
    assert specs(defaults, "stage2") == [
        f"{m}:{q}" for m in ("dense", "skip") for q in ("0.2", "0.4", "0.6", "0.8", "1.0")
    ]
    named = ev.EvalGrid((), "dense:0.2;skip:0.4;forced:1-4")
    # gate policies need a trained gate; forced depths stop at the checkpoint's R
    assert specs(named, "pretrain") == ["forced:1", "forced:2", "forced:3", "full"]
    assert specs(named, "chase") == ["dense:0.2", "skip:0.4", "forced:1", "forced:2", "forced:3", "full"]
    assert specs(named, "pretrain", n_loops=2) == ["forced:1", "full"]
    assert ev.EvalGrid((), stages=("stage2",)).evaluates("stage2") and not ev.EvalGrid(
        (), stages=("stage2",)
    ).evaluates("pretrain")


# ---- the step, in-process -------------------------------------------------------------------
def save(cfg, path: Path, gate_seed: int | None = None) -> Path:
    """A debug model with cfg's metadata; with gate_seed a gate whose large random weights
    and positive bias make tokens exit at different steps (skip then runs fewer loops)."""
    model = looplab.load_model("debug")
    model.metadata = experiment_metadata(cfg)
    if gate_seed is not None:
        with torch.no_grad():
            weights = torch.randn(model.exit_gate.weight.shape, generator=torch.Generator().manual_seed(gate_seed))
            model.exit_gate.weight.copy_(10 * weights)
            model.exit_gate.bias.fill_(1.0)
    save_model(model, path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A pre-trained and a Stage-1 checkpoint, and an MLflow store holding the stage runs
    that 'trained' them (what the platform leaves behind)."""
    root = tmp_path_factory.mktemp("evaluation")
    base = get_preset("debug")
    pre = stage_config(base, "pretrain")
    s1 = stage_config(base, "stage1", parent=pre.as_parent(str(root / "pre")))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mc = tracking.client(uri)
    exp = tracking.ensure_experiment(mc, "evaluation", root / "mlflow")
    checkpoints = []
    for cfg, folder, lineage, gate in ((pre, "pre", ("pretrain",), None), (s1, "s1", ("pretrain", "stage1"), 1)):
        path = save(cfg, root / folder, gate)
        run, _ = tracking.open_run(
            mc,
            exp,
            name=folder,
            key={tracking.LEVEL: tracking.STAGE, tracking.STAGE_KEY: cfg.stage_key()},
            tags=tracking.config_tags(
                cfg, level=tracking.STAGE, lineage=lineage, **{tracking.REUSED: "false", tracking.CHECKPOINT: str(path)}
            ),
        )
        tracking.close_run(mc, run, ok=True)
        checkpoints.append(ev.Checkpoint(str(path), cfg.stage, cfg.stage_key(), cfg.config_hash(), lineage, R, run))
    return {"root": root, "uri": uri, "mc": mc, "exp": exp, "checkpoints": checkpoints}


def eval_runs(mc, exp) -> list:
    return mc.search_runs([exp], filter_string=f"tags.level = '{tracking.EVAL}'", max_results=1000)


@pytest.mark.slow  # 14 s on 2 cores: .ci/run runs it after the suite
def test_evaluation_step_reuses_what_the_store_has(trained):
    """One run per (checkpoint, policy, task) under the run that trained the stage, with
    the contract's names and the values lm-eval gives directly; a grown grid evaluates
    only what is new; a task that cannot be read fails alone."""
    from looplab.evaluation.harness import evaluate_tasks

    mc, exp, (pre, s1) = trained["mc"], trained["exp"], trained["checkpoints"]
    tasks = toy_tasks()
    common = dict(
        tracking_uri=trained["uri"], experiment="evaluation", artifact_root=trained["root"] / "mlflow", inline=True
    )
    grid = ev.EvalGrid(tasks, "skip:0.4;forced:1;full", limit=6)
    first = ev.evaluate(grid, [pre, s1], **common)
    # pretrain: forced:1 and full (skip needs a gate); stage1: all three; × 2 tasks
    assert (first.planned, first.ran, first.reused, first.failed, first.jobs) == (10, 10, 0, 0, 2)
    runs = eval_runs(mc, exp)
    assert len(runs) == 10 and all(r.info.status == "FINISHED" for r in runs)
    seen = {(r.data.tags["stage_key"], r.data.tags["policy"], r.data.tags["task"]) for r in runs}
    assert len(seen) == 10  # one run per (checkpoint, policy, task)
    by = {(r.data.tags["stage"], r.data.tags["policy"], r.data.tags["task"]): r for r in runs}
    for r in runs:
        ck = pre if r.data.tags["stage"] == "pretrain" else s1
        assert r.data.tags["mlflow.parentRunId"] == ck.run_id and r.data.tags["method"] == (
            "fixed" if ck is pre else "Ouro"
        )
        assert r.data.params["eval.limit"] == "6" and r.data.params["eval.n_samples"] == "6"

    # the values: the same evaluation through lm-eval directly (an independent run of the adapter)
    config = tasks[1].config()
    direct = evaluate_tasks(s1.path, [config], limit=6, policy="skip:0.4", device="cpu")["results"][TASKS[1]]
    metrics = by[("stage1", "skip:0.4", TASKS[1])].data.metrics
    prefix = "skip_q0.4_"
    assert metrics[prefix + f"lm_eval.{TASKS[1]}"] == pytest.approx(direct["acc_norm,none"])
    assert metrics[prefix + f"lm_eval_loops.{TASKS[1]}"] == pytest.approx(direct["executed_loops"])
    assert 1.0 <= direct["executed_loops"] < R  # the gate exits: skip runs fewer loops (downstream, measured)
    # forced d and full run exactly d and R loops on every token; the FLOPs follow the loops
    full, one = by[("stage1", "full", TASKS[0])].data.metrics, by[("stage1", "forced:1", TASKS[0])].data.metrics
    assert full[f"val_lm_eval_loops.{TASKS[0]}"] == R and one[f"forced_d1_lm_eval_loops.{TASKS[0]}"] == 1
    assert full[f"val_lm_eval_flops.{TASKS[0]}"] == pytest.approx(R * one[f"forced_d1_lm_eval_flops.{TASKS[0]}"])
    assert one[f"forced_d1_lm_eval_seconds.{TASKS[0]}"] > 0
    assert {tracking.parse_metric(k)[1] for k in metrics} == {
        f"{f}.{TASKS[1]}" for f in ("lm_eval", "lm_eval_loops", "lm_eval_flops", "lm_eval_seconds")
    }

    # one more q and one more policy: only those run; nothing is recomputed
    ends = {r.info.run_id: r.info.end_time for r in runs}
    second = ev.evaluate(replace(grid, policies="skip:0.4,0.8;forced:1,2;full"), [pre, s1], **common)
    # new: skip:0.8 on stage1; forced:2 on both; × 2 tasks
    assert (second.ran, second.reused, second.failed) == (6, 10, 0)
    runs = eval_runs(mc, exp)
    assert len(runs) == 16 and all(ends[r.info.run_id] == r.info.end_time for r in runs if r.info.run_id in ends)

    # a task whose accuracy cannot be read fails alone; its run says why; the grid goes on
    broken = replace(tasks[0], metric="f1")
    third = ev.evaluate(ev.EvalGrid((broken, tasks[1]), "forced:3", limit=6), [s1], **common)
    assert (third.ran, third.failed) == (1, 1)
    failed = [r for r in eval_runs(mc, exp) if r.info.status == "FAILED"]
    assert len(failed) == 1 and "reports no f1" in failed[0].data.tags[tracking.ERROR_TAG]


def test_preset_checkpoint_carries_its_tokenizer(tmp_path, monkeypatch, capsys):
    """Item 7: a preset saved as is records its tokenizer, so `looplab lm-eval` runs on
    it; a checkpoint without one needs --tokenizer, and the error names the flag."""
    from looplab.checkpoint import read_config
    from looplab.cli import main

    save_model(looplab.load_model("debug"), tmp_path / "debug")
    assert read_config(tmp_path / "debug")["metadata"]["tokenizer"] == "bytes"
    monkeypatch.chdir(DATA)  # the CLI's --include-path reads toy_mc.yaml's data relative to the working directory
    argv = ["lm-eval", "--tasks", "looplab_toy_mc", "--include-path", str(DATA), "--limit", "3", "--device", "cpu"]
    assert main([*argv, "--checkpoint", str(tmp_path / "debug")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"]["looplab_toy_mc"]["results"]["executed_loops"] == R  # full depth

    bare = looplab.load_model("phop-debug", vocab_size=259, n_loops=R)  # a synthetic-task model: no tokenizer
    save_model(bare, tmp_path / "bare")
    assert main([*argv, "--checkpoint", str(tmp_path / "bare")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--tokenizer" in err, err
    assert main([*argv, "--checkpoint", str(tmp_path / "bare"), "--tokenizer", "bytes"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == "bytes"


# ---- bad input: one line, before any model loads or Ray starts -------------------------------
def sweep_main(argv):
    from sweeps import adaptive_pipeline
    from sweeps.launch import main

    return main("test", adaptive_pipeline.add_flags, adaptive_pipeline.from_args, argv)


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--eval-tasks", "looplab_toy_mc", "--eval-policies", "forced:7"], "--eval-policies='forced:7'"),
        (["--eval-tasks", "looplab_toy_mc", "--eval-policies", "fast:1"], "--eval-policies='fast:1'"),
        (["--eval-tasks", "looplab_toy_mc", "--eval-stages", "stage3"], "--eval-stages='stage3'"),
        (["--eval-tasks", "looplab_toy_mc", "--eval-limit", "0"], "--eval-limit='0'"),
        (["--eval-tasks", "looplab_toy_mc", "--eval-cpus", "0"], "--eval-cpus=0.0"),
        (["--eval-tasks", "looplab_toy_mc", "--eval-gpus", "1"], "--eval-gpus=1.0"),
        (["--eval-tasks", "piqa", "--eval-data", "."], "--eval-data='.'"),
        (["--eval-policies", "skip:0.4"], "--eval-tasks=''"),
        (["--eval-tasks", "looplab_nope"], "--eval-tasks='looplab_nope'"),  # checked against lm-eval's own index too
    ],
)
def test_bad_evaluation_input_is_one_line_before_ray(extra, field, capsys, monkeypatch, tmp_path):
    import looplab.checkpoint

    if "--eval-gpus" in extra and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(looplab.checkpoint, "load_model", no_model)
    argv = ["--preset", "debug", "--storage-path", str(tmp_path), "--eval-include", str(DATA), *extra]
    if "--eval-tasks" not in extra:
        argv.remove("--eval-include"), argv.remove(str(DATA))
    assert sweep_main(argv) == 2  # not --dry-run: a missed check would start the sweep
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {field} is invalid; allowed:"), err
    import ray

    assert not ray.is_initialized()


def test_dry_run_lists_the_evaluations(capsys, tmp_path):
    argv = [
        "--preset",
        "debug",
        "--dry-run",
        "--storage-path",
        str(tmp_path),
        "--eval-tasks",
        ",".join(TASKS),
        "--eval-include",
        str(DATA),
        "--eval-policies",
        "skip:0.4;forced:1-4",
        "--eval-limit",
        "6",
    ]
    assert sweep_main(argv) == 0
    out = capsys.readouterr().out
    # pretrain: forced 1..3 + full; stage1, chase and the two stage2: skip:0.4 + the same four
    assert "pretrain:" in out and "forced:1 forced:2 forced:3 full" in out
    assert f"{2 * (4 + 4 * 5)} evaluation(s)" in out and "limit 6 documents per task" in out


def test_standalone_evaluate_errors_are_one_line(trained, tmp_path, capsys):
    from sweeps.evaluate import main

    assert (
        main(
            [
                "--experiment",
                "x",
                "--storage-path",
                str(tmp_path),
                "--eval-tasks",
                "looplab_toy_mc",
                "--eval-include",
                str(DATA),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip().startswith("error: --tracking-uri=")
    assert (
        main(
            [
                "--experiment",
                "nope",
                "--tracking-uri",
                trained["uri"],
                "--eval-tasks",
                "looplab_toy_mc",
                "--eval-include",
                str(DATA),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --experiment='nope' is invalid") and "evaluation" in err
    assert main(["--experiment", "evaluation", "--tracking-uri", trained["uri"]]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --eval-tasks=''")


def test_standalone_evaluate_dry_run_reads_the_store(trained, capsys):
    from sweeps.evaluate import main

    argv = [
        "--experiment",
        "evaluation",
        "--tracking-uri",
        trained["uri"],
        "--eval-tasks",
        ",".join(TASKS),
        "--eval-include",
        str(DATA),
        "--eval-policies",
        "skip:0.4;forced:1;full",
        "--eval-limit",
        "6",
        "--dry-run",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # the store's two stage runs; what test_evaluation_step_reuses_what_the_store_has left there is reused
    assert "pretrain:" in out and "stage1:" in out and "10 evaluation(s)" in out


# ---- a sweep, on Ray ----------------------------------------------------------------------------
TINY = [
    "--preset",
    "debug",
    "--set",
    "train.steps=4",
    "--set",
    "train.eval_limit=8",
    "--set",
    "train.log_every=2",
    "--set",
    "train.eval_every=0",
]


@pytest.mark.ray
@pytest.mark.slow
def test_adaptive_pipeline_with_an_evaluation_grid(tmp_path, capsys):
    """The acceptance path: a debug adaptive pipeline (Ouro and CHASE arms sharing
    pretrain → Stage-1) with an evaluation grid leaves one evaluation run per
    (checkpoint, policy, task), each with accuracy and executed loops; the same sweep
    with one more q evaluates only that q and trains nothing; the report drawn from the
    store has Fig. 3 and the downstream table columns (and renders in Chromium)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    grid = ["--eval-tasks", ",".join(TASKS), "--eval-include", str(DATA), "--eval-limit", "6"]
    argv = TINY + ["--tracking-uri", uri, "--storage-path", str(tmp_path / "store"), *grid]
    assert sweep_main(argv + ["--eval-policies", "skip:0.4;forced:1"]) == 0
    out = capsys.readouterr().out
    assert "evaluations: 18 ran, 0 reused, 0 failed" in out
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("adaptive_pipeline-debug").experiment_id
    stages = mc.search_runs([exp], filter_string="tags.level = 'stage' and tags.reused = 'false'")
    trained = {r.data.tags["stage_key"]: r for r in stages}
    assert sorted(r.data.tags["stage"] for r in stages) == ["chase", "pretrain", "stage1", "stage2", "stage2"]
    runs = eval_runs(mc, exp)
    # 5 checkpoints: pretrain forced:1 (no gate); stage1, chase and two stage2 skip:0.4 and forced:1; × 2 tasks
    expected = {
        (k, p, t)
        for k, r in trained.items()
        for t in TASKS
        for p in (["forced:1"] if r.data.tags["stage"] == "pretrain" else ["skip:0.4", "forced:1"])
    }
    assert sorted((r.data.tags["stage_key"], r.data.tags["policy"], r.data.tags["task"]) for r in runs) == sorted(
        expected
    )
    for r in runs:
        policy, task = ExitPolicy.parse(r.data.tags["policy"]), r.data.tags["task"]
        assert (
            r.info.status == "FINISHED"
            and r.data.tags["mlflow.parentRunId"] == trained[r.data.tags["stage_key"]].info.run_id
        )
        accuracy = r.data.metrics[tracking.policy_metric(policy, tracking.lm_eval_quantity(task))]
        loops = r.data.metrics[tracking.policy_metric(policy, tracking.lm_eval_quantity(task, tracking.LM_EVAL_LOOPS))]
        assert 0.0 <= accuracy <= 1.0 and (loops == 1.0 if policy.execution == "forced" else 1.0 <= loops <= R)
    sweep = mc.search_runs([exp], filter_string="tags.level = 'sweep'")[0]
    assert sweep.data.metrics[tracking.EVALS_RAN] == 18
    done = {p: p.stat().st_mtime_ns for p in (tmp_path / "store" / "stages").glob("*/done.json")}

    # the same sweep with one more q: that q only (4 gated checkpoints × 2 tasks), nothing trained
    assert sweep_main(argv + ["--eval-policies", "skip:0.4,0.8;forced:1"]) == 0
    out = capsys.readouterr().out
    assert "evaluations: 8 ran, 18 reused, 0 failed" in out and out.count("reused") >= 2
    runs = eval_runs(mc, exp)
    assert len(runs) == 26 and sum(r.data.tags["policy"] == "skip:0.8" for r in runs) == 8
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "store" / "stages").glob("*/done.json")} == done
    assert len(mc.search_runs([exp], filter_string="tags.level = 'stage' and tags.reused = 'false'")) == 5

    # analysis from the store: Fig. 3 and the downstream columns
    report = next((tmp_path / "store" / "analysis").glob("adaptive_pipeline-*"))
    import csv

    with open(report / "downstream.csv") as f:
        fig3 = list(csv.DictReader(f))
    assert {r["series"] for r in fig3} == {"forced depth (1⊗4)", "CHASE · skip", "Ouro · skip"}
    assert (report / "downstream.png").is_file()
    tables = (report / "tables" / "tables.md").read_text()
    assert "Downstream evaluation with exit gates" in tables and "looplab_toy_cloze" in tables
    from analysis.screenshot import check_report, find_browser

    if find_browser() is not None:
        found = check_report(report / "report.html")
        assert found["problems"] == [], found


def test_paper_tasks_read_local_parquet_by_content(tmp_path):
    """--eval-data DIR: the paper's task at its shots, its data the parquet files it reads
    (keyed by their bytes), its config lm-eval's own YAML with only the data replaced."""
    import pandas as pd

    rows = [{"goal": f"Open jar {i}", "sol1": "twist the lid", "sol2": "hit it", "label": i % 2} for i in range(6)]
    for root in (tmp_path / "a", tmp_path / "b"):
        (root / "piqa").mkdir(parents=True)
        for split in ("train", "validation"):
            pd.DataFrame(rows).to_parquet(root / "piqa" / f"{split}.parquet")
    a, b, hub = (
        tasks.paper_task("piqa", str(tmp_path / "a")),
        tasks.paper_task("piqa", str(tmp_path / "b")),
        tasks.paper_task("piqa", None),
    )
    assert (a.num_fewshot, a.metric) == (5, "acc_norm") and a.data.startswith("sha256:") and a.data == b.data
    assert hub.data == "hub:baber/piqa" and hub.version == a.version  # the same YAML, another source
    config = a.config()
    assert config["dataset_path"] == "parquet" and config["num_fewshot"] == 5
    assert Path(config["dataset_kwargs"]["data_files"]["validation"]).parent == (tmp_path / "a" / "piqa").resolve()
