"""p-hop induction (paper App. C): follow p induction hops back through a sequence.

A sequence v = (v_1..v_n) is drawn over the alphabet {0..a-1}. One hop from
position i goes to j + 1, where j < i is the most recent earlier occurrence of
v_i ("find the previous occurrence of the current token, step one to the
right"). Starting at i = n, the answer y is the token reached after p hops.
A sample is written as

    <bos> v_1 ... v_n <hops_p> <ans> y        (n + 4 tokens; 260 in the paper)

and the loss applies only at the <ans> position, whose target is y.

Random sequences rarely have a long valid chain (a hop from i lands back on i
whenever v_{i-1} = v_i, and then stays there), so samples are built chain
first: choose the chain, make its tokens consistent, fill the rest without
breaking it, then verify the chain with the plain reference `hop_trace`.

Positions in code are 0-based (the paper's are 1-based).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from looplab.errors import check
from looplab.fields import check_choice, check_ints, keyed
from looplab.tasks.base import IGNORE_INDEX, Batch, batch_from_numpy, stream_rng

MAX_TRIES = 100


def bos_id(alphabet: int) -> int:
    return alphabet


def ans_id(alphabet: int) -> int:
    return alphabet + 1


def pad_id(alphabet: int) -> int:
    return alphabet + 2


def eos_id(alphabet: int) -> int:
    return alphabet + 3


def hops_token_id(alphabet: int, k: int) -> int:
    """Id of <hops_k>, the token telling the model how many hops to follow."""
    return alphabet + 4 + k


def vocab(alphabet: int, p: int) -> list[str]:
    """Token strings, indexed by id: alphabet "0".."a-1", specials, <hops_0>..<hops_p>."""
    symbols = [str(t) for t in range(alphabet)]
    return symbols + ["<bos>", "<ans>", "<pad>", "<eos>"] + [f"<hops_{k}>" for k in range(p + 1)]


def vocab_size(alphabet: int, p: int) -> int:
    return alphabet + 4 + p + 1


@dataclass(frozen=True)
class PhopConfig:
    """p-hop induction (App. C): alphabet a, sequence length n, p hops."""

    kind: Literal["phop"] = keyed(
        "phop"
    )  # mano | phop | text: setting task.kind resets the task to that kind's defaults
    n: int = keyed(256)  # sequence length (a sample is n + 4 tokens)
    p: int = keyed(16)  # hops from the last position to the answer (at most n - 2)
    alphabet: int = keyed(4)  # how many tokens the sequence is drawn from
    eval_count: int = keyed(10_000)  # samples in the fixed evaluation set
    eval_seed: int = keyed(20_232)  # seed of the evaluation set (apart from the training stream's)

    def __post_init__(self) -> None:
        check_choice(self, "kind", ("phop",))
        check_ints(self, "n", minimum=3)
        check_ints(self, "p", "eval_count")
        check_ints(self, "alphabet", minimum=2)
        check_ints(self, "eval_seed", minimum=0)
        # p distinct jump targets must fit before the last two positions.
        check(self.p <= self.n - 2, "PhopConfig.p", self.p, f"an integer in [1, n-2={self.n - 2}]")

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.alphabet, self.p)

    def row_length(self, seq_len: int) -> int:
        """Tokens in one training row: a whole sample of n + 4 tokens, whatever
        train.seq_len says (train_batch ignores it)."""
        return self.n + 4


def hop_trace(seq, p: int) -> list[int] | None:
    """0-based positions visited by p hops from the last position: [i_0, ..., i_p]
    (p + 1 entries), or None if some hop finds no earlier occurrence.

    Deliberately the plainest possible scan, independent of the sampler, so it can
    verify it.
    """
    tokens = np.asarray(seq).tolist()
    if not tokens:
        raise ValueError("hop_trace: the sequence is empty")
    position = len(tokens) - 1
    trace = [position]
    for _ in range(p):
        current = tokens[position]
        j = position - 1
        while j >= 0 and tokens[j] != current:
            j -= 1
        if j < 0:
            return None
        position = j + 1
        trace.append(position)
    return trace


def _check_sizes(n: int, p: int, alphabet: int) -> None:
    # The chain visits p + 1 distinct, strictly decreasing positions i_0 = n-1 > ...
    # > i_p >= 1 (i_p - 1 holds the last jump target), so p <= n - 2; a second
    # symbol is needed because consecutive chain tokens must differ.
    if alphabet < 2 or p < 1 or p > n - 2:
        raise ValueError(f"p-hop needs alphabet >= 2 and 1 <= p <= n - 2; got n={n}, p={p}, alphabet={alphabet}")


def _chain_positions(rng: np.random.Generator, n: int, p: int) -> np.ndarray:
    """Jump targets j_0 > j_1 > ... > j_{p-1}: p distinct positions in 0..n-3.

    Hop k goes from i_k to i_{k+1} = j_k + 1. Distinct targets make every hop move
    strictly left; j_0 = n - 2 is excluded because it would make the first hop
    land where it started (v_{n-2} = v_{n-1}), stuck there forever.
    """
    return np.sort(rng.choice(n - 2, size=p, replace=False))[::-1]


def _place_chain(rng: np.random.Generator, n: int, jumps: np.ndarray, alphabet: int) -> np.ndarray | None:
    """Tokens at chain positions (-1 elsewhere), or None on a conflict.

    v[j_k] must equal v[i_k] (the hop's match), and v[i_{k+1}] must differ from
    v[i_k] because i_{k+1} lies strictly between j_k and i_k. The only place two
    constraints meet is i_{k+1} = j_{k-1} (when j_{k-1} = j_k + 1); the token
    already there is v[i_{k-1}], which differs from v[i_k], so no conflict arises
    in practice, but it is checked rather than assumed.
    """
    v = np.full(n, -1, dtype=np.int64)
    first = int(rng.integers(0, alphabet))
    offsets = rng.integers(0, alphabet - 1, size=len(jumps)).tolist()
    position = n - 1
    v[position] = first
    for j, offset in zip(jumps.tolist(), offsets):
        token = int(v[position])
        if v[j] not in (-1, token):
            return None
        v[j] = token
        landing = j + 1
        if v[landing] == -1:
            # Uniform over the alphabet - 1 tokens other than `token`.
            v[landing] = (token + 1 + offset) % alphabet
        elif v[landing] == token:
            return None
        position = landing
    return v


def _fill_free(rng: np.random.Generator, v: np.ndarray, trace: list[int], alphabet: int) -> np.ndarray:
    """Random tokens at the unset positions, keeping each j_k the most recent
    occurrence of v[i_k] before i_k: positions in [i_{k+1}, i_k - 1] avoid v[i_k].
    Positions left of i_p are unconstrained."""
    n = len(v)
    forbidden = np.full(n, -1, dtype=np.int64)
    top_down = np.asarray(trace)
    widths = top_down[:-1] - top_down[1:]  # interval k spans [i_{k+1}, i_k - 1]
    # Intervals run right to left as k grows, so reverse both to lay them out left to right.
    forbidden[top_down[-1] : n - 1] = np.repeat(v[top_down[:-1]][::-1], widths[::-1])
    unrestricted = rng.integers(0, alphabet, size=n)
    avoiding = (forbidden + 1 + rng.integers(0, alphabet - 1, size=n)) % alphabet
    fill = np.where(forbidden >= 0, avoiding, unrestricted)
    return np.where(v >= 0, v, fill)


def sample_sequence(rng: np.random.Generator, n: int, p: int, alphabet: int) -> tuple[np.ndarray, int]:
    """A length-n sequence whose p-hop chain from the end exists, and its answer.

    Chain first: pick the jump targets, place consistent tokens on the chain, fill
    the rest so no hop finds a nearer match, then verify with `hop_trace`. The
    construction is symmetric under relabelling the alphabet, so the answer is
    uniform over it.
    """
    _check_sizes(n, p, alphabet)
    for _ in range(MAX_TRIES):
        jumps = _chain_positions(rng, n, p)
        chain = _place_chain(rng, n, jumps, alphabet)
        if chain is None:
            continue
        planned = [n - 1, *(jumps + 1).tolist()]
        v = _fill_free(rng, chain, planned, alphabet)
        if hop_trace(v, p) == planned:
            return v, int(v[planned[-1]])
    raise RuntimeError(f"p-hop: no valid sequence after {MAX_TRIES} tries for n={n}, p={p}, alphabet={alphabet}")


def encode_sample(seq: np.ndarray, p: int, answer: int, alphabet: int) -> np.ndarray:
    """`<bos> v_1 ... v_n <hops_p> <ans> y` as ids (alphabet tokens are their own ids)."""
    head = [bos_id(alphabet)]
    tail = [hops_token_id(alphabet, p), ans_id(alphabet), answer]
    return np.concatenate([head, np.asarray(seq, dtype=np.int64), tail]).astype(np.int64)


class PhopTask:
    """Batches for p-hop: one sample per row, loss only at the <ans> position."""

    def __init__(self, cfg: PhopConfig):
        self.cfg = cfg
        self.vocab_size = vocab_size(cfg.alphabet, cfg.p)
        self.pad_id = pad_id(cfg.alphabet)

    def _samples(self, rng: np.random.Generator, count: int) -> list[tuple[np.ndarray, int]]:
        cfg = self.cfg
        return [sample_sequence(rng, cfg.n, cfg.p, cfg.alphabet) for _ in range(count)]

    def _batch(self, samples: list[tuple[np.ndarray, int]]) -> Batch:
        cfg = self.cfg
        rows = np.stack([encode_sample(v, cfg.p, y, cfg.alphabet) for v, y in samples])
        targets = np.full_like(rows, IGNORE_INDEX)
        ans_position = cfg.n + 2  # <bos>, n tokens, <hops_p>, then <ans>
        targets[:, ans_position] = rows[:, -1]
        return batch_from_numpy(rows, targets)

    def train_batch(self, step: int, batch_size: int, seq_len: int, seed: int, start: int = 0) -> Batch:
        """batch_size fresh samples, deterministic in (seed, step, start).

        Rows are whole samples of n + 4 tokens and seq_len is ignored: each p-hop
        sample is one sequence, never packed (the paper's context of 272 holds one
        260-token sample). The answer is the row's last input token, which a causal
        model cannot see from the <ans> position that predicts it.

        start: the samples of the seed's stream consumed before this run's step 0
        (TrainConfig.data_start). Each step draws from one rng (base.stream_rng): the stream's
        own step start // batch_size + step when start is a whole number of batches (a
        parent's stream continued exactly when the batch size is unchanged), else a stream
        keyed by start too, disjoint from every other start's.
        """
        return self._batch(self._samples(stream_rng(seed, step, batch_size, start), batch_size))

    @functools.cached_property
    def _eval_batch(self) -> Batch:
        rng = np.random.default_rng([self.cfg.eval_seed, 1])
        return self._batch(self._samples(rng, self.cfg.eval_count))

    def eval_batch(self) -> Batch:
        """The fixed evaluation set of cfg.eval_count samples. Built once and cached."""
        return self._eval_batch

    def records(self, count: int, seed: int) -> list[dict]:
        """Human-readable samples {"sequence", "p", "answer"}, deterministic in seed.
        Drawn like the evaluation set, so records(k, cfg.eval_seed) lists its first k."""
        rng = np.random.default_rng([seed, 1])
        return [{"sequence": v.tolist(), "p": self.cfg.p, "answer": y} for v, y in self._samples(rng, count)]

    def decode(self, ids) -> list[str]:
        """Token strings for ids, for people reading batches."""
        names = vocab(self.cfg.alphabet, self.cfg.p)
        return [names[i] for i in np.asarray(ids).tolist()]
