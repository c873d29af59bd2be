"""build_report: MLflow runs → every file of the analysis, in one call.

    from analysis.report import ReportOptions, build_report
    paths = build_report(uri, ["beta_ablation-local"], "runs/beta/analysis", ReportOptions(sweep_run_id=run_id))

writes into out_dir:
  axis.csv               the sweep's searched axis first (analysis/axis.py): per value, the final stage's
                         quality at full depth with its seed interval, β diagnostics, skip at the
                         representative q; absent when the runs vary nothing but the seed
  points.csv             the evaluation-points table (one row per trial × stage × point)
  aggregated.csv         the same, seeds pooled per configuration (mean, std, t-interval, n)
  frontier.csv           the frontier's input points (seeds pooled) with on_frontier flags
  frontier_areas.csv     the signed area between every two series' frontiers
  budget.csv             the best point under --budget, overall and per series (when given)
  tables/*.md, *.csv     the paper-shaped tables (analysis.tables), tables.md all in one
  downstream.csv         Fig. 3's points (downstream Avg. against executed loops on the tasks, per arm)
  zoo.csv                each zero-shot exit rule's frontier against the learned gate's (area, mean gap)
  loops.csv              the per-loop instruments (analysis/per_loop.py)
  speed.csv              timed prefill points beside the stage's perplexity (analysis/bench.py; speed runs only)
  depth_fit.csv          a loop's worth in layers, γ of loss ≈ a + b·log(N·R^γ) with its interval, per
                         experiment and arch (analysis/depth_fit.py; pre-training at ≥ 2 N and ≥ 2 R)
  scan.csv, scan.md      a scan's effects along its axes (analysis/scan.py; scan.png, scan_<axis>.png)
  *.png                  axis.png, frontier.png, downstream.png (Fig. 3), zoo.png, skip_ppl.png,
                         beta_exit_entropy.png, beta_expected_exit_step.png, loops_*.png, speed.png,
                         depth_fit.png
  report.html            one interactive page with all of it; its header says which sweep(s) it covers
  plotly.min.js          plotly.js, which report.html loads from its folder (the folder is self-contained)
  notes.txt              what was skipped and why
and logs them as artifacts (folder `analysis`) of the sweep run: `sweep_run_id`, or
the newest run tagged level=sweep in the experiments. Returns {file name: path}.

With strict=False (what sweeps call) a missing metric never raises: what the data
supports is written and notes.txt says what was skipped. strict=True (the CLI) raises
AnalysisError when the asked-for compute or quality exists in no run or not in every
experiment (mixed schemas), or when no run has an evaluation metric at all.

The package, one module per job:
  build          build_report and its ReportOptions: runs the sections in the page's order, writes
                 the page and notes
  assemble       the page itself: sections, notes, the charts' data and scripts (page.html.j2)
  context        ReportContext: the runs, output folder and settings every section reads, and
                 the files, charts and notes they add to; write_csv
  quality        the compute and quality axes: CLI names, labels, directions, `auto`, checks
  render         the jinja2 environment over templates/*.html.j2 (autoescape on)
  wording        counts in words for captions
  coverage       the header's first lines: the one sweep the page covers, or each sweep it pools
  artifacts      the written files as MLflow artifacts of the sweep run
  one module per section, in the page's order:
    scan (a scan's effects), searched_axis (with findings: "What this sweep found"), beta,
    frontier (areas, budget), downstream (Fig. 3), zoo, skip (Fig. 2), paper_tables, depth,
    loops, speed (prefill speed; decoding under arrivals)
"""

from analysis.report.artifacts import ARTIFACT_DIR, newest_sweep_run
from analysis.report.build import ReportOptions, build_report
from analysis.report.context import ReportContext, write_csv
from analysis.report.frontier import AXIS_VALUES, MAX_AREA_SERIES
from analysis.report.quality import BASE_VALUES, COMPUTE_AXES, QUALITY_LABELS

__all__ = [
    "ReportOptions",
    "ARTIFACT_DIR",
    "AXIS_VALUES",
    "BASE_VALUES",
    "COMPUTE_AXES",
    "MAX_AREA_SERIES",
    "QUALITY_LABELS",
    "ReportContext",
    "build_report",
    "newest_sweep_run",
    "write_csv",
]
