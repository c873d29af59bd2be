"""CHASE's hole samplers: which minibatches are holed, and where tokens exit.

All randomness comes from a numpy Generator that the trainer seeds with
(seed, step), so a resumed run draws the same holes.
"""

from __future__ import annotations

import numpy as np
import torch

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the configs import the tasks and this module stays below them
    from looplab.config import HoleConfig


def take_hole_branch(rng: np.random.Generator, cfg: HoleConfig) -> bool:
    """Whether this minibatch takes the cache-hole branch (probability rho)."""
    return bool(rng.random() < cfg.rho)


def sample_threshold(rng: np.random.Generator, cfg: HoleConfig) -> float:
    """q ~ D_hole = U[q_low, q_high] for one minibatch."""
    return float(rng.uniform(cfg.q_low, cfg.q_high))


def round_depth(depth: np.ndarray, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Map fractional target depths to integer exit steps.
    stochastic: floor(d) + Bernoulli(d − floor(d)), so E[step] = d (the default);
    nearest / floor / ceil: deterministic."""
    if rule == "stochastic":
        base = np.floor(depth)
        return (base + (rng.random(depth.shape) < depth - base)).astype(np.int64)
    if rule == "nearest":
        return np.floor(depth + 0.5).astype(np.int64)
    if rule == "floor":
        return np.floor(depth).astype(np.int64)
    if rule == "ceil":
        return np.ceil(depth).astype(np.int64)
    raise ValueError(f"rounding={rule!r} is invalid; allowed: stochastic | nearest | floor | ceil")


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
