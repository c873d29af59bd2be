"""The paper's headline claims in miniature: one command, five fresh seeds, a computed verdict per claim.

    python sweeps/paper_mini.py                      # the protocol's seeds (300-304) on 2 CPU cores
    python sweeps/paper_mini.py --dry-run            # the protocol, the plan, each seed's status, the time
    python sweeps/paper_mini.py --seeds 300,...,305  # one more seed: only it trains

Everything it runs and every rule that judges it is one frozen declaration,
sweeps/protocol.PROTOCOL, whose digest goes with every verdict (verdicts.md, the LM
sweep's MLflow run). Three sweeps on the platform (Ray Tune trials, MLflow, the analysis
layer), a timed step, then the verdicts:

  lm     the `debug` byte-level 1⊗4 Mamba-2: pre-training → Stage-1, then the Ouro arm
         (→ Stage-2) and the CHASE arm (→ CHASE → Stage-2) on that Stage-1, and their
         compute-matched controls: Ouro continued without holes as long as CHASE's stage
         (ouro-matched) and the fixed-loop model continued as long as Stage-1 and CHASE
         (fixed-matched); beside them the pre-trained 1⊗1 and 4⊗1 (C1-LM, C1-depth)
  phop   the looped model against its N⊗1 on p-hop (C1; 1⊗2 against 1⊗1 under v4)
  mano   likewise on Mano over a small field (C1-mano; 1⊗2 against 1⊗1 under v4)
  speed  every seed's CHASE model, prefill full against skip at batch 1 and 64 (C4): a
         step keyed by content (trainables/speed.py), alone on the machine

Each claim's figure is computed over the seeds with a 95 % interval, its p-value and
Holm's correction over the claims family (analysis/claims.py); the verdict reads the
corrected test and, for C2 and C3, the compute-matched arm (the unmatched figure is
shown beside). The store's ledger (sweeps/protocol.Ledger) says which seeds were first
scored under this protocol; the headline verdicts read those alone. Everything is keyed
by content: a re-run trains nothing, and a new seed trains only that seed. The verdicts
go to STORAGE/analysis/paper_mini/ (verdicts.md, verdicts.csv, speed_records.csv: each
seed's timed prefills, report.html) and to the
LM sweep's MLflow run. --set / --stage-set make another protocol (another digest).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from looplab.config import ConfigError
from looplab.tracking import ACCURACY, PPL, VAL_ACCURACY, VAL_LOSS, VAL_PPL
from sweeps.depth_grid import depth_grid
from sweeps.flags import Common, Launch, parser
from sweeps.plan import SKIP_COLUMNS, Sweep, describe, sweep_key
from sweeps.protocol import PROTOCOL, Ledger, Protocol, fresh_seeds
from trainables.pipeline import PipelineSpec, stage_configs

SEEDS = ",".join(map(str, PROTOCOL.seeds))
LOOPED, BASE, DEEP = (1, 4), (1, 1), (4, 1)  # the LM's N⊗R, its iso-parameter N⊗1, its iso-depth NR⊗1
PROTOCOL_TAG = "paper_mini.protocol"  # the LM sweep run's tag: the digest its verdicts were judged under


def lm_sweep(protocol: Protocol = PROTOCOL) -> Sweep:
    """The gated arms at 1⊗4, their compute-matched controls, and the pre-trained 1⊗1,
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
        searched={"n_layers": "model.n_layers", "n_loops": "model.n_loops"},
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


def sweeps_of(protocol: Protocol = PROTOCOL) -> list[Sweep]:
    """The protocol's sweeps: the LM's, p-hop's, and Mano's where it has a Mano claim."""
    return [lm_sweep(protocol), phop_sweep(protocol)] + ([mano_sweep(protocol)] if protocol.mano_preset else [])


def describe_protocol(protocol: Protocol, launch: Launch) -> str:
    """The dry run's first lines: the protocol, the arms' weight-training steps, and
    each seed's standing in the store's ledger."""
    lines = [
        f"protocol {protocol.name}",
        f"  digest {protocol.digest()} (sweeps/protocol.py); confidence "
        f"{protocol.confidence:g}, correction {protocol.correction}; C2 and C3 read the compute-matched arms "
        f"({', '.join(f'{c}: {a}' for c, a in protocol.matched.items())})",
        "  arms:",
    ]
    lines += [f"    {line}" for line in protocol.arm_steps_text()]
    lines.append("  seeds:")
    for row in Ledger(launch.storage_path).status(launch.seeds, protocol):
        lines.append(
            f"    {row['seed']}: "
            + (
                "fresh (first scored under this protocol, or not yet scored)"
                if row["fresh"]
                else f"first scored under {row['first_scored_under']} "
                f"({row['first_protocol']}): left out of the headline verdicts"
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from sweeps.launch import prepare

    p = parser(__doc__.splitlines()[0])
    p.set_defaults(seeds=SEEDS, storage_path="runs/paper-mini")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        if args.preset != PROTOCOL.lm_preset:
            raise ConfigError(
                f"--preset={args.preset!r} is invalid; allowed: {PROTOCOL.lm_preset} (the regime is "
                "the protocol's, sweeps/protocol.py; --set changes both sweeps' settings, --stage-set "
                "the LM's stages, and either makes another protocol)"
            )
        common, launch = Common.from_args(args), Launch.from_args(args)
        protocol = PROTOCOL.with_overrides(common.overrides, common.stage_overrides)
        prepared = [prepare(sweep, launch) for sweep in sweeps_of(protocol)]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if launch.dry_run:
        from sweeps.estimate import estimate

        print(describe_protocol(protocol, launch) + "\n")
        for sweep, points, res, plans in prepared:
            print(describe(sweep, launch, points, res, plans) + "\n")
        try:  # it probes every stage here: one this machine cannot hold is refused first (looplab/costs/machine.py)
            print(
                estimate(
                    [(sweep, points) for sweep, points, _, _ in prepared],
                    launch,
                    extra_seconds=speed_seconds(prepared[0][0], launch, protocol),
                ).text()
            )
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    from sweeps.launch import run_sweep
    from sweeps.lock import SweepBusy

    status = 0
    for sweep, points, res, _ in prepared:
        try:
            rows = run_sweep(sweep, launch, points, res)
        except SweepBusy as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        status |= 0 if rows and all(r["status"] != "error" for r in rows) else 1
    if status:
        print("a trial failed: no verdicts (re-run the same command to resume)", file=sys.stderr)
        return status
    speed = measure_speed(prepared[0][0], launch, protocol)
    report = write_verdicts([sweep for sweep, _, _, _ in prepared], launch, speed, protocol)
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    print(f"\npaper_mini: {minutes} min {seconds:02d} s on this machine; verdicts: {report['verdicts.md']}")
    return 0


# ---- the timed step ---------------------------------------------------------------------------------


def speed_points(seq_len: int, protocol: Protocol = PROTOCOL):
    """Prefill at the models' own context, at each of the protocol's batches."""
    from trainables.speed import SpeedPoint

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

    from looplab.costs.timing import bench_point, measured_peaks, prefill_peaks
    from looplab.tasks.base import heldout_ids
    from looplab.checkpoint import model_from_config
    from looplab.policy import ExitPolicy

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
        for call, peaks in zip(calls, measured_peaks(prefill_peaks, calls)):  # as trainables/speed.measure does
            bench_point(**call, peaks=peaks)
        one_seed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(previous)
    return len(launch.seeds) * one_seed + REPORT_S


def measure_speed(sweep: Sweep, launch: Launch, protocol: Protocol = PROTOCOL) -> list[dict]:
    """C4's records: each seed's CHASE model (its final stage) timed at the speed points."""
    from looplab import tracking
    from trainables.pipeline import checkpoint_of
    from trainables.speed import measure
    from trainables.storage import Storage

    store = Storage(launch.storage_path)
    uri = launch.tracking_uri or f"sqlite:///{store.scratch() / 'mlflow.db'}"
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
        for r in measure(
            mc,
            experiment_id,
            sweep_run.info.run_id if sweep_run else None,
            checkpoint=checkpoint_of(store.root, final),
            stage_key=final.stage_key(),
            config_hash=final.config_hash(),
            method="CHASE",
            points=speed_points(final.train.seq_len, protocol),
            label=f"seed {seed}",
        ):
            records.append({**r, "seed": seed})
    return records


# ---- the verdicts ---------------------------------------------------------------------------------------


TABLES = ("lm_trials", "phop_trials", "mano_trials")  # claim_tables' names, in sweeps_of's order


def claim_tables(uri: str, experiments: list[str]) -> dict[str, Any]:
    """The experiments' trial measures (analysis.claims.trial_measures), every seed, by
    TABLES' names in sweeps_of's order."""
    from analysis.claims import trial_measures
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    return {
        name: trial_measures(evaluation_points(load_runs(uri, [experiment])))
        for name, experiment in zip(TABLES, experiments)
    }


def claim_results(
    tables: dict[str, Any], seeds, protocol: Protocol = PROTOCOL, speed: list[dict] | None = None
) -> list:
    """Every claim's result over these seeds, from claim_tables (and the speed records),
    corrected as the protocol says."""
    import polars as pl

    from analysis.claims import CLAIMS, SEARCHED, hole_claims, holm, loop_claims, speed_claims

    seeds = list(seeds)
    lm = tables["lm_trials"].filter(pl.col("seed").is_in(seeds))
    arm = pl.col(SEARCHED + "arm") if SEARCHED + "arm" in lm.columns else pl.lit(None)

    def of(name):
        return lm.filter(arm == name) if name else None

    results = []
    for claim, table, pairs in (
        ("C1", "phop_trials", protocol.phop_pairs),
        ("C1-mano", "mano_trials", protocol.mano_pairs),
    ):
        if pairs:  # the looped N⊗R first, against its N⊗1 (Protocol validates both)
            trials = tables[table].filter(pl.col("seed").is_in(seeds))
            looped, base = pairs[0], (pairs[0][0], 1)
            results += loop_claims(trials, quality=ACCURACY, looped=looped, base=base, deep=None, claim=claim)
    results += loop_claims(lm.filter(arm == "fixed"), quality=PPL, looped=LOOPED, base=BASE, deep=DEEP)
    results += hole_claims(
        lm.filter(arm.is_in(["ouro", "chase"])),
        matched_ouro=of(protocol.matched.get("C3")),
        matched_fixed=of(protocol.matched.get("C2")),
    )
    results += speed_claims([r for r in speed or [] if r["seed"] in seeds])
    order = list(CLAIMS)
    results = sorted((r for r in results if r.claim.id in protocol.claim_rules), key=lambda r: order.index(r.claim.id))
    if protocol.correction == "holm":
        results = holm(results, protocol.confidence)
    return results


def verdicts_text(protocol: Protocol, status: list[dict], results: list, all_results: list | None) -> str:
    """verdicts.md: the protocol, each seed's standing, the headline verdicts on fresh
    seeds, and (when some seeds are not fresh) the same over every seed, marked."""
    from analysis.claims import verdict_markdown

    lines = [
        f"Protocol **{protocol.name}**, digest `{protocol.digest()}` (sweeps/protocol.py). "
        f"{protocol.confidence:.0%} Student-t intervals over seeds (paired where arms share a parent, else "
        f"Welch); "
        + (
            "Holm's correction over the claims family decides each verdict (the uncorrected interval beside it); "
            if protocol.correction == "holm"
            else "no correction; "
        )
        + "C2 and C3 read the compute-matched arms; an interval narrower than the metric's resolution is "
        "'inconclusive (no spread)'.",
        "",
        "Arms (weight-training steps):",
        "",
    ]
    lines += [f"    {line}" for line in protocol.arm_steps_text()]
    lines += ["", "| seed | first scored under | in the headline |", "|---|---|---|"]
    lines += [
        f"| {r['seed']} | `{r['first_scored_under']}` ({r['first_protocol']}) | {'yes' if r['fresh'] else 'no'} |"
        for r in status
    ]
    lines += [
        "",
        f"**Headline: the seeds first scored under this protocol "
        f"({', '.join(map(str, fresh_seeds(status))) or 'none'}).**",
        "",
        verdict_markdown(results),
    ]
    if all_results is not None:
        lines += [
            "",
            f"Every seed, those scored under an earlier protocol included "
            f"({', '.join(str(r['seed']) for r in status)}): not a verdict on this protocol.",
            "",
            verdict_markdown(all_results),
        ]
    return "\n".join(lines)


def write_verdicts(
    sweeps: list[Sweep], launch: Launch, speed: list[dict], protocol: Protocol = PROTOCOL
) -> dict[str, Path]:
    """verdicts.md / .csv, the trial measures and report.html (the LM sweep's report with
    the verdicts first) in STORAGE/analysis/paper_mini; the verdicts are printed, set as
    the LM sweep run's description with the protocol's digest as a tag, and the seeds
    entered in the store's ledger."""
    import polars as pl

    from analysis.claims import verdict_table
    from analysis.report import build_report, write_csv
    from looplab import tracking
    from trainables.storage import Storage

    store = Storage(launch.storage_path)
    uri = launch.tracking_uri or f"sqlite:///{store.scratch() / 'mlflow.db'}"
    out = store.scratch() / "analysis" / "paper_mini"
    out.mkdir(parents=True, exist_ok=True)
    lm = sweeps[0]
    experiments = [tracking.experiment_name(sweep.name, sweep.spec.preset) for sweep in sweeps]
    lm_experiment = experiments[0]
    ledger = Ledger(store.scratch())
    status = ledger.status(launch.seeds, protocol)
    fresh = fresh_seeds(status)
    tables = claim_tables(uri, experiments)
    results = claim_results(tables, fresh, protocol, speed)
    everyone = claim_results(tables, launch.seeds, protocol, speed) if len(fresh) < len(status) else None
    markdown = verdicts_text(protocol, status, results, everyone)
    paths = {
        "verdicts.md": out / "verdicts.md",
        "verdicts.csv": out / "verdicts.csv",
        "readme_block.md": out / "readme_block.md",
    }
    paths["verdicts.md"].write_text(markdown + "\n")
    paths["readme_block.md"].write_text(readme_block(protocol, status, results) + "\n")
    verdict_table(results).with_columns(pl.lit(protocol.digest()).alias("protocol")).write_csv(paths["verdicts.csv"])
    for name, table in tables.items():
        write_csv(table.filter(pl.col("seed").is_in(fresh)), out / f"{name}.csv")  # the headline's trials
    # speed.csv is the report's table (analysis/speed.py), written below into this folder:
    # the per-seed records go beside it, not under it
    pl.DataFrame(speed).write_csv(out / "speed_records.csv")
    ledger.record(launch.seeds, protocol)
    print("\n" + markdown)
    mc = tracking.client(uri)
    experiment_id = mc.get_experiment_by_name(lm_experiment).experiment_id
    sweep_run = tracking.find_run(
        mc, experiment_id, **{tracking.LEVEL: tracking.SWEEP, tracking.SWEEP_KEY: sweep_key(lm, launch)}
    )
    report = build_report(
        uri,
        [lm_experiment],
        out,
        sweep_run_id=sweep_run.info.run_id if sweep_run else None,
        lead=[
            ("Claims: the paper's against ours", _claims_html(markdown)),
            ("The miniature's protocols", _protocols_html(results, protocol)),
        ],
    )
    if sweep_run is not None:  # the verdicts beside the report's files, and on the run's dashboard page
        for name in ("verdicts.md", "verdicts.csv"):
            mc.log_artifact(sweep_run.info.run_id, str(paths[name]), artifact_path="analysis")
        mc.set_tag(sweep_run.info.run_id, PROTOCOL_TAG, protocol.digest())
        tracking.set_description(mc, sweep_run.info.run_id, "**paper_mini**\n\n" + markdown)
    return {**paths, **report}


def readme_block(protocol: Protocol, status: list[dict], results: list) -> str:
    """docs/paper-mini.md's generated section (scripts/readme_figures.py paste paper_mini): the
    headline verdicts, a reading generated from them, and the protocols' history."""
    from analysis.claims import NO_SPREAD, NOT_REPRODUCED, REPRODUCED, verdict_markdown
    from sweeps.protocol import history_markdown

    fresh = fresh_seeds(status)
    groups = {REPRODUCED: [], NOT_REPRODUCED: [], NO_SPREAD: []}
    inconclusive = []
    for r in results:
        groups.get(r.verdict, inconclusive).append(r.claim.id)
    corrected = "after Holm's correction over the " + str(sum(r.p is not None for r in results)) + " claims"
    reading = (
        f"Reading ({corrected}): reproduced in direction: {', '.join(groups[REPRODUCED]) or 'none'}; "
        f"not reproduced: {', '.join(groups[NOT_REPRODUCED]) or 'none'}; inconclusive: "
        f"{', '.join(inconclusive + groups[NO_SPREAD]) or 'none'}."
    )
    changed = [
        f"{r.claim.id} ({r.raw_verdict} uncorrected)"
        for r in results
        if r.raw_verdict is not None and r.raw_verdict != r.verdict
    ]
    if changed:
        reading += " The correction changed " + ", ".join(changed) + "."
    return "\n".join(
        [
            f"Protocol **{protocol.name}**, digest `{protocol.digest()}`; seeds {', '.join(map(str, fresh))}, each first "
            "scored under it. Weight-training steps per arm:",
            "",
            *(f"    {line}" for line in protocol.arm_steps_text()),
            "",
            verdict_markdown(results),
            "",
            reading,
            "",
            "**Every protocol the miniature has had** (the verdicts as each printed them; v1 and v2 judged the same "
            "seeds; v3 and v4 were each declared before their seeds were trained):",
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
