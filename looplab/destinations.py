"""Where results go, checked before the work that produces them: an evaluation that runs
for an hour must not end in a traceback because its --json names a folder. Each check
is one line naming the flag (a ConfigError) and creates nothing: a folder that does not
exist yet is fine when its nearest existing ancestor is a folder this process can write.

    output_file(flag, path)     a file to write (JSON records, an lm-eval report)
    output_dir(flag, path)      a folder to write into (a run's --out)
    tracking_uri(flag, uri)     an MLflow store to write: a server (http(s), answering /health),
                                an SQLite file or a folder (checked like the files above), or
                                a database or Databricks URI (opened now)
    existing_store(flag, uri)   an MLflow store to read, which must exist already
    device(flag, name)          auto | cpu | cuda | cuda:N (a CUDA device must exist)
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from looplab.errors import ConfigError, invalid

SERVER_SCHEMES = ("http", "https")
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "databricks", "databricks-uc")


def _writable_place(flag: str, path: Path, what: str) -> None:
    """No ancestor of `path` is a file, and the nearest existing one is a writable folder."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise invalid(flag, str(path), f"{what} whose parent folders can be created ({parent} is a file)")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise invalid(flag, str(path), f"{what} in a folder this process can write ({parent} is not)")
            return


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a checked output file, making its missing parent folders first."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def output_file(flag: str, path: str | os.PathLike) -> None:
    p = Path(path).expanduser()
    if p.is_dir():
        raise invalid(flag, str(path), "a file path (this is a folder)")
    if p.exists() and not os.access(p, os.W_OK):
        raise invalid(flag, str(path), "a file this process can write")
    _writable_place(flag, p.absolute(), "a file")


def output_dir(flag: str, path: str | os.PathLike) -> None:
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise invalid(flag, str(path), "a folder (this is a file)")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise invalid(flag, str(path), "a folder this process can write")
        return
    _writable_place(flag, p.absolute(), "a folder")


def tracking_uri(flag: str, uri: str) -> None:
    """An MLflow tracking URI this process can use (see the module docstring)."""
    if not uri:
        return
    scheme = urlparse(uri).scheme
    if scheme in SERVER_SCHEMES:
        _server_answers(flag, uri)
    elif scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path:
            raise invalid(flag, uri, "sqlite:///PATH (three slashes, then the database file)")
        try:
            output_file(flag, path)
        except ConfigError as e:  # said about the URI as typed, not the path inside it
            raise e.renamed(flag, uri) from None
    elif scheme in ("", "file"):
        try:
            output_dir(flag, urlparse(uri).path if scheme == "file" else uri)
        except ConfigError as e:
            raise e.renamed(flag, uri) from None
    elif scheme.split("+")[0] in DATABASE_SCHEMES:
        try:
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - any failure to open the store is the answer
            raise invalid(flag, uri, f"a store MLflow can open ({type(e).__name__}: "
                                     f"{(str(e).strip().splitlines() or [''])[0][:160]})") from None
    else:
        raise invalid(flag, uri, "an MLflow tracking URI: http(s)://HOST:PORT, sqlite:///PATH, a folder, "
                                 f"file:///PATH, or {' | '.join(DATABASE_SCHEMES)}://...")


def existing_store(flag: str, uri: str) -> None:
    """An MLflow store to read, which must exist already: MLflow would otherwise make an
    empty one (an SQLite file, a folder) and the reader would report no runs."""
    scheme = urlparse(uri).scheme
    if not uri:
        raise invalid(flag, uri, "an MLflow store: sqlite:///STORAGE/mlflow.db of the sweep, or http(s)://HOST:PORT")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
        if not path or not Path(path).expanduser().is_file():
            raise invalid(flag, uri, "an existing MLflow store (sqlite:///STORAGE/mlflow.db of the sweep)")
    elif scheme in ("", "file"):
        folder = urlparse(uri).path if scheme == "file" else uri
        if not Path(folder).expanduser().is_dir():
            raise invalid(flag, uri, "an existing MLflow store (a folder of runs, or sqlite:///PATH)")
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
