"""The Table 4 pipeline for one backbone: pretrain (loop-4) → Stage-1, then two
arms that share that Stage-1 checkpoint: loop4-Ouro (→ Stage-2) and loop4-CHASE
(→ CHASE → Stage-2); every gated stage ends with the threshold evaluation (dense
and skip over q, forced depths), which analysis/ turns into the frontiers. With
--eval-tasks the trained checkpoints are then evaluated downstream (Table 4's columns,
Fig. 3; sweeps/evaluate.py).

    python sweeps/adaptive_pipeline.py --dry-run
    python sweeps/adaptive_pipeline.py --preset local --storage-path runs/table4
    python sweeps/adaptive_pipeline.py --preset paper-140m-hybrid --gpus-per-worker 1 --num-workers 8
    python sweeps/adaptive_pipeline.py --preset local --storage-path runs/table4 --eval-tasks paper \
        --eval-data /data/lm_eval --eval-gpus 0      # + the seven tasks on every checkpoint (App. F/G grids)
"""

from __future__ import annotations

import sys

from sweeps.evaluate import add_eval_flags, grid_from_args, with_evaluation
from sweeps.flags import Common, fail, parse_list, parse_ranges
from sweeps.launch import main
from sweeps.plan import Sweep
from trainables.evaluation import EvalGrid
from trainables.pipeline import PipelineSpec

ARMS = {"ouro": ("pretrain", "stage1", "stage2"), "chase": ("pretrain", "stage1", "chase", "stage2")}


def adaptive_pipeline(common: Common, arms: list[str], hp: float = 0.5, lo: float = 1.85, hi: float = 3.45,
                      evaluation: EvalGrid | None = None) -> Sweep:
    """The arms (ouro, chase) sharing pretrain → Stage-1; CHASE with App. E's depth holes;
    evaluation: the downstream grid run on every trained checkpoint."""
    for arm in arms:
        if arm not in ARMS:
            fail("--arms", ",".join(arms), " | ".join(ARMS))
    overrides = {"model.n_loops": 4, "hole.sampler": "depth", "hole.hp": hp, "hole.lo": lo, "hole.hi": hi,
                 **common.overrides}
    spec = PipelineSpec(preset=common.preset, stages=ARMS["chase"], arms=ARMS, overrides=overrides,
                        stage_overrides=common.stage_overrides)
    return with_evaluation(Sweep(name="adaptive_pipeline", spec=spec, grid={"arm": list(arms)}, metric="val_ppl",
                                 mode="min",
                                 columns=("val_ppl", "val_accuracy", "skip_q0.4_executed_loops", "skip_q0.4_ppl"),
                                 flags={"arm": "--arms", "hole.hp": "--hp", "hole.lo": "--depth-range",
                                        "hole.hi": "--depth-range"}),
                           evaluation)


def add_flags(p) -> None:
    p.add_argument("--arms", default="ouro,chase", help="which arms (default ouro,chase)")
    p.add_argument("--hp", type=float, default=0.5, help="CHASE hole probability (App. E: 0.5)")
    p.add_argument("--depth-range", default="1.85-3.45", help="CHASE target depths lo-hi (App. E: 1.85-3.45)")
    add_eval_flags(p)


def from_args(common: Common, args) -> Sweep:
    ranges = parse_ranges("--depth-range", args.depth_range, "lo", "hi")
    if len(ranges) != 1:
        fail("--depth-range", args.depth_range, "one LO-HI range, e.g. 1.85-3.45")
    return adaptive_pipeline(common, parse_list("--arms", args.arms, str, "ouro,chase"), args.hp, **ranges[0],
                             evaluation=grid_from_args(args))


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], add_flags, from_args))
