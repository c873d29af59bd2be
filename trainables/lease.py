"""One lease mechanism for the platform's two locks: one invocation of a sweep at a time
(sweeps/lock.py) and a stage shared by several trials trained once (trainables/shared_stage.py).

A lock is held by a holder: a random owner id (what a renewal and a release compare) and
the host, PID and start a refusal names. On a file system (local disk, or NFS/EFS on a
cluster) the lock is an flock, which the kernel releases when its holder dies: nothing
goes stale (`flocked`). An object store has no locks, so there the lock is a lease in a
table (`held`): its holder renews it RENEWALS times per lease, and a lease nobody renewed
for its duration belongs to a holder that is gone and is taken over (`granted`, the rule).

Two tables, because the two locks need different things of one:
- `StoreTable`, lease objects on the storage: the sweep lock is taken before Ray starts,
  and must refuse an invocation on another Ray cluster that shares the bucket. Taking is a
  read, a write and a read back (pyarrow's object stores have no conditional write), so
  two takers in the same instant can both win: invocations are started by people.
- `MemoryTable` in a named Ray actor of the cluster (`ActorTable`): a shared stage's trials
  contend for it in the same second, and the actor's one call at a time makes a take atomic.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from trainables.storage import Storage

# A holder renews its lease this many times per lease duration, so it loses the lease
# only when three renewals in a row fail or come late (a store's hiccup, a paused process).
RENEWALS = 4
POLL_SECONDS = 2.0  # a taker that waits for a held lease asks again this often
# The cluster's lease table. Not the name of the stage-lock actor of earlier versions,
# whose methods differ: a long-lived cluster may still run one.
ACTOR, NAMESPACE = "looplab-leases", "looplab"

Record = dict[str, Any]  # a holder: owner, host, pid, since; in a table also renewed (seconds since the epoch)
log = logging.getLogger(__name__)


class Busy(RuntimeError):
    """Another holder has the lock: `holder` is its record (None when it did not say who
    it is), `where` the lock."""

    def __init__(self, holder: Record | None, where: str):
        super().__init__(f"{where} is held by {who(holder)}")
        self.holder, self.where = holder, where


def holder() -> Record:
    return {
        "owner": uuid.uuid4().hex,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def who(record: Record | None) -> str:
    if not record:
        return "a process that did not say who it is"
    return f"host {record.get('host')}, pid {record.get('pid')}, since {record.get('since')}"


def granted(current: Record | None, mine: Record, seconds: float, now: float) -> bool:
    """Whether `mine` may take (or renew) a lease whose holder is `current`: nobody holds
    it, it is mine, or its holder has not renewed it for `seconds` (a holder that is gone)."""
    return current is None or current.get("owner") == mine["owner"] or now - current.get("renewed", 0) >= seconds


class Table(Protocol):
    """take: take or renew the lease `name` for `mine` when `granted`, return its holder after;
    release: end it if `owner` holds it (one taken over stays its new holder's); where: its place."""

    def take(self, name: str, mine: Record, seconds: float) -> Record | None: ...

    def release(self, name: str, owner: str) -> None: ...

    def where(self, name: str) -> str: ...


class MemoryTable:
    """Leases in one process's memory, taken one at a time: the body of the cluster's Ray
    actor (`ActorTable`)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.leases: dict[str, Record] = {}
        self.clock = clock
        self._one_at_a_time = threading.Lock()  # an actor's calls are one at a time; threads' are not

    def take(self, name: str, mine: Record, seconds: float) -> Record | None:
        with self._one_at_a_time:
            now = self.clock()
            if granted(self.leases.get(name), mine, seconds, now):
                self.leases[name] = {**mine, "renewed": now}
            return self.leases[name]

    def release(self, name: str, owner: str) -> None:
        with self._one_at_a_time:
            if self.leases.get(name, {}).get("owner") == owner:
                del self.leases[name]

    def where(self, name: str) -> str:
        return name


class ActorTable:
    """A MemoryTable in a named Ray actor, one per cluster: every trial reaches the same one."""

    def __init__(self) -> None:
        import ray

        # Detached: the table outlives the process that happened to create it.
        self._actor: Any = (
            ray.remote(num_cpus=0)(MemoryTable)
            .options(name=ACTOR, namespace=NAMESPACE, get_if_exists=True, lifetime="detached")
            .remote()
        )
        self._get: Callable[[Any], Any] = ray.get

    def take(self, name: str, mine: Record, seconds: float) -> Record | None:
        return self._get(self._actor.take.remote(name, mine, seconds))

    def release(self, name: str, owner: str) -> None:
        self._get(self._actor.release.remote(name, owner))

    def where(self, name: str) -> str:
        return f"{name} (Ray actor {ACTOR})"


class StoreTable:
    """Lease objects on a storage, <folder>/<name>.json, each a holder's JSON record."""

    def __init__(self, storage: Storage, folder: str, clock: Callable[[], float] = time.time):
        self.storage, self.folder, self.clock = storage, folder, clock

    def where(self, name: str) -> str:
        return self.storage.path(self.folder, f"{name}.json")

    def take(self, name: str, mine: Record, seconds: float) -> Record | None:
        location = self.where(name)
        current = _parse(self.storage.read_text(location))
        if not granted(current, mine, seconds, self.clock()):
            return current
        self.storage.write_text(location, json.dumps({**mine, "renewed": self.clock()}))
        return _parse(self.storage.read_text(location))  # another taker's, when it wrote in between: it won

    def release(self, name: str, owner: str) -> None:
        location = self.where(name)
        if (_parse(self.storage.read_text(location)) or {}).get("owner") == owner:
            self.storage.delete_file(location)


@contextlib.contextmanager
def held(table: Table, name: str, seconds: float, *, wait: bool) -> Iterator[Record]:
    """Hold the lease `name` for the block, renewed by a thread, released at the end. While
    another holds it: wait for it (`wait`), or raise Busy naming the holder."""
    mine = holder()
    while not _is_mine(current := table.take(name, mine, seconds), mine):
        if not wait:
            raise Busy(current, table.where(name))
        time.sleep(POLL_SECONDS)
    stop = threading.Event()
    keeper = threading.Thread(target=_renew, args=(table, name, mine, seconds, stop), daemon=True)
    keeper.start()
    try:
        yield mine
    finally:
        stop.set()
        keeper.join()
        table.release(name, mine["owner"])


def _renew(table: Table, name: str, mine: Record, seconds: float, stop: threading.Event) -> None:
    """Renew until stopped. A renewal that fails is tried again at the next turn, not the
    end of the renewals: one hiccup of a store must not let a live holder's lease lapse."""
    while not stop.wait(seconds / RENEWALS):
        try:
            current = table.take(name, mine, seconds)
        except Exception as e:  # noqa: BLE001 - any failure of the table: the next turn retries
            log.warning("lease %s not renewed (tried again in %.0f s): %s", table.where(name), seconds / RENEWALS, e)
            continue
        if not _is_mine(current, mine):
            log.warning("lease %s was taken over by %s after renewals failed", table.where(name), who(current))


def _is_mine(record: Record | None, mine: Record) -> bool:
    return record is not None and record.get("owner") == mine["owner"]


@contextlib.contextmanager
def flocked(path: Path, *, wait: bool, info: Path | None = None) -> Iterator[None]:
    """Hold an flock on `path` for the block. While another holds it: wait for it (`wait`),
    or raise Busy naming the holder `info` records (where each holder writes who it is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(_parse(_read(info)), str(path)) from None
        if info is not None:
            info.write_text(json.dumps(holder()))
        try:
            yield
        finally:
            if info is not None:
                info.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path: Path | None) -> str | None:
    try:
        return path.read_text() if path is not None else None
    except OSError:
        return None


def _parse(text: str | None) -> Record | None:
    """A holder's record; None for none, or for a damaged one (a holder that cannot say who it is)."""
    try:
        record = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
