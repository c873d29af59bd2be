"""A stage shared by several trials is trained once: the first trial to take the
stage's lock trains it and writes a "done" marker; the others wait on the lock,
find the marker and reuse the checkpoint. The lock is an flock on a file in the
shared storage (local disk, or NFS on a cluster)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterator

DONE = "done.json"
LOCK = ".lock"


@contextlib.contextmanager
def stage_lock(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks while another trial trains this stage
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_done(directory: Path) -> dict[str, Any] | None:
    path = directory / DONE
    return json.loads(path.read_text()) if path.is_file() else None


def write_done(directory: Path, info: dict[str, Any]) -> None:
    tmp = directory / (DONE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, directory / DONE)  # atomic: a crash never leaves half a marker
