"""CHASE's hole samplers: which minibatches are holed, and where tokens exit.

All randomness comes from a numpy Generator that the trainer seeds with
(seed, step), so a resumed run draws the same holes.
"""

from __future__ import annotations

import numpy as np
import torch

from looplab.config import HoleConfig
from looplab.policy import round_depth


def take_hole_branch(rng: np.random.Generator, cfg: HoleConfig) -> bool:
    """Whether this minibatch takes the cache-hole branch (probability rho)."""
    return bool(rng.random() < cfg.rho)


def sample_threshold(rng: np.random.Generator, cfg: HoleConfig) -> float:
    """q ~ D_hole = U[q_low, q_high] for one minibatch."""
    return float(rng.uniform(cfg.q_low, cfg.q_high))


def target_depths(cfg: HoleConfig) -> np.ndarray:
    """The `bins` evenly spaced target depths spanning [lo, hi] (both included)."""
    return np.linspace(cfg.lo, cfg.hi, cfg.bins) if cfg.bins > 1 else np.array([(cfg.lo + cfg.hi) / 2])


def sample_depth_holes(rng: np.random.Generator, cfg: HoleConfig, shape: tuple[int, int], n_loops: int) -> torch.Tensor:
    """Exit steps (B, L) for a depth-space holed forward: a fraction hp of
    positions exits at a rounded target depth, the rest runs all R steps."""
    holed = rng.random(shape) < cfg.hp
    depth = rng.choice(target_depths(cfg), size=shape)
    steps = np.clip(round_depth(depth, cfg.rounding, rng), 1, n_loops)
    return torch.from_numpy(np.where(holed, steps, n_loops))
