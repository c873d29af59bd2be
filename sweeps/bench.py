"""Prefill speed of an experiment's trained checkpoints (paper §5.4, Tables 5 and 6), as a
tracked sweep: full against skip execution at every point of a grid, on every chosen
checkpoint of an existing experiment.

    python sweeps/bench.py --experiment adaptive_pipeline-paper-140m --storage-path runs/paper --grid table5-140m
    python sweeps/bench.py --experiment adaptive_pipeline-paper-370m --storage-path runs/paper --grid table5-370m
    python sweeps/bench.py --experiment adaptive_pipeline-paper-140m --storage-path runs/paper --grid table6
    python sweeps/bench.py --experiment adaptive_pipeline-debug --grid debug --no-ray     # a CPU, in-process
    python sweeps/bench.py --experiment adaptive_pipeline-debug --grid debug --dry-run    # the plan, and the store

Grids (--grid; --batches, --seq-lens, --policies, --dtype, --packing, --repeats override
any of their settings):

    table5-140m  batch 1, 4, 8, 16, 64 at L 2048   skip:0.2, 0.4, 0.6   bf16, padded    (Table 5, 140M)
    table5-370m  batch 4, 8, 16, 32, 64 at L 2048  skip:0.2, 0.4, 0.6   bf16, padded    (Table 5, 370M)
    table6       batch 16 at L 256 ... 3584        skip:0.2, 0.4, 0.6   bf16, padded    (Table 6)
    debug        batch 1, 4 at L 128               skip:0.2, 0.4, 0.6   fp32, auto      (a CPU, minutes)

"padded" is the paper's ragged-halting layout (looplab/costs/timing.py). The checkpoints
(--stages; default: the gated final stages, the models the paper times) come from the
experiment's FINISHED stage runs (trainables/checkpoints.py's store_checkpoints). Each
point is one MLflow run keyed by content and by the machine that times it
(trainables/bench.py): a re-run measures only what the store lacks on this hardware.
Each run records, beside the measured speedup, the loop bound R/d̄ and the FLOP ratio
(F0 + R·Fr)/(F0 + d̄·Fr) (looplab/costs/resources.py).

--arrivals adds decoding under continuous arrivals (looplab/inference/arrivals.py, issue 27 item
6a): per checkpoint, a seeded request stream served by --slots cache rows under each
--schedules and each policy (and full, the baseline), one MLflow run per (checkpoint,
slots, schedule, policy, stream) keyed the same way; each logs tokens/s, decode tokens/s,
d̄, the FLOP ratio of d̄ and the speedup over full. --requests, --prompt-len, --new-tokens
set the stream (defaults: the grid's arrivals settings; debug is a CPU's seconds):

    python sweeps/bench.py --experiment adaptive_pipeline-debug --grid debug --no-ray --arrivals
    python sweeps/bench.py --experiment adaptive_pipeline-paper-140m --grid table5-140m --arrivals --slots 8,32

One job per checkpoint, a Ray task with --cpus and --gpus (defaults: without GPUs, a
node's CPUs, so that one job at a time has the machine to itself, as timing wants;
with GPUs, one GPU and its share of the CPUs), or in this process (--no-ray). The
report (analysis/bench.py: speed beside the stage's validation perplexity per policy,
and the perplexity-against-tokens/s figure) is written to STORAGE/analysis/<experiment>-speed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sys
from dataclasses import dataclass

from looplab import tracking
from looplab.arguments import flag, flags_of
from looplab.config import ConfigError
from looplab.policy import parse_policies
from looplab.stages import STAGE_NAMES, get_stage
from sweeps.bench_grid import (
    ArrivalFlags,
    ArrivalGrid,
    SpeedFlags,
    SpeedGrid,
    arrival_grid_of,
    parse_number,
    speed_grid_of,
)
from sweeps.bench_summary import print_summary
from sweeps.evaluate import experiment_checkpoints
from sweeps.flags import Store, distinct, fail, store_parser
from sweeps.runtime import console_to_log, local_gpus, write_report


# ---- flags ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bench(Store):
    """python -m sweeps.bench's options beside the grids' flags (sweeps/bench_grid.py
    SpeedFlags, ArrivalFlags). --cpus and --gpus are text ("": this machine's or the
    cluster's default), read by resources_of."""

    dry_run: bool = flag(False, "print the checkpoints × points and what the store has")
    stages: str = flag(
        "",
        "time checkpoints of these stages (default: the gated final stages, e.g. each arm's stage2)",
        metavar="STAGE,...",
    )
    cpus: str = flag(
        "",
        "CPUs per job, also its torch threads (default: a node's CPUs without GPUs, else its CPUs per GPU)",
        metavar="N",
    )
    gpus: str = flag("", "GPUs per job (default: 1 where there are GPUs, else 0)", metavar="N")
    no_ray: bool = flag(False, "run the jobs one after another in this process (one machine, no Ray)")
    no_report: bool = flag(False, "do not write the analysis report at the end")


def parser() -> argparse.ArgumentParser:
    return store_parser(
        "bench",
        "Prefill speed (full against skip) of an existing experiment's checkpoints, one MLflow run per point, "
        "keyed by content and machine (what the store lacks only).",
        Bench,
        {
            "the grid: a named one, any of its settings overridden": SpeedFlags,
            "decoding under continuous arrivals": ArrivalFlags,
        },
    )


def parse_stages(text: str) -> tuple[str, ...]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    for stage in stages:
        if stage not in STAGE_NAMES:
            fail("--stages", text, f"comma-separated stages: {' | '.join(STAGE_NAMES)}")
    return tuple(distinct("--stages", text, stages))


def this_machine() -> list[tuple[float, float]]:
    return [(float(os.cpu_count() or 1), float(local_gpus()))]


def resources_of(
    options: Bench, nodes: list[tuple[float, float]], check_fit: bool = True, where: str = "this machine"
) -> tuple[float, float]:
    """(CPUs, GPUs) per job: the flags', else the defaults for these nodes ((CPUs, GPUs)
    each): without GPUs a node's CPUs (the smallest node's, so that a job fits every
    node), so one job at a time has a machine to itself; with GPUs one GPU and the CPUs
    that go with it on the node with the fewest per GPU. check_fit: a job must fit one of
    the nodes (Ray would wait forever for one that fits none)."""
    gpus = (
        parse_number("--gpus", options.gpus, 0, "a number >= 0")
        if options.gpus
        else float(any(g > 0 for _, g in nodes))
    )
    with_gpus = [(c, g) for c, g in nodes if g > 0]
    if check_fit and gpus > 0 and not with_gpus:
        fail("--gpus", options.gpus, f"0 here (no CUDA device on {where})")
    if options.cpus:
        cpus = parse_number("--cpus", options.cpus, 0, "a number > 0")
        if cpus == 0:
            fail("--cpus", options.cpus, "a number > 0")
    elif gpus > 0 and with_gpus:
        cpus = float(max(1, min(math.floor(c / g) for c, g in with_gpus)))
    else:
        cpus = float(min(c for c, _ in nodes))
    largest = max(c for c, _ in nodes)
    if check_fit and cpus > largest:
        fail("--cpus", options.cpus, f"at most {largest:g} (the CPUs of the largest node of {where})")
    return cpus, gpus


# ---- which checkpoints ------------------------------------------------------------------------
def select_checkpoints(checkpoints, stages: tuple[str, ...]) -> list:
    """The named stages' checkpoints, or by default the gated final ones: a gated
    checkpoint whose lineage no other checkpoint continues (each arm's last stage)."""
    present = sorted({c.stage for c in checkpoints}, key=STAGE_NAMES.index)
    if stages:
        missing = [s for s in stages if s not in present]
        if missing:
            fail("--stages", ",".join(stages), f"stages with checkpoints in this experiment: {', '.join(present)}")
        return [c for c in checkpoints if c.stage in stages]
    chosen = [
        c
        for c in checkpoints
        if get_stage(c.stage).gated
        and not any(
            len(o.lineage) > len(c.lineage) and tuple(o.lineage[: len(c.lineage)]) == tuple(c.lineage)
            for o in checkpoints
        )
    ]
    if not chosen:
        fail("--stages", "", f"stages to time (no gated stage has a checkpoint here; stages: {', '.join(present)})")
    return chosen


def check_points(grid: SpeedGrid, checkpoints) -> None:
    """Every policy applies to every chosen checkpoint (a gate threshold needs a gated
    stage), and varlen packing to their architecture (Mamba-2 only)."""
    from trainables.evaluation import applies

    for policy in parse_policies(grid.policies):
        for ck in checkpoints:
            if not applies(policy, ck.stage, ck.n_loops):
                gated = ", ".join(s for s in STAGE_NAMES if get_stage(s).gated)
                fail(
                    "--policies",
                    policy.spec,
                    f"policies that apply to stage {ck.stage} (a gate threshold needs a "
                    f"gated stage: {gated}; zero-shot rules such as skip-entropy:2.0 "
                    "apply to any)",
                )
    if grid.packing == "varlen":
        from looplab.checkpoint import read_model_config
        from trainables.storage import local_checkpoint

        for ck in checkpoints:
            arch = read_model_config(local_checkpoint(ck.path)).arch
            if arch != "mamba2":
                fail(
                    "--packing",
                    grid.packing,
                    f"auto | padded for {arch} checkpoints (varlen packs sequences into "
                    "one row, which attention layers cannot)",
                )


# ---- the plan ---------------------------------------------------------------------------------
def bench_jobs(
    grid: SpeedGrid,
    checkpoints,
    *,
    threads: int,
    uri: str,
    experiment: str,
    artifact_root: str,
    board: str = "",
    arrivals: ArrivalGrid | None = None,
):
    from trainables.bench import BenchJob

    points = tuple(grid.points())
    plan = arrivals.plan(grid.policies) if arrivals else None
    return [
        BenchJob(ck, points, grid.repeats, threads, uri, experiment, artifact_root, board, plan) for ck in checkpoints
    ]


def stored_counts(mc, experiment_id: str, jobs) -> dict[str, int]:
    """Per job, how many of its points the store holds FINISHED on this machine (the key
    names the machine that times it: another machine measures again)."""
    from trainables.bench import host_of, plan_keys, speed_key
    from trainables.keyed_step import BENCH_STEP

    done = BENCH_STEP.finished_keys(mc, experiment_id)
    counts = {}
    for job in jobs:
        host = host_of(job.threads)
        keys = [speed_key(job.checkpoint.weights_key, p, host, job.repeats) for p in job.points]
        if job.arrivals:
            keys += plan_keys(job.checkpoint.weights_key, job.arrivals, host).values()
        counts[job.label] = sum(key in done for key in keys)
    return counts


def describe(
    grid: SpeedGrid, jobs, stored: dict[str, int], cpus: float, gpus: float, arrivals: ArrivalGrid | None = None
) -> str:
    from trainables.bench import host_of

    plan = arrivals.plan(grid.policies) if arrivals else None
    n = len(grid.points()) + (len(plan.points) if plan else 0)
    total, have = n * len(jobs), sum(stored.values())
    host = host_of(jobs[0].threads) if jobs else {}
    lines = [
        f"speed sweep: {len(jobs)} checkpoint(s) × {n} point(s) = {total} measurement(s); {have} in the store "
        f"(FINISHED with the same speed_key on this machine: {', '.join(f'{k} {v}' for k, v in host.items())})",
        f"  grid: {grid.describe()}",
        *(
            [
                f"  arrivals: {arrivals.describe()}; {len(plan.points)} point(s) per "
                "checkpoint (full is each schedule's baseline)"
            ]
            if plan and arrivals
            else []
        ),
        f"  jobs: one per checkpoint, {cpus:g} CPU" + (f", {gpus:g} GPU" if gpus else "") + " each",
    ]
    for job in jobs:
        ck = job.checkpoint
        lines.append(
            f"  {job.label} ({job.method}, R={ck.n_loops}, {'+'.join(ck.lineage)}): {n} point(s), "
            f"{stored[job.label]} in the store"
        )
    lines.append("  points: " + ", ".join(f"b{p.batch} L{p.seq_len} {p.policy}" for p in grid.points()))
    if plan:
        lines.append("  arrivals points: " + ", ".join(f"s{p.slots} {p.schedule} {p.policy}" for p in plan.points))
    lines.append(f"  to measure now: {total - have}")
    return "\n".join(lines)


# ---- python -m sweeps.bench ---------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:

    args = parser().parse_args(argv)
    options, speed = flags_of(Bench, args), flags_of(SpeedFlags, args)
    try:
        storage, uri = options.located()
        grid = speed_grid_of(speed)
        arrivals = arrival_grid_of(flags_of(ArrivalFlags, args), speed.grid)
        stages = parse_stages(options.stages)
        # On a cluster (--address) the jobs' resources are checked against its nodes once Ray is up.
        cpus, gpus = resources_of(options, this_machine(), check_fit=not options.address or options.no_ray)
        mc, experiment_id, found, notes = experiment_checkpoints(
            options, storage, uri, dry_run=options.dry_run, ray=not options.no_ray
        )
        chosen = select_checkpoints(found, stages)
        check_points(grid, chosen)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    # The jobs, one per checkpoint, given the threads each gets (and the progress board)
    jobs_for = functools.partial(
        bench_jobs,
        grid,
        chosen,
        uri=uri,
        experiment=options.experiment,
        artifact_root=storage.path("mlflow"),
        arrivals=arrivals,
    )
    if options.dry_run:
        jobs = jobs_for(threads=max(1, round(cpus)))
        print(describe(grid, jobs, stored_counts(mc, experiment_id, jobs), cpus, gpus, arrivals))
        if options.address and not options.no_ray:
            print("  (resources: this machine's defaults; a run takes the cluster's nodes')")
        return 0
    status, records = run(options, grid, jobs_for, storage, cpus, gpus, arrivals)
    if records:
        print()
        print_summary(records)
    if status != 2 and not options.no_report:
        sweep = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: tracking.SWEEP})
        folder = storage.scratch() / "analysis" / f"{options.experiment}-speed"
        report = write_report(uri, options.experiment, sweep.info.run_id if sweep else None, folder)
        for name in ("speed.png", "arrivals.csv", "arrivals.png", "report.html"):
            if name in report:
                print(f"{name}: {report[name]}")
    return status


def run(options: Bench, grid: SpeedGrid, jobs_for, storage, cpus: float, gpus: float, arrivals: ArrivalGrid | None):
    """Every job (in this process with --no-ray, else as Ray tasks), with a progress line
    per checkpoint. Returns (exit status: 0, 1 when a job failed, 2 when the cluster
    cannot hold a job; the records, in the plan's order)."""
    from trainables.progress import board_name

    inline = options.no_ray
    if not inline:
        import ray

        logs = storage.scratch() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with console_to_log(logs / "ray.log"):  # Ray's own output to the log; the jobs post their progress to a board
            ray.init(
                address=options.address or None, include_dashboard=None, log_to_driver=False, configure_logging=False
            )
    try:
        if not inline and options.address:
            import ray

            nodes = [
                (n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0)) for n in ray.nodes() if n.get("Alive")
            ]
            try:
                cpus, gpus = resources_of(options, nodes, where=f"the cluster at {options.address}")
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2, []
        board = "" if inline else board_name(f"speed-{options.experiment}")
        jobs = jobs_for(threads=max(1, round(cpus)), board=board)
        where = "in this process" if inline else f"{cpus:g} CPU" + (f", {gpus:g} GPU" if gpus else "") + " each"
        per_job = f"{len(grid.points())}" + (f" + {len(jobs[0].arrivals.points)} arrivals" if arrivals and jobs else "")
        print(
            f"timing {per_job} point(s) on each of {len(jobs)} checkpoint(s), one job per checkpoint ({where})",
            file=sys.stderr,
            flush=True,
        )
        records, failed = _run_jobs(jobs, cpus, gpus, inline, board)
    finally:
        if not inline:
            import ray

            ray.shutdown()
    order = {job.label: i for i, job in enumerate(jobs)}
    records.sort(key=lambda r: order[r["checkpoint"]])  # as the plan lists them, whichever finished first
    return (1 if failed else 0), records


def _run_jobs(jobs, cpus: float, gpus: float, inline: bool, board: str) -> tuple[list[dict], int]:
    """Run the jobs (keyed steps), printing a line per checkpoint as it finishes, its
    points' lines from the board before it: (the records, how many jobs failed)."""
    from trainables.bench import run_bench_job
    from trainables.keyed_step import run_jobs
    from trainables.progress import Printer

    records, failed = [], 0
    with Printer(board) if board else contextlib.nullcontext() as printer:
        for i, (job, result) in enumerate(run_jobs(run_bench_job, jobs, cpus=cpus, gpus=gpus, inline=inline), start=1):
            if printer is not None:
                printer.flush()  # the job's points before its summary line
            if isinstance(result, BaseException):
                failed += 1
                print(
                    f"[{i}/{len(jobs)}] {job.label} failed: {type(result).__name__}: {result}",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            reused = sum(r["reused"] for r in result)
            print(
                f"[{i}/{len(jobs)}] {job.label} ({job.method}): {len(result) - reused} measured, {reused} reused",
                file=sys.stderr,
                flush=True,
            )
            records += result
    return records, failed


if __name__ == "__main__":
    sys.exit(main())
