"""CHASE hole sweep (paper §3, App. E): pretrain → Stage-1 once, then CHASE over
hole probability hp × target-depth range [lo, hi] (and ρ), each followed by
Stage-2 and the threshold evaluation (dense and skip over q, forced depths).
`--sampler threshold` sweeps ρ × the threshold range [q_low, q_high] instead.

    python sweeps/hole_sweep.py --dry-run
    python sweeps/hole_sweep.py --hps 0.25,0.5,0.75 --ranges 1.0-4.0,1.85-3.45 --storage-path runs/holes
    python sweeps/hole_sweep.py --sampler threshold --q-ranges 0.2-0.8,0.4-0.6
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.common import Sweep, fail, main, parse_list, parse_sets  # noqa: E402
from trainables.pipeline import PipelineSpec  # noqa: E402

HOLE_PARAMS = {"hp": "hole.hp", "lo": "hole.lo", "hi": "hole.hi", "rho": "hole.rho",
               "q_low": "hole.q_low", "q_high": "hole.q_high"}


def flags(p) -> None:
    p.add_argument("--sampler", default="depth", help="depth (App. E) | threshold (§3)")
    p.add_argument("--hps", default="0.25,0.5,0.75", help="hole probabilities (depth sampler)")
    p.add_argument("--ranges", default="1.85-3.45,1.0-4.0", help="target depth ranges lo-hi (depth sampler)")
    p.add_argument("--q-ranges", default="0.2-0.8,0.4-0.6", help="threshold ranges q_low-q_high (threshold)")
    p.add_argument("--rhos", default="1.0", help="probability that a minibatch is holed")


def parse_ranges(flag: str, text: str, low: str, high: str) -> tuple[dict[str, float], ...]:
    out = []
    for item in text.split(","):
        a, dash, b = item.strip().partition("-")
        try:
            out.append({low: float(a), high: float(b)})
        except ValueError:
            fail(flag, text, "comma-separated LO-HI ranges, e.g. 1.85-3.45,1.0-4.0")
        if not dash:
            fail(flag, text, "comma-separated LO-HI ranges, e.g. 1.85-3.45,1.0-4.0")
    return tuple(out)


def hole_sweep(args) -> Sweep:
    if args.sampler not in ("depth", "threshold"):
        fail("--sampler", args.sampler, "depth | threshold")
    overrides = {"model.n_loops": 4, "hole.sampler": args.sampler, **parse_sets(args.set)}
    spec = PipelineSpec(preset=args.preset, stages=("pretrain", "stage1", "chase", "stage2"),
                        overrides=overrides, searched=HOLE_PARAMS, searched_stages=("chase",))
    grid = {"rho": parse_list("--rhos", args.rhos)}
    if args.sampler == "depth":
        grid["hp"] = parse_list("--hps", args.hps)
        points = parse_ranges("--ranges", args.ranges, "lo", "hi")
    else:
        points = parse_ranges("--q-ranges", args.q_ranges, "q_low", "q_high")
    return Sweep(name=f"hole_sweep_{args.sampler}", spec=spec, grid=grid, points=points,
                 ranges={"hp": (0.05, 1.0, "linear"), "lo": (1.0, 2.5, "linear"), "hi": (2.5, 4.0, "linear")},
                 metric="val_ppl", mode="min",
                 columns=("val_ppl", "val_accuracy", "skip_q0.4_executed_loops", "skip_q0.4_ppl"))


if __name__ == "__main__":
    sys.exit(main(hole_sweep, __doc__.splitlines()[0], add_flags=flags))
