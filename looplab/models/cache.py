"""Inference state of a looped model, keyed by (loop, residual block).

One backbone is applied R times, so each of its stateful mixers holds R states, one
per loop: loop r's state has seen exactly the tokens that ran loop r (under skip, the
tokens still active at r, in causal order; exited tokens leave holes). mamba-ssm keys
its cache by layer alone, which would let loop 2 overwrite loop 1's state.

    Mamba-2 block   conv: the last d_conv − 1 inputs of the conv (B, d_conv − 1, conv_dim)
                    ssm:  the SSM state (B, heads, headdim, d_state), at least float32
                    Both independent of the context length.
    attention block k, v: the keys (RoPE applied at their true positions) and values
                    (B, capacity, heads, head_dim), pos: those positions (B, capacity),
                    length: the entries of each row (B,)
    MLP block       nothing

Each block's states of all loops live in one storage (loop r's row b at slot
(r − 1)·batch + b), and one scratch slot after them (R·batch); loop r's states are
views of it. A fixed-shape step points the rows that must not write (a token that
exited before this loop, a row with no token) at the scratch slot: what they compute
and write there is thrown away, so one call serves rows that run and rows that do not
(generate's fused skip step). Several rows may write it in one step; its contents are
never read for anything kept. A backbone step reads and writes the states through a
`StepCache` (one loop's views, or the storage addressed by slots
so that rows at different loops share a step: looplab/inference/depth_batching.py, and a
`Layout`), whose `block(j)` hands each mixer its own state; mixers take it as the
`cache` argument of forward (models/mamba2.py, models/attention.py). The Layout says
where each cache row's tokens sit in the tensor the step runs on: a prefill layout
(padded rows, or the varlen row of skip execution, with each row's real tokens in
[start, end)), or a decode layout (one token per running row).

What an exited token leaves in the deeper loops' attention (`attention_fill`):
    hole        nothing (CHASE's semantics, the default)
    exit_state  the keys and values of its frozen exit state, computed by each deeper
                attention block from that state (Huginn, continuous-depth batching).
                The token still runs no deeper loop; Mamba-2 states keep their holes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from looplab.config import ConfigError

HOLE, EXIT_STATE = "hole", "exit_state"
RECURRENT, KEYS = "recurrent", "keys"  # a mixer's cache_kind: Mamba-2 states, attention keys/values
ATTENTION_FILLS = (HOLE, EXIT_STATE)


def storage_slots(n_loops: int, batch: int) -> int:
    """The slots of a cache's storage: every loop's rows, then the scratch slot."""
    return n_loops * batch + 1


def loop_slots(rows: torch.Tensor, loop: int, n_loops: int, batch: int, running: torch.Tensor | None = None):
    """The storage slots of cache rows (n,) at `loop` (1..R) of a cache of `batch`
    rows: (loop − 1)·batch + row, or the scratch slot where `running` (n,) is False."""
    slots = rows + (loop - 1) * batch
    return slots if running is None else torch.where(running, slots, n_loops * batch)


def check_fill(attention_fill: str) -> str:
    if attention_fill not in ATTENTION_FILLS:
        raise ConfigError(f"attention_fill={attention_fill!r} is invalid; allowed: {' | '.join(ATTENTION_FILLS)}")
    return attention_fill


@dataclass
class MambaState:
    conv: torch.Tensor  # (B, d_conv - 1, conv_dim), oldest input first (time-major: the step's shift is one copy)
    ssm: torch.Tensor  # (B, nheads, headdim, d_state)


@dataclass
class KVState:
    k: torch.Tensor  # (B, capacity, heads, head_dim), RoPE applied
    v: torch.Tensor  # (B, capacity, heads, head_dim)
    pos: torch.Tensor  # (B, capacity) the true position of each entry
    length: torch.Tensor  # (B,) entries per row

    def append(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Entries k, v (m, heads, head_dim) at positions pos (m,) for cache rows (m,),
        which may repeat (several tokens of one row, in causal order)."""
        if rows.numel() == 0:
            return
        counts = torch.bincount(rows, minlength=self.length.shape[0])
        first = torch.cumsum(counts, 0) - counts  # where each row's entries begin in this append
        order = torch.argsort(rows, stable=True)  # a row's entries together, in the given order
        rows, k, v, pos = rows[order], k[order], v[order], pos[order]
        slot = self.length[rows] + torch.arange(rows.shape[0], device=rows.device) - first[rows]
        self._check_room(int(slot.max()) + 1)
        self.k[rows, slot] = k.to(self.k.dtype)
        self.v[rows, slot] = v.to(self.v.dtype)
        self.pos[rows, slot] = pos
        self.length += counts

    def append_one(self, rows: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """One entry per row (decode): rows (n,) distinct, or None for every row."""
        length = self.length if rows is None else self.length[rows]
        self._check_room(int(length.max()) + 1)
        rows = torch.arange(self.length.shape[0], device=length.device) if rows is None else rows
        self.k[rows, length] = k.to(self.k.dtype)
        self.v[rows, length] = v.to(self.v.dtype)
        self.pos[rows, length] = pos
        self.length[rows] = length + 1

    def _check_room(self, need: int) -> None:
        # The buffers are views into the cache's storage of every loop (InferenceCache):
        # only the cache can enlarge them, before a step (InferenceCache.reserve).
        if need > self.k.shape[1]:
            raise RuntimeError(
                f"attention cache holds {self.k.shape[1]} entries per row, {need} needed: "
                "InferenceCache.reserve must run first"
            )

    def grown(self, capacity: int) -> "KVState":
        """A copy with room for `capacity` entries per row (the stored ones kept)."""
        pad = capacity - self.k.shape[1]
        return KVState(
            torch.cat([self.k, self.k.new_zeros(self.k.shape[0], pad, *self.k.shape[2:])], 1),
            torch.cat([self.v, self.v.new_zeros(self.v.shape[0], pad, *self.v.shape[2:])], 1),
            torch.cat([self.pos, self.pos.new_zeros(self.pos.shape[0], pad)], 1),
            self.length,
        )


@dataclass
class Layout:
    """Where each cache row's tokens sit in the (b, l, d) tensor a backbone step runs on.

    rows   (n,) the cache rows the step covers, or None: all rows, in order (the batch
           needs no gather then).
    Prefill: cache row rows[i]'s real tokens are slots [start[i], end[i]) of layout
    row seq[i] (padded layout: seq = i, start = 0; varlen: seq = 0, each row's
    segment). Tokens outside [start, end) (right padding, packing pads) are run but
    never stored. Decode: layout row i is the one new token of cache row rows[i]."""

    rows: torch.Tensor | None
    decode: bool
    seq: torch.Tensor | None = None
    start: torch.Tensor | None = None
    end: torch.Tensor | None = None

    @classmethod
    def padded(cls, n_real: torch.Tensor) -> "Layout":
        """Layout row b is cache row b; its first n_real[b] tokens are real."""
        arange = torch.arange(n_real.shape[0], device=n_real.device)
        return cls(None, False, arange, torch.zeros_like(n_real), n_real)

    @classmethod
    def varlen(cls, active: torch.Tensor, real: torch.Tensor) -> "Layout":
        """One layout row holding every active token of the batch in row-major order
        (models/execution.py's varlen skip); real (B, L) marks those to store."""
        counts = active.sum(1)
        start = torch.cumsum(counts, 0) - counts
        return cls(None, False, torch.zeros_like(counts), start, start + (active & real).sum(1))

    @classmethod
    def one_token(cls, rows: torch.Tensor | None) -> "Layout":
        return cls(rows, True)

    def segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(seq, start, end) of a prefill layout (a decode layout has none)."""
        if self.seq is None or self.start is None or self.end is None:
            raise ValueError("a decode layout has no prefill segments")
        return self.seq, self.start, self.end


State = TypeVar("State", MambaState, KVState)


@dataclass
class BlockCache(Generic[State]):
    """What one mixer sees: its own state (the kind its cache_kind names) and the step's layout."""

    state: State
    layout: Layout


class StepCache:
    """One backbone step's view of the cache: each mixer's state and the layout. Either
    one loop's states (the layout's rows are that loop's cache rows), or the storage of
    every loop (`slots`: the layout's rows are slots (loop − 1)·batch + row, so one step
    can run rows at different loops: looplab/inference/depth_batching.py)."""

    def __init__(self, states: list, layout: Layout):
        self.states, self.layout = states, layout

    def block(self, j: int) -> BlockCache[Any] | None:  # block j's mixer knows its state's kind
        state = self.states[j]
        return None if state is None else BlockCache(state, self.layout)


def _rows(state: MambaState | KVState, rows: slice) -> MambaState | KVState:
    """The same state restricted to some rows: views, so writes reach the storage."""
    return type(state)(**{name: t[rows] for name, t in vars(state).items()})


class InferenceCache:
    """Per-(loop, block) states of `batch` rows (module docstring). capacity sizes the
    attention buffers (prompt + new tokens; reserve() enlarges them); Mamba-2 states
    have a fixed size. attention_only: keys and values alone (a full forward under
    attention_fill="exit_state" needs them, not the recurrent states).

    Storage: one tensor per block and field for all loops, loop r's row b at slot
    (r − 1)·batch + b (`storage`), then the scratch slot (module docstring, loop_slots);
    `states[r − 1][j]` is loop r's view of block j.
    A step may read per-loop views (prefill, decode_step) or the storage with slot
    indices (rows at different loops in one step)."""

    def __init__(
        self,
        model,
        batch: int,
        capacity: int,
        *,
        attention_fill: str = HOLE,
        attention_only: bool = False,
        device=None,
        dtype: torch.dtype | None = None,
    ):
        ref = next(model.parameters())
        device = ref.device if device is None else torch.device(device)
        dtype = ref.dtype if dtype is None else dtype
        self.n_loops = model.cfg.n_loops
        self.batch = batch
        self.attention_fill = check_fill(attention_fill)
        # Stateful mixers say what they keep (cache_kind) and allocate it (new_state).
        kinds = [getattr(block.inner, "cache_kind", None) for block in model.backbone.residual_blocks()]
        keep = [kind == KEYS or (kind == RECURRENT and not attention_only) for kind in kinds]
        self.storage: list[MambaState | KVState | None] = [
            block.inner.new_state(storage_slots(self.n_loops, batch), capacity, device, dtype) if kept else None
            for block, kept in zip(model.backbone.residual_blocks(), keep)
        ]
        self.length = torch.zeros(batch, dtype=torch.long, device=device)  # tokens of each row so far
        self._make_views()

    def _make_views(self) -> None:
        B = self.batch
        self.states: list[list[MambaState | KVState | None]] = [
            [None if s is None else _rows(s, slice(r * B, (r + 1) * B)) for s in self.storage]
            for r in range(self.n_loops)
        ]

    def at(self, loop: int, layout: Layout) -> StepCache:
        return StepCache(self.states[loop - 1], layout)

    def at_slots(self, slots: torch.Tensor) -> StepCache:
        """One new token for each slot (loop − 1)·batch + row (slots distinct)."""
        return StepCache(self.storage, Layout.one_token(slots))

    @property
    def has_keys(self) -> bool:
        return any(isinstance(s, KVState) for s in self.storage)

    def reserve(self, entries: int) -> None:
        """Room for `entries` attention entries per (loop, row): a row's next token
        appends at most one per loop, so decoding reserves length + 1."""
        kv = [s for s in self.storage if isinstance(s, KVState)]
        if not kv or entries <= kv[0].k.shape[1]:
            return
        capacity = max(entries, 2 * kv[0].k.shape[1])  # doubling keeps growth rare (generate presizes)
        self.storage = [s.grown(capacity) if isinstance(s, KVState) else s for s in self.storage]
        self._make_views()

    def fill_exited(self, model, h: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, loop: int) -> None:
        """Tokens that exited after `loop` with frozen states h (m, d), of cache rows
        (m,) at positions (m,): under attention_fill="exit_state", every deeper loop's
        attention blocks store their keys and values computed from h."""
        if self.attention_fill != EXIT_STATE or loop >= self.n_loops or rows.numel() == 0:
            return
        for j, block in enumerate(model.backbone.residual_blocks()):
            if isinstance(self.states[loop][j], KVState):
                k, v = block.inner.key_value(block.norm(h), positions)  # the same at every deeper loop
                for r in range(loop, self.n_loops):
                    deeper = self.states[r][j]
                    assert isinstance(deeper, KVState)  # block j holds one kind of state at every loop
                    deeper.append(rows, k, v, positions)

    def write_row(self, row: int, source: "InferenceCache", source_row: int = 0) -> None:
        """Row `row` takes over row `source_row` of another cache of the same model:
        every loop's states and the row's length (a request prefilled alone joins a
        running batch: looplab/inference/arrivals.py). The row's former states are replaced
        whole; attention entries past the copied lengths are never read."""
        if source.n_loops != self.n_loops or len(source.storage) != len(self.storage):
            raise ConfigError("source is invalid; allowed: a cache of the same model")
        loops = torch.arange(self.n_loops, device=self.length.device)
        mine, theirs = loops * self.batch + row, loops * source.batch + source_row
        kv = [s for s in source.storage if isinstance(s, KVState)]
        if kv:
            self.reserve(int(kv[0].length[theirs].max()))
        for dst, src in zip(self.storage, source.storage):
            if dst is None:
                continue
            entries = int(src.length[theirs].max()) if isinstance(src, KVState) else None
            for name, to in vars(dst).items():
                values = getattr(src, name)[theirs]
                if entries is not None and to.dim() > 1:  # k, v, pos: the stored entries alone
                    to[mine, :entries] = values[:, :entries].to(to.dtype)
                else:
                    to[mine] = values.to(to.dtype)
        self.length[row] = source.length[source_row]

    def nbytes(self) -> int:
        """Bytes held by the states (attention buffers at their allocated capacity)."""
        tensors = [t for s in self.storage if s is not None for t in vars(s).values()]
        return sum(t.numel() * t.element_size() for t in tensors) + self.length.numel() * self.length.element_size()

    def clone(self) -> "InferenceCache":
        """An independent copy (benchmarks decode from the same prefilled state repeatedly)."""
        out = object.__new__(InferenceCache)
        out.n_loops, out.batch, out.attention_fill = self.n_loops, self.batch, self.attention_fill
        out.storage = [
            None if s is None else type(s)(**{k: t.clone() for k, t in vars(s).items()}) for s in self.storage
        ]
        out.length = self.length.clone()
        out._make_views()
        return out
