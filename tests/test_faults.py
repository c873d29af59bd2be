"""Faults that must lose nothing: a run that diverges keeps its last finite checkpoint
current and stops (and stops again at once when restarted); a metrics.jsonl cut short
by a full disk resumes; a checkpoint that cannot be written leaves the previous one
current; a failed run says why on the dashboard."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import looplab.training.run_folder as run_folder
import looplab.training.train as train_module
from looplab import tracking
from looplab.checkpoint import load_model, parent_ref
from looplab.config import ConfigError, apply_overrides
from looplab.errors import CheckpointNotWritten, TrainingDiverged
from looplab.presets import get_preset, stage_config
from looplab.training.run_folder import DIVERGED, METRICS_FILE
from looplab.training.train import train

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**extra):
    return apply_overrides(
        get_preset("phop-debug"),
        {
            "train.steps": 8,
            "train.batch_size": 4,
            "train.ckpt_every": 2,
            "train.eval_every": 0,
            "train.log_every": 1,
            "task.eval_count": 20,
            **extra,
        },
    )


def nan_at(monkeypatch, step: int, where: str) -> None:
    """From `step` on, make the loss (where="loss") or one gradient (where="grad") NaN."""
    original = train_module.accumulate_gradients

    def accumulate(model, stage, batch, cfg, k, shard, device):
        loss, diag = original(model, stage, batch, cfg, k, shard, device)
        if k >= step and where == "loss":
            loss = float("nan")
        if k >= step and where == "grad":
            model.lm_head.weight.grad[0, 0] = float("inf")
        return loss, diag

    monkeypatch.setattr(train_module, "accumulate_gradients", accumulate)


@pytest.mark.parametrize(
    "where, what", [("loss", "the loss is nan"), ("grad", "the gradient of lm_head.weight is not finite")]
)
def test_divergence_keeps_the_last_finite_checkpoint(tmp_path, monkeypatch, where, what):
    nan_at(monkeypatch, 5, where)
    with pytest.raises(TrainingDiverged) as error:
        train(tiny(), tmp_path, quiet=True)
    message = str(error.value)
    assert message.count("\n") == 0 and "step 5" in message and what in message
    assert "the checkpoint of step 4 stays current" in message
    state = json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())
    assert state["step"] == 4
    model = load_model(tmp_path / "checkpoint")
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    # A restart (a sweep retries a failed trial) stops at once, naming the marker.
    monkeypatch.setattr(train_module, "accumulate_gradients", lambda *a: pytest.fail("trained again"))
    with pytest.raises(TrainingDiverged, match=f"before this run: .*{DIVERGED}"):
        train(tiny(), tmp_path, quiet=True)


def test_a_fresh_start_clears_the_marker(tmp_path, monkeypatch):
    nan_at(monkeypatch, 3, "loss")
    with pytest.raises(TrainingDiverged, match="the checkpoint of step 2"):
        train(tiny(), tmp_path, quiet=True)
    monkeypatch.undo()
    assert train(tiny(), tmp_path, quiet=True, resume=False).step == 8
    assert not (tmp_path / DIVERGED).exists()


def test_a_torn_metrics_line_resumes(tmp_path, capsys):
    train(tiny(), tmp_path, quiet=True, stop_at=4)
    path = tmp_path / METRICS_FILE
    path.write_text(path.read_text() + '{"kind": "train", "step": 5, "lo')  # the disk filled mid-append
    assert train(tiny(), tmp_path, quiet=True).step == 8
    assert "dropped a torn last line" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if json.loads(line)["kind"] == "train"]
    assert steps == list(range(1, 9))  # every step once


def test_a_damaged_line_before_the_last_is_one_line(tmp_path):
    train(tiny(), tmp_path, quiet=True, stop_at=4)
    path = tmp_path / METRICS_FILE
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:5]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=f"{METRICS_FILE} line 2 is not a JSON record"):
        train(tiny(), tmp_path, quiet=True)


def test_a_full_disk_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    original = run_folder.save_training_state

    def save(directory, model, optimizer, state):
        if state["step"] == 6:
            raise OSError(28, "No space left on device")
        return original(directory, model, optimizer, state)

    monkeypatch.setattr(run_folder, "save_training_state", save)
    with pytest.raises(CheckpointNotWritten) as error:
        train(tiny(), tmp_path, quiet=True)
    assert "the checkpoint of step 4 stays current" in str(error.value) and "No space left" in str(error.value)
    assert json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["step"] == 4


def test_a_failed_run_says_why(tmp_path):
    mc = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = tracking.ensure_experiment(mc, "faults", tmp_path / "mlflow")
    run = mc.create_run(experiment).info.run_id
    with pytest.raises(TrainingDiverged):
        with tracking.terminated_on_exit(mc, run):
            raise TrainingDiverged("training diverged at step 5: the loss is nan\nmore")
    got = mc.get_run(run)
    assert got.info.status == "FAILED"
    assert got.data.tags[tracking.ERROR_TAG] == "TrainingDiverged: training diverged at step 5: the loss is nan"


def test_a_second_invocation_of_a_sweep_is_refused(tmp_path, capsys):
    from sweeps import beta_ablation
    from sweeps.flags import Common, Launch
    from sweeps.launch import main
    from sweeps.lock import sweep_lock
    from sweeps.sweep import sweep_key
    from trainables.storage import Storage

    sweep = beta_ablation.beta_ablation(Common("debug"), [0.1])
    key = sweep_key(sweep, Launch(storage_path=str(tmp_path), seeds=(0,)))
    with sweep_lock(Storage(str(tmp_path)), key, sweep.name):  # the first invocation, running
        code = main(
            "test",
            beta_ablation.add_flags,
            beta_ablation.from_args,
            ["--preset", "debug", "--betas", "0.1", "--storage-path", str(tmp_path)],
        )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and f"sweep beta_ablation [{key}] is already running" in err
    assert f"pid {os.getpid()}" in err
    assert not (tmp_path / "mlflow.db").exists()  # refused before MLflow: no run marked KILLED


def test_a_dead_holder_leaves_no_lock(tmp_path):
    from sweeps.lock import SweepBusy, sweep_lock
    from trainables.storage import Storage

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nsys.path.insert(0, '.')\n"
            "from sweeps.lock import sweep_lock\nfrom trainables.storage import Storage\n"
            f"with sweep_lock(Storage({str(tmp_path)!r}), 'k', 's'):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parents[1]),
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(SweepBusy, match=f"pid {holder.pid}"):
        with sweep_lock(Storage(str(tmp_path)), "k", "s"):
            pass
    holder.kill()
    holder.wait()
    with sweep_lock(Storage(str(tmp_path)), "k", "s"):  # the kernel released the killed holder's flock
        pass


class _Bucket:
    """An object store as the lock sees one: objects by path, no locks."""

    remote = True

    def __init__(self):
        self.objects = {}

    def path(self, *parts):
        return "mem://b/" + "/".join(parts)

    def read_text(self, location):
        return self.objects.get(location)

    def write_text(self, location, text):
        self.objects[location] = text

    def delete_file(self, location):
        self.objects.pop(location, None)


def test_a_lease_on_an_object_store_expires(monkeypatch):
    import time

    from sweeps import lock

    bucket = _Bucket()
    lease = bucket.path("locks", "sweep-k.json")
    bucket.write_text(lease, json.dumps({"host": "other", "pid": 7, "since": "then", "renewed": time.time()}))
    with pytest.raises(lock.SweepBusy, match="host other, pid 7"):
        with lock.sweep_lock(bucket, "k", "s"):
            pass
    bucket.write_text(
        lease, json.dumps({"host": "other", "pid": 7, "since": "then", "renewed": time.time() - lock.LEASE_SECONDS - 1})
    )
    with lock.sweep_lock(bucket, "k", "s"):  # a lease nobody renewed: its driver is gone
        assert json.loads(bucket.read_text(lease))["pid"] == os.getpid()
    assert lease not in bucket.objects


def test_a_stopped_parent_is_not_the_finished_one(tmp_path):
    from looplab.checkpoint import parent_ref
    from looplab.presets import stage_config

    cfg = tiny()
    train(cfg, tmp_path, quiet=True, stop_at=4)
    stopped = parent_ref(tmp_path / "checkpoint")
    assert stopped.key == cfg.stage_key() + "@step4"
    child_of_stopped = stage_config(get_preset("phop-debug"), "stage1", parent=stopped).stage_key()
    train(cfg, tmp_path, quiet=True)
    finished = parent_ref(tmp_path / "checkpoint")
    assert finished.key == cfg.stage_key()  # a finished parent keeps the key the platform plans with
    assert stage_config(get_preset("phop-debug"), "stage1", parent=finished).stage_key() != child_of_stopped


def test_checkpoints_record_the_digest_of_their_weights(tmp_path):
    from looplab.checkpoint import WEIGHTS_DIGEST, file_digest

    train(tiny(), tmp_path, quiet=True)
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert config[WEIGHTS_DIGEST] == file_digest(tmp_path / "checkpoint" / "model.safetensors")


def test_the_command_line_says_a_divergence_in_one_line(tmp_path, monkeypatch, capsys):
    from looplab.cli import main

    nan_at(monkeypatch, 3, "loss")
    code = main(
        [
            "train",
            "--preset",
            "phop-debug",
            "--out",
            str(tmp_path),
            "train.steps=8",
            "train.batch_size=4",
            "train.ckpt_every=2",
            "train.eval_every=0",
            "task.eval_count=20",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and err.startswith("looplab: training diverged at step 3") and "step 2 stays current" in err


# ---- checkpoints that claim more than they hold -----------------------------------------------
def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def _copy_weights(source: Path, target: Path) -> None:
    """model.safetensors and config.json (a config.json records its weights' digest) from one
    checkpoint folder into another, trainer.json left as it was: weights copied by hand."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(source / name, target / name)


def test_a_trainer_json_claiming_more_steps_than_the_run_has_is_refused(tmp_path):
    train(tiny(), tmp_path, quiet=True, stop_at=4)
    state_file = tmp_path / "checkpoint" / "trainer.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "step": 1000}))
    with pytest.raises(ConfigError) as error:  # before: step-4 weights taken as finished, rc 0
        train(tiny(), tmp_path, quiet=True)
    message = one_line(error)
    assert str(state_file) in message and "step 1000" in message and "train.steps=8" in message


def test_weights_of_another_step_under_a_trainer_json_are_refused(tmp_path):
    train(tiny(), tmp_path / "early", quiet=True, stop_at=4)
    train(tiny(), tmp_path / "run", quiet=True, stop_at=6)
    _copy_weights(tmp_path / "early" / "checkpoint", tmp_path / "run" / "checkpoint")  # step-4 weights, step-6 state
    with pytest.raises(ConfigError) as error:
        train(tiny(), tmp_path / "run", quiet=True)
    message = one_line(error)
    assert "trainer.json disagrees with" in message and "model.safetensors" in message and "step 6" in message
    with pytest.raises(ConfigError, match="trainer.json disagrees with"):  # nor is it anyone's parent
        parent_ref(tmp_path / "run" / "checkpoint")


def test_weights_without_their_trainer_json_are_not_the_finished_parent(tmp_path):
    cfg = tiny()
    train(cfg, tmp_path / "run", quiet=True, stop_at=3)
    copied = tmp_path / "copied"
    _copy_weights(tmp_path / "run" / "checkpoint", copied)  # step-3 weights, no trainer.json
    ref = parent_ref(copied)
    assert ref.key != cfg.stage_key() and ref.key.startswith("weights-")  # before: the finished parent's key
    # A child planned on the finished parent (as a sweep plans its stages) never starts from them.
    child = stage_config(
        get_preset("phop-debug"),
        "stage1",
        parent=cfg.as_parent(str(copied)),
        overrides={"train.steps": 2, "train.batch_size": 4, "train.eval_every": 0, "task.eval_count": 20},
    )
    with pytest.raises(ConfigError) as error:
        train(child, tmp_path / "child", quiet=True)
    message = one_line(error)
    assert str(copied) in message and "trainer.json" in message and cfg.stage_key() in message
    # nor from a parent stopped before its end
    stopped = dataclasses.replace(child.parent, checkpoint=str(tmp_path / "run" / "checkpoint"))
    with pytest.raises(ConfigError, match="a parent stopped at step 3"):
        train(apply_overrides(child, {"parent": stopped}), tmp_path / "child", quiet=True)
    assert not (tmp_path / "child" / "checkpoint").exists()


def _parent_and_child(tmp_path, **parent_extra):
    """A finished parent in tmp_path/parent and its stage-1 child stopped at step 2 in tmp_path/child."""
    parent = tiny(**parent_extra)
    train(parent, tmp_path / "parent", quiet=True, resume=False)
    child = stage_config(
        get_preset("phop-debug"),
        "stage1",
        parent=parent_ref(tmp_path / "parent" / "checkpoint"),
        overrides={"train.steps": 4, "train.batch_size": 4, "train.eval_every": 0, "task.eval_count": 20},
    )
    return parent, child


def test_a_child_resumes_only_from_the_parent_weights_it_started_from(tmp_path):
    parent, child = _parent_and_child(tmp_path)
    train(child, tmp_path / "child", quiet=True, stop_at=2)
    state = json.loads((tmp_path / "child" / "checkpoint" / "trainer.json").read_text())
    recorded = json.loads((tmp_path / "parent" / "checkpoint" / "config.json").read_text())["weights_sha256"]
    assert state["parent_weights_sha256"] == recorded
    # The parent trained again under the same key: micro-batches change its float rounding only
    train(tiny(**{"train.micro_batch_size": 2}), tmp_path / "parent", quiet=True, resume=False)
    assert parent_ref(tmp_path / "parent" / "checkpoint").key == child.parent.key
    with pytest.raises(ConfigError) as error:  # before: resumed onto weights of another parent
        train(child, tmp_path / "child", quiet=True)
    message = one_line(error)
    assert "parent" in message and recorded[:19] in message and "--no-resume" in message
    assert train(child, tmp_path / "child", quiet=True, resume=False).step == 4


def test_a_finished_child_of_a_changed_parent_is_trained_again(tmp_path):
    from trainables.keyed_step import stage_record
    from trainables.shared_stage import write_done
    from trainables.storage import Storage

    parent, child = _parent_and_child(tmp_path)
    train(child, tmp_path / "child", quiet=True)
    storage = Storage(tmp_path)
    write_done(storage, str(tmp_path / "child"), {"run_id": "r"})

    def record():
        return stage_record(
            storage, str(tmp_path / "child"), str(tmp_path / "child" / "checkpoint"), 4, child.init_from
        )

    assert record().finished  # the parent holds the weights it started from
    before = json.loads((tmp_path / "parent" / "checkpoint" / "config.json").read_text())["weights_sha256"]
    train(tiny(**{"train.micro_batch_size": 2}), tmp_path / "parent", quiet=True, resume=False)
    after = json.loads((tmp_path / "parent" / "checkpoint" / "config.json").read_text())["weights_sha256"]
    assert after != before  # micro-batches change the parent's float rounding
    assert record().broken
    assert record().problem == f"trained from parent weights {before[:12]}, but its parent now holds {after[:12]}"


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("shape", "of shape [3, 3], not a float tensor of its parameter's shape"),
        ("extra", "nope::exp_avg"),
        ("nan", "non-finite"),
    ],
)
def test_a_damaged_optimizer_state_is_one_line(tmp_path, monkeypatch, damage, expected):
    from safetensors.torch import load_file, save_file

    train(tiny(), tmp_path, quiet=True, stop_at=4)
    path = tmp_path / "checkpoint" / "optimizer.safetensors"
    state = load_file(str(path))
    moment = next(k for k in state if k.endswith("::exp_avg"))
    if damage == "shape":
        state[moment] = torch.zeros(3, 3)
    elif damage == "extra":
        state["nope::exp_avg"] = torch.zeros(1)
    else:
        state[moment] = torch.full_like(state[moment], float("nan"))
    save_file(state, str(path))
    monkeypatch.setattr(train_module, "accumulate_gradients", lambda *a: pytest.fail("trained on it"))
    with pytest.raises(ConfigError) as error:  # before: RuntimeError, KeyError, "lower train.lr"
        train(tiny(), tmp_path, quiet=True)
    message = one_line(error)
    assert str(path) in message and expected in message and "lower train.lr" not in message
    assert not (tmp_path / DIVERGED).exists()


def test_a_checkpoint_without_its_trainer_json_is_no_training_state(tmp_path):
    """load_training_state of a folder holding weights and moments but no trainer.json
    (what it was given is no training checkpoint): one line naming the missing file,
    before any weight is loaded (it returned None, which its caller indexes)."""
    from looplab.checkpoint import TRAINER, load_training_state, save_training_state
    from looplab.models.looped import LoopedLM

    model = LoopedLM(tiny().model)
    optimizer = torch.optim.AdamW(model.parameters())
    save_training_state(tmp_path / "ckpt", model, optimizer, {"step": 0})
    (tmp_path / "ckpt" / TRAINER).unlink()
    with pytest.raises(ConfigError) as error:
        load_training_state(tmp_path / "ckpt", model, optimizer)
    assert str(tmp_path / "ckpt" / TRAINER) in one_line(error)


def test_a_torn_record_the_checkpoint_already_holds_is_said_lost(tmp_path, capsys):
    train(tiny(), tmp_path, quiet=True, stop_at=4)
    path = tmp_path / METRICS_FILE
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1]) == {**json.loads(lines[-1]), "kind": "train", "step": 4}
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:30])  # step 4's record torn, its checkpoint whole
    assert train(tiny(), tmp_path, quiet=True).step == 8
    warning = capsys.readouterr().err
    assert "the train record of step 4 is lost" in warning and "checkpoint of step 4" in warning
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if json.loads(line)["kind"] == "train"]
    assert steps == [1, 2, 3, 5, 6, 7, 8]


def test_a_torn_final_evaluation_is_written_again(tmp_path, capsys):
    train(tiny(), tmp_path, quiet=True)
    path = tmp_path / METRICS_FILE
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["kind"] == "loops" and json.loads(lines[-1])["step"] == 8
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])
    train(tiny(), tmp_path, quiet=True)  # a finished run evaluates again
    assert "the loops record of step 8, which the resumed run writes again" in capsys.readouterr().err
    assert json.loads(path.read_text().splitlines()[-1])["kind"] == "loops"
