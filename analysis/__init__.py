"""looplab's analysis layer: MLflow runs → polars tables → frontiers → plots and a report.

    from analysis.report import build_report
    paths = build_report("sqlite:///runs/beta/mlflow.db", ["beta_ablation-debug"], "runs/beta/analysis")

Modules, one job each:
  names      the metric and tag names this layer reads (lm-eval conventions included)
  load       MLflow store → RunSet (runs, metric summaries) and the evaluation-points table
  aggregate  seeds → mean, std, t-interval, or best-of-seeds
  frontier   Pareto frontiers, the area between two frontiers, the best point under a budget
  tables     the paper's tables as Markdown and CSV
  plots      PNG figures (matplotlib, Agg)
  report     one self-contained interactive HTML page, and build_report() that writes everything
  cli        `python analysis/frontier.py ...`
  screenshot open a report in headless Chromium and check that it rendered

polars is imported at module top here (unlike looplab/, which must run without it).
"""
