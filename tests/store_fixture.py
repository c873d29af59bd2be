"""A stage stored as a trial stores it: a whole checkpoint of the stage's model at its
last step, and the done marker naming the run that trained it. Tests that need a store
holding trained stages (without training them) write them here; a done marker alone
vouches for files that are not there, which the platform trains again."""

from __future__ import annotations

from pathlib import Path

import torch

from looplab.checkpoint import model_from_config, save_training_state
from looplab.config import ExperimentConfig
from trainables.pipeline import checkpoint_of, stage_dir
from trainables.shared_stage import write_done
from trainables.storage import Storage


def store_stage(storage_path: str | Path, cfg: ExperimentConfig, run_id: str, metrics: dict | None = None) -> Path:
    """Write `cfg`'s stage into the store as finished by `run_id`; returns its checkpoint."""
    model = model_from_config(cfg.model, seed=cfg.train.seed)
    checkpoint = Path(checkpoint_of(storage_path, cfg))
    state = {"step": cfg.train.steps, "stage_key": cfg.stage_key()}
    save_training_state(checkpoint, model, torch.optim.AdamW(model.parameters()), state)
    done = {"run_id": run_id, "stage": cfg.stage, "stage_key": cfg.stage_key(), "metrics": metrics or {}}
    write_done(Storage(storage_path), stage_dir(storage_path, cfg), done)
    return checkpoint
