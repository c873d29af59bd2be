"""What Ray Tune does to a trial that the console must hear of, and the one failure no
retry can mend.

Tune restarts a failed trial (a killed worker, an out-of-memory kill) up to its
FailureConfig's count, silently: the error is only in ray.log. `TrialWatch` says each
restart in one progress line (the trial, the attempt, the error's first line; the
restarted stage then says where it resumes, trainables/stage_worker.py). A full disk
fails every retry the same way, so the first trial that fails on one stops the whole
sweep (`TrialWatch.stopper`), and the driver says it in one line (looplab.errors.
StorageFull) instead of waiting on trials that cannot write.

The error's text comes from the trial's error file, which Tune writes as text beside
the pickle it also keeps (never read here).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from looplab.errors import StorageFull, is_disk_full
from trainables.worker_watch import cause_line


def last_error(trial: Any) -> str:
    """The first line of the trial's newest failure, from Tune's text error file."""
    path = getattr(trial, "error_file", None)
    try:
        text = Path(path).read_text() if path else ""
    except OSError:
        return "(its error file cannot be read)"
    return cause_line(text.split("Failure # ")[-1].partition("\n")[2] if "Failure # " in text else text)


# The full-disk errors seen, by watch: Tune copies its callbacks and stoppers, so the
# copies share this (they all live in the driver's process) rather than an attribute.
_FULL: dict[str, str] = {}
_WATCHES = itertools.count()


def watch_of(post, label_of):
    """A Tune callback with its stopper: `post(label, event, **fields)` puts a progress
    record on the sweep's board; `label_of(trial)` names the trial as progress lines do.
    `watch.full` is the first full-disk error a trial failed with, or None."""
    from ray import tune

    class TrialWatch(tune.Callback):
        def __init__(self, token: str) -> None:
            self.token = token
            self.stopper = _StopWhenFull(token)

        @property
        def full(self) -> str | None:
            return _FULL.get(self.token)

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            error = last_error(trial)
            if self._note(error):  # no restart can write: the sweep stops instead (the driver says so)
                return
            attempt = getattr(getattr(trial, "run_metadata", None), "num_failures", 0) + 1
            post(label_of(trial), "restarted", attempt=attempt, error=error)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._note(last_error(trial))

        def _note(self, error: str) -> bool:
            if is_disk_full(error):
                _FULL.setdefault(self.token, error)
            return self.token in _FULL

    class _StopWhenFull(tune.Stopper):
        def __init__(self, token: str) -> None:
            self.token = token

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            return False

        def stop_all(self) -> bool:
            return self.token in _FULL

    return TrialWatch(f"watch-{next(_WATCHES)}")


def make_watch(platform):
    """The watch of a sweep's Tune run: restarts posted on its progress board, each
    trial named as its progress lines name it."""
    from trainables.progress import Reporter
    from trainables.trial import trial_label, trial_params

    def post(label: str, event: str, **fields: Any) -> None:
        Reporter(platform.progress_board, label).post(event, **fields)

    return watch_of(post, lambda trial: trial_label(trial_params(trial.config)) or "shared stage")


def stop_if_full(watch, storage_path: str) -> None:
    """StorageFull when a trial failed on a full disk: the trial's own line where it
    planned its room (trainables/stage_worker.py), else where the storage stands."""
    if watch.full is None:
        return
    said = watch.full.partition("storage full: ")[2]
    raise StorageFull(f"storage full: {said}" if said else storage_full_line(storage_path))


def storage_full_line(storage_path: str) -> str:
    """A full storage's line, with what its local folder has free now."""
    from trainables.storage import Storage, free_bytes, full_line

    local = Storage(storage_path).scratch()
    return full_line(local, free_bytes(local))
