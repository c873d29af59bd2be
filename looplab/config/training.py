"""A stage's training recipe (TrainConfig) and its objectives' settings: the exit
gate's (ExitConfig) and CHASE's cache holes (HoleConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from looplab.errors import check
from looplab.fields import check_choice, check_finite, check_ints, is_int, keyed
from looplab.policy import DEFAULT_QS, ROUNDINGS, Rounding

Compile = Literal["auto", "on", "off"]
COMPILE_CHOICES: tuple[str, ...] = get_args(Compile)  # train.compile
Precision = Literal["auto", "fp32", "bf16"]
Device = Literal["auto", "cpu", "cuda"]
Sampler = Literal["depth", "threshold"]
MAX_LR = 1.0  # train.lr (TrainConfig.__post_init__ says why)
# train.lr's floor: an AdamW step moves a weight by about lr, and float32 keeps 24 bits, so
# below ~1e-10 no weight of magnitude 0.002 or more (every initialised one) moves at all.
MIN_LR = 1e-10
MAX_SEED = 2**63 - 1  # train.seed: torch's generators take a signed 64-bit seed
MIN_ADAM_EPS = 1.1754943508222875e-38  # train.adam_eps: float32's smallest normal number
# Optimizer steps one stage may ask for: a thousand times the longest published language-model
# runs (about 10⁶ steps), and 12 days at a millisecond a step. No run means more; a typo does.
MAX_STEPS = 10**9


@dataclass(frozen=True)
class TrainConfig:
    """One training run: AdamW, linear warmup then cosine decay to a floor."""

    # The recipe: these can change the result, so they enter the run's key.
    steps: int = keyed(200)  # optimizer steps of this stage
    batch_size: int = keyed(16)  # global batch (sequences per optimizer step)
    seq_len: int = keyed(128)  # context length of a training sequence (packed tasks)
    lr: float = keyed(1e-3)  # peak learning rate, reached at the end of the warmup (at most MAX_LR = 1)
    min_lr_ratio: float = keyed(0.1)  # cosine floor, as a fraction of lr
    warmup_steps: int = keyed(20)  # steps of linear warmup to lr, before the cosine decay
    weight_decay: float = keyed(0.1)  # AdamW's decoupled weight decay, on matrices only
    beta1: float = keyed(0.9)  # AdamW's first-moment decay
    beta2: float = keyed(0.95)  # AdamW's second-moment decay
    adam_eps: float = keyed(1e-8)  # AdamW's epsilon (at least float32's smallest normal number)
    grad_clip: float = keyed(1.0)  # max global grad norm; 0 disables clipping
    precision: Precision = keyed("auto")  # auto: bf16 autocast on CUDA, fp32 on CPU
    eval_limit: int = keyed(0)  # evaluate on the first K eval samples; 0 = all (changes the logged result)
    seed: int = keyed(0)  # seeds the initialisation, the training stream and the cache holes
    # Where a pre-training run's weights start (looplab/retrofit.py): "" a
    # fresh initialisation, "hf:PATH" a Hugging Face Mamba2ForCausalLM or
    # LlamaForCausalLM folder (its embeddings, head and N of its layers as the shared
    # block; the checkpoint fixes the model's shape, apply_overrides sets it),
    # "hf-shape:PATH" that shape freshly initialised (the from-scratch arm). A continued
    # stage starts from its parent and ignores it. init_layers picks the N layers: "" the
    # first N, "even" evenly spaced (first and last included), or "0,5". Added after keys
    # were stored: at their defaults neither enters a key (fields.keyed's added).
    init_from: str = keyed("", added=True)
    init_layers: str = keyed("", added=True)  # the N layers of init_from's checkpoint: "" the first N, "even", or "0,5"
    # Where in the seed's training stream this run's first batch lies, in samples
    # (sequences) from the stream's start. A continued stage continues its parent's
    # stream (presets.stage_config sets it from ParentRef.data_end, not a person): each
    # stage sees only samples its lineage never saw, and arms of as many steps see as
    # many fresh tokens, where restarting at 0 showed Stage-1 pre-training's first
    # batches again. Added after keys were stored: at 0 (pre-training) it enters no key.
    data_start: int = keyed(0, added=True)
    # How the run is carried out and watched: never in a key.
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batch_size: int = 64  # samples per evaluation forward (memory, not the result)
    # The thresholds q a gated stage evaluates dense and skip at (the paper's grid by
    # default); a finer grid traces the compute–quality curves the claims interpolate.
    eval_qs: tuple[float, ...] = DEFAULT_QS
    log_every: int = 10  # steps between progress lines (and metrics records)
    ckpt_every: int = 0  # 0: no step cadence (ckpt_minutes still applies)
    ckpt_minutes: float = 5.0  # also checkpoint after this much wall clock; 0: off
    device: Device = "auto"  # auto (CUDA when there is one) | cpu | cuda
    # Memory, not maths: a step's gradient is the same (to float rounding) either way.
    micro_batch_size: int = 0  # rows per forward/backward, gradients accumulated; 0: a rank's whole share
    activation_checkpointing: bool = False  # keep each loop's input only, recompute the loop in backward
    # Speed, not maths: the training step's backbone under torch.compile (Inductor) and
    # AdamW's fused kernel, the same losses to float rounding (looplab/models/compiled.py,
    # training/steps.make_optimizer). auto: on for CUDA, off on a CPU, where it was
    # measured not to pay back its compile time (docs/benchmarks.md).
    compile: Compile = "auto"

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
        check(self.seed <= MAX_SEED, "TrainConfig.seed", self.seed, f"an integer in [0, 2**63 - 1 = {MAX_SEED}]")
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
        check(
            MIN_LR <= self.lr <= MAX_LR,
            "TrainConfig.lr",
            self.lr,
            f"a float in [{MIN_LR:g}, {MAX_LR:g}] (below, AdamW's steps round away in float32 weights)",
        )
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
        check_choice(self, "precision", get_args(Precision))
        check_choice(self, "device", get_args(Device))
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

    sampler: Sampler = keyed("depth")  # depth (App. D, the paper's runs) | threshold (§3), as the docstring above says
    rho: float = keyed(1.0)  # probability that a minibatch takes the cache-hole branch
    hp: float = keyed(0.5)  # depth sampler: the fraction of positions holed
    lo: float = keyed(1.85)  # depth sampler: the smallest target depth (>= 1)
    hi: float = keyed(3.45)  # depth sampler: the largest target depth (<= R, model.n_loops)
    bins: int = keyed(8)  # depth sampler: how many evenly spaced target depths span [lo, hi]
    rounding: Rounding = keyed(
        "stochastic"
    )  # depth sampler: a depth to an exit step: stochastic | nearest | floor | ceil
    q_low: float = keyed(0.2)  # threshold sampler: the lowest threshold q drawn for a minibatch
    q_high: float = keyed(0.8)  # threshold sampler: the highest threshold q drawn for a minibatch

    def __post_init__(self) -> None:
        check_choice(self, "sampler", get_args(Sampler))
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
