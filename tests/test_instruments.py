"""Per-loop instruments (looplab/training/instruments.py) against independent references: the
per-application gradient terms add up to the ordinary backward pass; the active
fraction under given exits is the share of exits at or beyond each loop; the state gap
is zero where nobody left and positive where holes are; the first loop's norm is the
step API's own. And every stage's evaluation logs them under tracking's names."""

from __future__ import annotations

import json

import pytest
import torch

from looplab.config import ParentRef, apply_overrides
from looplab.models.looped import LoopedLM
from looplab.policy import ExitPolicy
from looplab.presets import get_preset, stage_config
from looplab.stages import get_stage
from looplab.tasks.base import Batch
from looplab.tracking import LOOP_QUANTITIES, loop_metric, parse_loop_metric, record_metrics
from looplab.training.instruments import (
    hidden_norms,
    loop_gradient_norms,
    loop_instruments,
    per_application_parameters,
    skip_profile,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(arch: str = "mamba2"):
    cfg = apply_overrides(
        get_preset("debug"),
        {
            "model.d_model": 32,
            "model.arch": arch,
            "model.n_loops": 3,
            "train.seq_len": 24,
            "model.attn_head_dim": 16,
            "model.rope_dim": 16,
        },
    )
    torch.manual_seed(0)
    model = LoopedLM(cfg.model).double()
    ids = torch.randint(0, cfg.model.vocab_size, (2, 24))
    return cfg, model, Batch(ids, torch.roll(ids, -1, dims=1))


def continued(cfg, stage: str):
    parent = ParentRef(stage="pretrain", key="k", group="g", checkpoint="unused")
    return stage_config(
        cfg,
        stage,
        parent=parent,
        overrides={"model.d_model": 32, "model.n_loops": 3, "train.seq_len": 24, "hole.lo": 1.5, "hole.hi": 2.5},
    )


@pytest.mark.parametrize("stage", ["pretrain", "stage1", "chase"])
@pytest.mark.parametrize("arch", ["mamba2", "transformer"])
def test_per_application_terms_add_up_to_the_gradient(stage, arch):
    cfg, model, batch = tiny(arch)
    cfg = cfg if stage == "pretrain" else continued(cfg, stage)
    loss, _ = get_stage(stage).minibatch_loss(model, batch, cfg, 3)
    reference = dict(
        zip(
            [n for n, _ in model.backbone.named_parameters()],
            torch.autograd.grad(loss, list(model.backbone.parameters())),
        )
    )
    with per_application_parameters(model) as copies:
        loss_again, _ = get_stage(stage).minibatch_loss(model, batch, cfg, 3)
        names = list(copies[0])
        grads = torch.autograd.grad(loss_again, [c[n] for c in copies for n in names], allow_unused=True)
    assert "step" not in vars(model)  # the method is back
    assert torch.equal(loss, loss_again)
    assert len(copies) == 3
    for i, name in enumerate(names):
        terms = [g for g in grads[i :: len(names)] if g is not None]
        assert torch.allclose(sum(terms), reference[name], atol=1e-12, rtol=1e-9), name
    norms = loop_gradient_norms(model, get_stage(stage), batch, cfg, 3)
    assert len(norms) == 3 and all(n > 0 for n in norms)


def test_stage2_trains_no_backbone_so_it_has_no_gradient_terms():
    cfg, model, batch = tiny()
    assert loop_gradient_norms(model, get_stage("stage2"), batch, continued(cfg, "stage2"), 0) == []


def test_active_fraction_and_state_gap_under_given_exits():
    cfg, model, batch = tiny()
    exit_at = torch.tensor([[3] * 24, [1, 3, 2, 3] * 6])  # row 0 never exits early; row 1 leaves holes
    active, gap = skip_profile(model, batch.ids, ExitPolicy.given(exit_at))
    for r in (1, 2, 3):
        assert active[r - 1] == pytest.approx(float((exit_at >= r).float().mean()))
    assert gap[0] == 0.0 and gap[1] > 1e-6 and gap[2] > 1e-6
    no_holes = torch.full_like(exit_at, 3)
    active, gap = skip_profile(model, batch.ids, ExitPolicy.given(no_holes))
    assert active == [1.0, 1.0, 1.0] and max(gap) < 1e-12


def test_first_loop_norm_is_the_step_apis():
    _, model, batch = tiny()
    with torch.no_grad():
        h1 = model.step(model.embed(batch.ids))
    assert hidden_norms(model, batch.ids)[0] == pytest.approx(float(h1.pow(2).mean(-1).sqrt().mean()))


def test_metric_names_round_trip():
    skip = ExitPolicy.skip(0.4)
    assert loop_metric("hidden_norm", 2) == "loop2_hidden_norm"
    assert loop_metric("state_gap", 3, skip) == "skip_q0.4_loop3_state_gap"
    for quantity in LOOP_QUANTITIES:
        assert parse_loop_metric(loop_metric(quantity, 4, skip)) == (skip, 4, quantity)
        assert parse_loop_metric(loop_metric(quantity, 1)) == (None, 1, quantity)
    for other in ("val_ppl", "loop0_hidden_norm", "loop2_bogus", "skip_q0.4_ppl"):
        assert parse_loop_metric(other) is None
    with pytest.raises(ValueError, match="quantity"):
        loop_metric("bogus", 1)
    record = {"kind": "loops", "step": 5, "metrics": {"loop1_hidden_norm": 1.5, "not_a_loop_metric": 2.0}}
    assert record_metrics(record) == {"loop1_hidden_norm": 1.5}


def test_every_stage_logs_its_instruments(tmp_path):
    from looplab.training.train import train

    over = {
        "model.d_model": 32,
        "train.steps": 2,
        "train.seq_len": 32,
        "train.batch_size": 2,
        "task.val_blocks": 2,
        "train.eval_every": 0,
        "train.eval_qs": [0.5, 1.0],
    }
    pre = apply_overrides(get_preset("debug"), over)
    train(pre, tmp_path / "pre", quiet=True)
    parent = pre.as_parent(str(tmp_path / "pre" / "checkpoint"))
    chase = stage_config(get_preset("debug"), "chase", parent=parent, overrides=over)
    train(chase, tmp_path / "chase", quiet=True)
    R = pre.model.n_loops
    for run, gated in (("pre", False), ("chase", True)):
        records = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        (loops,) = [r for r in records if r["kind"] == "loops"]
        names = set(loops["metrics"])
        assert {loop_metric(q, r) for q in ("hidden_norm", "grad_norm") for r in range(1, R + 1)} <= names
        skip_names = {loop_metric(q, r, ExitPolicy.skip(0.5)) for q in ("active", "state_gap") for r in range(1, R + 1)}
        assert skip_names <= names if gated else not skip_names & names
        (evaluation,) = [r for r in records if r["kind"] == "eval"]
        # Every stage evaluates the fixed-depth curve (forced 1..R-1): the per-loop CE.
        assert {p["policy"] for p in evaluation["policies"]} >= {f"forced:{d}" for d in range(1, R)}


def test_instruments_restore_the_model():
    cfg, model, batch = tiny()
    before = {n: p.clone() for n, p in model.named_parameters()}
    model.eval()
    out = loop_instruments(model, get_stage("stage1"), batch, continued(cfg, "stage1"), 0, "cpu")
    assert not model.training and "step" not in vars(model)
    assert all(torch.equal(before[n], p) and p.grad is None for n, p in model.named_parameters())
    assert out[loop_metric("hidden_norm", 1)] > 0
