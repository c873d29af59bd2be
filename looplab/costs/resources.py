"""What one training stage needs before it is launched: its FLOPs, the micro-batch that
fits a device (looplab/costs/memory.py's model), and GPU-hours at a stated utilisation. The
sweeps' dry run prints it per stage (sweeps/sweep.py); `--gpu-memory GB` picks the
micro-batch.

Training FLOPs per token, from looplab's own forward count (models/flops.py), with
backward ≈ 2 × forward, from the stage's facts (looplab/stages.py): its loss reads the
LM head at one step or at all R (Stage.loops_read), a gated stage evaluates the gate
after each of the R − 1 non-final steps, and a stage that trains only the gate runs the
frozen model forward only (no graph through it):
    pretrain        3 × (R backbone steps + one LM head)
    stage1, chase   3 × (R backbone steps + R LM heads + R − 1 gates): the loss reads
                    every step (CHASE's dense branch; its hole branches run less)
    stage2          R backbone steps + R LM heads forward only (no graph through the
                    frozen model), the gate's forward and backward negligible
Activation checkpointing runs each loop's forward once more in backward: + R backbone
steps (the FLOPs the hardware does; MFU counts only the model's), where there is a
graph to recompute.

Inference: `prefill_flops` splits a prefill's forward FLOPs per token into F0, the work
outside the loops, and Fr, one loop application; `flop_ratio` is full's FLOPs over
skip's at d̄ mean executed loops, (F0 + R·Fr)/(F0 + d̄·Fr) (the speed sweep logs it
beside the measured speedup: trainables/bench.py). It is a ratio of FLOPs, not a bound
on time: a measured speedup exceeds it wherever the work outside the loops takes a
smaller share of the time than of the FLOPs (the LM head's GEMM runs nearer peak than a
small mixer). R/d̄, the loop bound, does bound the speedup when a loop costs the same
time in full and skip execution (then the speedup is (T0 + R·t)/(T0 + d̄·t) ≤ R/d̄).
"""

from __future__ import annotations

from dataclasses import dataclass

from looplab.config import ConfigError, ExperimentConfig
from looplab.costs.memory import GiB, StepMemory, gib, step_memory
from looplab.stages import get_stage

DEFAULT_MFU = 0.4  # a planning figure: model FLOP/s over the device's dense peak
# What a device's memory holds beside the step the model counts: the CUDA context, NCCL's
# communication buffers and the allocator's fragmentation. A plan fits the rest.
DEFAULT_MEMORY_MARGIN_GIB = 4.0
DEFAULT_PEAK_TFLOPS = 989.0  # H100 SXM, dense bf16


def row_length(cfg: ExperimentConfig) -> int:
    """Tokens in one of the stage's training rows: train.seq_len for packed text and Mano,
    a whole sample for p-hop (n + 4, whatever train.seq_len says)."""
    return cfg.task.row_length(cfg.train.seq_len)


def flops_per_token(cfg: ExperimentConfig, checkpointing: bool = False) -> float:
    """Training FLOPs per token of cfg's stage (module docstring); checkpointing
    adds the recomputed forward of the backbone."""
    import torch

    from looplab.models.looped import LoopedLM

    with torch.device("meta"):  # exact counts, no memory
        model = LoopedLM(cfg.model)
    f = model.flops_per_token(row_length(cfg))
    R, stage = cfg.model.n_loops, get_stage(cfg.stage)
    heads = stage.loops_read(R) * f["head"]
    gates = (R - 1) * 2 * cfg.model.d_model if stage.gated else 0
    if stage.trains_model:
        total = 3 * (f["backbone"] + heads + gates)
    else:  # the frozen model forward only; the gate forward and backward
        total = f["backbone"] + heads + 3 * gates
    if checkpointing and stage.trains_model:  # a frozen model keeps no graph to recompute
        total += f["backbone"]
    return float(total)


def prefill_flops(model_cfg, seq_len: int, policy=None, readout: str = "last") -> tuple[float, float]:
    """(F0, Fr): forward FLOPs per token of a forward at context seq_len outside the
    loops, and of one loop application (models/flops.py's convention: the embedding
    lookup and the final norm count nothing). Fr is the backbone step at seq_len (skip's
    packed survivors run it at their own count; the difference is the SSD's
    state passing and attention's context, a small share). F0 is the readout (the LM
    head at every token, readout "all"; only at the last position, "last", as a prefill
    computes the prompt's next-token distribution: one head per sequence) plus what the
    exit rule reads after each step r < R: execution (models/execution.py) reads it on
    every token, exited or not, in the dense twin and in skip alike, so it does not shrink
    with the loops: the gate's logit, or a zoo rule's LM head (policy None: the gate's;
    given exits read nothing)."""
    import torch

    from looplab.models.flops import linear_flops
    from looplab.models.looped import LoopedLM
    from looplab.policy import EXIT_RULES, GATE, STEP_LOGITS

    if readout not in ("all", "last"):
        raise ConfigError(f"readout={readout!r} is invalid; allowed: all | last")
    with torch.device("meta"):  # exact counts, no memory
        model = LoopedLM(model_cfg)
    counts = model.flops_per_token(seq_len)
    head = counts["head"]
    rule = EXIT_RULES[GATE] if policy is None else EXIT_RULES.get(policy.rule)
    per_step = 0 if rule is None else head if rule.reads == STEP_LOGITS else linear_flops(model.exit_gate)
    f0 = (head if readout == "all" else head / seq_len) + (model_cfg.n_loops - 1) * per_step
    return float(f0), float(counts["backbone_step"])


def flop_ratio(f0: float, fr: float, n_loops: int, executed_loops: float) -> float:
    """Full's FLOPs over skip's, (F0 + R·Fr)/(F0 + d̄·Fr), d̄ the mean executed loops:
    the speedup if time followed FLOPs. A ratio, not a bound (module docstring); below
    the loop bound R/d̄ by F0's share."""
    return (f0 + n_loops * fr) / (f0 + executed_loops * fr)


@dataclass(frozen=True)
class StagePlan:
    """One stage's training on `ranks` devices."""

    cfg: ExperimentConfig
    ranks: int
    micro_batch: int  # rows per forward on one device
    checkpointing: bool
    memory: StepMemory
    flops: float  # the whole stage, the hardware's (with recomputation)

    @property
    def accumulation(self) -> int:
        return -(-self.cfg.train.batch_size // (self.ranks * self.micro_batch))

    @property
    def tokens(self) -> int:
        return self.cfg.train.steps * self.cfg.train.batch_size * row_length(self.cfg)

    def gpu_hours(self, mfu: float = DEFAULT_MFU, peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> float:
        return self.flops / (mfu * peak_tflops * 1e12) / 3600

    def line(self, mfu: float = DEFAULT_MFU, peak_tflops: float = DEFAULT_PEAK_TFLOPS) -> str:
        t = self.cfg.train
        ckpt = ", activation checkpointing" if self.checkpointing else ""
        return (
            f"{t.steps} steps × {t.batch_size} × {row_length(self.cfg)} tokens = {self.tokens:,}; ≈ {self.flops:.2e} FLOPs; "
            f"micro-batch {self.micro_batch} × {self.accumulation} accumulation × {self.ranks} rank(s){ckpt}; "
            f"peak ≈ {gib(self.memory.peak)} per device; "
            f"≈ {self.gpu_hours(mfu, peak_tflops):,.1f} GPU-hours at {mfu:.0%} MFU of {peak_tflops:g} TFLOP/s"
        )


def plan_stage(
    cfg: ExperimentConfig,
    *,
    ranks: int = 1,
    path: str = "cuda",
    device_memory_gib: float | None = None,
    margin_gib: float = DEFAULT_MEMORY_MARGIN_GIB,
) -> StagePlan:
    """The stage's plan on `ranks` devices. Its own micro-batch (train.micro_batch_size,
    0: a rank's whole share) and checkpointing setting stand unless device_memory_gib
    is given: then the largest micro-batch whose peak fits the device less margin_gib
    (the CUDA context, communication buffers, fragmentation) is chosen (a divisor of the
    rank's rows, so every micro-batch is the same size), without activation
    checkpointing when one fits and with it otherwise (unless the config already asks for
    it). A plan that fits nowhere is a ConfigError naming --gpu-memory."""
    t = cfg.train
    rows = t.batch_size // ranks
    if device_memory_gib is None:
        micro = t.micro_batch_size or rows
        ckpt = t.activation_checkpointing
        return _plan(cfg, ranks, min(micro, rows), ckpt, path)
    budget = (device_memory_gib - margin_gib) * GiB
    sizes = sorted((m for m in range(1, rows + 1) if rows % m == 0), reverse=True)
    for ckpt in [True] if t.activation_checkpointing else [False, True]:
        for micro in sizes:
            plan = _plan(cfg, ranks, micro, ckpt, path)
            if plan.memory.peak <= budget:
                return plan
    smallest = _plan(cfg, ranks, 1, True, path)
    raise ConfigError(
        f"--gpu-memory={device_memory_gib:g} is invalid for {cfg.stage}: one row of "
        f"{t.seq_len} tokens with activation checkpointing needs ≈ {gib(smallest.memory.peak)} per "
        f"device ({smallest.memory.breakdown()}), with a margin of {margin_gib:g} GiB beside it; "
        "allowed: a device of at least that much, a smaller --memory-margin, or a smaller model or "
        "seq_len"
    )


def _plan(cfg: ExperimentConfig, ranks: int, micro: int, ckpt: bool, path: str) -> StagePlan:
    memory = step_memory(cfg, micro, ranks=ranks, path=path, checkpointing=ckpt)
    t = cfg.train
    flops = flops_per_token(cfg, ckpt) * t.steps * t.batch_size * row_length(cfg)
    return StagePlan(cfg, ranks, micro, ckpt, memory, flops)
