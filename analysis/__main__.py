"""The command line of the analysis layer, its one entry point (`python -m analysis`;
`python analysis/frontier.py` runs it too):

    python -m analysis --tracking-uri sqlite:///runs/beta/mlflow.db \\
        --experiment beta_ablation-local --out runs/beta/analysis

Writes frontier.csv, the tables (Markdown + CSV), the PNGs and report.html into --out,
logs them as artifacts of the sweep run (--sweep-run, else the newest level=sweep run
of the experiments) unless --no-log, and prints where everything is. It reads every run
of the experiments, or with --sweep-run ID that one sweep's runs alone; the page's
header says which sweeps it covers. A problem with
the input (unknown experiment, a metric no run logged, mixed schemas that make the
asked-for analysis impossible) is one line on stderr and exit status 2.
"""

# No `from __future__ import annotations`: `python analysis/frontier.py` runs this module
# by runpy.run_module as __main__ while sys.modules["__main__"] is frontier.py, where
# add_flags (typing.get_type_hints) could not resolve Report's annotations written as strings.
import argparse
import os
import sys
from dataclasses import dataclass
from typing import Literal

from analysis.errors import AnalysisError
from analysis.tables import REPRESENTATIVE_Q
from looplab.arguments import Parser, add_flags, flag, flags_of
from looplab.tracking import EXECUTED_LOOPS

Scope = Literal["experiment", "sweep"]


@dataclass(frozen=True, kw_only=True)  # kw_only: the required --out among the others, in --help's order
class Report:
    """python -m analysis's options, each field its flag."""

    tracking_uri: str = flag(
        "",
        "MLflow URI, e.g. sqlite:///runs/beta/mlflow.db (default $MLFLOW_TRACKING_URI)",
        unset=None,  # from_args: the environment's when the command runs
    )
    experiment: list[str] = flag(
        help="experiment name, e.g. beta_ablation-local (repeatable)", repeat=True, metavar="NAME"
    )
    sweep_run: str | None = flag(
        None,
        "one sweep's parent run: only that sweep's runs are read (its trials, their stages, the stages they "
        "reused) and the files become its artifacts",
        metavar="ID",
    )
    scope: Scope | None = flag(
        None,
        "sweep: only the --sweep-run's runs (the default with --sweep-run); experiment: every run of the "
        "experiments (the default without), the files still logged to --sweep-run",
    )
    out: str = flag(help="output folder", metavar="DIR")
    compute: str = flag(
        EXECUTED_LOOPS,
        "x axis: executed_loops | downstream_loops | flops | time | any points.csv column (default "
        "executed_loops; with an lm-eval quality, the loops executed on the tasks when they were logged)",
    )
    quality: str = flag("auto", "y axis: auto | accuracy | ppl | loss | lm_eval_avg | lm_eval.<task> | <x>_best")
    stage: str | None = flag(
        None,
        "stage whose evaluations form the frontier (default: each trial's final stage; 'all': every stage "
        "as its own series)",
    )
    series_by: list[str] = flag(
        help="split series by these columns (repeatable; default method and policy), e.g. --series-by params.hole.hp",
        repeat=True,
        metavar="COLUMN",
    )
    best_of_seeds: bool = flag(
        False, "per configuration, the seed with the best full-depth quality (paper, Mano and p-hop)"
    )
    confidence: float = flag(0.95, "Student-t interval over seeds")
    budget: float | None = flag(None, "also report the best point with compute <= BUDGET")
    representative_q: float = flag(
        REPRESENTATIVE_Q,
        f"Table 4 shows each gated method at this q beside its best-Avg. q (default {REPRESENTATIVE_Q:g}, "
        "the paper's); a negative value leaves it out",
    )
    all_statuses: bool = flag(False, "keep unfinished trials (default: FINISHED only)")
    no_log: bool = flag(False, "do not log the files as MLflow artifacts")

    def report_options(self):
        """What build_report is asked (a strict reading: a missing metric is an error)."""
        from analysis.report import ReportOptions

        return ReportOptions(
            sweep_run_id=self.sweep_run,
            log_artifacts=not self.no_log,
            compute=self.compute,
            quality=self.quality,
            stage=self.stage,
            series_by=tuple(self.series_by) or None,
            best_of_seeds=self.best_of_seeds,
            confidence=self.confidence,
            budget=self.budget,
            scope=resolved_scope(self.scope, self.sweep_run),
            statuses=None if self.all_statuses else ("FINISHED",),
            strict=True,
            representative_q=self.representative_q if self.representative_q >= 0 else None,
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Report":
        uri = os.environ.get("MLFLOW_TRACKING_URI", "") if args.tracking_uri is None else args.tracking_uri
        return flags_of(cls, args, tracking_uri=uri, scope=resolved_scope(args.scope, args.sweep_run))


def resolved_scope(scope: Scope | None, sweep_run: str | None) -> Scope:
    """--scope as given, else one sweep's runs with --sweep-run, every run of the experiments without."""
    return scope or ("sweep" if sweep_run else "experiment")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m analysis", description="Frontiers, tables, plots and an HTML report from looplab's MLflow runs."
    )
    add_flags(p, Report)
    return p


def main(argv: list[str] | None = None) -> int:
    options = Report.from_args(parser().parse_args(argv))
    from analysis.report import build_report  # after parsing: --help stays instant
    from looplab import destinations
    from looplab.errors import ConfigError

    try:
        destinations.existing_store("--tracking-uri", options.tracking_uri)
        destinations.output_dir("--out", options.out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        paths = build_report(options.tracking_uri, options.experiment, options.out, options.report_options())
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
