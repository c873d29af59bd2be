"""The paper's headline claims in miniature: one command, several seeds, a computed verdict per claim.

    python sweeps/paper_mini.py                                 # seeds 100,101,102 on 2 CPU cores
    python sweeps/paper_mini.py --dry-run                       # the plan and its time, measured here
    python sweeps/paper_mini.py --seeds 100,101,102,103         # one more seed: only it trains

Two sweeps on the platform (Ray Tune trials, MLflow, the analysis layer), a timed step,
then the verdicts, at the regime the scale scan found (sweeps/scale_scan.py; the
README's scan table):

  lm     the `debug` byte-level 1⊗4 Mamba-2 at LM_REGIME: pre-training → Stage-1, then the
         loop4-Ouro arm (→ Stage-2) and the loop4-CHASE arm (→ CHASE → Stage-2), which
         share Stage-1 (claims C2, C3); beside the 1⊗4, the pre-trained 1⊗1 and 4⊗1
         (C1-LM, C1-depth)
  phop   1⊗4, 1⊗1 and 4⊗1 on p-hop at PHOP_REGIME (C1)
         (--set reaches both sweeps, --stage-set the LM's continued stages)
  speed  every seed's CHASE model, prefill full against skip at batch 1 and SPEED_BATCH
         (C4): a step keyed by content (trainables/speed.py), alone on the machine

Each claim's figure is computed over the seeds with a 95 % interval and a verdict
(analysis/claims.py): "reproduced (direction)", "not reproduced" or "inconclusive".
The default seeds are not the scan's (0, 1, 2): no verdict is read off the data its
regime was chosen on. Everything is keyed by content: a re-run trains nothing, and a
new seed trains only that seed. The verdicts, with the paper's figure beside each, go
to STORAGE/analysis/paper_mini/ (verdicts.md, verdicts.csv, report.html) and to the LM
sweep's MLflow run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from looplab.config import ConfigError
from looplab.stages import ARMS as GATED_ARMS
from looplab.stages import DEFAULT_STAGE
from looplab.tracking import ACCURACY, PPL, VAL_ACCURACY, VAL_LOSS, VAL_PPL
from sweeps.depth_grid import depth_grid
from sweeps.flags import Common, Launch, parser
from sweeps.plan import SKIP_COLUMNS, Sweep, describe, sweep_key
from trainables.pipeline import PipelineSpec, stage_configs

ARMS = {**GATED_ARMS, "fixed": (DEFAULT_STAGE,)}
SEEDS = "100,101,102"
LM_PRESET, PHOP_PRESET = "debug", "phop-debug"
# The regime the scale scan found for the cache-hole effect (README: the scan's table, seeds
# 0-2): at context 128 the Ouro - CHASE gap (+9.3 [+5.3, +13.2] points) is the centre's
# (512: +10.5 [+6.6, +14.4]) at about a quarter of the step's cost, which is what fits the
# whole command in 30 minutes on 2 cores; 800 pre-training steps, each continued stage 200.
LM_REGIME = {"train.seq_len": 128, "train.batch_size": 8, "train.steps": 800, "task.val_blocks": 64,
             "train.eval_every": 400, "model.n_loops": 4, "hole.sampler": "depth", "hole.hp": 0.5,
             "train.eval_qs": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}
STAGE_STEPS = 200
LOOPED, BASE, DEEP = (1, 4), (1, 1), (4, 1)  # N⊗R, its iso-parameter N⊗1, its iso-depth NR⊗1
# The loop advantage's regime from the scan's loops effect: phop-debug's Mamba-2 at d 64,
# 2,000 steps on 16-token sequences.
PHOP_REGIME = {"task.n": 16, "model.d_model": 64, "train.steps": 2000}
PHOP_HOPS = [2]
SPEED_BATCH, SPEED_POLICY = 64, "skip:0.2"  # the paper's headline speedup: batch 64, q 0.2 (Table 5)


def lm_sweep(common: Common) -> Sweep:
    """The gated arms at 1⊗4 and the pre-trained 1⊗1, 4⊗1 (and 1⊗4, shared) beside them."""
    spec = PipelineSpec(preset=LM_PRESET, stages=ARMS["chase"], arms=ARMS, overrides={**LM_REGIME, **common.overrides},
                        stage_overrides=common.stage_overrides_over({s: {"train.steps": STAGE_STEPS}
                                                                     for s in ("stage1", "chase", "stage2")}),
                        searched={"n_layers": "model.n_layers", "n_loops": "model.n_loops"},
                        searched_stages=ARMS["chase"])
    pair = lambda nr: {"n_layers": nr[0], "n_loops": nr[1]}  # noqa: E731
    points = ({"arm": "ouro", **pair(LOOPED)}, {"arm": "chase", **pair(LOOPED)},
              *({"arm": "fixed", **pair(nr)} for nr in (LOOPED, BASE, DEEP)))
    return Sweep(name="paper_mini_lm", spec=spec, points=points, metric=VAL_PPL, mode="min",
                 columns=(VAL_PPL, *SKIP_COLUMNS), flags={"n_layers": "--set", "n_loops": "--set"})


def phop_sweep(common: Common) -> Sweep:
    pairs = tuple({"n_layers": n, "n_loops": r} for n, r in (LOOPED, BASE, DEEP))
    return depth_grid("paper_mini_phop", Common(PHOP_PRESET, {**PHOP_REGIME, **common.overrides}), pairs,
                      level=("p", PHOP_HOPS), level_flag="--hops", metric=VAL_ACCURACY, mode="max",
                      columns=(VAL_ACCURACY, VAL_LOSS))


def main(argv: list[str] | None = None) -> int:
    from sweeps.launch import prepare

    p = parser(__doc__.splitlines()[0])
    p.set_defaults(seeds=SEEDS, storage_path="runs/paper-mini")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        if args.preset != LM_PRESET:
            raise ConfigError(f"--preset={args.preset!r} is invalid; allowed: {LM_PRESET} (the regime is the "
                              "scan's; --set changes both sweeps' settings, --stage-set the LM's stages)")
        common, launch = Common.from_args(args), Launch.from_args(args)
        prepared = [prepare(sweep, launch) for sweep in (lm_sweep(common), phop_sweep(common))]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if launch.dry_run:
        from sweeps.estimate import estimate

        for sweep, points, res, plans in prepared:
            print(describe(sweep, launch, points, res, plans) + "\n")
        print(estimate([(sweep, points) for sweep, points, _, _ in prepared], launch,
                       extra_seconds=speed_seconds(prepared[0][0], launch)).text())
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
    speed = measure_speed(prepared[0][0], launch)
    report = write_verdicts(prepared[0][0], prepared[1][0], launch, speed)
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    print(f"\npaper_mini: {minutes} min {seconds:02d} s on this machine; verdicts: {report['verdicts.md']}")
    return 0


# ---- the timed step ---------------------------------------------------------------------------------

def speed_points(seq_len: int):
    """Prefill at the models' own context, batch 1 and SPEED_BATCH."""
    from trainables.speed import SpeedPoint

    return [SpeedPoint(batch, seq_len, SPEED_POLICY) for batch in (1, SPEED_BATCH)]


REPORT_S = 15.0  # the verdicts, their report and the MLflow writes (measured on 2 cores)


def speed_seconds(sweep: Sweep, launch: Launch) -> float:
    """The speed step's time and the verdicts', for the dry run's estimate: one seed's
    timing (the memory probe's child process, then warm-ups and repeats of full and skip
    prefill at each speed point) run here on the CHASE model's shape with fresh weights,
    times the seeds. Skip on fresh weights exits where an untrained gate does, so this
    bounds the trained model's skip time from above."""
    import os

    import torch

    from looplab.costs.timing import bench_point, heldout_ids, measured_peaks, prefill_peaks
    from looplab.checkpoint import model_from_config
    from looplab.policy import ExitPolicy

    final = stage_configs(sweep.spec, {"arm": "chase", "n_layers": LOOPED[0], "n_loops": LOOPED[1],
                                       "seed": launch.seeds[0]}, launch.storage_path)[-1]
    model = model_from_config(final.model, final.train.seed).eval()
    previous = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        t0 = time.perf_counter()
        calls = [dict(model=model, ids=heldout_ids(model, None, p.batch, p.seq_len), policy=ExitPolicy.parse(p.policy))
                 for p in speed_points(final.train.seq_len)]
        for call, peaks in zip(calls, measured_peaks(prefill_peaks, calls)):  # as trainables/speed.measure does
            bench_point(**call, peaks=peaks)
        one_seed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(previous)
    return len(launch.seeds) * one_seed + REPORT_S


def measure_speed(sweep: Sweep, launch: Launch) -> list[dict]:
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
    sweep_run = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: tracking.SWEEP,
                                                        tracking.SWEEP_KEY: sweep_key(sweep, launch)})
    records = []
    for seed in launch.seeds:
        final = stage_configs(sweep.spec, {"arm": "chase", "n_layers": LOOPED[0], "n_loops": LOOPED[1],
                                           "seed": seed}, store.root)[-1]
        for r in measure(mc, experiment_id, sweep_run.info.run_id if sweep_run else None,
                         checkpoint=checkpoint_of(store.root, final), stage_key=final.stage_key(),
                         config_hash=final.config_hash(), method="CHASE", points=speed_points(final.train.seq_len),
                         label=f"seed {seed}"):
            records.append({**r, "seed": seed})
    return records


# ---- the verdicts ---------------------------------------------------------------------------------------

def claim_results(uri: str, lm_experiment: str, phop_experiment: str, seeds) -> tuple[list, dict[str, Any]]:
    """Every claim's result, from the two experiments' runs of these seeds, and the
    tables they were read from."""
    import polars as pl

    from analysis.claims import hole_claims, loop_claims, trial_measures
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    seeds = list(seeds)
    lm = trial_measures(evaluation_points(load_runs(uri, [lm_experiment]))).filter(pl.col("seed").is_in(seeds))
    phop = trial_measures(evaluation_points(load_runs(uri, [phop_experiment]))).filter(pl.col("seed").is_in(seeds))
    results = loop_claims(phop, quality=ACCURACY, looped=LOOPED, base=BASE, deep=None)
    results += loop_claims(lm.filter(pl.col("method") == "fixed"), quality=PPL, looped=LOOPED, base=BASE, deep=DEEP)
    results += hole_claims(lm)
    return results, {"lm_trials": lm, "phop_trials": phop}


def write_verdicts(lm: Sweep, phop: Sweep, launch: Launch, speed: list[dict]) -> dict[str, Path]:
    """verdicts.md / .csv, the trial measures and report.html (the LM sweep's report with
    the verdicts first) in STORAGE/analysis/paper_mini; the verdicts are printed and set
    as the LM sweep run's description."""
    from analysis.claims import CLAIMS, speed_claims, verdict_markdown, verdict_table
    from analysis.report import build_report
    from looplab import tracking
    from trainables.storage import Storage

    store = Storage(launch.storage_path)
    uri = launch.tracking_uri or f"sqlite:///{store.scratch() / 'mlflow.db'}"
    out = store.scratch() / "analysis" / "paper_mini"
    out.mkdir(parents=True, exist_ok=True)
    lm_experiment = tracking.experiment_name(lm.name, lm.spec.preset)
    phop_experiment = tracking.experiment_name(phop.name, phop.spec.preset)
    results, tables = claim_results(uri, lm_experiment, phop_experiment, launch.seeds)
    results += speed_claims(speed)
    order = list(CLAIMS)
    results.sort(key=lambda r: order.index(r.claim.id))
    markdown = (f"Seeds {', '.join(map(str, launch.seeds))}; 95 % Student-t intervals over seeds.\n\n"
                + verdict_markdown(results))
    paths = {"verdicts.md": out / "verdicts.md", "verdicts.csv": out / "verdicts.csv"}
    paths["verdicts.md"].write_text(markdown + "\n")
    verdict_table(results).write_csv(paths["verdicts.csv"])
    for name, table in tables.items():
        table.write_csv(out / f"{name}.csv")
    import polars as pl

    pl.DataFrame(speed).write_csv(out / "speed.csv")
    print("\n" + markdown)
    mc = tracking.client(uri)
    experiment_id = mc.get_experiment_by_name(lm_experiment).experiment_id
    sweep_run = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: tracking.SWEEP,
                                                        tracking.SWEEP_KEY: sweep_key(lm, launch)})
    report = build_report(uri, [lm_experiment], out, sweep_run_id=sweep_run.info.run_id if sweep_run else None,
                          lead=[("Claims: the paper's against ours", _claims_html(results, launch.seeds))])
    if sweep_run is not None:  # the verdicts beside the report's files, and on the run's dashboard page
        for name in ("verdicts.md", "verdicts.csv"):
            mc.log_artifact(sweep_run.info.run_id, str(paths[name]), artifact_path="analysis")
        tracking.set_description(mc, sweep_run.info.run_id, "**paper_mini**\n\n" + markdown)
    return {**paths, **report}


def _claims_html(results, seeds) -> str:
    import html

    rows = "".join(
        f"<tr><td><b>{html.escape(r.claim.id)}</b> {html.escape(r.claim.statement)}</td>"
        f"<td>{html.escape(r.claim.paper)}</td><td>{html.escape(r.claim.text(r.interval))}<br>"
        f"<small>{html.escape(r.claim.measure)}{'; ' + html.escape(r.detail) if r.detail else ''}</small></td>"
        f"<td class='verdict'>{html.escape(r.verdict)}</td></tr>" for r in results)
    return (f"<p>Seeds {', '.join(map(str, seeds))}; 95 % Student-t intervals over seeds; verdicts computed by "
            "analysis/claims.py (an interval that includes the null value is inconclusive).</p>"
            "<table><tr><th>claim</th><th>the paper</th><th>ours</th><th>verdict</th></tr>" + rows + "</table>")


if __name__ == "__main__":
    sys.exit(main())
