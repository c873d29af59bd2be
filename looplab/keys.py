"""Keys: one digest for everything looplab names by content, and one rule for the
names (of folders, runs and lock files) made from a key.

A result is found again by its key, never by a timestamp or a counter: the same inputs
give the same key, so a re-run, another sweep or a resumed trial finds what was
already computed. The stage key (looplab/config/experiment.py), the evaluation and bench
keys (trainables/evaluation.py, trainables/bench.py), the sweep key and a trial's name
(sweeps/sweep.py) are all `digest` of a payload, and every stored name is
`keyed_name(name, key)`: `<name>-<key>`, the readable part first and the key last, as
Marin's executor names each step's output after the step and the hash of its config.

Keys of stores written before this module existed stay valid: each caller keeps the
length and the JSON form its keys were first made with (STRICT or LENIENT below).
Changing either renames every stored result of that kind, which is then trained or
evaluated again; tests/test_keys.py pins values written before to catch that.

Imports nothing beyond the standard library (no torch, Ray, MLflow or polars): the
driver, the analysis and the workers all name things with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ---- lengths -------------------------------------------------------------------------
# Hex digits of SHA-256 kept per key. 12 (48 bits) keeps names short and collisions
# unlikely among the stages, evaluations and speed points of one store; the others
# are the lengths their keys were first stored with, kept so those stores stay found.
KEY_LENGTH = 12  # stage keys, config hashes, evaluation and speed keys, path digests
SWEEP_KEY_LENGTH = 10  # sweep keys (the sweep's MLflow run, its Ray Tune folder, its lock)
TRIAL_NAME_KEY_LENGTH = 6  # the tail of a trial's name, after its readable params
FILES_KEY_LENGTH = 16  # an evaluation's data: the content of its local files
LOCATION_KEY_LENGTH = 16  # a local copy of an object store's checkpoint
# The whole SHA-256: a text's identity where no name is made of it (looplab/tasks/text.py:
# a corpus' duplicates, the digest order that splits it, a stream's held-out texts).
FULL_LENGTH = 64
SHA256 = "sha256:"  # how a content digest of files says which hash it is (file_digest, files_digest)


# ---- the JSON a payload is hashed as ------------------------------------------------
@dataclass(frozen=True)
class JsonForm:
    """How a payload becomes the text that is hashed. Keys are sorted in every form;
    the separators and the handling of values JSON lacks are what the forms differ in."""

    separators: tuple[str, str]
    default: Callable[[Any], Any] | None  # None: a value JSON lacks is an error


# Stage keys, config hashes, evaluation and speed keys: compact, and a value JSON lacks
# raises, so a key never silently depends on some object's str().
STRICT = JsonForm(separators=(",", ":"), default=None)
# Sweep keys, trial names and task-config versions were first made with json.dumps's
# defaults (", " and ": ") and str() for values JSON lacks (a Path, say);
# they keep that form, or every stored sweep and evaluation would be renamed.
LENIENT = JsonForm(separators=(", ", ": "), default=str)


def canonical_json(payload: Any, form: JsonForm = STRICT) -> str:
    """The payload as the text its key hashes: sorted keys, so dict order never matters."""
    return json.dumps(payload, sort_keys=True, separators=form.separators, default=form.default)


def digest(payload: Any, length: int = KEY_LENGTH, form: JsonForm = STRICT) -> str:
    """The key of a JSON payload: the first `length` hex digits of SHA-256 over its
    canonical JSON. Every content key of looplab is this."""
    return _sha256_hex(canonical_json(payload, form).encode())[:length]


def text_digest(text: str, length: int = KEY_LENGTH) -> str:
    """The key of a single string (a path, a storage URI), hashed as its UTF-8 bytes
    rather than as JSON: how such keys were first made, so stored ones stay found.
    length=FULL_LENGTH: the whole hex digest (a document's identity)."""
    return _sha256_hex(text.encode())[:length]


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- content digests of files ----------------------------------------------------------
def file_digest(path: Path) -> str:
    """The full SHA-256 of a file's bytes, as sha256:<hex> (a checkpoint records its
    weights' digest and is verified against it before use)."""
    h = hashlib.sha256()
    _feed_file(h, path)
    return SHA256 + h.hexdigest()


def files_digest(files: dict[str, list[Path]], length: int = FILES_KEY_LENGTH) -> str:
    """A digest of the files' contents by split, as sha256:<hex> (an evaluation task's
    data): the same data under another path or name has the same digest, one changed
    byte another. Each split's name and each file end with a NUL, so moving a file from
    one split to another changes the digest."""
    h = hashlib.sha256()
    for split in sorted(files):
        for path in files[split]:
            h.update(f"{split}\0".encode())
            _feed_file(h, path)
            h.update(b"\0")
    return SHA256 + h.hexdigest()[:length]


def _feed_file(h: Any, path: Path) -> None:
    """A file into a hash, 1 MiB at a time: a checkpoint or a data set need not fit in memory."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)


# ---- names made from keys ---------------------------------------------------------------
STAGES_DIR = "stages"  # STORAGE/stages/<stage>-<stage_key>/: one folder per trained stage


def keyed_name(name: str, key: str) -> str:
    """The one output-path rule: `<name>-<key>`. The name says what it is (a stage, a
    sweep, a trial, an evaluation) and sorts a listing by it; the key says which one, so
    two different configs never share a name and the same config always finds its own."""
    return f"{name}-{key}"


def stage_folder(stage: str, stage_key: str) -> str:
    """A stage's folder (and its MLflow run's name): `<stage>-<stage_key>`."""
    return keyed_name(stage, stage_key)


def stage_path(stage: str, stage_key: str, *inside: str) -> tuple[str, ...]:
    """The parts of a stage's location under a storage root, for Storage.path(*parts):
    stages/<stage>-<stage_key>[/inside...]."""
    return (STAGES_DIR, stage_folder(stage, stage_key), *inside)
