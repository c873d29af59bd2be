"""What the N⊗R sweeps (mano.py, phop.py, iso_flops.py) share: a pre-training grid
over paired (N, R) values, optionally crossed with backbones and task levels, with
the paper's pairs on the paper presets and a laptop-sized grid on the small ones.
A synthetic task's sweep (mano.py, phop.py) is only data, a `DepthTask`; its flags,
its factory and its entry point are built from it here.

An N⊗R model is iso-parameter with N⊗1 and iso-FLOPs with NR⊗1 (paper §3), so a
grid holding all three answers both comparisons; analysis/ groups them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looplab.arguments import add_flags, flag, flags_of
from looplab.config.paths import checked_key, field_key
from looplab.presets import get_preset
from looplab.tracking import VAL_ACCURACY, VAL_LOSS
from sweeps.flags import Common, parse_list, parse_pairs
from sweeps.launch import main
from sweeps.sweep import Sweep
from trainables.pipeline import PipelineSpec

NR_PARAMS = {"n_layers": field_key(lambda c: c.model.n_layers), "n_loops": field_key(lambda c: c.model.n_loops)}
ARCH_PARAMS = {"arch": field_key(lambda c: c.model.arch)}  # with --archs


def is_paper_preset(name: str) -> bool:
    """The paper-scale presets (long runs on GPUs), whose grids are the paper's tables."""
    return get_preset(name).train.steps >= 10_000


def depth_grid(
    name: str,
    common: Common,
    pairs: tuple[dict[str, int], ...],
    *,
    archs: list[str] | None = None,
    level: tuple[str, list[int]] | None = None,
    level_flag: str = "",
    metric: str,
    mode: str,
    columns: tuple[str, ...],
) -> Sweep:
    """Pre-training at each N⊗R pair, × each backbone in archs, × each value of the
    task field level = (field, values), e.g. ("L", [10, 16, 24])."""
    grid: dict[str, list[Any]] = {}
    searched = dict(NR_PARAMS)
    if archs:
        grid["arch"] = list(archs)
        searched.update(ARCH_PARAMS)
    if level is not None:
        field, values = level
        grid[field] = list(values)
        searched[field] = checked_key(f"task.{field}", "--levels")  # a field of the task kind chosen at run time
    spec = PipelineSpec(
        preset=common.preset,
        stages=("pretrain",),
        overrides=common.overrides,
        stage_overrides=common.stage_overrides,
        searched=searched,
    )
    flags = {"n_layers": "--pairs", "n_loops": "--pairs", "arch": "--archs"}
    if level is not None:
        flags[level[0]] = level_flag or f"--{level[0]}"
    return Sweep(name=name, spec=spec, grid=grid, points=pairs, metric=metric, mode=mode, columns=columns, flags=flags)


@dataclass(frozen=True)
class PairFlags:
    """An N⊗R sweep's own flags, each "" for its default: --pairs (the sweep's pairs),
    --archs (the preset's backbone) and its task's level flag (--levels for Mano, --hops
    for p-hop; the preset's value), if it has one. The help of --pairs and the level
    flag's name are the sweep's: pair_flags declares them."""

    pairs: str = flag("", "NxR pairs (default: the sweep's)")
    archs: str = flag("", "backbones to cross with the pairs, e.g. mamba2,transformer (default: the preset's)")
    level: str = ""  # the level flag's values (a flag where pair_flags names it)


def pair_flags(small_pairs: str, paper_pairs: str, level: tuple[str, str] | None = None) -> type[PairFlags]:
    """PairFlags whose --pairs help says this sweep's pairs, with the level flag
    level = (flag, task field), e.g. ("levels", "L") for --levels → task.L."""
    pairs_help = f"NxR pairs (default: {paper_pairs} on paper presets, {small_pairs} otherwise)"
    if level is None:

        @dataclass(frozen=True)
        class Pairs(PairFlags):
            pairs: str = flag("", pairs_help)

        return Pairs
    name, field = level

    @dataclass(frozen=True)
    class LevelPairs(PairFlags):
        pairs: str = flag("", pairs_help)
        level: str = flag("", f"values of task.{field} (default: the preset's)", name=f"--{name}", metavar=name.upper())

    return LevelPairs


def add_pair_flags(p, *, preset: str, small_pairs: str, paper_pairs: str, level: tuple[str, str] | None) -> None:
    """--pairs, --archs (and --<level flag> for the task's difficulty field), with this sweep's defaults."""
    p.set_defaults(preset=preset, seeds="0,1,2")  # several seeds: best-of-3 and mean ± std
    add_flags(p, pair_flags(small_pairs, paper_pairs, level))


def pairs_from(text: str, common: Common, small_pairs: str, paper_pairs: str) -> tuple[dict[str, int], ...]:
    """--pairs, else the sweep's pairs for the preset (the paper's on paper presets)."""
    default = paper_pairs if is_paper_preset(common.preset) else small_pairs
    return parse_pairs("--pairs", text or default)


def archs_from(text: str) -> list[str] | None:
    return parse_list("--archs", text, str, "mamba2,transformer") if text else None


def level_from(text: str, flag: str, field: str) -> tuple[str, list[int]] | None:
    """A level flag's values (--hops 1,2,4 for task.p: ("p", [1, 2, 4])), None without."""
    return (field, parse_list(f"--{flag}", text, int, "10,16,24")) if text else None


@dataclass(frozen=True)
class DepthTask:
    """A synthetic task's N⊗R sweep as data (paper Tables 1-2): looped vs non-looped
    at matched parameters and matched depth, over the task's difficulty levels, with
    several seeds. The level flag sets one task field, e.g. --levels → task.L."""

    name: str  # the sweep's name (its MLflow experiment's too)
    preset: str  # default preset: a laptop-sized one
    small_pairs: str  # N⊗R pairs on the small presets
    paper_pairs: str  # the paper's pairs, on the paper presets
    level_flag: str  # e.g. "levels" for --levels
    level_field: str  # the task field it sets, e.g. "L"
    metric: str = VAL_ACCURACY
    mode: str = "max"
    columns: tuple[str, ...] = (VAL_ACCURACY, VAL_LOSS)

    def sweep(
        self,
        common: Common,
        pairs: tuple[dict[str, int], ...],
        archs: list[str] | None = None,
        levels: tuple[str, list[int]] | None = None,
    ) -> Sweep:
        return depth_grid(
            self.name,
            common,
            pairs,
            archs=archs,
            level=levels,
            level_flag=f"--{self.level_flag}",
            metric=self.metric,
            mode=self.mode,
            columns=self.columns,
        )

    def add_flags(self, p) -> None:
        add_pair_flags(
            p,
            preset=self.preset,
            small_pairs=self.small_pairs,
            paper_pairs=self.paper_pairs,
            level=(self.level_flag, self.level_field),
        )

    def from_args(self, common: Common, args) -> Sweep:
        flags = flags_of(PairFlags, args)
        return self.sweep(
            common,
            pairs_from(flags.pairs, common, self.small_pairs, self.paper_pairs),
            archs_from(flags.archs),
            level_from(flags.level, self.level_flag, self.level_field),
        )


def run(task: DepthTask, doc: str) -> int:
    """A task script's entry point; doc is its docstring, whose first line is --help's description."""
    return main(doc.splitlines()[0], task.add_flags, task.from_args)
