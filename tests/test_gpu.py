"""On a CUDA device (skipped without one; scripts/device_check.sh runs these with
`-m cuda`): the kernels are there, and the doctor's correctness checks pass on them in
bf16 and fp32: the scan, the decode step, and generation in every policy against the
full forward. A bf16 training step of a paper-sized block stays finite."""

from __future__ import annotations

import pytest
import torch

import looplab.doctor as doctor
from looplab.models.ops.dispatch import kernel_path

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICE = torch.device("cuda")


def test_the_kernels_run_on_this_gpu():
    path, why = kernel_path(torch.zeros(1, device=DEVICE))
    assert path == "cuda", why


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_kernels_match_the_torch_path(dtype):
    checks = doctor.scan_check(DEVICE, dtype) + doctor.step_check(DEVICE, dtype, kernel="cuda")
    assert all(c.status == doctor.PASS for c in checks), [c.line() for c in checks]


def test_generation_in_every_policy_matches_the_full_forward():
    checks = doctor.generation_check(DEVICE)
    assert all(c.status == doctor.PASS for c in checks), [c.line() for c in checks]


def test_a_bf16_training_step_is_finite():
    from looplab.config import apply_overrides
    from looplab.presets import get_preset

    cfg = apply_overrides(get_preset("paper-140m"), {"model.n_layers": 2, "train.batch_size": 2, "train.seq_len": 512})
    from looplab.training.steps import optimizer_step

    loss = optimizer_step(cfg, DEVICE)[0]()
    assert torch.isfinite(torch.tensor(loss)), loss


def test_a_plan_is_held_to_this_gpus_free_memory():
    """looplab/costs/machine.py on a GPU: the free bytes CUDA reports, the step's peak on
    the kernels' path against them, a batch no GPU holds refused in one line."""
    from looplab.config import ConfigError
    from looplab.costs import machine
    from looplab.presets import get_preset, stage_config

    free, total = torch.cuda.mem_get_info(DEVICE)
    assert 0 < machine.available_memory(DEVICE) <= total
    machine.check_training(stage_config(get_preset("debug"), "pretrain"), DEVICE)
    with pytest.raises(
        ConfigError,
        match="train.batch_size=1000000000 is invalid; allowed: a plan that fits this machine's available GPU memory",
    ):
        machine.check_training(
            stage_config(get_preset("debug"), "pretrain", overrides={"train.batch_size": 10**9}), DEVICE
        )
