"""One invocation of a sweep at a time. Two invocations of the same sweep (same key, same
storage) would train its trials twice and close each other's live runs as orphans, so
the second is refused with one line naming the first, before it touches MLflow.

The lock is trainables/lease.py's. On a file system it is an flock on
STORAGE/locks/sweep-<key>.lock, which the kernel releases when its holder dies (a killed
driver leaves no stale lock); the holder writes who it is (host, PID, start) beside it for
the refusal to name. On an object store, which has no locks, it is a lease object
STORAGE/locks/sweep-<key>.json, renewed while the sweep runs; a lease not renewed for
LEASE_SECONDS belongs to a driver that is gone and is taken over. Not the Ray actor that
holds the shared stages' leases: this lock is taken before Ray starts, and a second
invocation may start another Ray cluster on the same bucket.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ContextManager, Iterator

from looplab.keys import keyed_name
from trainables import lease
from trainables.storage import Storage

# How long a driver that stopped renewing is taken for alive: after a crash, a relaunch on
# an object store is refused (told to wait) for up to this long. Long rather than short:
# taking over a live sweep would close its live runs as orphans.
LEASE_SECONDS = 120.0


class SweepBusy(RuntimeError):
    """Another invocation of this sweep holds its lock; the message is one line naming it."""


def _busy(name: str, key: str, busy: lease.Busy) -> SweepBusy:
    return SweepBusy(
        f"sweep {name} [{key}] is already running on this storage ({lease.who(busy.holder)}; "
        f"lock {busy.where}): wait for it to finish, or give another --storage-path"
    )


def _lock_name(key: str) -> str:
    """sweep-<sweep key>: the output-path rule of looplab/keys.py."""
    return keyed_name("sweep", key)


@contextlib.contextmanager
def sweep_lock(storage: Storage, key: str, name: str) -> Iterator[None]:
    """Hold the sweep's lock for the block; SweepBusy when another invocation holds it."""
    lock = _lock_name(key)
    held: ContextManager[Any]
    if storage.remote:
        held = lease.held(lease.StoreTable(storage, "locks"), lock, LEASE_SECONDS, wait=False)
    else:
        folder = Path(storage.path("locks"))
        held = lease.flocked(folder / f"{lock}.lock", wait=False, info=folder / f"{lock}.json")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(held)
        except lease.Busy as e:
            raise _busy(name, key, e) from None
        yield
