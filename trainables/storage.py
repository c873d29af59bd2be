"""Where a sweep keeps what outlives its processes: stage folders (checkpoints and
"done" markers), Ray's results, MLflow artifacts.

`--storage-path` is a local (or NFS/EFS-mounted) folder, or an object-store URI that
every node reaches: s3://bucket/prefix, gs://bucket/prefix (read and written through
pyarrow's file systems, as Ray does), or any fsspec protocol pyarrow lacks (memory://
in the tests). Training itself always writes to a local folder; on an object store the
stage worker keeps that folder in a local scratch directory, downloads the stage's
newest checkpoint (and its parent's) before training and uploads each checkpoint as it
is written (trainables/stage_worker.py), so a killed stage on another node resumes from
the store.

An uploaded checkpoint replaces the previous one so that a reader never sees half of
it: it is written to `<dir>.next` first, its marker file last, then the old one is
deleted and the new one moved into place; `download_dir` takes `<dir>.next` when a
crash left it complete and `<dir>` gone.
"""

from __future__ import annotations

import os
from pathlib import Path

from looplab.dashboard import STORE_FILE
from looplab.errors import StorageFull, invalid
from looplab.keys import LOCATION_KEY_LENGTH, text_digest

LOCAL_SCHEMES = ("", "file")


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else ""


class Storage:
    """A storage root: a local path or an object-store URI (see the module docstring)."""

    def __init__(self, uri: str | os.PathLike):
        text = str(uri)
        self.scheme = _scheme(text)
        if self.scheme in LOCAL_SCHEMES:
            try:
                self.root = str(Path(text.removeprefix("file://")).expanduser().resolve())
            except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13)
                raise invalid("--storage-path", text, f"a folder, or s3://BUCKET/PREFIX ({e})") from None
        else:
            self.root = text.rstrip("/")
        self._fs = None

    @property
    def remote(self) -> bool:
        return self.scheme not in LOCAL_SCHEMES

    def __str__(self) -> str:
        return self.root

    def tracking_uri(self, given: str | None = None) -> str:
        """`given`, or by default the storage's own MLflow store, sqlite:///<local>/mlflow.db."""
        return given or f"sqlite:///{self.scratch() / STORE_FILE}"

    def path(self, *parts: str) -> str:
        """A location in this storage: a local path, or a URI under the root."""
        if not self.remote:
            return str(Path(self.root, *parts))
        return "/".join([self.root, *(p.strip("/") for p in parts)])

    def scratch(self, *parts: str) -> Path:
        """A local folder standing for a location: the location itself when local, else a
        folder under ~/.cache/looplab named by the storage root."""
        if not self.remote:
            return Path(self.root, *parts)
        digest = text_digest(self.root)
        base = Path(os.environ.get("LOOPLAB_SCRATCH", Path.home() / ".cache" / "looplab" / "scratch"))
        return base / digest / Path(*parts)

    # ---- file system access (pyarrow, or fsspec through pyarrow) -------------------------
    @property
    def fs(self):
        if self._fs is None:
            self._fs = file_system(self.root)
        return self._fs

    def _key(self, location: str) -> str:
        """The path pyarrow's file system takes for a location of this storage."""
        return location if not self.remote else location.split("://", 1)[1]

    def exists(self, location: str) -> bool:
        from pyarrow.fs import FileType

        return self.fs.get_file_info(self._key(location)).type != FileType.NotFound

    def read_text(self, location: str) -> str | None:
        if not self.exists(location):
            return None
        with self.fs.open_input_stream(self._key(location)) as f:
            return f.read().decode()

    def write_text(self, location: str, text: str) -> None:
        """One whole object (atomic on stores); locally a temporary file renamed into place."""
        if not self.remote:
            path = Path(location)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
            return
        self.fs.create_dir(self._key(location.rsplit("/", 1)[0]), recursive=True)
        with self.fs.open_output_stream(self._key(location)) as f:
            f.write(text.encode())

    def delete_file(self, location: str) -> None:
        if self.remote:
            self.fs.delete_file(self._key(location))
        else:
            Path(location).unlink()

    def delete_dir(self, location: str) -> None:
        if self.exists(location):
            self.fs.delete_dir(self._key(location))

    def move(self, source: str, destination: str) -> None:
        """Move a file or folder, replacing whatever `destination` held."""
        self.delete_dir(destination)
        if self.remote:
            self.fs.move(self._key(source), self._key(destination))
        else:
            os.replace(source, destination)

    def upload_dir(self, local: Path, location: str, marker: str) -> None:
        """Replace the folder at `location` with the local folder's files, the `marker`
        file uploaded last (module docstring)."""
        from pyarrow.fs import LocalFileSystem

        staging = location + ".next"
        self.delete_dir(staging)
        local_fs = LocalFileSystem()
        self.fs.create_dir(self._key(staging), recursive=True)
        files = sorted(p for p in Path(local).iterdir() if p.is_file())
        for path in sorted(files, key=lambda p: p.name == marker):  # the marker last
            with (
                local_fs.open_input_stream(str(path)) as src,
                self.fs.open_output_stream(self._key(f"{staging}/{path.name}")) as dst,
            ):
                dst.write(src.read())
        self.delete_dir(location)
        self.fs.move(self._key(staging), self._key(location))

    def download_dir(self, location: str, local: Path, marker: str) -> bool:
        """Copy the folder at `location` (or a complete `<location>.next` a crash left)
        into the local folder; False when neither holds a complete copy (no marker)."""
        import shutil

        from pyarrow.fs import FileSelector, FileType

        for source in (location, location + ".next"):
            if self.exists(f"{source}/{marker}"):
                break
        else:
            return False
        if local.exists():
            shutil.rmtree(local)
        local.mkdir(parents=True)
        for info in self.fs.get_file_info(FileSelector(self._key(source))):
            if info.type == FileType.File:
                with self.fs.open_input_stream(info.path) as src:
                    (local / info.base_name).write_bytes(src.read())
        return True


def local_checkpoint(location: str, marker: str = "config.json") -> Path:
    """A checkpoint folder on this machine: the location itself when it is a path, else a
    copy downloaded into the scratch folder (where a store's checkpoint is read, e.g. by
    an evaluation job on another node)."""
    if "://" not in location or location.startswith("file://"):
        return Path(location.removeprefix("file://"))
    storage = Storage(location.rsplit("/", 1)[0])
    local = storage.scratch("checkpoints", text_digest(location, LOCATION_KEY_LENGTH))
    if not (local / marker).is_file() and not storage.download_dir(location, local, marker):
        raise FileNotFoundError(f"{location} holds no complete checkpoint")
    return local


def file_system(uri: str):
    """pyarrow's file system for a URI (s3, gs, hdfs, file), or an fsspec file system
    wrapped for pyarrow when pyarrow does not speak the protocol (memory, ...)."""
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)[0]
    except (ValueError, OSError):  # pyarrow's ArrowInvalid is a ValueError
        import fsspec

        return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(_scheme(uri))))


def full_line(where: str | os.PathLike, free: int | None = None, need: str = "") -> str:
    """What a full storage says, on one line: where, what is free and needed, the way on."""
    state = f"{_size(free)} free" if free is not None else "no space left"
    return (
        f"storage full: {where} has {state}" + (f"; {need}" if need else "") + ": free space (or pass another "
        "--storage-path) and run the same command again; what finished is kept and the rest resumes"
    )


def check_room(folder: str | os.PathLike, needed: int, what: str) -> None:
    """StorageFull, in one line, unless the file system of the local `folder` has
    `needed` bytes free for `what`."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise StorageFull(full_line(folder, free, f"{what} need about {_size(needed)}"))


def free_bytes(where: str | os.PathLike) -> int | None:
    """Bytes free on the local file system of `where` (its nearest existing folder); None
    where that is not a local path."""
    import shutil

    path = Path(where)
    for p in (path, *path.parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"
