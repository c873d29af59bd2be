"""The policy zoo: each zero-shot exit rule's frontier beside the learned gate's of the
same method and execution (zoo.csv, zoo.png). Does the gate earn its training?"""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.charts import frontier_chart, zoo_rows
from analysis.errors import AnalysisError
from analysis.frontier import frontier_gap
from analysis.report.context import ReportContext, Section
from analysis.report.frontier import flag_frontier
from analysis.report.quality import COMPUTE_AXES, QUALITY_LABELS, maximize, quality_label
from analysis.report.render import render
from looplab import tracking

GAPS_SCHEMA = {
    "method": pl.String,
    "rule": pl.String,
    "gate": pl.String,
    "area": pl.Float64,
    "mean_gap": pl.Float64,
    "compute_from": pl.Float64,
    "compute_to": pl.Float64,
    "note": pl.String,
}


def zoo_section(ctx: ReportContext, agg: pl.DataFrame, quality: str) -> list[Section]:
    """The rules' and gates' frontiers and the area between each pair; nothing (a note)
    when no final stage evaluated a zero-shot rule."""
    found = zoo_axes(agg, quality)
    rows = zoo_rows(agg, *found) if found else None
    if found is None or rows is None:
        ctx.note(
            "policy zoo: skipped, no zero-shot exit rule evaluated on a final stage "
            "(metrics like skip_entropy2.5_*, dense_kl0.01_*)"
        )
        return []
    compute_col, zoo_quality = found
    flagged = flag_frontier(rows, compute_col, zoo_quality)
    table = rule_gaps(flagged, maximize(zoo_quality))
    ctx.csv(table, "zoo.csv")
    label = quality_label(zoo_quality)
    downstream = compute_col == tracking.LM_EVAL_LOOPS
    spec = frontier_chart(
        flagged,
        compute_col,
        zoo_quality,
        name="zoo",
        compute_label=COMPUTE_AXES["downstream_loops" if downstream else tracking.EXECUTED_LOOPS][1],
        quality_label=label,
        title=f"Exit rules against the learned gate ({label})",
    )
    ctx.chart(spec)
    return [("Policy zoo: zero-shot exit rules against the learned gate", render("zoo.html.j2", gaps=table))]


def zoo_axes(agg: pl.DataFrame, quality: str) -> tuple[str, str] | None:
    """The axes the rules were measured on: downstream when they were evaluated on tasks,
    else the validation set's, in the report's quality when they have it."""
    rules = agg.filter(pl.col("is_final_stage") & pl.col("policy").str.contains("-", literal=True))
    axes = [(tracking.LM_EVAL_LOOPS, tracking.LM_EVAL_AVG)] + [
        (tracking.EXECUTED_LOOPS, q)
        for q in dict.fromkeys((quality, tracking.ACCURACY, tracking.PPL, tracking.LOSS))
        if q in QUALITY_LABELS and q != tracking.LM_EVAL_AVG
    ]
    return next(
        (
            (c, q)
            for c, q in axes
            if c in rules.columns
            and q in rules.columns
            and rules.filter(pl.col(c).is_not_null() & pl.col(q).is_not_null()).height
        ),
        None,
    )


def rule_gaps(flagged: pl.DataFrame, maximize: bool) -> pl.DataFrame:
    """Per zero-shot rule: the area between its method's learned gate's frontier and its own."""
    groups = {name[0]: g for name, g in flagged.group_by("series", maintain_order=True)}
    gaps = []
    for series, group in groups.items():
        method, _, policy = series.partition(" · ")
        if not names.is_rule_policy(policy):
            continue
        execution = policy.split("-", 1)[0]
        gate = f"{method} · {execution}"
        row = {"method": method, "rule": policy, "gate": gate, "area": None, "mean_gap": None}
        row |= {"compute_from": None, "compute_to": None, "note": ""}
        if gate not in groups:
            row["note"] = f"no learned gate under {execution} in {method}"
        else:
            try:
                gap = frontier_gap(groups[gate], group, "compute", "quality", maximize=maximize)
            except AnalysisError as e:
                row["note"] = str(e)
            else:
                row |= {"area": gap["area"], "mean_gap": gap["mean_gap"], "compute_from": gap["lo"]}
                row |= {"compute_to": gap["hi"], "note": _verdict(gap["area"])}
        gaps.append(row)
    return pl.DataFrame(gaps, schema=GAPS_SCHEMA)


def _verdict(area: float) -> str:
    """Which of the two frontiers is better, from the sign of the area between them."""
    return "the gate is better" if area > 0 else "the rule is better" if area < 0 else "a tie"
