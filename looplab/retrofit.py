"""Initialise a looped model from a Hugging Face checkpoint (`train.init_from=hf:PATH`).

A `Mamba2ForCausalLM` or `LlamaForCausalLM` folder (config.json and its weights, as
`save_pretrained` writes them) gives the looped model its embeddings, final norm and
LM head, and N of its layers (`train.init_layers`) as the shared block that the
looped model applies R times; the exit gate keeps its fresh initialisation. A
"retrofitted" arm and a "from scratch" one differ in train.init_from alone ("" is
from scratch), so their stages have different keys and share one store: a sweep run
with and without `--set train.init_from=hf:PATH` compares them.

The checkpoint fixes the model's shape: `checkpoint_model_fields` reads config.json
into the ModelConfig fields it determines (arch, width, vocabulary, mixer sizes,
norm epsilon, RoPE), and `apply_overrides` (looplab/config/experiment.py) sets them, so a run's
recorded config and its key say what was trained; the loop structure (n_layers N,
n_loops R), the chunk size and everything else stay the preset's and the overrides'.
A field looplab's model cannot represent (biases it lacks, partial or scaled RoPE,
another activation, a clamped dt) is refused with one line naming it. Two things
that differ in form only are mapped exactly: grouped-query attention (each key/value
head is repeated for the query heads it serves, as HF's repeat_kv does) and tied
embeddings (the head gets a copy of the embedding; looplab's head is untied).

Names and conventions mapped (transformers 5's modeling_mamba2.py / modeling_llama.py):
  Mamba-2: in_proj emits [z | x B C | dt] in both, conv1d is the same depthwise Conv1d,
    A_log, D, dt_bias per head, and the gated RMSNorm is norm(x·silu(z)) over groups of
    d_inner/ngroups channels in both (mamba-ssm's norm_before_gate=False).
  Llama: looplab's qkv is [q | k | v] rows, heads contiguous; its RoPE rotates the pairs
    (i, i + head_dim/2) with the same frequencies as HF's rotate_half, so no permutation
    of q/k rows is needed. The MLP's fc1 is [up | gate] and fc2 is down_proj.

Identity: the stage key hashes train.init_from as written (the path) and the derived
model fields, not the weights' bytes (hashing gigabytes whenever a config is built
would be slow). Treat a checkpoint folder as immutable: a new checkpoint goes to a new
path (as the Hub's cache does: snapshots/<revision>/). The trained checkpoint records
the SHA-256 of the source's files (`initialise`'s provenance, in its metadata), so a
changed source is visible afterwards.

It never needs transformers: config.json is JSON and the weights are read with
safetensors (a core dependency) or torch, lazily, one tensor at a time; the tests
build their references with transformers. Nothing of looplab above looplab.errors and
looplab.keys is imported: looplab/config/ calls it while building a config (torch-free),
and the weights go into a model handed in (looplab/training/train.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from looplab.errors import ConfigError, check
from looplab.keys import files_digest

PREFIX = "hf:"  # the checkpoint's shape and weights: a retrofitted model
# The checkpoint's shape only, freshly initialised: the from-scratch arm a retrofitted one
# is compared with at equal architecture (a sweep's --init-from runs both).
SHAPE_PREFIX = "hf-shape:"
ALLOWED = (
    '"" (from scratch, the preset\'s shape) | hf:PATH (a Hugging Face checkpoint folder: its shape and '
    "weights) | hf-shape:PATH (its shape, fresh weights)"
)
FIELD = "train.init_from"
LAYERS_FIELD = "train.init_layers"
ARCHITECTURES = {"Mamba2ForCausalLM": "mamba2", "LlamaForCausalLM": "transformer"}
EVEN = "even"  # init_layers: N layers evenly spaced over the checkpoint's depth, first and last included


# ---- the source folder and its config --------------------------------------------------
def well_formed(init_from: Any) -> bool:
    """ "" or hf:PATH or hf-shape:PATH (the path not empty); torch-free, for config checks."""
    return isinstance(init_from, str) and (
        init_from == ""
        or any(init_from.startswith(prefix) and len(init_from) > len(prefix) for prefix in (PREFIX, SHAPE_PREFIX))
    )


def loads_weights(init_from: str) -> bool:
    """hf:PATH starts from the checkpoint's weights; hf-shape:PATH takes its shape alone."""
    return init_from.startswith(PREFIX)


def source_dir(init_from: str) -> Path:
    """The folder an "hf:PATH" (or "hf-shape:PATH") value names; it must hold config.json."""
    check(well_formed(init_from) and init_from != "", FIELD, init_from, ALLOWED)
    folder = Path(init_from.split(":", 1)[1]).expanduser()
    check(
        (folder / "config.json").is_file(),
        FIELD,
        init_from,
        f"hf:PATH of a folder with config.json and weights ({folder / 'config.json'} does not exist)",
    )
    return folder


def read_hf_config(init_from: str) -> dict[str, Any]:
    """config.json of the checkpoint. Mamba-2's time_step_limit holds an infinity:
    transformers 5 writes it as {"__float__": "Infinity"}, earlier versions as a bare
    Infinity (which Python's json reads)."""
    path = source_dir(init_from) / "config.json"

    def special_floats(obj: dict[str, Any]) -> Any:
        return float(obj["__float__"]) if set(obj) == {"__float__"} else obj

    try:
        return json.loads(path.read_text(), object_hook=special_floats)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{FIELD}={init_from!r} is invalid; allowed: a folder whose config.json is JSON ({path}: {e})"
        ) from None


def architecture(hf: dict[str, Any], init_from: str) -> str:
    """'mamba2' or 'transformer': the looplab arch of the checkpoint's architecture."""
    names = hf.get("architectures") or []
    found = [ARCHITECTURES[n] for n in names if n in ARCHITECTURES]
    if not found:  # a config saved without `architectures` still names its model_type
        found = (
            [{"mamba2": "mamba2", "llama": "transformer"}[hf["model_type"]]]
            if hf.get("model_type") in ("mamba2", "llama")
            else []
        )
    check(
        bool(found),
        f"{FIELD} architectures",
        names or hf.get("model_type"),
        " | ".join(ARCHITECTURES) + f" (in {init_from})",
    )
    return found[0]


def _refuse(ok: bool, name: str, value: Any, allowed: str) -> None:
    """One line naming the HF config field that looplab's model cannot represent."""
    check(ok, f"{FIELD} config.json {name}", value, allowed)


def _int(hf: dict[str, Any], name: str) -> int:
    value = hf.get(name)
    _refuse(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, value, "a positive integer")
    assert isinstance(value, int)  # _refuse raised otherwise
    return value


def checkpoint_model_fields(init_from: str) -> dict[str, Any]:
    """The ModelConfig fields the checkpoint at init_from determines (its shape), after
    refusing what looplab's model cannot represent."""
    hf = read_hf_config(init_from)
    arch = architecture(hf, init_from)
    return _mamba2_fields(hf) if arch == "mamba2" else _llama_fields(hf)


def checkpoint_layers(init_from: str) -> int:
    """How many layers the checkpoint at init_from has (num_hidden_layers)."""
    return _int(read_hf_config(init_from), "num_hidden_layers")


def _mamba2_fields(hf: dict[str, Any]) -> dict[str, Any]:
    d, heads, headdim = _int(hf, "hidden_size"), _int(hf, "num_heads"), _int(hf, "head_dim")
    expand = hf.get("expand", 2)
    _refuse(
        isinstance(expand, int) and not isinstance(expand, bool) and expand > 0,
        "expand",
        expand,
        "a positive integer (looplab's d_inner is expand·d_model)",
    )
    _refuse(
        heads * headdim == expand * d,
        "num_heads",
        heads,
        f"expand·hidden_size/head_dim = {expand * d / headdim:g} (looplab derives the head count)",
    )
    _refuse(not hf.get("use_bias", False), "use_bias", hf.get("use_bias"), "false (looplab's in/out_proj have no bias)")
    _refuse(hf.get("hidden_act", "silu") == "silu", "hidden_act", hf.get("hidden_act"), "silu")
    _refuse(hf.get("rms_norm", True) is True, "rms_norm", hf.get("rms_norm"), "true (the gated RMSNorm)")
    limit = list(hf.get("time_step_limit", (0.0, math.inf)))
    _refuse(limit == [0.0, math.inf], "time_step_limit", limit, "[0.0, Infinity] (looplab never clamps dt)")
    return {
        "arch": "mamba2",
        "vocab_size": _int(hf, "vocab_size"),
        "d_model": d,
        "mixers_per_layer": 1,
        "d_state": _int(hf, "state_size"),
        "d_conv": _int(hf, "conv_kernel"),
        "expand": expand,
        "headdim": headdim,
        "ngroups": _int(hf, "n_groups"),
        "d_intermediate": 0,
        "attn_layer_idx": (),
        "norm_eps": float(hf.get("layer_norm_epsilon", 1e-5)),
    }


def _llama_fields(hf: dict[str, Any]) -> dict[str, Any]:
    d, heads = _int(hf, "hidden_size"), _int(hf, "num_attention_heads")
    kv = hf.get("num_key_value_heads") or heads
    _refuse(
        isinstance(kv, int) and heads % kv == 0, "num_key_value_heads", kv, f"a divisor of num_attention_heads={heads}"
    )
    head_dim = hf.get("head_dim") or d // heads
    _refuse(
        head_dim * heads == d,
        "head_dim",
        head_dim,
        f"hidden_size/num_attention_heads = {d / heads:g} (looplab's heads span d_model)",
    )
    for name in ("attention_bias", "mlp_bias"):
        _refuse(not hf.get(name, False), name, hf.get(name), "false (looplab's projections have no bias)")
    _refuse(hf.get("hidden_act", "silu") == "silu", "hidden_act", hf.get("hidden_act"), "silu (SwiGLU)")
    # transformers 5 writes rope_parameters {rope_type, rope_theta}; earlier versions
    # rope_theta and rope_scaling beside each other.
    rope = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    _refuse(rope_type == "default", "rope_type", rope_type, "default (no RoPE scaling)")
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    _refuse(partial == 1.0, "partial_rotary_factor", partial, "1.0 (Llama rotates whole heads)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    return {
        "arch": "transformer",
        "vocab_size": _int(hf, "vocab_size"),
        "d_model": d,
        "attn_head_dim": head_dim,
        "rope_dim": head_dim,
        "rope_theta": float(theta),
        "d_intermediate": _int(hf, "intermediate_size"),
        "attn_layer_idx": (),
        "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
    }


# ---- which layers ------------------------------------------------------------------------
def select_layers(init_layers: str, n_layers: int, available: int) -> list[int]:
    """The checkpoint's layers that become the N layers of the shared block, in order.
    "" the first N; "even" N evenly spaced, first and last included; "0,5" those."""
    check(
        n_layers <= available,
        "ModelConfig.n_layers",
        n_layers,
        f"an integer <= {available}, the layers of the checkpoint in {FIELD}",
    )
    if init_layers == "":
        return list(range(n_layers))
    if init_layers == EVEN:
        return [0] if n_layers == 1 else [round(i * (available - 1) / (n_layers - 1)) for i in range(n_layers)]
    chosen = [int(i) for i in init_layers.split(",")]
    check(
        len(chosen) == n_layers and all(0 <= i < available for i in chosen),
        LAYERS_FIELD,
        init_layers,
        f"{n_layers} (model.n_layers) comma-separated layer indices in [0, {available})",
    )
    return chosen


def check_matches(model_cfg: Any, init_from: str) -> dict[str, Any]:
    """The checkpoint's fields, after checking that model_cfg has every one of them
    (apply_overrides sets them; a config built field by field may not have)."""
    fields = checkpoint_model_fields(init_from)
    for name, value in fields.items():
        ours = getattr(model_cfg, name)
        if name == "attn_layer_idx":
            ours, value = tuple(ours), tuple(value)
        check(
            ours == value,
            f"model.{name}",
            ours,
            f"{value!r}, as the checkpoint in {FIELD}={init_from!r} has (apply_overrides sets it)",
        )
    return fields


# ---- the weights -------------------------------------------------------------------------
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class _Weights:
    """The checkpoint's tensors by name, read one at a time (safetensors, sharded or not,
    or a torch pickle loaded weights-only), so only the chosen layers are read."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.files: dict[str, Path] = {}  # tensor name -> file
        for name in WEIGHT_FILES:
            path = folder / name
            if not path.is_file():
                continue
            if name.endswith(".index.json"):
                weight_map = json.loads(path.read_text())["weight_map"]
                self.files = {k: folder / v for k, v in weight_map.items()}
            else:
                self.files = {k: path for k in self._names(path)}
            break
        check(bool(self.files), FIELD, f"{PREFIX}{folder}", "a folder with " + " | ".join(WEIGHT_FILES))
        self._pickles: dict[Path, dict] = {}

    @staticmethod
    def _names(path: Path) -> list[str]:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                return list(f.keys())
        import torch

        return list(torch.load(path, map_location="cpu", weights_only=True, mmap=True))

    def paths(self) -> list[Path]:
        return sorted(set(self.files.values()))

    def get(self, *names: str):
        """The first of names that the checkpoint has, or None."""
        for name in names:
            path = self.files.get(name)
            if path is None:
                continue
            if path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(path), framework="pt") as f:
                    return f.get_tensor(name)
            import torch

            if path not in self._pickles:
                self._pickles[path] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return self._pickles[path][name]
        return None

    def need(self, *names: str):
        tensor = self.get(*names)
        check(tensor is not None, FIELD, f"{PREFIX}{self.folder}", f"a checkpoint with the weight {names[0]}")
        return tensor


def _copy(param, tensor, name: str) -> None:
    check(
        tuple(param.shape) == tuple(tensor.shape),
        f"{FIELD} weight {name}",
        tuple(tensor.shape),
        f"shape {tuple(param.shape)}",
    )
    param.data.copy_(tensor.to(param.dtype))


def initialise(model, model_cfg: Any, init_from: str, init_layers: str = "") -> dict[str, Any]:
    """Load the checkpoint at init_from into a LoopedLM built from model_cfg: its
    embeddings, final norm, LM head and the chosen layers as the N shared layers (the
    exit gate keeps its initialisation). Returns the provenance a trained checkpoint
    records: the source, its architecture, the layers taken and the files' digest."""
    import torch

    fields = check_matches(model_cfg, init_from)
    folder = source_dir(init_from)
    hf = read_hf_config(init_from)
    layers = select_layers(init_layers, model_cfg.n_layers, checkpoint_layers(init_from))
    weights = _Weights(folder)
    mamba = fields["arch"] == "mamba2"
    top = "backbone" if mamba else "model"
    with torch.no_grad():
        embedding = weights.need(
            *((f"{top}.embeddings.weight", f"{top}.embedding.weight") if mamba else (f"{top}.embed_tokens.weight",))
        )
        _copy(model.embedding.weight, embedding, "embedding")
        _copy(model.norm_f.weight, weights.need(f"{top}.norm_f.weight" if mamba else f"{top}.norm.weight"), "norm")
        # Tied embeddings: the looped model's head is untied, so it starts as a copy.
        head = embedding if hf.get("tie_word_embeddings", False) else weights.need("lm_head.weight")
        _copy(model.lm_head.weight, head, "lm_head")
        for ours, theirs in zip(model.backbone.layers, layers):
            (_load_mamba2_layer if mamba else _load_llama_layer)(ours, weights, f"{top}.layers.{theirs}", hf)
    return {
        "source": init_from,
        "architecture": fields["arch"],
        "layers": layers,
        "files": files_digest({"config": [folder / "config.json"], "weights": weights.paths()}, length=64),
    }


def _load_mamba2_layer(layer, weights: _Weights, prefix: str, hf: dict[str, Any]) -> None:
    import torch

    (block,) = layer  # mixers_per_layer = 1
    _copy(block.norm.weight, weights.need(f"{prefix}.norm.weight"), f"{prefix}.norm.weight")
    mixer = block.inner
    for name in ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight"):
        _copy(mixer.get_parameter(name), weights.need(f"{prefix}.mixer.{name}"), f"{prefix}.mixer.{name}")
    bias = weights.get(f"{prefix}.mixer.conv1d.bias")  # use_conv_bias=false: a zero bias is the same conv
    _copy(
        mixer.conv1d.bias, torch.zeros_like(mixer.conv1d.bias) if bias is None else bias, f"{prefix}.mixer.conv1d.bias"
    )


def _load_llama_layer(layer, weights: _Weights, prefix: str, hf: dict[str, Any]) -> None:
    import torch

    attention, mlp = layer
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or heads

    def repeated(name: str):
        # Grouped-query attention: key/value head j serves query heads j·g .. j·g+g−1
        # (HF's repeat_kv), so its rows repeat g times in place: the same attention.
        w = weights.need(f"{prefix}.self_attn.{name}.weight")
        return w.view(kv, -1, w.shape[-1]).repeat_interleave(heads // kv, dim=0).reshape(-1, w.shape[-1])

    q = weights.need(f"{prefix}.self_attn.q_proj.weight")
    _copy(attention.norm.weight, weights.need(f"{prefix}.input_layernorm.weight"), f"{prefix}.input_layernorm")
    _copy(attention.inner.qkv.weight, torch.cat([q, repeated("k_proj"), repeated("v_proj")]), f"{prefix}.qkv")
    _copy(attention.inner.out_proj.weight, weights.need(f"{prefix}.self_attn.o_proj.weight"), f"{prefix}.o_proj")
    _copy(
        mlp.norm.weight, weights.need(f"{prefix}.post_attention_layernorm.weight"), f"{prefix}.post_attention_layernorm"
    )
    up, gate = weights.need(f"{prefix}.mlp.up_proj.weight"), weights.need(f"{prefix}.mlp.gate_proj.weight")
    _copy(mlp.inner.fc1.weight, torch.cat([up, gate]), f"{prefix}.mlp.up|gate")
    _copy(mlp.inner.fc2.weight, weights.need(f"{prefix}.mlp.down_proj.weight"), f"{prefix}.mlp.down_proj")
