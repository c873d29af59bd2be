"""Tasks: synthetic reasoning (Mano, p-hop) and language modelling (text). Each task
turns a step number into a deterministic training batch and owns a fixed evaluation
set."""

from __future__ import annotations

from looplab.tasks.base import IGNORE_INDEX, Batch, exact_match_counts


def make_task(cfg, seq_len: int | None = None, *, rank: int = 0, world_size: int = 1):
    """The task object for a task config (ManoConfig, PhopConfig or TextConfig).

    seq_len (TrainConfig.seq_len) is required for text, which packs its corpus into
    blocks of that context length; the synthetic tasks take it per batch instead.
    rank / world_size shard the text corpus across data-parallel workers; synthetic
    batches are functions of (seed, step), so workers differ by seed there.
    """
    if cfg.kind == "mano":
        from looplab.tasks.mano import ManoTask

        return ManoTask(cfg)
    if cfg.kind == "phop":
        from looplab.tasks.phop import PhopTask

        return PhopTask(cfg)
    if cfg.kind == "text":
        from looplab.errors import invalid
        from looplab.tasks.text import TextTask

        if seq_len is None:
            raise invalid(
                "make_task(seq_len)", seq_len, "the context length (TrainConfig.seq_len) for task.kind='text'"
            )
        return TextTask(cfg, seq_len, rank=rank, world_size=world_size)
    raise ValueError(f"task.kind={cfg.kind!r} is invalid; allowed: mano | phop | text")


__all__ = ["Batch", "IGNORE_INDEX", "exact_match_counts", "make_task"]
