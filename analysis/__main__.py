"""The command line of the analysis layer, its one entry point (`python -m analysis`;
`python analysis/frontier.py` runs it too):

    python -m analysis --tracking-uri sqlite:///runs/beta/mlflow.db \\
        --experiment beta_ablation-local --out runs/beta/analysis

Writes frontier.csv, the tables (Markdown + CSV), the PNGs and report.html into --out,
logs them as artifacts of the sweep run (--sweep-run, else the newest level=sweep run
of the experiments) unless --no-log, and prints where everything is. A problem with
the input (unknown experiment, a metric no run logged, mixed schemas that make the
asked-for analysis impossible) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from analysis.errors import AnalysisError
from analysis.tables import REPRESENTATIVE_Q
from looplab.arguments import Parser
from looplab.tracking import EXECUTED_LOOPS


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m analysis", description="Frontiers, tables, plots and an HTML report from looplab's MLflow runs."
    )
    p.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", ""),
        help="MLflow URI, e.g. sqlite:///runs/beta/mlflow.db (default $MLFLOW_TRACKING_URI)",
    )
    p.add_argument(
        "--experiment",
        action="append",
        default=[],
        metavar="NAME",
        help="experiment name, e.g. beta_ablation-local (repeatable)",
    )
    p.add_argument(
        "--sweep-run",
        default=None,
        metavar="ID",
        help="the sweep's parent run: artifacts go there; with --scope sweep only its trials are read",
    )
    p.add_argument(
        "--scope",
        choices=("experiment", "sweep"),
        default="experiment",
        help="read every run of the experiments (default) or only the --sweep-run subtree",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument(
        "--compute",
        default=EXECUTED_LOOPS,
        help="x axis: executed_loops | downstream_loops | flops | time | any points.csv column (default "
        "executed_loops; with an lm-eval quality, the loops executed on the tasks when they were logged)",
    )
    p.add_argument(
        "--quality",
        default="auto",
        help="y axis: auto | accuracy | ppl | loss | lm_eval_avg | lm_eval.<task> | <x>_best",
    )
    p.add_argument(
        "--stage",
        default=None,
        help="stage whose evaluations form the frontier (default: each trial's "
        "final stage; 'all': every stage as its own series)",
    )
    p.add_argument(
        "--series-by",
        action="append",
        default=None,
        metavar="COLUMN",
        help="split series by these columns (repeatable; default method and policy), e.g. --series-by params.hole.hp",
    )
    p.add_argument(
        "--best-of-seeds",
        action="store_true",
        help="per configuration, the seed with the best full-depth quality (paper, Mano and p-hop)",
    )
    p.add_argument("--confidence", type=float, default=0.95, help="Student-t interval over seeds (default 0.95)")
    p.add_argument("--budget", type=float, default=None, help="also report the best point with compute <= BUDGET")
    p.add_argument(
        "--representative-q",
        type=float,
        default=REPRESENTATIVE_Q,
        help=f"Table 4 shows each gated method at this q beside its best-Avg. q (default "
        f"{REPRESENTATIVE_Q:g}, the paper's); a negative value leaves it out",
    )
    p.add_argument("--all-statuses", action="store_true", help="keep unfinished trials (default: FINISHED only)")
    p.add_argument("--no-log", action="store_true", help="do not log the files as MLflow artifacts")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from analysis.report import build_report  # after parsing: --help stays instant
    from looplab import destinations
    from looplab.errors import ConfigError

    try:
        destinations.existing_store("--tracking-uri", args.tracking_uri)
        destinations.output_dir("--out", args.out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        paths = build_report(
            args.tracking_uri,
            args.experiment,
            args.out,
            sweep_run_id=args.sweep_run,
            log_artifacts=not args.no_log,
            compute=args.compute,
            quality=args.quality,
            stage=args.stage,
            series_by=args.series_by,
            best_of_seeds=args.best_of_seeds,
            confidence=args.confidence,
            budget=args.budget,
            scope=args.scope,
            statuses=None if args.all_statuses else ("FINISHED",),
            strict=True,
            representative_q=args.representative_q if args.representative_q >= 0 else None,
        )
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    notes = paths["notes.txt"].read_text().splitlines()
    for note in notes:
        print(f"note: {note}")
    width = max(len(k) for k in paths)
    for name, path in paths.items():
        print(f"{name.ljust(width)}  {path}")
    budget = paths.get("budget.csv")
    if budget is not None:
        print(f"\nbest under the budget ({budget}):\n{budget.read_text()}", end="")
    print(f"\nopen {paths['report.html']} in a browser (no network needed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
