"""The paper's headline claims in miniature: one command, its declared seeds, a computed verdict per claim.

    python sweeps/paper_mini.py                      # the protocol's declared seeds on 2 CPU cores
    python sweeps/paper_mini.py --dry-run            # the protocol, its power analysis, seeds and pins, the time
    python sweeps/paper_mini.py --seeds 900,901      # other seeds: an exploratory run, never the headline

Everything it runs and every rule that judges it is one frozen declaration,
sweeps/protocol.PROTOCOL, whose digest covers its seeds and goes with every verdict
(verdicts.md, the LM sweep's MLflow run). Three sweeps on the platform (Ray Tune trials,
MLflow, the analysis layer), a timed step, then the verdicts:

  lm     the `debug` byte-level 1⊗4 Mamba-2: pre-training → Stage-1, then the Ouro arm
         (→ Stage-2) and the CHASE arm (→ CHASE → Stage-2) on that Stage-1, and their
         step-matched controls: Ouro continued without holes as long as CHASE's stage
         (ouro-matched) and the fixed-loop model continued as long as Stage-1 and CHASE
         (fixed-matched); beside them the pre-trained 1⊗1 and 4⊗1 (C1-LM, C1-depth).
         Every continued stage continues its parent's data stream (train.data_start)
  phop   the looped model against its N⊗1 on p-hop (C1)
  mano   likewise on Mano over a small field (C1-mano)
  speed  every LM seed's CHASE model, prefill full against skip at batch 1 and 64 (C4):
         a step keyed by content (trainables/bench.py), alone on the machine

Each sweep trains the protocol's declared seeds for it (the block's first n: a power
analysis sized them, sweeps/power_analysis.py). Before anything trains, the run checks
what the protocol pins (sweeps/fingerprint.py: torch, the machine class, the stages'
resolved configs, what the claims code computes, each stage shape's first steps) and
the store's ledger (sweeps/ledger.Ledger: each seed's first use); every departure is
one line, and any departure, other seeds or --set/--stage-set make the run
*exploratory*: its verdicts are printed and kept, marked so, never the headline. The
seeds are entered in the ledger as their first stage starts. Each claim's figure is
computed over the seeds with its interval and test (analysis/claims.py), and Holm's
correction over the protocol's fixed family decides the verdicts; claims outside the
family are shown, not judged. Everything is keyed by content: a re-run trains nothing.
The verdicts go to STORAGE/analysis/paper_mini/ (verdicts.md, verdicts.csv,
speed_records.csv: each seed's timed prefills, report.html, readme_block.md) and to the
LM sweep's MLflow run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from looplab.arguments import add_flags, flag, flags_of
from looplab.config import ConfigError
from looplab.tracking import ACCURACY, PPL, VAL_ACCURACY, VAL_LOSS, VAL_PPL
from sweeps.depth_grid import NR_PARAMS, depth_grid
from sweeps.dry_run import describe
from sweeps.flags import Common, Launch, parser
from sweeps.ledger import Ledger
from sweeps.protocol import CLAIM_SWEEP, PROTOCOL, Protocol, seed_range
from sweeps.sweep import SKIP_COLUMNS, Sweep, sweep_key
from trainables.pipeline import PipelineSpec, stage_configs

LOOPED, BASE, DEEP = (1, 4), (1, 1), (4, 1)  # the LM's N⊗R, its iso-parameter N⊗1, its iso-depth NR⊗1
PROTOCOL_TAG = "paper_mini.protocol"  # the LM sweep run's tag: the digest its verdicts were judged under
LM, PHOP, MANO = "lm", "phop", "mano"  # the sweeps, as the protocol's Pins.seeds names them


def lm_sweep(protocol: Protocol = PROTOCOL) -> Sweep:
    """The gated arms at 1⊗4, their step-matched controls, and the pre-trained 1⊗1,
    4⊗1 (and 1⊗4, shared) beside them."""
    every = tuple(dict.fromkeys(s for stages in protocol.arms.values() for s in stages))
    declared = {s: {"train.steps": n} for s, n in protocol.stage_steps.items()}
    for stage, values in protocol.stage_overrides.items():
        declared.setdefault(stage, {}).update(values)
    spec = PipelineSpec(
        preset=protocol.lm_preset,
        stages=protocol.arms["chase"],
        arms=dict(protocol.arms),
        overrides={**protocol.lm_regime, **protocol.overrides},
        stage_overrides=declared,
        searched=NR_PARAMS,
        searched_stages=every,
    )
    points = tuple({"arm": arm, "n_layers": n, "n_loops": r} for arm, n, r in protocol.lm_points)
    return Sweep(
        name="paper_mini_lm",
        spec=spec,
        points=points,
        metric=VAL_PPL,
        mode="min",
        columns=(VAL_PPL, *SKIP_COLUMNS),
        flags={"n_layers": "--set", "n_loops": "--set"},
    )


def phop_sweep(protocol: Protocol = PROTOCOL) -> Sweep:
    level = ("p", list(protocol.phop_hops))
    return _pretraining(
        "paper_mini_phop", protocol.phop_preset, protocol.phop_regime, protocol.phop_pairs, level, "--hops", protocol
    )


def mano_sweep(protocol: Protocol = PROTOCOL) -> Sweep:
    level = ("L", list(protocol.mano_levels))
    return _pretraining(
        "paper_mini_mano", protocol.mano_preset, protocol.mano_regime, protocol.mano_pairs, level, "--levels", protocol
    )


def _pretraining(name: str, preset: str, regime: dict, pairs, level, level_flag: str, protocol: Protocol) -> Sweep:
    """A synthetic task's N⊗R pre-trainings at the protocol's pairs and level, judged by accuracy."""
    return depth_grid(
        name,
        Common(preset, {**regime, **protocol.overrides}),
        tuple({"n_layers": n, "n_loops": r} for n, r in pairs),
        level=level,
        level_flag=level_flag,
        metric=VAL_ACCURACY,
        mode="max",
        columns=(VAL_ACCURACY, VAL_LOSS),
    )


def sweeps_of(protocol: Protocol = PROTOCOL) -> dict[str, Sweep]:
    """The protocol's sweeps by name: the LM's, p-hop's, and Mano's where it has a Mano claim."""
    out = {LM: lm_sweep(protocol), PHOP: phop_sweep(protocol)}
    if protocol.mano_preset:
        out[MANO] = mano_sweep(protocol)
    return out


# ---- seeds, pins and the ledger: headline or exploratory ----------------------------------------------------


@dataclass(frozen=True)
class SeedPlan:
    """The seeds each sweep trains, and whether they are the protocol's declared ones."""

    seeds: dict[str, tuple[int, ...]]
    declared: bool

    @property
    def every(self) -> tuple[int, ...]:
        return tuple(sorted({s for seeds in self.seeds.values() for s in seeds}))

    def text(self) -> str:
        return "; ".join(f"{name} {seed_range(seeds)} ({len(seeds)})" for name, seeds in self.seeds.items())


def seed_plan(protocol: Protocol, given: tuple[int, ...] | None, names) -> SeedPlan:
    """The declared seeds per sweep (given None), or the given seeds for every sweep."""
    if given is None:
        return SeedPlan({name: protocol.seeds_of(name) for name in names}, declared=True)
    return SeedPlan({name: tuple(given) for name in names}, declared=False)


def exploratory_reasons(protocol: Protocol, plan: SeedPlan, ledger: Ledger, departures: list[str]) -> list[str]:
    """Why a run is not the headline, one line each (empty: it is): a modified protocol,
    seeds other than the declared ones, a departure from the pins, a seed first used
    under another protocol (or seen in an exploratory run first)."""
    reasons = []
    if protocol.overrides or protocol.stage_overrides:
        reasons.append(f"--set/--stage-set make another protocol (digest {protocol.digest()})")
    if not plan.declared:
        reasons.append(
            f"the seeds are not the protocol's declared ones ({seed_plan(protocol, None, plan.seeds).text()})"
        )
    reasons += departures
    for row in ledger.status(plan.every, protocol):
        if not row["fresh"]:
            reasons.append(
                f"seed {row['seed']} was first used under {row['first_used_under']} ({row['first_protocol']})"
                + (" in an exploratory run" if row["first_used_under"] == protocol.digest() else "")
            )
    return reasons


def check_pins(protocol: Protocol, sweeps: dict[str, Sweep], *, quiet: bool = False) -> list[str]:
    """The departures from the protocol's pins (sweeps/fingerprint.py); none without pins."""
    if protocol.pins is None:
        return []
    from sweeps.fingerprint import departures

    if not quiet:
        print("checking the protocol's pins (each stage shape's first steps, compiled where declared)...", flush=True)
    return departures(protocol.pins, list(sweeps.values()), protocol.seeds[0])


def describe_protocol(protocol: Protocol, plan: SeedPlan, ledger: Ledger, reasons: list[str]) -> str:
    """The dry run's first lines: the protocol, its family, the arms' weight-training
    steps, its seeds and pins, the power analysis, and whether this run would be the
    headline."""
    from sweeps import power_analysis

    family = protocol.family
    shown = [c for c in protocol.claim_rules if c not in family]
    lines = [
        f"protocol {protocol.name}",
        f"  digest {protocol.digest()} (sweeps/protocol.py); confidence {protocol.confidence:g}, correction "
        f"{protocol.correction} over a fixed family of {len(family)}: {', '.join(family)}",
    ]
    if shown:
        lines.append(
            f"  shown, not judged here: {', '.join(shown)} (a GPU's regime: scripts/device_check.sh judges it)"
        )
    lines.append(
        "  C2 and C3 read the step-matched arms ("
        + ", ".join(f"{c}: {a}" for c, a in protocol.matched.items())
        + "); every continued stage continues its parent's data stream"
    )
    lines.append("  arms:")
    lines += [f"    {line}" for line in protocol.arm_steps_text()]
    lines += [f"  disclosed: {d}" for d in protocol.disclosed]
    lines.append(
        f"  seeds ({'the declared ones, inside the digest' if plan.declared else 'given, not the declared ones'}): "
        + plan.text()
    )
    status = ledger.status(plan.every, protocol)
    fresh = tuple(row["seed"] for row in status if row["fresh"])
    if fresh:
        lines.append(f"    fresh (not yet used, or first used under this protocol): {seed_range(fresh)}")
    for row in status:
        if not row["fresh"]:
            lines.append(f"    {row['seed']}: first used under {row['first_used_under']} ({row['first_protocol']})")
    if protocol.pins is not None:
        pins = protocol.pins
        lines.append(
            f"  pins: torch {pins.torch}; machine {pins.machine}; stages {pins.stages}; analysis {pins.analysis}; "
            f"first steps of {len(pins.behaviour)} stage shapes"
        )
    lines.append(
        "  this run would be the headline: every pin holds, the seeds are the declared ones and fresh"
        if not reasons
        else "  this run would be EXPLORATORY (a replication, never the headline):\n"
        + "\n".join(f"    - {r}" for r in reasons)
    )
    return "\n".join(lines) + "\n\n" + power_analysis.text(protocol)


@dataclass(frozen=True)
class MiniFlags:
    """The miniature's own flag, beside every sweep's (sweeps/flags.py)."""

    pins: bool = flag(
        False, "print what this checkout and machine would pin (a new protocol's declaration pastes it) and stop"
    )


def main(argv: list[str] | None = None) -> int:
    from sweeps.launch import prepare

    p = parser(__doc__.splitlines()[0])
    add_flags(p, MiniFlags)
    p.set_defaults(seeds=None, storage_path="runs/paper-mini")
    args = p.parse_args(argv)
    if flags_of(MiniFlags, args).pins:
        return print_pins(PROTOCOL)
    started = time.monotonic()
    try:
        if args.preset != PROTOCOL.lm_preset:
            raise ConfigError(
                f"--preset={args.preset!r} is invalid; allowed: {PROTOCOL.lm_preset} (the regime is "
                "the protocol's, sweeps/protocol.py; --set changes both sweeps' settings, --stage-set "
                "the LM's stages, and either makes another protocol)"
            )
        common, launch = Common.from_args(args), Launch.from_args(args)
        given = None if args.seeds is None else launch.seeds  # None: the protocol's declared seeds
        protocol = PROTOCOL.with_overrides(common.overrides, common.stage_overrides)
        sweeps = sweeps_of(protocol)
        plan = seed_plan(protocol, given, sweeps)
        launches = {name: replace(launch, seeds=plan.seeds[name]) for name in sweeps}
        prepared = {name: prepare(sweep, launches[name]) for name, sweep in sweeps.items()}
        ledger = Ledger(launch.storage_path)
        ledger.entries()  # a torn ledger is one line here, before anything runs
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reasons = exploratory_reasons(protocol, plan, ledger, check_pins(protocol, sweeps))
    if launch.dry_run:
        from sweeps.estimate import estimate

        print(describe_protocol(protocol, plan, ledger, reasons) + "\n")
        for name, (sweep, points, res, plans) in prepared.items():
            print(describe(sweep, launches[name], points, res, plans) + "\n")
        try:  # it probes every stage here: one this machine cannot hold is refused first (looplab/costs/machine.py)
            print(
                estimate(
                    [(sweep, points) for sweep, points, _, _ in prepared.values()],
                    launch,
                    extra_seconds=speed_seconds(prepared[LM][0], launches[LM], protocol),
                ).text()
            )
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    from sweeps.launch import run_sweep
    from sweeps.lock import SweepBusy

    exploratory = bool(reasons)
    if exploratory:
        print("this run is EXPLORATORY (a replication, never the headline):", file=sys.stderr)
        for reason in reasons:
            print(f"  - {reason}", file=sys.stderr)
    ledger.start(plan.every, protocol, exploratory)  # before any stage trains: the seeds are used now
    status = 0
    for name, (sweep, points, res, _) in prepared.items():
        try:
            rows = run_sweep(sweep, launches[name], points, res)
        except SweepBusy as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        status |= 0 if rows and all(r["status"] != "error" for r in rows) else 1
    if status:
        print("a trial failed: no verdicts (re-run the same command to resume)", file=sys.stderr)
        return status
    speed = measure_speed(prepared[LM][0], launches[LM], protocol)
    report = write_verdicts({name: prepared[name][0] for name in sweeps}, launches, speed, protocol, plan, reasons)
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    print(f"\npaper_mini: {minutes} min {seconds:02d} s on this machine; verdicts: {report['verdicts.md']}")
    return 0


def print_pins(protocol: Protocol) -> int:
    """What this checkout and machine would pin for the protocol's sweeps, as the Pins
    fields a declaration in sweeps/protocol.py takes."""
    from sweeps.fingerprint import current_pins

    if protocol.pins is None:
        print("error: the protocol declares no pins (v5 on do)", file=sys.stderr)
        return 2
    pins = current_pins(protocol.pins, list(sweeps_of(protocol).values()), protocol.seeds[0])
    print(f'torch="{pins.torch}",\nmachine="{pins.machine}",\nstages="{pins.stages}",\nanalysis="{pins.analysis}",')
    print("behaviour={")
    for label, losses in pins.behaviour.items():
        print(f'    "{label}": [{", ".join(repr(v) for v in losses)}],')
    print("},")
    return 0


# ---- the timed step ---------------------------------------------------------------------------------


def speed_points(seq_len: int, protocol: Protocol = PROTOCOL):
    """Prefill at the models' own context, at each of the protocol's batches."""
    from trainables.bench import SpeedPoint

    return [
        SpeedPoint(batch, seq_len, protocol.speed_policy, dtype, packing)
        for batch, packing, dtype in protocol.speed_points
    ]


REPORT_S = 15.0  # the verdicts, their report and the MLflow writes (measured on 2 cores)


def speed_seconds(sweep: Sweep, launch: Launch, protocol: Protocol = PROTOCOL) -> float:
    """The speed step's time and the verdicts', for the dry run's estimate: one seed's
    timing (the memory probe's child process, then warm-ups and repeats of full and skip
    prefill at each speed point) run here on the CHASE model's shape with fresh weights,
    times the seeds. Skip on fresh weights exits where an untrained gate does, so this
    bounds the trained model's skip time from above."""
    import os

    import torch

    from looplab.checkpoint import model_from_config
    from looplab.costs.timing import bench_point, measured_peaks, prefill_peaks
    from looplab.policy import ExitPolicy
    from looplab.tasks.base import heldout_ids

    final = stage_configs(
        sweep.spec,
        {"arm": "chase", "n_layers": LOOPED[0], "n_loops": LOOPED[1], "seed": launch.seeds[0]},
        launch.storage_path,
    )[-1]
    model = model_from_config(final.model, final.train.seed).eval()
    previous = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        t0 = time.perf_counter()
        calls = [
            dict(
                model=model,
                ids=heldout_ids(model, None, p.batch, p.seq_len),
                policy=ExitPolicy.parse(p.policy),
                packing=p.packing,
                dtype=p.dtype,
            )
            for p in speed_points(final.train.seq_len, protocol)
        ]
        for call, peaks in zip(calls, measured_peaks(prefill_peaks, calls)):  # as trainables/bench.measure does
            bench_point(**call, peaks=peaks)
        one_seed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(previous)
    return len(launch.seeds) * one_seed + REPORT_S


def measure_speed(sweep: Sweep, launch: Launch, protocol: Protocol = PROTOCOL) -> list[dict]:
    """C4's records: each seed's CHASE model (its final stage) timed at the speed points."""
    from looplab import tracking
    from trainables.bench import BenchTarget, measure
    from trainables.pipeline import checkpoint_of
    from trainables.storage import Storage

    store = Storage(launch.storage_path)
    uri = store.tracking_uri(launch.tracking_uri)
    mc = tracking.client(uri)
    experiment = tracking.experiment_name(sweep.name, sweep.spec.preset)
    experiment_id = tracking.ensure_experiment(mc, experiment, store.path("mlflow"))
    sweep_run = tracking.find_run(
        mc, experiment_id, **{tracking.LEVEL: tracking.SWEEP, tracking.SWEEP_KEY: sweep_key(sweep, launch)}
    )
    records = []
    for seed in launch.seeds:
        final = stage_configs(
            sweep.spec, {"arm": "chase", "n_layers": LOOPED[0], "n_loops": LOOPED[1], "seed": seed}, store.root
        )[-1]
        target = BenchTarget(checkpoint_of(store.root, final), final.stage_key(), final.config_hash(), "CHASE")
        for r in measure(
            mc,
            experiment_id,
            sweep_run.info.run_id if sweep_run else None,
            target,
            points=speed_points(final.train.seq_len, protocol),
            label=f"seed {seed}",
        ):
            records.append({**r, "seed": seed})
    return records


# ---- the verdicts ---------------------------------------------------------------------------------------


TABLES = {LM: "lm_trials", PHOP: "phop_trials", MANO: "mano_trials"}  # each sweep's trial measures' name


def claim_tables(uri: str, experiments: dict[str, str]) -> dict[str, Any]:
    """The experiments' trial measures (analysis.claims.trial_measures), every seed, by
    the sweep they belong to."""
    from analysis.claims import trial_measures
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    return {
        name: trial_measures(evaluation_points(load_runs(uri, [experiment])))
        for name, experiment in experiments.items()
    }


def claim_results(
    tables: dict[str, Any], plan: SeedPlan, protocol: Protocol = PROTOCOL, speed: list[dict] | None = None
) -> list:
    """Every claim's result over the plan's seeds (each sweep's own), from claim_tables
    (and the speed records, the LM's seeds), corrected over the protocol's family."""
    import polars as pl

    from analysis.claims import CLAIMS, SEARCHED, correct, hole_claims, loop_claims, speed_claims

    def of_seeds(name: str):
        return tables[name].filter(pl.col("seed").is_in(list(plan.seeds[name])))

    lm = of_seeds(LM)
    arm = pl.col(SEARCHED + "arm") if SEARCHED + "arm" in lm.columns else pl.lit(None)

    def of(name):
        return lm.filter(arm == name) if name else None

    results = []
    for claim, pairs in (("C1", protocol.phop_pairs), ("C1-mano", protocol.mano_pairs)):
        sweep = CLAIM_SWEEP[claim]
        if pairs and sweep in tables:  # the looped N⊗R first, against its N⊗1 (Protocol validates both)
            looped, base = pairs[0], (pairs[0][0], 1)
            results += loop_claims(of_seeds(sweep), quality=ACCURACY, looped=looped, base=base, deep=None, claim=claim)
    results += loop_claims(lm.filter(arm == "fixed"), quality=PPL, looped=LOOPED, base=BASE, deep=DEEP)
    results += hole_claims(
        lm.filter(arm.is_in(["ouro", "chase"])),
        matched_ouro=of(protocol.matched.get("C3")),
        matched_fixed=of(protocol.matched.get("C2")),
    )
    results += speed_claims([r for r in speed or [] if r["seed"] in plan.seeds[LM]])
    order = list(CLAIMS)
    results = sorted((r for r in results if r.claim.id in protocol.claim_rules), key=lambda r: order.index(r.claim.id))
    if protocol.correction == "holm":
        results = correct(results, protocol.family, protocol.confidence)
    return results


def verdicts_text(protocol: Protocol, plan: SeedPlan, status: list[dict], results: list, reasons: list[str]) -> str:
    """verdicts.md: the protocol, whether this is the headline or an exploratory run (and
    why), each seed's standing, and the verdicts."""
    from analysis.claims import verdict_markdown

    lines = [
        f"Protocol **{protocol.name}**, digest `{protocol.digest()}` (sweeps/protocol.py). "
        f"{protocol.confidence:.0%} Student-t intervals over seeds, each claim's test and scale as its line "
        "below says; "
        + (
            f"Holm's correction over a fixed family of {len(protocol.family)} claims decides each verdict, its "
            "interval shown at the level Holm's procedure gives it (the uncorrected interval beside it); "
            if protocol.correction == "holm"
            else "no correction; "
        )
        + "C2 and C3 read the step-matched arms.",
        "",
    ]
    if reasons:
        lines += ["**EXPLORATORY: a replication, not a verdict on this protocol's declared seeds:**", ""]
        lines += [f"- {r}" for r in reasons]
    else:
        lines.append(
            f"**Headline: the protocol's declared seeds ({plan.text()}), each first used under it, on its "
            "machine class and code.**"
        )
    lines += ["", "Arms (weight-training steps):", ""]
    lines += [f"    {line}" for line in protocol.arm_steps_text()]
    lines += [""] + [f"Disclosed: {d}." for d in protocol.disclosed]
    lines += ["", "| seed | first used under | fresh |", "|---|---|---|"]
    lines += [
        f"| {r['seed']} | `{r['first_used_under']}` ({r['first_protocol']}) | {'yes' if r['fresh'] else 'no'} |"
        for r in status
    ]
    lines += ["", verdict_markdown(results)]
    return "\n".join(lines)


def write_verdicts(
    sweeps: dict[str, Sweep],
    launches: dict[str, Launch],
    speed: list[dict],
    protocol: Protocol,
    plan: SeedPlan,
    reasons: list[str],
) -> dict[str, Path]:
    """verdicts.md / .csv, the trial measures and report.html (the LM sweep's report with
    the verdicts first) in STORAGE/analysis/paper_mini; the verdicts are printed, set as
    the LM sweep run's description with the protocol's digest as a tag (and whether the
    run was exploratory), and the seeds entered in the store's ledger as scored."""
    import polars as pl

    from analysis.claims import verdict_table
    from analysis.report import ReportOptions, build_report, write_csv
    from looplab import tracking
    from trainables.storage import Storage

    launch = launches[LM]
    store = Storage(launch.storage_path)
    uri = store.tracking_uri(launch.tracking_uri)
    out = store.scratch() / "analysis" / "paper_mini"
    out.mkdir(parents=True, exist_ok=True)
    experiments = {name: tracking.experiment_name(sweep.name, sweep.spec.preset) for name, sweep in sweeps.items()}
    ledger = Ledger(launch.storage_path)
    status = ledger.status(plan.every, protocol)
    tables = claim_tables(uri, experiments)
    results = claim_results(tables, plan, protocol, speed)
    markdown = verdicts_text(protocol, plan, status, results, reasons)
    paths = {
        "verdicts.md": out / "verdicts.md",
        "verdicts.csv": out / "verdicts.csv",
        "readme_block.md": out / "readme_block.md",
    }
    paths["verdicts.md"].write_text(markdown + "\n")
    paths["readme_block.md"].write_text(readme_block(protocol, plan, results, reasons) + "\n")
    verdict_table(results).with_columns(
        pl.lit(protocol.digest()).alias("protocol"), pl.lit(bool(reasons)).alias("exploratory")
    ).write_csv(paths["verdicts.csv"])
    for name, table in tables.items():
        write_csv(table.filter(pl.col("seed").is_in(list(plan.seeds[name]))), out / f"{TABLES[name]}.csv")
    # speed.csv is the report's table (analysis/bench.py), written below into this folder:
    # the per-seed records go beside it, not under it
    pl.DataFrame(speed).write_csv(out / "speed_records.csv")
    ledger.record(plan.every, protocol, exploratory=bool(reasons))
    print("\n" + markdown)
    mc = tracking.client(uri)
    experiment_id = mc.get_experiment_by_name(experiments[LM]).experiment_id
    sweep_run = tracking.find_run(
        mc, experiment_id, **{tracking.LEVEL: tracking.SWEEP, tracking.SWEEP_KEY: sweep_key(sweeps[LM], launch)}
    )
    report = build_report(
        uri,
        [experiments[LM]],
        out,
        ReportOptions(
            sweep_run_id=sweep_run.info.run_id if sweep_run else None,
            lead=(
                ("Claims: the paper's against ours", _claims_html(markdown)),
                ("The miniature's protocols", _protocols_html(results, protocol)),
            ),
        ),
    )
    if sweep_run is not None:  # the verdicts beside the report's files, and on the run's dashboard page
        for name in ("verdicts.md", "verdicts.csv"):
            mc.log_artifact(sweep_run.info.run_id, str(paths[name]), artifact_path="analysis")
        mc.set_tag(sweep_run.info.run_id, PROTOCOL_TAG, protocol.digest() + (" exploratory" if reasons else ""))
        tracking.set_description(mc, sweep_run.info.run_id, "**paper_mini**\n\n" + markdown)
    return {**paths, **report}


def readme_block(protocol: Protocol, plan: SeedPlan, results: list, reasons: list[str]) -> str:
    """docs/paper-mini.md's generated section (scripts/readme_figures.py paste paper_mini): the
    verdicts, a reading generated from them, and the protocols' history. An exploratory
    run's block says so in its first line."""
    from analysis.claims import DESCRIPTIVE, NO_SPREAD, NOT_REPRODUCED, REPRODUCED, verdict_markdown
    from sweeps.protocol import history_markdown

    groups: dict[str, list[str]] = {REPRODUCED: [], NOT_REPRODUCED: [], NO_SPREAD: [], DESCRIPTIVE: []}
    inconclusive: list[str] = []
    for r in results:
        groups.get(r.verdict, inconclusive).append(r.claim.id)
    corrected = f"after Holm's correction over the fixed family of {len(protocol.family)} claims"
    reading = (
        f"Reading ({corrected}): reproduced in direction: {', '.join(groups[REPRODUCED]) or 'none'}; "
        f"not reproduced: {', '.join(groups[NOT_REPRODUCED]) or 'none'}; inconclusive: "
        f"{', '.join(inconclusive + groups[NO_SPREAD]) or 'none'}"
        + (f"; shown, not judged on this machine: {', '.join(groups[DESCRIPTIVE])}" if groups[DESCRIPTIVE] else "")
        + "."
    )
    changed = [
        f"{r.claim.id} ({r.raw_verdict} uncorrected)"
        for r in results
        if r.verdict != DESCRIPTIVE and r.raw_verdict is not None and r.raw_verdict != r.verdict
    ]
    if changed:
        reading += " The correction changed " + ", ".join(changed) + "."
    head = ["**Exploratory** (not the headline): " + "; ".join(reasons) + ".", ""] if reasons else []
    return "\n".join(
        head
        + [
            f"Protocol **{protocol.name}**, digest `{protocol.digest()}`; seeds {plan.text()}, each first used "
            "under it. Weight-training steps per arm:",
            "",
            *(f"    {line}" for line in protocol.arm_steps_text()),
            "",
            *(f"Disclosed: {d}." for d in protocol.disclosed),
            "",
            verdict_markdown(results),
            "",
            reading,
            "",
            "**Every protocol the miniature has had** (the verdicts as each printed them; v1 and v2 judged the same "
            "seeds; v3 on were each declared before their seeds were trained):",
            "",
            history_markdown(current_verdicts(results), protocol),
        ]
    )


def current_verdicts(results) -> dict[str, str]:
    """claim -> "figure: verdict", the history table's entry for today's protocol."""
    return {r.claim.id: f"{r.claim.text(r.tested).split(' (n=')[0]}: {r.verdict}" for r in results}


def _claims_html(markdown: str) -> str:
    return _markdown_html(markdown)


def _protocols_html(results, protocol: Protocol) -> str:
    from sweeps.protocol import history_markdown

    return _markdown_html(history_markdown(current_verdicts(results), protocol))


def _markdown_html(text: str) -> str:
    """The verdicts' markdown (tables, bullets, paragraphs, **bold**, `code`) as HTML."""
    import html
    import re

    def inline(t: str) -> str:
        t = html.escape(t)
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t))

    out, table = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip("|").split("|")])
            continue
        if table:
            head, *body = [r for r in table if not all(set(c) <= {"-"} for c in r)]
            out.append(
                "<table><tr>"
                + "".join(f"<th>{inline(c)}</th>" for c in head)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in body)
                + "</table>"
            )
            table = []
        if line.startswith("- "):
            out.append(f"<li>{inline(line[2:])}</li>")
        elif line.startswith("    "):
            out.append(f"<pre>{html.escape(line.strip())}</pre>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
