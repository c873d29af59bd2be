"""Behaviour of the Mano and p-hop tasks, checked against independent references
(`evaluate_prefix`, `hop_trace`) and hand-computed examples."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from looplab.config import ConfigError, ManoConfig, PhopConfig
from looplab.tasks import IGNORE_INDEX, make_task, mano, phop

MANO_CFG = ManoConfig(L=6, eval_count=50)
PHOP_CFG = PhopConfig(n=32, p=4, eval_count=100)


# ----------------------------------------------------------------------------- Mano


@pytest.mark.parametrize(
    "tokens, value",
    [
        (["-", "*", "3", "5", "7"], 8),  # (3 * 5 - 7) mod 23
        (["+", "22", "5"], 4),  # 27 mod 23
        (["-", "3", "5"], 21),  # subtraction wraps into 0..22
        (["*", "+", "1", "2", "-", "10", "4"], 18),  # (1 + 2) * (10 - 4) = 18
        (["7"], 7),
    ],
)
def test_evaluate_prefix_hand_examples(tokens, value):
    assert mano.evaluate_prefix(tokens) == value


@pytest.mark.parametrize("bad", [["+", "1"], ["1", "2"], []])
def test_evaluate_prefix_rejects_malformed(bad):
    with pytest.raises(ValueError):
        mano.evaluate_prefix(bad)


def test_mano_vocab_ids():
    names = mano.vocab(MANO_CFG.L)
    assert len(names) == mano.vocab_size(MANO_CFG.L) == 31 + MANO_CFG.L == MANO_CFG.vocab_size
    assert names[:23] == [str(v) for v in range(23)]
    assert names[23:30] == ["+", "-", "*", "<bos>", "<ans>", "<eos>", "<pad>"]
    assert (mano.BOS_ID, mano.ANS_ID, mano.EOS_ID, mano.PAD_ID) == (26, 27, 28, 29)
    for i in range(MANO_CFG.L + 1):
        assert names[mano.len_token_id(i)] == f"<len_{i}>"


def test_encode_instance_layout():
    ids = mano.encode_instance(["-", "*", "3", "5", "7"], 2, 8)
    assert ids == [26, mano.len_token_id(2), 24, 25, 3, 5, 7, 27, 8]
    assert mano.decode(ids) == ["<bos>", "<len_2>", "-", "*", "3", "5", "7", "<ans>", "8"]


@pytest.mark.parametrize("n_ops", [0, 1, 2, 5, 9])
def test_sample_expression_matches_reference(n_ops):
    rng = np.random.default_rng(n_ops)
    for _ in range(200):
        tokens, value = mano.sample_expression(rng, n_ops)
        assert len(tokens) == 2 * n_ops + 1
        assert sum(t in mano.OPERATORS for t in tokens) == n_ops
        assert all(t in mano.OPERATORS or 0 <= int(t) < 23 for t in tokens)
        assert value == mano.evaluate_prefix(tokens)


def test_sample_expression_varies_tree_shape():
    # With the split uniform, both a leaf and an operator follow the root operator.
    rng = np.random.default_rng(0)
    second = {mano.sample_expression(rng, 4)[0][1] in mano.OPERATORS for _ in range(100)}
    assert second == {True, False}


def _instances_in_row(ids: list[int]) -> list[tuple[int, list[int]]]:
    """(position of <ans>, expression ids) for each complete instance in a packed row."""
    found = []
    start = None
    for t, token in enumerate(ids):
        if token == mano.BOS_ID:
            start = t
        elif token == mano.ANS_ID and start is not None:
            found.append((t, ids[start + 2 : t]))
    return found


def test_mano_packed_targets_are_answers_of_preceding_expressions():
    task = make_task(MANO_CFG)
    batch = task.train_batch(step=3, batch_size=4, seq_len=96, seed=11)
    assert batch.ids.shape == batch.targets.shape == (4, 96)
    has_target = batch.targets != IGNORE_INDEX
    assert torch.equal(has_target, batch.ids == mano.ANS_ID)
    for ids, targets in zip(batch.ids.tolist(), batch.targets.tolist()):
        assert ids[0] == mano.BOS_ID
        instances = _instances_in_row(ids)
        assert len(instances) == sum(t != IGNORE_INDEX for t in targets) >= 3
        for ans_pos, expr in instances:
            n_ops = sum(tok in (mano.PLUS_ID, mano.MINUS_ID, mano.TIMES_ID) for tok in expr)
            assert 1 <= n_ops <= MANO_CFG.L
            assert ids[ans_pos - len(expr) - 1] == mano.len_token_id(n_ops)
            assert targets[ans_pos] == mano.evaluate_prefix(mano.decode(expr))


def test_mano_loss_all_targets_every_next_token():
    # The target at t is the token at t + 1 of the same packed stream.
    task = mano.ManoTask(ManoConfig(L=6, loss="all"))
    batch = task.train_batch(step=0, batch_size=3, seq_len=64, seed=0)
    assert torch.equal(batch.targets[:, :-1], batch.ids[:, 1:])
    assert (batch.targets != IGNORE_INDEX).all()
    answers = batch.targets[batch.ids == mano.ANS_ID]
    assert ((answers >= 0) & (answers < 23)).all()


def test_mano_train_batch_is_deterministic_in_seed_and_step():
    a = mano.ManoTask(MANO_CFG).train_batch(step=5, batch_size=2, seq_len=40, seed=1)
    b = mano.ManoTask(MANO_CFG).train_batch(step=5, batch_size=2, seq_len=40, seed=1)
    other_step = mano.ManoTask(MANO_CFG).train_batch(step=6, batch_size=2, seq_len=40, seed=1)
    other_seed = mano.ManoTask(MANO_CFG).train_batch(step=5, batch_size=2, seq_len=40, seed=2)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.ids, other_step.ids)
    assert not torch.equal(a.ids, other_seed.ids)


def test_mano_training_lengths_cover_one_to_L():
    batch = mano.ManoTask(MANO_CFG).train_batch(step=0, batch_size=8, seq_len=256, seed=0)
    after_bos = batch.ids[:, 1:][batch.ids[:, :-1] == mano.BOS_ID]
    lengths = {mano.decode([t])[0] for t in after_bos.tolist()}
    assert lengths == {f"<len_{i}>" for i in range(1, MANO_CFG.L + 1)}


def test_mano_eval_set_is_fixed_and_hardest_length():
    task = mano.ManoTask(MANO_CFG)
    batch = task.eval_batch()
    L = MANO_CFG.L
    assert batch.ids.shape == (MANO_CFG.eval_count, 2 * L + 5)
    assert task.eval_batch() is batch  # cached
    again = mano.ManoTask(MANO_CFG).eval_batch()
    assert torch.equal(batch.ids, again.ids) and torch.equal(batch.targets, again.targets)
    assert (batch.ids[:, 0] == mano.BOS_ID).all()
    assert (batch.ids[:, 1] == mano.len_token_id(L)).all()
    assert (batch.ids[:, 2 * L + 3] == mano.ANS_ID).all()
    assert ((batch.targets != IGNORE_INDEX).sum(dim=1) == 1).all()
    for ids, targets in zip(batch.ids.tolist(), batch.targets.tolist()):
        assert targets[2 * L + 3] == ids[-1] == mano.evaluate_prefix(mano.decode(ids[2 : 2 * L + 3]))


def test_mano_records():
    task = mano.ManoTask(MANO_CFG)
    train = task.records(count=30, seed=4, eval=False)
    assert train == task.records(count=30, seed=4, eval=False)
    assert {r["length"] for r in train} <= set(range(1, MANO_CFG.L + 1))
    for r in train:
        assert set(r) == {"length", "expression", "answer"}
        assert r["answer"] == mano.evaluate_prefix(r["expression"])
        assert len(r["expression"]) == 2 * r["length"] + 1
    evals = task.records(count=5, seed=MANO_CFG.eval_seed, eval=True)
    assert all(r["length"] == MANO_CFG.L for r in evals)
    # Same stream as the evaluation set.
    for r, ids in zip(evals, task.eval_batch().ids.tolist()):
        assert mano.encode_instance(r["expression"], r["length"], r["answer"]) == ids


# ----------------------------------------------------------------------------- p-hop


def test_hop_trace_hand_example():
    seq = [2, 0, 1, 0, 2, 1, 0]
    # From position 6 (token 0): last earlier 0 is at 3, land on 4 (token 2);
    # last earlier 2 is at 0, land on 1 (token 0); no 0 before position 1.
    assert phop.hop_trace(seq, 1) == [6, 4]
    assert phop.hop_trace(seq, 2) == [6, 4, 1]
    assert phop.hop_trace(seq, 3) is None
    assert phop.hop_trace(seq, 0) == [6]


def test_hop_trace_repeated_token_stays_put():
    # v[i-1] == v[i]: the match is the previous position, so the hop lands on i again.
    assert phop.hop_trace([3, 1, 1], 3) == [2, 2, 2, 2]


def test_phop_vocab_ids():
    a, p = 4, 3
    names = phop.vocab(a, p)
    assert len(names) == phop.vocab_size(a, p) == a + 4 + p + 1
    assert names[:a] == ["0", "1", "2", "3"]
    assert [names[f(a)] for f in (phop.bos_id, phop.ans_id, phop.pad_id, phop.eos_id)] == [
        "<bos>",
        "<ans>",
        "<pad>",
        "<eos>",
    ]
    assert names[phop.hops_token_id(a, p)] == f"<hops_{p}>"
    assert PhopConfig(n=32, p=p, alphabet=a).vocab_size == len(names)


@pytest.mark.parametrize(
    "n, p, alphabet, count",
    [
        (16, 2, 4, 200),
        (16, 14, 4, 50),
        (6, 4, 2, 50),
        (32, 4, 3, 100),
        (256, 16, 4, 10),
        (256, 32, 4, 10),
    ],
)
def test_sampled_sequences_verify_against_hop_trace(n, p, alphabet, count):
    rng = np.random.default_rng(n * 1000 + p)
    for _ in range(count):
        seq, answer = phop.sample_sequence(rng, n, p, alphabet)
        assert seq.shape == (n,) and seq.min() >= 0 and seq.max() < alphabet
        trace = phop.hop_trace(seq, p)
        assert trace is not None and len(trace) == p + 1
        assert all(a > b for a, b in zip(trace, trace[1:]))  # every hop moves left
        assert seq[trace[-1]] == answer


def test_phop_answer_is_roughly_uniform():
    rng = np.random.default_rng(0)
    counts = collections.Counter(phop.sample_sequence(rng, 32, 4, 4)[1] for _ in range(400))
    assert set(counts) == {0, 1, 2, 3}
    assert all(60 <= c <= 140 for c in counts.values()), counts  # expected 100 each


def test_phop_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="n=5, p=4, alphabet=2"):
        phop.sample_sequence(np.random.default_rng(0), 5, 4, 2)


def _check_phop_rows(batch, cfg):
    a, n = cfg.alphabet, cfg.n
    assert batch.ids.shape == batch.targets.shape == (len(batch), n + 4)
    for ids, targets in zip(batch.ids.tolist(), batch.targets.tolist()):
        assert ids[0] == phop.bos_id(a)
        assert ids[n + 1] == phop.hops_token_id(a, cfg.p)
        assert ids[n + 2] == phop.ans_id(a)
        assert [t for t in targets if t != IGNORE_INDEX] == [targets[n + 2]]
        seq = ids[1 : n + 1]
        assert targets[n + 2] == ids[-1] == seq[phop.hop_trace(seq, cfg.p)[-1]]


def test_phop_train_batch_layout_and_determinism():
    task = make_task(PHOP_CFG)
    assert task.vocab_size == PHOP_CFG.vocab_size and task.pad_id == phop.pad_id(PHOP_CFG.alphabet)
    batch = task.train_batch(step=2, batch_size=8, seq_len=64, seed=3)
    _check_phop_rows(batch, PHOP_CFG)
    same = phop.PhopTask(PHOP_CFG).train_batch(step=2, batch_size=8, seq_len=999, seed=3)
    assert torch.equal(batch.ids, same.ids)  # seq_len plays no part
    assert not torch.equal(batch.ids, task.train_batch(step=3, batch_size=8, seq_len=64, seed=3).ids)
    assert not torch.equal(batch.ids, task.train_batch(step=2, batch_size=8, seq_len=64, seed=4).ids)


def test_phop_eval_set_is_fixed():
    task = phop.PhopTask(PHOP_CFG)
    batch = task.eval_batch()
    assert len(batch) == PHOP_CFG.eval_count
    assert task.eval_batch() is batch
    again = phop.PhopTask(PHOP_CFG).eval_batch()
    assert torch.equal(batch.ids, again.ids) and torch.equal(batch.targets, again.targets)
    _check_phop_rows(batch, PHOP_CFG)


def test_phop_records():
    task = phop.PhopTask(PHOP_CFG)
    records = task.records(count=5, seed=PHOP_CFG.eval_seed)
    assert records == task.records(count=5, seed=PHOP_CFG.eval_seed)
    for r, ids in zip(records, task.eval_batch().ids.tolist()):
        assert set(r) == {"sequence", "p", "answer"} and r["p"] == PHOP_CFG.p
        assert r["sequence"] == ids[1 : PHOP_CFG.n + 1] and r["answer"] == ids[-1]


def _prefix_value(tokens: list[str], modulus: int) -> int:
    """An independent reference: recursive descent over a prefix expression."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    position = 0

    def read() -> int:
        nonlocal position
        token = tokens[position]
        position += 1
        if token in ops:
            left = read()
            return ops[token](left, read()) % modulus
        return int(token)

    value = read()
    assert position == len(tokens)
    return value


def test_mano_over_a_smaller_field_keeps_the_layout_and_the_arithmetic():
    cfg = ManoConfig(L=3, modulus=5)
    task = mano.ManoTask(cfg)
    assert cfg.vocab_size == task.vocab_size == 5 + 3 + 4 + (3 + 1) == len(mano.vocab(3, 5))
    ids = mano.TokenIds(5)
    assert (ids.ops, ids.bos, ids.ans, ids.pad, ids.length(0)) == ((5, 6, 7), 8, 9, 11, 12)
    assert mano.decode(list(range(cfg.vocab_size)), 5) == mano.vocab(3, 5)
    batch = task.train_batch(step=0, batch_size=4, seq_len=64, seed=3)
    answers = 0
    for row, targets in zip(batch.ids.tolist(), batch.targets.tolist()):
        start = None
        for t, token in enumerate(row):
            if token == ids.bos:
                start = t
            elif token == ids.ans and start is not None:
                expression = mano.decode(row[start + 2 : t], 5)
                assert all(tok in mano.OPERATORS or 0 <= int(tok) < 5 for tok in expression)
                assert targets[t] == _prefix_value(expression, 5)
                answers += 1
    assert answers >= 16
    eval_batch = task.eval_batch()
    for row, targets in zip(eval_batch.ids.tolist()[:50], eval_batch.targets.tolist()[:50]):
        assert targets[2 * 3 + 3] == _prefix_value(mano.decode(row[2 : 2 * 3 + 3], 5), 5)


def test_a_mano_modulus_that_is_not_a_prime_is_one_line():
    with pytest.raises(ConfigError, match=r"ManoConfig.modulus=4 is invalid; allowed: a prime in 2..23"):
        ManoConfig(modulus=4)
