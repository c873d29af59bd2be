"""looplab/destinations.py checks a destination by doing what the work will do there:
creating its folders and writing a file, then removing what it made. Permission bits
say nothing under root, so /proc and /sys (on every Linux, CI included) and a name
longer than the file system allows stand for the places nobody can write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from looplab import destinations
from looplab.errors import ConfigError

LONG = "n" * 300  # past NAME_MAX (255) on every common file system


def refused(check, *args) -> str:
    with pytest.raises(ConfigError) as e:
        check(*args)
    line = str(e.value)
    assert "\n" not in line and "is invalid; allowed:" in line, line
    return line


@pytest.mark.parametrize("path", ["/proc/looplab-run", "/proc/looplab/a/b", "/sys/looplab-run", "/sys/kernel/looplab"])
def test_places_nobody_can_write_are_refused(path):
    assert refused(destinations.output_dir, "--out", path).startswith(f"--out={path!r} is invalid")
    assert refused(destinations.output_file, "--json", path + ".json").startswith(f"--json={path + '.json'!r}")


def test_an_existing_file_in_a_place_that_refuses_writes_is_refused():
    # /proc/version looks like a regular file and opens for writing, as root; a write fails
    assert "--json='/proc/version'" in refused(destinations.output_file, "--json", "/proc/version")


def test_over_long_names_are_refused_in_one_line(tmp_path):
    assert "File name too long" in refused(destinations.output_dir, "--out", str(tmp_path / LONG))
    assert "File name too long" in refused(destinations.output_file, "--json", str(tmp_path / LONG))
    assert "File name too long" in refused(destinations.output_file, "--json", str(tmp_path / LONG / "x.json"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "check, flag",
    [
        (destinations.output_dir, "--out"),
        (destinations.output_file, "--json"),
        (destinations.tracking_uri, "--tracking-uri"),
    ],
)
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_destination_is_refused_not_taken_for_here(check, flag, empty):
    assert refused(check, flag, empty).startswith(f"{flag}={empty!r} is invalid")


def test_a_probe_leaves_nothing_behind(tmp_path):
    destinations.output_dir("--out", tmp_path / "a" / "b" / "run")
    destinations.output_file("--json", tmp_path / "c" / "d" / "out.json")
    destinations.tracking_uri("--tracking-uri", f"sqlite:///{tmp_path / 'e' / 'mlflow.db'}")
    assert list(tmp_path.iterdir()) == []  # folders made for the probe are gone again
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    destinations.output_file("--json", kept)
    assert kept.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]


def test_a_character_device_is_a_file_to_write():
    destinations.output_file("--json", "/dev/null")  # written in place; /dev's folder is not the question


def test_the_kind_of_each_entry_is_checked(tmp_path):
    destinations.output_file("--json", tmp_path / "new.json")
    assert "a file path (this is a folder)" in refused(destinations.output_file, "--json", tmp_path)
    (tmp_path / "file").write_text("x")
    assert "a folder (this is a file)" in refused(destinations.output_dir, "--out", tmp_path / "file")
    assert "(" + str(tmp_path / "file") + " is a file)" in refused(
        destinations.output_dir, "--out", tmp_path / "file" / "run"
    )


def test_the_files_a_command_writes_inside_its_folder_are_checked(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    (tmp_path / "checkpoint").write_text("x")
    line = refused(destinations.output_dir, "--out", tmp_path, ("metrics.jsonl",))
    assert "metrics.jsonl is a folder" in line
    assert "checkpoint is a file" in refused(destinations.output_dir, "--out", tmp_path, (), ("checkpoint",))
    destinations.output_dir("--out", tmp_path, ("new.jsonl",), ("new",))  # missing entries: the work makes them


def test_an_sqlite_store_is_a_writable_folder_and_an_sqlite_file(tmp_path):
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello")
    assert "an SQLite database file" in refused(destinations.tracking_uri, "--tracking-uri", f"sqlite:///{not_db}")
    assert "--tracking-uri='sqlite:////proc/looplab/m.db'" in refused(
        destinations.tracking_uri, "--tracking-uri", "sqlite:////proc/looplab/m.db"
    )
    assert "File name too long" in refused(destinations.tracking_uri, "--tracking-uri", f"sqlite:///{tmp_path}/{LONG}")
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")  # SQLite makes its tables in an empty file
    destinations.tracking_uri("--tracking-uri", f"sqlite:///{empty}?timeout=20")


@pytest.mark.parametrize("uri", ["garbage", "runs/mlruns", "file:///tmp/mlruns"])
def test_a_folder_store_is_refused_with_the_sqlite_alternative(uri, monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    line = refused(destinations.tracking_uri, "--tracking-uri", uri)
    assert line.startswith(f"--tracking-uri={uri!r} is invalid; allowed: sqlite:///")
    assert "MLFLOW_ALLOW_FILE_STORE" in line
    from mlflow.tracking import MlflowClient  # MLflow's own answer for the same URI: it refuses too

    with pytest.raises(Exception, match="maintenance mode"):
        MlflowClient(tracking_uri=str(tmp_path / "mlruns")).search_experiments()


def test_a_folder_store_is_checked_as_a_folder_when_mlflow_allows_it(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    destinations.tracking_uri("--tracking-uri", str(tmp_path / "mlruns"))
    destinations.tracking_uri("--tracking-uri", f"file://{tmp_path / 'mlruns'}")
    assert "--tracking-uri='file:///proc/looplab-mlruns'" in refused(
        destinations.tracking_uri, "--tracking-uri", "file:///proc/looplab-mlruns"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_store_reads_and_a_writable_one_is_probed(tmp_path):
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")
    destinations.existing_store("--tracking-uri", f"sqlite:///{store}")
    destinations.existing_store("--tracking-uri", f"sqlite:///{store}", write=True)
    assert "an existing MLflow store" in refused(
        destinations.existing_store, "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"
    )
    assert not (tmp_path / "none.db").exists()
    assert sorted(os.listdir(tmp_path)) == ["mlflow.db"]
    assert "--tracking-uri='sqlite:////proc/version'" in refused(
        destinations.existing_store, "--tracking-uri", "sqlite:////proc/version", True
    )


def test_write_text_writes_a_checked_file(tmp_path):
    target = tmp_path / "a" / "out.json"
    destinations.output_file("--json", target)
    destinations.write_text(target, "{}")
    assert Path(target).read_text() == "{}"
