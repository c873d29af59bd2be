"""Export a looplab checkpoint as a Hugging Face folder (`looplab export --format hf`).

    export_hf(checkpoint, out_dir, policy="full")

writes a folder that `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`
loads, `AutoTokenizer.from_pretrained(DIR)` tokenizes for, `model.generate()` decodes
from and lm-eval's `hf` backend scores:

    config.json              LoopLabConfig: the looplab ModelConfig, R, the exit policy
                             (`exit_policy`, overridable at load time:
                             from_pretrained(DIR, trust_remote_code=True, exit_policy="skip:0.4")),
                             the stage, lineage and method of the checkpoint, and an
                             `auto_map` naming the two files below
    configuration_looplab.py the config class (generated here)
    modeling_looplab.py      LoopLabForCausalLM: a thin PreTrainedModel + GenerationMixin
                             around looplab's own LoopedLM (generated here)
    looplab_*.py             looplab's model source itself: the transitive closure of the
                             modules models/looped.py imports, copied from the installed
                             package with each `from looplab.a.b import x` rewritten to the
                             folder's flat `from .looplab_a_b import x` (transformers' loader
                             copies a folder's files by following `from .NAME import` lines,
                             and refuses subfolders). The model code keeps one home: the
                             export copies it, it is never written twice.
    model.safetensors        the weights, keyed model.<looplab name>
    tokenizer files          the checkpoint's tokenizer (bytes: a stock fast tokenizer, a
                             byte-level BPE without merges whose ids are the byte values,
                             <bos> <eos> <pad> = 256 257 258; mistral: the pinned
                             SentencePiece file and tokenization_looplab.py, a small
                             SentencePieceBackend subclass that lets sentencepiece itself
                             encode and decode; any other spec: the AutoTokenizer's own
                             files). add_special_tokens=True (the default) prepends <bos>, as
                             looplab's lm-eval adapter and generate do. AutoTokenizer reads
                             config.json first, so it wants trust_remote_code=True as the
                             model does; the byte tokenizer also loads without any remote
                             code through PreTrainedTokenizerFast.from_pretrained(DIR).
    generation_config.json   use_cache=False: generate() recomputes the looped forward over
                             the whole sequence for each new token, so every exit policy
                             decodes exactly as looplab's own generate does (greedy).

The folder needs torch, numpy, transformers and (for the tokenizer) tokenizers or
sentencepiece, not looplab. Not carried over: the opt-in compiled CPU decode kernel
(models/cpu/cpu_step.cpp: the export never decodes token by token) and mamba-ssm's CUDA
kernels, which the copied code uses when they are installed, as looplab does.
transformers and safetensors are imported inside functions: `import looplab` stays light.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from looplab.errors import ConfigError

FORMATS = ("hf",)
ROOT_PACKAGE = "looplab"
ENTRY_MODULE = "looplab.models.looped"  # the model's source: this module and what it imports
CONFIG_FILE, MODELING_FILE = "configuration_looplab.py", "modeling_looplab.py"
CONFIG_CLASS, MODEL_CLASS = "LoopLabConfig", "LoopLabForCausalLM"
WEIGHT_PREFIX = "model."  # LoopLabForCausalLM.model is the LoopedLM


# ---- the model's source, flattened into the folder ----------------------------------


def flat_name(module: str) -> str:
    """looplab.models.ops.ssd -> looplab_models_ops_ssd (the file's stem in the folder)."""
    return module.replace(".", "_")


def _package_dir() -> Path:
    return Path(__file__).resolve().parent  # this module sits at the package's top


def _module_file(module: str) -> Path | None:
    """The installed source file of a looplab module (a package: its __init__.py)."""
    path = _package_dir().joinpath(*module.split(".")[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _is_ours(name: str | None) -> bool:
    return name is not None and (name == ROOT_PACKAGE or name.startswith(ROOT_PACKAGE + "."))


def _targets(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(module, name) pairs one import statement of looplab reads: name None for a
    module imported as a whole (`from looplab.models.cpu import cpu_step` gives
    ("looplab.models.cpu.cpu_step", None))."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if _is_ours(a.name)]
    module = node.module
    if node.level or module is None or not _is_ours(module):
        return []
    out: list[tuple[str, str | None]] = []
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        out.append((sub, None) if _module_file(sub) is not None else (module, alias.name))
    return out


def source_closure(entry: str = ENTRY_MODULE) -> list[str]:
    """Every looplab module `entry` imports, transitively, anywhere in its files (lazy
    imports inside functions and TYPE_CHECKING blocks too, so no line of the copied
    source names looplab). Package __init__ files are not followed unless imported."""
    seen, todo = set(), [entry]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = _module_file(module)
        if path is None:
            raise ConfigError(
                f"module {module!r} has no source file in {_package_dir()}; the export copies the "
                "model's source and needs looplab installed from source files"
            )
        seen.add(module)
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise ConfigError(
                    f"{path}:{node.lineno}: a relative import; the export rewrites absolute looplab imports only"
                )
            todo += [m for m, _ in _targets(node)]
    return sorted(seen)


def flatten_source(module: str) -> str:
    """The module's source with every looplab import rewritten to the folder's flat
    modules: `from looplab.a import x as y` -> `from .looplab_a import x as y`, a module
    imported whole -> `from . import looplab_a_b as b`."""
    path = _module_file(module)
    assert path is not None  # a module of source_closure, which refuses one without a source file
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    edits = []
    for node in _imports(ast.parse(text)):
        if not _targets(node):
            continue
        end = node.end_lineno
        assert end is not None  # ast.parse sets every statement's end
        indent = lines[node.lineno - 1][: node.col_offset]
        comment = lines[end - 1][node.end_col_offset :].strip()
        if indent.strip() or (comment and not comment.startswith("#")):
            raise ConfigError(
                f"{path}:{node.lineno}: an import sharing its line with other code; the export "
                "rewrites import statements on lines of their own"
            )
        statements, names = [], []
        for alias in node.names:
            if isinstance(node, ast.Import):
                if alias.asname is None:
                    raise ConfigError(
                        f"{path}:{node.lineno}: `import {alias.name}`; the export rewrites "
                        "`from looplab... import` and `import looplab... as name` only"
                    )
                statements.append(f"from . import {flat_name(alias.name)} as {alias.asname}")
                continue
            sub = f"{node.module}.{alias.name}"
            if _module_file(sub) is not None:
                statements.append(f"from . import {flat_name(sub)} as {alias.asname or alias.name}")
            else:
                names.append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
        if names:
            assert isinstance(node, ast.ImportFrom) and node.module is not None  # names: `from looplab.x import`
            statements.insert(0, f"from .{flat_name(node.module)} import {', '.join(names)}")
        if comment:
            statements[-1] += "  " + comment
        edits.append((node.lineno, end, "".join(indent + s + "\n" for s in statements)))
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start - 1 : end] = [replacement]
    header = (
        f"# looplab's {module} ({path.name}), copied by `looplab export --format hf` with its looplab imports\n"
        "# rewritten to this folder's flat modules. Edit the original, not this copy.\n"
    )
    return header + "".join(lines)


# ---- the two generated files ----------------------------------------------------------

CONFIGURATION_SOURCE = '''"""The configuration of a looplab looped model exported for transformers
(written by `looplab export --format hf`)."""

from transformers import PretrainedConfig


class LoopLabConfig(PretrainedConfig):
    """looplab_model: looplab's ModelConfig fields (the architecture). exit_policy: how
    the looped model runs and reads out (looplab/policy.py): full | forced:D | dense:Q |
    skip:Q | dense-entropy:T | skip-kl:T | skip-stable:K ...; override it at load time,
    from_pretrained(DIR, trust_remote_code=True, exit_policy="skip:0.4"), or per call,
    model(input_ids, exit_policy="forced:2"). n_loops is R; stage, lineage and method say
    how the checkpoint was trained; exit_policies lists what its stage evaluates."""

    model_type = "looplab"

    def __init__(self, looplab_model=None, exit_policy="full", n_loops=None, stage=None, lineage=None,
                 method=None, exit_policies=None, looplab_tokenizer=None, max_position_embeddings=None, **kwargs):
        self.looplab_model = dict(looplab_model or {})
        self.exit_policy = exit_policy
        self.n_loops = n_loops if n_loops is not None else self.looplab_model.get("n_loops")
        self.stage, self.lineage, self.method = stage, list(lineage or []), method
        self.exit_policies = list(exit_policies or [])
        self.looplab_tokenizer = looplab_tokenizer
        self.vocab_size = self.looplab_model.get("vocab_size")
        self.hidden_size = self.looplab_model.get("d_model")
        self.num_hidden_layers = self.looplab_model.get("n_layers")
        if max_position_embeddings is not None:
            self.max_position_embeddings = max_position_embeddings
        kwargs.setdefault("tie_word_embeddings", False)
        kwargs.setdefault("use_cache", False)
        super().__init__(**kwargs)
'''

MODELING_SOURCE = '''"""A looplab looped model for transformers (written by `looplab export --format hf`).

LoopLabForCausalLM wraps looplab's own LoopedLM (the looplab_*.py files beside this
one are looplab's source) and runs it under the config's exit policy. With padding
(attention_mask zeros) each row's real tokens run alone, so left and right padding
give every real token the logits of its unpadded sequence. generate() recomputes the
forward over the whole sequence for each new token (no cache): every exit policy
decodes as looplab's own generate does.
"""

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_looplab import LoopLabConfig
from .looplab_config import ModelConfig
from .looplab_models_looped import LoopedLM
from .looplab_policy import ExitPolicy

# The rest of looplab's source in this folder: transformers copies the files that
# `from .NAME import` lines name, following them from this file.
__MANIFEST__


class LoopLabForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LoopLabConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = []

    def __init__(self, config: LoopLabConfig):
        super().__init__(config)
        fields = dict(config.looplab_model)
        fields["attn_layer_idx"] = tuple(fields.get("attn_layer_idx") or ())
        self.model = LoopedLM(ModelConfig(**fields))
        self.post_init()

    def _init_weights(self, module):
        pass  # LoopedLM initialises itself; from_pretrained loads every weight

    def get_input_embeddings(self):
        return self.model.embedding

    def set_input_embeddings(self, value):
        self.model.embedding = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def exit_policy(self, spec=None):
        """The ExitPolicy of spec, or of config.exit_policy."""
        policy = ExitPolicy.parse(spec if spec is not None else self.config.exit_policy)
        policy.check(self.model.cfg.n_loops)
        return policy

    def looped_logits(self, input_ids, attention_mask=None, exit_policy=None):
        """(B, L, V) logits under the policy; positions without a real token get zeros."""
        policy = self.exit_policy(exit_policy)
        if attention_mask is None or bool(attention_mask.all()):
            return self.model(input_ids, policy).logits
        real = attention_mask.bool()
        logits = None
        for b in range(input_ids.shape[0]):
            if not bool(real[b].any()):
                continue
            row = self.model(input_ids[b][real[b]][None], policy).logits[0]
            if logits is None:
                logits = row.new_zeros(*input_ids.shape, row.shape[-1])
            logits[b, real[b]] = row
        if logits is None:
            logits = torch.zeros(*input_ids.shape, self.model.cfg.vocab_size, device=input_ids.device)
        return logits

    def forward(self, input_ids=None, attention_mask=None, labels=None, exit_policy=None, return_dict=None,
                **kwargs):
        logits = self.looped_logits(input_ids, attention_mask, exit_policy)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "exit_policy" in kwargs:
            inputs["exit_policy"] = kwargs["exit_policy"]
        return inputs
'''


def modeling_source(modules: list[str]) -> str:
    manifest = "\n".join(
        f"from .{flat_name(m)} import __name__ as _source_{i}  # noqa: F401" for i, m in enumerate(modules)
    )
    return MODELING_SOURCE.replace("__MANIFEST__", manifest)


# ---- config, weights, tokenizer ---------------------------------------------------------


def hf_config(model, policy_spec: str) -> dict[str, Any]:
    """config.json's content: the looplab ModelConfig, the default exit policy, what the
    checkpoint's metadata says of its training, and the auto_map."""
    from looplab.policy import ExitPolicy
    from looplab.stages import DEFAULT_STAGE, get_stage, method_of

    cfg, meta = model.cfg, dict(model.metadata or {})
    looplab_model = dataclasses.asdict(cfg)
    looplab_model["attn_layer_idx"] = list(looplab_model["attn_layer_idx"])
    stage = meta.get("stage", DEFAULT_STAGE)
    lineage = list(meta.get("lineage") or [stage])
    try:
        evaluated = [p.spec for p in get_stage(stage).eval_policies(cfg.n_loops)]
    except ConfigError:
        evaluated = []
    seq_len = (meta.get("experiment") or {}).get("train", {}).get("seq_len")
    spec = meta.get("tokenizer")
    special = {}
    if spec:
        tok = _load_tokenizer(spec)
        special = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    out = {
        "model_type": "looplab",
        "architectures": [MODEL_CLASS],
        "auto_map": {
            "AutoConfig": f"{Path(CONFIG_FILE).stem}.{CONFIG_CLASS}",
            "AutoModelForCausalLM": f"{Path(MODELING_FILE).stem}.{MODEL_CLASS}",
        },
        "looplab_model": looplab_model,
        "n_loops": cfg.n_loops,
        "exit_policy": ExitPolicy.parse(policy_spec).spec,
        "exit_policies": evaluated,
        "stage": stage,
        "lineage": lineage,
        "method": meta.get("method") or method_of(lineage),
        "looplab_tokenizer": spec,
        "tie_word_embeddings": False,
        "use_cache": False,
        "dtype": "float32",
        **special,
    }
    if seq_len:
        out["max_position_embeddings"] = int(seq_len)
    return out


def _load_tokenizer(spec: str):
    from looplab.tasks.tokenizer import load_tokenizer

    return load_tokenizer(spec)


def byte_level_tokenizer():
    """looplab's byte tokenizer as a transformers fast tokenizer: GPT-2's byte-to-
    character map, a BPE over the 256 byte characters with no merges (so each byte is
    one token, its id the byte value), <bos> <eos> <pad> = 256 257 258, <bos>
    prepended when special tokens are added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_to_char = bytes_to_unicode()  # the byte-level pre-tokenizer's map of bytes to characters
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<bos>", "<eos>", "<pad>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", 256)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=int(1e30),
    )


TOKENIZATION_FILE, SP_TOKENIZER_CLASS = "tokenization_looplab.py", "LoopLabSentencePieceTokenizer"
TOKENIZATION_SOURCE = '''"""A SentencePiece model as looplab reads it (written by `looplab export --format hf`):
the sentencepiece library itself encodes and decodes, so ids and text are exactly
looplab's; add_special_tokens=True (the default) prepends <bos>."""

from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


class LoopLabSentencePieceTokenizer(SentencePieceBackend):
    def convert_tokens_to_string(self, tokens):
        return self.sp_model.decode_pieces(list(tokens))

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs):
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return self.sp_model.decode(ids)
'''


def write_sentencepiece_tokenizer(model_file: Path, out: Path) -> None:
    """looplab's SentencePiece tokenizer (Mistral's, pinned) as a transformers
    tokenizer: the model file, a tokenizer_config.json and the small class above
    (AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)). transformers' own
    conversion to a fast tokenizer splits runs of spaces differently from
    sentencepiece, so the ids would not be looplab's; this class runs sentencepiece."""
    shutil.copyfile(model_file, out / "tokenizer.model")
    (out / TOKENIZATION_FILE).write_text(TOKENIZATION_SOURCE, encoding="utf-8")
    config = {
        "tokenizer_class": SP_TOKENIZER_CLASS,
        "auto_map": {"AutoTokenizer": [f"{Path(TOKENIZATION_FILE).stem}.{SP_TOKENIZER_CLASS}", None]},
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "legacy": True,
        "special_tokens_pattern": "bos",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(1e30),
        "backend": "sentencepiece",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_tokenizer(spec: str, out: Path) -> None:
    """Write a transformers tokenizer equal to looplab's tokenizer `spec` into out."""
    from looplab.tasks.tokenizer import (
        ByteTokenizer,
        HFTokenizer,
        SentencePieceTokenizer,
        hub_reachable,
        mistral_model_path,
    )

    tok = _load_tokenizer(spec)
    if isinstance(tok, ByteTokenizer):
        byte_level_tokenizer().save_pretrained(str(out))
    elif isinstance(tok, SentencePieceTokenizer) and spec == "mistral":
        write_sentencepiece_tokenizer(mistral_model_path(), out)
    elif isinstance(tok, HFTokenizer):  # its own files, saved as they are
        from transformers import AutoTokenizer

        local = Path(spec).expanduser().exists() or not hub_reachable()
        AutoTokenizer.from_pretrained(spec, local_files_only=local).save_pretrained(str(out))
    else:
        raise ConfigError(
            f"tokenizer={spec!r} has no Hugging Face export; allowed: bytes | mistral | a HuggingFace "
            "tokenizer name or path"
        )


# ---- the export ---------------------------------------------------------------------------


def check_out_dir(out_dir: str | Path, force: bool = False, name: str = "out_dir") -> Path:
    """The folder to write: new or empty, or with force a previous export (its
    config.json's model_type is looplab), whose contents are replaced. Anything else is
    refused, so --force never deletes a folder that is not an export."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{name}={str(out_dir)!r} is invalid; allowed: a folder (this is a file)")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(
                f"{name}={str(out_dir)!r} is not empty; allowed: an empty or new folder, or --force "
                "to replace a previous export"
            )
        if not _is_export(out):
            raise ConfigError(
                f"{name}={str(out_dir)!r} is not empty and not a looplab export, so --force leaves it "
                "alone; allowed: an empty or new folder, or a previous export"
            )
    return out


def _is_export(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == "looplab"
    except (OSError, ValueError, AttributeError):
        return False


def export_hf(checkpoint, out_dir: str | Path, policy: str = "full", *, force: bool = False) -> Path:
    """Write checkpoint (a looplab checkpoint directory, or a LoopedLM) as a Hugging
    Face folder (module docstring); returns the folder. policy: the default exit policy
    recorded in config.json (a spec such as "skip:0.4")."""
    import torch

    from looplab.checkpoint import save_tensors
    from looplab.policy import ExitPolicy

    out = check_out_dir(out_dir, force)
    if isinstance(checkpoint, (str, Path)):
        from looplab.checkpoint import load_model, verify_checkpoint

        verify_checkpoint(checkpoint, recover="pass another --checkpoint, or train it again")
        model = load_model(checkpoint)
    else:
        model = checkpoint
    spec = policy.spec if isinstance(policy, ExitPolicy) else str(policy)
    ExitPolicy.parse(spec).check(model.cfg.n_loops)
    config = hf_config(model, spec)

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    modules = source_closure()
    for module in modules:
        (out / f"{flat_name(module)}.py").write_text(flatten_source(module), encoding="utf-8")
    (out / CONFIG_FILE).write_text(CONFIGURATION_SOURCE, encoding="utf-8")
    (out / MODELING_FILE).write_text(modeling_source(modules), encoding="utf-8")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {"use_cache": False, "do_sample": False}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in config:
            generation[key] = config[key]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    state = {WEIGHT_PREFIX + k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    weights = out / "model.safetensors"
    save_tensors(state, weights, metadata={"format": "pt"})
    if config["looplab_tokenizer"]:
        write_tokenizer(config["looplab_tokenizer"], out)
    return out
