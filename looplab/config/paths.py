"""A config field named by code, not by a string.

`field_key(lambda c: c.exit.beta)` is "exit.beta", the dotted override key that
apply_overrides reads and sweeps search over. The type checker follows the lambda's
attribute path through ExperimentConfig, so renaming ExitConfig.beta fails mypy at every
sweep that searches it, and a reader goes from the sweep to the field in one step. A
key that arrives as text (a stored sweep spec, a task field chosen at run time) is
checked against the dataclasses by `checked_key`: both give a ConfigKey, the same
string, so keys and stored specs read as before.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any, NewType

from looplab.config.experiment import ExperimentConfig
from looplab.errors import ConfigError

ConfigKey = NewType("ConfigKey", str)


class _Path:
    """Records the attributes read from it: what a field_key lambda selects."""

    def __init__(self, names: tuple[str, ...] = ()) -> None:
        self.names = names

    def __getattr__(self, name: str) -> "_Path":
        return _Path((*self.names, name))


def field_key(select: Callable[[ExperimentConfig], object]) -> ConfigKey:
    """The dotted override key of the field `select` reads, e.g.
    field_key(lambda c: c.train.lr) == "train.lr"."""
    path = select(typing.cast(ExperimentConfig, _Path()))
    if not isinstance(path, _Path) or len(path.names) != 2:
        raise ConfigError("field_key needs a lambda reading one section's field, e.g. lambda c: c.exit.beta")
    return checked_key(".".join(path.names))


def checked_key(text: str, name: str = "config key") -> ConfigKey:
    """`text` as a ConfigKey when it names a section's field (SECTION.FIELD; a task
    field of any task kind), else a one-line error naming `name`."""
    section, dot, field = text.partition(".")
    sections = _sections()
    if not dot or section not in sections:
        raise ConfigError(
            f"{name}={text!r} is invalid; allowed: SECTION.FIELD with SECTION one of {' | '.join(sections)}"
        )
    if field not in sections[section]:
        raise ConfigError(
            f"{name}={text!r} is invalid; allowed: a field of {section}, one of {', '.join(sorted(sections[section]))}"
        )
    return ConfigKey(text)


@functools.cache  # the dataclasses do not change; sweeps call checked_key at import
def _sections() -> dict[str, set[str]]:
    """Each dataclass section of ExperimentConfig -> its field names (a union section,
    the task: every arm's)."""
    out = {}
    for name, hint in typing.get_type_hints(ExperimentConfig).items():
        arms = [a for a in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(a)]
        if arms and type(None) not in typing.get_args(hint):  # the parent is no override section
            out[name] = {f.name for arm in arms for f in dataclasses.fields(typing.cast(Any, arm))}
    return out
