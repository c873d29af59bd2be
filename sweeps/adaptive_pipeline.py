"""The Table 4 pipeline for one backbone: pretrain (loop-4) → Stage-1, then two
arms that share that Stage-1 checkpoint: loop4-Ouro (→ Stage-2) and loop4-CHASE
(→ CHASE → Stage-2); every gated stage ends with the threshold evaluation (dense
and skip over q, forced depths), which analysis/ turns into the frontiers.

    python sweeps/adaptive_pipeline.py --dry-run
    python sweeps/adaptive_pipeline.py --preset local --storage-path runs/table4
    python sweeps/adaptive_pipeline.py --preset paper-140m-hybrid --gpus-per-worker 1 --num-workers 8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.common import Sweep, main, parse_list, parse_sets  # noqa: E402
from trainables.pipeline import PipelineSpec  # noqa: E402

ARMS = {"ouro": ("pretrain", "stage1", "stage2"), "chase": ("pretrain", "stage1", "chase", "stage2")}


def flags(p) -> None:
    p.add_argument("--arms", default="ouro,chase", help="which arms (default ouro,chase)")
    p.add_argument("--hp", type=float, default=0.5, help="CHASE hole probability (App. E: 0.5)")
    p.add_argument("--depth-range", default="1.85-3.45", help="CHASE target depths lo-hi (App. E: 1.85-3.45)")


def adaptive_pipeline(args) -> Sweep:
    from sweeps.hole_sweep import parse_ranges

    (depths,) = parse_ranges("--depth-range", args.depth_range, "lo", "hi")
    overrides = {"model.n_loops": 4, "hole.sampler": "depth", "hole.hp": args.hp,
                 "hole.lo": depths["lo"], "hole.hi": depths["hi"], **parse_sets(args.set)}
    spec = PipelineSpec(preset=args.preset, stages=ARMS["chase"], arms=ARMS, overrides=overrides)
    arms = parse_list("--arms", args.arms, str, "ouro,chase")
    return Sweep(name="adaptive_pipeline", spec=spec, grid={"arm": arms}, metric="val_ppl", mode="min",
                 columns=("val_ppl", "val_accuracy", "skip_q0.4_executed_loops", "skip_q0.4_ppl"))


if __name__ == "__main__":
    sys.exit(main(adaptive_pipeline, __doc__.splitlines()[0], add_flags=flags))
