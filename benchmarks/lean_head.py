"""Training steps with full logits against the chunked head (models/head.py), side by side.

    PYTHONPATH=$PWD python benchmarks/lean_head.py [--preset local] [--batch 16] [--seq-len 512]
        [--repeats 3] [--threads 2] [--precision fp32|bf16] [--chunk-mib 64] [--stages pretrain,stage1]
        [--json out.json]

For pre-training and Stage-1 one optimizer step (forward, backward, AdamW) of the
preset's model on random tokens, in two arms:
    before  the loss code the chunked head replaced, kept here as the baseline:
            full (B, L, V) logits (R of them for Stage-1) and F.cross_entropy;
    after   looplab.stages.minibatch_loss (hidden states through the chunked head).
All four (stage, arm) steps and a 2048³ matmul (float32, or bf16 with --precision
bf16) are timed in alternation, after a warm-up, so background load hits them
alike; medians are reported. On a CPU shared with other work, 2 threads suffer
most (a descheduled thread stalls every parallel op): --threads 1 is the steadier
measurement.

Peak memory: looplab/costs/measured_memory.py, in a child process whose resident set
follows live tensors (the timing runs in this one, under the allocator's normal
behaviour): the RSS above the RSS before the step, after a warm-up step of every
point (the model, its gradients and AdamW's moments are already resident, so this is
the memory the step needs above the model), and the absolute peak during the step.

MFU = model FLOP/s ÷ the matmul's FLOP/s of this run (same threads). Model FLOPs
per token = 3 × forward FLOPs (forward + backward ≈ 3 forwards):
    pre-training  R backbone steps + one head;
    Stage-1       R backbone steps + R heads (its loss reads every step) + R − 1 gates
(looplab/costs/resources.py's flops_per_token). Work a head implementation adds (a recomputation of logits) would be overhead, not
model work, and is not counted; the trained stages use the head's weighted form,
which does not recompute.

The ratio line sets Stage-1 ÷ pre-training's time beside their FLOP ratio: the time
ratio falls below the FLOP ratio only as far as Stage-1 runs at a higher MFU.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Literal

import torch

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of, number_in, one_of, some_of
from looplab.checkpoint import model_from_config, parent_ref
from looplab.costs.measured_memory import in_rss_process, peak_memory
from looplab.costs.resources import flops_per_token
from looplab.devices import autocast_context
from looplab.models import head as lean_head
from looplab.models.head import token_losses
from looplab.policy import ExitPolicy
from looplab.presets import PRESETS, get_preset, stage_config
from looplab.stages import get_stage
from looplab.tasks.base import IGNORE_INDEX, Batch
from looplab.training.objectives import masked_mean, stage1_loss
from looplab.training.steps import make_optimizer

STAGES = ("pretrain", "stage1")
# The chunked head's targets on `local` (after): Stage-1's memory above the model and its
# step time, each ÷ pre-training's, at most these; pre-training's MFU at least this.
MEMORY_RATIO_TARGET, TIME_RATIO_TARGET, PRETRAIN_MFU_TARGET = 1.5, 2.5, 0.5
ARMS = ("before", "after")
GEMM_N = 2048


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    preset: str = flag("local", "the model", type=one_of(*sorted(PRESETS)), metavar="PRESET")
    batch: int = flag(16, "sequences per step", type=at_least(1))
    seq_len: int = flag(512, "tokens per sequence", type=at_least(1))
    repeats: int = flag(3, "timed steps per (stage, arm), after one warm-up", type=at_least(1))
    threads: int = flag(2, "torch threads", type=at_least(1))
    chunk_mib: float | None = flag(
        None,
        f"logits MiB per chunk of the head (default {lean_head.DEFAULT_CHUNK_BYTES / 2**20:g})",
        type=number_in(0.0, low_open=True),
    )
    arms: tuple[str, ...] = flag(ARMS, "before,after or one of them", type=some_of(*ARMS))
    stages: tuple[str, ...] = flag(STAGES, "pretrain,stage1 or one of them", type=some_of(*STAGES))
    precision: Literal["fp32", "bf16"] = flag(
        "fp32", "bf16: autocast (as train.precision=bf16), MFU against a bf16 matmul"
    )
    json: str | None = flag(None, "write the results here")


def before_loss(model, batch: Batch, cfg) -> torch.Tensor:
    """The replaced code: CE from full logits (stages.py before the chunked head)."""
    mask = batch.targets != IGNORE_INDEX
    if cfg.stage == "pretrain":
        return masked_mean(token_losses(model(batch.ids).logits, batch.targets), mask)
    out = model(batch.ids, ExitPolicy.full(), all_steps=True)
    losses = torch.stack([token_losses(logits, batch.targets) for logits in out.step_logits])
    return stage1_loss(losses, torch.sigmoid(out.gate_logits), mask, cfg.exit.beta, cfg.exit.entropy_eps)[0]


def after_loss(model, batch: Batch, cfg) -> torch.Tensor:
    return get_stage(cfg.stage).minibatch_loss(model, batch, cfg, 0)[0]


def gemm_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    t = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - t


class Steps:
    """The benchmark's model, optimizer and batch; step(stage, arm) -> one optimizer step."""

    def __init__(self, opts: Options):
        if opts.chunk_mib:
            lean_head.DEFAULT_CHUNK_BYTES = int(opts.chunk_mib * 2**20)
        base = get_preset(opts.preset)
        # Stage-1 from the fresh model: the step's cost does not depend on the weights
        # (init_from names no checkpoint; nothing is loaded).
        shape = {"train.batch_size": opts.batch, "train.seq_len": opts.seq_len}  # what the FLOP count reads
        self.cfgs = {
            s: stage_config(base, s, parent=None if s == "pretrain" else parent_ref("(fresh)"), overrides=shape)
            for s in STAGES
        }
        self.base, self.precision = base, opts.precision
        self.model = model_from_config(base.model, 0)
        self.model.train()
        self.optimizer = make_optimizer(self.model, base.train, torch.device("cpu"))
        self.gen = torch.Generator().manual_seed(0)
        V, B, L = base.model.vocab_size, opts.batch, opts.seq_len
        self.batch = Batch(
            torch.randint(0, V, (B, L), generator=self.gen), torch.randint(0, V, (B, L), generator=self.gen)
        )

    def step(self, stage: str, arm: str):
        loss_fn = {"before": before_loss, "after": after_loss}[arm]

        def run():
            with autocast_context(torch.device("cpu"), self.precision):
                loss = loss_fn(self.model, self.batch, self.cfgs[stage])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()

        return run


def step_peaks(opts: Options, points) -> dict:
    """Every point's peak memory (run in a child process: measured_memory)."""
    steps = Steps(opts)
    for pt in points:  # warm-up: first-touch allocations, AdamW state
        steps.step(*pt)()
    return {pt: peak_memory(steps.step(*pt), torch.device("cpu")) for pt in points}


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args())
    torch.set_num_threads(opts.threads)
    arms, stages = opts.arms, opts.stages
    points = [(s, a) for s in stages for a in arms]
    print("measuring peak memory in a separate process...", flush=True)
    peaks = in_rss_process(step_peaks, opts, points)

    steps = Steps(opts)
    base, cfgs = steps.base, steps.cfgs
    V, B, L = base.model.vocab_size, opts.batch, opts.seq_len
    dtype = torch.bfloat16 if opts.precision == "bf16" else torch.float32
    gemm_a, gemm_b = (torch.randn(GEMM_N, GEMM_N, generator=steps.gen).to(dtype) for _ in range(2))
    for pt in points:  # warm-up: first-touch allocations, AdamW state
        steps.step(*pt)()
    gemm_seconds(gemm_a, gemm_b)
    times = {pt: [] for pt in points}
    gemm = []
    for _ in range(opts.repeats):
        for pt in points:
            t = time.perf_counter()
            steps.step(*pt)()
            times[pt].append(time.perf_counter() - t)
            gemm.append(gemm_seconds(gemm_a, gemm_b))
    peak_gflops = 2 * GEMM_N**3 / statistics.median(gemm) / 1e9
    mem = {pt: peaks[pt].delta for pt in points}
    absolute = {pt: peaks[pt].absolute for pt in points}

    tokens = B * L
    rows = []
    for s, a in points:
        t = statistics.median(times[(s, a)])
        flops = flops_per_token(cfgs[s]) * tokens  # looplab/costs/resources.py: the stage's model FLOPs
        rows.append(
            {
                "stage": s,
                "arm": a,
                "step_s": t,
                "step_s_all": times[(s, a)],
                "tokens_per_s": tokens / t,
                "model_gflop": flops / 1e9,
                "mfu": flops / t / (peak_gflops * 1e9),
                "peak_mem_above_model": mem[(s, a)],
                "peak_rss": absolute[(s, a)],
            }
        )
    ratios = {}
    for a in arms if len(stages) == 2 else ():
        pre, s1 = (next(r for r in rows if r["stage"] == s and r["arm"] == a) for s in STAGES)
        # Stage-1's loss reads out every step, so its model FLOPs are a fixed
        # multiple of pre-training's: its time ratio can only fall below that
        # multiple by running at a higher MFU than pre-training (the "mfu" ratio).
        ratios[a] = {
            "time": s1["step_s"] / pre["step_s"],
            "flops": s1["model_gflop"] / pre["model_gflop"],
            "mfu": s1["mfu"] / pre["mfu"],
            "memory": s1["peak_mem_above_model"] / max(1, pre["peak_mem_above_model"]),
        }

    print(
        f"{opts.preset}: B {B} × L {L}, vocab {V}, R {base.model.n_loops}, {opts.threads} threads, "
        f"head chunk {lean_head.chunk_tokens_for(V)} tokens; {opts.precision} GEMM {GEMM_N}³: {peak_gflops:.1f} GFLOP/s "
        f"(median of {len(gemm)})"
    )
    print("stage     arm      step s   tok/s   model GFLOP  MFU    mem above model  peak RSS")
    for r in rows:
        print(
            f"{r['stage']:9s} {r['arm']:7s} {r['step_s']:7.2f}  {r['tokens_per_s']:6.0f}  {r['model_gflop']:11.1f}"
            f"  {r['mfu']:5.1%}  {r['peak_mem_above_model'] / 1e9:12.2f} GB  {r['peak_rss'] / 1e9:5.2f} GB"
        )
    for a, q in ratios.items():
        print(
            f"Stage-1 ÷ pre-training ({a}): time {q['time']:.2f}× for {q['flops']:.2f}× the model FLOPs "
            f"(MFU {q['mfu']:.2f}×), memory above model {q['memory']:.2f}×"
        )
    if "after" in arms and len(stages) == 2:
        pre = next(r for r in rows if r["stage"] == "pretrain" and r["arm"] == "after")
        after = ratios["after"]
        met = {True: "met", False: "MISSED"}
        print(
            f"targets (after): memory ≤ {MEMORY_RATIO_TARGET}× {met[after['memory'] <= MEMORY_RATIO_TARGET]}, "
            f"time ≤ {TIME_RATIO_TARGET}× {met[after['time'] <= TIME_RATIO_TARGET]}, "
            f"pre-training MFU ≥ {PRETRAIN_MFU_TARGET:.0%} {met[pre['mfu'] >= PRETRAIN_MFU_TARGET]}"
        )
        need = after["flops"] / TIME_RATIO_TARGET
        print(
            f"  (time ≤ {TIME_RATIO_TARGET}× needs Stage-1 at {need:.2f}× pre-training's MFU, "
            f"{need * pre['mfu']:.0%} of the GEMM peak)"
        )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "preset": opts.preset,
                    "batch": B,
                    "seq_len": L,
                    "threads": opts.threads,
                    "precision": opts.precision,
                    "chunk_tokens": lean_head.chunk_tokens_for(V),
                    "gemm_gflops": peak_gflops,
                    "gemm_s_all": gemm,
                    "machine": platform.processor() or platform.machine(),
                    "torch": torch.__version__,
                    "rows": rows,
                    "ratios": ratios,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
