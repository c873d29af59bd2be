"""A plan held to this machine before anything is allocated (looplab/costs/machine.py):
the memory reading, the training check against a plan computed here by hand (the
available memory set small, so that a modest batch is refused and a small one fits),
its one override, the time floor, and the decoding checks."""

from __future__ import annotations

import math

import pytest

from looplab.config import MAX_STEPS, ConfigError
from looplab.costs import machine
from looplab.costs.memory import step_memory
from looplab.costs.resources import flops_per_token
from looplab.presets import get_preset, stage_config

MiB = 2**20


def debug(**overrides):
    return stage_config(get_preset("debug"), "pretrain", overrides=overrides)


@pytest.fixture
def memory(monkeypatch):
    """available_memory(): what the checks read, set to a figure."""
    monkeypatch.delenv(machine.MEMORY_CHECK_ENV, raising=False)

    def set_to(n: int) -> None:
        monkeypatch.setattr(machine, "available_memory", lambda device=None: n)

    return set_to


def test_this_machines_memory_is_read(tmp_path):
    total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    assert 0 < machine.available_memory() <= total
    # A container's cgroup: its limit less its usage (v2); no limit, or v1's "no limit", is None.
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    assert machine.cgroup_room(tmp_path) == 600_000
    (tmp_path / "memory.max").write_text("max\n")
    assert machine.cgroup_room(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("2000000\n")
    assert machine.cgroup_room(v1) is None
    assert machine.cgroup_room(tmp_path / "none") is None


def test_a_modest_batch_is_refused_where_a_small_one_fits(memory):
    memory(200 * MiB)  # 180 MiB once the margin is left
    machine.check_training(debug(**{"train.batch_size": 4}))  # a step's peak ≈ 31 MiB
    with pytest.raises(ConfigError) as refused:
        machine.check_training(debug(**{"train.batch_size": 64}))  # ≈ 490 MiB
    line = str(refused.value)
    assert line.startswith(
        "train.batch_size=64 is invalid; allowed: a plan that fits this machine's available "
        "memory (0.2 GiB, less a 10% margin): its step's peak with its batch is ≈ 0.5 GiB"
    ), line
    assert "\n" not in line and line.endswith(f"{machine.MEMORY_CHECK_ENV}=off to run it anyway")


def test_the_check_is_the_plan_by_hand_against_the_memory_less_its_margin(memory):
    """The figure: the memory model's step at the whole batch (no micro-batching) plus
    the batch's int64 ids and targets, 2 × 8 × B × L bytes; it fits 90% of the memory."""
    cfg = debug(**{"train.batch_size": 16})
    need = step_memory(cfg, 16, path="torch").peak + 2 * 8 * 16 * 128
    memory(math.ceil(need / 0.9))
    machine.check_training(cfg)
    memory(math.ceil(need / 0.9) - 1)
    with pytest.raises(ConfigError, match="train.batch_size=16 is invalid"):
        machine.check_training(cfg)
    # With micro-batches the step holds 4 rows, and the flag to name is theirs.
    micro = debug(**{"train.batch_size": 16, "train.micro_batch_size": 4})
    need = step_memory(micro, 4, path="torch").peak + 2 * 8 * 16 * 128
    memory(math.ceil(need / 0.9) - 1)
    with pytest.raises(ConfigError, match="train.micro_batch_size=4 is invalid"):
        machine.check_training(micro)


def test_the_override_runs_it_anyway_and_train_refuses_before_allocating(memory, monkeypatch, tmp_path):
    from looplab.training.train import train

    memory(20 * MiB)
    cfg = debug(**{"train.batch_size": 4, "train.steps": 1, "train.eval_every": 0})
    with pytest.raises(ConfigError, match="train.batch_size=4 is invalid"):  # ≈ 31 MiB
        train(cfg, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()  # refused before the folder, the task or the model
    memory(1 * MiB)  # not even one row (≈ 3 MiB with activation checkpointing): no batch helps, its length is named
    with pytest.raises(ConfigError, match="train.seq_len=128 is invalid; .* one row of 128 tokens"):
        train(cfg, tmp_path / "run", quiet=True)
    monkeypatch.setenv(machine.MEMORY_CHECK_ENV, "off")
    machine.check_training(cfg)


def test_a_run_that_cannot_end_is_refused_with_no_override(monkeypatch):
    """Its FLOPs at 10 PFLOP/s on each device against a year: the most steps, by hand."""
    monkeypatch.setenv(machine.MEMORY_CHECK_ENV, "off")
    cfg = stage_config(get_preset("paper-140m"), "pretrain")
    per_step = flops_per_token(cfg) * cfg.train.batch_size * cfg.train.seq_len
    most = int(365 * 86400 * 1e16 / per_step)
    machine.check_training(
        stage_config(get_preset("paper-140m"), "pretrain", overrides={"train.steps": most}), memory=False
    )
    too_many = stage_config(get_preset("paper-140m"), "pretrain", overrides={"train.steps": most + most // 100})
    with pytest.raises(
        ConfigError,
        match=f"train.steps={most + most // 100} is invalid; allowed: a run that can end: .* at most 365 days",
    ) as refused:
        machine.check_training(too_many, memory=False)
    said = int(str(refused.value).split("train.steps ≤ ")[1].split()[0].replace(",", ""))
    assert most - 1 <= said <= most  # (float rounding)
    # Two devices take half the time each.
    machine.check_training(too_many, ranks=2, memory=False)
    with pytest.raises(ConfigError, match=f"an integer in \\[1, {MAX_STEPS:,}\\]"):
        debug(**{"train.steps": MAX_STEPS + 1})


def test_decoding_is_bounded_by_its_cache_where_it_grows(memory):
    """The same million new tokens: a transformer's keys and values (2 × 4 bytes × d per
    position, loop and layer, and the int64 position) do not fit 512 MiB; a Mamba-2
    model's states do not grow with the tokens."""
    memory(512 * MiB)
    mamba = get_preset("debug").model
    transformer = get_preset("phop-induction-debug").model
    tokens = 10**6
    kv = transformer.n_loops * transformer.n_layers * tokens * (2 * 4 * transformer.d_model + 8)
    assert kv > 512 * MiB
    machine.check_decoding(mamba, 1, 16, tokens, "--max-new-tokens", tokens)
    with pytest.raises(
        ConfigError, match="--max-new-tokens=1000000 is invalid; .* decoding cache \\(growing with the tokens\\)"
    ):
        machine.check_decoding(transformer, 1, 16, tokens, "--max-new-tokens", tokens)
    machine.check_new_tokens("--max-new-tokens", machine.MAX_NEW_TOKENS)
    with pytest.raises(ConfigError, match=f"--max-new-tokens={machine.MAX_NEW_TOKENS + 1} is invalid"):
        machine.check_new_tokens("--max-new-tokens", machine.MAX_NEW_TOKENS + 1)


def test_a_bench_grid_names_its_larger_flag(memory):
    memory(64 * MiB)
    cfg = get_preset("debug").model
    machine.check_grid(cfg, [1, 2], [32, 64])
    with pytest.raises(ConfigError, match="--seq-len=100000 is invalid"):
        machine.check_grid(cfg, [1, 8], [64, 100000])
    with pytest.raises(ConfigError, match="--batch=100000 is invalid"):
        machine.check_grid(cfg, [100000], [64])
