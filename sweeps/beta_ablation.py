"""Stage-1 entropy coefficient β ablation (paper App. E): one loop-4 (R = 4) model
pre-trained once, then Stage-1 from that shared checkpoint for each β, logging the
exit entropy and expected exit step during training.

    python sweeps/beta_ablation.py --preset debug --dry-run
    python sweeps/beta_ablation.py --preset debug --storage-path runs/beta
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.common import Sweep, main, parse_sets  # noqa: E402
from trainables.pipeline import PipelineSpec  # noqa: E402

BETAS = [0.05, 0.1, 0.25, 0.5, 1.0]


def add_flags(argv: list[str] | None) -> tuple[list[float], list[str] | None]:
    """--betas is this sweep's own flag; the rest are common."""
    argv = list(sys.argv[1:] if argv is None else argv)
    betas = BETAS
    if "--betas" in argv:
        i = argv.index("--betas")
        text = argv[i + 1] if i + 1 < len(argv) else ""
        betas = [float(b) for b in text.split(",") if b.strip()]
        del argv[i:i + 2]
    return betas, argv


def beta_ablation(args, betas: list[float]) -> Sweep:
    overrides = {"model.n_loops": 4, **parse_sets(args.set)}  # loop-4, as in App. E
    spec = PipelineSpec(preset=args.preset, stages=("pretrain", "stage1"), overrides=overrides,
                        searched={"beta": "exit.beta"}, searched_stages=("stage1",))
    return Sweep(name="beta_ablation", spec=spec, grid={"beta": betas}, ranges={"beta": (0.01, 2.0, "log")},
                 metric="val_ppl", mode="min",
                 columns=("val_ppl", "val_accuracy", "exit_entropy", "expected_exit_step"))


if __name__ == "__main__":
    try:
        betas, rest = add_flags(None)
    except ValueError:
        print("error: --betas is invalid; allowed: comma-separated floats >= 0, e.g. 0.1,0.5", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(lambda args: beta_ablation(args, betas), __doc__.splitlines()[0], rest))
