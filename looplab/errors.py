"""The errors a user acts on, each a single line: ConfigError (a bad input, naming the
argument and what is allowed, raised before anything expensive starts), and the three
ways a run can stop that lose nothing: TrainingDiverged (its loss, gradient or weights
stopped being finite), CheckpointNotWritten (a full disk, say) and Interrupted (the
user asked it to stop: Ctrl-C or SIGTERM to a sweep)."""

from __future__ import annotations

from typing import Any


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
