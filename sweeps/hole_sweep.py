"""CHASE hole sweep (paper §3, App. D): pretrain → Stage-1 once, then CHASE over
hole probability hp × target-depth range [lo, hi] (and ρ), each followed by
Stage-2 and the threshold evaluation (dense and skip over q, forced depths).
`--sampler threshold` sweeps ρ × the threshold range [q_low, q_high] instead.
`--eval-tasks` evaluates every trained checkpoint downstream afterwards (sweeps/evaluate.py).

    python sweeps/hole_sweep.py --dry-run
    python sweeps/hole_sweep.py --hps 0.25,0.5,0.75 --ranges 1.0-4.0,1.85-3.45 --storage-path runs/holes
    python sweeps/hole_sweep.py --sampler threshold --q-ranges 0.2-0.8,0.4-0.6
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from looplab.arguments import flag, flags_of
from looplab.config.paths import field_key
from looplab.tracking import VAL_ACCURACY, VAL_PPL
from sweeps.evaluate import evaluation_of, with_eval_flags, with_evaluation
from sweeps.flags import Common, fail, parse_list, parse_ranges
from sweeps.launch import main
from sweeps.sweep import SKIP_COLUMNS, Sweep
from trainables.evaluation import EvalGrid
from trainables.pipeline import PipelineSpec

HOLE_PARAMS = {
    "hp": field_key(lambda c: c.hole.hp),
    "lo": field_key(lambda c: c.hole.lo),
    "hi": field_key(lambda c: c.hole.hi),
    "rho": field_key(lambda c: c.hole.rho),
    "q_low": field_key(lambda c: c.hole.q_low),
    "q_high": field_key(lambda c: c.hole.q_high),
}
SAMPLERS = ("depth", "threshold")


def hole_sweep(
    common: Common,
    sampler: str,
    rhos: list[float],
    hps: list[float] | None = None,
    ranges: tuple[dict[str, float], ...] = (),
    evaluation: EvalGrid | None = None,
) -> Sweep:
    """sampler depth: ρ × hp × the depth ranges ({lo, hi}); threshold: ρ × the q ranges ({q_low, q_high})."""
    if sampler not in SAMPLERS:
        fail("--sampler", sampler, " | ".join(SAMPLERS))
    overrides = {"model.n_loops": 4, "hole.sampler": sampler, **common.overrides}
    spec = PipelineSpec(
        preset=common.preset,
        stages=("pretrain", "stage1", "chase", "stage2"),
        overrides=overrides,
        stage_overrides=common.stage_overrides,
        searched=HOLE_PARAMS,
        searched_stages=("chase",),
    )
    grid = {"rho": list(rhos)}
    if sampler == "depth":
        grid["hp"] = list(hps or [])
    return with_evaluation(
        Sweep(
            name=f"hole_sweep_{sampler}",
            spec=spec,
            grid=grid,
            points=ranges,
            ranges={"hp": (0.05, 1.0, "linear"), "lo": (1.0, 2.5, "linear"), "hi": (2.5, 4.0, "linear")},
            metric=VAL_PPL,
            mode="min",
            columns=(VAL_PPL, VAL_ACCURACY, *SKIP_COLUMNS),
            flags={
                "rho": "--rhos",
                "hp": "--hps",
                "lo": "--ranges",
                "hi": "--ranges",
                "q_low": "--q-ranges",
                "q_high": "--q-ranges",
                "hole.sampler": "--sampler",
            },
        ),
        evaluation,
    )


@dataclass(frozen=True)
class HoleFlags:
    """The sweep's own flags (beside the downstream evaluation's, sweeps/evaluate.py)."""

    sampler: str = flag("depth", "depth (the default, App. D) | threshold (§3)")
    hps: str = flag("0.25,0.5,0.75", "hole probabilities (depth sampler)")
    ranges: str = flag("1.85-3.45,1.0-4.0", "target depth ranges lo-hi (depth sampler)")
    q_ranges: str = flag("0.2-0.8,0.4-0.6", "threshold ranges q_low-q_high (threshold)")
    rhos: str = flag("1.0", "probability that a minibatch is holed")


add_flags = with_eval_flags(HoleFlags)


def from_args(common: Common, args) -> Sweep:
    flags = flags_of(HoleFlags, args)
    rhos = parse_list("--rhos", flags.rhos)
    if flags.sampler == "depth":
        return hole_sweep(
            common,
            "depth",
            rhos,
            parse_list("--hps", flags.hps),
            parse_ranges("--ranges", flags.ranges, "lo", "hi"),
            evaluation=evaluation_of(args),
        )
    return hole_sweep(
        common,
        flags.sampler,
        rhos,
        ranges=parse_ranges("--q-ranges", flags.q_ranges, "q_low", "q_high"),
        evaluation=evaluation_of(args),
    )


if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0], add_flags, from_args))
