"""A damaged MLflow store is one line before any work (looplab/destinations.py
intact_sqlite): a truncated and a page-corrupted SQLite file, made here with the
stdlib's sqlite3, and a store in memory that would keep nothing."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from looplab import destinations
from looplab.config import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _database(path: Path) -> Path:
    """An SQLite file of some hundred pages, whole."""
    with sqlite3.connect(path) as db:
        db.execute("create table runs(id integer primary key, name text)")
        db.executemany("insert into runs(name) values (?)", [("x" * 200,) for _ in range(3000)])
        db.execute("create index by_name on runs(name)")
    db.close()
    return path


def _truncated(path: Path) -> Path:
    _database(path)
    os.truncate(path, path.stat().st_size // 2)
    return path


def _page_corrupted(path: Path) -> Path:
    _database(path)
    with path.open("r+b") as f:  # the header stays, so only SQLite's own check can tell
        f.seek(4096 * 5 + 100)
        f.write(bytes(range(256)) * 12)
    return path


def test_a_whole_database_passes(tmp_path):
    uri = f"sqlite:///{_database(tmp_path / 'mlflow.db')}"
    destinations.tracking_uri("--tracking-uri", uri)
    destinations.existing_store("--tracking-uri", uri)


@pytest.mark.parametrize("damage", [_truncated, _page_corrupted])
@pytest.mark.parametrize("check", [destinations.tracking_uri, destinations.existing_store])
def test_a_damaged_database_is_one_line_naming_the_file(tmp_path, damage, check):
    path = damage(tmp_path / "mlflow.db")
    with pytest.raises(ConfigError) as e:
        check("--tracking-uri", f"sqlite:///{path}")
    said = str(e.value)
    assert "undamaged SQLite store" in said and str(path) in said and "restore" in said
    assert "\n" not in said


def test_a_store_in_memory_is_refused():
    with pytest.raises(ConfigError, match="keeps no record past this process"):
        destinations.tracking_uri("--tracking-uri", "sqlite:///:memory:")


def test_a_sweep_on_a_damaged_default_store_stops_before_ray(tmp_path):
    """The sweep's own store (sqlite:///STORAGE/mlflow.db, no --tracking-uri) is checked
    before Ray starts: one line, exit 2, the file left as it was."""
    store = tmp_path / "store"
    store.mkdir()
    path = _page_corrupted(store / "mlflow.db")
    before = path.read_bytes()
    done = subprocess.run(
        [sys.executable, str(REPO / "sweeps" / "beta_ablation.py"), "--preset", "debug", "--storage-path", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "PRAGMA quick_check" in done.stderr and "mlflow.db" in done.stderr
    assert path.read_bytes() == before
    assert not (store / "stages").exists()


def test_a_storage_path_on_a_symlink_loop_is_one_line(tmp_path):
    from trainables.storage import Storage

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match="--storage-path=.*is invalid; allowed: a folder") as e:
        Storage(tmp_path / "a")
    assert "\n" not in str(e.value)
