"""generate's per-row bookkeeping (looplab/inference/generate.py): each row's limit
and stop strings, the tokens it accepted with the loops behind them, why it finished,
its text and the work run for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from looplab.config import ConfigError
from looplab.inference.sampling import Sampler


def per_row(value, n: int, name: str, kind) -> list:
    """One value for every row, or a value per row, as a list of `kind` (n values)."""
    values = list(value) if isinstance(value, (list, tuple)) and not isinstance(value, str) else [value] * n
    if len(values) != n:
        raise ConfigError(f"{name} is invalid; allowed: one value or one per row ({n})")
    return [kind(v) for v in values]


def stop_lists(stop, n: int) -> list[list[str]]:
    """stop: None, a string, a list of strings (for every row) or one list per row."""
    if not stop:
        return [[] for _ in range(n)]
    if isinstance(stop, str):
        return [[stop] for _ in range(n)]
    stop = list(stop)
    if all(isinstance(s, str) for s in stop):
        return [list(stop) for _ in range(n)]
    if len(stop) != n:
        raise ConfigError(f"stop is invalid; allowed: strings for every row, or one list per row ({n})")
    return [[s] if isinstance(s, str) else list(s or []) for s in stop]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """The text before its first stop string, and whether it held one."""
    cuts = [text.index(s) for s in stops if s and s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


@dataclass
class GenerationRows:
    """generate's per-row record: each row's limits and stop strings, the tokens it has
    accepted (with their loops and exit steps), why it finished ("" while going), its
    text, and the work run for it."""

    limits: list[int]
    stops: list[list[str]]
    eos_id: int | None
    decode: Callable[[list[int]], str] | None
    ran_tokens: list[int]
    ran_loops: list[int]
    tokens: list[list[int]]
    loops: list[list[int]]
    exits: list[list[int]]
    finish: list[str]
    texts: list[str] | None

    @classmethod
    def start(cls, limits, stops, eos_id, decode, ran_tokens, ran_loops) -> GenerationRows:
        """Rows with nothing generated yet (a row allowed no new tokens is done)."""
        bsz = len(limits)
        return cls(
            limits,
            stops,
            eos_id,
            decode,
            ran_tokens,
            ran_loops,
            tokens=[[] for _ in range(bsz)],
            loops=[[] for _ in range(bsz)],
            exits=[[] for _ in range(bsz)],
            finish=["length" if limit == 0 else "" for limit in limits],
            texts=[""] * bsz if decode is not None else None,
        )

    def accept(self, b: int, token: int, loops_b: int, exit_b: int) -> bool:
        """Row b's next token, predicted by a position that ran loops_b loops (read out
        at exit_b): record it; True if the row goes on."""
        if self.eos_id is not None and token == self.eos_id:
            self.finish[b] = "eos"
            return False
        self.tokens[b].append(token)
        self.loops[b].append(loops_b)
        self.exits[b].append(exit_b)
        if self.texts is not None and self.decode is not None:  # texts: kept when there is a decode
            self.texts[b], stopped = cut_at_stop(self.decode(self.tokens[b]), self.stops[b])
            if stopped:
                self.finish[b] = "stop"
                return False
        if len(self.tokens[b]) >= self.limits[b]:
            self.finish[b] = "length"
            return False
        return True

    def draw(
        self, sampler: Sampler, rows: list[int], logits: torch.Tensor | None, loops_of: list[int], exits_of: list[int]
    ) -> list[tuple[int, int]]:
        """Sample the rows' next tokens (the model runs batched; bookkeeping per row):
        (row, token) for the rows that go on."""
        assert logits is not None  # the readout is on: every finished token has its logits
        drawn = sampler(logits)
        return [(b, t) for b, t, n, e in zip(rows, drawn, loops_of, exits_of) if self.accept(b, t, n, e)]

    def ran(self, rows: list[int], loops_of: list[int]) -> None:
        """Count one more position run through the model for each row, with its loops."""
        for b, n in zip(rows, loops_of):
            self.ran_tokens[b] += 1
            self.ran_loops[b] += n
