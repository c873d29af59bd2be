"""C3-growth, preregistered: does stock Ouro's skip penalty grow with training faster
than CHASE's? The scale scan's own protocol (sweeps/protocol.C3_GROWTH), too long for the
miniature's 30 minutes.

    python sweeps/c3_growth.py --dry-run     # the declaration, its digest and power, the plan and its time
    python sweeps/c3_growth.py               # its declared seeds; STORAGE runs/c3-growth

The scale scan found Ouro's perplexity increase under skip growing by +4.3 points per
doubling of pre-training while CHASE's grew by +2.5 and the paired gap by +1.8 [+0.8,
+2.8] (docs/scale_scan.md, seeds 0-2): a hypothesis, found by looking, on the road to
the paper's effect sizes (Fig. 2: Ouro up to +4788 %, CHASE +3-4 % at 140M-370M). The
protocol declares, before its seeds train: the scan's pre-training axis at its centre
(debug's byte-level 1⊗4 Mamba-2, context 512; each continued stage a quarter of the
pre-training; every continued stage on fresh data), the steps 200, 400, 800 and 1,600,
the measure (per seed, the least-squares slope of Ouro's minus CHASE's perplexity
increase at R/2 executed loops against log2 of the steps: the difference of the two
slopes), the one-sided test above zero and its seeds. Other seeds or --set make an
exploratory run, never the verdict. The verdict goes to
STORAGE/analysis/c3_growth/verdict.md.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from looplab.config import ConfigError
from sweeps.dry_run import describe
from sweeps.flags import Common, Launch, parser
from sweeps.protocol import C3_GROWTH, GrowthProtocol
from sweeps.scale_scan import HOLE_CENTRE, holes_scan
from sweeps.sweep import Sweep


def growth_sweep(protocol: GrowthProtocol = C3_GROWTH, overrides: dict[str, Any] | None = None) -> Sweep:
    """The scan's holes sweep along the protocol's axis only (its centre is one of the values)."""
    sweep = holes_scan(Common(protocol.preset, {**protocol.regime, **(overrides or {})}), [protocol.axis])
    values = {p[protocol.axis] for p in sweep.points}
    if values != set(protocol.values) or HOLE_CENTRE[protocol.axis] not in values:
        raise ConfigError(
            f"GrowthProtocol.values={protocol.values!r} is invalid; allowed: the scan's {protocol.axis} points "
            f"({sorted(values)})"
        )
    return replace(sweep, name=f"c3_growth_{protocol.axis}")


def slope(xs: list[float], ys: list[float]) -> float | None:
    """The least-squares slope of ys against log2 xs (per doubling); None under two points."""
    if len(xs) < 2:
        return None
    lx = [math.log2(x) for x in xs]
    mean_x, mean_y = sum(lx) / len(lx), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in lx)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(lx, ys)) / sxx


def seed_slopes(trials, protocol: GrowthProtocol = C3_GROWTH) -> dict[int, float]:
    """Per seed: the slope of the gap (Ouro's skip increase minus CHASE's, points, at the
    claim's executed loops) against log2 of the axis, over the values where both arms
    reach those loops. trials: analysis.claims.trial_measures rows of the growth sweep."""
    import polars as pl

    from analysis import names
    from analysis.claims import SEARCHED

    column = SEARCHED + protocol.axis
    rows = trials.select("seed", "method", pl.col(column).alias("x"), pl.col(names.SKIP_INCREASE).alias("y"))
    out = {}
    for (seed,), part in rows.group_by(["seed"], maintain_order=True):
        by = {(r["method"], int(r["x"])): r["y"] for r in part.iter_rows(named=True)}
        points = [
            (x, by[("Ouro", x)] - by[("CHASE", x)])
            for x in sorted(protocol.values)
            if by.get(("Ouro", x)) is not None and by.get(("CHASE", x)) is not None
        ]
        s = slope([float(x) for x, _ in points], [g for _, g in points])
        if s is not None:
            out[int(seed)] = s
    return out


def judge_growth(trials, protocol: GrowthProtocol = C3_GROWTH):
    """C3-growth's result over the seeds' slopes (one-sided above zero, uncorrected: the
    protocol has one claim)."""
    from analysis.claims import CLAIMS, judge

    slopes = seed_slopes(trials, protocol)
    detail = (
        f"per seed, the slope of Ouro's minus CHASE's increase against log2 of {protocol.axis} "
        f"({', '.join(map(str, protocol.values))}); seeds {', '.join(map(str, sorted(slopes)))}"
    )
    return judge(
        protocol.claim,
        CLAIMS[protocol.claim].interval(slopes.values(), protocol.confidence),
        detail,
        confidence=protocol.confidence,
    )


def describe_protocol(protocol: GrowthProtocol, seeds: tuple[int, ...], reasons: list[str]) -> str:
    from analysis.stats import power

    lines = [
        f"protocol {protocol.name}",
        f"  digest {protocol.digest()} (sweeps/protocol.py); {protocol.claim}, one-sided at "
        f"{protocol.confidence:g}, uncorrected (one claim)",
        f"  {protocol.axis}: {', '.join(map(str, protocol.values))} at the scan's centre; seeds "
        f"{', '.join(map(str, seeds))}",
        f"  evidence it was found on (never a judge): {protocol.evidence}",
        f"  power at these seeds: {power(len(protocol.seeds), protocol.effect, protocol.spread, 1 - protocol.confidence, sides=1):.2f}"
        f" (effect {protocol.effect:+g} per doubling, per-seed spread {protocol.spread:g}, from that evidence)",
    ]
    lines.append(
        "  this run would be the verdict: the declared seeds, the declared protocol"
        if not reasons
        else "  this run would be EXPLORATORY:\n" + "\n".join(f"    - {r}" for r in reasons)
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from sweeps.launch import prepare

    p = parser(__doc__.splitlines()[0])
    p.set_defaults(seeds=None, storage_path="runs/c3-growth")
    args = p.parse_args(argv)
    try:
        common = Common.from_args(args)
        given = None if args.seeds is None else tuple(Launch.from_args(args).seeds)
        seeds = C3_GROWTH.seeds if given is None else given
        launch = replace(Launch.from_args(args), seeds=seeds)
        sweep = growth_sweep(C3_GROWTH, common.overrides)
        if common.stage_overrides:
            raise ConfigError("--stage-set is invalid here; allowed: --set (which makes the run exploratory)")
        prepared = prepare(sweep, launch)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reasons = ([f"--set {common.overrides} changes the declared regime"] if common.overrides else []) + (
        [f"seeds {', '.join(map(str, seeds))} are not the declared {', '.join(map(str, C3_GROWTH.seeds))}"]
        if given is not None and tuple(given) != C3_GROWTH.seeds
        else []
    )
    print(describe_protocol(C3_GROWTH, seeds, reasons) + "\n")
    sweep, points, res, plans = prepared
    if launch.dry_run:
        from sweeps.estimate import estimate

        print(describe(sweep, launch, points, res, plans) + "\n")
        print(estimate([(sweep, points)], launch).text())
        return 0
    from sweeps.launch import run_sweep

    rows = run_sweep(sweep, launch, points, res)
    if not rows or any(r["status"] == "error" for r in rows):
        print("a trial failed: no verdict (re-run the same command to resume)", file=sys.stderr)
        return 1
    path = write_verdict(sweep, launch, reasons)
    print(f"\nC3-growth: {path}")
    return 0


def write_verdict(sweep: Sweep, launch: Launch, reasons: list[str]) -> Path:
    from analysis.claims import trial_measures, verdict_markdown
    from analysis.load import load_runs
    from analysis.points import evaluation_points
    from looplab import tracking
    from trainables.storage import Storage

    store = Storage(launch.storage_path)
    uri = store.tracking_uri(launch.tracking_uri)
    trials = trial_measures(
        evaluation_points(load_runs(uri, [tracking.experiment_name(sweep.name, sweep.spec.preset)]))
    )
    result = judge_growth(trials, C3_GROWTH)
    slopes = seed_slopes(trials, C3_GROWTH)
    lines = [
        ("**EXPLORATORY:** " + "; ".join(reasons) + "." if reasons else "**The preregistered verdict.**"),
        "",
        f"Protocol **{C3_GROWTH.name}**, digest `{C3_GROWTH.digest()}`; seeds {', '.join(map(str, sorted(slopes)))}.",
        "",
        "| seed | slope of the gap, points per doubling |",
        "|---|---|",
        *(f"| {s} | {v:+.2f} |" for s, v in sorted(slopes.items())),
        "",
        verdict_markdown([result]),
    ]
    out = store.scratch() / "analysis" / "c3_growth"
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdict.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out / "verdict.md"


if __name__ == "__main__":
    sys.exit(main())
