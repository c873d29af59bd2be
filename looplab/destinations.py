"""Where results go, checked before the work that produces them: an evaluation that runs
for an hour must not end in a traceback because its --json names a folder. Each check
is one line naming the flag (a ConfigError) and does what the work will do there, then
undoes it: it creates the missing folders and writes a small file, and removes both.
Permission bits are not asked: root ignores them, and /proc, /sys, a read-only mount or
a name longer than the file system allows refuse only when written. An empty string is
refused (it would mean the current folder).

    output_file(flag, path)     a file to write (JSON records, an lm-eval report)
    output_dir(flag, path, files, folders)
                                a folder to write into (a run's --out), and the entries the
                                work writes inside it, each of its kind (a metrics.jsonl
                                that is a folder is refused now, not after the work)
    tracking_uri(flag, uri)     an MLflow store to write: a server (http(s), answering /health),
                                an SQLite file (its folder written, the file an SQLite one), a
                                database or Databricks URI (opened now); a folder or file: URI
                                only where MLflow still opens folder stores (MLFLOW_ALLOW_FILE_STORE)
    existing_store(flag, uri)   an MLflow store to read (and with write=True, to write), which
                                must exist already
    intact_sqlite(flag, v, path) an existing SQLite store passes PRAGMA quick_check
    device(flag, name)          auto | cpu | cuda | cuda:N (a CUDA device must exist)
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from looplab.arguments import has_control_characters
from looplab.errors import ConfigError, invalid

SERVER_SCHEMES = ("http", "https")
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "databricks", "databricks-uc")
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def _given(flag: str, path: str | os.PathLike) -> Path:
    """The path a flag names; "" is refused: Path("") is the current folder, and an empty
    value is more often an unset shell variable than a wish to write here."""
    if not str(path).strip():
        raise invalid(flag, str(path), "a path (an empty one would mean the current folder: write . for that)")
    if has_control_characters(str(path)):
        raise invalid(flag, str(path), CONTROL_CHARACTERS)
    return Path(path).expanduser()


CONTROL_CHARACTERS = "a path without control characters (escape sequences, newlines, tabs)"


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def _probe(flag: str, shown: str, folder: Path, what: str, name: str | None = None) -> None:
    """Make `folder` (mkdir -p) and create and write a file in it (`name`, or a temporary
    name), then remove the file and every folder this made: the work will succeed there."""
    made: list[Path] = []
    try:
        missing, existing = [], folder
        while not existing.exists():  # OSError for a name too long
            missing.append(existing)
            existing = existing.parent
        if not existing.is_dir():
            raise invalid(flag, shown, f"{what} whose parent folders can be created ({existing} is a file)")
        for step in reversed(missing):
            step.mkdir()
            made.append(step)
        if name is None:
            fd, probe = tempfile.mkstemp(prefix=".looplab-probe-", dir=folder)
        else:
            probe = str(folder / name)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"probe\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise invalid(flag, shown, f"{what} this process can create and write ({_reason(e)})") from None
    finally:
        for step in reversed(made):
            try:
                step.rmdir()
            except OSError:  # someone else wrote into it meanwhile: theirs now
                pass


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a checked output file, making its missing parent folders first."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def output_file(flag: str, path: str | os.PathLike) -> None:
    p, shown = _given(flag, path), str(path)
    try:
        mode = p.stat().st_mode if p.exists() else None  # OSError for a name too long
    except OSError as e:
        raise invalid(flag, shown, f"a file this process can create and write ({_reason(e)})") from None
    if mode is None:  # the file itself, created and removed: its name and its folder are tried at once
        _probe(flag, shown, p.parent, "a file", name=p.name)
        return
    if stat.S_ISDIR(mode):
        raise invalid(flag, shown, "a file path (this is a folder)")
    try:  # non-blocking: a FIFO without a reader is an error, not a hang
        os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as e:
        raise invalid(flag, shown, f"a file this process can write ({_reason(e)})") from None
    if stat.S_ISREG(mode):  # /proc's and /sys's files open as regular ones and refuse the write: try beside it
        _probe(flag, shown, p.parent, "a file")


def output_dir(flag: str, path: str | os.PathLike, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()) -> None:
    """A folder to write into (made if missing); `files` and `folders`: the entries the
    work writes inside it, which must not exist as the other kind."""
    p, shown = _given(flag, path), str(path)
    try:
        is_file = p.exists() and not p.is_dir()  # OSError for a name too long
    except OSError as e:
        raise invalid(flag, shown, f"a folder this process can create and write ({_reason(e)})") from None
    if is_file:
        raise invalid(flag, shown, "a folder (this is a file)")
    _probe(flag, shown, p, "a folder")
    for name in files:
        if (p / name).is_dir():
            raise invalid(flag, shown, f"a folder the work can write its {name} in ({p / name} is a folder)")
        if (p / name).exists():
            output_file(flag, p / name)
    for name in folders:
        if (p / name).exists() and not (p / name).is_dir():
            raise invalid(flag, shown, f"a folder the work can write its {name}/ in ({p / name} is a file)")


def _renamed(check, flag: str, uri: str, *args) -> None:
    """A check of the path inside a URI, said about the URI as typed."""
    try:
        check(flag, *args)
    except ConfigError as e:
        raise e.renamed(flag, uri) from None


def _sqlite_file(flag: str, uri: str) -> Path:
    """The database file of sqlite:///PATH (query parameters dropped)."""
    path = uri[len("sqlite:///") :].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    if not path.strip():
        raise invalid(flag, uri, "sqlite:///PATH (three slashes, then the database file)")
    if path == ":memory:" or path.startswith("file::memory:"):  # every record would go with the process
        raise invalid(flag, uri, "sqlite:///PATH, a database file (one in memory keeps no record past this process)")
    return Path(path).expanduser()


def _sqlite_store(flag: str, uri: str) -> None:
    """SQLite writes its journal beside the database: the folder must take new files,
    and an existing file must be an SQLite database (or empty: SQLite fills it)."""
    path = _sqlite_file(flag, uri)
    _renamed(output_file, flag, uri, path)  # a new file is created in its folder; beside an existing one, a probe
    if path.is_file():
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
        if head and head != SQLITE_HEADER:
            raise invalid(flag, uri, "an SQLite database file (this file is not one), or a new path")
        if head:
            intact_sqlite(flag, uri, path)


def intact_sqlite(flag: str, uri: str, path: Path) -> None:
    """An existing SQLite store passes SQLite's own `PRAGMA quick_check` (a truncated or
    page-damaged file does not), so no sweep trains on past a store that loses its runs."""
    import sqlite3

    try:
        with sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True) as db:
            verdict = [row[0] for row in db.execute("PRAGMA quick_check")]
        db.close()
    except sqlite3.Error as e:
        verdict = [str(e)]
    if verdict != ["ok"]:
        first = str(verdict[-1]).strip().splitlines()[0][:120]  # SQLite's summary line comes last
        raise invalid(
            flag,
            uri,
            f"an undamaged SQLite store (PRAGMA quick_check on {path}: {first}); restore the file from a "
            "backup, or start a fresh store (another --storage-path or --tracking-uri)",
        )


def folder_stores_allowed() -> bool:
    """MLflow 3 refuses its folder ("file") store unless MLFLOW_ALLOW_FILE_STORE is true
    (the installed MLflow says, the way it reads its own variable)."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow from before the folder store was retired
        return True
    try:
        return bool(MLFLOW_ALLOW_FILE_STORE.get())
    except ValueError:  # a value MLflow cannot read: it would refuse the store too
        return False


def _folder_store(flag: str, uri: str, folder: str) -> None:
    """A folder store is refused in one line with the SQLite file that replaces it,
    unless MLflow still opens folder stores here."""
    if not folder_stores_allowed():
        target = (Path(folder or ".") / "mlflow.db").as_posix()
        raise invalid(
            flag,
            uri,
            f"sqlite:///{target} (MLflow 3 no longer opens folder stores; `mlflow "
            "migrate-filestore` moves an old one, MLFLOW_ALLOW_FILE_STORE=true keeps it), "
            "http(s)://HOST:PORT, or a database URI",
        )


def tracking_uri(flag: str, uri: str) -> None:
    """An MLflow tracking URI this process can use (see the module docstring)."""
    if not uri.strip():
        raise invalid(
            flag,
            uri,
            "an MLflow tracking URI: sqlite:///PATH, http(s)://HOST:PORT or a database URI "
            "(an empty one would mean the default store)",
        )
    scheme = urlparse(uri).scheme
    if scheme in SERVER_SCHEMES:
        _server_answers(flag, uri)
    elif scheme == "sqlite":
        _sqlite_store(flag, uri)
    elif scheme in ("", "file"):
        folder = urlparse(uri).path if scheme == "file" else uri
        _folder_store(flag, uri, folder)
        _renamed(output_dir, flag, uri, folder)
    elif scheme.split("+")[0] in DATABASE_SCHEMES:
        try:
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - any failure to open the store is the answer
            raise invalid(
                flag,
                uri,
                f"a store MLflow can open ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]})",
            ) from None
    else:
        raise invalid(
            flag,
            uri,
            f"an MLflow tracking URI: http(s)://HOST:PORT, sqlite:///PATH, or {' | '.join(DATABASE_SCHEMES)}://...",
        )


def existing_store(flag: str, uri: str, write: bool = False) -> None:
    """An MLflow store to read (with write=True: and to write runs and artifacts into),
    which must exist already: MLflow would otherwise make an empty one (an SQLite file,
    a folder) and the reader would report no runs."""
    if not uri.strip():
        raise invalid(flag, uri, "an MLflow store: sqlite:///STORAGE/mlflow.db of the sweep, or http(s)://HOST:PORT")
    scheme = urlparse(uri).scheme
    if scheme in ("sqlite", "", "file"):
        path = _sqlite_file(flag, uri) if scheme == "sqlite" else Path(urlparse(uri).path if scheme else uri)
        if scheme != "sqlite":
            _folder_store(flag, uri, str(path))
        try:
            found = path.expanduser().is_file() if scheme == "sqlite" else path.expanduser().is_dir()
        except OSError as e:  # a name too long
            raise invalid(flag, uri, f"an existing MLflow store ({_reason(e)})") from None
        if not found:
            raise invalid(flag, uri, "an existing MLflow store (sqlite:///STORAGE/mlflow.db of the sweep)")
        if write:  # its check covers the database's too
            tracking_uri(flag, uri)
        elif scheme == "sqlite":
            intact_sqlite(flag, uri, path.expanduser())
    else:
        tracking_uri(flag, uri)


def _server_answers(flag: str, uri: str, timeout: float = 10.0) -> None:
    """An http(s) tracking server answers MLflow's /health now: MLflow's client would
    otherwise retry each call for minutes before it fails."""
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            if response.status == 200:
                return
            problem = f"HTTP {response.status}"
    except OSError as e:  # refused, unresolvable, timed out, HTTP errors
        problem = str(getattr(e, "reason", e))
    raise invalid(flag, uri, f"a reachable MLflow server (GET /health: {problem}), or sqlite:///PATH")


def device(flag: str, name: str) -> None:
    import torch

    if name in ("auto", "cpu"):
        return
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise invalid(flag, name, "auto | cpu | cuda | cuda:N")
    if not torch.cuda.is_available():
        raise invalid(flag, name, "auto | cpu (no CUDA device here)")
    if index and int(index) >= torch.cuda.device_count():
        raise invalid(flag, name, f"cuda:0 .. cuda:{torch.cuda.device_count() - 1}")


__all__ = ["ConfigError", "device", "existing_store", "output_dir", "output_file", "tracking_uri", "write_text"]
