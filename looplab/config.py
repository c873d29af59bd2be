"""Typed, validated configs: one frozen dataclass per concern.

Every config validates itself on construction, so a bad value fails with one line
naming the field and what is allowed, before anything expensive starts. Configs are
plain data: `to_dict` / `from_dict` round-trip through JSON. A task's config lives
beside its task (ManoConfig in looplab/tasks/mano.py, PhopConfig in phop.py,
TextConfig in text.py) and is imported here; the field declarations and checks every
config shares are in looplab/fields.py. Nothing here imports torch.

Keys by opt-in (as Marin's executor versions only the fields it is told to): a field
that can change a run's result is declared with `keyed(...)`; everything else
(logging, evaluation and checkpoint cadence, device, evaluation batch size, paths)
never enters a key, so a re-run with another log interval reuses every stage. A
stage's `stage_key` hashes its keyed fields (the model, the task, the training recipe,
the sections its stage reads, the seed) and its parent stage's key; `config_hash` is
the same without the seed, shared by the seeds of one configuration. Names of runs
and folders derive from keys, never from timestamps.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Union

from looplab.errors import ConfigError, check, invalid
from looplab.fields import KEY, check_choice, check_finite, check_ints, is_int, key_values, keyed, unkeyed_fields
from looplab.keys import digest
from looplab.policy import DEFAULT_QS, ROUNDINGS
from looplab.stages import DEFAULT_STAGE, STAGE_NAMES, get_stage

# Each task's config lives beside its task; this module gathers them into TaskConfig.
from looplab.tasks.mano import ManoConfig
from looplab.tasks.phop import PhopConfig
from looplab.tasks.text import TextConfig

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "ManoConfig",
    "ParentRef",
    "PhopConfig",
    "TextConfig",
    "apply_overrides",
    "check",
    "invalid",
    "keyed",
    "key_values",
    "unkeyed_fields",
]


ARCHS = ("mamba2", "transformer", "hybrid")
COMPILE_CHOICES = ("auto", "on", "off")  # train.compile
MAX_LR = 1.0  # train.lr (TrainConfig.__post_init__ says why)
MIN_ADAM_EPS = 1.1754943508222875e-38  # train.adam_eps: float32's smallest normal number
# Optimizer steps one stage may ask for: a thousand times the longest published language-model
# runs (about 10⁶ steps), and 12 days at a millisecond a step. No run means more; a typo does.
MAX_STEPS = 10**9
MODEL_BOUNDS = {
    "vocab_size": 1 << 20,
    "d_model": 1 << 16,
    "n_layers": 1024,
    "n_loops": 128,
    "d_state": 4096,
    "headdim": 4096,
    "attn_head_dim": 4096,
    "chunk_size": 1 << 16,
    "expand": 16,
    "d_conv": 64,
    "ngroups": 1024,
}


@dataclass(frozen=True)
class ModelConfig:
    """A looped language model N⊗R: one N-layer backbone applied n_loops times."""

    arch: str = keyed("mamba2")
    vocab_size: int = keyed(64)
    d_model: int = keyed(256)
    n_layers: int = keyed(2)  # N: independently parameterised layers
    n_loops: int = keyed(4)  # R: applications of the shared backbone
    # Two residual mixer blocks per Mamba-2 layer: the paper's proxy for the
    # attention+MLP pair of a Transformer layer (Mano / p-hop models).
    mixers_per_layer: int = keyed(1)
    # Mamba-2 mixer (names as in mamba_ssm.modules.mamba2.Mamba2).
    d_state: int = keyed(64)
    d_conv: int = keyed(4)
    expand: int = keyed(2)
    headdim: int = keyed(64)
    ngroups: int = keyed(1)
    chunk_size: int = keyed(64)
    # Attention layers (transformer, hybrid).
    attn_head_dim: int = keyed(64)
    rope_dim: int = keyed(64)
    rope_theta: float = keyed(10000.0)
    # Gated-MLP width of a transformer layer; 0 means "no MLP". None resolves to
    # the LLaMA default (8/3 d rounded up to a multiple of 64) for transformers
    # and to 0 for Mamba-2 and hybrid stacks, which have no external MLP.
    d_intermediate: int | None = keyed(None)
    attn_layer_idx: tuple[int, ...] = keyed(())  # hybrid only, 0-based
    norm_eps: float = keyed(1e-5)
    init_std: float = keyed(0.02)

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_attn_layer_idx_type()
        self._resolve_mlp_width()
        self._check_floats()
        self._check_head_shapes()
        self._check_attention_layers()

    def _check_sizes(self) -> None:
        """The architecture, and every size an integer within MODEL_BOUNDS."""
        name = "ModelConfig"
        check_choice(self, "arch", ARCHS)
        check_ints(self, "vocab_size", minimum=2)
        check_ints(
            self,
            "d_model",
            "n_layers",
            "n_loops",
            "d_state",
            "expand",
            "headdim",
            "ngroups",
            "chunk_size",
            "attn_head_dim",
        )
        check_ints(self, "d_conv", minimum=2)
        # Bounds far beyond any model of the paper (R ≤ 12, N ≤ 48, d ≤ 1024, 32k vocab), so a
        # config (a checkpoint's, say) can never make looplab build or allocate absurdly.
        for field_name, most in MODEL_BOUNDS.items():
            value = getattr(self, field_name)
            check(value <= most, f"{name}.{field_name}", value, f"an integer in [1, {most}]")
        check(self.mixers_per_layer in (1, 2), f"{name}.mixers_per_layer", self.mixers_per_layer, "1 | 2")

    def _check_attn_layer_idx_type(self) -> None:
        """attn_layer_idx a list of indices (a JSON list arrives as one), kept as a tuple."""
        check(
            isinstance(self.attn_layer_idx, (list, tuple)),
            "ModelConfig.attn_layer_idx",
            self.attn_layer_idx,
            "a list of layer indices, e.g. [1, 3]",
        )
        object.__setattr__(self, "attn_layer_idx", tuple(self.attn_layer_idx))

    def _resolve_mlp_width(self) -> None:
        """d_intermediate: None resolved to the architecture's default, then checked."""
        name = "ModelConfig"
        d_intermediate = self.d_intermediate
        if d_intermediate is None:
            d_intermediate = -(-8 * self.d_model // 3 // 64) * 64 if self.arch == "transformer" else 0
            object.__setattr__(self, "d_intermediate", d_intermediate)
        check_ints(self, "d_intermediate", minimum=0)
        check(d_intermediate <= 1 << 20, f"{name}.d_intermediate", d_intermediate, f"an integer in [0, {1 << 20}]")
        if self.arch == "transformer":
            check(
                d_intermediate > 0,
                f"{name}.d_intermediate",
                d_intermediate,
                "an integer >= 1 for arch='transformer' (LLaMA layers have a gated MLP)",
            )

    def _check_floats(self) -> None:
        """The norm's epsilon, the initialisation's std and RoPE's base: finite and > 0."""
        name = "ModelConfig"
        check_finite(self, "norm_eps", "init_std", "rope_theta")
        check(self.norm_eps > 0, f"{name}.norm_eps", self.norm_eps, "a float > 0")
        check(self.init_std > 0, f"{name}.init_std", self.init_std, "a float > 0")
        check(self.rope_theta > 0, f"{name}.rope_theta", self.rope_theta, "a float > 0")

    def _check_head_shapes(self) -> None:
        """SSM heads that split expand*d_model and their groups; attention heads that split d_model."""
        name = "ModelConfig"
        if self.arch in ("mamba2", "hybrid"):
            d_inner = self.expand * self.d_model
            check(
                d_inner % self.headdim == 0, f"{name}.headdim", self.headdim, f"a divisor of expand*d_model={d_inner}"
            )
            nheads = d_inner // self.headdim
            check(
                nheads % self.ngroups == 0,
                f"{name}.ngroups",
                self.ngroups,
                f"a divisor of the number of SSM heads ({nheads})",
            )
        if self.arch in ("transformer", "hybrid"):
            check(
                self.d_model % self.attn_head_dim == 0,
                f"{name}.attn_head_dim",
                self.attn_head_dim,
                f"a divisor of d_model={self.d_model}",
            )
            check(
                is_int(self.rope_dim) and 0 < self.rope_dim <= self.attn_head_dim and self.rope_dim % 2 == 0,
                f"{name}.rope_dim",
                self.rope_dim,
                f"an even integer in [2, attn_head_dim={self.attn_head_dim}]",
            )

    def _check_attention_layers(self) -> None:
        """A hybrid's attention layers: distinct indices of its layers; none elsewhere."""
        name = "ModelConfig"
        if self.arch == "hybrid":
            idx = self.attn_layer_idx
            check(len(idx) > 0, f"{name}.attn_layer_idx", idx, "a non-empty tuple of layer indices for arch='hybrid'")
            check(
                all(is_int(i) and 0 <= i < self.n_layers for i in idx) and len(set(idx)) == len(idx),
                f"{name}.attn_layer_idx",
                idx,
                f"distinct integers in [0, n_layers={self.n_layers})",
            )
        else:
            check(not self.attn_layer_idx, f"{name}.attn_layer_idx", self.attn_layer_idx, "() unless arch='hybrid'")

    def layer_kinds(self) -> list[str]:
        """The mixer kind of each of the N layers: 'mamba2' or 'attention'."""
        if self.arch == "transformer":
            return ["attention"] * self.n_layers
        if self.arch == "hybrid":
            return ["attention" if i in self.attn_layer_idx else "mamba2" for i in range(self.n_layers)]
        return ["mamba2"] * self.n_layers


TaskConfig = Union[ManoConfig, PhopConfig, TextConfig]
TASK_KINDS: dict[str, type] = {"mano": ManoConfig, "phop": PhopConfig, "text": TextConfig}


@dataclass(frozen=True)
class TrainConfig:
    """One training run: AdamW, linear warmup then cosine decay to a floor."""

    # The recipe: these can change the result, so they enter the run's key.
    steps: int = keyed(200)
    batch_size: int = keyed(16)  # global batch (sequences per optimizer step)
    seq_len: int = keyed(128)  # context length of a training sequence (packed tasks)
    lr: float = keyed(1e-3)
    min_lr_ratio: float = keyed(0.1)  # cosine floor, as a fraction of lr
    warmup_steps: int = keyed(20)
    weight_decay: float = keyed(0.1)
    beta1: float = keyed(0.9)
    beta2: float = keyed(0.95)
    adam_eps: float = keyed(1e-8)
    grad_clip: float = keyed(1.0)  # max global grad norm; 0 disables clipping
    precision: str = keyed("auto")  # auto: bf16 autocast on CUDA, fp32 on CPU
    eval_limit: int = keyed(0)  # evaluate on the first K eval samples; 0 = all (changes the logged result)
    seed: int = keyed(0)
    # Where a pre-training run's weights start (looplab/retrofit.py): "" a
    # fresh initialisation, "hf:PATH" a Hugging Face Mamba2ForCausalLM or
    # LlamaForCausalLM folder (its embeddings, head and N of its layers as the shared
    # block; the checkpoint fixes the model's shape, apply_overrides sets it),
    # "hf-shape:PATH" that shape freshly initialised (the from-scratch arm). A continued
    # stage starts from its parent and ignores it. init_layers picks the N layers: "" the
    # first N, "even" evenly spaced (first and last included), or "0,5". Added after keys
    # were stored: at their defaults neither enters a key (fields.keyed's added).
    init_from: str = keyed("", added=True)
    init_layers: str = keyed("", added=True)
    # Where in the seed's training stream this run's first batch lies, in samples
    # (sequences) from the stream's start. A continued stage continues its parent's
    # stream (presets.stage_config sets it from ParentRef.data_end, not a person): each
    # stage sees only samples its lineage never saw, and arms of as many steps see as
    # many fresh tokens, where restarting at 0 showed Stage-1 pre-training's first
    # batches again. Added after keys were stored: at 0 (pre-training) it enters no key.
    data_start: int = keyed(0, added=True)
    # How the run is carried out and watched: never in a key.
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batch_size: int = 64
    # The thresholds q a gated stage evaluates dense and skip at (the paper's grid by
    # default); a finer grid traces the compute–quality curves the claims interpolate.
    eval_qs: tuple[float, ...] = DEFAULT_QS
    log_every: int = 10
    ckpt_every: int = 0  # 0: no step cadence (ckpt_minutes still applies)
    ckpt_minutes: float = 5.0  # also checkpoint after this much wall clock; 0: off
    device: str = "auto"
    # Memory, not maths: a step's gradient is the same (to float rounding) either way.
    micro_batch_size: int = 0  # rows per forward/backward, gradients accumulated; 0: a rank's whole share
    activation_checkpointing: bool = False  # keep each loop's input only, recompute the loop in backward
    # Speed, not maths: the training step's backbone under torch.compile (Inductor) and
    # AdamW's fused kernel, the same losses to float rounding (looplab/models/compiled.py,
    # training/steps.make_optimizer). auto: on for CUDA, off on a CPU, where it was
    # measured not to pay back its compile time (docs/benchmarks.md).
    compile: str = "auto"

    def __post_init__(self) -> None:
        self._check_counts()
        self._check_optimizer()
        self._check_run_settings()
        self._normalise_eval_qs()
        self._check_init()

    def _check_counts(self) -> None:
        """Steps, batch sizes, cadences and the seed: integers in range."""
        check_ints(self, "steps", "batch_size", "seq_len", "eval_batch_size", "log_every")
        check(self.steps <= MAX_STEPS, "TrainConfig.steps", self.steps, f"an integer in [1, {MAX_STEPS:,}]")
        check_ints(
            self,
            "warmup_steps",
            "eval_every",
            "eval_limit",
            "ckpt_every",
            "seed",
            "micro_batch_size",
            "data_start",
            minimum=0,
        )
        check(
            isinstance(self.activation_checkpointing, bool),
            "TrainConfig.activation_checkpointing",
            self.activation_checkpointing,
            "true or false",
        )

    def _check_optimizer(self) -> None:
        """AdamW's and the schedule's numbers: finite, and where a step stays meaningful."""
        check_finite(
            self, "lr", "min_lr_ratio", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip", "ckpt_minutes"
        )
        # An AdamW step moves each weight by about lr: above 1 it moves every weight past its
        # scale at once, and past float32's range (3.4e38) the optimizer itself overflows.
        check(0 < self.lr <= MAX_LR, "TrainConfig.lr", self.lr, f"a float in (0, {MAX_LR:g}]")
        check(0 <= self.min_lr_ratio <= 1, "TrainConfig.min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        check(self.weight_decay >= 0, "TrainConfig.weight_decay", self.weight_decay, "a float >= 0")
        check(0 <= self.beta1 < 1, "TrainConfig.beta1", self.beta1, "a float in [0, 1)")
        check(0 <= self.beta2 < 1, "TrainConfig.beta2", self.beta2, "a float in [0, 1)")
        # Below float32's smallest normal number eps rounds to (or flushes to) 0, and AdamW
        # divides 0 by 0 for a weight whose gradient is 0: a NaN that is no divergence.
        check(
            self.adam_eps >= MIN_ADAM_EPS,
            "TrainConfig.adam_eps",
            self.adam_eps,
            f"a float >= {MIN_ADAM_EPS:.3g} (float32's smallest normal number)",
        )
        check(self.grad_clip >= 0, "TrainConfig.grad_clip", self.grad_clip, "a float >= 0 (0 disables)")

    def _check_run_settings(self) -> None:
        """How the run is carried out: checkpoint cadence, precision, device, compile."""
        check(
            isinstance(self.ckpt_minutes, (int, float))
            and not isinstance(self.ckpt_minutes, bool)
            and self.ckpt_minutes >= 0,
            "TrainConfig.ckpt_minutes",
            self.ckpt_minutes,
            "a number >= 0 (0: off)",
        )
        check_choice(self, "precision", ("auto", "fp32", "bf16"))
        check_choice(self, "device", ("auto", "cpu", "cuda"))
        check_choice(self, "compile", COMPILE_CHOICES)

    def _normalise_eval_qs(self) -> None:
        """eval_qs: distinct thresholds in (0, 1], kept sorted as floats."""
        qs = self.eval_qs
        check(
            isinstance(qs, (list, tuple))
            and len(qs) > 0
            and all(isinstance(q, (int, float)) and not isinstance(q, bool) and 0 < q <= 1 for q in qs)
            and len(set(qs)) == len(qs),
            "TrainConfig.eval_qs",
            qs,
            "a non-empty list of distinct thresholds in (0, 1], e.g. [0.2, 0.4, 0.6, 0.8, 1.0]",
        )
        object.__setattr__(self, "eval_qs", tuple(float(q) for q in sorted(qs)))

    def _check_init(self) -> None:
        """Where the weights start (init_from) and which layers (init_layers, kept as "0,5")."""
        if self.init_from != "":  # the forms are retrofit's (torch-free, imported only when one is given)
            from looplab.retrofit import ALLOWED, well_formed

            check(well_formed(self.init_from), "TrainConfig.init_from", self.init_from, ALLOWED)
        layers = self.init_layers
        # A command line's init_layers=3 arrives as JSON's 3, and [0, 5] as a list: one spelling, "0,5".
        if is_int(layers) or (isinstance(layers, (list, tuple)) and layers and all(is_int(i) for i in layers)):
            layers = ",".join(str(i) for i in ([layers] if is_int(layers) else layers))
        check(
            isinstance(layers, str) and (layers in ("", "even") or all(part.isdigit() for part in layers.split(","))),
            "TrainConfig.init_layers",
            self.init_layers,
            '"" (the first N) | even | comma-separated layer indices, e.g. 0,5',
        )
        object.__setattr__(self, "init_layers", layers)
        check(
            self.init_from != "" or not layers,
            "TrainConfig.init_layers",
            layers,
            '"" unless train.init_from names a checkpoint',
        )


@dataclass(frozen=True)
class ExitConfig:
    """The exit gate's objectives: Stage-1 (entropy-regularised expected loss) and
    Stage-2 (continuation targets from loss improvements)."""

    beta: float = keyed(0.25)  # Stage-1 entropy coefficient
    entropy_eps: float = keyed(1e-8)  # ε inside the log of H(π)
    kappa: float = keyed(50.0)  # Stage-2 target sharpness
    gamma: float = keyed(0.005)  # Stage-2 minimum improvement

    def __post_init__(self) -> None:
        check_finite(self, "beta", "entropy_eps", "kappa", "gamma")
        check(self.beta >= 0, "ExitConfig.beta", self.beta, "a float >= 0")
        check(self.entropy_eps > 0, "ExitConfig.entropy_eps", self.entropy_eps, "a float > 0")
        check(self.kappa > 0, "ExitConfig.kappa", self.kappa, "a float > 0")
        check(self.gamma >= 0, "ExitConfig.gamma", self.gamma, "a float >= 0")


@dataclass(frozen=True)
class HoleConfig:
    """CHASE: with probability rho a minibatch takes the cache-hole branch.

    sampler="threshold" (§3): q ~ U[q_low, q_high] for the minibatch, skip forward
      with the gate under stop-gradient, CE at each token's realized exit depth.
    sampler="depth" (App. D, the paper's runs): a fraction hp of positions is holed;
      each draws a target depth uniformly from `bins` evenly spaced values spanning
      [lo, hi], which `rounding` maps to an integer exit step; deeper updates of the
      position are dropped (packed out as in skip); Stage-1 loss on that forward.
      stochastic rounding (floor + Bernoulli(fraction)) keeps E[step] = depth.
    """

    sampler: str = keyed("depth")
    rho: float = keyed(1.0)
    hp: float = keyed(0.5)
    lo: float = keyed(1.85)
    hi: float = keyed(3.45)
    bins: int = keyed(8)
    rounding: str = keyed("stochastic")
    q_low: float = keyed(0.2)
    q_high: float = keyed(0.8)

    def __post_init__(self) -> None:
        check_choice(self, "sampler", ("depth", "threshold"))
        check_choice(self, "rounding", ROUNDINGS)
        check_finite(self, "rho", "hp", "lo", "hi", "q_low", "q_high")
        for name in ("rho", "hp", "q_low", "q_high"):
            v = getattr(self, name)
            check(isinstance(v, (int, float)) and 0.0 <= v <= 1.0, f"HoleConfig.{name}", v, "a float in [0, 1]")
        check(self.q_low <= self.q_high, "HoleConfig.q_low", self.q_low, f"a float <= q_high={self.q_high}")
        check(self.lo >= 1, "HoleConfig.lo", self.lo, "a float >= 1 (and <= hi)")
        check(self.lo <= self.hi, "HoleConfig.hi", self.hi, f"a float >= lo={self.lo} (and <= R)")
        check_ints(self, "bins")


def stream_end(data_start: int, steps: int, batch_size: int) -> int:
    """Where a run's training stream stands after `steps` steps of batch_size samples
    from data_start (TrainConfig.data_start): its child's data_start (ParentRef.data_end)."""
    return data_start + steps * batch_size


@dataclass(frozen=True)
class ParentRef:
    """The stage a continued stage starts from. key and group name it by content (its
    stage_key and its config_hash); checkpoint is where its weights are, which never
    enters a key: the same sweep under another storage path has the same keys."""

    stage: str
    key: str  # the parent's stage_key (seed included)
    group: str  # the parent's config_hash (seed excluded): seeds of one configuration share it
    checkpoint: str = ""
    # The samples of the training stream the parent's lineage consumed (its data_start
    # + its steps × batch_size), where its child's stream starts (TrainConfig.data_start).
    # Never in a key by itself: the parent's key names the parent, the child's data_start
    # enters the child's.
    data_end: int = 0

    def __post_init__(self) -> None:
        for name in ("stage", "key", "group"):
            v = getattr(self, name)
            check(isinstance(v, str) and v != "", f"ParentRef.{name}", v, "a non-empty string")
        check(isinstance(self.checkpoint, str), "ParentRef.checkpoint", self.checkpoint, "a directory path")
        check_ints(self, "data_end", minimum=0)


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one run needs: the model, the task, the training recipe, the stage
    (looplab/stages.py) and, for a continued stage, the parent it starts from."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=PhopConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    stage: str = DEFAULT_STAGE
    parent: ParentRef | None = None  # None: a fresh initialisation (pre-training)
    exit: ExitConfig = field(default_factory=ExitConfig)
    hole: HoleConfig = field(default_factory=HoleConfig)
    preset: str = ""  # the preset it derives from, for people reading configs (never in a key)

    def __post_init__(self) -> None:
        check_choice(self, "stage", STAGE_NAMES)
        stage = get_stage(self.stage)
        if stage.continues:
            check(
                self.parent is not None,
                "ExperimentConfig.parent",
                self.parent,
                f"the checkpoint a {self.stage!r} stage continues (it starts from a trained model)",
            )
        else:
            check(
                self.parent is None,
                "ExperimentConfig.parent",
                self.parent,
                f"None for stage={self.stage!r} (it starts from a fresh initialisation)",
            )
        stage.check(self)
        if self.train.init_from:
            check(
                self.model.arch != "hybrid",
                "ModelConfig.arch",
                self.model.arch,
                "mamba2 | transformer with train.init_from (the checkpoint's architecture)",
            )
            chosen = self.train.init_layers
            check(
                chosen in ("", "even") or len(chosen.split(",")) == self.model.n_layers,
                "TrainConfig.init_layers",
                chosen,
                f"{self.model.n_layers} (model.n_layers) comma-separated layer indices",
            )
        need = self.task.vocab_size
        check(
            self.model.vocab_size >= need,
            "ModelConfig.vocab_size",
            self.model.vocab_size,
            f"an integer >= {need}, the {self.task.kind} task's vocabulary",
        )

    @property
    def init_from(self) -> str:
        """The parent's checkpoint directory ("" for a fresh initialisation)."""
        return self.parent.checkpoint if self.parent is not None else ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ExperimentConfig":
        task = dict(d.get("task", {}))
        kind = task.get("kind", "phop")
        check(kind in TASK_KINDS, "task.kind", kind, " | ".join(TASK_KINDS))
        known = {"model", "task", "train", "stage", "parent", "exit", "hole", "preset"}
        for k in d:
            check(k in known, k, d[k], "one of " + ", ".join(sorted(known)))
        parent = d.get("parent")
        return cls(
            model=_build(ModelConfig, d.get("model", {}), "model"),
            task=_build(TASK_KINDS[kind], task, "task"),
            train=_build(TrainConfig, d.get("train", {}), "train"),
            stage=d.get("stage", DEFAULT_STAGE),
            parent=_build(ParentRef, parent, "parent") if parent else None,
            exit=_build(ExitConfig, d.get("exit", {}), "exit"),
            hole=_build(HoleConfig, d.get("hole", {}), "hole"),
            preset=d.get("preset", ""),
        )

    # ---- keys --------------------------------------------------------------------------
    def key_payload(self, *, seed: bool = True) -> dict[str, Any]:
        """Exactly what can change this stage's result: its stage, the keyed fields of
        model, task and train and of the sections its stage reads (local data files
        by their content: TextConfig.data_digest), and its parent's key (its group
        hash when the seed is left out)."""
        payload: dict[str, Any] = {
            "stage": self.stage,
            "model": key_values(self.model),
            "task": key_values(self.task),
            "train": key_values(self.train),
        }
        data = getattr(self.task, "data_digest", None)  # only a text task reads files a user names
        if data is not None:  # local files: keyed by their content, not by where they lie
            payload["task"]["dataset"] = data
        for section in get_stage(self.stage).reads:
            payload[section] = key_values(getattr(self, section))
        if not seed:
            payload["train"].pop("seed")
        if self.parent is not None:
            payload["parent"] = self.parent.key if seed else self.parent.group
        return payload

    def key_fields(self) -> list[str]:
        """The dotted names of the config fields the stage key hashes (checkpoints record them)."""
        payload = self.key_payload()
        return sorted(
            f"{section}.{name}" if isinstance(values, dict) else section
            for section, values in payload.items()
            for name in (values if isinstance(values, dict) else [None])
        )

    def stage_key(self) -> str:
        """Names this stage by content (seed included): looplab.keys.digest of
        key_payload(). Its folder and MLflow runs derive from it (keys.stage_folder)."""
        return digest(self.key_payload())

    def config_hash(self) -> str:
        """stage_key without the seed, chained through the parents' config hashes: the
        seeds of one configuration share it (analysis aggregates seeds by it)."""
        return digest(self.key_payload(seed=False))

    def as_parent(self, checkpoint: str = "") -> ParentRef:
        """This stage as the parent of the next one, its stream consumed to the end of its steps."""
        return ParentRef(
            stage=self.stage,
            key=self.stage_key(),
            group=self.config_hash(),
            checkpoint=checkpoint,
            data_end=stream_end(self.train.data_start, self.train.steps, self.train.batch_size),
        )


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    for k in values:
        check(k in known, f"{prefix}.{k}", values[k], "one of " + ", ".join(sorted(known)))
    kwargs = dict(values)
    if cls is ModelConfig and isinstance(kwargs.get("attn_layer_idx"), list):
        kwargs["attn_layer_idx"] = tuple(kwargs["attn_layer_idx"])  # JSON's list; anything else ModelConfig refuses
    return cls(**kwargs)


SECTION_OF = {
    "ModelConfig": "model",
    "TrainConfig": "train",
    "ExitConfig": "exit",
    "HoleConfig": "hole",
    "ManoConfig": "task",
    "PhopConfig": "task",
    "TextConfig": "task",
}


def is_keyed(name: str) -> bool:
    """Whether a dotted override ("train.lr", "model.n_loops") names a keyed field.
    Unkeyed ones (cadence, device, micro-batching) never change what a run computes;
    every task field is keyed, and so are the stage and the parent."""
    section, _, attr = config_key(name).partition(".")
    cls = {"model": ModelConfig, "train": TrainConfig, "exit": ExitConfig, "hole": HoleConfig}.get(section)
    if cls is None:
        return section != "preset"
    return any(f.name == attr and f.metadata.get(KEY) for f in dataclasses.fields(cls))


def config_key(name: str) -> str:
    """A ConfigError's field as the dotted override key that sets it:
    'HoleConfig.hp' -> 'hole.hp'; 'train.lr' stays."""
    cls, _, field_name = name.partition(".")
    return f"{SECTION_OF[cls]}.{field_name}" if cls in SECTION_OF else name


def parse_value(text: str) -> Any:
    """Parse a command-line override value: JSON if it parses, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(cfg: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """Return cfg with dotted overrides applied, e.g. {"model.n_loops": 1,
    "train.steps": 50}. A bare name is looked up in model, then train, then task;
    the bare names stage and parent (a ParentRef or None) set those. Changing
    task.kind resets the task to that kind's defaults first. The result is validated
    once, after every override is in."""
    d = cfg.to_dict()
    # Presets size the vocabulary to their task; keep it following the task when an
    # override changes the task's vocabulary (e.g. task.L) unless it is set itself.
    vocab_follows_task = cfg.model.vocab_size == cfg.task.vocab_size and not any(
        k in ("model.vocab_size", "vocab_size") for k in overrides
    )
    sections = ("model", "train", "task", "exit", "hole")
    original_arch = d["model"]["arch"]
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        if not section and name in ("stage", "parent"):
            d[name] = dataclasses.asdict(value) if isinstance(value, ParentRef) else value
            continue
        if not section:
            for candidate in sections:
                if name in d[candidate]:
                    section = candidate
                    break
            else:
                raise ConfigError(f"override {key!r} names no field of {', '.join(sections)}, stage or parent")
        check(section in sections, "override section", section, " | ".join(sections))
        if section == "task" and name == "kind" and value != d["task"].get("kind"):
            check(value in TASK_KINDS, "task.kind", value, " | ".join(TASK_KINDS))
            d["task"] = {"kind": value}
            continue
        check(name in d[section], f"{section}.{name}", value, "one of " + ", ".join(sorted(d[section])))
        d[section][name] = value
        if section == "model" and name == "arch" and value != original_arch:
            # Arch-dependent defaults follow the new arch unless set explicitly.
            given = {k.rpartition(".")[2] for k in overrides}
            if "d_intermediate" not in given:
                d["model"]["d_intermediate"] = None
            if "attn_layer_idx" not in given and value != "hybrid":
                d["model"]["attn_layer_idx"] = ()
    if vocab_follows_task:
        task = _build(TASK_KINDS[d["task"].get("kind", "phop")], d["task"], "task")
        d["model"]["vocab_size"] = task.vocab_size
    if d["train"].get("init_from"):
        _follow_checkpoint(d, overrides)
    cfg = ExperimentConfig.from_dict(d)
    if cfg.train.init_from:  # the layers it names exist, before anything starts
        from looplab.retrofit import checkpoint_layers, select_layers

        select_layers(cfg.train.init_layers, cfg.model.n_layers, checkpoint_layers(cfg.train.init_from))
    return cfg


def _follow_checkpoint(d: dict[str, Any], overrides: dict[str, Any]) -> None:
    """train.init_from names a Hugging Face checkpoint: the model takes its shape (width,
    vocabulary, mixer sizes, norm epsilon, RoPE) from it, while N, R and the rest stay
    the preset's and the overrides'. An override that contradicts the checkpoint is
    refused rather than silently replaced."""
    from looplab.retrofit import checkpoint_model_fields

    init_from = d["train"]["init_from"]
    check(isinstance(init_from, str), "TrainConfig.init_from", init_from, '"" | hf:PATH')
    given = {k.rpartition(".")[2]: v for k, v in overrides.items() if k.rpartition(".")[0] in ("", "model")}
    for name, value in checkpoint_model_fields(init_from).items():
        if (
            name in given
            and name in d["model"]
            and given[name] != value
            and not (name == "attn_layer_idx" and tuple(given[name]) == tuple(value))
        ):
            raise invalid(
                f"ModelConfig.{name}",
                given[name],
                f"{value!r}, the checkpoint's in train.init_from="
                f"{init_from!r} (leave it unset: the checkpoint sets it)",
            )
        d["model"][name] = value
    task = _build(TASK_KINDS[d["task"].get("kind", "phop")], d["task"], "task")
    check(
        d["model"]["vocab_size"] >= task.vocab_size,
        "TrainConfig.init_from",
        init_from,
        f"a checkpoint whose vocabulary ({d['model']['vocab_size']}) holds the {task.kind} task's "
        f"({task.vocab_size} ids)",
    )
