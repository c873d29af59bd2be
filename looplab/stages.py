"""The training stages, one object each, in one registry (paper §3, App. A, App. D).

    pretrain  fixed-loop pre-training: CE at step R                        method "fixed"
    stage1    Ouro Stage-1: Σ_r π^(r) ℓ^(r) − β H(π), backbone and gate    method "Ouro"
    chase     cache-hole adaptation (the hole branch with probability ρ)   method "CHASE"
    stage2    Ouro Stage-2: only the gate trains, on continuation targets  keeps its parent's method
    pretrain_more, stage1_more   their parent's loss for more steps: step-matched controls

A `Stage` owns everything that makes it what it is: its name and order, whether it
continues a parent checkpoint, the config sections beyond model/task/train that
change its result (so they enter its key), its optimiser recipe (App. D) with a warmup
*fraction* of its own steps, which parameters train, which loops' outputs its loss
reads, its loss, what it evaluates, and the method label a model carries after it.
Config validation and hashing (looplab/config/), the CLI's --stage choices, the platform's
stage order (trainables/pipeline.py), the memory and FLOP models (memory.py,
resources.py), training (train.py) and analysis's method labels read these facts and
never a stage's name.

Adding a stage is one entry plus its loss: `register(Stage(...))` (or a line in
STAGES below) and a function decorated `@stage_loss(name)`, taking (model, batch, cfg,
step, rows) and returning (loss, diagnostics). The built-in losses live in
looplab/training/objectives.py and register themselves when it is imported
(training/train.py and evaluation/validation.py import it), so this module stays below
the configs and torch.

A stage's config derives from a preset by one precedence rule (presets.stage_config):
    preset < stage recipe (and the preset's budget for the stage) < sweep-wide overrides
           < per-stage overrides,
and a continued stage's warmup is its recipe's fraction of its own final step count
unless train.warmup_steps is overridden. A continued stage also continues its parent's
training stream: its train.data_start is where the parent's lineage stopped
(ParentRef.data_end) unless train.data_start is overridden, so no stage trains on a
batch an earlier stage of its lineage saw.

This module imports no torch, no config and no loss (the configs validate themselves
against it, the losses register with it, the analysis layer reads it): a `cfg` below
is an ExperimentConfig, read by its fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from looplab.errors import ConfigError, check
from looplab.policy import DEFAULT_QS, ExitPolicy

# Method labels recorded on every stage run (tag `method`): what a model is after it.
METHOD_FIXED, METHOD_OURO, METHOD_CHASE = "fixed", "Ouro", "CHASE"

# What a stage trains: every parameter, or only the exit gate (the model frozen).
TRAINS_ALL, TRAINS_GATE = "all", "gate"
# Which loops' outputs a stage's loss reads: the final loop's only, or every loop's.
FINAL_LOOP, EVERY_LOOP = "final", "every"


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
        return {
            "train.lr": self.lr,
            "train.min_lr_ratio": self.min_lr / self.lr,
            "train.grad_clip": self.grad_clip,
            "train.beta1": self.beta1,
            "train.beta2": self.beta2,
            "train.weight_decay": self.weight_decay,
        }

    def warmup_steps(self, steps: int) -> int:
        return max(1, round(self.warmup_fraction * steps))


@dataclass(frozen=True)
class Stage:
    name: str
    method: str | None  # the method label a model has after this stage; None: its parent's
    continues: bool  # starts from a parent stage's checkpoint (config validation demands one)
    gated: bool  # trains or uses the exit gate, so it is evaluated under exit policies
    trains: str  # TRAINS_ALL parameters, or TRAINS_GATE: only the exit gate
    loss_reads: str  # FINAL_LOOP or EVERY_LOOP: whose outputs the loss reads (the head's work and memory)
    reads: tuple[str, ...] = ()  # config sections beyond model/task/train that change its result
    recipe: Recipe | None = None  # None: the preset's own recipe (pre-training)
    doc: str = ""

    def __post_init__(self) -> None:
        check(self.trains in (TRAINS_ALL, TRAINS_GATE), "Stage.trains", self.trains, f"{TRAINS_ALL} | {TRAINS_GATE}")
        check(
            self.loss_reads in (FINAL_LOOP, EVERY_LOOP),
            "Stage.loss_reads",
            self.loss_reads,
            f"{FINAL_LOOP} | {EVERY_LOOP}",
        )

    @property
    def order(self) -> int:
        return list(STAGES).index(self.name)

    @property
    def trains_model(self) -> bool:
        """Whether the backbone, embedding and head train. When only the gate does, the
        model's forward needs no graph (no saved activations, no backward through it,
        no recomputation), which memory.py and resources.py count."""
        return self.trains == TRAINS_ALL

    @property
    def samples_holes(self) -> bool:
        """Whether its loss samples cache holes: the hole section (HoleConfig) is one it reads."""
        return "hole" in self.reads

    def loops_read(self, n_loops: int) -> int:
        """How many loops' outputs the loss reads through the LM head: 1 or R."""
        return n_loops if self.loss_reads == EVERY_LOOP else 1

    def trainable(self, parameter_name: str) -> bool:
        return self.trains_model or parameter_name.startswith("exit_gate.")

    def check(self, cfg) -> None:
        """The stage's own demands on a config (ExperimentConfig validation calls it)."""
        if self.gated:
            check(
                cfg.model.n_loops >= 2,
                "ModelConfig.n_loops",
                cfg.model.n_loops,
                f"an integer >= 2 for stage={self.name!r} (an exit gate needs a choice of steps)",
            )
        if self.samples_holes and cfg.hole.sampler == "depth":
            check(
                cfg.hole.hi <= cfg.model.n_loops,
                "HoleConfig.hi",
                cfg.hole.hi,
                f"a float in [lo={cfg.hole.lo}, R={cfg.model.n_loops}]",
            )

    def eval_policies(self, n_loops: int, qs=DEFAULT_QS) -> list[ExitPolicy]:
        """What a run of this stage evaluates: full depth and the forced depths 1..R-1
        (the fixed-depth baseline of App. E and of the paper's trade-off figure: forced R
        is full depth, evaluated once; the per-loop cross-entropy); gated stages add
        dense and skip at every threshold of qs (train.eval_qs: the paper's grid by
        default)."""
        forced = [ExitPolicy.forced(d) for d in range(1, n_loops)]
        if not self.gated:
            return [ExitPolicy.full()] + forced
        return [ExitPolicy.full()] + [ExitPolicy.dense(q) for q in qs] + [ExitPolicy.skip(q) for q in qs] + forced

    @property
    def loss(self) -> Callable:
        """The function registered as this stage's loss (@stage_loss)."""
        if self.name not in _LOSSES:
            raise LookupError(
                f"stage {self.name!r} has no loss registered; decorate one with "
                f"@looplab.stages.stage_loss({self.name!r}) (the built-in stages' losses register "
                "when looplab.training.objectives is imported)"
            )
        return _LOSSES[self.name][0]

    @property
    def shows(self) -> tuple[str, ...]:
        """The loss's diagnostics that a progress line prints (stage_loss(shows=...))."""
        return _LOSSES[self.name][1] if self.name in _LOSSES else ()

    def minibatch_loss(self, model, batch, cfg, step: int, rows=None):
        """The stage's training loss of one minibatch and its diagnostics. rows: which
        rows of the step's global batch `batch` is (training/distributed.Rows; None: all
        of it, which a loss that reads rows takes as Rows.whole)."""
        return self.loss(model, batch, cfg, step, rows)


_CONTINUED = Recipe(lr=1.5e-4, min_lr=8e-5, warmup_fraction=0.002, grad_clip=0.6)  # App. D: Stage-1 and CHASE

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "pretrain",
            METHOD_FIXED,
            continues=False,
            gated=False,
            trains=TRAINS_ALL,
            loss_reads=FINAL_LOOP,
            doc="fixed-loop pre-training: mean next-token CE at step R",
        ),
        Stage(
            "stage1",
            METHOD_OURO,
            continues=True,
            gated=True,
            trains=TRAINS_ALL,
            loss_reads=EVERY_LOOP,
            reads=("exit",),
            recipe=_CONTINUED,
            doc="Ouro Stage-1: Σ_r π^(r) ℓ^(r) − β H(π) on the dense forward; trains backbone and gate",
        ),
        # Its loss reads every loop on the dense branch, which bounds its cost; the hole
        # branches read each token at its exit.
        Stage(
            "chase",
            METHOD_CHASE,
            continues=True,
            gated=True,
            trains=TRAINS_ALL,
            loss_reads=EVERY_LOOP,
            reads=("exit", "hole"),
            recipe=_CONTINUED,
            doc="CHASE: with probability ρ the cache-hole branch (skip forward at sampled exits), else Stage-1",
        ),
        Stage(
            "stage2",
            None,
            continues=True,
            gated=True,
            trains=TRAINS_GATE,
            loss_reads=EVERY_LOOP,
            reads=("exit",),
            recipe=Recipe(lr=1.5e-4, min_lr=1.5e-5, warmup_fraction=0.01, grad_clip=1.0),
            doc="Ouro Stage-2: only the gate trains, BCE to σ(κ(max(0, ℓ^(r) − ℓ^(r+1)) − γ))",
        ),
        # Step-matched controls: a method's effect is only its own when the compared arm
        # trained its weights as many steps, on as many fresh samples (every continued stage
        # continues its parent's data stream). Each repeats its parent's loss with the
        # continued recipe, so the extra steps are the only difference. Not compute-matched:
        # a CHASE step skips loops on its hole branch, a Stage-1 step reads every loop.
        Stage(
            "pretrain_more",
            None,
            continues=True,
            gated=False,
            trains=TRAINS_ALL,
            loss_reads=FINAL_LOOP,
            recipe=_CONTINUED,
            doc="fixed-loop pre-training continued (its loss, the continued recipe): the fixed-depth comparator "
            "trained as many weight steps as a gated arm",
        ),
        Stage(
            "stage1_more",
            None,
            continues=True,
            gated=True,
            trains=TRAINS_ALL,
            loss_reads=EVERY_LOOP,
            reads=("exit",),
            recipe=_CONTINUED,
            doc="Stage-1 continued without holes: stock Ouro trained as many weight steps as CHASE's stage",
        ),
    )
}
# stage name -> its minibatch loss and the diagnostics its progress line shows (stage_loss fills it)
_LOSSES: dict[str, tuple[Callable, tuple[str, ...]]] = {}
# The stage of a config, or a checkpoint, that names none: the first that starts from fresh weights.
DEFAULT_STAGE: str = next(name for name, stage in STAGES.items() if not stage.continues)
# The paper's two gated arms, which share pre-training and Stage-1: stock Ouro (Stage-2
# on Stage-1) and CHASE (cache-hole adaptation, then Stage-2) (App. D).
OURO_ARM = ("pretrain", "stage1", "stage2")
CHASE_ARM = ("pretrain", "stage1", "chase", "stage2")
ARMS: dict[str, tuple[str, ...]] = {"ouro": OURO_ARM, "chase": CHASE_ARM}
# Their step-matched controls: Ouro given CHASE's extra weight steps without holes (two
# stages of 200, as CHASE's), and (a fixed-loop arm) pre-training continued for as many
# steps as Stage-1 and CHASE, in one stage: one learning-rate restart and optimizer reset
# where CHASE's weights have two (paper_mini's protocol discloses it).
OURO_MATCHED_ARM = ("pretrain", "stage1", "stage1_more", "stage2")
FIXED_MATCHED_ARM = ("pretrain", "pretrain_more")


class _StageNames(Sequence):
    """The registered stages' names in order, read afresh from STAGES on every use, so
    that a stage registered after import (a plug-in's, a test's) is a valid choice
    wherever the names were imported (config validation, the platform's pipelines)."""

    def __getitem__(self, index):
        return tuple(STAGES)[index]

    def __len__(self) -> int:
        return len(STAGES)

    def __iter__(self):
        return iter(tuple(STAGES))

    def __contains__(self, name: object) -> bool:
        return name in STAGES

    def __repr__(self) -> str:
        return repr(tuple(STAGES))


STAGE_NAMES: Sequence[str] = _StageNames()


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise ConfigError(f"stage={name!r} is invalid; allowed: {' | '.join(STAGE_NAMES)}")
    return STAGES[name]


def register(stage: Stage) -> Stage:
    """Add a stage after the registered ones; its loss registers with @stage_loss."""
    if stage.name in STAGES:
        raise ConfigError(f"stage={stage.name!r} is registered already; allowed: a new name")
    STAGES[stage.name] = stage
    return stage


def unregister(name: str) -> None:
    """Remove a registered stage and its loss (a test's toy stage leaves none behind)."""
    get_stage(name)
    del STAGES[name]
    _LOSSES.pop(name, None)


def stage_loss(name: str, shows: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: the function becomes the loss of the registered stage `name`. shows:
    the diagnostics of its own (keys of the dict it returns) that the training loop's
    progress line prints beside the loss, in this order (Stage.shows)."""
    get_stage(name)  # a loss for no stage is a typo

    def register_loss(loss: Callable) -> Callable:
        _LOSSES[name] = (loss, tuple(shows))
        return loss

    return register_loss


def method_of(lineage) -> str:
    """The method label of a model trained through these stages in order: the label of
    the last stage that sets one (stage2 after chase is CHASE, after stage1 Ouro)."""
    method = METHOD_FIXED
    for name in lineage:
        method = get_stage(name).method or method
    return method
