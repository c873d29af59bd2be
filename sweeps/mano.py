"""Mano (modular-arithmetic manipulation, paper Table 1): looped vs non-looped
Mamba-2 at matched parameters (N⊗R vs N⊗1) and matched effective depth (vs NR⊗1),
over difficulty levels L, with several seeds (best-of-3 and mean ± std in analysis/).

    python sweeps/mano.py --dry-run                       # mano-debug, laptop grid
    python sweeps/mano.py --preset mano-L24 --levels 10,16,24 --num-workers 8 --gpus-per-worker 1
"""

from __future__ import annotations

import sys

from sweeps.depth_grid import DepthTask, run

MANO = DepthTask(
    name="mano",
    preset="mano-debug",
    small_pairs="1x1,1x4,4x1",
    paper_pairs="24x1,4x1,4x6,6x1,6x4,12x1,12x2",
    level_flag="levels",
    level_field="L",
)

# What other modules read: iso_flops.py's --task mano the pairs, the tests the flags and factory.
SMALL_PAIRS, PAPER_PAIRS = MANO.small_pairs, MANO.paper_pairs
add_flags, from_args = MANO.add_flags, MANO.from_args

if __name__ == "__main__":
    sys.exit(run(MANO, __doc__))
