"""A stage shared by several trials is trained once: the first trial to take the
stage's lock trains it and writes a "done" marker; the others wait on the lock,
find the marker and reuse the checkpoint.

The lock is an flock on a file in the stage folder when the storage is a file system
(local disk, or NFS/EFS on a cluster: flock is released when its holder dies). On an
object store there are no locks, so a named Ray actor of the sweep holds them as
leases: the holder renews its lease every few seconds, and a lease its holder stopped
renewing (a dead process) expires and passes to the next waiter.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from trainables.storage import Storage

DONE = "done.json"
LOCK = ".lock"
LOCKS_ACTOR, NAMESPACE = "looplab-stage-locks", "looplab"
LEASE_SECONDS = 60.0


@contextlib.contextmanager
def stage_lock(storage: Storage, location: str) -> Iterator[None]:
    if not storage.remote:
        directory = Path(location)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / LOCK, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # blocks while another trial trains this stage
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    with _lease(location):
        yield


def read_done(storage: Storage, location: str) -> dict[str, Any] | None:
    text = storage.read_text(f"{location}/{DONE}")
    return json.loads(text) if text else None


def check_parent_unchanged(storage: Storage, cfg, checkpoint: str) -> None:
    """A stage trained before (its checkpoint at `checkpoint`) is reused only while its
    parent's checkpoint holds the weights it started from, whose digest its trainer.json
    records: a parent trained again under its key (a deleted folder retrained on a GPU,
    weights copied in) would otherwise leave a child of other weights reused. Refused in
    one line rather than retrained: whether the old child or the new parent is the one
    to keep is the user's call. Stages trained before the digest was recorded pass."""
    from looplab.checkpoint import CONFIG, PARENT_WEIGHTS, TRAINER, WEIGHTS_DIGEST
    from looplab.errors import ConfigError

    if cfg.parent is None:
        return
    started_from = stored_json(storage, f"{checkpoint}/{TRAINER}").get(PARENT_WEIGHTS)
    now = stored_json(storage, f"{cfg.parent.checkpoint}/{CONFIG}").get(WEIGHTS_DIGEST)
    if started_from is not None and now is not None and started_from != now:
        folder = checkpoint.rstrip("/").rsplit("/", 1)[0]
        raise ConfigError(f"{folder} was trained from the parent weights {str(started_from)[:19]}..., but "
                          f"{cfg.parent.checkpoint} now holds {str(now)[:19]}... (the parent was trained again or "
                          f"replaced); allowed: delete {folder} to train it again from the parent as it is, or "
                          "the parent's checkpoint as it was")


def stored_json(storage: Storage, location: str) -> dict[str, Any]:  # also trial.py: a checkpoint's step
    """A stored JSON object ({} when there is none), a damaged one said in one line."""
    from looplab.errors import ConfigError

    text = storage.read_text(location)
    try:
        return json.loads(text) if text else {}
    except ValueError as e:
        raise ConfigError(f"{location} is damaged ({e}); allowed: delete its stage folder to train it again") from None


def write_done(storage: Storage, location: str, info: dict[str, Any]) -> None:
    # One whole file (a temporary file renamed locally, one object on a store): a crash
    # never leaves half a marker.
    storage.write_text(f"{location}/{DONE}", json.dumps(info, indent=2, sort_keys=True) + "\n")


# ---- leases for object stores ---------------------------------------------------------------

def _locks():
    import ray

    @ray.remote(num_cpus=0)
    class StageLocks:
        """name -> (owner, expiry): the lease table."""

        def __init__(self):
            self.leases: dict[str, tuple[str, float]] = {}

        def acquire(self, name: str, owner: str, seconds: float) -> bool:
            now = time.time()
            holder = self.leases.get(name)
            if holder is None or holder[0] == owner or holder[1] < now:
                self.leases[name] = (owner, now + seconds)
                return True
            return False

        def release(self, name: str, owner: str) -> None:
            if self.leases.get(name, ("",))[0] == owner:
                del self.leases[name]

    # Detached: the table outlives the process that happened to create it.
    return StageLocks.options(name=LOCKS_ACTOR, namespace=NAMESPACE, get_if_exists=True,
                              lifetime="detached").remote()


@contextlib.contextmanager
def _lease(name: str) -> Iterator[None]:
    import ray

    locks, owner = _locks(), uuid.uuid4().hex
    while not ray.get(locks.acquire.remote(name, owner, LEASE_SECONDS)):
        time.sleep(2.0)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(LEASE_SECONDS / 4):
            ray.get(locks.acquire.remote(name, owner, LEASE_SECONDS))

    keeper = threading.Thread(target=renew, daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()
        ray.get(locks.release.remote(name, owner))
