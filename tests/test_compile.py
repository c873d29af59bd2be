"""train.compile: the compiled backbone trains along eager's trajectory (losses and
weights to float rounding) for every backbone, on the dense forward and on skip's
packed survivors (CHASE's depth holes), and the compiled function really ran."""

import re

import pytest
import torch

from looplab.config import ConfigError, TrainConfig, apply_overrides
from looplab.models.compiled import compiles
from looplab.training.train import optimizer_step
from test_stages import stage_cfg

STEPS = 3
ATTENTION = {"model.attn_head_dim": 16, "model.rope_dim": 16}
ARCHS = {"mamba2": {}, "transformer": {"model.arch": "transformer", **ATTENTION},
         "hybrid": {"model.arch": "hybrid", "model.n_layers": 2, "model.attn_layer_idx": (1,), **ATTENTION}}
CASES = {  # dense: Stage-1's full forward; skip: every minibatch packs its survivors
    "dense": ("stage1", {}),
    "skip": ("chase", {"hole.rho": 1.0, "hole.sampler": "depth", "hole.hp": 0.6}),
}


def trajectory(cfg):
    step, model = optimizer_step(cfg, "cpu")
    losses = [step() for _ in range(STEPS)]
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, model


# Compiling costs 30-60 s a case on 2 cores: the suite keeps one, the slow tier (.ci/run) all.
MATRIX = [pytest.param(arch, case, marks=[] if (arch, case) == ("mamba2", "skip") else [pytest.mark.slow])
          for arch in ARCHS for case in CASES]


@pytest.mark.parametrize("arch,case", MATRIX)
def test_compiled_training_follows_eager(arch, case):
    stage, overrides = CASES[case]
    cfg = stage_cfg(stage, **ARCHS[arch], **overrides, **{"train.batch_size": 4})
    eager_losses, eager_weights, _ = trajectory(apply_overrides(cfg, {"train.compile": "off"}))
    torch._dynamo.reset()
    compiled_losses, compiled_weights, model = trajectory(apply_overrides(cfg, {"train.compile": "on"}))
    assert model.compiled_backbone.shapes  # the dense first loop's shape (skip's packed loops run eager)
    # The compiled function ran: dynamo produced graphs for it (a silent fallback would not).
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)
    for name, w in eager_weights.items():
        assert torch.allclose(compiled_weights[name], w, rtol=1e-4, atol=1e-5), name


def test_compile_setting():
    assert compiles("auto", torch.device("cuda")) and not compiles("auto", torch.device("cpu"))
    assert compiles("on", torch.device("cpu")) and not compiles("off", torch.device("cuda"))
    with pytest.raises(ConfigError, match=re.escape("TrainConfig.compile='yes' is invalid; allowed: auto | on | off")):
        TrainConfig(compile="yes")
