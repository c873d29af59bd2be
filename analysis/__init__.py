"""looplab's analysis layer: MLflow runs → polars tables → frontiers → plots and a report.

    from analysis.report import build_report
    paths = build_report("sqlite:///runs/beta/mlflow.db", ["beta_ablation-local"], "runs/beta/analysis")

Modules, one job each:
  names      the analysis' own column names, orderings and directions (the MLflow names it
             reads are looplab/tracking/'s; policy labels are looplab/policy.py's ExitPolicy)
  sources    MLflow's SQL tables (one query per table) or MlflowClient pages, as long frames
  load       MLflow store → RunSet (runs table, last and best per metric, histories)
  points     RunSet → the evaluation-points table (trial × stage × policy point)
  aggregate  seeds → mean, std, t-interval (scipy's Student t), or best-of-seeds
  frontier   Pareto frontiers, the area between two frontiers, the best point under a budget
  tables     the paper's tables as Markdown and CSV (Table 4 in gate_tables, the Table and
             its cells in table_parts)
  speed      the speed sweep's timed points joined by stage key to the stage's perplexity
  depth_fit  what a loop is worth in layers: γ of loss ≈ a + b·log(N·R^γ) over pre-trainings
  charts     what each figure shows, as data (drawn by plots and by the page)
  plots      PNG figures (matplotlib, Agg)
  page       ChartSpec → Plotly figures (small multiples past a handful of colours); the page's
             CSS and scripts (report/assemble.py lays out the page: Plotly offline, plotly.js
             a file beside it, the folder self-contained, no CDN)
  claims     the paper's claims judged (claim_rules, curves, verdicts and claim_families
             beside it; every claim name imports from here)
  report     build_report(): every file above, plus MLflow artifacts (a package: one module
             per section, jinja2 templates for the page's HTML)
  __main__   the command line: `python -m analysis ...` (also `python analysis/frontier.py ...`)
  screenshot open a report in headless Chromium and check that Plotly drew it

polars is imported at module top here (unlike looplab/, which must run without it);
matplotlib, plotly and scipy inside the functions that use them (about 1.5 s of imports
together, which a CLI run that stops at a bad experiment name should not pay).
"""
