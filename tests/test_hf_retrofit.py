"""Retrofitting (looplab/retrofit.py): a looped model initialised from a
Hugging Face Mamba2ForCausalLM or LlamaForCausalLM checkpoint.

Every reference is transformers' own model: tiny ones built from their config classes,
their weights perturbed (so no norm weight is 1 and no D is 1: a swapped or skipped
tensor shows), saved with save_pretrained to tmp_path (no hub). An N⊗R model built
from layers S of a checkpoint must compute what the HF model does whose layers are S
repeated R times (its state dict renamed, loaded by HF itself).
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from looplab import retrofit  # noqa: E402
from looplab.checkpoint import load_model, model_from_config  # noqa: E402
from looplab.config import ConfigError, ExperimentConfig, ModelConfig, apply_overrides  # noqa: E402
from looplab.config.training import MIN_LR  # noqa: E402
from looplab.presets import get_preset  # noqa: E402
from looplab.tasks import make_task  # noqa: E402
from looplab.tasks.base import IGNORE_INDEX  # noqa: E402
from looplab.training.run_folder import METRICS_FILE  # noqa: E402
from looplab.training.train import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
transformers.logging.set_verbosity_error()  # the CPU fallbacks' "install mamba_ssm" notices

VOCAB = 40
IDS = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(0))  # 21 > HF's chunk of 8


def mamba2_config(layers: int, **extra):
    return transformers.Mamba2Config(
        hidden_size=16,
        num_heads=4,
        head_dim=8,
        expand=2,
        state_size=8,
        n_groups=2,
        conv_kernel=4,
        vocab_size=VOCAB,
        num_hidden_layers=layers,
        chunk_size=8,
        **extra,
    )


def llama_config(layers: int, kv_heads: int = 2, tied: bool = True, **extra):
    return transformers.LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        intermediate_size=48,
        vocab_size=VOCAB,
        num_hidden_layers=layers,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        **extra,
    )


def hf_model(config, seed: int = 0):
    """An HF model with every weight moved off its initialisation."""
    cls = {"mamba2": transformers.Mamba2ForCausalLM, "llama": transformers.LlamaForCausalLM}[config.model_type]
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def save(model, folder) -> str:
    model.save_pretrained(folder)
    return f"hf:{folder}"


def hf_reference(model, layers: list[int]):
    """The HF model whose layers are `layers` of `model`, in that order: built and
    loaded by transformers itself (state-dict names renamed, strict load)."""
    config = model.config.to_dict()
    config["num_hidden_layers"] = len(layers)
    config = type(model.config).from_dict(config)
    prefix = "backbone.layers." if config.model_type == "mamba2" else "model.layers."
    source = model.state_dict()
    state = {k: v for k, v in source.items() if not k.startswith(prefix)}
    for new, old in enumerate(layers):
        state.update(
            {
                k.replace(f"{prefix}{old}.", f"{prefix}{new}.", 1): v
                for k, v in source.items()
                if k.startswith(f"{prefix}{old}.")
            }
        )
    reference = type(model)(config).eval()
    reference.load_state_dict(state, strict=True)
    return reference


def retrofitted(init_from: str, n_layers: int, n_loops: int, init_layers: str = "", seed: int = 0):
    cfg = ModelConfig(
        **retrofit.checkpoint_model_fields(init_from), n_layers=n_layers, n_loops=n_loops, chunk_size=16
    )  # another chunk than HF's 8: the chunking is numerics only
    model = model_from_config(cfg, seed).eval()
    info = retrofit.initialise(model, cfg, init_from, init_layers)
    return model, info


def assert_same_logits(looped, reference, ids=IDS):
    with torch.no_grad():
        ours, theirs = looped(ids).logits, reference(ids).logits
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-5, atol=2e-5)


# ---- the mapping: one layer, once ---------------------------------------------------------
def test_mamba2_1x1_reproduces_the_hf_logits(tmp_path):
    hf = hf_model(mamba2_config(1))
    looped, info = retrofitted(save(hf, tmp_path), 1, 1)
    assert_same_logits(looped, hf)
    assert info["architecture"] == "mamba2" and info["layers"] == [0] and info["files"].startswith("sha256:")


@pytest.mark.parametrize("kv_heads,tied", [(4, False), (2, True), (1, False)], ids=["mha", "gqa-tied", "mqa"])
def test_llama_1x1_reproduces_the_hf_logits(tmp_path, kv_heads, tied):
    hf = hf_model(llama_config(1, kv_heads=kv_heads, tied=tied))
    init_from = save(hf, tmp_path)
    looped, _ = retrofitted(init_from, 1, 1)
    assert_same_logits(looped, hf)
    if tied:  # looplab's head is untied: it starts as a copy, a parameter of its own
        assert looped.lm_head.weight.data_ptr() != looped.embedding.weight.data_ptr()
        assert torch.equal(looped.lm_head.weight, looped.embedding.weight)


def test_a_conv_without_bias_maps_to_a_zero_bias(tmp_path):
    hf = hf_model(mamba2_config(1, use_conv_bias=False))
    looped, _ = retrofitted(save(hf, tmp_path), 1, 1)
    assert_same_logits(looped, hf)


# ---- the layer selection and the loop ---------------------------------------------------------
@pytest.mark.parametrize("make", [mamba2_config, llama_config], ids=["mamba2", "llama"])
def test_a_chosen_layer_matches_hf_with_only_that_layer(tmp_path, make):
    hf = hf_model(make(2))
    looped, info = retrofitted(save(hf, tmp_path), 1, 1, init_layers="1")
    assert info["layers"] == [1]
    assert_same_logits(looped, hf_reference(hf, [1]))


@pytest.mark.parametrize("make", [mamba2_config, llama_config], ids=["mamba2", "llama"])
def test_a_looped_model_applies_the_chosen_layers_r_times(tmp_path, make):
    """2⊗3 from a 3-layer checkpoint, evenly spaced layers (0 and 2): the HF model
    with layers 0, 2, 0, 2, 0, 2 computes the same (the looped model shares them)."""
    hf = hf_model(make(3))
    looped, info = retrofitted(save(hf, tmp_path), 2, 3, init_layers="even", seed=5)
    assert info["layers"] == [0, 2]
    assert_same_logits(looped, hf_reference(hf, [0, 2] * 3))
    fresh = model_from_config(looped.cfg, 5)  # the exit gate keeps its fresh initialisation
    assert torch.equal(looped.exit_gate.weight, fresh.exit_gate.weight)
    assert torch.equal(looped.exit_gate.bias, fresh.exit_gate.bias)


def test_select_layers_by_hand():
    assert retrofit.select_layers("", 2, 12) == [0, 1]
    assert retrofit.select_layers("even", 3, 12) == [0, 6, 11]
    assert retrofit.select_layers("even", 1, 12) == [0]
    assert retrofit.select_layers("5,0", 2, 12) == [5, 0]
    with pytest.raises(ConfigError, match="train.init_layers"):
        retrofit.select_layers("0,12", 2, 12)
    with pytest.raises(ConfigError, match="n_layers"):
        retrofit.select_layers("", 13, 12)


# ---- configs -------------------------------------------------------------------------------
def test_the_checkpoint_sets_the_model_shape_and_the_key(tmp_path):
    init_from = save(hf_model(mamba2_config(2)), tmp_path / "hf")
    scratch = get_preset("phop-debug")
    cfg = apply_overrides(scratch, {"train.init_from": init_from, "model.n_loops": 3})
    m = cfg.model
    assert (m.d_model, m.d_state, m.headdim, m.ngroups, m.vocab_size) == (16, 8, 8, 2, VOCAB)
    assert (m.n_layers, m.n_loops, m.chunk_size) == (scratch.model.n_layers, 3, scratch.model.chunk_size)
    # The choice is part of the run's identity; at its default it is not in the key at all.
    assert "train.init_from" in cfg.key_fields() and "train.init_from" not in scratch.key_fields()
    other = apply_overrides(scratch, {"train.init_from": init_from, "model.n_loops": 3, "train.init_layers": [1]})
    assert other.train.init_layers == "1" and other.stage_key() != cfg.stage_key()
    # A stored config is read back without the checkpoint (analysis elsewhere), key unchanged.
    (tmp_path / "hf" / "config.json").unlink()
    assert ExperimentConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))).stage_key() == cfg.stage_key()


def _error(base, overrides) -> str:
    with pytest.raises(ConfigError) as e:
        apply_overrides(base, overrides)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_values_fail_with_one_line_naming_the_field(tmp_path):
    from looplab.config import TrainConfig

    with pytest.raises(ConfigError, match=r"TrainConfig.init_from='/no/prefix' is invalid; allowed: \"\" "):
        TrainConfig(init_from="/no/prefix")  # checked on construction, before any file is read
    with pytest.raises(ConfigError, match="TrainConfig.init_layers"):
        TrainConfig(init_from="hf:x", init_layers="0;5")
    assert TrainConfig(init_from="hf:x", init_layers=[0, 5]).init_layers == "0,5"  # JSON's list, one spelling
    base = get_preset("phop-debug")
    assert "train.init_from='/no/prefix' is invalid" in _error(base, {"train.init_from": "/no/prefix"})
    assert "does not exist" in _error(base, {"train.init_from": f"hf:{tmp_path / 'missing'}"})
    init_from = save(hf_model(mamba2_config(2)), tmp_path / "m")
    assert "init_layers" in _error(base, {"train.init_from": init_from, "train.init_layers": "one"})
    assert "init_layers" in _error(base, {"train.init_from": init_from, "train.init_layers": "0,1"})  # N is 1
    assert "init_layers" in _error(base, {"train.init_from": init_from, "train.init_layers": "7"})
    assert "init_layers" in _error(base, {"train.init_layers": "0"})  # without a checkpoint
    assert "n_layers" in _error(base, {"train.init_from": init_from, "model.n_layers": 3})
    assert "d_model=64 is invalid; allowed: 16, the checkpoint's" in _error(
        base, {"train.init_from": init_from, "model.d_model": 64}
    )


@pytest.mark.parametrize(
    "config,field",
    [
        (lambda: llama_config(1, attention_bias=True), "attention_bias"),
        (lambda: llama_config(1, mlp_bias=True), "mlp_bias"),
        (lambda: llama_config(1, hidden_act="gelu"), "hidden_act"),
        (lambda: llama_config(1, head_dim=16), "head_dim"),
        (lambda: mamba2_config(1, use_bias=True), "use_bias"),
        (lambda: mamba2_config(1, time_step_limit=(0.0, 0.5)), "time_step_limit"),
    ],
    ids=["attention_bias", "mlp_bias", "gelu", "head_dim", "mamba2-bias", "dt-limit"],
)
def test_what_looplab_cannot_represent_is_refused(tmp_path, config, field):
    config().save_pretrained(tmp_path)  # the config alone: it is refused before any weight is read
    message = _error(get_preset("phop-debug"), {"train.init_from": f"hf:{tmp_path}"})
    assert field in message and "train.init_from" in message


def test_rope_scaling_is_refused(tmp_path):
    config = json.loads(llama_config(1).to_json_string())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "rope_type" in _error(get_preset("phop-debug"), {"train.init_from": f"hf:{tmp_path}"})


def test_a_vocabulary_smaller_than_the_tasks_is_refused(tmp_path):
    config = mamba2_config(1)
    config.vocab_size = 8  # phop-debug's task has 11 ids
    config.save_pretrained(tmp_path)
    assert "vocabulary" in _error(get_preset("phop-debug"), {"train.init_from": f"hf:{tmp_path}"})


# ---- training ----------------------------------------------------------------------------
def test_training_starts_from_the_hf_weights(tmp_path):
    """Pre-training through the ordinary entry with train.init_from: at the smallest
    learning rate a config takes (MIN_LR: two steps of it leave the outputs as they were,
    to float32 rounding), the evaluation's loss is the HF model's own loss on the
    task's evaluation set, and the checkpoint computes the HF model's logits."""
    hf = hf_model(mamba2_config(1))
    init_from = save(hf, tmp_path / "hf")
    cfg = apply_overrides(
        get_preset("phop-debug"),
        {
            "train.init_from": init_from,
            "model.n_loops": 1,
            "train.steps": 2,
            "train.warmup_steps": 0,
            "train.lr": MIN_LR,
            "train.batch_size": 4,
            "train.eval_every": 0,
            "task.eval_count": 32,
        },
    )
    train(cfg, tmp_path / "run", quiet=True)

    evaluation = [
        r
        for r in map(json.loads, (tmp_path / "run" / METRICS_FILE).read_text().splitlines())
        if r.get("kind") == "eval"
    ][-1]["policies"][0]
    batch = make_task(cfg.task, cfg.train.seq_len).eval_batch()
    with torch.no_grad():
        logits = hf(batch.ids).logits
    mask = batch.targets != IGNORE_INDEX
    hf_loss = torch.nn.functional.cross_entropy(logits[mask], batch.targets[mask]).item()
    assert evaluation["loss"] == pytest.approx(hf_loss, rel=1e-4)

    trained = load_model(tmp_path / "run" / "checkpoint").eval()
    assert trained.metadata["retrofit"]["source"] == init_from and trained.metadata["retrofit"]["layers"] == [0]
    assert_same_logits(trained, hf, IDS % cfg.task.vocab_size)


def test_a_continued_stage_starts_from_its_parent_not_the_checkpoint(tmp_path, monkeypatch):
    from looplab.presets import stage_config
    from looplab.training import train as training

    init_from = save(hf_model(mamba2_config(1)), tmp_path / "hf")
    overrides = {
        "train.init_from": init_from,
        "train.steps": 1,
        "train.warmup_steps": 0,
        "train.batch_size": 4,
        "train.eval_every": 0,
        "task.eval_count": 8,
    }
    pretrain = stage_config(get_preset("phop-debug"), "pretrain", overrides=overrides)
    train(pretrain, tmp_path / "pre", quiet=True)
    stage1 = stage_config(
        get_preset("phop-debug"),
        "stage1",
        overrides=overrides,
        parent=pretrain.as_parent(str(tmp_path / "pre" / "checkpoint")),
    )
    monkeypatch.setattr(training, "initialise", lambda *a, **k: pytest.fail("a continued stage retrofitted"))
    train(stage1, tmp_path / "s1", quiet=True)


def test_a_config_built_without_the_checkpoints_shape_is_refused_before_training(tmp_path):
    """apply_overrides gives the model the checkpoint's shape; a config built field by
    field that differs is refused before the run's folder exists (never trained as
    something its recorded config does not say)."""
    import dataclasses

    init_from = save(hf_model(mamba2_config(1)), tmp_path / "hf")
    base = get_preset("phop-debug")  # d_model 32; the checkpoint's is 16
    cfg = dataclasses.replace(
        base,
        train=dataclasses.replace(base.train, init_from=init_from),
        model=dataclasses.replace(base.model, vocab_size=VOCAB),
    )
    with pytest.raises(ConfigError, match="model.d_model=32 is invalid; allowed: 16"):
        train(cfg, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("layout", ["shards", "pickle"])
def test_sharded_and_pickled_weights_load_the_same(tmp_path, layout):
    """Large checkpoints come in safetensors shards (model.safetensors.index.json); older
    ones as pytorch_model.bin (transformers 5 writes only safetensors: written by hand)."""
    hf = hf_model(llama_config(2, tied=False))
    if layout == "shards":
        hf.save_pretrained(tmp_path, max_shard_size="20KB")
        assert (tmp_path / "model.safetensors.index.json").is_file()
    else:
        hf.config.save_pretrained(tmp_path)
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    looped, _ = retrofitted(f"hf:{tmp_path}", 1, 1, init_layers="1")
    assert_same_logits(looped, hf_reference(hf, [1]))


# ---- the from-scratch arm at the checkpoint's shape, and a sweep comparing the two --------
def test_hf_shape_takes_the_shape_and_not_the_weights(tmp_path):
    """hf-shape:PATH trains the checkpoint's architecture from a fresh initialisation:
    the same model fields as hf:PATH, the same initial weights as a plain model of that
    shape and seed, and a different stage key from the retrofitted arm."""
    folder = tmp_path / "hf"
    hf = hf_model(mamba2_config(2))
    save(hf, folder)
    base = {
        "model.n_loops": 2,
        "model.n_layers": 1,
        "train.steps": 1,
        "train.warmup_steps": 0,
        "train.batch_size": 2,
        "train.eval_every": 0,
        "task.eval_count": 8,
    }
    shape = apply_overrides(get_preset("phop-debug"), {**base, "train.init_from": f"hf-shape:{folder}"})
    weights = apply_overrides(get_preset("phop-debug"), {**base, "train.init_from": f"hf:{folder}"})
    assert shape.model == weights.model and shape.model.d_model == 16
    assert shape.stage_key() != weights.stage_key()
    # Training the hf-shape arm starts from exactly a fresh model of that shape and seed.
    train(shape, tmp_path / "scratch", quiet=True)
    trained = load_model(tmp_path / "scratch" / "checkpoint")
    assert "retrofit" not in trained.metadata
    fresh = model_from_config(shape.model, shape.train.seed)
    retro, _ = retrofitted(f"hf:{folder}", 1, 2)
    name = "embedding.weight"  # what one step at lr 1e-3 barely moves: compare it to both starts
    ours = dict(trained.named_parameters())[name]
    assert (ours - dict(fresh.named_parameters())[name]).abs().max() < 0.01
    assert (ours - dict(retro.named_parameters())[name]).abs().max() > 0.05


def test_a_sweep_compares_retrofitted_with_scratch_at_one_shape(tmp_path, capsys):
    """--init-from PATH adds an axis: per trial point, hf-shape:PATH (scratch) and
    hf:PATH (retrofit), read by the pre-training alone; trial names stay folder-safe."""
    from sweeps import phop
    from sweeps.launch import main
    from sweeps.sweep import trial_name

    folder = tmp_path / "ckpt"
    save(hf_model(mamba2_config(2)), folder)
    argv = ["--init-from", str(folder), "--seeds", "0", "--pairs", "1x2", "--dry-run"]
    assert main("t", phop.add_flags, phop.from_args, argv) == 0
    out = capsys.readouterr().out
    trials = [json.loads(line.split("}")[0] + "}") for line in out.splitlines() if line.startswith("  {")]
    assert sorted(t["init_from"] for t in trials) == [f"hf-shape:{folder}", f"hf:{folder}"]
    keys = [line.rsplit("pretrain:", 1)[1] for line in out.splitlines() if line.startswith("  {")]
    assert len(set(keys)) == 2  # two pre-trainings, nothing shared between the arms
    for t in trials:
        name = trial_name(t)
        assert "/" not in name and "\\" not in name
    # an unknown folder is one line naming the flag
    assert main("t", phop.add_flags, phop.from_args, ["--init-from", str(tmp_path / "nope"), "--dry-run"]) == 2
    assert "--init-from" in capsys.readouterr().err
