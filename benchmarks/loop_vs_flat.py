"""Looped N⊗R against its iso-parameter N⊗1 baseline on a preset, over seeds.

    python benchmarks/loop_vs_flat.py --preset phop-induction-debug --seeds 0 1 2
    python benchmarks/loop_vs_flat.py --preset phop-debug --seeds 0 1 2 [--json out.json]

Both arms train the same steps on the same batches (batches depend on seed and
step only) and are scored on the task's fixed evaluation set; one torch thread.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of, one_of
from looplab.config import apply_overrides, parse_value
from looplab.presets import PRESETS, get_preset
from looplab.training.train import train

SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag); --seeds, several words, is
    added by hand (a flag is one word or repeated)."""

    preset: str = flag("phop-induction-debug", "the task and model", type=one_of(*sorted(PRESETS)), metavar="PRESET")
    seeds: list[int] = field(default_factory=lambda: list(SEEDS))
    json: str | None = flag(None, "write the records here")
    overrides: list[str] = flag(help="KEY=VALUE applied to both arms", positional=True)


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, Options)
    p.add_argument("--seeds", type=at_least(0), nargs="+", default=list(SEEDS), help="training seeds (default 0 1 2)")
    opts = flags_of(Options, p.parse_args())
    torch.set_num_threads(1)

    base = apply_overrides(
        get_preset(opts.preset), {k: parse_value(v) for k, v in (o.split("=", 1) for o in opts.overrides)}
    )
    R = base.model.n_loops
    records = []
    print(f"{opts.preset}: N={base.model.n_layers}, looped R={R} vs R=1, {base.train.steps} steps")
    print("seed  looped  flat    margin  time looped / flat")
    for seed in opts.seeds:
        row = {"seed": seed}
        for arm, loops in (("looped", R), ("flat", 1)):
            cfg = apply_overrides(base, {"model.n_loops": loops, "train.seed": seed})
            with tempfile.TemporaryDirectory() as out:
                t = time.perf_counter()
                result = train(cfg, out, quiet=True)
                row[f"{arm}_time_s"] = time.perf_counter() - t
            row[f"{arm}_accuracy"] = result.eval["accuracy"]
        row["margin"] = row["looped_accuracy"] - row["flat_accuracy"]
        records.append(row)
        print(
            f"{seed:<5d} {row['looped_accuracy']:.4f}  {row['flat_accuracy']:.4f}  {row['margin']:+.4f}  "
            f"{row['looped_time_s']:.1f} s / {row['flat_time_s']:.1f} s",
            flush=True,
        )
    margins = [r["margin"] for r in records]
    spread = statistics.stdev(margins) if len(margins) > 1 else 0.0
    print(f"margin: mean {statistics.mean(margins):+.4f}, std {spread:.4f}, min {min(margins):+.4f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"preset": opts.preset, "config": base.to_dict(), "records": records}, f, indent=2)


if __name__ == "__main__":
    main()
