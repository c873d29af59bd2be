"""The paper's claims and the rules that judge ours (analysis/claims.py judges them).

  Claim   the paper's statement and the rule that judges ours: its direction against a
          null, the scale seeds are averaged and tested on (linear, or log for a ratio),
          the test (paired, Welch, or one value per seed), its sides (a bound is tested
          one-sided), and where it can be tested at all
  CLAIMS  the paper's four headline claims (and their sub-claims) with the paper's own
          figure beside each
  the verdicts' words (REPRODUCED, ...), shared by the judging and the tables

Like analysis/claims.py, this module imports no polars at its top: the GPU image judges
claims without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis.stats import CONFIDENCE, Interval, difference, mean_interval, p_value

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced (direction)", "not reproduced", "inconclusive"
NO_SPREAD = "inconclusive (no spread)"  # every seed gave the same value and no exact test decides
DESCRIPTIVE = "descriptive (not judged here)"  # a claim outside the protocol's family on this machine
# "Within a few percent of full compute": the paper reports +3-4 % (Fig. 2); the verdict
# asks whether CHASE's increase lies below this bound.
FEW_PERCENT = 5.0


LINEAR, LOG = "linear", "log"  # the scale a claim's seeds are averaged and tested on
PAIRED, WELCH, PER_SEED = "paired", "Welch", "per seed"  # how its per-seed values become an interval


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims and the rule that judges ours.

    direction  +1: the paper's direction is measure > null; -1: measure < null
    scale      LINEAR, or LOG for a ratio: a percent change (unit " %") is tested as
               log(1 + v/100), a ratio (unit "x") as log v, and shown back in its unit
               (a geometric mean over seeds; a ratio's interval then stays a ratio's)
    test       PAIRED (two arms' difference per seed: the arms share what a seed fixes),
               WELCH (two arms' independent means), or PER_SEED (one value per seed,
               itself a matched comparison inside one seed)
    sides      2: a two-sided t test; 1: one-sided in the paper's direction (a bound,
               such as "within 5 %": non-inferiority)
    examples   held-out examples behind each per-seed value of a count measure
               (accuracy): where seeds do not vary at all, Fisher's exact test on the
               counts pooled over seeds decides instead of a t test (0: not a count)
    gpu_only   a phenomenon only a GPU shows (a latency-bound batch-1 prefill): on a
               CPU the claim is shown, outside the family, and never judged
    why        why this scale and test, said where the claim is shown"""

    id: str
    statement: str  # what the paper claims
    measure: str  # what we compute, and its unit
    paper: str  # the paper's own figure for it
    direction: int
    unit: str = ""
    null: float = 0.0
    scale: str = LINEAR
    test: str = PER_SEED
    sides: int = 2
    examples: int = 0
    gpu_only: bool = False
    why: str = ""

    def __post_init__(self) -> None:
        if self.direction not in (1, -1):
            raise ValueError(f"Claim.direction={self.direction!r} is invalid; allowed: 1 | -1")
        if self.scale not in (LINEAR, LOG) or (self.scale == LOG and self.unit not in (" %", "x")):
            raise ValueError(
                f"Claim.scale={self.scale!r} is invalid with unit={self.unit!r}; allowed: {LINEAR}, or {LOG} "
                "for a percent change (' %') or a ratio ('x')"
            )
        if self.test not in (PAIRED, WELCH, PER_SEED):
            raise ValueError(f"Claim.test={self.test!r} is invalid; allowed: {PAIRED} | {WELCH} | {PER_SEED}")
        if self.sides not in (1, 2):
            raise ValueError(f"Claim.sides={self.sides!r} is invalid; allowed: 1 | 2")

    @property
    def signed(self) -> bool:
        """A difference shows its sign; a ratio (null 1) does not."""
        return self.null != 1.0

    def rule(self) -> dict:
        """What decides this claim's verdict (a protocol's content hash covers it)."""
        return {
            "direction": self.direction,
            "null": self.null,
            "unit": self.unit,
            "scale": self.scale,
            "test": self.test,
            "sides": self.sides,
            "examples": self.examples,
            "gpu_only": self.gpu_only,
        }

    def tested_value(self, v: float) -> float:
        """A value in the claim's unit on the scale it is tested on."""
        if self.scale == LINEAR:
            return v
        return math.log1p(v / 100.0) if self.unit == " %" else math.log(v)

    def shown_value(self, t: float) -> float:
        if self.scale == LINEAR:
            return t
        return 100.0 * math.expm1(t) if self.unit == " %" else math.exp(t)

    @property
    def tested_null(self) -> float:
        return self.tested_value(self.null)

    def interval(self, values, confidence: float = CONFIDENCE) -> Interval:
        """Per-seed values in the claim's unit as its tested interval (PER_SEED claims)."""
        floor = -100.0 if self.unit == " %" else 0.0  # where the log scale ends: a ratio of 0
        clean = [v for v in values if v is not None and math.isfinite(v) and (self.scale == LINEAR or v > floor)]
        return mean_interval([self.tested_value(v) for v in clean], confidence, self.sides)

    def difference(self, a: dict, b: dict, confidence: float = CONFIDENCE) -> Interval:
        """Arm a minus arm b by seed, values already on the tested scale (PAIRED, WELCH)."""
        return difference(a, b, paired=self.test != WELCH, confidence=confidence, sides=self.sides)

    def shown(self, interval: Interval) -> Interval:
        """The interval in the unit the claim is shown in."""
        return interval if self.scale == LINEAR else interval.mapped(self.shown_value)

    def on_paper_side(self, tested_mean: float) -> bool:
        return (tested_mean > self.tested_null) == (self.direction == 1)

    def p_value(self, tested: Interval) -> float | None:
        """The t test in the claim's sides (one-sided: in the paper's direction)."""
        return p_value(tested, self.tested_null, self.direction)

    def verdict(self, tested: Interval) -> str:
        """The verdict an interval gives at its own level: reproduced when it excludes
        the null on the paper's side, not reproduced on the other side, else
        inconclusive (no spread: every seed gave the same value)."""
        if tested.no_spread:
            return NO_SPREAD
        if tested.low is None or tested.high is None:
            return INCONCLUSIVE
        null = self.tested_null
        if tested.low > null:
            return REPRODUCED if self.direction == 1 else NOT_REPRODUCED
        if tested.high < null:
            return REPRODUCED if self.direction == -1 else NOT_REPRODUCED
        return INCONCLUSIVE

    def text(self, tested: Interval) -> str:
        return self.shown(tested).text(2, self.unit, self.signed)

    def how(self) -> str:
        """The test and the scale in words, for the line under the verdict table."""
        side = "against the bound" if self.null != 0 else ("above zero" if self.direction == 1 else "below zero")
        sides = "two-sided" if self.sides == 2 else f"one-sided {side}"
        scale = "log scale (a geometric mean over seeds)" if self.scale == LOG else "linear scale"
        return f"{self.test} t test, {sides}, on the {scale}" + (f": {self.why}" if self.why else "")


PHOP_EXAMPLES = 500  # phop-debug's held-out examples (task.eval_count): the exact test's unit
MANO_EXAMPLES = 500  # mano-debug's

_SAME_SEED = "both models of a seed train on the same batches in the same order and are scored on the same held-out set"
_PAIRED_ACCURACY = f"paired by seed because {_SAME_SEED}; points of accuracy add"
_PAIRED_PERPLEXITY = f"paired by seed because {_SAME_SEED}; a perplexity ratio is a difference of log perplexities"


def _perplexity_ratio(claim: str, says: str, measure: str, paper: str) -> Claim:
    """A claim that one model's perplexity beats another's, paired by seed, on a log scale."""
    return Claim(claim, says, measure, paper, +1, unit=" %", scale=LOG, test=PAIRED, why=_PAIRED_PERPLEXITY)


_SPEEDUP = "a speedup is a ratio of times"


def _speedup(claim: str, says: str, measure: str, paper: str, direction: int = +1, **more: Any) -> Claim:
    """A claim about a speedup of skip over full: a ratio (null 1), on a log scale."""
    return Claim(claim, says, measure, paper, direction, unit="x", null=1.0, scale=LOG, **{"why": _SPEEDUP, **more})


CLAIMS: dict[str, Claim] = {
    c.id: c
    for c in (
        Claim(
            "C1",
            "looping helps at equal parameters (N⊗R beats N⊗1)",
            "p-hop exact match of N⊗R minus N⊗1, points",
            "p-hop p=16: 1⊗6 99.51 % vs 1⊗1 38.32 % (+61.2 points, Table 2)",
            +1,
            unit=" pt",
            test=PAIRED,
            examples=PHOP_EXAMPLES,
            why=_PAIRED_ACCURACY,
        ),
        Claim(
            "C1-mano",
            "looping helps at equal parameters on Mano (N⊗R beats N⊗1)",
            "Mano exact match (ℓ = L) of N⊗R minus N⊗1, points",
            "L=10: 4⊗6 99.21 % vs 4⊗1 55.60 % (+43.6 points, Table 1)",
            +1,
            unit=" pt",
            test=PAIRED,
            examples=MANO_EXAMPLES,
            why=_PAIRED_ACCURACY,
        ),
        _perplexity_ratio(
            "C1-LM",
            "looping helps at equal parameters, language modelling",
            "perplexity of N⊗1 over N⊗R, % (positive: the looped model is better)",
            "140M Mamba-2: loop4 14.68 vs baseline 15.80 (+7.6 %, Table 4); 6⊗4 19.98 vs 6⊗1 21.96 (+9.9 %, Table 3)",
        ),
        _perplexity_ratio(
            "C1-depth",
            "where NR⊗1 stands: the iso-depth (iso-FLOPs) non-looped model stays ahead",
            "perplexity of N⊗R over NR⊗1, % (positive: the deeper non-looped model is better)",
            "24⊗1 16.15 vs 6⊗4 19.98 (+23.7 %, Table 3)",
        ),
        Claim(
            "C2",
            "adaptive exits beat forced fixed depth at equal executed loops",
            "perplexity of the fixed-loop model forced to d loops over CHASE skip at the same executed loops, mean "
            "over the loops both cover, %",
            "140M at ~2 loops: forced 2 loops PPL 12,907 vs CHASE skip 16.45 at 2.15 loops (Fig. 3, App. E)",
            +1,
            unit=" %",
            scale=LOG,
            why="each seed's value is a mean gap in log perplexity, shown as a ratio",
        ),
        Claim(
            "C2-own",
            "(stronger) adaptive exits beat the same gated model at a forced depth",
            "perplexity of CHASE's own model forced to d loops over its skip at the same executed loops, mean over "
            "the loops both cover, %",
            "not reported: the paper forces the fixed-loop model",
            +1,
            unit=" %",
            scale=LOG,
            why="each seed's value is a mean gap in log perplexity, shown as a ratio",
        ),
        Claim(
            "C3",
            "cache holes: stock Ouro skip degrades far more than CHASE skip at about half the loops",
            "Ouro's perplexity increase over its full compute minus CHASE's, at R/2 executed loops, points of %",
            "370M: Ouro up to +4788 %, CHASE +3-4 % (Fig. 2)",
            +1,
            unit=" pt",
            test=PAIRED,
            why="paired by seed because both arms continue one Stage-1; a difference of two increases in points, "
            "as the paper's Fig. 2 compares them",
        ),
        Claim(
            "C3-few",
            "CHASE skip stays within a few percent of full compute",
            f"CHASE's perplexity increase over its full compute at R/2 executed loops, % (bound {FEW_PERCENT:g} %)",
            "+3-4 % across the range (Fig. 2)",
            -1,
            unit=" %",
            null=FEW_PERCENT,
            scale=LOG,
            sides=1,
            why="a bound (non-inferiority) is tested on its own side; a perplexity ratio on the log scale",
        ),
        Claim(
            "C3-growth",
            "the cache-hole gap grows with training, on the road to the paper's sizes",
            "per seed, the least-squares slope of Ouro's minus CHASE's perplexity increase at R/2 executed loops "
            "against log2 of the pre-training steps, points per doubling",
            "at 140M-370M and 150B tokens Ouro up to +4788 %, CHASE +3-4 % (Fig. 2); at laptop scale a gap of a "
            "few points",
            +1,
            unit=" pt",
            sides=1,
            why="a difference of two slopes, in points of increase per doubling; one-sided: the claim is growth "
            "(the scan's own protocol, sweeps/c3_growth.py)",
        ),
        _speedup(
            "C4",
            "skip turns saved loops into prefill speedup where compute binds",
            "prefill speedup of skip over full at the largest batch, × (null 1)",
            "1.73x (140M) / 1.83x (370M) at batch 64, q=0.2 (Table 5)",
        ),
        _speedup(
            "C4-batch1",
            "and not at batch 1, where the prefill is latency-bound",
            "prefill speedup at batch 1, × (the paper: no faster than full, i.e. below 1)",
            "0.95-0.97x at batch 1 (140M, Table 5)",
            direction=-1,
            gpu_only=True,
            why=f"{_SPEEDUP}; a latency-bound batch-1 prefill is a GPU's regime",
        ),
        _speedup(
            "C4-padded",
            "the same speedup in the paper's layout (padded survivors, bf16 autocast)",
            "prefill speedup of skip over full at the largest batch with survivors padded to each batch's largest "
            "count under bf16 autocast, × (null 1)",
            "1.73x (140M) at batch 64, q=0.2, padded bf16 on a GPU at L 2048 (Table 5)",
        ),
        Claim(
            "C4-growth",
            "the speedup grows as the batch makes the prefill compute-bound",
            "speedup at the largest batch minus at batch 1, paired by model",
            "1.73x - 0.96x = +0.77 (140M, batch 64 vs 1, q=0.2, Table 5)",
            +1,
            unit="x",
            test=PAIRED,
            gpu_only=True,
            why="one model timed at both batches; a difference of speedups, as the paper's Table 5 reads it; "
            "a latency-bound batch-1 prefill is a GPU's regime",
        ),
    )
}
