"""p-hop induction (paper Table 2): non-looped baselines, iso-parameter looped
models and iso-FLOPs baselines over hop counts p, with several seeds.

    python sweeps/phop.py --dry-run                       # phop-debug, laptop grid
    python sweeps/phop.py --preset phop-p16 --hops 16,32 --gpus-per-worker 1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.common import main  # noqa: E402
from sweeps.depth_grid import add_pair_flags, depth_grid  # noqa: E402

PAPER_PAIRS = "12x1,1x1,1x6,1x12,2x1,2x3,2x6,3x1,3x2,3x4,4x1,4x3,6x1,6x2"
SMALL_PAIRS = "1x1,1x2,2x1"


def flags(p) -> None:
    add_pair_flags(p, preset="phop-debug", small_pairs=SMALL_PAIRS, paper_pairs=PAPER_PAIRS, level=("hops", "p"))


def phop(args):
    return depth_grid("phop", args, metric="val_accuracy", mode="max", columns=("val_accuracy", "val_loss"))


if __name__ == "__main__":
    sys.exit(main(phop, __doc__.splitlines()[0], add_flags=flags))
