"""p-hop induction (paper Table 2): non-looped baselines, iso-parameter looped
models and iso-FLOPs baselines over hop counts p, with several seeds.

    python sweeps/phop.py --dry-run                       # phop-debug, laptop grid
    python sweeps/phop.py --preset phop-p16 --hops 16,32 --gpus-per-worker 1
"""

from __future__ import annotations

import sys

from sweeps.depth_grid import add_pair_flags, archs_from, depth_grid, level_from, pairs_from
from sweeps.flags import Common
from sweeps.launch import main
from sweeps.plan import Sweep

PAPER_PAIRS = "12x1,1x1,1x6,1x12,2x1,2x3,2x6,3x1,3x2,3x4,4x1,4x3,6x1,6x2"
SMALL_PAIRS = "1x1,1x2,2x1"


def phop(common: Common, pairs, archs=None, hops=None) -> Sweep:
    return depth_grid("phop", common, pairs, archs=archs, level=hops, level_flag="--hops", metric="val_accuracy",
                      mode="max",
                      columns=("val_accuracy", "val_loss"))


def add_flags(p) -> None:
    add_pair_flags(p, preset="phop-debug", small_pairs=SMALL_PAIRS, paper_pairs=PAPER_PAIRS, level=("hops", "p"))


def from_args(common: Common, args) -> Sweep:
    return phop(common, pairs_from(args, common, SMALL_PAIRS, PAPER_PAIRS), archs_from(args),
                level_from(args, "hops", "p"))


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], add_flags, from_args))
