"""Mano (paper App. B): prefix arithmetic over F_23, answered in a single token.

An instance is a random binary expression tree with exactly ℓ operations over
{+, -, *} and leaves in 0..22, written in prefix notation and evaluated mod 23:

    <bos> <len_3> - * a b + c d <ans> answer

Token ids are fixed so that a number token's id IS its value (ids 0..22); this
keeps encoding trivial and makes the answer token id equal to the answer.

`modulus` (default the paper's 23) shrinks the field for small models: the three
operation tables have modulus² entries each, which a d = 64 model does not learn
from F_23 in minutes, while the task's structure (trees, prefix parsing, composed
operations, one answer token) stays the same. The ids follow the numbers: operators
at modulus.., then the specials, then the length tokens.

Training draws ℓ ~ U[1, L] and packs instances back to back into each row
(sequence packing); evaluation uses only the hardest length ℓ = L, one instance
per row. Every batch is a pure function of (seed, step), so a resumed run sees
exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Literal

import numpy as np

from looplab.fields import check, check_choice, check_ints, keyed
from looplab.tasks.base import IGNORE_INDEX, Batch, batch_from_numpy, stream_rng

if TYPE_CHECKING:  # tensors are made by tasks/base.py: config.py reads this module's config without torch
    import torch

MODULUS = 23  # the paper's field
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23)  # a modulus makes a field, as the paper's F_23 does
OPERATORS = ("+", "-", "*")
SPECIALS = ("<bos>", "<ans>", "<eos>", "<pad>")


@dataclass(frozen=True)
class TokenIds:
    """The token ids of Mano over Z_modulus: numbers 0..modulus-1 are their own ids."""

    modulus: int

    @property
    def ops(self) -> tuple[int, int, int]:  # +, -, *
        return (self.modulus, self.modulus + 1, self.modulus + 2)

    @property
    def bos(self) -> int:
        return self.modulus + 3

    @property
    def ans(self) -> int:
        return self.modulus + 4

    @property
    def eos(self) -> int:
        return self.modulus + 5

    @property
    def pad(self) -> int:
        return self.modulus + 6

    def length(self, i: int) -> int:
        """Id of the length token <len_i>."""
        return self.modulus + 7 + i

    def op_by_name(self, name: str) -> int:
        return self.ops[OPERATORS.index(name)]

    def apply(self, op_id: int, left: int, right: int) -> int:
        m = self.modulus
        if op_id == self.ops[0]:
            return (left + right) % m
        if op_id == self.ops[1]:
            return (left - right) % m  # Python's % keeps the result in 0..m-1
        return (left * right) % m


DEFAULT_IDS = TokenIds(MODULUS)
PLUS_ID, MINUS_ID, TIMES_ID = DEFAULT_IDS.ops
BOS_ID, ANS_ID, EOS_ID, PAD_ID = DEFAULT_IDS.bos, DEFAULT_IDS.ans, DEFAULT_IDS.eos, DEFAULT_IDS.pad


def len_token_id(i: int, modulus: int = MODULUS) -> int:
    """Id of the length token <len_i>."""
    return TokenIds(modulus).length(i)


def vocab(L: int, modulus: int = MODULUS) -> list[str]:
    """Token strings, indexed by id: numbers, operators, specials, <len_0>..<len_L>."""
    numbers = [str(v) for v in range(modulus)]
    lengths = [f"<len_{i}>" for i in range(L + 1)]
    return numbers + list(OPERATORS) + list(SPECIALS) + lengths


def vocab_size(L: int, modulus: int = MODULUS) -> int:
    return TokenIds(modulus).length(L + 1)


@dataclass(frozen=True)
class ManoConfig:
    """Mano (App. B): prefix arithmetic over F_23 with at most L operations."""

    kind: Literal["mano"] = keyed(
        "mano"
    )  # mano | phop | text: setting task.kind resets the task to that kind's defaults
    L: int = keyed(10)  # most operations in an expression: training draws 1..L, evaluation uses L
    modulus: int = keyed(MODULUS)  # the field Z_modulus (the paper: 23); smaller for small models
    eval_count: int = keyed(2000)  # samples in the fixed evaluation set
    eval_seed: int = keyed(20_231)  # seed of the evaluation set (apart from the training stream's)
    # Where the training loss applies: only at answer positions, or on every token.
    loss: Literal["answer", "all"] = keyed("answer")

    def __post_init__(self) -> None:
        check_choice(self, "kind", ("mano",))
        check_ints(self, "L", "eval_count")
        check(
            isinstance(self.modulus, int) and self.modulus in _PRIMES,
            "ManoConfig.modulus",
            self.modulus,
            f"a prime in {_PRIMES[0]}..{_PRIMES[-1]}",
        )
        check_ints(self, "eval_seed", minimum=0)
        check_choice(self, "loss", ("answer", "all"))

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.L, self.modulus)

    def row_length(self, seq_len: int) -> int:
        """Tokens in one training row: samples packed to train.seq_len."""
        return seq_len


def _uniform_stream(rng: np.random.Generator, chunk: int = 4096) -> Iterator[float]:
    """Endless uniforms in [0, 1), drawn from rng in chunks: one Generator call per
    chunk instead of one per tree node, which would dominate the sampling cost."""
    while True:
        yield from rng.random(chunk).tolist()


def _build_expression(uniforms: Iterator[float], n_ops: int, ids: TokenIds = DEFAULT_IDS) -> tuple[list[int], int]:
    """Prefix token ids and value of a random tree with exactly n_ops operations,
    consuming 3 * n_ops + 1 uniforms (one per leaf, operator and split)."""
    tokens: list[int] = []

    def build(ops_here: int) -> int:
        if ops_here == 0:
            leaf = int(next(uniforms) * ids.modulus)
            tokens.append(leaf)
            return leaf
        op_id = ids.ops[int(next(uniforms) * 3)]
        tokens.append(op_id)
        # The other ops_here - 1 operations go left or right; the left share is
        # uniform in 0..ops_here-1, so trees of every shape occur.
        left_ops = int(next(uniforms) * ops_here)
        left = build(left_ops)
        right = build(ops_here - 1 - left_ops)
        return ids.apply(op_id, left, right)

    value = build(n_ops)
    return tokens, value


def _sample_expression_ids(rng: np.random.Generator, n_ops: int, ids: TokenIds = DEFAULT_IDS) -> tuple[list[int], int]:
    if n_ops < 0:
        raise ValueError(f"n_ops={n_ops} is invalid; allowed: an integer >= 0")
    return _build_expression(iter(rng.random(3 * n_ops + 1).tolist()), n_ops, ids)


def sample_expression(rng: np.random.Generator, n_ops: int, modulus: int = MODULUS) -> tuple[list[str], int]:
    """A random expression with exactly n_ops operations: (prefix tokens, value mod modulus)."""
    ids, value = _sample_expression_ids(rng, n_ops, TokenIds(modulus))
    return decode(ids, modulus), value


def evaluate_prefix(tokens: Iterable[str], modulus: int = MODULUS) -> int:
    """Value mod modulus of a prefix expression given as strings, e.g. ["+", "22", "5"] -> 4.

    Reads right to left with a stack, independently of how expressions are sampled,
    so it can serve as the reference in tests.
    """
    ids = TokenIds(modulus)
    stack: list[int] = []
    for token in reversed(list(tokens)):
        if token in OPERATORS:
            if len(stack) < 2:
                raise ValueError(f"malformed prefix expression: operator {token!r} lacks operands")
            left, right = stack.pop(), stack.pop()
            stack.append(ids.apply(ids.op_by_name(token), left, right))
        else:
            stack.append(int(token) % modulus)
    if len(stack) != 1:
        raise ValueError(f"malformed prefix expression: {len(stack)} values left over")
    return stack[0]


def encode_instance(tokens: Iterable[str | int], n_ops: int, answer: int, modulus: int = MODULUS) -> list[int]:
    """`<bos> <len_n_ops> expr... <ans> answer` as ids (expression as strings or ids)."""
    ids = TokenIds(modulus)
    return _instance_ids([_token_id(t, ids) for t in tokens], n_ops, answer, ids)


def _token_id(token: str | int, ids: TokenIds) -> int:
    if isinstance(token, (int, np.integer)):
        return int(token)
    return ids.op_by_name(token) if token in OPERATORS else int(token)


def decode(ids: Iterable[int] | torch.Tensor | np.ndarray, modulus: int = MODULUS) -> list[str]:
    """Token strings for ids, for people reading batches."""
    if hasattr(ids, "tolist"):  # a tensor or an array (asked of the value: this module imports no torch)
        ids = ids.tolist()
    first_len = TokenIds(modulus).length(0)
    return [_token_name(int(i), modulus, first_len) for i in ids]


def _token_name(token_id: int, modulus: int, first_len: int) -> str:
    # Computed rather than looked up in vocab(L) so decode needs no L.
    if 0 <= token_id < modulus:
        return str(token_id)
    if modulus <= token_id < first_len:
        return (OPERATORS + SPECIALS)[token_id - modulus]
    if token_id >= first_len:
        return f"<len_{token_id - first_len}>"
    raise ValueError(f"token id {token_id} is not a Mano token id")


def _instance_ids(expr_ids: list[int], n_ops: int, answer: int, ids: TokenIds) -> list[int]:
    # encode_instance for an expression already in ids: the hot path skips the
    # per-token string handling.
    return [ids.bos, ids.length(n_ops), *expr_ids, ids.ans, answer]


def _sample_instance(rng: np.random.Generator, n_ops: int, ids: TokenIds) -> list[int]:
    expr_ids, answer = _sample_expression_ids(rng, n_ops, ids)
    return _instance_ids(expr_ids, n_ops, answer, ids)


class ManoTask:
    """Batches for Mano: packed training rows and a fixed ℓ = L evaluation set."""

    def __init__(self, cfg: ManoConfig):
        self.cfg = cfg
        self.ids = TokenIds(cfg.modulus)
        self.vocab_size = vocab_size(cfg.L, cfg.modulus)
        self.pad_id = self.ids.pad

    def _train_length(self, rng: np.random.Generator) -> int:
        return int(rng.integers(1, self.cfg.L + 1))

    def _packed_row(self, uniforms: Iterator[float], n_tokens: int) -> list[int]:
        """Whole instances back to back until n_tokens are filled; the last is cut."""
        buf: list[int] = []
        while len(buf) < n_tokens:
            n_ops = 1 + int(next(uniforms) * self.cfg.L)  # ℓ ~ U[1, L]
            expr_ids, answer = _build_expression(uniforms, n_ops, self.ids)
            buf.extend(_instance_ids(expr_ids, n_ops, answer, self.ids))
        return buf[:n_tokens]

    def train_batch(self, step: int, batch_size: int, seq_len: int, seed: int, start: int = 0) -> Batch:
        """Packed rows of seq_len tokens; the target at t is the token at t + 1.

        With loss="answer" only positions holding <ans> carry a target (the answer);
        an instance cut off before its answer contributes none. Deterministic in
        (seed, step, start).

        start: the rows of the seed's stream consumed before this run's step 0
        (TrainConfig.data_start). Each step draws from one rng (base.stream_rng): the
        stream's own step start // batch_size + step when start is a whole number of
        batches (a parent's stream continued exactly when the batch size is unchanged),
        else a stream keyed by start too, disjoint from every other start's.
        """
        uniforms = _uniform_stream(stream_rng(seed, step, batch_size, start))
        rows = np.array([self._packed_row(uniforms, seq_len + 1) for _ in range(batch_size)], dtype=np.int64)
        ids, next_tokens = rows[:, :-1], rows[:, 1:]
        if self.cfg.loss == "all":
            targets = next_tokens
        else:
            targets = np.where(ids == self.ids.ans, next_tokens, IGNORE_INDEX)
        return batch_from_numpy(ids.copy(), np.ascontiguousarray(targets))

    @functools.cached_property
    def _eval_batch(self) -> Batch:
        rng = np.random.default_rng([self.cfg.eval_seed, 1])
        rows = np.array(
            [_sample_instance(rng, self.cfg.L, self.ids) for _ in range(self.cfg.eval_count)], dtype=np.int64
        )
        # Rows are whole instances (2L + 5 tokens, answer included as the last input,
        # which a causal model cannot see from the <ans> position that predicts it).
        ans_position = rows.shape[1] - 2
        targets = np.full_like(rows, IGNORE_INDEX)
        targets[:, ans_position] = rows[:, -1]
        return batch_from_numpy(rows, targets)

    def eval_batch(self) -> Batch:
        """The fixed evaluation set: eval_count instances with ℓ = L, one per row,
        target only at the <ans> position. Built once and cached."""
        return self._eval_batch

    def records(self, count: int, seed: int, eval: bool) -> list[dict]:
        """Human-readable instances: {"length", "expression", "answer"}.

        eval=True draws ℓ = L from the same stream as the evaluation set, so
        records(k, cfg.eval_seed, eval=True) lists its first k instances;
        eval=False draws ℓ ~ U[1, L].
        """
        rng = np.random.default_rng([seed, 1 if eval else 2])
        out = []
        for _ in range(count):
            length = self.cfg.L if eval else self._train_length(rng)
            expression, answer = sample_expression(rng, length, self.cfg.modulus)
            out.append({"length": length, "expression": expression, "answer": answer})
        return out

    def decode(self, ids: Iterable[int] | torch.Tensor | np.ndarray) -> list[str]:
        return decode(ids)
