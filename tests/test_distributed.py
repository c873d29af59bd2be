"""Data-parallel training (two gloo ranks on CPU) against its reference: one
process training the same global batches. Same data, same holes, averaged
gradients, so the weights after a few CHASE steps must agree to float rounding,
and only rank 0 writes the log and the checkpoint."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from looplab.checkpoint import load_model, parent_ref
from looplab.config import ConfigError
from looplab.presets import get_preset, stage_config
from looplab.training.distributed import Shard
from looplab.training.train import train

STEPS = 4


def configs(tmp_path):
    overrides = {
        "train.steps": STEPS,
        "train.batch_size": 8,
        "train.eval_every": 0,
        "train.eval_limit": 16,
        "train.log_every": 1,
        "train.warmup_steps": 1,
        "model.n_loops": 3,
        "hole.sampler": "depth",
        "hole.lo": 1.0,
        "hole.hi": 3.0,
    }
    base = get_preset("phop-debug")
    parent = tmp_path / "pretrain"
    train(stage_config(base, "pretrain", overrides=overrides), parent, quiet=True)
    return stage_config(base, "chase", parent=parent_ref(parent / "checkpoint"), overrides=overrides)


def _rank_main(rank: int, world: int, port: int, cfg_dict: dict, out: str) -> None:
    from looplab.config import ExperimentConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train(ExperimentConfig.from_dict(cfg_dict), out, quiet=True)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "train"]


def test_two_ranks_train_what_one_process_trains_on_the_global_batch(tmp_path):
    cfg = configs(tmp_path)
    train(cfg, tmp_path / "single", quiet=True)
    mp.spawn(_rank_main, args=(2, free_port(), cfg.to_dict(), str(tmp_path / "ddp")), nprocs=2, join=True)

    single, ddp = load_model(tmp_path / "single" / "checkpoint"), load_model(tmp_path / "ddp" / "checkpoint")
    moved = False
    for (name, a), (_, b) in zip(single.state_dict().items(), ddp.state_dict().items()):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4, msg=f"parameter {name}")
    parent = load_model(tmp_path / "pretrain" / "checkpoint").state_dict()
    moved = any(not torch.equal(parent[n], t) for n, t in single.state_dict().items())
    assert moved  # the comparison is of trained weights, not of two copies of the parent
    # One log (rank 0), whose losses are the global batch's.
    assert len(losses(tmp_path / "ddp")) == STEPS
    assert losses(tmp_path / "ddp") == pytest.approx(losses(tmp_path / "single"), rel=1e-4)


def test_shards_partition_the_batch_and_reject_uneven_sizes():
    rows = [Shard(r, 4).rows(8) for r in range(4)]
    assert [(s.start, s.stop, s.total) for s in rows] == [(0, 2, 8), (2, 4, 8), (4, 6, 8), (6, 8, 8)]
    parts = rows[1].split(1) + rows[2].split(0) + rows[3].split(3)
    assert [(s.start, s.stop) for s in parts] == [(2, 3), (3, 4), (4, 6), (6, 8)]
    with pytest.raises(ConfigError, match="batch_size=6 is invalid with 4 workers"):
        Shard(0, 4).check_batch_size(6)
