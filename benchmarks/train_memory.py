"""Peak memory of training steps, measured beside looplab/costs/memory.py's model: what
micro-batching and activation checkpointing save, and how close the model is.

    python benchmarks/train_memory.py [--preset local] [--batch 8] [--seq-len 512]
        [--points pretrain:0:0,stage1:0:0,stage1:0:1,stage1:2:0,stage2:0:0] [--threads 2] [--repeats 3]
        [--set model.arch=transformer ...] [--json out.json]

A point is STAGE:MICRO:CKPT (MICRO 0: the whole batch in one forward; CKPT 1: train.
activation_checkpointing). For each, one optimizer step (every micro-batch's forward
and backward, AdamW) of the preset's model on random tokens, after a warm-up step,
through the trainer's own accumulation (looplab.training.train); continued stages start from
the fresh model (a step's memory does not depend on the weights).

Measured: looplab/costs/measured_memory.py on CPU, in a child process whose resident set
follows live tensors: the RSS above the RSS before the step (weights and AdamW's
moments are resident by then). The step's wall time is the median of --repeats steps
in this process, under the allocator's normal behaviour. Model: StepMemory.peak −
persistent on the torch path (the CPU's).
Checkpointing's saving is reported against the point of the same stage and micro-batch
without it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of, one_of
from looplab.checkpoint import parent_ref
from looplab.config import apply_overrides, parse_value
from looplab.costs.measured_memory import in_rss_process, peak_memory
from looplab.costs.memory import step_memory
from looplab.costs.timing import median_seconds
from looplab.presets import PRESETS, get_preset, stage_config
from looplab.stages import STAGE_NAMES
from looplab.training.steps import optimizer_step

MiB = 2**20
POINTS = "pretrain:0:0,stage1:0:0,stage1:0:1,stage1:2:0,stage2:0:0"


def points_text(text: str) -> str:
    """An argparse type: comma-separated STAGE:MICRO:CKPT points, as given once checked."""
    for spec in text.split(","):
        stage, micro, ckpt = (spec.split(":") + ["", ""])[:3]
        if spec.count(":") != 2 or stage not in STAGE_NAMES or not micro.isdigit() or ckpt not in ("0", "1"):
            raise argparse.ArgumentTypeError(
                f"{text!r} is invalid; allowed: comma-separated STAGE:MICRO:CKPT with STAGE one of "
                f"{' | '.join(STAGE_NAMES)}, MICRO >= 0 and CKPT 0 or 1, e.g. stage1:2:0"
            )
    return text


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    preset: str = flag("local", "the model", type=one_of(*sorted(PRESETS)), metavar="PRESET")
    batch: int = flag(8, "sequences per step", type=at_least(1))
    seq_len: int = flag(512, "tokens per sequence", type=at_least(1))
    points: str = flag(POINTS, "STAGE:MICRO:CKPT, comma-separated", type=points_text)
    threads: int = flag(2, "torch threads", type=at_least(1))
    repeats: int = flag(3, "timed steps per point (median), after a warm-up; 0: memory only", type=at_least(0))
    set: list[str] = flag(help="config override (repeatable)", metavar="KEY=VALUE", repeat=True)
    json: str | None = flag(None, "write the rows here")


def point_config(base, stage: str, micro: int, ckpt: bool, batch: int, seq_len: int):
    parent = None if stage == "pretrain" else parent_ref("(fresh)")
    return stage_config(
        base,
        stage,
        parent=parent,
        overrides={
            "train.batch_size": batch,
            "train.seq_len": seq_len,
            "train.micro_batch_size": micro,
            "train.activation_checkpointing": ckpt,
        },
    )


def training_step(cfg):
    """One optimizer step of the config's stage (the trainer's accumulation), warmed up."""
    step, _ = optimizer_step(cfg, torch.device("cpu"))
    step()  # AdamW's moments, first-touch allocations
    return step


def step_peak(cfg):
    """One step's peak above the resident model (run in a child process: measured_memory)."""
    return peak_memory(training_step(cfg), torch.device("cpu"))


def step_seconds(cfg, repeats: int) -> float:
    return median_seconds(training_step(cfg), repeats)


def main(argv: list[str] | None = None) -> list[dict]:
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args(argv))
    torch.set_num_threads(opts.threads)
    base = apply_overrides(
        get_preset(opts.preset), {k: parse_value(v) for k, _, v in (s.partition("=") for s in opts.set)}
    )
    rows = []
    print(
        f"{opts.preset} ({base.model.arch} {base.model.n_layers}⊗{base.model.n_loops}, d {base.model.d_model}, "
        f"vocab {base.model.vocab_size}): batch {opts.batch} × {opts.seq_len}, {opts.threads} threads, "
        f"peak above the resident model"
    )
    print("stage     micro ckpt   measured     model   model/measured  step s")
    for spec in opts.points.split(","):
        stage, micro, ckpt = spec.split(":")
        cfg = point_config(base, stage, int(micro), ckpt == "1", opts.batch, opts.seq_len)
        est = step_memory(cfg, int(micro) or opts.batch, path="torch")
        peak = in_rss_process(step_peak, cfg)
        row = {
            "stage": stage,
            "micro": int(micro),
            "ckpt": ckpt == "1",
            "measured": peak.delta,
            "absolute": peak.absolute,
            "step_s": step_seconds(cfg, opts.repeats) if opts.repeats else None,
            "model": est.peak - est.persistent,
            "model_terms": est.breakdown(),
        }
        rows.append(row)
        print(
            f"{stage:9s} {int(micro) or opts.batch:5d} {'yes' if row['ckpt'] else 'no':4s} "
            f"{row['measured'] / MiB:8.0f} MiB {row['model'] / MiB:6.0f} MiB {row['model'] / row['measured']:8.2f}"
            f"        {'-' if row['step_s'] is None else format(row['step_s'], '6.2f')}",
            flush=True,
        )
    for r in rows:
        plain = next((q for q in rows if not q["ckpt"] and q["stage"] == r["stage"] and q["micro"] == r["micro"]), None)
        if r["ckpt"] and plain is not None:
            print(
                f"activation checkpointing, {r['stage']} micro {r['micro'] or opts.batch}: peak "
                f"{plain['measured'] / MiB:.0f} → {r['measured'] / MiB:.0f} MiB "
                f"({r['measured'] / plain['measured']:.0%})"
                + (f", step {plain['step_s']:.2f} → {r['step_s']:.2f} s" if opts.repeats else "")
            )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "preset": opts.preset,
                    "batch": opts.batch,
                    "seq_len": opts.seq_len,
                    "threads": opts.threads,
                    "overrides": opts.set,
                    "rows": rows,
                },
                f,
                indent=2,
            )
    return rows


if __name__ == "__main__":
    main()
