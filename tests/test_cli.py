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
    args = ["train", "--preset", "phop-debug", "--out", str(tmp_path), "train.steps=4", "train.batch_size=4",
            "task.eval_count=20", "train.eval_every=0"]
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
    assert err.startswith("looplab: ModelConfig.n_layers=0 is invalid") and "\n" not in err
