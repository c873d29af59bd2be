"""Stage folders on object storage (trainables/storage.py): fsspec's in-memory file
system stands in for a bucket. A stage checkpoint is written to it, the local scratch
copy is lost (another node), and the stage resumes from the store."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from looplab.checkpoint import TRAINER
from looplab.config import apply_overrides
from looplab.presets import get_preset
from trainables.stage_worker import train_stage
from trainables.storage import Storage


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPLAB_SCRATCH", str(tmp_path / "scratch"))
    return Storage(f"memory://bucket-{uuid.uuid4().hex[:8]}/sweep")


def test_upload_replaces_a_folder_whole_and_download_recovers_a_finished_upload(bucket, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights").write_bytes(b"v1")
    (src / TRAINER).write_text('{"step": 1}')
    where = bucket.path("stages", "s", "checkpoint")
    bucket.upload_dir(src, where, TRAINER)
    (src / "weights").write_bytes(b"v2")
    (src / TRAINER).write_text('{"step": 2}')
    bucket.upload_dir(src, where, TRAINER)
    out = tmp_path / "out"
    assert bucket.download_dir(where, out, TRAINER) and (out / "weights").read_bytes() == b"v2"
    assert not bucket.exists(where + ".next")
    # A crash after the new copy was complete but before it moved into place: the reader takes it.
    bucket.fs.move(bucket._key(where), bucket._key(where + ".next"))
    assert bucket.download_dir(where, tmp_path / "again", TRAINER)
    assert json.loads((tmp_path / "again" / TRAINER).read_text())["step"] == 2
    # Half an upload (no marker) is not a checkpoint.
    bucket.delete_dir(where + ".next")
    bucket.write_text(bucket.path("stages", "s", "checkpoint", "weights"), "partial")
    assert not bucket.download_dir(where, tmp_path / "none", TRAINER)


def test_stage_checkpoint_resumes_from_the_store_on_another_node(bucket):
    cfg = apply_overrides(
        get_preset("phop-debug"),
        {"train.steps": 4, "train.batch_size": 4, "train.log_every": 1, "train.eval_every": 0, "task.eval_count": 20},
    )
    folder = f"pretrain-{cfg.stage_key()}"
    first = train_stage(cfg, bucket, folder, stop_at=2, quiet=True)  # an interrupted stage: checkpoint at 2
    assert first.step == 2 and bucket.exists(bucket.path("stages", folder, "checkpoint", TRAINER))
    shutil.rmtree(bucket.scratch())  # the node is gone; only the store remains
    done = train_stage(cfg, bucket, folder, quiet=True)
    assert done.step == 4
    records = [
        json.loads(line) for line in bucket.read_text(bucket.path("stages", folder, "metrics.jsonl")).splitlines()
    ]
    assert [r["step"] for r in records if r["kind"] == "resume"] == [2]  # resumed mid-stage, not from 0
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]  # each step once
    stored = json.loads(bucket.read_text(bucket.path("stages", folder, "checkpoint", TRAINER)))
    assert {k: stored[k] for k in ("step", "stage_key")} == {"step": 4, "stage_key": cfg.stage_key()}


def test_a_continued_stage_reads_its_parent_from_the_store(bucket):
    from looplab.presets import stage_config

    overrides = {
        "train.steps": 2,
        "train.batch_size": 4,
        "train.eval_every": 0,
        "task.eval_count": 20,
        "model.n_loops": 3,
    }
    base = get_preset("phop-debug")
    pre = stage_config(base, "pretrain", overrides=overrides)
    pre_folder = f"pretrain-{pre.stage_key()}"
    train_stage(pre, bucket, pre_folder, quiet=True)
    s1 = stage_config(
        base, "stage1", parent=pre.as_parent(bucket.path("stages", pre_folder, "checkpoint")), overrides=overrides
    )
    shutil.rmtree(bucket.scratch())
    assert train_stage(s1, bucket, f"stage1-{s1.stage_key()}", quiet=True).step == 2
    missing = stage_config(
        base, "stage1", parent=pre.as_parent(bucket.path("stages", "nope", "checkpoint")), overrides=overrides
    )
    with pytest.raises(ValueError, match="parent checkpoint .* is missing"):
        train_stage(missing, bucket, f"stage1-{missing.stage_key()}", quiet=True)


def test_local_storage_paths_stay_paths(tmp_path):
    local = Storage(tmp_path / "runs")
    assert not local.remote and local.path("stages", "x") == str((tmp_path / "runs" / "stages" / "x").resolve())
    assert Storage(f"file://{tmp_path}/runs").path("a") == str(Path(tmp_path, "runs", "a").resolve())
    assert local.scratch("a") == Path(local.path("a"))
