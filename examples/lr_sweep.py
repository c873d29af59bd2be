"""Stage-1's learning rate, swept over one shared pre-training: the smallest complete
sweep, as docs/sweeps.md ("Write your own sweep") walks through it.

    python examples/lr_sweep.py --preset debug --dry-run
    python examples/lr_sweep.py --preset debug --lrs 1e-4,3e-4,1e-3 --storage-path runs/lr
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from looplab.arguments import add_flags, flag, flags_of
from looplab.config.paths import field_key
from looplab.tracking import EXIT_ENTROPY, VAL_ACCURACY, VAL_PPL
from sweeps.flags import Common, parse_list
from sweeps.launch import main
from sweeps.sweep import Sweep
from trainables.pipeline import PipelineSpec


@dataclass(frozen=True)
class LrFlags:
    """This sweep's own flags, beside the common ones (--preset, --set, --seeds, ...)."""

    lrs: str = flag("1e-4,3e-4,1e-3", "Stage-1 learning rates")


def lr_sweep(common: Common, lrs: list[float]) -> Sweep:
    spec = PipelineSpec(
        preset=common.preset,
        stages=("pretrain", "stage1"),  # Stage-1 continues the pre-training's checkpoint
        overrides=common.overrides,  # --set: every stage
        stage_overrides=common.stage_overrides_over({"stage1": {"train.steps": 40}}),
        searched={"lr": field_key(lambda c: c.train.lr)},  # the param "lr" sets train.lr ...
        searched_stages=("stage1",),  # ... in Stage-1 only: every trial shares one pre-training
    )
    return Sweep(
        name="lr_sweep",
        spec=spec,
        grid={"lr": lrs},  # --search grid: one trial per value (and per seed)
        ranges={"lr": (1e-5, 1e-2, "log")},  # --search optuna: where it samples
        metric=VAL_PPL,
        mode="min",
        columns=(VAL_PPL, VAL_ACCURACY, EXIT_ENTROPY),  # the summary table
        flags={"lr": "--lrs"},  # a bad value is said as the flag, not the field
    )


def from_args(common: Common, args) -> Sweep:
    return lr_sweep(common, parse_list("--lrs", flags_of(LrFlags, args).lrs))


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], lambda parser: add_flags(parser, LrFlags), from_args))
