"""Micro-batching and activation checkpointing trade time for memory and never change
the step: for every stage, the gradient of a batch split over ranks and micro-batches,
and the gradient with each loop recomputed in backward, equal the gradient of the
whole batch's loss taken in one piece (float64 models; the token CE itself is taken in
float32, hence the tolerances)."""

import pytest
import torch
from test_adaptive import gated_model
from test_stages import model_vocab, stage_cfg
from test_train import tiny_run

from looplab.config import apply_overrides
from looplab.stages import get_stage
from looplab.tasks import make_task
from looplab.tasks.base import IGNORE_INDEX, Batch
from looplab.training.distributed import Shard
from looplab.training.steps import accumulate_gradients
from looplab.training.train import train

CASES = {  # every stage, and both of CHASE's hole branches
    "pretrain": ("pretrain", {}),
    "stage1": ("stage1", {}),
    "chase-depth": ("chase", {"hole.rho": 1.0, "hole.sampler": "depth", "hole.hp": 0.6}),
    "chase-threshold": ("chase", {"hole.rho": 1.0, "hole.sampler": "threshold"}),
    "stage2": ("stage2", {}),
}


def uneven_batch(cfg, rows=6, seq=24, seed=0) -> Batch:
    """A batch whose rows carry very different numbers of targets (0 to all), so a
    split that weighed parts by rows instead of target tokens would show."""
    ids = make_task(cfg.task).train_batch(0, rows, seq, 0).ids
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, model_vocab(), ids.shape, generator=g)
    keep = torch.rand(ids.shape, generator=g) < torch.linspace(0.0, 1.0, rows).unsqueeze(1)
    return Batch(ids, torch.where(keep, targets, IGNORE_INDEX))


def assert_same_gradient(got: dict, want: dict) -> None:
    """Equal to float32 rounding, relative to each tensor's scale (a split weighed by
    rows instead of target tokens is off by tens of percent)."""
    assert got.keys() == want.keys() and want
    for name, g in want.items():
        err = (got[name] - g).abs().max().item()
        assert err <= 1e-5 * g.abs().max().item(), (name, err)


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def whole_batch_grads(model, batch, cfg, step=3):
    """The reference: the stage's loss over the whole batch, one backward."""
    model.zero_grad(set_to_none=True)
    loss, _ = get_stage(cfg.stage).minibatch_loss(model, batch, cfg, step)
    loss.backward()
    return loss.item(), grads(model)


def split_grads(model, batch, cfg, world, micro, step=3):
    """`world` ranks simulated in one process: each accumulates its rows, micro rows at
    a time; the sum over ranks divided by world is what the all-reduce leaves."""
    cfg = apply_overrides(cfg, {"train.micro_batch_size": micro})
    model.zero_grad(set_to_none=True)
    losses = [
        accumulate_gradients(model, get_stage(cfg.stage), batch, cfg, step, Shard(r, world), torch.device("cpu"))[0]
        for r in range(world)
    ]
    return sum(losses) / world, {n: g / world for n, g in grads(model).items()}


def model_for(stage):
    model = gated_model("hybrid", vocab_size=model_vocab())
    for name, p in model.named_parameters():
        p.requires_grad_(get_stage(stage).trainable(name))
    return model


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("world,micro", [(1, 1), (1, 4), (2, 2), (3, 0)])
def test_split_batch_gives_the_whole_batch_gradient(case, world, micro):
    stage, overrides = CASES[case]
    cfg = stage_cfg(stage, **overrides)
    model, batch = model_for(stage), uneven_batch(cfg)
    loss, reference = whole_batch_grads(model, batch, cfg)
    split_loss, split = split_grads(model, batch, cfg, world, micro)
    assert_same_gradient(split, reference)
    assert split_loss == pytest.approx(loss, rel=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_activation_checkpointing_gives_the_same_gradient(case):
    stage, overrides = CASES[case]
    cfg = stage_cfg(stage, **overrides)
    model = model_for(stage)  # hybrid: both kinds of mixer
    batch = uneven_batch(cfg)
    calls = []
    # The first layer: recomputation stops as soon as the saved tensors are back, so a
    # hook on the whole backbone (which returns last) would not see it.
    model.backbone.layers[0].register_forward_hook(lambda *_: calls.append(1))
    loss, reference = whole_batch_grads(model, batch, cfg)
    plain_calls = len(calls)
    model.checkpoint_steps = True
    recomputed_loss, recomputed = whole_batch_grads(model, batch, cfg)
    trains_backbone = stage != "stage2"  # Stage-2's backbone runs without a graph: nothing to recompute
    assert len(calls) - plain_calls == (2 if trains_backbone else 1) * plain_calls  # each loop ran again
    assert_same_gradient(recomputed, reference)
    assert recomputed_loss == loss


def test_training_with_micro_batches_and_checkpointing_follows_the_same_trajectory(tmp_path):
    """End to end (float32): the logged losses of a run split into micro-batches of one
    row, each loop recomputed, match the plain run's."""
    plain = train(tiny_run(steps=6), tmp_path / "plain", quiet=True)
    lean = train(
        tiny_run(steps=6, **{"train.micro_batch_size": 1, "train.activation_checkpointing": True}),
        tmp_path / "lean",
        quiet=True,
    )
    assert lean.losses == pytest.approx(plain.losses, rel=1e-4)
    assert lean.eval["accuracy"] == pytest.approx(plain.eval["accuracy"], abs=1 / 40)
