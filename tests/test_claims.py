"""The claims' arithmetic (analysis/claims.py) against hand-computed cases: matched-loop
interpolation, Student-t and Welch intervals, the verdict on a known-positive, a
known-null and a reversed input, and every claim read end to end from an MLflow store
shaped like the platform's (tests/analysis_fixture.py, whose closed forms give the
expected numbers by hand)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

import analysis_fixture as fx
from analysis.claims import (
    CLAIMS,
    INCONCLUSIVE,
    NO_SPREAD,
    NOT_REPRODUCED,
    REPRODUCED,
    ClaimResult,
    Interval,
    difference,
    hole_claims,
    holm,
    increase_pct,
    interpolate,
    loop_claims,
    mean_difference,
    mean_interval,
    speed_claims,
    target_loops,
    trial_measures,
    verdict,
    verdict_markdown,
)
from analysis.load import load_runs
from analysis.points import evaluation_points

T_975 = {1: 12.706204736, 2: 4.302652730, 4: 2.776445105}  # Student-t table, two-sided 95 %


def test_interpolation_is_piecewise_linear_and_never_extrapolates():
    xs, ys = [1.86, 2.19, 2.81, 4.0], [2.0, 1.9, 1.8, 1.7]
    # Between 1.86 and 2.19: 2.0 + (1.9 - 2.0) * (2.0 - 1.86) / (2.19 - 1.86)
    assert interpolate(xs, ys, 2.0) == pytest.approx(2.0 - 0.1 * 0.14 / 0.33)
    assert interpolate(xs, ys, 2.81) == pytest.approx(1.8)
    assert interpolate(xs, ys, 4.0) == pytest.approx(1.7)
    assert interpolate(list(reversed(xs)), list(reversed(ys)), 3.0) == pytest.approx(1.8 - 0.1 * 0.19 / 1.19)
    assert interpolate(xs, ys, 1.5) is None and interpolate(xs, ys, 4.01) is None
    assert interpolate([], [], 2.0) is None
    # Points at the same loops (q 0.8 .. 1.0 all at R) are averaged.
    assert interpolate([2.0, 4.0, 4.0], [1.0, 3.0, 5.0], 3.0) == pytest.approx(2.5)


def test_mean_difference_of_two_curves_by_hand():
    # a = x on [0, 2], b = 1 on [1, 3]: over the shared [1, 2], a - b = x - 1, mean 0.5
    assert mean_difference(([0, 2], [0, 2]), ([1, 3], [1, 1])) == pytest.approx(0.5)
    # a kink inside the range: a through (0, 0), (1, 2), (2, 0) over b = 0: mean 1
    assert mean_difference(([0, 1, 2], [0, 2, 0]), ([0, 2], [0, 0])) == pytest.approx(1.0)
    assert mean_difference(([0, 1], [0, 0]), ([1, 2], [0, 0])) is None  # they meet in a point
    assert mean_difference(([], []), ([0, 1], [0, 0])) is None


def test_mean_interval_by_hand():
    i = mean_interval([1.0, 2.0, 3.0])  # mean 2, s 1, n 3
    half = T_975[2] * 1.0 / math.sqrt(3)
    assert (i.mean, i.n) == (2.0, 3)
    assert i.low == pytest.approx(2.0 - half) and i.high == pytest.approx(2.0 + half)
    assert mean_interval([5.0]).low is None and mean_interval([5.0]).mean == 5.0
    assert mean_interval([None, float("nan")]).mean is None


def test_paired_difference_uses_the_seeds_both_arms_have():
    a = {0: 10.0, 1: 12.0, 2: 11.0, 3: 99.0}
    b = {0: 7.0, 1: 8.0, 2: 9.0}  # seed 3 has no partner: left out
    i = difference(a, b, paired=True)  # differences 3, 4, 2: mean 3, s 1
    assert i.paired and i.n == 3 and i.mean == pytest.approx(3.0)
    assert i.low == pytest.approx(3.0 - T_975[2] / math.sqrt(3))


def test_welch_difference_by_hand():
    a, b = {0: 1.0, 1: 2.0, 2: 3.0}, {0: 2.0, 1: 4.0, 2: 6.0}  # variances 1 and 4, n 3 each
    i = difference(a, b, paired=False)
    se = math.sqrt(1 / 3 + 4 / 3)
    df = (5 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2)  # Welch–Satterthwaite: 50/17
    assert df == pytest.approx(50 / 17)
    t = 3.218759  # t_{0.975} at 50/17 ≈ 2.94 degrees of freedom (between the table's 3.182 at 3 and 4.303 at 2)
    assert i.mean == pytest.approx(-2.0) and not i.paired
    assert i.high == pytest.approx(-2.0 + t * se, abs=1e-5)


def test_verdicts_known_positive_null_and_reversed():
    positive = mean_interval([2.1, 1.9, 2.0, 2.2, 1.8])  # clearly above zero
    null = mean_interval([0.5, -0.4, 0.1, -0.3, 0.2])  # straddles zero
    assert verdict(positive, +1) == REPRODUCED
    assert verdict(null, +1) == INCONCLUSIVE and verdict(null, -1) == INCONCLUSIVE
    assert verdict(positive, -1) == NOT_REPRODUCED
    # A bound other than zero: "below 5 %".
    assert verdict(mean_interval([3.0, 3.5, 4.0]), -1, null=5.0) == REPRODUCED
    assert verdict(mean_interval([3.0, 6.5, 4.0]), -1, null=5.0) == INCONCLUSIVE
    assert verdict(Interval(3.0, None, None, 1), +1) == INCONCLUSIVE  # one seed: no interval, no verdict
    with pytest.raises(ValueError, match="direction"):
        verdict(positive, 0)


def test_target_loops_and_increase():
    assert target_loops(4) == 2.0 and target_loops(6) == 3.0 and target_loops(2) == 1.5
    assert increase_pct(math.log(11.0), math.log(10.0)) == pytest.approx(10.0)
    assert increase_pct(None, 1.0) is None


@pytest.fixture(scope="module")
def gated_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("claims")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    fx.log_sweep(uri, root, "claims-debug", seeds=(0, 1))
    return trial_measures(evaluation_points(load_runs(uri, ["claims-debug"])))


def test_trial_measures_read_each_curve_at_half_the_loops(gated_store):
    t = gated_store.sort("method", "seed")
    assert set(t["method"]) == {"Ouro", "CHASE"} and (t["loops"] == 2.0).all()
    for row in t.iter_rows(named=True):
        s = row["seed"]
        # The fixture: full compute is forced depth R = 4 (ppl 100/16 + s); skip at q = 0.2
        # runs exactly 2.0 loops (Ouro ppl 50 + s, CHASE 11.3 + s); forced depth 2 has ppl 25 + s.
        assert math.exp(row["full_loss"]) == pytest.approx(6.25 + s)
        skip = 50.0 + s if row["method"] == "Ouro" else 11.3 + s
        assert math.exp(row["skip_loss"]) == pytest.approx(skip)
        assert row["skip_increase"] == pytest.approx(100 * (skip / (6.25 + s) - 1))
        assert math.exp(row["fixed_loss"]) == pytest.approx(25.0 + s)
        assert math.exp(row["forced_loss"]) == pytest.approx(25.0 + s)


def test_hole_claims_end_to_end_by_hand(gated_store):
    results = {r.claim.id: r for r in hole_claims(gated_store)}
    gaps = [100 * ((50 + s) / (6.25 + s) - (11.3 + s) / (6.25 + s)) for s in (0, 1)]
    c3 = results["C3"].interval
    assert c3.paired and c3.n == 2 and c3.mean == pytest.approx(sum(gaps) / 2)
    half = T_975[1] * abs(gaps[0] - gaps[1]) / math.sqrt(2) / math.sqrt(2)
    assert c3.low == pytest.approx(c3.mean - half)
    assert results["C3"].verdict == REPRODUCED  # the fixture's Ouro gate collapses under skip
    # C2: the pre-trained model's forced curve over CHASE's skip curve, averaged over the loops
    # both cover ([2, 4]), in mean CE; a dense Riemann sum of numpy's own interpolation is the reference.
    c2 = []
    for s in (0, 1):
        grid = np.linspace(2.0, 4.0, 200_001)
        skip = np.interp(
            grid,
            [2.0, 2.5, 3.0, 3.5, 4.0],
            [
                math.log(11.3 + s),
                math.log(11.1 + s),
                math.log(10.9 + s),
                math.log(10.7 + s),
                (math.log(10.5 + s) + math.log(6.25 + s)) / 2,
            ],
        )
        fixed = np.interp(grid, [1.0, 2.0, 3.0, 4.0], [math.log(100 / d**2 + s) for d in (1, 2, 3, 4)])
        c2.append(100 * math.expm1(float(np.mean(fixed - skip))))
    assert results["C2"].interval.mean == pytest.approx(sum(c2) / 2, rel=1e-4)
    assert results["C2"].interval.n == 2
    # CHASE's increase (+81 %, +70 %) is far above "a few percent", but two seeds give
    # t = 12.7: the interval [+4.5, +146] still holds the 5 % bound.
    few = [100 * ((11.3 + s) / (6.25 + s) - 1) for s in (0, 1)]
    assert results["C3-few"].interval.low == pytest.approx(
        sum(few) / 2 - T_975[1] * abs(few[0] - few[1]) / math.sqrt(2) / math.sqrt(2)
    )
    assert results["C3-few"].interval.low < 5.0 and results["C3-few"].verdict == INCONCLUSIVE
    table = verdict_markdown(list(results.values()))
    assert "| **C3**" in table and REPRODUCED in table


def test_loop_claims_by_hand():
    rows = []
    for seed, (looped, base, deep) in enumerate([(0.9, 0.5, 0.95), (0.88, 0.6, 0.97), (0.89, 0.4, 0.96)]):
        for (n, r), acc in (((1, 4), looped), ((1, 1), base), ((4, 1), deep)):
            rows.append({"n_layers": n, "n_loops": r, "seed": seed, "full_accuracy": acc, "full_ppl": 10.0 / acc})
    fixed = pl.DataFrame(rows)
    (c1,) = loop_claims(fixed, quality="accuracy", looped=(1, 4), base=(1, 1), deep=None)
    assert c1.interval.mean == pytest.approx(100 * (0.89 - 0.5)) and c1.verdict == REPRODUCED
    lm, depth = loop_claims(fixed, quality="ppl", looped=(1, 4), base=(1, 1), deep=(4, 1))
    # Welch on log perplexity: the ratio of geometric means, as a percent.
    geo = lambda accs: math.exp(sum(math.log(10.0 / a) for a in accs) / 3)  # noqa: E731
    assert lm.interval.mean == pytest.approx(100 * (geo([0.5, 0.6, 0.4]) / geo([0.9, 0.88, 0.89]) - 1))
    assert depth.interval.mean == pytest.approx(100 * (geo([0.9, 0.88, 0.89]) / geo([0.95, 0.97, 0.96]) - 1))
    assert depth.verdict == REPRODUCED


def test_speed_claims():
    records = [
        {"batch": b, "seq_len": 512, "policy": "skip:0.2", "speedup": s, "ideal_speedup": 2.0, "seed": seed}
        for b, s, seed in ((1, 0.96, 0), (1, 0.97, 1), (1, 0.95, 2), (64, 1.7, 0), (64, 1.75, 1), (64, 1.72, 2))
    ]
    c4, batch1, growth = speed_claims(records)
    assert c4.interval.mean == pytest.approx(1.7233333) and c4.verdict == REPRODUCED
    assert batch1.verdict == REPRODUCED  # below 1 at batch 1, as the paper's 0.95-0.97x
    assert growth.interval.paired and growth.interval.mean == pytest.approx((0.74 + 0.78 + 0.77) / 3)
    assert growth.verdict == REPRODUCED
    assert "1.72x [" in c4.claim.text(c4.tested)  # a ratio shows no sign
    assert speed_claims([]) == []
    # the paper's layout is judged apart and never mixed into looplab's
    padded = [{**r, "packing": "padded", "speedup": r["speedup"] - 0.5} for r in records if r["batch"] == 64]
    by_id = {r.claim.id: r for r in speed_claims(records + padded)}
    assert by_id["C4"].interval.mean == pytest.approx(1.7233333)
    assert by_id["C4-padded"].interval.mean == pytest.approx(1.2233333) and by_id["C4-padded"].verdict == REPRODUCED


# ---- degenerate spread and the family-wise correction ------------------------------------------------


def test_zero_spread_is_no_evidence():
    """Saturated accuracies, {100, 100, 100} against {99.8, 99.8, 99.8}: Welch's interval
    has zero width, and the 0.2-point gap is one example of 500, the metric's resolution."""
    gap = difference({0: 100.0, 1: 100.0, 2: 100.0}, {0: 99.8, 1: 99.8, 2: 99.8}, paired=False)
    assert gap.low == gap.high == pytest.approx(0.2)  # the zero-width interval that used to read as a verdict
    c1 = CLAIMS["C1"]
    assert c1.resolution == pytest.approx(0.2)
    assert c1.verdict(gap) == NO_SPREAD and verdict(gap, +1, resolution=0.2) == NO_SPREAD
    # near-zero spread (below one example) and a gap of one example: still no evidence
    near = difference({0: 100.0, 1: 99.8, 2: 100.0}, {0: 99.8, 1: 99.8, 2: 99.6}, paired=False)
    assert near.sd < 0.2 and c1.verdict(near) == NO_SPREAD
    # a gap the metric resolves many times over decides even without spread
    assert (
        c1.verdict(difference({0: 100.0, 1: 100.0, 2: 100.0}, {0: 50.0, 1: 50.0, 2: 50.0}, paired=False)) == REPRODUCED
    )
    # end to end: loop_claims on saturated p-hop accuracies
    rows = [
        {"n_layers": n, "n_loops": r, "seed": s, "full_accuracy": acc, "full_ppl": 1.0}
        for s in range(3)
        for (n, r), acc in (((1, 4), 1.0), ((1, 1), 0.998))
    ]
    (result,) = loop_claims(pl.DataFrame(rows), quality="accuracy", looped=(1, 4), base=(1, 1), deep=None)
    assert result.verdict == NO_SPREAD and result.p == 1.0


def test_holm_against_a_hand_computed_case():
    """p = 0.01, 0.04, 0.03, 0.005 (m = 4, α = 0.05): sorted 0.005, 0.01, 0.03, 0.04 are
    compared with 0.05/4, 0.05/3, 0.05/2, 0.05/1: the first two are rejected, the third
    fails (0.03 > 0.025) and stops the step-down, so the fourth (0.04 ≤ 0.05) is not
    rejected either. Adjusted: 4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 0.04)."""
    from scipy.stats import t

    def result(p):
        return ClaimResult(CLAIMS["C3"], Interval(10.0, 5.0, 15.0, 5, sd=2.0, se=1.0, df=4), REPRODUCED, p=p)

    out = holm(
        [
            result(0.01),
            result(0.04),
            result(0.03),
            result(0.005),
            ClaimResult(CLAIMS["C4"], Interval(1.0, None, None, 1), INCONCLUSIVE),
        ]
    )
    assert [r.p_adjusted for r in out[:4]] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [r.verdict for r in out[:4]] == [REPRODUCED, INCONCLUSIVE, INCONCLUSIVE, REPRODUCED]
    assert [r.raw_verdict for r in out[:4]] == [REPRODUCED] * 4
    assert out[4].p_adjusted is None and out[4].verdict == INCONCLUSIVE  # no test: not in the family
    # the interval at the level of each step: p = 0.04 was tested last, at 1 - 0.05/1 = 95 %
    assert out[1].adjusted.high == pytest.approx(10.0 + t.ppf(0.975, 4))
    assert out[3].adjusted.high == pytest.approx(10.0 + t.ppf(1 - 0.05 / 4 / 2, 4))  # first step: 98.75 %
    assert "Holm-corrected" in verdict_markdown(out) and "(uncorrected: reproduced (direction))" in verdict_markdown(
        out
    )


def test_p_values_match_the_interval():
    """The t test's two-sided p is 0.05 exactly where the 95 % interval touches the null."""
    i = mean_interval([1.0, 2.0, 3.0])
    shifted = i.low  # the null at the interval's lower end
    from analysis.claims import p_value

    assert p_value(i, shifted) == pytest.approx(0.05)
    assert p_value(i, 2.0) == pytest.approx(1.0)
