"""The Table 4 pipeline for one backbone: pretrain (loop-4) → Stage-1, then two
arms that share that Stage-1 checkpoint: loop4-Ouro (→ Stage-2) and loop4-CHASE
(→ CHASE → Stage-2); every gated stage ends with the threshold evaluation (dense
and skip over q, forced depths), which analysis/ turns into the frontiers. With
--eval-tasks the trained checkpoints are then evaluated downstream (Table 4's columns,
Fig. 3; sweeps/evaluate.py).

With --baselines the same sweep also pre-trains the ungated rows of the preset's Table 4
blocks (looplab/presets.TABLE4): N⊗1 ("baseline"), loop2 at 140M, loop4 (the gated arms'
own pre-training, by key), and at 140M the LLaMA-2 baseline and loop4 (the paper's
Table 4 has no 370M LLaMA-2 block). They are
iso_flops.py's trials (arm "baseline" = its one pretrain stage, params n_layers /
n_loops / arch as its --pairs / --archs set them), so their stage keys are the ones
`iso_flops.py --preset paper-140m --pairs 24x1,24x2,24x4 --archs mamba2,transformer` trains:
on one storage path nothing is trained twice, whichever command ran first. The gated
rows (loop4-Ouro, loop4-CHASE) come from the arms; analysis/tables.table4 lays every
row out in the paper's order.

    python sweeps/adaptive_pipeline.py --dry-run
    python sweeps/adaptive_pipeline.py --preset local --storage-path runs/table4
    python sweeps/adaptive_pipeline.py --preset paper-140m-hybrid --gpus-per-worker 1 --num-workers 8
    python sweeps/adaptive_pipeline.py --preset local --storage-path runs/table4 --eval-tasks paper \
        --eval-data /data/lm_eval --eval-gpus 0      # + the seven tasks on every checkpoint (App. E/F grids)
    python sweeps/adaptive_pipeline.py --preset paper-140m --baselines --num-workers 8 --gpus-per-worker 1 \
        --gpu-memory 80 --address auto --dry-run     # + Table 4's ungated rows of the 140M blocks
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from looplab.arguments import flag, flags_of
from looplab.presets import TABLE4, get_preset, table4_loops
from looplab.stages import ARMS
from looplab.tracking import VAL_ACCURACY, VAL_PPL
from sweeps.depth_grid import ARCH_PARAMS, NR_PARAMS
from sweeps.evaluate import evaluation_of, with_eval_flags, with_evaluation
from sweeps.flags import Common, fail, parse_list, parse_ranges
from sweeps.launch import main
from sweeps.sweep import SKIP_COLUMNS, Sweep
from trainables.evaluation import EvalGrid
from trainables.pipeline import PipelineSpec

BASELINE = "baseline"  # the arm of the ungated rows: iso_flops.py's single pretrain stage
BASELINE_PARAMS = {**NR_PARAMS, **ARCH_PARAMS}  # iso_flops.py's searched params (depth_grid with --archs)


def baseline_points(preset: str) -> list[dict]:
    """The ungated Table 4 rows the sweep on `preset` trains, as iso_flops.py's params."""
    points = []
    for group in TABLE4:
        if group.trained_by != preset:
            continue
        model = get_preset(group.preset).model
        points += [
            {"arm": BASELINE, "n_layers": model.n_layers, "n_loops": loops, "arch": model.arch}
            for loops in map(table4_loops, group.rows)
            if loops is not None
        ]
    return points


def adaptive_pipeline(
    common: Common,
    arms: list[str],
    hp: float = 0.5,
    lo: float = 1.85,
    hi: float = 3.45,
    evaluation: EvalGrid | None = None,
    baselines: bool = False,
) -> Sweep:
    """The arms (ouro, chase) sharing pretrain → Stage-1; CHASE with App. D's depth holes;
    evaluation: the downstream grid run on every trained checkpoint; baselines: also
    Table 4's ungated rows (module docstring)."""
    for arm in arms:
        if arm not in ARMS:
            fail("--arms", ",".join(arms), " | ".join(ARMS))
    overrides = {
        "model.n_loops": 4,
        "hole.sampler": "depth",
        "hole.hp": hp,
        "hole.lo": lo,
        "hole.hi": hi,
        **common.overrides,
    }
    extra = baseline_points(common.preset) if baselines else []
    if baselines and not extra:
        fail("--preset", common.preset, "with --baselines: " + " | ".join(sorted({g.trained_by for g in TABLE4})))
    # The baselines' params set the model in their one (pretrain) stage, over the sweep-wide
    # n_loops 4; the gated arms' points carry none, so their trials and keys stay as without.
    arms_of = {**ARMS, BASELINE: ("pretrain",)} if extra else ARMS
    spec = PipelineSpec(
        preset=common.preset,
        stages=ARMS["chase"],
        arms=arms_of,
        overrides=overrides,
        stage_overrides=common.stage_overrides,
        searched=BASELINE_PARAMS if extra else {},
    )
    grid = {} if extra else {"arm": list(arms)}
    points = tuple([{"arm": a} for a in arms] + extra) if extra else ()
    return with_evaluation(
        Sweep(
            name="adaptive_pipeline",
            spec=spec,
            grid=grid,
            points=points,
            metric=VAL_PPL,
            mode="min",
            columns=(VAL_PPL, VAL_ACCURACY, *SKIP_COLUMNS),
            flags={
                "arm": "--arms",
                **dict.fromkeys(BASELINE_PARAMS, "--baselines"),
                "hole.hp": "--hp",
                "hole.lo": "--depth-range",
                "hole.hi": "--depth-range",
            },
        ),
        evaluation,
    )


@dataclass(frozen=True)
class PipelineFlags:
    """The sweep's own flags (beside the downstream evaluation's, sweeps/evaluate.py)."""

    arms: str = flag("ouro,chase", "which arms (default ouro,chase)")
    hp: float = flag(0.5, "CHASE hole probability (default 0.5, App. D's)")
    depth_range: str = flag("1.85-3.45", "CHASE target depths lo-hi (default 1.85-3.45, App. D's)")
    baselines: bool = flag(
        False,
        "also pre-train Table 4's ungated rows of this preset's blocks (N⊗1, loop2, LLaMA-2 "
        "at 140M), with iso_flops.py's stage keys",
    )


add_flags = with_eval_flags(PipelineFlags)


def from_args(common: Common, args) -> Sweep:
    flags = flags_of(PipelineFlags, args)
    ranges = parse_ranges("--depth-range", flags.depth_range, "lo", "hi")
    if len(ranges) != 1:
        fail("--depth-range", flags.depth_range, "one LO-HI range, e.g. 1.85-3.45")
    return adaptive_pipeline(
        common,
        parse_list("--arms", flags.arms, str, "ouro,chase"),
        flags.hp,
        **ranges[0],
        evaluation=evaluation_of(args),
        baselines=flags.baselines,
    )


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], add_flags, from_args))
