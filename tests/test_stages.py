"""Training stages: what each branch trains, hole sampling, and the full pipeline."""

import numpy as np
import pytest
import torch
from test_adaptive import gated_model

from looplab.checkpoint import parent_ref
from looplab.config import ConfigError, ExperimentConfig, HoleConfig, apply_overrides
from looplab.evaluation.validation import evaluate_policies
from looplab.policy import ExitPolicy, round_depth
from looplab.presets import get_preset, stage_config
from looplab.stages import get_stage
from looplab.tasks import make_task
from looplab.training.holes import sample_depth_holes, target_depths
from looplab.training.train import train


def stage_cfg(stage, init_from="/unused", **extra):
    """phop-debug as `stage` (its recipe), continuing the checkpoint at init_from."""
    parent = parent_ref(init_from) if get_stage(stage).continues else None
    return stage_config(
        get_preset("phop-debug"), stage, parent=parent, overrides={"model.n_loops": 4, "task.eval_count": 40, **extra}
    )


def minibatch_loss(model, batch, cfg, step):
    return get_stage(cfg.stage).minibatch_loss(model, batch, cfg, step)


def gate_grads(model, cfg, step=0):
    model.zero_grad(set_to_none=True)
    batch = make_task(cfg.task).train_batch(step, 4, 32, 0)
    loss, _ = minibatch_loss(model, batch, cfg, step)
    loss.backward()
    return model.exit_gate.weight.grad, next(model.backbone.parameters()).grad


def test_dense_stage1_trains_gate_and_backbone():
    model = gated_model("mamba2", vocab_size=model_vocab())
    gate, backbone = gate_grads(model, stage_cfg("stage1"))
    assert gate is not None and gate.abs().sum() > 0
    assert backbone is not None and backbone.abs().sum() > 0


def test_threshold_hole_branch_gives_the_gate_no_gradient():
    cfg = stage_cfg("chase", **{"hole.sampler": "threshold", "hole.rho": 1.0})
    model = gated_model("mamba2", vocab_size=model_vocab())
    gate, backbone = gate_grads(model, cfg)
    assert gate is None or gate.abs().sum() == 0
    assert backbone is not None and backbone.abs().sum() > 0


def test_chase_with_rho_zero_is_stage1():
    model = gated_model("mamba2", vocab_size=model_vocab())
    batch = make_task(stage_cfg("stage1").task).train_batch(0, 4, 32, 0)
    a, _ = minibatch_loss(model, batch, stage_cfg("stage1"), 0)
    b, diag = minibatch_loss(model, batch, stage_cfg("chase", **{"hole.rho": 0.0}), 0)
    assert diag["hole_branch"] == 0.0 and torch.equal(a, b)


def test_depth_hole_branch_runs_stage1_on_the_holed_forward():
    cfg = stage_cfg(
        "chase", **{"hole.sampler": "depth", "hole.rho": 1.0, "hole.hp": 1.0, "hole.lo": 1.0, "hole.hi": 1.0}
    )
    model = gated_model("mamba2", vocab_size=model_vocab())
    batch = make_task(cfg.task).train_batch(0, 4, 32, 0)
    loss, diag = minibatch_loss(model, batch, cfg, 0)
    assert diag["executed_loops"] == 1.0  # every position holed at depth 1
    # Every token exits after step 1, so every later step reads the same frozen state.
    out = model(batch.ids, ExitPolicy.given(torch.ones_like(batch.ids)), all_steps=True)
    for h in out.step_hidden[1:]:
        assert torch.equal(h, out.step_hidden[0])


def test_stage2_changes_only_the_gate(tmp_path):
    pre = train(stage_cfg("pretrain", **{"train.steps": 3}), tmp_path / "pre", quiet=True)
    cfg = stage_cfg("stage2", str(pre.out_dir / "checkpoint"), **{"train.steps": 3})
    before = {k: v.clone() for k, v in _load(pre.out_dir / "checkpoint").state_dict().items()}
    after = _load(train(cfg, tmp_path / "s2", quiet=True).out_dir / "checkpoint").state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"exit_gate.weight", "exit_gate.bias"}


def test_stage2_trains_only_the_gate_by_the_registry():
    model = gated_model("mamba2", vocab_size=model_vocab())
    stage = get_stage("stage2")
    assert {n for n, _ in model.named_parameters() if stage.trainable(n)} == {"exit_gate.weight", "exit_gate.bias"}
    assert all(get_stage("stage1").trainable(n) for n, _ in model.named_parameters())


def test_depth_holes_follow_the_configured_distribution():
    cfg = HoleConfig(hp=0.3, lo=1.85, hi=3.45, bins=8, rounding="stochastic")
    steps = sample_depth_holes(np.random.default_rng(0), cfg, (200, 500), n_loops=4).numpy()
    holed = steps < 4
    assert 0.2 < holed.mean() < 0.3  # hp minus the holes whose depth rounds up to R
    assert steps.min() >= 1 and steps.max() <= 4
    assert target_depths(cfg).tolist() == pytest.approx(np.linspace(1.85, 3.45, 8).tolist())
    # Stochastic rounding keeps the mean depth: E[step] over holed positions = mean target depth.
    depth = np.full(100_000, 2.3)
    assert round_depth(depth, "stochastic", np.random.default_rng(1)).mean() == pytest.approx(2.3, abs=0.01)
    assert set(round_depth(np.array([1.5, 2.49, 2.5]), "nearest", None)) == {2, 3}


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"hole.hp": 1.5}, "hp"),
        ({"hole.rho": -0.1}, "rho"),
        ({"hole.lo": 0.5}, "lo"),
        ({"hole.hi": 5.0}, "hi"),
        ({"exit.beta": -1.0}, "beta"),
        ({"hole.q_high": 2.0}, "q_high"),
    ],
)
def test_bad_adaptive_values_fail_in_one_line(overrides, field):
    with pytest.raises(ConfigError) as err:
        stage_cfg("chase", **overrides)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_unknown_stage_fails_in_one_line():
    with pytest.raises(ConfigError, match="stage='stage3' is invalid"):
        apply_overrides(get_preset("phop-debug"), {"stage": "stage3"})


def test_an_arm_names_each_stage_once():
    """A repeated stage would train (each occurrence its own key), but the analysis reads a
    trial's final stage by its name, so both occurrences would count as final: refused."""
    from trainables.pipeline import PipelineSpec

    with pytest.raises(ConfigError, match=r"PipelineSpec.arms.fixed-twice=.* is invalid; allowed: each stage once"):
        PipelineSpec(
            preset="debug", stages=("pretrain",), arms={"fixed-twice": ("pretrain", "pretrain_more", "pretrain_more")}
        )
    PipelineSpec(preset="debug", stages=("pretrain",), arms={"fixed": ("pretrain", "pretrain_more")})


def test_continued_stage_needs_a_parent_and_pretrain_has_none():
    with pytest.raises(ConfigError, match="ExperimentConfig.parent=None is invalid"):
        apply_overrides(get_preset("phop-debug"), {"stage": "stage1"})
    with pytest.raises(ConfigError, match="ExperimentConfig.parent=.* is invalid"):
        ExperimentConfig.from_dict(
            {**get_preset("phop-debug").to_dict(), "parent": {"stage": "pretrain", "key": "k", "group": "g"}}
        )


def test_pipeline_pretrain_stage1_chase_stage2_end_to_end(tmp_path):
    common = {
        "train.steps": 30,
        "train.batch_size": 16,
        "train.eval_every": 0,
        "train.warmup_steps": 3,
        "train.log_every": 10,
    }
    pre = train(stage_cfg("pretrain", **common), tmp_path / "pre", quiet=True)
    s1 = train(
        stage_cfg("stage1", str(pre.out_dir / "checkpoint"), **common, **{"exit.beta": 0.1}),
        tmp_path / "s1",
        quiet=True,
    )
    ch = train(
        stage_cfg("chase", str(s1.out_dir / "checkpoint"), **common, **{"hole.sampler": "depth", "hole.rho": 0.5}),
        tmp_path / "chase",
        quiet=True,
    )
    s2 = train(stage_cfg("stage2", str(ch.out_dir / "checkpoint"), **common), tmp_path / "s2", quiet=True)
    model = _load(s2.out_dir / "checkpoint")
    assert model.metadata["stage"] == "stage2" and model.metadata["parent_checkpoint"].endswith("chase/checkpoint")
    assert model.metadata["lineage"] == ["pretrain", "stage1", "chase", "stage2"]
    assert model.metadata["method"] == "CHASE"
    records = evaluate_policies(
        model,
        make_task(stage_cfg("pretrain").task).eval_batch(),
        [ExitPolicy.skip(q) for q in (0.2, 0.4, 0.6, 0.8, 1.0)],
    )
    loops = [r["executed_loops"] for r in records]  # q = 0.2 … 1.0
    assert all(a <= b + 1e-9 for a, b in zip(loops, loops[1:])), loops
    assert loops[0] < loops[-1] == 4.0


def model_vocab():
    return get_preset("phop-debug").model.vocab_size


def _load(path):
    from looplab import load_model

    return load_model(path)
