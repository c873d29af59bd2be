"""Stopping a sweep the way its user expects: the first Ctrl-C (SIGINT) or SIGTERM asks
every trial to stop, the second exits at once.

The first signal starts nothing new: the driver asks the trials, through the progress
board (trainables/progress.py), to stop; a training stage checkpoints at its next step
and its run ends KILLED with the reason; a trial that has not started yet ends without
a run. Tune then finishes on its own, and the driver closes the sweep run as KILLED and
prints how to resume (the same command: stages resume from their checkpoints, finished
ones are reused). Ray Tune's own SIGINT handler is turned off for the sweep: it would
end the trials' processes before they save.

The second signal raises KeyboardInterrupt in the driver: it exits at once, closing its
runs as KILLED (sweeps/launch.py), and a rerun resumes from the last checkpoints.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from typing import Any, Callable

from looplab.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)
TUNE_SIGINT_ENV = "TUNE_DISABLE_SIGINT_HANDLER"


class StopOnSignal:
    """Inside the block, SIGINT and SIGTERM call `request(reason)` once, then raise
    KeyboardInterrupt. `reason` is the first signal's name (None: no signal came)."""

    def __init__(self, request: Callable[[str], None], out=None):
        self.request, self.out = request, out or sys.stderr
        self.reason: str | None = None
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}  # signal.signal's previous handlers
        self._tune_env: str | None = None

    def __enter__(self) -> "StopOnSignal":
        self._tune_env = os.environ.get(TUNE_SIGINT_ENV)
        os.environ[TUNE_SIGINT_ENV] = "1"
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._tune_env is None:
            os.environ.pop(TUNE_SIGINT_ENV, None)
        else:
            os.environ[TUNE_SIGINT_ENV] = self._tune_env

    def _handle(self, signum: int, frame) -> None:
        if self.reason is not None:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: exit at once")
        self.signum, self.reason = signum, signal.Signals(signum).name
        print(
            f"\n{self.reason}: stopping the sweep: no new stage starts, training stages save a checkpoint "
            "(press Ctrl-C again to exit at once)",
            file=self.out,
            flush=True,
        )
        self.request(self.reason)

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by this signal (130 for SIGINT)."""
        return 128 + (self.signum or signal.SIGINT)

    def check(self) -> None:
        """Raise SweepStopped when a signal came: nothing after this point starts."""
        if self.reason is not None:
            raise SweepStopped(self.reason, self.exit_status)


class SweepStopped(Interrupted):
    """The sweep stopped on the user's signal; its exit status is the signal's."""

    def __init__(self, reason: str, exit_status: int):
        super().__init__(f"the sweep was stopped ({reason})")
        self.reason, self.exit_status = reason, exit_status


def resume_line(reason: str) -> str:
    """What the driver prints last after a stop: how to go on."""
    command = " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv])
    return (
        f"stopped ({reason}): training stages saved a checkpoint and their runs are KILLED; "
        f"to resume, run the same command again: {command}"
    )
