"""The scale scan: where the paper's effects live at laptop scale, and how they grow.

    python sweeps/scale_scan.py --dry-run                               # the plan and its time
    python sweeps/scale_scan.py --storage-path runs/scan                # cache holes, 3 seeds
    python sweeps/scale_scan.py --effect loops --storage-path runs/scan # loop advantage on p-hop

--effect holes (the cache-hole effect, paper Fig. 2): at every scan point, pre-training
→ Stage-1, then the loop4-Ouro arm (→ Stage-2) and the loop4-CHASE arm (→ CHASE →
Stage-2), which share Stage-1 (the adaptive pipeline, sweeps/adaptive_pipeline.py).
Every gated stage evaluates skip execution over a fine threshold grid (train.eval_qs),
so analysis/claims.py can read each arm's perplexity increase over its own full compute
at matched executed loops (interpolated on the arm's q sweep, never at equal q). The
points vary one axis at a time around a centre (HOLE_CENTRE): context length,
pre-training length (each continued stage trains a quarter of it), width, R (CHASE's
hole depth range scaled with R), and the tokenizer (bytes against Mistral's 32k, at
400 pre-training steps: the Mistral head makes a step ~4x dearer).

--effect loops (the loop advantage, paper Tables 1-2): pre-training of N⊗R, the
iso-parameter N⊗1 and the iso-depth NR⊗1 on p-hop at a ladder of hop counts p (--hops;
p = 1 is induction), on `phop-debug`'s Mamba-2 at LOOP_OVERRIDES, or with --preset
phop-induction-debug on a one-layer attention model.

The seeds (default 0,1,2) are the scan's own; sweeps/paper_mini.py reports its verdicts
on other seeds, so no verdict is read off the data its regime was chosen on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

from looplab import arguments
from looplab.arguments import flag, flags_of
from looplab.config.paths import checked_key, field_key
from looplab.stages import ARMS
from looplab.tracking import VAL_ACCURACY, VAL_LOSS, VAL_PPL
from sweeps.depth_grid import depth_grid, level_from, pairs_from
from sweeps.flags import Common, fail, parse_list
from sweeps.launch import main
from sweeps.sweep import SKIP_COLUMNS, Sweep
from trainables.pipeline import PipelineSpec

CONTINUED = ("stage1", "chase", "stage2")
# Scan params -> config keys, and the stages each reaches (default: every stage).
HOLE_PARAMS = {
    "seq_len": field_key(lambda c: c.train.seq_len),
    "pretrain_steps": field_key(lambda c: c.train.steps),
    "stage_steps": field_key(lambda c: c.train.steps),
    "d_model": field_key(lambda c: c.model.d_model),
    "n_loops": field_key(lambda c: c.model.n_loops),
    "tokenizer": checked_key("task.tokenizer"),  # the text task's (the task's kind is the preset's)
    "lo": field_key(lambda c: c.hole.lo),
    "hi": field_key(lambda c: c.hole.hi),
}
HOLE_SCOPES = {"pretrain_steps": ("pretrain",), "stage_steps": CONTINUED, "lo": ("chase",), "hi": ("chase",)}
# The centre every axis varies around: debug's byte-level 1⊗4 Mamba-2 at a 512-token context.
HOLE_CENTRE = {"seq_len": 512, "pretrain_steps": 800, "d_model": 64, "n_loops": 4, "tokenizer": "bytes"}
HOLE_AXES: dict[str, list[Any]] = {
    "seq_len": [128, 256, 1024],
    "pretrain_steps": [200, 400, 1600],
    "d_model": [32, 128],
    "n_loops": [2, 6],
    # Mistral's head costs ~4x a byte-level step: its point trains 400 steps, beside the
    # byte-level point at 400 steps of the pre-training axis.
    "tokenizer": [{"tokenizer": "mistral", "pretrain_steps": 400}],
}
# The settings every point shares: the paper's CHASE (App. D: depth holes, hp 0.5), a
# batch of 8 sequences, 64 validation blocks, and a fine threshold grid for the q sweeps.
HOLE_OVERRIDES = {
    "hole.sampler": "depth",
    "hole.hp": 0.5,
    "train.batch_size": 8,
    "task.val_blocks": 64,
    "train.eval_every": 200,
    "train.eval_qs": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
}
PAPER_RANGE = (1.85, 3.45)  # App. D's hole depth range at R = 4
STAGE_FRACTION = 4  # continued stages train pretrain_steps / 4


def hole_range(n_loops: int) -> tuple[float, float]:
    """App. D's [1.85, 3.45] at R = 4, placed at the same fractions of [1, R] for another R."""
    lo, hi = ((d - 1) / 3 for d in PAPER_RANGE)
    return round(1 + lo * (n_loops - 1), 3), round(1 + hi * (n_loops - 1), 3)


def hole_point(**values: Any) -> dict[str, Any]:
    """A full scan point: the centre with `values`, the continued stages' steps and the
    hole depth range derived."""
    point = {**HOLE_CENTRE, **values}
    point["stage_steps"] = max(20, point["pretrain_steps"] // STAGE_FRACTION)
    point["lo"], point["hi"] = hole_range(point["n_loops"])
    return point


def hole_points(axes: list[str]) -> tuple[dict[str, Any], ...]:
    """The centre, then each axis's values (one axis at a time)."""
    points = [hole_point()]
    for axis in axes:
        for value in HOLE_AXES[axis]:
            points.append(hole_point(**(value if isinstance(value, dict) else {axis: value})))
    return tuple(points)


def holes_scan(common: Common, axes: list[str]) -> Sweep:
    for axis in axes:
        if axis not in HOLE_AXES:
            fail("--axes", ",".join(axes), " | ".join(HOLE_AXES))
    spec = PipelineSpec(
        preset=common.preset,
        stages=ARMS["chase"],
        arms=ARMS,
        overrides={**HOLE_OVERRIDES, **common.overrides},
        stage_overrides=common.stage_overrides,
        searched=HOLE_PARAMS,
        searched_stages=ARMS["chase"],
        scopes=HOLE_SCOPES,
    )
    return Sweep(
        name="scale_scan_holes",
        spec=spec,
        grid={"arm": list(ARMS)},
        points=hole_points(axes),
        metric=VAL_PPL,
        mode="min",
        columns=(VAL_PPL, *SKIP_COLUMNS),
        flags={"arm": "--arms", **{p: "--axes" for p in HOLE_PARAMS}},
        axes=tuple(HOLE_CENTRE),
    )


LOOP_PAIRS = "1x1,1x4,4x1"  # N⊗R, its iso-parameter N⊗1 and its iso-depth NR⊗1
LOOP_HOPS = "1,2,4"  # p = 1 is induction
# phop-debug's model at d 64 for 2,000 steps on 16-token sequences: at d 32 and 1,000 steps
# (the preset) no model learns 3 or more hops and looping does not help (1⊗1 58 %,
# 1⊗4 51 % at p = 2, one seed); here 1⊗4 reaches 82 % against 64 % at p = 2.
LOOP_OVERRIDES = {"task.n": 16, "model.d_model": 64, "train.steps": 2000}


def loops_scan(common: Common, pairs, hops) -> Sweep:
    common = Common(common.preset, {**LOOP_OVERRIDES, **common.overrides}, common.stage_overrides)
    sweep = depth_grid(
        "scale_scan_loops",
        common,
        pairs,
        level=hops,
        level_flag="--hops",
        metric=VAL_ACCURACY,
        mode="max",
        columns=(VAL_ACCURACY, VAL_LOSS),
    )
    return replace(sweep, axes=("p",) if hops else ())


EFFECTS = ("holes", "loops")
SEEDS = "0,1,2"  # the scan's own; sweeps/paper_mini.py reports on others


@dataclass(frozen=True)
class ScanFlags:
    """The scan's own flags: the effect, and each effect's points."""

    effect: str = flag("holes", "holes (cache holes, default) | loops (loop advantage)")
    axes: str = flag(",".join(HOLE_AXES), f"holes: the axes to scan (default all: {','.join(HOLE_AXES)})")
    pairs: str = flag(LOOP_PAIRS, f"loops: NxR pairs (default {LOOP_PAIRS})")
    hops: str = flag(LOOP_HOPS, f"loops: p-hop hop counts p (default {LOOP_HOPS})")


def add_flags(p) -> None:
    p.set_defaults(seeds=SEEDS)
    arguments.add_flags(p, ScanFlags)


def from_args(common: Common, args) -> Sweep:
    flags = flags_of(ScanFlags, args)
    if flags.effect not in EFFECTS:
        fail("--effect", flags.effect, " | ".join(EFFECTS))
    if flags.effect == "holes":
        return holes_scan(common, parse_list("--axes", flags.axes, str, "seq_len,pretrain_steps"))
    if common.preset == "debug":  # the holes scan's default preset is no p-hop preset
        common = Common("phop-debug", common.overrides, common.stage_overrides)
    return loops_scan(
        common, pairs_from(flags.pairs, common, LOOP_PAIRS, LOOP_PAIRS), level_from(flags.hops, "hops", "p")
    )


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], add_flags, from_args))
