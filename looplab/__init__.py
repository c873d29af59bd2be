"""looplab: looped state-space language models (N⊗R), exit gates and CHASE.

The library imports only torch and numpy at module top; Ray, MLflow and polars live
in the platform layers (trainables/, sweeps/, analysis/).
"""

from looplab.config import ConfigError, ExperimentConfig, ManoConfig, ModelConfig, PhopConfig, TrainConfig


def load_model(name_or_path, **overrides):
    """A LoopedLM from a checkpoint directory, or freshly initialised from a preset
    name with model overrides (arch, n_layers, n_loops, d_model, vocab_size, ...,
    and seed for the initialisation)."""
    from looplab.checkpoint import load_model as _load

    return _load(name_or_path, **overrides)


def save_model(model, directory):
    """Write a LoopedLM as a looplab checkpoint (config.json, model.safetensors with its
    digest) that load_model reads back; returns the directory."""
    from looplab.checkpoint import save_model as _save

    return _save(model, directory)


__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "ManoConfig",
    "ModelConfig",
    "PhopConfig",
    "TrainConfig",
    "load_model",
    "save_model",
]
