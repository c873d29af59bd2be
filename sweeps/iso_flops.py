"""Iso-parameter / iso-FLOPs N⊗R grids (paper Table 3 for language modelling;
`--task mano|phop` gives the synthetic tables' grids): N⊗R against N⊗1 (same
parameters) and NR⊗1 (same effective depth, same FLOPs), per backbone.

    python sweeps/iso_flops.py --dry-run                          # debug LM, laptop grid
    python sweeps/iso_flops.py --preset paper-140m --archs mamba2,transformer --gpus-per-worker 1
    python sweeps/iso_flops.py --task phop --dry-run
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps import mano, phop  # noqa: E402
from sweeps.common import fail, main  # noqa: E402
from sweeps.depth_grid import add_pair_flags, depth_grid  # noqa: E402

TASKS = {  # task -> (default preset, small pairs, paper pairs, metric, mode)
    "text": ("debug", "1x1,1x4,4x1", "6x1,6x4,12x1,12x2,24x1", "val_ppl", "min"),
    "mano": ("mano-debug", mano.SMALL_PAIRS, mano.PAPER_PAIRS, "val_accuracy", "max"),
    "phop": ("phop-debug", phop.SMALL_PAIRS, phop.PAPER_PAIRS, "val_accuracy", "max"),
}


def task_of(argv: list[str]) -> str:
    """--task picks the defaults of the other flags, so it is read first."""
    if "--task" in argv and argv.index("--task") + 1 < len(argv):
        return argv[argv.index("--task") + 1]
    return next((a.split("=", 1)[1] for a in argv if a.startswith("--task=")), "text")


def make_flags(task: str):
    preset, small, paper, _, _ = TASKS.get(task, TASKS["text"])

    def flags(p) -> None:
        p.add_argument("--task", default="text", help="text | mano | phop (default text)")
        add_pair_flags(p, preset=preset, small_pairs=small, paper_pairs=paper, level=None)
        p.set_defaults(seeds="0")
    return flags


def iso_flops(args):
    if args.task not in TASKS:
        fail("--task", args.task, " | ".join(TASKS))
    _, _, _, metric, mode = TASKS[args.task]
    return depth_grid(f"iso_flops_{args.task}", args, metric=metric, mode=mode,
                      columns=("val_ppl", "val_accuracy") if args.task == "text" else ("val_accuracy", "val_loss"))


if __name__ == "__main__":
    sys.exit(main(iso_flops, __doc__.splitlines()[0], add_flags=make_flags(task_of(sys.argv[1:]))))
