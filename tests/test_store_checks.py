"""A damaged MLflow store is one line before any work (looplab/destinations.py
intact_sqlite): a truncated and a page-corrupted SQLite file, made here with the
stdlib's sqlite3, and a store in memory that would keep nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
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


# ---- a full disk ---------------------------------------------------------------------------


def test_a_full_disk_is_known_in_each_of_its_guises():
    import errno

    from looplab.errors import is_disk_full

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise RuntimeError("(raised as a result of Query-invoked autoflush)") from e
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)  # MLflow's wrapping of SQLite's error
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full("ray.exceptions.RayTaskError: OSError: [Errno 28] No space left on device")
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("loss is nan"))


def test_a_stage_without_room_for_its_checkpoints_is_one_line(tmp_path, monkeypatch):
    """Before a stage trains: room for two checkpoints (one is written beside the other)."""
    import shutil

    from looplab.errors import StorageFull
    from trainables import storage

    free = 3 * 2**20
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * free, 9 * free, free))
    storage.check_room(tmp_path / "stages" / "stage1-abc", free, "the stage1 stage's checkpoints")  # just fits
    with pytest.raises(StorageFull) as full:
        storage.check_room(tmp_path / "stages" / "stage1-abc", free + 1, "the stage1 stage's checkpoints")
    said = str(full.value)
    assert said.startswith(f"storage full: {tmp_path / 'stages' / 'stage1-abc'} has 3.0 MiB free; the stage1")
    assert "run the same command again" in said and "\n" not in said


def test_a_failed_run_keeps_its_own_error_when_the_store_is_full_too():
    """terminated_on_exit raises what stopped the block, not the store's failure to record it."""
    from looplab import tracking

    class FullStore:
        def set_tag(self, *args):
            raise sqlite3.OperationalError("database or disk is full")

        set_terminated = set_tag

        def get_run(self, *args):
            raise sqlite3.OperationalError("database or disk is full")

    with pytest.raises(OSError, match="No space left"), tracking.terminated_on_exit(FullStore(), "run"):
        raise OSError(28, "No space left on device")


TUNE_ERROR_FILE = """Failure # 1 (occurred at 2026-11-29_01-55-01)
ray::run_trial() (pid=123, ip=127.0.0.1)
  File "trainables/stage_worker.py", line 160, in train_stage
    _check_room(cfg, work)
looplab.errors.StorageFull: storage full: /s/stages/stage1-ab has 1.9 MiB free; the stage1 stage's checkpoints need about 5.4 MiB: free space
"""


def test_the_watch_says_a_restart_and_stops_the_sweep_on_a_full_disk(tmp_path):
    pytest.importorskip("ray")
    from sweeps.trial_watch import last_error, watch_of

    class Trial:
        def __init__(self, text: str, failures: int):
            self.error_file = tmp_path / f"error-{failures}.txt"
            self.error_file.write_text(text)
            self.run_metadata = type("Metadata", (), {"num_failures": failures})()
            self.config = {}

    posted = []
    watch = watch_of(lambda label, event, **fields: posted.append((label, event, fields)), lambda trial: "beta=0.1")
    killed = "Failure # 1 (occurred at 2026-11-29)\nray.exceptions.ActorDiedError: The actor died unexpectedly\n"
    assert last_error(Trial(killed, 1)) == "ray.exceptions.ActorDiedError: The actor died unexpectedly"
    watch.on_trial_recover(iteration=1, trials=[], trial=Trial(killed, 1))
    assert posted == [
        ("beta=0.1", "restarted", {"attempt": 2, "error": "ray.exceptions.ActorDiedError: The actor died unexpectedly"})
    ]
    assert watch.full is None and not watch.stopper.stop_all()
    watch.on_trial_recover(iteration=2, trials=[], trial=Trial(TUNE_ERROR_FILE, 1))
    assert len(posted) == 1  # no restart is said: none can write, so the sweep stops
    assert watch.full.startswith("looplab.errors.StorageFull: storage full: /s/stages/stage1-ab has 1.9 MiB free")
    assert watch.stopper.stop_all()
    assert not watch_of(lambda *a, **k: None, str).stopper.stop_all()  # another sweep's watch is its own


@contextlib.contextmanager
def small_filesystem(path: Path, megabytes: int):
    """A tmpfs of that size at `path` (root's mount), unmounted after; skips without one."""
    path.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"no tmpfs here ({made.stderr.decode().strip()[:80]}); the unit tests above fake ENOSPC instead")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(folder: Path, leave: int) -> Path:
    filler = folder / "filler"
    with filler.open("wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, shutil.disk_usage(folder).free - leave))
    return filler


@pytest.mark.slow  # three small sweeps: about two minutes on 2 cores
def test_a_sweep_on_a_full_disk_stops_in_one_line_and_resumes_once_freed(tmp_path):
    with small_filesystem(tmp_path / "small", 40) as small:
        store = small / "store"
        sweep = [sys.executable, str(REPO / "sweeps" / "beta_ablation.py"), "--preset", "debug"]
        sweep += ["--storage-path", str(store), "--stage-steps", "pretrain=40,stage1=20"]

        def run(*betas: str) -> subprocess.CompletedProcess:
            return subprocess.run([*sweep, "--betas", ",".join(betas)], capture_output=True, text=True, timeout=600)

        assert run("0.1").returncode == 0
        filler = _fill(small, leave=2 * 2**20)  # less than a Stage-1 stage's two checkpoints and logs
        full = run("0.1", "0.5")
        said = [line for line in full.stderr.splitlines() if "storage full" in line]
        assert full.returncode == 1, full.stderr[-2000:]
        assert len(said) == 1 and said[0].startswith("error: storage full: "), full.stderr[-2000:]
        assert "Traceback" not in full.stderr and "run the same command again" in said[0]
        with sqlite3.connect(store / "mlflow.db") as db:
            assert db.execute("select count(*) from runs where status = 'RUNNING'").fetchone() == (0,)
        db.close()
        filler.unlink()
        freed = run("0.1", "0.5")
        assert freed.returncode == 0, freed.stderr[-2000:]
        assert "[beta=0.5 seed=0] stage1: done" in freed.stderr and "[beta=0.1 seed=0] trial reused" in freed.stderr


RAY_DEATH_NOTICE = """The actor died unexpectedly before finishing this task.
\tclass_name: RayTrainWorker
\tpid: 4816
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the OOM killer"""


def test_a_dead_worker_is_said_in_one_line_with_its_cause_and_the_retry():
    pytest.importorskip("ray")
    from ray.exceptions import ActorDiedError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    from trainables.worker_watch import death_line

    class Died(ActorDiedError):  # Ray builds its own from a dead actor's details; the text is what matters
        def __str__(self) -> str:
            return RAY_DEATH_NOTICE

    killed = WorkerHealthCheckFailedError("A worker health check failed.\nWorker info: Worker(...)", Died())
    assert death_line(0, killed, attempt=1, retries=2) == {
        "rank": 0,
        "error": "Died: The actor is dead because its worker process has died.",
        "then": "Ray Train restarts its workers (retry 1 of 2)",
    }
    raised = RuntimeError("Traceback (most recent call last):\n  File 'x.py', line 3\nRuntimeError: boom")
    assert death_line(1, raised, attempt=3, retries=2) == {
        "rank": 1,
        "error": "RuntimeError: boom",
        "then": "no retry left",
    }
