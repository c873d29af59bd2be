"""The miniature's frozen protocol (sweeps/protocol.py): its digest covers what decides a
verdict and nothing else, its history is pinned, and the ledger marks a seed scored under
one protocol when another scores it again."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from analysis.claims import CLAIMS
from looplab.config import ConfigError
from looplab.presets import get_preset
from sweeps.protocol import HISTORY, PROTOCOL, V1, V2, V3, Ledger, history_markdown

# Pinned: a change to the protocol (its regime, arms, claims' rules, correction) or to how
# it is hashed changes these. That is allowed, never silent: move the old protocol to
# HISTORY with its verdicts, judge the new one on seeds it has not seen, and update here.
DIGESTS = {"v1": "93fe2c4f8c75", "v2": "7d62b43fc36d", "v3": "54fd723ad155", "v4": "eb7a16dd9c01"}


def test_the_digests_are_pinned():
    assert (V1.digest(), V2.digest(), V3.digest(), PROTOCOL.digest()) == tuple(DIGESTS.values())
    # the Mano fields are opt-in: v1-v3, which have no Mano claim, hash as before the fields existed
    assert "mano_preset" not in V3.content() and "mano_preset" in PROTOCOL.content()


def test_the_digest_covers_the_rules_not_the_label_or_the_seeds():
    assert replace(PROTOCOL, name="another label", seeds=(7,)).digest() == PROTOCOL.digest()
    assert replace(PROTOCOL, confidence=0.9).digest() != PROTOCOL.digest()
    assert replace(PROTOCOL, correction="none").digest() != PROTOCOL.digest()
    rules = {**PROTOCOL.claim_rules, "C3-few": {**PROTOCOL.claim_rules["C3-few"], "null": 4.0}}
    assert replace(PROTOCOL, claim_rules=rules).digest() != PROTOCOL.digest()  # a moved margin is another protocol
    assert PROTOCOL.with_overrides({"train.steps": 10}, {}).digest() != PROTOCOL.digest()
    assert PROTOCOL.with_overrides({}, {}) is PROTOCOL


def test_the_protocol_reads_the_claims_rules_and_the_metric_resolution():
    assert PROTOCOL.claim_rules == {c.id: c.rule() for c in CLAIMS.values()}
    # C1's resolution is one held-out example of the p-hop preset the protocol trains
    eval_count = get_preset(PROTOCOL.phop_preset).task.eval_count
    assert "task.eval_count" not in PROTOCOL.phop_regime
    assert CLAIMS["C1"].resolution == pytest.approx(100 / eval_count)
    # and C1-mano's one held-out example of the Mano preset
    assert "task.eval_count" not in PROTOCOL.mano_regime
    assert CLAIMS["C1-mano"].resolution == pytest.approx(100 / get_preset(PROTOCOL.mano_preset).task.eval_count)


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


def test_the_history_keeps_every_protocol_with_its_verdicts():
    assert [p.protocol.lm_regime["train.seq_len"] for p in HISTORY] == [512, 128, 128]  # the 512-token run included
    assert [set(p.protocol.seeds) for p in HISTORY] == [{100, 101, 102}] * 2 + [{200, 201, 202, 203, 204}]
    assert not set(PROTOCOL.seeds) & {s for p in HISTORY for s in p.protocol.seeds}  # fresh judges
    text = history_markdown({"C1": "+1.00 pt [+0.50, +1.50]: reproduced (direction)"})
    assert all(d in text for d in DIGESTS.values())
    assert "| C4-growth | +0.46x [−0.05, +0.96]: inconclusive | +0.35x [+0.20, +0.49]: reproduced |" in text
    assert "| C1 | +9.00 pt" in text and "+1.00 pt [+0.50, +1.50]: reproduced (direction) |" in text


def test_the_ledger_marks_a_seed_scored_under_an_earlier_protocol(tmp_path):
    a, b = PROTOCOL, PROTOCOL.with_overrides({"train.steps": 10}, {})
    ledger = Ledger(tmp_path)
    assert [r["fresh"] for r in ledger.status([400, 401], a)] == [True, True]  # never scored
    ledger.record([400, 401], a)
    assert [r["fresh"] for r in ledger.status([400, 401], a)] == [True, True]  # first scored under a itself
    ledger.record([400, 401], a)  # once per (seed, protocol)
    assert len((tmp_path / "protocol_ledger.jsonl").read_text().splitlines()) == 2
    status = ledger.status([400, 402], b)
    assert status[0]["fresh"] is False and status[0]["first_scored_under"] == a.digest()
    assert status[1]["fresh"] is True
    ledger.record([400, 402], b)
    assert ledger.first_scored()[400][0] == a.digest() and ledger.first_scored()[402][0] == b.digest()
    # the committed history counts for every store: 100-102 were v1's
    assert ledger.status([100], a)[0]["first_scored_under"] == V1.digest()
    lines = [json.loads(line) for line in (tmp_path / "protocol_ledger.jsonl").read_text().splitlines()]
    assert [(d["seed"], d["protocol"]) for d in lines] == [
        (400, a.digest()),
        (401, a.digest()),
        (400, b.digest()),
        (402, b.digest()),
    ]


def test_a_torn_ledger_is_one_line(tmp_path):
    (tmp_path / "protocol_ledger.jsonl").write_text('{"seed": 1, "protocol": "x"}\n{"seed": \n')
    with pytest.raises(ConfigError, match="protocol_ledger.jsonl:2 is not a ledger line"):
        Ledger(tmp_path).entries()
