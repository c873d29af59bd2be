"""The `looplab` command as a person uses it."""

import json

from looplab.cli import main
from looplab.tasks.mano import evaluate_prefix
from looplab.tasks.phop import hop_trace


def lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_data_mano_prints_valid_json_lines(capsys):
    assert main(["data", "mano", "--L", "4", "--count", "20", "--seed", "1"]) == 0
    records = lines(capsys)
    assert len(records) == 20
    for r in records:
        assert 1 <= r["length"] <= 4
        assert sum(tok in "+-*" for tok in r["expression"]) == r["length"]
        assert evaluate_prefix(r["expression"]) == r["answer"]
    assert main(["data", "mano", "--L", "4", "--eval", "--count", "5", "--seed", "1"]) == 0
    assert all(r["length"] == 4 for r in lines(capsys))


def test_data_phop_prints_valid_json_lines(capsys):
    assert main(["data", "phop", "--n", "32", "--p", "3", "--alphabet", "4", "--count", "10", "--seed", "2"]) == 0
    for r in lines(capsys):
        seq = r["sequence"]
        assert len(seq) == 32 and r["p"] == 3 and set(seq) <= {0, 1, 2, 3}
        trace = hop_trace(seq, 3)
        assert trace is not None and seq[trace[-1]] == r["answer"]


def test_train_command_runs_and_resumes(tmp_path, capsys):
    args = [
        "train",
        "--preset",
        "phop-debug",
        "--out",
        str(tmp_path),
        "train.steps=4",
        "train.batch_size=4",
        "task.eval_count=20",
        "train.eval_every=0",
    ]
    assert main(args + ["--stop-at", "2"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["step"] == 2
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    assert summary["step"] == 4 and 0 <= summary["eval_accuracy"] <= 1
    assert "resumed from" in captured.err and (tmp_path / "checkpoint" / "model.safetensors").is_file()


def test_bad_override_is_one_line_error(capsys):
    assert main(["train", "--preset", "phop-debug", "--out", "/tmp/unused", "model.n_layers=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("looplab: error: override='model.n_layers=0' is invalid") and "\n" not in err


def test_eval_command_prints_a_sweep(tmp_path, capsys):
    args = [
        "train",
        "--preset",
        "phop-debug",
        "--out",
        str(tmp_path / "pre"),
        "train.steps=2",
        "train.batch_size=4",
        "task.eval_count=20",
        "train.eval_every=0",
        "model.n_loops=4",
    ]
    assert main(args) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(tmp_path / "pre" / "checkpoint"),
                "--policies",
                "dense:0.5,1.0;skip:0.5,1.0;forced:1-3;full",
                "--json",
                str(tmp_path / "sweep.json"),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["policy"] for r in records] == [
        "dense:0.5",
        "dense:1.0",
        "skip:0.5",
        "skip:1.0",
        "forced:1",
        "forced:2",
        "forced:3",
        "full",
    ]
    assert [r["executed_loops"] for r in records[4:]] == [1.0, 2.0, 3.0, 4.0]
    assert "policy" in captured.err and json.loads((tmp_path / "sweep.json").read_text()) == [
        {k: v for k, v in r.items() if k not in ("checkpoint", "stage")} for r in records
    ]


def test_train_stage_uses_the_app_e_recipe(tmp_path, capsys):
    common = ["train.steps=2", "train.batch_size=4", "task.eval_count=20", "train.eval_every=0"]
    assert main(["train", "--preset", "phop-debug", "--out", str(tmp_path / "pre"), *common]) == 0
    assert (
        main(
            [
                "train",
                "--preset",
                "phop-debug",
                "--stage",
                "stage1",
                "--init",
                str(tmp_path / "pre" / "checkpoint"),
                "--out",
                str(tmp_path / "s1"),
                *common,
                "exit.beta=0.5",
            ]
        )
        == 0
    )
    capsys.readouterr()
    from looplab import load_model

    meta = load_model(tmp_path / "s1" / "checkpoint").metadata
    train_cfg = meta["experiment"]["train"]
    assert meta["stage"] == "stage1" and meta["parent_checkpoint"] == str((tmp_path / "pre" / "checkpoint").resolve())
    assert (train_cfg["lr"], train_cfg["grad_clip"]) == (1.5e-4, 0.6)
    assert train_cfg["lr"] * train_cfg["min_lr_ratio"] == __import__("pytest").approx(8e-5)
    assert meta["experiment"]["exit"]["beta"] == 0.5
    records = [json.loads(x) for x in (tmp_path / "s1" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert "exit_entropy" in train_records[-1] and "expected_exit_step" in train_records[-1]
    evaluated = [p["policy"] for r in records if r["kind"] == "eval" for p in r["policies"]]
    assert {p.partition(":")[0] for p in evaluated} == {"full", "dense", "skip", "forced"}
