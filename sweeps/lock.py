"""One invocation of a sweep at a time. Two invocations of the same sweep (same key, same
storage) would train its trials twice and close each other's live runs as orphans, so
the second is refused with one line naming the first, before it touches MLflow.

On a file system the lock is an flock on STORAGE/locks/sweep-<key>.lock, which the
kernel releases when its holder dies (a killed driver leaves no stale lock); the holder
writes who it is (host, PID, start) beside it for the refusal to name. On an object store,
which has no locks, the holder writes a lease object and renews it every RENEW_SECONDS;
a lease not renewed for STALE_SECONDS belongs to a driver that is gone and is taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

from looplab.keys import keyed_name
from trainables.storage import Storage

RENEW_SECONDS, STALE_SECONDS = 30.0, 120.0


class SweepBusy(RuntimeError):
    """Another invocation of this sweep holds its lock; the message is one line naming it."""


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "renewed": time.time()}


def _busy(name: str, key: str, holder: dict | None, where: str) -> SweepBusy:
    who = (f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('since')}" if holder
           else "a process that did not say who it is")
    return SweepBusy(f"sweep {name} [{key}] is already running on this storage ({who}; lock {where}): wait for it "
                     "to finish, or give another --storage-path")


def _lock_name(key: str) -> str:
    """sweep-<sweep key>: the output-path rule of looplab/keys.py."""
    return keyed_name("sweep", key)


@contextlib.contextmanager
def sweep_lock(storage: Storage, key: str, name: str) -> Iterator[None]:
    """Hold the sweep's lock for the block; SweepBusy when another invocation holds it."""
    if not storage.remote:
        folder = Path(storage.path("locks"))
        folder.mkdir(parents=True, exist_ok=True)
        lock, info = folder / f"{_lock_name(key)}.lock", folder / f"{_lock_name(key)}.json"
        with open(lock, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(name, key, _read(info), str(lock)) from None
            info.write_text(json.dumps(_holder()))
            try:
                yield
            finally:
                info.unlink(missing_ok=True)
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    lease = storage.path("locks", f"{_lock_name(key)}.json")
    current = _parse(storage.read_text(lease))
    if current is not None and time.time() - current.get("renewed", 0) < STALE_SECONDS:
        raise _busy(name, key, current, lease)
    mine = _holder()
    storage.write_text(lease, json.dumps(mine))
    if _parse(storage.read_text(lease)) != mine:  # another driver wrote in between: it won
        raise _busy(name, key, _parse(storage.read_text(lease)), lease)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(RENEW_SECONDS):
            storage.write_text(lease, json.dumps({**mine, "renewed": time.time()}))

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        storage.delete_file(lease)


def _read(path: Path) -> dict | None:
    try:
        return _parse(path.read_text())
    except OSError:
        return None


def _parse(text: str | None) -> dict | None:
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
