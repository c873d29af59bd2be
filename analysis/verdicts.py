"""A claim's verdict: its figure over seeds, its test, and Holm's correction over a
declared family; the verdicts as a table and as markdown.

No polars at this module's top (the GPU image judges claims without it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

from analysis.claim_rules import CLAIMS, DESCRIPTIVE, INCONCLUSIVE, NO_SPREAD, NOT_REPRODUCED, REPRODUCED, Claim
from analysis.stats import CONFIDENCE, Interval, holm

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class ClaimResult:
    """A claim's figure over seeds and its verdict. tested: the interval on the scale the
    claim is tested on, at the claim's confidence (Claim.shown gives the one shown);
    unmatched: where the verdict reads a step-matched comparison, the same figure
    against the unmatched arm, shown beside it and never judged; p: the claim's test
    (the t test, or Fisher's exact test on held-out counts where seeds do not vary at
    all: exact). A family-wise correction (correct) fills p_adjusted and adjusted (the
    interval at the level Holm's procedure shows it at) and sets verdict to the
    corrected one, keeping raw_verdict, the uncorrected."""

    claim: Claim
    tested: Interval
    verdict: str
    detail: str = ""  # which arms, at which loops, what was left out
    unmatched: Interval | None = None
    unmatched_detail: str = ""
    p: float | None = None
    exact: bool = False
    p_adjusted: float | None = None
    adjusted: Interval | None = None
    raw_verdict: str | None = None

    @property
    def interval(self) -> Interval:
        """The figure as shown (the claim's unit)."""
        return self.claim.shown(self.tested)

    def row(self) -> dict:
        c, shown = self.claim, self.interval
        adjusted = c.shown(self.adjusted) if self.adjusted is not None else None
        unmatched = c.shown(self.unmatched) if self.unmatched is not None else None
        return {
            "claim": c.id,
            "statement": c.statement,
            "paper": c.paper,
            "measure": c.measure,
            "test": c.how(),
            "ours": c.text(self.tested),
            "mean": shown.mean,
            "low": shown.low,
            "high": shown.high,
            "n": shown.n,
            "p": self.p,
            "p_exact": self.exact,
            "p_holm": self.p_adjusted,
            "holm_low": adjusted.low if adjusted else None,
            "holm_high": adjusted.high if adjusted else None,
            "unmatched": c.text(self.unmatched) if self.unmatched is not None else None,
            "unmatched_mean": unmatched.mean if unmatched else None,
            "verdict": self.verdict,
            "verdict_unadjusted": self.raw_verdict or self.verdict,
            "detail": self.detail,
            "unmatched_detail": self.unmatched_detail,
        }


def decide(claim: Claim, tested: Interval, p: float | None, rejected: bool, shown_at: Interval) -> str:
    """A verdict from a test's decision and the interval shown with it: rejected, the
    side of the estimate decides; not rejected, "not reproduced" only where the shown
    interval excludes the null on the other side (a one-sided claim's far bound), else
    inconclusive (no spread where every seed gave the same value and nothing decided)."""
    if p is not None and rejected and tested.mean is not None:
        return REPRODUCED if claim.on_paper_side(tested.mean) else NOT_REPRODUCED
    null = claim.tested_null
    if shown_at.low is not None and shown_at.high is not None and not shown_at.no_spread:
        if (shown_at.low > null and claim.direction == -1) or (shown_at.high < null and claim.direction == 1):
            return NOT_REPRODUCED
    return NO_SPREAD if tested.no_spread else INCONCLUSIVE


def judge(
    claim_id: str,
    interval: Interval,
    detail: str = "",
    *,
    unmatched: Interval | None = None,
    unmatched_detail: str = "",
    exact: float | None = None,
    confidence: float = CONFIDENCE,
) -> ClaimResult:
    """A claim's result, uncorrected: its t test, or `exact` (an exact test's p) where
    the seeds do not vary at all; the verdict at `confidence`."""
    claim = CLAIMS[claim_id]
    p = exact if interval.no_spread else claim.p_value(interval)
    rejected = p is not None and p <= 1.0 - confidence
    return ClaimResult(
        claim,
        interval,
        decide(claim, interval, p, rejected, interval),
        detail,
        unmatched,
        unmatched_detail,
        p=p,
        exact=interval.no_spread and exact is not None,
    )


def correct(results: list[ClaimResult], family: Sequence[str], confidence: float = CONFIDENCE) -> list[ClaimResult]:
    """Holm's correction over a fixed family of claims (analysis.stats.holm) at
    family-wise error 1 − confidence. The family is declared, not found: a member with no
    result, or no test, counts as p = 1 and still holds its place (it is added as
    "inconclusive (no result)" when missing). Each member's adjusted interval is shown
    at the level Holm's procedure gives it, so no interval contradicts its verdict.
    Results outside the family are descriptive: shown, never judged. Family order first,
    then the rest in their order."""
    by_id = {r.claim.id: r for r in results}
    members = [
        by_id.get(c) or ClaimResult(CLAIMS[c], Interval(None, None, None, 0), INCONCLUSIVE, "no result") for c in family
    ]
    steps = holm([r.p for r in members], 1.0 - confidence)
    out = []
    for r, step in zip(members, steps):
        adjusted = r.tested.at(step.level)
        out.append(
            replace(
                r,
                p_adjusted=step.p_adjusted,
                adjusted=adjusted,
                verdict=decide(r.claim, r.tested, r.p, step.rejected, adjusted),
                raw_verdict=r.verdict,
            )
        )
    return out + [replace(r, verdict=DESCRIPTIVE, raw_verdict=r.verdict) for r in results if r.claim.id not in family]


def verdict_table(results: list[ClaimResult]) -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame([r.row() for r in results], infer_schema_length=None)


def verdict_markdown(results: list[ClaimResult]) -> str:
    """The verdicts as a markdown table, one short line per claim: the paper's figure
    beside ours with its uncorrected interval, the Holm-compatible interval and adjusted
    p-value where a correction ran, the unmatched arm's figure where the verdict reads a
    step-matched one, and the verdict; what each figure measures, and how it is tested,
    follows the table."""
    corrected = any(r.p_adjusted is not None for r in results)
    head = "| claim | the paper | ours (95 %, uncorrected) |"
    head += " Holm-compatible |" if corrected else ""
    head += " unmatched arm | verdict |"
    lines = [head, "|" + "---|" * head.count(" |")]
    for r in results:
        c = r.claim
        row = f"| **{c.id}** {c.statement} | {c.paper} | {c.text(r.tested)} |"
        if corrected:
            if r.adjusted is not None and r.p_adjusted is not None:
                row += f" {c.text(r.adjusted)}, p {r.p_adjusted:.3g}{' (exact)' if r.exact else ''} |"
            else:
                row += " — |"
        row += f" {c.text(r.unmatched) if r.unmatched is not None else '—'} |"
        verdict_text = r.verdict
        if r.verdict != DESCRIPTIVE and r.raw_verdict is not None and r.raw_verdict != r.verdict:
            verdict_text += f" (uncorrected: {r.raw_verdict})"
        lines.append(row + f" {verdict_text} |")
    lines.append("")
    for r in results:
        c = r.claim
        lines.append(
            f"- **{c.id}**: {c.measure}{'; ' + r.detail if r.detail else ''}"
            + (f"; unmatched: {r.unmatched_detail}" if r.unmatched is not None else "")
            + f"; {c.how()}"
            + ("; every seed gave the same value: Fisher's exact test on the held-out counts" if r.exact else "")
        )
    return "\n".join(lines)
