"""Mano (modular-arithmetic manipulation, paper Table 1): looped vs non-looped
Mamba-2 at matched parameters (N⊗R vs N⊗1) and matched effective depth (vs NR⊗1),
over difficulty levels L, with several seeds (best-of-3 and mean ± std in analysis/).

    python sweeps/mano.py --dry-run                       # mano-debug, laptop grid
    python sweeps/mano.py --preset mano-L24 --levels 10,16,24 --num-workers 8 --gpus-per-worker 1
"""

from __future__ import annotations

import sys

from sweeps.depth_grid import add_pair_flags, archs_from, depth_grid, level_from, pairs_from
from sweeps.flags import Common
from sweeps.launch import main
from sweeps.plan import Sweep

PAPER_PAIRS = "24x1,4x1,4x6,6x1,6x4,12x1,12x2"
SMALL_PAIRS = "1x1,1x4,4x1"


def mano(common: Common, pairs, archs=None, levels=None) -> Sweep:
    return depth_grid("mano", common, pairs, archs=archs, level=levels, level_flag="--levels", metric="val_accuracy",
                      mode="max",
                      columns=("val_accuracy", "val_loss"))


def add_flags(p) -> None:
    add_pair_flags(p, preset="mano-debug", small_pairs=SMALL_PAIRS, paper_pairs=PAPER_PAIRS, level=("levels", "L"))


def from_args(common: Common, args) -> Sweep:
    return mano(common, pairs_from(args, common, SMALL_PAIRS, PAPER_PAIRS), archs_from(args),
                level_from(args, "levels", "L"))


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], add_flags, from_args))
