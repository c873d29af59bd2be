"""Adding a stage is one registry entry plus one loss function (looplab/stages.py):
a toy stage registered here alone is validated, keyed, planned by the sweeps' dry run
(memory, FLOPs, micro-batches) and trained through looplab.training.train, with nothing else
edited. Its facts match pre-training's (it trains everything and its loss reads the
final loop), so its plan must equal pre-training's at the same settings: the plan
reads the facts, not the name."""

import math

import pytest

from looplab.checkpoint import read_config
from looplab.config import ConfigError, apply_overrides
from looplab.costs.memory import step_memory
from looplab.costs.resources import flops_per_token
from looplab.keys import stage_folder
from looplab.models.head import token_losses
from looplab.presets import get_preset, stage_config
from looplab.stages import (
    FINAL_LOOP,
    STAGE_NAMES,
    TRAINS_ALL,
    Recipe,
    Stage,
    get_stage,
    method_of,
    register,
    stage_loss,
    unregister,
)
from looplab.training.objectives import final_loop_loss
from looplab.training.train import train
from sweeps.dry_run import describe
from sweeps.flags import Launch
from sweeps.sweep import Sweep, fit_devices, validate
from trainables.pipeline import PipelineSpec, stage_configs, stage_dir

TOY = "toy"
CALLS = []  # (stage name, step) of every toy loss evaluated


def toy_minibatch(model, batch, cfg, step, rows):
    """Mean next-token CE at the final loop from full logits: a loss written in a few lines."""
    CALLS.append((cfg.stage, step))
    return final_loop_loss(token_losses(model(batch.ids).logits, batch.targets), batch.targets), {}


def toy_entry() -> Stage:
    return Stage(
        TOY,
        method="toy",
        continues=True,
        gated=False,
        trains=TRAINS_ALL,
        loss_reads=FINAL_LOOP,
        recipe=Recipe(lr=2e-3, min_lr=2e-4, warmup_fraction=0.5, grad_clip=1.0),
        doc="a test's stage: final-loop CE, continuing pre-training",
    )


@pytest.fixture
def toy_stage():
    """The whole addition: the entry and its loss. Removed afterwards."""
    stage = register(toy_entry())
    stage_loss(TOY)(toy_minibatch)
    CALLS.clear()
    yield stage
    unregister(TOY)


def toy_spec(overrides=None, **declaration) -> PipelineSpec:
    return PipelineSpec(
        preset="phop-debug",
        stages=("pretrain", TOY),
        overrides={"task.eval_count": 40, "model.n_loops": 3, **(overrides or {})},
        **declaration,
    )


def test_a_registered_stage_is_a_choice_everywhere(toy_stage):
    assert TOY in STAGE_NAMES and STAGE_NAMES[-1] == TOY and toy_stage.order == len(STAGE_NAMES) - 1
    assert get_stage(TOY).loss is toy_minibatch
    with pytest.raises(ConfigError, match="parent"):  # it continues a parent: config validation demands one
        apply_overrides(get_preset("phop-debug"), {"stage": TOY})
    with pytest.raises(ConfigError, match="registered already"):
        register(toy_entry())


def test_an_unregistered_stage_leaves_no_trace():
    register(toy_entry())
    stage_loss(TOY)(toy_minibatch)
    unregister(TOY)
    assert TOY not in STAGE_NAMES and list(STAGE_NAMES) == [
        "pretrain",
        "stage1",
        "chase",
        "stage2",
        "pretrain_more",
        "stage1_more",
    ]
    with pytest.raises(ConfigError, match="stage='toy' is invalid"):
        apply_overrides(get_preset("phop-debug"), {"stage": TOY})
    with pytest.raises(ConfigError, match="stage='toy' is invalid"):
        stage_loss(TOY)  # a loss for no stage


def test_the_dry_run_plans_a_toy_stage_from_its_facts(toy_stage, tmp_path):
    """Two learning rates searched in the toy stage: one pre-training shared by both."""
    sweep = Sweep(
        name="toy", spec=toy_spec(searched={"lr": "train.lr"}, searched_stages=(TOY,)), grid={"lr": [1e-3, 3e-3]}
    )
    launch = Launch(storage_path=str(tmp_path), gpu_memory=80.0)
    points, resources = validate(sweep, launch)
    sweep, plans = fit_devices(sweep, launch, points)
    trials = [stage_configs(sweep.spec, point, launch.storage_path) for point in points]
    assert len(plans) == 3 and len({pre.stage_key() for pre, _ in trials}) == 1
    for (pre, toy), lr in zip(trials, [1e-3, 3e-3]):
        assert toy.stage == TOY and toy.parent.key == pre.stage_key() and toy.train.lr == lr
        assert toy.train.min_lr_ratio == pytest.approx(0.1) and toy.train.steps == pre.train.steps  # its recipe
    text = describe(sweep, launch, points, resources, plans)
    assert "stages: 3 to train (1 reused across trials)" in text
    toy = trials[0][1]
    planned = plans[stage_folder(TOY, toy.stage_key())]
    assert f"{stage_folder(TOY, toy.stage_key())}: {planned.line()}" in text
    # Same facts as pre-training (trains everything, reads the final loop, no gate):
    # the same memory and FLOPs per token.
    as_pretrain = stage_config(
        get_preset("phop-debug"),
        "pretrain",
        overrides={**sweep.spec.overrides, **sweep.spec.stage_overrides.get(TOY, {})},
    )
    assert step_memory(toy, planned.micro_batch, path="cuda") == step_memory(
        as_pretrain, planned.micro_batch, path="cuda"
    )
    for ckpt in (False, True):
        assert flops_per_token(toy, ckpt) == flops_per_token(as_pretrain, ckpt)


def test_a_toy_stage_trains_through_looplab_train_on_its_parent(toy_stage, tmp_path):
    spec = toy_spec(
        {"train.steps": 2, "train.batch_size": 4, "train.eval_every": 0, "train.log_every": 1, "train.eval_limit": 8}
    )
    pre, toy = stage_configs(spec, {}, tmp_path)
    train(pre, stage_dir(tmp_path, pre), quiet=True)
    assert CALLS == []  # pre-training uses its own loss
    result = train(toy, stage_dir(tmp_path, toy), quiet=True)
    assert result.step == 2 and all(math.isfinite(loss) for loss in result.losses)
    # Two training steps, then the final evaluation's per-loop instruments (the gradient
    # each loop's application gets from the stage's loss, looplab/training/instruments.py).
    assert CALLS == [(TOY, 0), (TOY, 1), (TOY, 2)]
    meta = read_config(result.out_dir / "checkpoint")["metadata"]
    assert meta["lineage"] == ["pretrain", TOY] and meta["method"] == method_of(["pretrain", TOY]) == "toy"
