"""p-hop induction (paper Table 2): non-looped baselines, iso-parameter looped
models and iso-FLOPs baselines over hop counts p, with several seeds.

    python sweeps/phop.py --dry-run                       # phop-debug, laptop grid
    python sweeps/phop.py --preset phop-p16 --hops 16,32 --gpus-per-worker 1
"""

from __future__ import annotations

import sys

from sweeps.depth_grid import DepthTask, run

PHOP = DepthTask(
    name="phop",
    preset="phop-debug",
    small_pairs="1x1,1x2,2x1",
    paper_pairs="12x1,1x1,1x6,1x12,2x1,2x3,2x6,3x1,3x2,3x4,4x1,4x3,6x1,6x2",
    level_flag="hops",
    level_field="p",
)

# What other modules read: iso_flops.py's --task phop the pairs, the tests the flags and factory.
SMALL_PAIRS, PAPER_PAIRS = PHOP.small_pairs, PHOP.paper_pairs
add_flags, from_args = PHOP.add_flags, PHOP.from_args

if __name__ == "__main__":
    sys.exit(run(PHOP, __doc__))
