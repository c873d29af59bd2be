"""Fig. 3: downstream average accuracy against the loops executed on the tasks
(downstream.csv, downstream.png)."""

from __future__ import annotations

import polars as pl

from analysis.charts import bars_phrase, downstream_rows, frontier_chart
from analysis.report.context import ReportContext, Section
from analysis.report.frontier import FRONTIER_LEAD, flag_frontier
from analysis.report.render import render
from looplab import tracking

# downstream.csv's columns, those the rows have, in this order: frontier.csv's lead but
# the metric names (one quality, one compute here), the spread and the trial's hash.
DOWNSTREAM_COLUMNS = [
    c for c in FRONTIER_LEAD if c not in ("compute_metric", "quality_metric", "quality_std", "trial_config_hash")
]


def downstream_section(ctx: ReportContext, agg: pl.DataFrame) -> list[Section]:
    """Fig. 3's chart and points; nothing (a note) without downstream evaluations."""
    rows = downstream_rows(agg)
    if rows is None:
        ctx.note(
            "downstream accuracy (Fig. 3): skipped, no downstream evaluations with executed loops "
            "(lm_eval.* and lm_eval_loops.*: --eval-tasks, or python -m sweeps.evaluate)"
        )
        return []
    flagged = flag_frontier(rows, tracking.LM_EVAL_LOOPS, tracking.LM_EVAL_AVG)
    ctx.csv(flagged.select([c for c in DOWNSTREAM_COLUMNS if c in flagged.columns]), "downstream.csv")
    spec = frontier_chart(
        flagged,
        tracking.LM_EVAL_LOOPS,
        tracking.LM_EVAL_AVG,
        name="downstream",
        compute_label="executed loops per token on the tasks",
        quality_label="downstream average accuracy",
        title="Downstream accuracy against executed loops (Fig. 3)",
    )
    ctx.chart(spec)
    body = render("downstream.html.j2", bars=bars_phrase(spec, "seed intervals"))
    return [("Downstream accuracy against compute", body)]
