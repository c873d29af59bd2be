"""Configs fail fast with one line naming the field and the allowed values."""

import pytest

from looplab.config import (
    ConfigError,
    ExperimentConfig,
    ManoConfig,
    ModelConfig,
    PhopConfig,
    TrainConfig,
    apply_overrides,
)
from looplab.presets import PRESETS, get_preset


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda: ModelConfig(n_layers=0), "n_layers"),
        (lambda: ModelConfig(n_loops=0), "n_loops"),
        (lambda: ModelConfig(arch="rnn"), "arch"),
        (lambda: ModelConfig(arch="hybrid", n_layers=4, attn_layer_idx=(4,)), "attn_layer_idx"),
        (lambda: ModelConfig(arch="hybrid", n_layers=4, attn_layer_idx=()), "attn_layer_idx"),
        (lambda: ModelConfig(arch="mamba2", attn_layer_idx=(0,)), "attn_layer_idx"),
        (lambda: ModelConfig(arch="transformer", d_model=100, attn_head_dim=64), "attn_head_dim"),
        (lambda: ModelConfig(d_model=100, expand=1, headdim=64), "headdim"),
        (lambda: ModelConfig(d_model=256, headdim=64, ngroups=3), "ngroups"),
        (lambda: ModelConfig(mixers_per_layer=3), "mixers_per_layer"),
        (lambda: ModelConfig(n_loops=True), "n_loops"),
        (lambda: ManoConfig(L=0), "L"),
        (lambda: PhopConfig(n=8, p=7), "p"),
        (lambda: TrainConfig(lr=0), "lr"),
        (lambda: TrainConfig(lr=1e-320), "lr"),  # no AdamW step of it moves a float32 weight
        (lambda: TrainConfig(seed=2**63), "seed"),  # torch's generators take a signed 64-bit seed
        (lambda: TrainConfig(min_lr_ratio=1.5), "min_lr_ratio"),
        (lambda: TrainConfig(precision="fp16"), "precision"),
        (lambda: ExperimentConfig(model=ModelConfig(vocab_size=8), task=PhopConfig(n=16, p=2)), "vocab_size"),
        (lambda: get_preset("no-such-preset"), "preset"),
    ],
)
def test_bad_values_raise_one_line_naming_the_field(make, field):
    with pytest.raises(ConfigError) as err:
        make()
    message = str(err.value)
    assert "\n" not in message
    assert field in message and "allowed" in message


def test_every_preset_builds_and_round_trips_through_json():
    for name in PRESETS:
        cfg = get_preset(name)
        again = ExperimentConfig.from_dict(cfg.to_dict())
        assert again == cfg and again.config_hash() == cfg.config_hash()


def test_config_hash_ignores_seed_but_not_content():
    cfg = get_preset("phop-debug")
    reseeded = apply_overrides(cfg, {"train.seed": 7})
    assert reseeded.config_hash() == cfg.config_hash()
    assert reseeded.stage_key() != cfg.stage_key()
    assert apply_overrides(cfg, {"model.n_loops": 1}).config_hash() != cfg.config_hash()


@pytest.mark.parametrize(
    "cadence",
    [
        {"train.log_every": 5},
        {"train.eval_every": 7},
        {"train.ckpt_every": 3},
        {"train.device": "cpu"},
        {"train.eval_batch_size": 3},
        {"train.eval_qs": [0.1, 0.5, 1.0]},
    ],
)
def test_cadence_and_device_never_enter_a_key(cadence):
    cfg = get_preset("phop-debug")
    assert apply_overrides(cfg, cadence).stage_key() == cfg.stage_key()


def test_keys_are_opt_in_and_every_field_is_classified():
    """A field enters keys only when declared keyed(); the fields that do not are
    exactly the cadence and device fields (a new field must be classified here)."""
    import dataclasses

    from looplab.config import ExitConfig, HoleConfig, TextConfig, unkeyed_fields

    for cls in (ModelConfig, ManoConfig, PhopConfig, TextConfig, ExitConfig, HoleConfig):
        assert unkeyed_fields(cls) == [], cls
    assert set(unkeyed_fields(TrainConfig)) == {
        "eval_every",
        "eval_batch_size",
        "log_every",
        "ckpt_every",
        "ckpt_minutes",
        "device",
        "micro_batch_size",
        "activation_checkpointing",
        "eval_qs",
        "compile",
    }
    cfg = get_preset("debug")
    fields = cfg.key_fields()
    assert "train.lr" in fields and "train.seed" in fields and "model.n_loops" in fields
    assert not any(f.startswith(("exit.", "hole.")) for f in fields)  # pretrain reads neither
    # A field added after keys were stored (keyed(..., added=True)) enters a key only
    # away from its default: the debug preset leaves train.init_from and init_layers there.
    assert (
        len(fields)
        == sum(
            len(
                [
                    f
                    for f in dataclasses.fields(c)
                    if f.metadata.get("key") and not (f.metadata.get("added") and getattr(c, f.name) == f.default)
                ]
            )
            for c in (cfg.model, cfg.task, cfg.train)
        )
        + 1
    )  # + the stage
    assert not {"train.init_from", "train.init_layers"} & set(fields)


def test_eval_qs_are_checked_and_sorted():
    cfg = apply_overrides(get_preset("debug"), {"train.eval_qs": [0.5, 0.1, 1.0]})
    assert cfg.train.eval_qs == (0.1, 0.5, 1.0)
    for bad in ([], [0.0], [1.5], [0.2, 0.2], ["a"], 0.5):
        with pytest.raises(ConfigError, match="TrainConfig.eval_qs"):
            apply_overrides(get_preset("debug"), {"train.eval_qs": bad})


def test_overrides_reach_each_section_and_reject_unknown_names():
    cfg = apply_overrides(get_preset("mano-debug"), {"model.n_loops": 2, "steps": 5, "task.L": 4})
    assert (cfg.model.n_loops, cfg.train.steps, cfg.task.L) == (2, 5, 4)
    assert cfg.model.vocab_size == cfg.task.vocab_size  # follows the task's vocabulary
    with pytest.raises(ConfigError, match="model.nope"):
        apply_overrides(cfg, {"model.nope": 1})
    with pytest.raises(ConfigError, match="names no field"):
        apply_overrides(cfg, {"nope": 1})


def test_switching_arch_resets_arch_dependent_defaults():
    cfg = get_preset("phop-debug")
    tr = apply_overrides(cfg, {"model.arch": "transformer", "model.attn_head_dim": 16, "model.rope_dim": 16})
    assert tr.model.d_intermediate > 0
    back = apply_overrides(tr, {"model.arch": "mamba2"})
    assert back.model.d_intermediate == 0
    with pytest.raises(ConfigError, match="attn_layer_idx"):
        apply_overrides(cfg, {"model.arch": "hybrid", "model.attn_head_dim": 16, "model.rope_dim": 16})


def test_a_warmup_set_longer_than_the_run_is_one_line_a_presets_own_is_not():
    """train.warmup_steps given above train.steps never reaches its learning rate; a
    preset's own warmup over steps shortened for a quick run stays allowed."""
    from looplab.presets import stage_config

    with pytest.raises(
        ConfigError, match="train.warmup_steps=1000000 is invalid; allowed: a warmup of at most the run's 12"
    ):
        stage_config(get_preset("debug"), "pretrain", overrides={"train.steps": 12, "train.warmup_steps": 1000000})
    quick = stage_config(get_preset("debug"), "pretrain", overrides={"train.steps": 2})
    assert quick.train.warmup_steps > quick.train.steps  # the preset's own, left alone
