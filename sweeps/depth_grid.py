"""What the N⊗R sweeps (mano.py, phop.py, iso_flops.py) share: a pre-training grid
over paired (N, R) values, optionally crossed with task levels, with the paper's
pairs on the paper presets and a laptop-sized grid on the small ones.

An N⊗R model is iso-parameter with N⊗1 and iso-FLOPs with NR⊗1 (paper §3), so a
grid holding all three answers both comparisons; analysis/ groups them.
"""

from __future__ import annotations

from typing import Any

from looplab.presets import get_preset
from sweeps.common import Sweep, parse_list, parse_pairs, parse_sets
from trainables.pipeline import PipelineSpec

NR_PARAMS = {"n_layers": "model.n_layers", "n_loops": "model.n_loops"}


def add_pair_flags(p, *, preset: str, small_pairs: str, paper_pairs: str, level: tuple[str, str] | None) -> None:
    """--pairs (and --levels for the task's difficulty field), with this sweep's defaults."""
    p.set_defaults(preset=preset, seeds="0,1,2")  # several seeds: best-of-3 and mean ± std
    p.add_argument("--pairs", default="",
                   help=f"NxR pairs (default: {paper_pairs} on paper presets, {small_pairs} otherwise)")
    p.add_argument("--archs", default="", help="backbones to cross with the pairs, e.g. mamba2,transformer "
                                               "(default: the preset's)")
    if level is not None:
        flag, field = level
        p.add_argument(f"--{flag}", default="", help=f"values of task.{field} (default: the preset's)")
    p.set_defaults(_small_pairs=small_pairs, _paper_pairs=paper_pairs, _level=level)


def is_paper_preset(name: str) -> bool:
    """The paper-scale presets (long runs on GPUs), whose grids are the paper's tables."""
    cfg = get_preset(name)
    return cfg.train.steps >= 10_000


def depth_grid(name: str, args, *, metric: str, mode: str, columns: tuple[str, ...]) -> Sweep:
    paper = is_paper_preset(args.preset) if args.preset else False
    pairs = parse_pairs("--pairs", args.pairs or (args._paper_pairs if paper else args._small_pairs))
    grid: dict[str, list[Any]] = {}
    searched = dict(NR_PARAMS)
    if args.archs:
        grid["arch"] = parse_list("--archs", args.archs, str, "mamba2,transformer")
        searched["arch"] = "model.arch"
    if args._level is not None:
        flag, field = args._level
        text = getattr(args, flag.replace("-", "_"))
        if text:
            grid[field] = parse_list(f"--{flag}", text, int, "10,16,24")
            searched[field] = f"task.{field}"
    spec = PipelineSpec(preset=args.preset, stages=("pretrain",), overrides=parse_sets(args.set),
                        searched=searched)
    return Sweep(name=name, spec=spec, grid=grid, points=pairs, metric=metric, mode=mode, columns=columns)
