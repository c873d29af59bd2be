"""Tasks: synthetic reasoning (Mano, p-hop). Each task turns a step number into a
deterministic training batch and owns a fixed evaluation set."""

from __future__ import annotations

from looplab.tasks.base import IGNORE_INDEX, Batch, exact_match_counts


def make_task(cfg):
    """The task object for a task config (ManoConfig or PhopConfig)."""
    if cfg.kind == "mano":
        from looplab.tasks.mano import ManoTask

        return ManoTask(cfg)
    if cfg.kind == "phop":
        from looplab.tasks.phop import PhopTask

        return PhopTask(cfg)
    if cfg.kind == "text":
        raise ValueError("task.kind='text': the language-modelling pipeline (tokenizer, corpus, packing) is "
                         "not built yet; train a synthetic preset (mano-*, phop-*) meanwhile")
    raise ValueError(f"task.kind={cfg.kind!r} is invalid; allowed: mano | phop")


__all__ = ["Batch", "IGNORE_INDEX", "exact_match_counts", "make_task"]
