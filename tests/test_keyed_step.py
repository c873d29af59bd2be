"""The keyed step's rule: a step is finished when its outputs exist and verify, not
because a record says so; and its jobs run one by one, a failure costing only itself."""

from __future__ import annotations

import json

import pytest

from looplab.checkpoint import TRAINER, WEIGHTS
from looplab.presets import get_preset
from tests.store_fixture import store_stage
from trainables.keyed_step import record_of, run_jobs, set_aside
from trainables.storage import Storage

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def stored(tmp_path):
    cfg = get_preset("phop-debug")
    return cfg, store_stage(tmp_path, cfg, "run-1")


def test_a_whole_stage_is_finished(tmp_path, stored):
    cfg, _ = stored
    record = record_of(str(tmp_path), cfg)
    assert record.finished and not record.broken and record.done["run_id"] == "run-1"


def test_a_stage_without_a_marker_is_neither_finished_nor_broken(tmp_path):
    record = record_of(str(tmp_path), get_preset("phop-debug"))
    assert record.done is None and not record.finished and not record.broken


def _damage_weights(checkpoint):
    data = bytearray((checkpoint / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last tensor
    (checkpoint / WEIGHTS).write_bytes(bytes(data))


def _rewind(checkpoint):
    state = json.loads((checkpoint / TRAINER).read_text())
    (checkpoint / TRAINER).write_text(json.dumps({**state, "step": 1}))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda ck: __import__("shutil").rmtree(ck), "checkpoint missing"),
        (lambda ck: (ck / WEIGHTS).unlink(), f"checkpoint's {WEIGHTS} missing"),
        (lambda ck: (ck / TRAINER).write_text("{"), "checkpoint's records damaged"),
        (_rewind, "checkpoint at step 1 of "),
        (_damage_weights, "checkpoint damaged: "),
    ],
    ids=["deleted", "no-weights", "torn-trainer", "unfinished", "flipped-byte"],
)
def test_a_marker_over_missing_or_damaged_files_is_broken(tmp_path, stored, damage, problem):
    cfg, checkpoint = stored
    damage(checkpoint)
    record = record_of(str(tmp_path), cfg)
    assert record.broken and not record.finished
    assert record.problem.startswith(problem), record.problem


def test_set_aside_keeps_the_damaged_files_and_drops_the_marker(tmp_path, stored):
    cfg, checkpoint = stored
    _damage_weights(checkpoint)
    set_aside(Storage(tmp_path), str(checkpoint.parent), str(checkpoint))
    assert not checkpoint.exists() and (checkpoint.parent / "checkpoint.broken" / WEIGHTS).is_file()
    assert record_of(str(tmp_path), cfg).done is None  # trained afresh, as if never trained


def test_inline_jobs_run_in_order_and_one_failure_costs_only_itself():
    def work(n: int) -> int:
        if n == 2:
            raise ValueError("two")
        return n * 10

    results = list(run_jobs(work, [1, 2, 3], cpus=1, gpus=0, inline=True))
    assert [job for job, _ in results] == [1, 2, 3]
    assert results[0][1] == 10 and results[2][1] == 30
    assert isinstance(results[1][1], ValueError)


def test_a_broken_stage_and_a_stale_trial_are_said_in_one_line():
    from trainables.progress import format_record

    retrain = {"trial": "beta=0.1 seed=0", "event": "retrain", "stage": "pretrain", "why": "checkpoint missing"}
    assert format_record(retrain) == "[beta=0.1 seed=0] pretrain: checkpoint missing → retrain"
    stale = {"trial": "beta=0.1 seed=0", "event": "trial_stale", "why": "pretrain-abc: checkpoint missing"}
    assert (
        format_record(stale)
        == "[beta=0.1 seed=0] trial finished before, but pretrain-abc: checkpoint missing → run again"
    )


def test_a_verdict_is_not_reused_once_the_files_are_replaced(tmp_path, stored):
    """The sweep asks of a stage many times and the verdict is kept while the files stay
    the same; weights replaced afterwards (a new file, as a copy or a save makes) are read
    again and found damaged."""
    cfg, checkpoint = stored
    assert record_of(str(tmp_path), cfg).finished
    data = bytearray((checkpoint / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (checkpoint / "replacement").write_bytes(bytes(data))
    (checkpoint / "replacement").replace(checkpoint / WEIGHTS)
    assert record_of(str(tmp_path), cfg).problem.startswith("checkpoint damaged: ")
