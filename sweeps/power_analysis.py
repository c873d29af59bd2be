"""How many seeds a protocol's claims need: a power analysis from the seeds earlier
protocols judged (sweeps/protocol.HISTORY), printed by the dry run and read when a new
protocol declares its seeds.

Each claim's effect and spread come from the intervals the earlier protocols recorded
for it (the committed verdicts: "mean [low, high]" over n seeds), read back on the scale
the current protocol tests it on (analysis.claims.Claim.scale): the standard error is
the half-width over the t quantile that made it, the spread se·√n, pooled over the
protocols that shared the claim's setup (SOURCES). An interval recorded as Welch's gives
the spread of a difference of two independent seeds (its degrees of freedom unknown,
taken as 2(n − 1), the larger spread); the paired test the current protocol runs has at
most that spread where the arms' seeds agree in sign (and the analysis assumes none).

The n a claim needs is the fewest seeds at which its test, at the family's strictest
level α/m (Holm's first step), has POWER to detect the pooled effect: a planning
figure, as good as the earlier protocols' seeds are like the new ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.prose import cell
from analysis.stats import POWER, seeds_for_power, t_quantile

# The earlier protocols whose seeds share each claim's setup: the LM sweep and the timed
# prefills were one regime under v3 and v4 (ten seeds); p-hop's looped model became 1⊗2 and
# Mano entered under v4 (five seeds each).
SOURCES: dict[str, tuple[str, ...]] = {
    "C1": ("v4",),
    "C1-mano": ("v4",),
    **{c: ("v3", "v4") for c in ("C1-LM", "C1-depth", "C2", "C2-own", "C3", "C3-few", "C4", "C4-padded")},
    **{c: ("v3", "v4") for c in ("C4-batch1", "C4-growth")},
}
WELCH_THEN = {"C1", "C1-mano", "C1-LM", "C1-depth"}  # the claims v3 and v4 tested with Welch's interval
CONFIDENCE_THEN = 0.95  # the recorded intervals' confidence (uncorrected)


@dataclass(frozen=True)
class Need:
    """One claim's power analysis: its pooled effect and spread on the tested scale, the
    seeds that gave them, the n for POWER at `level`, and the power at the declared n."""

    claim: str
    effect: float  # pooled mean minus the null, on the tested scale
    spread: float  # per-seed standard deviation on the tested scale
    seeds_behind: int
    sources: tuple[str, ...]
    level: float  # the test's level (α/m)
    needs: int | None
    declared: int | None
    power_declared: float | None


def needs(protocol, history=None) -> list[Need]:
    """Every claim of the protocol's family with recorded seeds behind it, in family order."""
    from analysis.claims import CLAIMS
    from analysis.stats import power
    from sweeps.protocol import HISTORY

    past = {p.protocol.name.split(":")[0]: p for p in (history or HISTORY)}
    family = protocol.family
    alpha = (1.0 - protocol.confidence) / max(len(family), 1)
    out = []
    for claim_id in family:
        claim = CLAIMS[claim_id]
        parts = []
        for version in SOURCES.get(claim_id, ()):
            text = past[version].verdicts.get(claim_id) if version in past else None
            if text is None:
                continue
            n = len(past[version].protocol.seeds)
            try:
                read = cell(text, n)  # "+3.75 % [+1.87, +5.62]: inconclusive", as the history recorded it
            except ValueError:  # recorded without an interval: nothing to size on
                continue
            mean, low, high = (claim.tested_value(v) for v in (read.mean, read.low, read.high))
            df = 2 * (n - 1) if claim_id in WELCH_THEN else n - 1
            se = (high - low) / 2 / t_quantile(0.5 + CONFIDENCE_THEN / 2, df)
            parts.append((version, n, mean, se * math.sqrt(n)))
        if not parts:
            continue
        behind = sum(n for _, n, _, _ in parts)
        effect = sum(n * mean for _, n, mean, _ in parts) / behind - claim.tested_null
        spread = math.sqrt(sum((n - 1) * sd**2 for _, n, _, sd in parts) / sum(n - 1 for _, n, _, _ in parts))
        declared = len(protocol.seeds_of_claim(claim_id)) if protocol.seeds else None
        out.append(
            Need(
                claim_id,
                effect,
                spread,
                behind,
                tuple(v for v, _, _, _ in parts),
                alpha,
                seeds_for_power(effect, spread, alpha, sides=claim.sides),
                declared,
                power(declared, effect, spread, alpha, sides=claim.sides) if declared else None,
            )
        )
    return out


def text(protocol, history=None) -> str:
    """The dry run's power analysis: one line per claim."""
    rows = needs(protocol, history)
    if not rows:
        return "power analysis: no earlier protocol recorded these claims"
    lines = [
        f"power analysis ({POWER:.0%} power at the family's strictest level α/m = {rows[0].level:.3g}; effect and "
        "spread from the earlier protocols' judged seeds, on the scale each claim is tested on):",
        f"  {'claim':<10} {'effect':>9} {'spread':>9} {'d':>5}  {'from':<6} {'needs':>5} {'declared':>8} {'power':>6}",
    ]
    for r in rows:
        short = r.needs is None or (r.declared is not None and r.declared < r.needs)
        lines.append(
            f"  {r.claim:<10} {r.effect:>+9.4g} {r.spread:>9.4g} {abs(r.effect) / r.spread:>5.2f}  "
            f"{'+'.join(r.sources):<6} {_or_dash(r.needs):>5} {_or_dash(r.declared):>8} "
            f"{_or_dash(r.power_declared, '.2f'):>6}" + ("  under-powered" if short else "")
        )
    return "\n".join(lines)


def _or_dash(value, spec: str = "") -> str:
    return "—" if value is None else format(value, spec)
