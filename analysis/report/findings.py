"""The searched axis' "What this sweep found": sentences generated from its table
(analysis/prose.py), against the pre-trained model every trial starts from."""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.points import shared_once
from analysis.prose import Arm, findings
from analysis.report.quality import QUALITY_LABELS, maximize
from analysis.report.render import render
from looplab import tracking
from looplab.policy import FULL


def findings_html(agg, full, keys, quality, qlabel, title, confidence) -> str:
    """'What this sweep found' for the full-depth rows of the searched axis."""

    def arms(column: str, lo: str | None, hi: str | None) -> list[Arm]:
        rows = full.filter(pl.col(column).is_not_null())
        return [
            Arm(
                " · ".join(f"{k}={r[k]}" if k != "method" else str(r[k]) for k in keys),
                float(r[column]),
                r.get(lo) if lo else None,
                r.get(hi) if hi else None,
                int(r["n_seeds"]),
            )
            for r in rows.iter_rows(named=True)
        ]

    others = tuple(
        (QUALITY_LABELS[c], arms(c, *names.interval_of(c)))
        for c in (tracking.ACCURACY, tracking.PPL)
        if c != quality and c in full.columns and full[c].is_not_null().any()
    )
    final = ", ".join(names.ordered_stages(full["stage"].drop_nulls().unique().to_list()))
    sentences = findings(
        arms(quality, *names.interval_of(quality)),
        measure=qlabel,
        axis=title,
        higher_is_better=bool(maximize(quality)),
        baseline=baseline(agg, quality),
        others=others,
        confidence=confidence,
        result=f"final-stage ({final}) result",
    )
    return render("findings.html.j2", sentences=" ".join(sentences))


def baseline(agg: pl.DataFrame, quality: str) -> Arm | None:
    """The model the searched stages start from: the one pre-trained (gateless, not final)
    stage configuration every trial shares, at full depth; None when there is not exactly one."""
    from looplab.stages import STAGES

    gateless = [s for s, stage in STAGES.items() if not stage.gated]
    rows = shared_once(
        agg.filter(
            pl.col("stage").is_in(gateless)
            & ~pl.col("is_final_stage")
            & (pl.col("policy") == FULL)
            & pl.col(quality).is_not_null()
        )
    )
    if rows.height != 1:
        return None
    r = rows.row(0, named=True)
    low, high = names.interval_of(quality)
    return Arm(f"the pre-trained model ({r['stage']})", float(r[quality]), r.get(low), r.get(high), int(r["n_seeds"]))
