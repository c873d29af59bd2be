"""Training: schedule, resume to the same trajectory, checkpoints, load_model, CLI."""

import json
import math

import pytest
import torch

from looplab import load_model
from looplab.checkpoint import save_model
from looplab.config import ConfigError, TrainConfig, apply_overrides
from looplab.presets import get_preset
from looplab.training.steps import lr_at
from looplab.training.train import train


def tiny_run(steps=12, **extra):
    return apply_overrides(
        get_preset("phop-debug"),
        {
            "train.steps": steps,
            "train.warmup_steps": 3,
            "train.batch_size": 8,
            "train.eval_every": 0,
            "train.log_every": 4,
            "task.eval_count": 40,
            **extra,
        },
    )


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


def test_a_compiled_run_steps_with_fused_adamw_and_resumes_an_eager_checkpoint(tmp_path, monkeypatch):
    """train.compile is no key: a run checkpointed eager (AdamW's multi-tensor loop) goes
    on compiled (its fused kernel) and follows the uninterrupted eager run's losses to
    float rounding, and the other way round."""
    from looplab.models import compiled
    from looplab.training.steps import make_optimizer

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")  # Inductor's C++ builds: the slow tier's
    cfg = tiny_run(steps=6)
    model = torch.nn.Linear(2, 2)
    for setting, fused in (("on", True), ("off", None)):
        run = apply_overrides(cfg, {"train.compile": setting})
        assert make_optimizer(model, run.train, torch.device("cpu")).defaults["fused"] is fused
    straight = train(cfg, tmp_path / "straight", quiet=True).losses
    for first, then in (("off", "on"), ("on", "off")):
        out = tmp_path / f"{first}-{then}"
        head = train(apply_overrides(cfg, {"train.compile": first}), out, stop_at=3, quiet=True).losses
        tail = train(apply_overrides(cfg, {"train.compile": then}), out, quiet=True).losses
        assert head + tail == pytest.approx(straight, rel=1e-4), (first, then)


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
    evaluation, loops = records[-2:]  # the final evaluation, then its per-loop instruments
    R = cfg.model.n_loops
    assert evaluation["kind"] == "eval" and loops["kind"] == "loops"
    assert [p["policy"] for p in evaluation["policies"]] == ["full"] + [f"forced:{d}" for d in range(1, R)]
    assert evaluation["policies"][0]["n"] == 40


def test_checkpoint_round_trip_keeps_outputs_and_config(tmp_path):
    model = load_model("phop-debug", n_loops=2, seed=3)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
    assert again.cfg == model.cfg
    assert torch.equal(again(ids).logits, model(ids).logits)
    assert again.metadata["task"] == "phop"
    assert not any(p.name.endswith((".pt", ".pkl", ".bin")) for p in (tmp_path / "m").iterdir())
    with pytest.raises(ConfigError, match="cannot change"):
        load_model(tmp_path / "m", n_loops=3)


def test_a_checkpoints_files_take_the_umasks_mode(tmp_path):
    """safetensors creates its files 0600: a training checkpoint's weights and moments
    get the mode every other file of the folder gets under the umask."""
    import os
    import stat

    from looplab.checkpoint import save_training_state

    model = load_model("phop-debug", n_loops=2, seed=3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, model.cfg.vocab_size, (2, 9))).logits.sum().backward()
    optimizer.step()
    before = os.umask(0o027)
    try:
        save_training_state(tmp_path / "ckpt", model, optimizer, {"step": 1})
    finally:
        os.umask(before)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "ckpt").iterdir()}
    assert modes and set(modes.values()) == {0o640}, modes


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


def test_a_resumed_run_logs_every_step_once(tmp_path):
    """An interrupted run resumed from its checkpoint: metrics.jsonl drops what the
    interrupted run wrote after the checkpoint (the resumed run writes it again), so
    each step is there once, and the resume is on record."""
    cfg = tiny_run(steps=12, **{"train.log_every": 1, "train.ckpt_every": 4})
    log = tmp_path / "metrics.jsonl"
    train(cfg, tmp_path, stop_at=6, quiet=True)  # checkpoints at 4 (cadence) and 6 (the stop)
    # Pretend the process died after step 8 with its newest checkpoint at 6.
    with log.open("a") as f:
        f.write(json.dumps({"kind": "train", "step": 7, "loss": 9.0}) + "\n")
        f.write(json.dumps({"kind": "train", "step": 8, "loss": 9.0}) + "\n")
    train(cfg, tmp_path, quiet=True)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 13))
    assert [r["step"] for r in records if r["kind"] == "resume"] == [6]
    assert all(r["loss"] != 9.0 for r in records if r["kind"] == "train")
    train(cfg, tmp_path, resume=False, quiet=True)  # starting over starts the history over
    assert [json.loads(x)["step"] for x in log.read_text().splitlines() if json.loads(x)["kind"] == "train"] == list(
        range(1, 13)
    )


def test_checkpoints_follow_the_wall_clock_too(tmp_path):
    """ckpt_minutes: a checkpoint as soon as that much time passed (here ~0), whatever
    ckpt_every says; each replaces the previous whole (only the newest is kept)."""
    saved = []
    cfg = tiny_run(steps=3, **{"train.ckpt_every": 0, "train.ckpt_minutes": 1e-9})
    train(
        cfg,
        tmp_path,
        on_checkpoint=lambda step, path: saved.append((step, sorted(p.name for p in path.iterdir()))),
        quiet=True,
    )
    assert [s for s, _ in saved] == [1, 2, 3]
    assert all(
        files == ["config.json", "model.safetensors", "optimizer.safetensors", "trainer.json"] for _, files in saved
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.jsonl"]  # no .next / .prev left
    saved.clear()
    train(
        tiny_run(steps=3, **{"train.ckpt_every": 0, "train.ckpt_minutes": 0}),
        tmp_path / "b",
        on_checkpoint=lambda step, path: saved.append(step),
        quiet=True,
    )
    assert saved == [3]  # only the end


def test_a_crash_during_a_checkpoint_swap_is_settled(tmp_path):
    """save_training_state writes <dir>.next whole, then swaps; a crash between the
    swap's two renames leaves <dir>.next or <dir>.prev alone: the next load settles it."""
    import os

    from looplab.checkpoint import settle_checkpoint

    cfg = tiny_run(steps=4, **{"train.ckpt_every": 2})
    train(cfg, tmp_path / "a", stop_at=2, quiet=True)
    ckpt = tmp_path / "a" / "checkpoint"
    os.replace(ckpt, tmp_path / "a" / "checkpoint.next")  # the new one written, not yet in place
    settle_checkpoint(ckpt)
    assert json.loads((ckpt / "trainer.json").read_text())["step"] == 2
    assert not (tmp_path / "a" / "checkpoint.next").exists()
    os.replace(ckpt, tmp_path / "a" / "checkpoint.prev")  # the old one moved out, the new one lost
    (tmp_path / "a" / "checkpoint.next").mkdir()  # a half-written new one: no trainer.json
    assert train(cfg, tmp_path / "a", quiet=True).step == 4  # resumes from the previous complete one
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "resume"] == [2]
