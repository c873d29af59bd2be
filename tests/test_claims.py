"""The claims' arithmetic (analysis/claims.py, analysis/stats.py) against hand-computed
cases: matched-loop interpolation, Student-t and Welch intervals, one-sided bounds, the
verdict on a known-positive, a known-null and a reversed input, the exact test where
seeds do not vary, Holm's correction over a fixed family with compatible intervals, the
power analysis, and every claim read end to end from an MLflow store shaped like the
platform's (tests/analysis_fixture.py, whose closed forms give the expected numbers by
hand)."""

from __future__ import annotations

import math
import statistics

import analysis_fixture as fx
import numpy as np
import polars as pl
import pytest

from analysis.claims import (
    CLAIMS,
    DESCRIPTIVE,
    INCONCLUSIVE,
    LINEAR,
    NO_SPREAD,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    ClaimResult,
    correct,
    hole_claims,
    increase_pct,
    interpolate,
    judge,
    loop_claims,
    mean_difference,
    speed_claims,
    target_loops,
    trial_measures,
    verdict_markdown,
)
from analysis.load import load_runs
from analysis.points import evaluation_points
from analysis.stats import Interval, difference, holm, mean_interval, p_value, power, seeds_for_power

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


def _claim(direction=+1, null=0.0, sides=2):
    return Claim("T", "a test claim", "a difference", "—", direction, null=null, scale=LINEAR, sides=sides)


def test_verdicts_known_positive_null_and_reversed():
    positive = mean_interval([2.1, 1.9, 2.0, 2.2, 1.8])  # clearly above zero
    null = mean_interval([0.5, -0.4, 0.1, -0.3, 0.2])  # straddles zero
    assert _claim(+1).verdict(positive) == REPRODUCED
    assert _claim(+1).verdict(null) == INCONCLUSIVE and _claim(-1).verdict(null) == INCONCLUSIVE
    assert _claim(-1).verdict(positive) == NOT_REPRODUCED
    # A bound other than zero: "below 5 %".
    assert _claim(-1, 5.0).verdict(mean_interval([3.0, 3.5, 4.0])) == REPRODUCED
    assert _claim(-1, 5.0).verdict(mean_interval([3.0, 6.5, 4.0])) == INCONCLUSIVE
    assert _claim(+1).verdict(Interval(3.0, None, None, 1)) == INCONCLUSIVE  # one seed: no interval, no verdict
    with pytest.raises(ValueError, match="direction"):
        _claim(0)


def test_a_bound_is_tested_one_sided():
    """C3-few is non-inferiority ("within 5 %"): one-sided against its bound. Values
    3.0, 4.6, 4.2 (mean 3.933, s 0.833, n 3): the two-sided 95 % upper end reads
    t_{0.975, 2} = 4.303, the one-sided bound t_{0.95, 2} = 2.920. On five values whose
    one-sided bound falls below 5 while the two-sided end does not, only the one-sided
    test reproduces the bound."""
    values = [3.0, 4.6, 4.2]
    one, two = mean_interval(values, sides=1), mean_interval(values)
    se = one.se
    assert one.high == pytest.approx(statistics.fmean(values) + 2.919985580 * se)
    assert two.high == pytest.approx(statistics.fmean(values) + T_975[2] * se)
    # mean 4.3, s 0.640, se 0.286: one-sided 4.3 + 2.132·0.286 = 4.91, two-sided 4.3 + 2.776·0.286 = 5.10
    five = [3.4, 5.0, 4.6, 3.9, 4.6]
    claim = _claim(-1, 5.0, sides=1)
    tested = mean_interval(five, sides=1)
    assert tested.high < 5.0 < mean_interval(five).high
    assert claim.verdict(tested) == REPRODUCED and _claim(-1, 5.0).verdict(mean_interval(five)) == INCONCLUSIVE
    # its p is the lower tail of the t test against the bound, and it decides as the bound does
    from scipy.stats import t

    assert claim.p_value(tested) == pytest.approx(t.cdf((tested.mean - 5.0) / tested.se, 4))
    assert claim.p_value(tested) < 0.05 < p_value(mean_interval(five), 5.0)
    # the declared C3-few is one-sided, on the log scale of a perplexity ratio, against 5 %
    few = CLAIMS["C3-few"]
    assert few.sides == 1 and few.tested_null == pytest.approx(math.log(1.05))


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
        c2.append(float(np.mean(fixed - skip)))  # the mean gap in log perplexity
    # averaged on the log scale (a geometric mean of the two seeds' perplexity ratios)
    assert results["C2"].interval.mean == pytest.approx(100 * math.expm1(sum(c2) / 2), rel=1e-4)
    assert results["C2"].interval.n == 2
    # CHASE's increase (+81 %, +70 %) is far above "a few percent": one-sided against the
    # 5 % bound on the log scale, two seeds (t_{0.95, 1} = 6.314), the lower bound
    # exp(mean − 6.314·s/√2) − 1 is +43 %, above the bound: not reproduced.
    few = [math.log((11.3 + s) / (6.25 + s)) for s in (0, 1)]
    low = sum(few) / 2 - 6.313751515 * abs(few[0] - few[1]) / math.sqrt(2) / math.sqrt(2)
    assert results["C3-few"].interval.low == pytest.approx(100 * math.expm1(low))
    assert results["C3-few"].interval.low > 5.0 and results["C3-few"].verdict == NOT_REPRODUCED
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
    geometric = (1.7 * 1.75 * 1.72) ** (1 / 3)  # speedups average on the log scale
    assert c4.interval.mean == pytest.approx(geometric) and c4.verdict == REPRODUCED
    assert batch1.verdict == REPRODUCED  # below 1 at batch 1, as the paper's 0.95-0.97x
    assert growth.interval.paired and growth.interval.mean == pytest.approx((0.74 + 0.78 + 0.77) / 3)
    assert growth.verdict == REPRODUCED
    assert "1.72x [" in c4.claim.text(c4.tested)  # a ratio shows no sign
    assert speed_claims([]) == []
    # the paper's layout is judged apart and never mixed into looplab's
    padded = [{**r, "packing": "padded", "speedup": r["speedup"] - 0.5} for r in records if r["batch"] == 64]
    by_id = {r.claim.id: r for r in speed_claims(records + padded)}
    assert by_id["C4"].interval.mean == pytest.approx(geometric)
    assert by_id["C4-padded"].interval.mean == pytest.approx((1.2 * 1.25 * 1.22) ** (1 / 3))
    assert by_id["C4-padded"].verdict == REPRODUCED


# ---- degenerate spread and the family-wise correction ------------------------------------------------


def test_no_spread_only_at_exactly_zero_spread_backed_by_an_exact_test():
    """Saturated accuracies, {100, 100, 100} against {99.8, 99.8, 99.8}: every seed's
    difference is 0.2 points, so no t test exists. Fisher's exact test on the held-out
    counts pooled over seeds (1500/1500 against 1497/1500) decides: p = 0.249, no
    evidence. A gap of 50 points without spread is decided by the same test."""
    from scipy.stats import fisher_exact

    c1 = CLAIMS["C1"]
    assert c1.examples == 500
    gap = c1.difference({0: 100.0, 1: 100.0, 2: 100.0}, {0: 99.8, 1: 99.8, 2: 99.8})
    assert gap.no_spread and gap.low is None  # no zero-width interval that could read as a verdict

    def accuracy_rows(looped, base):
        return pl.DataFrame(
            [
                {"n_layers": n, "n_loops": r, "seed": s, "full_accuracy": acc, "full_ppl": 1.0}
                for s in range(3)
                for (n, r), acc in (((1, 4), looped), ((1, 1), base))
            ]
        )

    (saturated,) = loop_claims(accuracy_rows(1.0, 0.998), quality="accuracy", looped=(1, 4), base=(1, 1), deep=None)
    assert saturated.exact and saturated.p == pytest.approx(fisher_exact([[1500, 0], [1497, 3]]).pvalue)
    assert saturated.p == pytest.approx(0.2496, abs=1e-3) and saturated.verdict == NO_SPREAD
    (far,) = loop_claims(accuracy_rows(1.0, 0.5), quality="accuracy", looped=(1, 4), base=(1, 1), deep=None)
    assert far.exact and far.p < 1e-100 and far.verdict == REPRODUCED
    # a spread below one example is still a spread: the t test reads it (no rule rounds it away)
    near = c1.difference({0: 100.0, 1: 99.8, 2: 100.0}, {0: 99.8, 1: 99.8, 2: 99.8})
    assert 0 < near.sd < 0.2 and not near.no_spread and c1.p_value(near) is not None
    # a non-count measure without spread has no test at all: no evidence, and p None (counted as 1 in a family)
    flat = judge("C2", CLAIMS["C2"].interval([10.0, 10.0, 10.0]))
    assert flat.p is None and flat.verdict == NO_SPREAD


def _with_p(claim_id: str, p: float) -> ClaimResult:
    """A two-sided result whose t test gives p exactly: mean t_{1-p/2, 4}·se, se 1, df 4."""
    from scipy.stats import t

    mean = float(t.isf(p / 2, 4))
    tested = Interval(mean, None, None, 5, sd=math.sqrt(5), se=1.0, df=4).at(0.95)
    result = judge(claim_id, tested)
    assert result.p == pytest.approx(p)
    return result


def test_holm_against_a_hand_computed_case():
    """p = 0.01, 0.04, 0.03, 0.005 (m = 4, α = 0.05): sorted 0.005, 0.01, 0.03, 0.04 are
    compared with 0.05/4, 0.05/3, 0.05/2, 0.05/1: the first two are rejected, the third
    fails (0.03 > 0.025) and stops the step-down, so the fourth (0.04 ≤ 0.05) is not
    rejected either. Adjusted: 4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 0.04).
    Holm-compatible intervals: the rejected at their step's level (98.75 %, 98.33 %), the
    two others at 1 − α/(m − r) = 97.5 % with r = 2 rejected; so p = 0.04, whose 95 %
    interval excludes zero, is shown at 97.5 %, where it does not: no interval
    contradicts its verdict."""
    from scipy.stats import t

    family = ("C1", "C1-LM", "C1-depth", "C3")
    out = correct(
        [_with_p("C1", 0.01), _with_p("C1-LM", 0.04), _with_p("C1-depth", 0.03), _with_p("C3", 0.005)], family
    )
    by = {r.claim.id: r for r in out}
    assert [by[c].p_adjusted for c in family] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [by[c].verdict for c in family] == [REPRODUCED, INCONCLUSIVE, INCONCLUSIVE, REPRODUCED]
    assert [by[c].raw_verdict for c in family] == [REPRODUCED] * 4
    levels = {"C3": 1 - 0.05 / 4, "C1": 1 - 0.05 / 3, "C1-LM": 1 - 0.05 / 2, "C1-depth": 1 - 0.05 / 2}
    for c, level in levels.items():
        r = by[c]
        assert r.adjusted.low == pytest.approx(r.tested.mean - t.ppf(0.5 + level / 2, 4))
        assert (r.adjusted.low > 0) == (r.verdict == REPRODUCED)  # the interval agrees with the verdict
    assert by["C1-LM"].tested.low > 0 and by["C1-LM"].adjusted.low < 0  # the contradiction the old display had
    text = verdict_markdown(out)
    assert "Holm-compatible" in text and "(uncorrected: reproduced (direction))" in text


def test_the_family_is_fixed_a_missing_claim_counts_as_p_one():
    """p = 0.015, 0.02, 0.03 over a family of three: all rejected (0.015 ≤ 0.05/3, 0.02 ≤
    0.05/2, 0.03 ≤ 0.05). Declared as a family of four with the fourth missing: m stays
    4, so 0.015 > 0.05/4 stops the step-down and nothing is rejected."""
    three = [_with_p("C1", 0.015), _with_p("C1-LM", 0.02), _with_p("C1-depth", 0.03)]
    assert [r.verdict for r in correct(three, ("C1", "C1-LM", "C1-depth"))] == [REPRODUCED] * 3
    out = correct(three, ("C1", "C1-LM", "C1-depth", "C3"))
    assert [r.claim.id for r in out] == ["C1", "C1-LM", "C1-depth", "C3"]
    assert [r.verdict for r in out] == [INCONCLUSIVE] * 4
    assert out[3].detail == "no result" and out[3].p is None and out[3].p_adjusted == 1.0
    assert out[0].p_adjusted == pytest.approx(4 * 0.015)
    # a claim outside the family is shown, never judged
    extra = correct(three + [_with_p("C4-growth", 0.001)], ("C1", "C1-LM", "C1-depth"))
    assert extra[-1].claim.id == "C4-growth" and extra[-1].verdict == DESCRIPTIVE and extra[-1].p_adjusted is None


def test_holm_steps_by_hand():
    steps = holm([0.01, None, 0.001], 0.05)  # a missing test is p = 1 in a family of 3
    assert [s.rejected for s in steps] == [True, False, True]
    assert [s.p_adjusted for s in steps] == pytest.approx([0.02, 1.0, 0.003])
    assert [s.level for s in steps] == pytest.approx([1 - 0.05 / 2, 1 - 0.05 / 1, 1 - 0.05 / 3])


def _simulated_power(n, effect, sd, alpha, sides=2, trials=40_000):
    """The independent reference: the share of simulated paired t tests that reject."""
    from scipy.stats import t

    rng = np.random.default_rng(0)
    x = rng.normal(effect, sd, size=(trials, n))
    stat = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
    critical = t.ppf(1 - alpha / sides, n - 1)
    return float(np.mean(np.abs(stat) > critical)) if sides == 2 else float(np.mean(stat > critical))


def test_power_and_seeds_by_hand():
    """A paired t test of effect 1 with spread 1 (d = 1) at α = 0.05 two-sided: 80 %
    power needs 10 seeds (about 0.80 at 10, 0.75 at 9, against simulated tests); one-sided
    needs 8."""
    for n, sides in ((9, 2), (10, 2), (7, 1), (8, 1)):
        assert power(n, 1.0, 1.0, 0.05, sides=sides) == pytest.approx(
            _simulated_power(n, 1.0, 1.0, 0.05, sides), abs=0.01
        )
    assert power(9, 1.0, 1.0, 0.05) < 0.8 <= power(10, 1.0, 1.0, 0.05)
    assert seeds_for_power(1.0, 1.0, 0.05) == 10
    assert seeds_for_power(1.0, 1.0, 0.05, sides=1) == 8
    assert seeds_for_power(0.0, 1.0, 0.05) is None and seeds_for_power(1e-6, 1.0, 0.05) is None
    # a stricter level needs more seeds
    assert seeds_for_power(1.0, 1.0, 0.005) > seeds_for_power(1.0, 1.0, 0.05)


def test_p_values_match_the_interval():
    """The t test's two-sided p is 0.05 exactly where the 95 % interval touches the null."""
    i = mean_interval([1.0, 2.0, 3.0])
    shifted = i.low  # the null at the interval's lower end
    from analysis.claims import p_value

    assert p_value(i, shifted) == pytest.approx(0.05)
    assert p_value(i, 2.0) == pytest.approx(1.0)
