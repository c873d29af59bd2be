"""The training stages, one object each, in one registry (paper §3, App. A, App. D).

    pretrain  fixed-loop pre-training: CE at step R                        method "fixed"
    stage1    Ouro Stage-1: Σ_r π^(r) ℓ^(r) − β H(π), backbone and gate    method "Ouro"
    chase     cache-hole adaptation (the hole branch with probability ρ)   method "CHASE"
    stage2    Ouro Stage-2: only the gate trains, on continuation targets  keeps its parent's method

A `Stage` owns everything that makes it what it is: its name and order, whether it
continues a parent checkpoint, the config sections beyond model/task/train that
change its result (so they enter its key), its optimiser recipe (App. D) with a warmup
*fraction* of its own steps, which parameters train, its loss (looplab/objectives.py),
what it evaluates, and the method label a model carries after it. Config validation
and hashing (config.py), the CLI's --stage choices, the platform's stage order
(trainables/pipeline.py) and analysis's method labels derive from `STAGES`; adding a
stage is one entry here plus its loss.

A stage's config derives from a preset by one precedence rule (presets.stage_config):
    preset < stage recipe (and the preset's budget for the stage) < sweep-wide overrides
           < per-stage overrides,
and a continued stage's warmup is its recipe's fraction of its own final step count
unless train.warmup_steps is overridden.

This module imports no torch and no config at its top (the configs validate
themselves against it; the analysis layer reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing import TYPE_CHECKING

from looplab.errors import ConfigError, check
from looplab.policy import DEFAULT_QS, ExitPolicy

if TYPE_CHECKING:  # the configs validate themselves against this registry, so it imports none of them
    from looplab.config import ExperimentConfig

# Method labels recorded on every stage run (tag `method`): what a model is after it.
METHOD_FIXED, METHOD_OURO, METHOD_CHASE = "fixed", "Ouro", "CHASE"


@dataclass(frozen=True)
class Recipe:
    """A continued stage's optimiser settings (App. D: AdamW (0.9, 0.95), wd 0.1,
    cosine from lr to min_lr after a linear warmup over warmup_fraction of the
    stage's steps). They replace the preset's pre-training recipe."""

    lr: float
    min_lr: float
    warmup_fraction: float
    grad_clip: float
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1

    def overrides(self) -> dict[str, Any]:
        """The recipe as train.* overrides (the warmup follows the steps: warmup_steps)."""
        return {"train.lr": self.lr, "train.min_lr_ratio": self.min_lr / self.lr, "train.grad_clip": self.grad_clip,
                "train.beta1": self.beta1, "train.beta2": self.beta2, "train.weight_decay": self.weight_decay}

    def warmup_steps(self, steps: int) -> int:
        return max(1, round(self.warmup_fraction * steps))


@dataclass(frozen=True)
class Stage:
    name: str
    method: str | None  # the method label a model has after this stage; None: its parent's
    continues: bool  # starts from a parent stage's checkpoint
    gated: bool  # trains or uses the exit gate, so it is evaluated under exit policies
    trains: str  # "all" parameters, or only the exit "gate"
    reads: tuple[str, ...] = ()  # config sections beyond model/task/train that change its result
    recipe: Recipe | None = None  # None: the preset's own recipe (pre-training)
    doc: str = ""

    @property
    def order(self) -> int:
        return STAGE_NAMES.index(self.name)

    def trainable(self, parameter_name: str) -> bool:
        return self.trains == "all" or parameter_name.startswith("exit_gate.")

    def check(self, cfg: ExperimentConfig) -> None:
        """The stage's own demands on a config (ExperimentConfig validation calls it)."""
        if self.gated:
            check(cfg.model.n_loops >= 2, "ModelConfig.n_loops", cfg.model.n_loops,
                  f"an integer >= 2 for stage={self.name!r} (an exit gate needs a choice of steps)")
        if self.name == "chase" and cfg.hole.sampler == "depth":
            check(cfg.hole.hi <= cfg.model.n_loops, "HoleConfig.hi", cfg.hole.hi,
                  f"a float in [lo={cfg.hole.lo}, R={cfg.model.n_loops}]")

    def eval_policies(self, n_loops: int, qs=DEFAULT_QS) -> list[ExitPolicy]:
        """What a run of this stage evaluates: full depth and the forced depths 1..R-1
        (the fixed-depth baseline of App. E and of the paper's trade-off figure: forced R
        is full depth, evaluated once; the per-loop cross-entropy); gated stages add
        dense and skip at every threshold of qs (train.eval_qs: the paper's grid by
        default)."""
        forced = [ExitPolicy.forced(d) for d in range(1, n_loops)]
        if not self.gated:
            return [ExitPolicy.full()] + forced
        return ([ExitPolicy.full()] + [ExitPolicy.dense(q) for q in qs]
                + [ExitPolicy.skip(q) for q in qs] + forced)

    def minibatch_loss(self, model, batch, cfg: ExperimentConfig, step: int, rows=None):
        """The stage's training loss of one minibatch and its diagnostics
        (looplab/objectives.py holds one function per stage, named after it). rows:
        which rows of the step's global batch `batch` is (default: all of it)."""
        from looplab import objectives
        from looplab.distributed import Rows

        return getattr(objectives, f"{self.name}_minibatch")(model, batch, cfg, step, rows or Rows.whole(len(batch)))


_CONTINUED = Recipe(lr=1.5e-4, min_lr=8e-5, warmup_fraction=0.002, grad_clip=0.6)  # App. D: Stage-1 and CHASE

STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("pretrain", METHOD_FIXED, continues=False, gated=False, trains="all",
          doc="fixed-loop pre-training: mean next-token CE at step R"),
    Stage("stage1", METHOD_OURO, continues=True, gated=True, trains="all", reads=("exit",), recipe=_CONTINUED,
          doc="Ouro Stage-1: Σ_r π^(r) ℓ^(r) − β H(π) on the dense forward; trains backbone and gate"),
    Stage("chase", METHOD_CHASE, continues=True, gated=True, trains="all", reads=("exit", "hole"),
          recipe=_CONTINUED,
          doc="CHASE: with probability ρ the cache-hole branch (skip forward at sampled exits), else Stage-1"),
    Stage("stage2", None, continues=True, gated=True, trains="gate", reads=("exit",),
          recipe=Recipe(lr=1.5e-4, min_lr=1.5e-5, warmup_fraction=0.01, grad_clip=1.0),
          doc="Ouro Stage-2: only the gate trains, BCE to σ(κ(max(0, ℓ^(r) − ℓ^(r+1)) − γ))"),
)}
STAGE_NAMES: tuple[str, ...] = tuple(STAGES)


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise ConfigError(f"stage={name!r} is invalid; allowed: {' | '.join(STAGE_NAMES)}")
    return STAGES[name]


def method_of(lineage) -> str:
    """The method label of a model trained through these stages in order: the label of
    the last stage that sets one (stage2 after chase is CHASE, after stage1 Ouro)."""
    method = METHOD_FIXED
    for name in lineage:
        method = get_stage(name).method or method
    return method
