"""The errors a user acts on, each a single line: ConfigError (a bad input, naming the
argument and what is allowed, raised before anything expensive starts), and the three
ways a run can stop that lose nothing: TrainingDiverged (its loss, gradient or weights
stopped being finite), CheckpointNotWritten (a full disk, say), StorageFull (a sweep's
storage has no room left) and Interrupted (the user asked it to stop: Ctrl-C or SIGTERM
to a sweep). `is_disk_full` tells a full disk in any of its guises."""

from __future__ import annotations

import difflib
import errno
from collections.abc import Iterable
from typing import Any

# A full disk as the operating system, SQLite and Ray Tune's error text say it
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_WORDS = (
    "No space left on device",
    "Disk quota exceeded",
    "database or disk is full",
    "storage full: ",  # StorageFull's own line, as a trial's error text carries it
)


class ConfigError(ValueError):
    """A config value outside its allowed range. The message is one line:
    "<name>=<value> is invalid; allowed: <allowed>". Raised through `check`, it keeps
    name, value and allowed, so a command line can say it in terms of its own flag
    (`renamed`) instead of the config field the flag reached."""

    def __init__(self, message: str, *, name: str | None = None, value: Any = None, allowed: str | None = None):
        super().__init__(message)
        self.name, self.value, self.allowed = name, value, allowed

    def renamed(self, name: str, value: Any) -> "ConfigError":
        """The same complaint about the argument `name` with its own `value`."""
        return invalid(name, value, self.allowed or str(self))


def invalid(name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{name}={value!r} is invalid; allowed: {allowed}", name=name, value=value, allowed=allowed)


def allowed_names(value: Any, names: Iterable[str]) -> str:
    """The allowed names as an error lists them, with the nearest to a mistyped value
    offered: "debug | local | ... (did you mean 'debug'?)"."""
    names = list(names)
    return " | ".join(names) + did_you_mean(value, names)


def did_you_mean(value: Any, names: Iterable[str]) -> str:
    """ " (did you mean 'debug'?)" for the name nearest a mistyped value, "" when none is near."""
    close = difflib.get_close_matches(str(value), list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise invalid(name, value, allowed)


class TrainingDiverged(FloatingPointError):
    """Training produced a non-finite loss, gradient or weight. The message is one line:
    the step, the tensor, the checkpoint that stays current, and the way out. The run
    never writes a non-finite checkpoint (looplab/training/train.py)."""


class CheckpointNotWritten(OSError):
    """A checkpoint could not be written (a full disk): the previous one stays current,
    and the message (one line) says which step that is and how to go on."""


class Interrupted(Exception):
    """A stop the user asked for (Ctrl-C or SIGTERM to a sweep): the stage that was
    training saved a checkpoint first, so running the same command again resumes.
    The message is one line: what stopped where, and why."""


class StorageFull(OSError):
    """A sweep's storage has no room for what comes next: the sweep stopped, nothing
    finished is lost, and the same command resumes once space is freed. The message is
    one line: the place, what is free and what was needed where known, the way on."""


def is_disk_full(error: BaseException | str | None) -> bool:
    """Whether `error` is a full disk: an OSError of ENOSPC or EDQUOT, SQLite's "database
    or disk is full" (also wrapped by SQLAlchemy and MLflow), or an error's text saying
    so (Ray Tune keeps a failed trial's error as text); its causes count too."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, str):
            return any(words in error for words in DISK_FULL_WORDS)
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if any(words in str(error) for words in DISK_FULL_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False
