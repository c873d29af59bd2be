"""The ledger of seeds: each seed's first use by the miniature, written when the seeds
start (event "started") and when their verdicts are scored ("scored"), with the
protocol's digest, the machine, the commit and whether the run was exploratory. A seed
whose first use is elsewhere makes a later run exploratory (sweeps/paper_mini.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from looplab.errors import ConfigError
from sweeps.protocol import HISTORY, Past, Protocol

LEDGER = "protocol_ledger.jsonl"
COMMITTED_LEDGER = Path(__file__).resolve().parent / LEDGER  # the ledger lines committed with verdicts
STARTED, SCORED = "started", "scored"  # a ledger line's event


class Ledger:
    """Which seeds were used under which protocol digest, in the order they were first
    used: HISTORY's seeds, then the committed ledger (COMMITTED_LEDGER), then the
    store's STORAGE/protocol_ledger.jsonl, one JSON object a line, appended, never
    rewritten, read and written through the store (trainables/storage.py: a local
    folder or an object store, so the dry run and the run read one file). A line:
    {"seed", "protocol": DIGEST, "name", "event": "started" | "scored", "exploratory",
    "machine", "commit", "dirty"}; lines written before v5 carry the first three and
    were written when verdicts were (event "scored")."""

    def __init__(
        self, storage: str | Path, history: tuple[Past, ...] = HISTORY, committed: Path | None = COMMITTED_LEDGER
    ):
        from trainables.storage import Storage

        self.store = Storage(str(storage))
        self.path = self.store.path(LEDGER)  # a local path, or a URI on an object store
        self.history, self.committed = history, committed

    def _lines(self) -> list[tuple[str, str]]:
        """(where, text) of every ledger line: the committed file's, then the store's."""
        out = []
        if self.committed is not None and self.committed.is_file():
            out += [(str(self.committed), t) for t in self.committed.read_text().splitlines()]
        text = self.store.read_text(self.path)
        if text:
            out += [(self.path, t) for t in text.splitlines()]
        return out

    def entries(self) -> list[dict[str, Any]]:
        """Every line, HISTORY's first (event "scored"), in the order they were used."""
        out = [
            {"seed": seed, "protocol": past.protocol.digest(), "name": past.protocol.name, "event": SCORED}
            for past in self.history
            for seed in past.protocol.seeds
        ]
        seen: dict[str, int] = {}
        for where, line in self._lines():
            seen[where] = seen.get(where, 0) + 1
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append(
                    {**d, "seed": int(d["seed"]), "protocol": str(d["protocol"]), "name": str(d.get("name", ""))}
                )
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(
                    f"{where}:{seen[where]} is not a ledger line ({e}); allowed: "
                    '{"seed": INT, "protocol": DIGEST, "name": TEXT, ...}'
                ) from None
        return out

    def first_used(self) -> dict[int, dict[str, Any]]:
        """seed -> its first ledger entry (the protocol it was first used under)."""
        first: dict[int, dict[str, Any]] = {}
        for e in self.entries():
            first.setdefault(e["seed"], e)
        return first

    def _append(self, seeds, protocol: Protocol, event: str, exploratory: bool) -> None:
        """One line per seed, unless this store already holds the same (seed, digest,
        event, exploratory): a re-run of a run adds nothing."""
        from looplab.tracking import git_dirty, git_sha, hardware

        mine = protocol.digest()
        have = {
            (e["seed"], e["protocol"], e.get("event", SCORED), bool(e.get("exploratory", False)))
            for e in self.entries()
        }
        new = [s for s in seeds if (s, mine, event, exploratory) not in have]
        if not new:
            return
        commit, dirty = git_sha(), git_dirty()
        lines = [
            json.dumps(
                {
                    "seed": s,
                    "protocol": mine,
                    "name": protocol.name,
                    "event": event,
                    "exploratory": exploratory,
                    "machine": hardware(),
                    "commit": commit,
                    "dirty": dirty,
                }
            )
            for s in new
        ]
        before = self.store.read_text(self.path) or ""
        self.store.write_text(self.path, before + "".join(line + "\n" for line in lines))

    def start(self, seeds, protocol: Protocol, exploratory: bool) -> None:
        """Note, before any of their stages trains, that these seeds are used under this protocol."""
        self._append(seeds, protocol, STARTED, exploratory)

    def record(self, seeds, protocol: Protocol, exploratory: bool = False) -> None:
        """Note that these seeds were scored under this protocol."""
        self._append(seeds, protocol, SCORED, exploratory)

    def status(self, seeds, protocol: Protocol) -> list[dict[str, Any]]:
        """Per seed: fresh (not yet used, or first used under this protocol in a run that
        was not exploratory) or the protocol it was first used under."""
        mine, rows, used = protocol.digest(), [], self.first_used()
        for s in seeds:
            first = used.get(s)
            rows.append(
                {
                    "seed": s,
                    "fresh": first is None or (first["protocol"] == mine and not first.get("exploratory", False)),
                    "first_used_under": mine if first is None else first["protocol"],
                    "first_protocol": protocol.name if first is None else first["name"],
                }
            )
        return rows
