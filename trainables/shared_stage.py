"""A stage shared by several trials is trained once: the first trial to take the
stage's lock trains it and writes a "done" marker; the others wait on the lock,
find the marker and reuse the checkpoint.

The lock is trainables/lease.py's: an flock on a file in the stage folder when the
storage is a file system (local disk, or NFS/EFS on a cluster: flock is released when
its holder dies). On an object store there are no locks, so the cluster's Ray actor of
leases holds it: the holder renews its lease while it trains, and a lease its holder
stopped renewing (a dead process) expires after LEASE_SECONDS and passes to the next waiter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ContextManager

from trainables import lease
from trainables.storage import Storage

DONE = "done.json"
LOCK = ".lock"
# How long a trial that stopped renewing is taken for alive: the trials waiting on its
# stage sit idle this long after it died. Half a sweep's lease: the cluster's actor
# answers at once, so a live trial's renewals do not come late.
LEASE_SECONDS = 60.0


def stage_lock(storage: Storage, location: str) -> ContextManager[Any]:
    """Hold the stage's lock for the block, waiting while another trial trains the stage."""
    if not storage.remote:
        return lease.flocked(Path(location) / LOCK, wait=True)
    return lease.held(lease.ActorTable(), location, LEASE_SECONDS, wait=True)


def read_done(storage: Storage, location: str) -> dict[str, Any] | None:
    text = storage.read_text(f"{location}/{DONE}")
    return json.loads(text) if text else None


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
