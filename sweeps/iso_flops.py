"""Iso-parameter / iso-FLOPs N⊗R grids (paper Table 3 for language modelling;
`--task mano|phop` gives the synthetic tables' grids): N⊗R against N⊗1 (same
parameters) and NR⊗1 (same effective depth, same FLOPs), per backbone. With
`--eval-tasks paper` each language model is then evaluated downstream at forced depths
1..R (Table 3's benchmark columns at R, App. E below it; sweeps/evaluate.py).

    python sweeps/iso_flops.py --dry-run                          # debug LM, laptop grid
    python sweeps/iso_flops.py --preset paper-140m --archs mamba2,transformer --gpus-per-worker 1
    python sweeps/iso_flops.py --task phop --dry-run
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from looplab import arguments
from looplab.arguments import flag, flags_of
from looplab.tracking import VAL_ACCURACY, VAL_LOSS, VAL_PPL
from sweeps import mano, phop
from sweeps.depth_grid import PairFlags, add_pair_flags, archs_from, depth_grid, pairs_from
from sweeps.evaluate import add_eval_flags, evaluation_of, with_evaluation
from sweeps.flags import Common, fail
from sweeps.launch import main
from sweeps.sweep import Sweep
from trainables.evaluation import EvalGrid

TASKS = {  # task -> (default preset, small pairs, paper pairs, metric, mode, summary columns)
    "text": ("debug", "1x1,1x4,4x1", "6x1,6x4,12x1,12x2,24x1", VAL_PPL, "min", (VAL_PPL, VAL_ACCURACY)),
    "mano": ("mano-debug", mano.SMALL_PAIRS, mano.PAPER_PAIRS, VAL_ACCURACY, "max", (VAL_ACCURACY, VAL_LOSS)),
    "phop": ("phop-debug", phop.SMALL_PAIRS, phop.PAPER_PAIRS, VAL_ACCURACY, "max", (VAL_ACCURACY, VAL_LOSS)),
}


def iso_flops(common: Common, task: str, pairs, archs=None, evaluation: EvalGrid | None = None) -> Sweep:
    if task not in TASKS:
        fail("--task", task, " | ".join(TASKS))
    *_, metric, mode, columns = TASKS[task]
    return with_evaluation(
        depth_grid(f"iso_flops_{task}", common, pairs, archs=archs, metric=metric, mode=mode, columns=columns),
        evaluation,
    )


def task_of(argv: list[str]) -> str:
    """--task picks the defaults of the other flags, so it is read first."""
    if "--task" in argv and argv.index("--task") + 1 < len(argv):
        return argv[argv.index("--task") + 1]
    return next((a.split("=", 1)[1] for a in argv if a.startswith("--task=")), "text")


@dataclass(frozen=True)
class IsoFlags:
    """The sweep's --task (read first: it picks the other flags' defaults, task_of)."""

    task: str = flag("text", "text | mano | phop")


def flags_for(task: str):
    preset, small, paper, *_ = TASKS.get(task, TASKS["text"])

    def add_flags(p) -> None:
        arguments.add_flags(p, IsoFlags)
        add_pair_flags(p, preset=preset, small_pairs=small, paper_pairs=paper, level=None)
        add_eval_flags(p)
        p.set_defaults(seeds=None)  # the preset's own seed (3407 for the paper's language models)

    return add_flags


def from_args(common: Common, args) -> Sweep:
    task, pairs = flags_of(IsoFlags, args).task, flags_of(PairFlags, args)
    if task not in TASKS:
        fail("--task", task, " | ".join(TASKS))
    _, small, paper, *_ = TASKS[task]
    return iso_flops(
        common,
        task,
        pairs_from(pairs.pairs, common, small, paper),
        archs_from(pairs.archs),
        evaluation=evaluation_of(args),
    )


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], flags_for(task_of(sys.argv[1:])), from_args))
