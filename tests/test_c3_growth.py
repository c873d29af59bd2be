"""C3-growth's preregistered protocol (sweeps/protocol.C3_GROWTH, sweeps/c3_growth.py):
declared and hashed before its seeds train, on seeds nothing else used, the measure (a
per-seed slope of the paired gap against log2 of the pre-training steps) by hand, its
one-sided verdict, and a dry run that says whether a run would be the verdict."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import polars as pl
import pytest

from analysis import names
from analysis.claims import NOT_REPRODUCED, REPRODUCED, SEARCHED
from sweeps import c3_growth
from sweeps.protocol import C3_GROWTH, HISTORY, V5
from sweeps.scale_scan import SEEDS as SCAN_SEEDS

# Pinned: a change to the declaration is another protocol, declared before its seeds train.
DIGEST = "b0c501816374"


def test_the_declaration_is_pinned_and_its_seeds_fresh():
    assert C3_GROWTH.digest() == DIGEST
    assert replace(C3_GROWTH, name="another label", evidence="").digest() == DIGEST
    assert replace(C3_GROWTH, seeds=(700, 701, 702)).digest() != DIGEST
    assert replace(C3_GROWTH, values=(200, 400, 800)).digest() != DIGEST
    used = {s for p in HISTORY for s in p.protocol.seeds} | set(V5.seeds) | {int(s) for s in SCAN_SEEDS.split(",")}
    assert not set(C3_GROWTH.seeds) & used
    assert C3_GROWTH.claim_rule["sides"] == 1 and C3_GROWTH.claim_rule["direction"] == 1


def test_the_sweep_is_the_scans_pretraining_axis():
    sweep = c3_growth.growth_sweep()
    assert sorted({p["pretrain_steps"] for p in sweep.points}) == list(C3_GROWTH.values)
    assert {p["stage_steps"] for p in sweep.points} == {v // 4 for v in C3_GROWTH.values}
    assert {p["seq_len"] for p in sweep.points} == {512}  # the scan's centre otherwise
    assert sweep.spec.overrides["train.compile"] == "on" and sweep.spec.overrides["train.device"] == "cpu"
    with pytest.raises(Exception, match="GrowthProtocol.values"):
        c3_growth.growth_sweep(replace(C3_GROWTH, values=(100, 200)))


def _trials(gaps: dict[int, list[float]]) -> pl.DataFrame:
    """Trial measures of the growth sweep: CHASE's increase 5 % everywhere, Ouro's 5 % plus
    the seed's gap at each of the declared steps."""
    rows = []
    for seed, gap in gaps.items():
        for steps, g in zip(C3_GROWTH.values, gap):
            for method, increase in (("Ouro", 5.0 + g), ("CHASE", 5.0)):
                rows.append(
                    {"seed": seed, "method": method, SEARCHED + "pretrain_steps": steps, names.SKIP_INCREASE: increase}
                )
    return pl.DataFrame(rows)


def test_the_slope_of_the_gap_by_hand():
    """log2 of 200, 400, 800, 1600 is x0 + 0, 1, 2, 3: least-squares weights (−1.5, −0.5,
    +0.5, +1.5)/5, so gaps 2, 4, 6, 8 give a slope of 2 per doubling, and 3, 3, 3, 3 none."""
    slopes = c3_growth.seed_slopes(_trials({700: [2, 4, 6, 8], 701: [3, 3, 3, 3], 702: [1, 0, 2, 5]}))
    assert slopes[700] == pytest.approx(2.0) and slopes[701] == pytest.approx(0.0)
    assert slopes[702] == pytest.approx((-1.5 * 1 - 0.5 * 0 + 0.5 * 2 + 1.5 * 5) / 5)
    assert c3_growth.slope([200.0], [1.0]) is None


def test_the_verdict_is_one_sided_above_zero():
    """Seeds whose gaps rise by exactly 2.0, 2.5, 1.5 and 3.0 points per doubling: the
    slopes' mean 2.25, s 0.645, one-sided bound 2.25 − 2.353·0.323 = 1.49 above zero."""
    rising = {700 + i: [1 + k * a for k in range(4)] for i, a in enumerate((2.0, 2.5, 1.5, 3.0))}
    grows = c3_growth.judge_growth(_trials(rising))
    assert grows.verdict == REPRODUCED and grows.tested.sides == 1 and grows.tested.n == 4
    assert grows.tested.mean == pytest.approx(2.25)
    sd = statistics.stdev([2.0, 2.5, 1.5, 3.0])
    assert grows.tested.low == pytest.approx(2.25 - 2.353363435 * sd / 2)
    falling = {700 + i: [8 - k * a for k in range(4)] for i, a in enumerate((2.0, 2.1, 1.9, 2.2))}
    assert c3_growth.judge_growth(_trials(falling)).verdict == NOT_REPRODUCED
    assert math.isfinite(grows.p)


def test_the_dry_run_says_whether_a_run_would_be_the_verdict(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sweeps.estimate.estimate", lambda *a, **k: type("E", (), {"text": lambda self: "est"})())
    assert c3_growth.main(["--dry-run", "--storage-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"digest {DIGEST}" in out and "this run would be the verdict" in out and "power at these seeds: 0.99" in out
    assert "pretrain_steps: 200, 400, 800, 1600" in out
    assert c3_growth.main(["--dry-run", "--storage-path", str(tmp_path), "--seeds", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "EXPLORATORY" in out and "seeds 0, 1 are not the declared 700, 701, 702, 703" in out
