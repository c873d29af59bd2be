"""A continued stage continues its parent's training stream (TrainConfig.data_start).

Batches are a pure function of (seed, step, start): a stage whose stream restarted at 0
would train again on the batches its parent began with (Stage-1 on pre-training's first
batches, CHASE on them a third time). Every check here reads batches by content (the
token ids of each sample) against a reference built without the stage's data_start.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from looplab.checkpoint import parent_ref
from looplab.config import ConfigError, ParentRef, apply_overrides
from looplab.presets import get_preset, stage_config
from looplab.stages import ARMS, CHASE_ARM, OURO_MATCHED_ARM
from looplab.tasks import make_task
from looplab.tasks.mano import ManoTask
from looplab.tasks.phop import PhopTask
from looplab.training import train as train_module
from looplab.training.train import train
from trainables.pipeline import PipelineSpec, stage_configs

BATCH, PRETRAIN_STEPS, STAGE_STEPS = 2, 6, 4
# The debug preset (byte-level text) through the platform's pipeline, as a sweep builds it.
SPEC = PipelineSpec(
    preset="debug",
    stages=ARMS["ouro"],
    arms={**ARMS, "ouro_matched": OURO_MATCHED_ARM},
    overrides={"train.batch_size": BATCH, "train.eval_every": 0},
    stage_overrides={
        "pretrain": {"train.steps": PRETRAIN_STEPS},
        **{s: {"train.steps": STAGE_STEPS} for s in CHASE_ARM[1:] + OURO_MATCHED_ARM[1:]},
    },
)


@pytest.fixture(scope="module")
def chase_arm():
    configs = stage_configs(SPEC, {"arm": "chase", "seed": 0}, "/store")
    assert [c.stage for c in configs] == list(CHASE_ARM)
    return configs, make_task(configs[0].task, configs[0].train.seq_len)


def batches(task, cfg, steps=None, *, start=None):
    """cfg's training batches: its first `steps` (default: all of its own), from the
    stream position `start` (default: cfg's data_start)."""
    t = cfg.train
    start = t.data_start if start is None else start
    return [task.train_batch(s, t.batch_size, t.seq_len, t.seed, start=start) for s in range(steps or t.steps)]


def samples(batch_list) -> list[bytes]:
    """Each sample by content: its inputs and its last target (the whole packed block)."""
    return [
        torch.cat([ids, targets[-1:]]).numpy().tobytes() for b in batch_list for ids, targets in zip(b.ids, b.targets)
    ]


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.ids, y.ids) and torch.equal(x.targets, y.targets) for x, y in zip(a, b)
    )


# ---- a lineage never sees a sample twice ----------------------------------------------------
def test_no_stage_sees_a_sample_its_lineage_saw(chase_arm):
    configs, task = chase_arm
    seen: set[bytes] = set()
    for cfg in configs:
        mine = samples(batches(task, cfg))
        assert len(set(mine)) == len(mine) == cfg.train.steps * BATCH
        assert not seen & set(mine), f"{cfg.stage} trains on samples an earlier stage of its lineage saw"
        seen |= set(mine)


def test_each_stage_is_its_parents_stream_continued(chase_arm):
    configs, task = chase_arm
    assert [c.train.data_start for c in configs] == [0, 12, 20, 28]  # 6 × 2, then + 4 × 2 per stage
    for parent, child in zip(configs, configs[1:]):
        t = parent.train
        kept_training = [
            task.train_batch(t.steps + s, t.batch_size, t.seq_len, t.seed, start=t.data_start)
            for s in range(child.train.steps)
        ]
        assert same(batches(task, child), kept_training)
    # and the whole lineage is pre-training's own stream, read on
    lineage = batches(task, configs[0], sum(c.train.steps for c in configs))
    assert same(sum((batches(task, c) for c in configs), []), lineage)


def test_arms_of_as_many_steps_see_as_many_fresh_samples():
    """CHASE's arm and Ouro's step-matched control share pre-training and Stage-1 (one
    key each) and then each train as many steps on samples neither lineage saw before."""
    chase = stage_configs(SPEC, {"arm": "chase", "seed": 0}, "/store")
    matched = stage_configs(SPEC, {"arm": "ouro_matched", "seed": 0}, "/store")
    assert [c.stage_key() for c in matched[:2]] == [c.stage_key() for c in chase[:2]]
    assert matched[2].train.data_start == chase[2].train.data_start == 20
    assert matched[3].train.data_start == chase[3].train.data_start == 28
    assert matched[3].stage_key() != chase[3].stage_key()  # another parent


# ---- pre-training's stream is the one before data_start ---------------------------------------
def test_pretraining_batches_are_unchanged_by_the_keyword(chase_arm):
    configs, task = chase_arm
    pretrain = configs[0]
    assert pretrain.train.data_start == 0
    t = pretrain.train
    # the in-memory corpus's order as the text module documents it: epoch 0's permutation
    order = np.random.default_rng([t.seed, 0]).permutation(len(task.corpus.train_blocks))
    for step in range(t.steps):
        expected = task.corpus.train_blocks[order[step * BATCH : (step + 1) * BATCH]]
        got = task.train_batch(step, BATCH, t.seq_len, t.seed, start=0)
        assert torch.equal(got.ids, torch.as_tensor(expected[:, :-1], dtype=got.ids.dtype))
        assert same([got], [task.train_batch(step, BATCH, t.seq_len, t.seed)])


def test_synthetic_pretraining_batches_are_unchanged():
    phop = PhopTask(get_preset("phop-debug").task)
    for step in (0, 3):  # the rng of before: one per (seed, step)
        reference = phop._batch(phop._samples(np.random.default_rng([7, step, 0]), 4))
        assert same([phop.train_batch(step, 4, 0, 7, start=0)], [reference])
        assert same([phop.train_batch(step, 4, 0, 7)], [reference])
    mano = ManoTask(get_preset("mano-debug").task)
    assert same([mano.train_batch(2, 3, 32, 7, start=0)], [mano.train_batch(2, 3, 32, 7)])


# ---- the rule of each task ------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["phop-debug", "mano-debug"])
def test_a_synthetic_stream_continues_exactly_at_a_whole_batch(preset):
    task = make_task(get_preset(preset).task, 32)
    parent_stream = [task.train_batch(s, 4, 32, 5) for s in range(8)]
    assert same([task.train_batch(s, 4, 32, 5, start=3 * 4) for s in range(5)], parent_stream[3:])


@pytest.mark.parametrize("preset", ["phop-debug", "mano-debug"])
def test_a_synthetic_stream_at_another_batch_size_is_disjoint(preset):
    """A parent of 4 a step stopped at 12 samples, a child of 5 a step: 12 is no whole
    number of the child's batches, so it draws a stream keyed by its start, which shares
    no batch with the parent's stream nor with another start's."""
    task = make_task(get_preset(preset).task, 32)
    parent = set(samples([task.train_batch(s, 4, 32, 5) for s in range(40)]))
    parent |= set(samples([task.train_batch(s, 5, 32, 5) for s in range(40)]))  # its own size at start 0
    child = samples([task.train_batch(s, 5, 32, 5, start=12) for s in range(6)])
    other = samples([task.train_batch(s, 5, 32, 5, start=13) for s in range(6)])
    assert len(set(child)) == len(child) and not parent & set(child)
    assert not set(child) & set(other)


def test_text_continues_exactly_whatever_the_batch_sizes(chase_arm):
    _, task = chase_arm
    seq = task.seq_len
    parent_stream = torch.cat([task.train_batch(s, 4, seq, 3).ids for s in range(6)])  # 24 samples
    child = torch.cat([task.train_batch(s, 3, seq, 3, start=9).ids for s in range(5)])  # no whole number of either
    assert torch.equal(child, parent_stream[9:24])


def test_a_streamed_corpus_continues_exactly_too(tmp_path):
    from test_text import DOCS, byte_cfg

    from looplab.tasks.text import TextTask

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    cfg = byte_cfg(str(jsonl), streaming="on", val_blocks=2, shuffle_buffer=8)
    parent = TextTask(cfg, 15)
    stream = [parent.train_batch(s, 4, 15, 0).ids for s in range(6)]  # 24 blocks
    # the same task read on (no replay), and a fresh one (replays the 9 blocks before its start)
    assert torch.equal(parent.train_batch(0, 4, 15, 0, start=24).ids, parent.train_batch(6, 4, 15, 0).ids)
    fresh = TextTask(cfg, 15)
    child = torch.cat([fresh.train_batch(s, 3, 15, 0, start=9).ids for s in range(5)])
    assert torch.equal(child, torch.cat(stream)[9:24])


# ---- the parent's end, from a config and from a checkpoint -------------------------------------------
def tiny(steps, **extra):
    return apply_overrides(
        get_preset("phop-debug"),
        {
            "train.steps": steps,
            "train.warmup_steps": 1,
            "train.batch_size": 8,
            "train.eval_every": 0,
            "train.log_every": 2,
            "task.eval_count": 40,
            **extra,
        },
    )


def test_parent_ref_of_a_checkpoint_says_where_its_stream_stopped(tmp_path, monkeypatch):
    pretrain = tiny(4)
    train(pretrain, tmp_path / "pre", quiet=True)
    ref = parent_ref(tmp_path / "pre" / "checkpoint")
    assert ref.data_end == 4 * 8 == pretrain.as_parent().data_end
    assert ref.key == pretrain.stage_key()  # finished: its own key, as a sweep names it
    # the CLI's child (parent_ref) and the sweep's (as_parent) are one stage
    child = stage_config(pretrain, "pretrain_more", parent=ref, overrides={"train.steps": 2})
    assert child.train.data_start == 32
    swept = stage_config(
        pretrain, "pretrain_more", parent=pretrain.as_parent(ref.checkpoint), overrides={"train.steps": 2}
    )
    assert child.stage_key() == swept.stage_key()

    starts = []  # the stream position train() asks the task for

    def recording(cfg, seq_len=None, **kw):
        task = make_task(cfg, seq_len, **kw)
        real = task.train_batch

        def train_batch(step, batch_size, seq_len, seed, start=0):
            starts.append(start)
            return real(step, batch_size, seq_len, seed, start=start)

        task.train_batch = train_batch
        return task

    monkeypatch.setattr(train_module, "make_task", recording)
    train(child, tmp_path / "more", quiet=True)
    assert starts == [32, 32]
    # a grandchild continues from the child's end: its data_start + its steps × batch size
    assert parent_ref(tmp_path / "more" / "checkpoint").data_end == 32 + 2 * 8


def test_a_parent_stopped_early_counts_only_the_steps_it_ran(tmp_path):
    train(tiny(4), tmp_path, stop_at=3, quiet=True)
    ref = parent_ref(tmp_path / "checkpoint")
    assert ref.key.endswith("@step3") and ref.data_end == 3 * 8


def test_a_path_without_a_checkpoint_has_consumed_nothing(tmp_path):
    assert parent_ref(tmp_path / "nothing").data_end == 0


# ---- stage_config and validation ------------------------------------------------------------
def test_stage_config_starts_a_continued_stage_where_its_parent_stopped():
    base = get_preset("debug")
    parent = stage_config(base, "pretrain").as_parent("/ckpt")
    assert parent.data_end == 200 * 16
    assert stage_config(base, "stage1", parent=parent).train.data_start == 3200
    # an explicit data_start wins, sweep-wide or for the stage
    assert stage_config(base, "stage1", parent=parent, overrides={"train.data_start": 7}).train.data_start == 7
    assert stage_config(base, "stage1", parent=parent, stage_overrides={"train.data_start": 0}).train.data_start == 0
    # a parent of a different batch size still hands over its samples, not its steps
    small = stage_config(base, "pretrain", overrides={"train.batch_size": 4}).as_parent("/ckpt")
    assert stage_config(base, "stage1", parent=small).train.data_start == 200 * 4


def test_data_end_never_enters_a_key_by_itself():
    base = get_preset("debug")
    parent = stage_config(base, "pretrain").as_parent("/ckpt")
    pinned = {"train.data_start": 5}
    a = stage_config(base, "stage1", parent=parent, overrides=pinned)
    b = stage_config(
        base, "stage1", parent=ParentRef(parent.stage, parent.key, parent.group, "/ckpt", 1), overrides=pinned
    )
    assert a.stage_key() == b.stage_key() and a.config_hash() == b.config_hash()


@pytest.mark.parametrize("bad", [-1, "x", 1.5, True])
def test_a_bad_data_start_is_one_line(bad):
    with pytest.raises(ConfigError) as e:
        apply_overrides(get_preset("debug"), {"train.data_start": bad})
    assert str(e.value) == f"TrainConfig.data_start={bad!r} is invalid; allowed: an integer >= 0"


def test_a_bad_data_end_is_one_line():
    with pytest.raises(ConfigError, match=r"^ParentRef.data_end=-3 is invalid; allowed: an integer >= 0$"):
        ParentRef("pretrain", "k", "g", data_end=-3)
