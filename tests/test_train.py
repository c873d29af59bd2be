"""Training: schedule, resume to the same trajectory, checkpoints, load_model, CLI."""

import json
import math

import pytest
import torch

from looplab import load_model
from looplab.config import ConfigError, TrainConfig, apply_overrides
from looplab.presets import get_preset
from looplab.train import lr_at, train


def tiny_run(steps=12, **extra):
    return apply_overrides(get_preset("phop-debug"), {
        "train.steps": steps, "train.warmup_steps": 3, "train.batch_size": 8, "train.eval_every": 0,
        "train.log_every": 4, "task.eval_count": 40, **extra})


def test_lr_schedule_by_hand():
    cfg = TrainConfig(steps=10, warmup_steps=2, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.5)
    assert lr_at(1, cfg) == pytest.approx(1.0)
    assert lr_at(2, cfg) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr_at(5, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert lr_at(9, cfg) == pytest.approx(0.1)  # and ends on the floor


def test_resume_continues_the_same_loss_trajectory(tmp_path):
    cfg = tiny_run(steps=12)
    straight = train(cfg, tmp_path / "straight", quiet=True)
    first = train(cfg, tmp_path / "split", stop_at=5, quiet=True)
    assert first.step == 5 and not first.eval
    second = train(cfg, tmp_path / "split", quiet=True)
    assert len(straight.losses) == 12 and len(second.losses) == 7
    assert first.losses + second.losses == straight.losses  # bit for bit
    assert second.eval == straight.eval


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    train(tiny_run(steps=2), tmp_path, quiet=True)
    with pytest.raises(ConfigError, match="checkpoint of stage key .* --no-resume"):
        train(tiny_run(steps=2, **{"model.n_loops": 1}), tmp_path, quiet=True)


def test_training_reduces_loss_and_writes_metrics(tmp_path):
    cfg = tiny_run(steps=40, **{"train.lr": 3e-3})
    result = train(cfg, tmp_path, quiet=True)
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert records[-1]["kind"] == "eval" and [p["policy"] for p in records[-1]["policies"]] == ["full"]
    assert records[-1]["policies"][0]["n"] == 40


def test_checkpoint_round_trip_keeps_outputs_and_config(tmp_path):
    model = load_model("phop-debug", n_loops=2, seed=3)
    model.save(tmp_path / "m")
    again = load_model(tmp_path / "m")
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
    assert again.cfg == model.cfg
    assert torch.equal(again(ids).logits, model(ids).logits)
    assert again.metadata["task"] == "phop"
    assert not any(p.name.endswith((".pt", ".pkl", ".bin")) for p in (tmp_path / "m").iterdir())
    with pytest.raises(ConfigError, match="cannot change"):
        load_model(tmp_path / "m", n_loops=3)


def test_load_model_from_preset_with_overrides_is_seeded():
    a = load_model("phop-debug", arch="transformer", n_layers=2, attn_head_dim=16, rope_dim=16, seed=1)
    b = load_model("phop-debug", arch="transformer", n_layers=2, attn_head_dim=16, rope_dim=16, seed=1)
    c = load_model("phop-debug", arch="transformer", n_layers=2, attn_head_dim=16, rope_dim=16, seed=2)
    assert a.cfg.arch == "transformer" and a.cfg.n_layers == 2
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    with pytest.raises(ConfigError, match="preset"):
        load_model("no-such-preset")
    with pytest.raises(ConfigError, match="n_loops"):
        load_model("phop-debug", n_loops=0)


def test_trained_checkpoint_loads_with_load_model(tmp_path):
    result = train(tiny_run(steps=3), tmp_path, quiet=True)
    model = load_model(result.out_dir / "checkpoint")
    assert model.metadata["config_hash"] == tiny_run(steps=3).config_hash()
