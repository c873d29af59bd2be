"""Per-trial platform overhead (Tune, MLflow, a Ray Train worker group if any)
against compute, and CPU utilisation, for a real sweep run through the platform.

    python benchmarks/platform_overhead.py --preset debug     # one β-ablation trial (pretrain → Stage-1)
    python benchmarks/platform_overhead.py --preset local
    python benchmarks/platform_overhead.py --preset local -- sweeps/iso_flops.py --pairs 2x4

Compute is the time inside looplab's train() in the workers (model and data
setup, steps, evaluations, checkpoints: what `looplab train` does alone), minus
the MLflow and Ray Train calls made from inside it. Everything else a trial spends
is overhead: MLflow runs, Tune, and with --num-workers K >= 1 starting the stage's
Ray Train worker group (none in the default local mode: the trial's process
trains). The sweep's own start (Ray, the MLflow store) and end are reported apart,
once per sweep. CPU utilisation is sampled from /proc/stat (all CPUs) while the
sweep runs.
Run it on a quiet machine: other load inflates every figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from looplab.arguments import Parser, add_flags, flag, flags_of, given, one_of
from looplab.presets import PRESETS

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    preset: str = flag("debug", "the sweep's --preset", type=one_of(*sorted(PRESETS)), metavar="PRESET")
    storage_path: str | None = flag(None, "the sweep's storage (default: a temporary folder)", type=given("a folder"))
    json: str | None = flag(None, "write the figures here")
    sweep: list[str] = flag(
        help="sweep script and flags (default: sweeps/beta_ablation.py --betas 0.1)", positional=True
    )


def cpu_sampler(stop: threading.Event, samples: list[float], every: float = 1.0) -> None:
    def read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    total0, idle0 = read()
    while not stop.wait(every):
        total1, idle1 = read()
        if total1 > total0:
            samples.append(1.0 - (idle1 - idle0) / (total1 - total0))
        total0, idle0 = total1, idle1


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args())

    storage = Path(opts.storage_path or tempfile.mkdtemp(prefix="looplab-overhead-"))
    uri = f"sqlite:///{storage / 'mlflow.db'}"
    sweep = opts.sweep or ["sweeps/beta_ablation.py", "--betas", "0.1"]
    cmd = [
        sys.executable,
        str(REPO / sweep[0]),
        *sweep[1:],
        "--preset",
        opts.preset,
        "--storage-path",
        str(storage),
        "--tracking-uri",
        uri,
    ]
    print("running:", " ".join(cmd), file=sys.stderr)

    samples: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=cpu_sampler, args=(stop, samples), daemon=True)
    sampler.start()
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    if done.returncode != 0:
        sys.exit(f"the sweep failed ({done.returncode}):\n{done.stderr[-3000:]}")

    figures = measure(uri, wall)
    figures.update(
        preset=opts.preset,
        command=" ".join(cmd),
        cpu_utilisation=sum(samples) / max(1, len(samples)),
        cpu_samples=len(samples),
    )
    report(figures)
    if opts.json:
        Path(opts.json).write_text(json.dumps(figures, indent=2) + "\n")


def measure(uri: str, wall: float) -> dict:
    """Per trial: its wall time, its compute (train() in the workers), its
    overhead; per sweep: the time outside every trial and shared stage."""
    from looplab import tracking

    mc = tracking.client(uri)
    experiments = [e.experiment_id for e in mc.search_experiments()]
    runs = mc.search_runs(experiments, max_results=10_000)
    seconds = lambda r: (r.info.end_time - r.info.start_time) / 1000.0  # noqa: E731

    def compute_of(stage_runs) -> tuple[float, float]:
        """(compute, platform calls inside train()) over the stages trained in these runs."""
        compute = calls = 0.0
        for r in stage_runs:
            if r.data.tags.get(tracking.REUSED) == "true":  # trained elsewhere; its run only carries the figures
                continue
            m = r.data.metrics
            if tracking.STAGE_SECONDS in m:
                inside = m.get(tracking.MLFLOW_SECONDS, 0.0) + m.get(tracking.REPORT_SECONDS, 0.0)
                compute += m[tracking.STAGE_SECONDS] - inside
                calls += inside
        return compute, calls

    stages = [r for r in runs if r.data.tags.get(tracking.LEVEL) == tracking.STAGE]
    by_parent: dict[str, list] = {}
    for r in stages:
        by_parent.setdefault(r.data.tags.get(tracking.PARENT_RUN_TAG, ""), []).append(r)
    trials = []
    for t in (r for r in runs if r.data.tags.get(tracking.LEVEL) == tracking.TRIAL):
        compute, calls = compute_of(by_parent.get(t.info.run_id, []))
        trials.append(
            {
                "trial": t.info.run_name,
                "wall_s": seconds(t),
                "compute_s": compute,
                "in_train_calls_s": calls,
                "overhead_s": seconds(t) - compute,
                "overhead_frac": (seconds(t) - compute) / seconds(t),
            }
        )
    sweep_runs = [r for r in runs if r.data.tags.get(tracking.LEVEL) == tracking.SWEEP]
    shared = [r for s in sweep_runs for r in by_parent.get(s.info.run_id, [])]  # stages trained before the trials
    shared_compute, _ = compute_of(shared)
    shared_wall = sum(seconds(r) for r in shared)
    busy = sum(t["wall_s"] for t in trials) + shared_wall
    return {
        "sweep_wall_s": wall,
        "trials": trials,
        "shared_stages_wall_s": shared_wall,
        "shared_stages_compute_s": shared_compute,
        "total_compute_s": shared_compute + sum(t["compute_s"] for t in trials),
        "outside_trials_s": wall - busy if len(trials) == 1 and not shared else None,
    }


def difference(seconds: float, width: int = 0) -> str:
    """A time that is a difference of two timings (a span less what ran inside it): never
    shown negative, which says only that the two clocks disagree (load, or skew)."""
    return f"{seconds:{width}.1f}" if seconds >= 0 else f"{'n/a (<0: clocks disagree)':>{width}s}"


def report(f: dict) -> None:
    print(f"\nplatform overhead, preset {f['preset']}: {f['command']}")
    print(f"{'trial':36s} {'wall s':>8s} {'compute s':>10s} {'overhead s':>11s} {'overhead':>9s}")
    for t in f["trials"]:
        share = f"{100 * t['overhead_frac']:8.1f}%" if t["overhead_s"] >= 0 else ""
        print(f"{t['trial']:36s} {t['wall_s']:8.1f} {t['compute_s']:10.1f} {difference(t['overhead_s'], 11)} {share}")
    if f["shared_stages_wall_s"]:
        print(
            f"shared stages (trained before the trials): wall {f['shared_stages_wall_s']:.1f} s, "
            f"compute {f['shared_stages_compute_s']:.1f} s"
        )
    print(
        f"sweep wall {f['sweep_wall_s']:.1f} s; compute of every stage trained, summed: "
        f"{f['total_compute_s']:.1f} s (concurrent trials overlap, so the sum may exceed the wall)"
    )
    if f["outside_trials_s"] is not None:
        print(f"outside the trial (Ray start, Tune, shutdown, summary): {difference(f['outside_trials_s'])} s")
    print(
        f"CPU utilisation during the sweep: {100 * f['cpu_utilisation']:.0f}% of all CPUs ({f['cpu_samples']} samples)"
    )


if __name__ == "__main__":
    main()
