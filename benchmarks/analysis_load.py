"""How long the analysis layer takes on a large sweep: N synthetic runs (default 5,000)
in a local MLflow store, then the real loader and analysis, timed.

    python benchmarks/analysis_load.py                     # 5,000 runs in a temporary store
    python benchmarks/analysis_load.py --runs 20000 --store /tmp/big --repeat 3
    python benchmarks/analysis_load.py --client            # also time the MlflowClient fallback
    python benchmarks/analysis_load.py --store /tmp/b --reuse   # time an existing store again

The store: MLflow creates the database and the experiment (its schema, its migrations);
the runs are then written with bulk SQL inserts into MLflow's own tables (runs, tags,
params, metrics, latest_metrics), row for row what MLflow's SQL store writes, because
creating 5,000 runs through the client takes minutes. The rows are shaped like the
platform's: one sweep run; per trial a trial run and four stage runs (pretrain →
stage1 → chase → stage2) with looplab.tracking's params (config_params of real
configs), tags (config_tags) and metric names (record_metrics of looplab.training.train's
records: training histories, val_*, the threshold sweep at 5 q × dense/skip and forced
depths 1..4). Before timing, MlflowClient reads a few runs back and must agree.

Timed (median of --repeat): load_runs (the SQL path), evaluation_points,
aggregate_seeds, the frontiers (per series) and their pairwise areas, all tables,
the β-diagnostic histories, and build_report end to end (CSVs, PNGs, HTML).
"""

from __future__ import annotations

import math
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from looplab import tracking
from looplab.arguments import Parser, add_flags, at_least, flag, flags_of
from looplab.policy import ExitPolicy
from looplab.presets import get_preset, stage_config
from looplab.stages import STAGE_NAMES

EXPERIMENT = "bench_sweep-debug"
QS = (0.2, 0.4, 0.6, 0.8, 1.0)
R = 4
TRAIN_STEPS = 200
LOG_EVERY = 20


def pipeline(point: dict, seed: int):
    """The chain pretrain → stage1 → chase → stage2 as the platform derives it; the hole
    and β values reach the stages that read them."""
    overrides = {
        "model.n_loops": R,
        "train.steps": TRAIN_STEPS,
        "train.seed": seed,
        **{f"hole.{k}": v for k, v in point.items() if k != "beta"},
    }
    configs = []
    for stage in STAGE_NAMES:
        parent = configs[-1] if configs else None
        ref = parent.as_parent(f"/storage/stages/{parent.stage}-{parent.stage_key()}/checkpoint") if parent else None
        configs.append(
            stage_config(
                get_preset("debug"),
                stage,
                parent=ref,
                overrides=overrides,
                stage_overrides={} if stage == "pretrain" else {"exit.beta": point["beta"]},
            )
        )
    return configs


def records(stage: str, rng: random.Random, quality: float) -> list[dict]:
    """looplab.training.train's records for one stage: training windows, the full eval, the threshold sweep."""
    out = []
    for step in range(LOG_EVERY, TRAIN_STEPS + 1, LOG_EVERY):
        rec = {
            "kind": tracking.TRAIN_RECORD,
            "step": step,
            "stage": stage,
            tracking.LOSS: 3.0 - step / TRAIN_STEPS + rng.random() * 0.1,
            tracking.LR: 1e-3,
            tracking.GRAD_NORM: 1.0 + rng.random(),
            tracking.TOKENS_PER_S: 15000.0 + rng.random() * 1000,
        }
        if stage != "pretrain":
            rec.update(
                {
                    tracking.EXIT_ENTROPY: math.log(R) * (1 - 0.3 * step / TRAIN_STEPS),
                    tracking.EXPECTED_EXIT_STEP: 3.5 - step / 400,
                }
            )
        out.append(rec)
    ppl = 8.0 / quality
    policies = [evaluation("full", ppl, 0.4 * quality, loops=float(R), exit_step=float(R))]
    if stage != "pretrain":
        for mode in ("dense", "skip"):
            for q in QS:
                loops = R if mode == "dense" else 1.5 + 2.5 * q
                p = ppl * (1 + (1 - q) * (0.05 if mode == "dense" else 0.2 + rng.random() * 0.1))
                policies.append(
                    evaluation(f"{mode}:{q}", p, 0.4 * quality * q**0.1, loops=loops, exit_step=1.5 + 2.5 * q)
                )
        for depth in range(1, R):  # depth R is full depth, logged once
            p = ppl * (R / depth) ** 2
            policies.append(
                evaluation(f"forced:{depth}", p, 0.1 * depth * quality, loops=float(depth), exit_step=float(depth))
            )
    out.append({"kind": tracking.EVAL_RECORD, "step": TRAIN_STEPS, "policies": policies})
    return out


def evaluation(policy: str, ppl: float, accuracy: float, *, loops: float, exit_step: float) -> dict:
    """One policy's record of an evaluation (looplab.evaluation.validation's fields)."""
    return {
        "policy": policy,
        tracking.PPL: ppl,
        tracking.ACCURACY: accuracy,
        tracking.LOSS: math.log(ppl),
        tracking.EXECUTED_LOOPS: loops,
        tracking.MEAN_EXIT_STEP: exit_step,
        tracking.BACKBONE_FLOPS: 9000.0 * loops,
    }


def metric_rows(run_id: str, recs: list[dict], t0: int) -> list[tuple]:
    rows = []
    for i, rec in enumerate(recs):
        for key, value in tracking.record_metrics(rec).items():
            rows.append((key, value, t0 + i, run_id, int(rec["step"]), 0))
    return rows


def latest_rows(metric_rows_: list[tuple]) -> list[tuple]:
    """MLflow's latest_metrics: per key the row with the highest (step, timestamp, value)."""
    best: dict[str, tuple] = {}
    for key, value, ts, run_id, step, is_nan in metric_rows_:
        if key not in best or (step, ts, value) > (best[key][4], best[key][2], best[key][1]):
            best[key] = (key, value, ts, run_id, step, is_nan)
    return [(k, v, ts, step, nan, run) for k, v, ts, run, step, nan in best.values()]


def build_store(store: Path, n_runs: int, seed: int = 0) -> tuple[str, int]:
    """Returns (tracking URI, runs written)."""
    store.mkdir(parents=True, exist_ok=True)
    db = store / "mlflow.db"
    if db.exists():
        db.unlink()
    uri = f"sqlite:///{db}"
    mc = tracking.client(uri)  # MLflow creates the schema (alembic migrations) and the experiment
    exp_id = int(tracking.ensure_experiment(mc, EXPERIMENT, store / "artifacts"))
    artifact_root = tracking.artifact_location(store / "artifacts", EXPERIMENT)
    rng = random.Random(seed)
    n_trials = -(-(n_runs - 1) // (1 + len(STAGE_NAMES)))  # at least n_runs runs
    seeds = 4  # 250 configurations × 4 seeds = 1,000 trials = 5,001 runs
    grid = [
        {"beta": beta, "hp": hp, "lo": lo, "rho": rho}
        for beta in (0.05, 0.1, 0.25, 0.5, 1.0)
        for hp in (0.1, 0.25, 0.5, 0.75, 0.9)
        for lo in (1.0, 1.5, 1.85, 2.25, 2.75)
        for rho in (0.5, 1.0)
    ]
    runs, tags, params, metrics, latest = [], [], [], [], []
    t0 = 1_700_000_000_000
    sweep = uuid.uuid4().hex

    def add_run(run_id, name, run_tags, run_params, recs=(), extra=()):
        start = t0 + len(runs) * 1000
        runs.append(
            (
                run_id,
                name,
                "LOCAL",
                "",
                "",
                "bench",
                "FINISHED",
                start,
                start + 500,
                None,
                "",
                "active",
                f"{artifact_root}/{run_id}/artifacts",
                exp_id,
            )
        )
        tags.extend((k, str(v), run_id) for k, v in {**run_tags, tracking.RUN_NAME_TAG: name}.items())
        params.extend((k, v, run_id) for k, v in run_params.items())
        rows = metric_rows(run_id, list(recs), start) + [(k, v, start + 999, run_id, TRAIN_STEPS, 0) for k, v in extra]
        metrics.extend(rows)
        latest.extend(latest_rows(rows))

    add_run(
        sweep,
        "bench_sweep",
        {
            tracking.LEVEL: tracking.SWEEP,
            tracking.SWEEP_KEY: "bench",
            tracking.PRESET: "debug",
            tracking.GIT_SHA: "bench",
            tracking.COMMAND: "benchmarks/analysis_load.py",
        },
        {},
    )
    shared: dict[str, str] = {}  # stage_key -> the run that trained it
    for t in range(n_trials):
        point = grid[(t // seeds) % len(grid)]
        configs = pipeline(point, t % seeds + seeds * (t // (seeds * len(grid))))
        final = configs[-1]
        trial = uuid.uuid4().hex
        quality = 0.8 + 0.2 * rng.random()
        final_recs = records("stage2", rng, quality)
        lineage = [c.stage for c in configs]
        add_run(
            trial,
            tracking.trial_run_name(final.stage_key()),
            {
                **tracking.config_tags(
                    final, level=tracking.TRIAL, git="bench", lineage=lineage, **{tracking.SWEEP_TAG: EXPERIMENT}
                ),
                tracking.PARENT_RUN_TAG: sweep,
            },
            {**tracking.config_params(final), **tracking.search_params(point)},
            final_recs,
            [(tracking.STAGE_SECONDS, 30.0)],
        )
        for i, cfg in enumerate(configs):
            run = uuid.uuid4().hex
            reused = shared.get(cfg.stage_key())
            stage_tags = tracking.config_tags(
                cfg,
                level=tracking.STAGE,
                git="bench",
                lineage=lineage[: i + 1],
                **{
                    tracking.REUSED: "true" if reused else "false",
                    tracking.CHECKPOINT: "ckpt",
                    tracking.TRIAL_RUN: trial,
                },
                **({tracking.REUSED_FROM: reused} if reused else {}),
            )
            recs = final_recs if cfg.stage == "stage2" else records(cfg.stage, rng, quality)
            timing = [(tracking.STAGE_SECONDS, 10.0 * (i + 1))]
            if reused:  # the original's final values only, as trainables/trial.py logs them
                last = {}
                for rec in recs:
                    last.update(tracking.record_metrics(rec))
                add_run(
                    run,
                    tracking.stage_run_name(cfg.stage, cfg.stage_key()),
                    {**stage_tags, tracking.PARENT_RUN_TAG: trial},
                    {},
                    (),
                    [*last.items(), *timing],
                )
            else:
                shared[cfg.stage_key()] = run
                add_run(
                    run,
                    tracking.stage_run_name(cfg.stage, cfg.stage_key()),
                    {**stage_tags, tracking.PARENT_RUN_TAG: trial},
                    tracking.config_params(cfg),
                    recs,
                    timing,
                )

    with sqlite3.connect(db) as con:
        con.executemany(
            "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status, "
            "start_time, end_time, deleted_time, source_version, lifecycle_stage, artifact_uri, "
            "experiment_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            runs,
        )
        con.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", tags)
        con.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)", params)
        con.executemany(
            "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)", metrics
        )
        con.executemany(
            "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
            latest,
        )
    _check_with_mlflow(mc, exp_id, len(runs))
    print(
        f"store: {db} ({db.stat().st_size / 2**20:.0f} MiB): {len(runs):,} runs, {len(tags):,} tags, "
        f"{len(params):,} params, {len(metrics):,} metric values"
    )
    return uri, len(runs)


def _check_with_mlflow(mc, exp_id: int, expected: int) -> None:
    """MLflow itself reads the bulk-written runs back: the count, and a trial's metrics."""
    found = mc.search_runs([str(exp_id)], max_results=1, filter_string="tags.level = 'trial'")
    run = mc.get_run(found[0].info.run_id)
    skip_ppl = tracking.policy_metric(ExitPolicy.skip(0.4), tracking.PPL)
    assert run.data.params["model.n_loops"] == str(R) and skip_ppl in run.data.metrics, run.data
    history = mc.get_metric_history(run.info.run_id, tracking.LOSS)
    assert len(history) == TRAIN_STEPS // LOG_EVERY, len(history)
    total, token = 0, None
    while True:
        page = mc.search_runs([str(exp_id)], max_results=5000, page_token=token)
        total += len(page)
        token = page.token
        if not token:
            break
    assert total == expected, (total, expected)


def timed(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    runs: int = flag(5000, "runs to write", type=at_least(1))
    store: str | None = flag(None, "store folder (default: a temporary folder)")
    repeat: int = flag(3, "timings are the median of this many runs", type=at_least(1))
    client: bool = flag(False, "also time load_runs through MlflowClient (slow)")
    reuse: bool = flag(False, "time the store already in --store instead of writing one")


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args(argv))

    import polars as pl

    from analysis import names
    from analysis.aggregate import aggregate_seeds
    from analysis.frontier import frontier_gap, pareto_frontier
    from analysis.load import load_runs
    from analysis.points import evaluation_points, full_as_forced_depth
    from analysis.report import BASE_VALUES, ReportOptions, build_report
    from analysis.tables import all_tables

    with tempfile.TemporaryDirectory(prefix="looplab-bench-") as tmp:
        store = Path(opts.store) if opts.store else Path(tmp)
        if opts.reuse and (store / "mlflow.db").is_file():
            uri = f"sqlite:///{store / 'mlflow.db'}"
            n = len(load_runs(uri, [EXPERIMENT]).runs)
            print(f"store: {store / 'mlflow.db'} (reused)\n")
        else:
            start = time.perf_counter()
            uri, n = build_store(store, opts.runs)
            print(f"wrote the store in {time.perf_counter() - start:.1f} s (not part of the timings)\n")

        rows = []
        t_load, runs = timed(lambda: load_runs(uri, [EXPERIMENT]), opts.repeat)
        shape = f"{runs.runs.height:,} runs × {runs.runs.width} columns, {runs.metrics.height:,} metric summaries"
        rows.append(("load_runs (SQL: runs, tags, params, latest, extrema)", t_load, shape))
        t_points, points = timed(lambda: evaluation_points(runs), opts.repeat)
        rows.append(("evaluation_points", t_points, f"{points.height:,} points"))
        values = [v for v in BASE_VALUES if v in points.columns]
        t_agg, agg = timed(lambda: aggregate_seeds(points, values), opts.repeat)
        rows.append(("aggregate_seeds (mean, std, t-interval)", t_agg, f"{agg.height:,} configuration points"))

        def frontiers():
            final = full_as_forced_depth(agg.filter("is_final_stage")).with_columns(
                pl.concat_str("method", "policy", separator=" · ").alias("series")
            )
            flagged = pareto_frontier(final, tracking.EXECUTED_LOOPS, tracking.PPL, maximize=False, by="series")
            groups = {k[0]: g for k, g in flagged.group_by("series")}
            areas = [
                frontier_gap(groups[a], groups[b], tracking.EXECUTED_LOOPS, tracking.PPL, maximize=False)
                for a in groups
                for b in groups
                if a < b
            ]
            return flagged, areas

        t_front, (flagged, areas) = timed(frontiers, opts.repeat)
        rows.append(
            (
                "frontiers per series + pairwise areas",
                t_front,
                f"{int(flagged['on_frontier'].sum())} frontier points, {len(areas)} areas",
            )
        )
        t_tables, (tables, _) = timed(lambda: all_tables(agg), opts.repeat)
        rows.append(("tables (Markdown + CSV data)", t_tables, f"{len(tables)} tables"))
        t_hist, hist = timed(lambda: runs.histories(list(names.BETA_DIAGNOSTICS)), opts.repeat)
        rows.append(("β-diagnostic histories", t_hist, f"{hist.height:,} values"))
        analysis_total = t_load + t_points + t_agg + t_front + t_tables + t_hist
        rows.append(("= loading + analysis", analysis_total, ""))
        out = store / "report"
        t_report, paths = timed(lambda: build_report(uri, [EXPERIMENT], out, ReportOptions(log_artifacts=False)), 1)
        rows.append(("build_report end to end (+ CSVs, 4 PNGs, HTML)", t_report, f"{len(paths)} files"))
        if opts.client:
            t_client, crs = timed(lambda: load_runs(uri, [EXPERIMENT], backend="client"), 1)
            rows.append(("load_runs via MlflowClient (fallback)", t_client, f"{crs.runs.height:,} runs"))

        print(f"{n:,} runs, median of {opts.repeat}:")
        width = max(len(r[0]) for r in rows)
        for name, seconds, what in rows:
            print(f"  {name.ljust(width)}  {seconds:7.2f} s  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
