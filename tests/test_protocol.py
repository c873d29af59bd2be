"""The miniature's frozen protocol (sweeps/protocol.py): its digest covers what decides a
verdict (from v5 on its seeds and pins too) and nothing else, its history is pinned, the
power analysis sizes its seeds, and the ledger marks a seed used under one protocol
when another uses it again, from the moment its first stage starts."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pytest

from analysis.claims import CLAIMS
from looplab.config import ConfigError
from looplab.presets import get_preset
from sweeps import power_analysis
from sweeps.ledger import Ledger
from sweeps.protocol import HISTORY, PROTOCOL, V1, V2, V3, V4, V5, Pins, history_markdown

# Pinned: a change to the protocol (its regime, arms, claims' rules, correction, seeds,
# pins) or to how it is hashed changes these. That is allowed, never silent: move the old
# protocol to HISTORY with its verdicts, judge the new one on seeds it has not seen, and
# update here.
DIGESTS = {"v1": "93fe2c4f8c75", "v2": "7d62b43fc36d", "v3": "54fd723ad155", "v4": "eb7a16dd9c01"}


def test_the_digests_are_pinned():
    assert (V1.digest(), V2.digest(), V3.digest(), V4.digest()) == tuple(DIGESTS.values())
    assert PROTOCOL is V5 and HISTORY[-1].protocol is V4
    # the Mano fields are opt-in: v1-v3, which have no Mano claim, hash as before the fields existed
    assert "mano_preset" not in V3.content() and "mano_preset" in V4.content()
    # v1-v4 kept their seeds outside the digest; v5 holds its seeds, pins and GPU setting inside
    assert "seeds" not in V4.content() and "pins" not in V4.content() and "gpu_speed" not in V4.content()
    assert {"seeds", "pins", "gpu_speed"} <= set(V5.content())


def test_v5_holds_its_seeds_and_pins_in_the_digest():
    d = V5.digest()
    assert replace(V5, name="another label", disclosed=("prose",)).digest() == d
    assert replace(V5, seeds=V5.seeds[1:] + (999,)).digest() != d  # dropping a seed and adding another
    pins = V5.pins
    assert replace(V5, pins=replace(pins, seeds={**pins.seeds, "mano": pins.seeds["mano"] - 1})).digest() != d
    assert replace(V5, pins=replace(pins, torch="2.14.0")).digest() != d
    assert replace(V5, pins=replace(pins, machine="another machine")).digest() != d
    assert replace(V5, pins=replace(pins, family=pins.family[:-1])).digest() != d
    assert replace(V5, confidence=0.9).digest() != d and replace(V5, correction="none").digest() != d
    rules = {**V5.claim_rules, "C3-few": {**V5.claim_rules["C3-few"], "sides": 2}}
    assert replace(V5, claim_rules=rules).digest() != d  # a one-sided test made two-sided is another protocol
    assert V5.with_overrides({"train.steps": 10}, {}).digest() != d
    assert V5.with_overrides({}, {}) is V5


def test_v5_seeds_are_fresh_explicit_and_per_sweep():
    used = {s for p in HISTORY for s in p.protocol.seeds} | {0, 1, 2, 10, 11, 12}  # the scan's, development's
    assert not set(V5.seeds) & used
    assert V5.seeds_of("lm") == V5.seeds[: V5.pins.seeds["lm"]] and len(V5.seeds_of("mano")) == V5.pins.seeds["mano"]
    assert V4.seeds_of("lm") == V4.seeds  # before v5: the whole block for every sweep
    for regime in (V5.lm_regime, V5.phop_regime, V5.mano_regime):  # nothing left to "auto"
        assert (regime["train.device"], regime["train.precision"], regime["train.compile"]) == ("cpu", "fp32", "on")
    # the family: every claim of v5 a CPU can test; the GPU's two are declared where they are judged
    assert set(V5.pins.family) == {c for c in V5.claim_rules if not CLAIMS[c].gpu_only}
    assert set(V5.gpu_speed.claims) == {c for c in V5.claim_rules if CLAIMS[c].gpu_only} == {"C4-batch1", "C4-growth"}


def test_the_protocol_reads_the_claims_rules_and_the_held_out_examples():
    # v5 judges v4's claims, each by today's rule (C3-growth is the scan's own protocol)
    assert set(PROTOCOL.claim_rules) == set(V4.claim_rules) and "C3-growth" in CLAIMS
    assert PROTOCOL.claim_rules == {c: CLAIMS[c].rule() for c in PROTOCOL.claim_rules}
    # C1's exact test counts the held-out examples of the p-hop preset the protocol trains
    assert "task.eval_count" not in PROTOCOL.phop_regime and "task.eval_count" not in PROTOCOL.mano_regime
    assert CLAIMS["C1"].examples == get_preset(PROTOCOL.phop_preset).task.eval_count
    assert CLAIMS["C1-mano"].examples == get_preset(PROTOCOL.mano_preset).task.eval_count


def test_a_bad_declaration_is_one_line():
    with pytest.raises(ConfigError, match="Protocol.correction='bonferroni' is invalid; allowed: holm | none"):
        replace(PROTOCOL, correction="bonferroni")
    with pytest.raises(ConfigError, match="Protocol.matched"):
        replace(PROTOCOL, matched={"C3": "no-such-arm"})
    with pytest.raises(
        ConfigError, match=r"Protocol.mano_pairs=\(\(1, 4\), \(2, 1\)\) is invalid; allowed: \(N, R\) pairs"
    ):
        replace(PROTOCOL, mano_pairs=((1, 4), (2, 1)))  # no iso-parameter 1⊗1 to compare with
    with pytest.raises(ConfigError, match="Protocol.mano_preset='mano-debug' is invalid with mano_pairs=()"):
        replace(PROTOCOL, mano_pairs=())
    with pytest.raises(ConfigError, match=r"Pins.seeds\['lm'\]=1 is invalid"):
        replace(V5.pins, seeds={"lm": 1})
    with pytest.raises(ConfigError, match="Pins.family='C9' is invalid"):
        replace(V5, pins=replace(V5.pins, family=("C9",)))
    with pytest.raises(ConfigError, match="Protocol.seeds=.* is invalid; allowed: 18 distinct seeds"):
        replace(V5, seeds=V5.seeds[:5])


def test_the_history_keeps_every_protocol_with_its_verdicts():
    assert [p.protocol.lm_regime["train.seq_len"] for p in HISTORY] == [512, 128, 128, 128]  # the 512-token run
    assert [set(p.protocol.seeds) for p in HISTORY] == [{100, 101, 102}] * 2 + [
        set(range(200, 205)),
        set(range(300, 305)),
    ]
    text = history_markdown({"C1": "+1.00 pt [+0.50, +1.50]: reproduced (direction)"})
    assert all(d in text for d in DIGESTS.values()) and V5.digest() in text
    assert "| C4-growth | +0.46x [−0.05, +0.96]: inconclusive | +0.35x [+0.20, +0.49]: reproduced |" in text
    assert "| C1-mano | — | — | — | +12.84 pt [−0.47, +26.15]: inconclusive |" in text
    assert "+1.00 pt [+0.50, +1.50]: reproduced (direction) |" in text


def test_the_power_analysis_reads_the_recorded_intervals_by_hand():
    """C3-few under v3 and v4: +3.43 % [+2.27, +4.59] and +3.75 % [+1.87, +5.62], five seeds
    each, read on the log scale v5 tests it on: half-widths over t_{0.975, 4} = 2.776 give
    each protocol's spread, pooled over their 4 + 4 degrees of freedom; the effect is the
    pooled mean's distance below the log of the 5 % bound."""
    import math

    def log(v):
        return math.log1p(v / 100)

    sd3 = (log(4.59) - log(2.27)) / 2 / 2.7764451 * math.sqrt(5)
    sd4 = (log(5.62) - log(1.87)) / 2 / 2.7764451 * math.sqrt(5)
    few = {r.claim: r for r in power_analysis.needs(V5)}["C3-few"]
    assert few.sources == ("v3", "v4") and few.seeds_behind == 10
    assert few.spread == pytest.approx(math.sqrt((sd3**2 + sd4**2) / 2), rel=1e-6)
    assert few.effect == pytest.approx((log(3.43) + log(3.75)) / 2 - log(5.0), rel=1e-6)
    assert few.level == pytest.approx(0.05 / len(V5.pins.family))
    # v5 declares at least what every family claim needs for 80 % power
    for need in power_analysis.needs(V5):
        assert need.needs is not None and need.declared >= need.needs, need
        assert need.power_declared >= 0.8
    # a claim recorded with Welch's interval reads the wider degrees of freedom (2(n − 1))
    c1 = {r.claim: r for r in power_analysis.needs(V5)}["C1"]
    assert c1.spread == pytest.approx((20.86 - 8.02) / 2 / 2.3060041 * math.sqrt(5), rel=1e-6)
    assert "power analysis" in power_analysis.text(V5) and "C3-few" in power_analysis.text(V5)


# ---- the ledger ------------------------------------------------------------------------------------------


def test_the_ledger_marks_a_seed_used_under_an_earlier_protocol(tmp_path):
    a, b = PROTOCOL, PROTOCOL.with_overrides({"train.steps": 10}, {})
    ledger = Ledger(tmp_path, committed=None)
    assert [r["fresh"] for r in ledger.status([400, 401], a)] == [True, True]  # never used
    ledger.start([400, 401], a, exploratory=False)  # as their first stage starts, before any verdict
    assert [r["fresh"] for r in ledger.status([400, 401], a)] == [True, True]  # first used under a itself
    ledger.start([400, 401], a, exploratory=False)  # once per (seed, protocol, event)
    ledger.record([400, 401], a)
    lines = [json.loads(line) for line in (tmp_path / "protocol_ledger.jsonl").read_text().splitlines()]
    assert [(d["seed"], d["event"]) for d in lines] == [
        (400, "started"),
        (401, "started"),
        (400, "scored"),
        (401, "scored"),
    ]
    assert {"machine", "commit", "dirty", "exploratory"} <= set(lines[0])
    status = ledger.status([400, 402], b)
    assert status[0]["fresh"] is False and status[0]["first_used_under"] == a.digest()
    assert status[1]["fresh"] is True
    # a seed trained and looked at but never scored is spent all the same
    ledger.start([402], b, exploratory=True)
    assert ledger.status([402], a)[0]["fresh"] is False
    # and a seed first seen in an exploratory run of this very protocol is spent for its headline
    ledger.start([403], a, exploratory=True)
    assert ledger.status([403], a)[0]["fresh"] is False
    # the committed history counts for every store: 100-102 were v1's, 300-304 v4's
    assert ledger.status([100], a)[0]["first_used_under"] == V1.digest()
    assert ledger.status([303], a)[0]["first_used_under"] == V4.digest()


def test_the_committed_ledger_counts_before_the_stores(tmp_path):
    committed = tmp_path / "committed.jsonl"
    committed.write_text(json.dumps({"seed": 77, "protocol": "abc", "name": "elsewhere", "event": "scored"}) + "\n")
    ledger = Ledger(tmp_path / "store", committed=committed)
    ledger.start([77], PROTOCOL, exploratory=False)
    assert ledger.status([77], PROTOCOL)[0]["first_used_under"] == "abc"


def test_the_ledger_is_read_and_written_through_the_store(tmp_path):
    """One file for the dry run and the run, local or on an object store (memory:// here)."""
    store = f"memory://ledger-{uuid.uuid4().hex[:8]}/mini"
    Ledger(store, committed=None).start([610], PROTOCOL, exploratory=False)
    again = Ledger(store, committed=None)
    assert again.path == f"{store}/protocol_ledger.jsonl"
    assert [e["seed"] for e in again.entries()][-1] == 610
    assert Ledger(store, committed=None).status([610], PROTOCOL.with_overrides({"x": 1}, {}))[0]["fresh"] is False


def test_a_torn_ledger_is_one_line(tmp_path):
    (tmp_path / "protocol_ledger.jsonl").write_text('{"seed": 1, "protocol": "x"}\n{"seed": \n')
    with pytest.raises(ConfigError, match="protocol_ledger.jsonl:2 is not a ledger line"):
        Ledger(tmp_path, committed=None).entries()


def test_pins_are_validated():
    assert isinstance(V5.pins, Pins)
    with pytest.raises(ConfigError, match="Pins.seeds"):
        Pins(family=(), seeds={"vision": 3}, torch="", machine="", stages="", analysis="")
