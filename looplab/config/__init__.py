"""Typed, validated configs: one frozen dataclass per concern.

Every config validates itself on construction, so a bad value fails with one line
naming the field and what is allowed, before anything expensive starts. Configs are
plain data: `to_dict` / `from_dict` round-trip through JSON. A task's config lives
beside its task (ManoConfig in looplab/tasks/mano.py, PhopConfig in phop.py,
TextConfig in text.py) and is imported here; the field declarations and checks every
config shares are in looplab/fields.py. model.py holds the model's config, training.py
the recipe's and the objectives', experiment.py the whole stage's, its keys and the
overrides. Nothing here imports torch.

Keys by opt-in (as Marin's executor versions only the fields it is told to): a field
that can change a run's result is declared with `keyed(...)`; everything else
(logging, evaluation and checkpoint cadence, device, evaluation batch size, paths)
never enters a key, so a re-run with another log interval reuses every stage. A
stage's `stage_key` hashes its keyed fields (the model, the task, the training recipe,
the sections its stage reads, the seed) and its parent stage's key; `config_hash` is
the same without the seed, shared by the seeds of one configuration. Names of runs
and folders derive from keys, never from timestamps.
"""

from __future__ import annotations

from looplab.config.experiment import (
    SECTION_OF,
    TASK_KINDS,
    ExperimentConfig,
    ParentRef,
    TaskConfig,
    apply_overrides,
    config_key,
    is_keyed,
    parse_value,
)
from looplab.config.model import ARCHS, MODEL_BOUNDS, ModelConfig
from looplab.config.training import (
    COMPILE_CHOICES,
    MAX_LR,
    MAX_STEPS,
    MIN_ADAM_EPS,
    ExitConfig,
    HoleConfig,
    TrainConfig,
    stream_end,
)
from looplab.errors import ConfigError, check, invalid
from looplab.fields import key_values, keyed, unkeyed_fields

# Each task's config lives beside its task; this package gathers them into TaskConfig.
from looplab.tasks.mano import ManoConfig
from looplab.tasks.phop import PhopConfig
from looplab.tasks.text import TextConfig

__all__ = [
    "ARCHS",
    "COMPILE_CHOICES",
    "ConfigError",
    "ExitConfig",
    "ExperimentConfig",
    "HoleConfig",
    "MAX_LR",
    "MAX_STEPS",
    "MIN_ADAM_EPS",
    "MODEL_BOUNDS",
    "ManoConfig",
    "ModelConfig",
    "ParentRef",
    "PhopConfig",
    "SECTION_OF",
    "TASK_KINDS",
    "TaskConfig",
    "TextConfig",
    "TrainConfig",
    "apply_overrides",
    "check",
    "config_key",
    "invalid",
    "is_keyed",
    "keyed",
    "key_values",
    "parse_value",
    "stream_end",
    "unkeyed_fields",
]
