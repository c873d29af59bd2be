"""What every config dataclass is made of: keyed fields and the checks of their values.

A field that can change a run's result is declared with `keyed(...)` and enters the
keys of the runs it configures (looplab/config/'s docstring); the checks raise a
one-line ConfigError naming the field and what is allowed.

This module sits below every config class, wherever the class lives (looplab/config/,
the task configs beside their tasks in looplab/tasks/), so that none of them imports
another config module to get these. It imports no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

from looplab.errors import check

KEY = "key"  # field metadata: the field can change a run's result, so it enters the run's key
ADDED = "added"  # field metadata: keyed, but added after keys were stored (keyed(..., added=True))


def keyed(
    default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, added: bool = False
) -> Any:
    """A dataclass field that enters the keys of the runs it configures.

    added=True: a field added after keys were stored. It enters a key only when set
    away from its default, so every key made before the field existed (and every run
    that leaves it at its default) stays what it was (tests/test_keys.py pins them)."""
    return field(default=default, default_factory=default_factory, metadata={KEY: True, ADDED: added})


def key_values(obj: Any) -> dict[str, Any]:
    """The keyed fields of a config dataclass, as JSON-able data (an added field only
    when it is away from its default)."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get(KEY):
            value = getattr(obj, f.name)
            if f.metadata.get(ADDED) and value == f.default:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def unkeyed_fields(cls: type) -> list[str]:
    """The fields of a config class that never enter a key."""
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get(KEY)]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_ints(obj: Any, *names: str, minimum: int = 1) -> None:
    """Each named field holds an integer >= minimum."""
    for n in names:
        v = getattr(obj, n)
        check(is_int(v) and v >= minimum, f"{type(obj).__name__}.{n}", v, f"an integer >= {minimum}")


def check_finite(obj: Any, *names: str) -> None:
    """Float fields hold finite numbers: inf, NaN or a string ("abc", "nan") is refused
    here, before a range check compares it (NaN passes no comparison; inf passes > 0)."""
    for n in names:
        v = getattr(obj, n)
        check(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            f"{type(obj).__name__}.{n}",
            v,
            "a finite number",
        )


def check_choice(obj: Any, name: str, options) -> None:
    """The named field holds one of options."""
    v = getattr(obj, name)
    check(v in options, f"{type(obj).__name__}.{name}", v, " | ".join(map(str, options)))
