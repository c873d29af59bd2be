"""Named presets: small Python functions returning a complete ExperimentConfig.

Sizes: `debug` / `*-debug` train in seconds on a CPU, `*-local` in minutes on a laptop; the
paper presets carry the settings of App. B–D (the continued stages' optimiser recipes
live with the stages, looplab/stages.py; their step budgets per preset here).
Experiments derive from a preset with `dataclasses.replace` or
`config.apply_overrides`, and a stage's config with `stage_config` (the one
precedence rule: preset < stage recipe < sweep-wide < per-stage overrides).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from looplab.config import (
    ExperimentConfig,
    ManoConfig,
    ModelConfig,
    ParentRef,
    PhopConfig,
    TextConfig,
    TrainConfig,
    apply_overrides,
    invalid,
)
from looplab.config.model import Arch
from looplab.errors import allowed_names
from looplab.stages import get_stage

PRESETS: dict[str, Callable[[], ExperimentConfig]] = {}
# The preset's step budget of each continued stage (the paper's, App. D); a stage
# without one trains as many steps as the preset's pre-training.
STAGE_BUDGETS: dict[str, dict[str, int]] = {}
# Presets that are one family's variants for a value of a field a sweep varies: a
# sweep that switches model.arch on paper-140m trains paper-140m-transformer (App. D's
# d_intermediate 640, the hybrid's attention indices), one that varies task.L on a Mano
# preset trains each level with its own App. B recipe. family -> {(key, value): preset}.
VARIANTS: dict[str, dict[tuple[str, object], str]] = {}
FAMILY: dict[str, str] = {}  # preset -> its family


def preset(name: str, stage_steps: dict[str, int] | None = None):
    def register(fn: Callable[[], ExperimentConfig]):
        PRESETS[name] = fn
        if stage_steps:
            STAGE_BUDGETS[name] = dict(stage_steps)
        return fn

    return register


def get_preset(name: str) -> ExperimentConfig:
    if name not in PRESETS:
        raise invalid("preset", name, allowed_names(name, sorted(PRESETS)))
    return replace(PRESETS[name](), preset=name)


def stage_budget(name: str, stage: str) -> int | None:
    """The preset's step count for a continued stage, or None (the pre-training's)."""
    return STAGE_BUDGETS.get(name, {}).get(stage)


def variant(family: str, key: str, value, name: str) -> None:
    """Register preset `name` as `family`'s own preset for key = value."""
    VARIANTS.setdefault(family, {})[(key, value)] = name
    FAMILY[name] = family


def variant_of(name: str, key: str, value) -> str | None:
    """The preset of `name`'s family for key = value (None: the family has none).
    Variants are declared for scalar values; a list (attn_layer_idx=[1, 3]) has none."""
    if isinstance(value, (list, dict, set)):
        return None
    return VARIANTS.get(FAMILY.get(name, ""), {}).get((key, value))


def _experiment(model: ModelConfig, task, train: TrainConfig) -> ExperimentConfig:
    # Size the vocabulary to the task unless the model states its own.
    return ExperimentConfig(model=replace(model, vocab_size=task.vocab_size), task=task, train=train)


# ---- p-hop (App. C) ------------------------------------------------------------
# The paper's p-hop models are Mamba-2 with d = 256 and two mixers per layer; it
# gives lr 2e-4 → 2e-5, 2000 warmup steps, clip 1.0, wd 0.1, bf16, but not the batch
# size or step count: 128 × 50k steps here is our choice.


def _phop_paper(p: int) -> ExperimentConfig:
    return _experiment(
        ModelConfig(arch="mamba2", d_model=256, n_layers=1, n_loops=6, mixers_per_layer=2, chunk_size=64),
        PhopConfig(n=256, p=p, alphabet=4, eval_count=10_000),
        TrainConfig(
            steps=50_000,
            batch_size=128,
            seq_len=272,
            lr=2e-4,
            min_lr_ratio=0.1,
            warmup_steps=2000,
            weight_decay=0.1,
            grad_clip=1.0,
            eval_every=2000,
            eval_limit=0,
            ckpt_every=5000,
        ),
    )


preset("phop-p16")(lambda: _phop_paper(16))
preset("phop-p32")(lambda: _phop_paper(32))


# The two laptop p-hop presets' recipe (one hop or two, a Mamba-2 or an attention layer)
PHOP_DEBUG_TRAIN = TrainConfig(steps=1000, batch_size=32, lr=3e-3, warmup_steps=30, eval_every=250, log_every=50)


@preset("phop-debug")
def phop_debug() -> ExperimentConfig:
    # Two hops need two lookups in sequence: one Mamba-2 mixer does one, 1⊗2 can
    # do both. The 1⊗1 baseline still finds shortcuts at this tiny n (≈ 70%).
    return _experiment(
        ModelConfig(arch="mamba2", d_model=32, n_layers=1, n_loops=2, d_state=16, headdim=16, chunk_size=16),
        PhopConfig(n=12, p=2, alphabet=4, eval_count=500),
        PHOP_DEBUG_TRAIN,
    )


@preset("phop-induction-debug")
def phop_induction_debug() -> ExperimentConfig:
    # One hop is induction, which a one-layer attention stack cannot compose
    # (it needs a previous-token head feeding an induction head); looping the
    # layer twice gives it the second application. The loop-advantage test uses it.
    return _experiment(
        ModelConfig(
            arch="transformer", d_model=64, n_layers=1, n_loops=2, attn_head_dim=16, rope_dim=16, d_intermediate=128
        ),
        PhopConfig(n=16, p=1, alphabet=4, eval_count=500),
        PHOP_DEBUG_TRAIN,
    )


@preset("phop-local")
def phop_local() -> ExperimentConfig:
    return _experiment(
        ModelConfig(
            arch="mamba2", d_model=128, n_layers=1, n_loops=4, mixers_per_layer=2, d_state=32, headdim=32, chunk_size=32
        ),
        PhopConfig(n=64, p=4, alphabet=4, eval_count=2000),
        TrainConfig(steps=2000, batch_size=32, lr=2e-3, warmup_steps=100, eval_every=250, log_every=50),
    )


# ---- Mano (App. B) -------------------------------------------------------------
# d = 1024, two Mamba-2 mixers per layer, 4⊗6 (the paper's best at effective depth
# 24), AdamW (0.9, 0.98), eps 1e-6, wd 0.1, 1000 warmup steps, cosine to 0.1×,
# context 1024, batch 128; steps and peak lr per difficulty as in App. B.


def _mano_paper(L: int, steps: int, lr: float) -> ExperimentConfig:
    return _experiment(
        ModelConfig(arch="mamba2", d_model=1024, n_layers=4, n_loops=6, mixers_per_layer=2, chunk_size=64),
        ManoConfig(L=L, eval_count=2000),
        TrainConfig(
            steps=steps,
            batch_size=128,
            seq_len=1024,
            lr=lr,
            min_lr_ratio=0.1,
            warmup_steps=1000,
            beta1=0.9,
            beta2=0.98,
            adam_eps=1e-6,
            weight_decay=0.1,
            grad_clip=1.0,
            eval_every=2000,
            ckpt_every=5000,
        ),
    )


for _L, _steps, _lr in ((10, 80_000, 5e-4), (16, 110_000, 1e-4), (24, 200_000, 5e-5)):
    preset(f"mano-L{_L}")(lambda L=_L, steps=_steps, lr=_lr: _mano_paper(L, steps, lr))
    variant("mano-paper", "task.L", _L, f"mano-L{_L}")


@preset("mano-debug")
def mano_debug() -> ExperimentConfig:
    return _experiment(
        ModelConfig(arch="mamba2", d_model=64, n_layers=1, n_loops=4, d_state=16, headdim=16, chunk_size=32),
        ManoConfig(L=3, eval_count=500),
        TrainConfig(steps=300, batch_size=16, seq_len=128, lr=3e-3, warmup_steps=30, eval_every=100, log_every=20),
    )


@preset("mano-local")
def mano_local() -> ExperimentConfig:
    return _experiment(
        ModelConfig(
            arch="mamba2", d_model=128, n_layers=2, n_loops=4, mixers_per_layer=2, d_state=32, headdim=32, chunk_size=64
        ),
        ManoConfig(L=5, eval_count=2000),
        TrainConfig(steps=2000, batch_size=16, seq_len=256, lr=2e-3, warmup_steps=100, eval_every=250, log_every=50),
    )


# ---- language models (App. D) --------------------------------------------------
# Shared pre-training recipe: context 2048, vocabulary 32k (Mistral-7B tokenizer),
# AdamW (0.9, 0.95), wd 0.1, cosine 8e-4 → 8e-5, warmup 10%, clip 1.0, bf16, seed
# 3407, global batch 1024 sequences, 75k steps (150B tokens) for the Table 4 models.


def _paper_lm(
    d_model: int, n_layers: int, arch: Arch, attn_idx: tuple[int, ...], steps: int = 75_000
) -> ExperimentConfig:
    # App. D: the Transformer's gated MLP is 640 wide (parameter-matched to Mamba-2, not
    # LLaMA's 8/3 d); the hybrid puts attention (no MLP, RoPE 64) at attn_idx.
    model = ModelConfig(
        arch=arch,
        d_model=d_model,
        n_layers=n_layers,
        n_loops=4,
        d_state=128,
        headdim=64,
        expand=2,
        chunk_size=256,
        attn_head_dim=64,
        rope_dim=64,
        d_intermediate=640 if arch == "transformer" else 0,
        attn_layer_idx=attn_idx if arch == "hybrid" else (),
    )
    train = TrainConfig(
        steps=steps,
        batch_size=1024,
        seq_len=2048,
        lr=8e-4,
        min_lr_ratio=0.1,
        warmup_steps=steps // 10,
        beta1=0.9,
        beta2=0.95,
        weight_decay=0.1,
        grad_clip=1.0,
        eval_every=2_500,
        ckpt_every=2_500,
        seed=3407,
    )
    return _experiment(model, TextConfig(tokenizer="mistral", dataset="climbmix"), train)


# Table 4's models: 75k pre-training steps; App. D's continued stages: Stage-1 2,500
# iterations, CHASE 800 (140M) / 2,000 (370M), Stage-2 600. Table 3's iso-FLOPs grid
# (N ∈ {6, 12, 24} at d 768) pre-trains for 50k steps (100B tokens): paper-table3.
for _arch, _suffix in (("mamba2", ""), ("transformer", "-transformer"), ("hybrid", "-hybrid")):
    preset(f"paper-140m{_suffix}", stage_steps={"stage1": 2500, "chase": 800, "stage2": 600})(
        lambda a=_arch: _paper_lm(768, 24, a, (5, 10, 15, 20))
    )
    preset(f"paper-370m{_suffix}", stage_steps={"stage1": 2500, "chase": 2000, "stage2": 600})(
        lambda a=_arch: _paper_lm(1024, 48, a, (6, 18, 30, 42))
    )
    for _family in ("paper-140m", "paper-370m"):
        variant(_family, "model.arch", _arch, f"{_family}{_suffix}")
for _arch, _suffix in (("mamba2", ""), ("transformer", "-transformer")):
    preset(f"paper-table3{_suffix}")(lambda a=_arch: _paper_lm(768, 24, a, (), steps=50_000))
    variant("paper-table3", "model.arch", _arch, f"paper-table3{_suffix}")


@dataclass(frozen=True)
class Table4Group:
    """One block of the paper's Table 4: a backbone at a scale (the preset whose
    config its rows are) and its rows in the paper's order. A row is "loopR" / "baseline"
    (that preset's N layers at R loops, or 1, without a gate, at full depth) or a gated
    method "loop4-Ouro" (dense execution) / "loop4-CHASE" (skip). trained_by: the preset
    of the sweep that trains the block's ungated rows (sweeps/adaptive_pipeline.py
    --baselines); LLaMA-2 has no gated arm, so its rows ride with the Mamba-2 command."""

    title: str
    preset: str
    rows: tuple[str, ...]
    trained_by: str


TABLE4_GATED = {"loop4-Ouro": ("Ouro", "dense"), "loop4-CHASE": ("CHASE", "skip")}  # row -> (method, execution)
TABLE4 = (
    Table4Group("140M LLaMA-2", "paper-140m-transformer", ("baseline", "loop4"), "paper-140m"),
    Table4Group(
        "140M Mamba-2", "paper-140m", ("baseline", "loop2", "loop4", "loop4-Ouro", "loop4-CHASE"), "paper-140m"
    ),
    Table4Group("140M Mamba-2 Hybrid", "paper-140m-hybrid", ("baseline", "loop4", "loop4-Ouro"), "paper-140m-hybrid"),
    Table4Group("370M Mamba-2", "paper-370m", ("baseline", "loop4", "loop4-Ouro", "loop4-CHASE"), "paper-370m"),
    Table4Group("370M Mamba-2 Hybrid", "paper-370m-hybrid", ("baseline", "loop4", "loop4-Ouro"), "paper-370m-hybrid"),
)


def table4_loops(row: str) -> int | None:
    """An ungated row's loops ("baseline": 1, "loop2": 2); None for a gated row."""
    if row in TABLE4_GATED:
        return None
    return 1 if row == "baseline" else int(row.removeprefix("loop"))


# Offline language models on the embedded corpus (Shakespeare + CPython's pydoc
# topics, ~1.8M Mistral tokens, 5.6M bytes): the whole text pipeline end to end.


@preset("debug")
def debug() -> ExperimentConfig:
    # Bytes: no tokenizer file, and a 259-row head costs nothing next to the mixer.
    return _experiment(
        ModelConfig(arch="mamba2", d_model=64, n_layers=1, n_loops=4, d_state=16, headdim=16, chunk_size=32),
        TextConfig(tokenizer="bytes", dataset="embedded", val_blocks=32),
        TrainConfig(steps=200, batch_size=16, seq_len=128, lr=3e-3, warmup_steps=20, eval_every=100, log_every=20),
    )


@preset("local")
def local() -> ExperimentConfig:
    # The README's main job (the β ablation: this pre-training, then five Stage-1
    # trials) must fit 15 minutes on 2 cores. Mistral's 32000 × 128 head dominates
    # every step, and Stage-1 runs it at each of the R = 4 steps (its loss weighs
    # every step's CE): ~9.5 s per 2,048 tokens on one core. Hence 8 × 128 tokens
    # per step and 32 validation blocks (4,096 tokens).
    return _experiment(
        ModelConfig(arch="mamba2", d_model=128, n_layers=2, n_loops=4, d_state=32, headdim=32, chunk_size=64),
        TextConfig(tokenizer="mistral", dataset="embedded", val_blocks=32),
        TrainConfig(
            steps=120,
            batch_size=8,
            seq_len=128,
            lr=3e-3,
            warmup_steps=10,
            eval_every=60,
            eval_batch_size=16,
            log_every=10,
        ),
    )


# ---- a stage's config ----------------------------------------------------------------


def stage_config(
    base: ExperimentConfig,
    stage: str,
    *,
    parent: ParentRef | None = None,
    overrides: dict[str, Any] | None = None,
    stage_overrides: dict[str, Any] | None = None,
) -> ExperimentConfig:
    """`base` (a preset's config) as `stage`, continuing `parent`, by the precedence
    rule of the module docstring: the stage's recipe and the preset's step budget for
    it (presets.STAGE_BUDGETS, when the preset has one), then the sweep-wide
    `overrides`, then this stage's `stage_overrides`; the warmup follows the stage's
    own final steps. A continued stage continues its parent's training stream:
    train.data_start is parent.data_end (the samples the parent's lineage consumed)
    unless the overrides set train.data_start themselves. An override of a field the
    preset's family has a variant for (model.arch on paper-140m, task.L on a Mano
    preset: presets.VARIANTS) starts from that variant, so the paper's own settings for
    it come along."""
    spec = get_stage(stage)
    given = {**(overrides or {}), **(stage_overrides or {})}  # per-stage wins over sweep-wide
    for key, value in given.items():  # a field the preset's family has its own preset for
        other = variant_of(base.preset, key, value)
        if other is not None and other != base.preset:
            base = get_preset(other)
    budget = stage_budget(base.preset, stage) if spec.continues else None
    layers: dict[str, Any] = {"stage": stage, "parent": parent}
    if budget is not None:
        layers["train.steps"] = budget
    if spec.recipe is not None:
        layers.update(spec.recipe.overrides())
    if parent is not None:  # under the overrides: an explicit train.data_start wins
        layers["train.data_start"] = parent.data_end
    layers.update(given)
    if spec.recipe is not None and not _sets(given, "warmup_steps"):
        steps = next((v for k, v in reversed(layers.items()) if k.rpartition(".")[2] == "steps"), base.train.steps)
        layers["train.warmup_steps"] = spec.recipe.warmup_steps(steps) if isinstance(steps, int) else steps
    cfg = apply_overrides(base, layers)
    _check_given_warmup(cfg, given)
    return cfg


def _check_given_warmup(cfg: ExperimentConfig, given: dict[str, Any]) -> None:
    """A warmup the caller sets longer than the run never reaches its learning rate: one
    line naming the override. (A preset's own warmup over steps the caller shortened is
    left alone: that is every quick run of a preset.)"""
    key = next((k for k in given if k.rpartition(".")[2] == "warmup_steps"), None)
    if key is not None and cfg.train.warmup_steps > cfg.train.steps:
        raise invalid(
            key,
            given[key],
            f"a warmup of at most the run's {cfg.train.steps} steps (longer, its learning rate is never reached)",
        )


def _sets(overrides: dict[str, Any], field_name: str) -> bool:
    return any(k.rpartition(".")[2] == field_name for k in overrides)
