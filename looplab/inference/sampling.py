"""Drawing the next tokens: greedy, or temperature / top-k / top-p from a seeded
generator (generate's sampler, looplab/inference/generate.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from looplab.config import ConfigError


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next tokens (n,) from logits (n, V): argmax at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the top_k most likely tokens and the
    smallest set whose probability reaches top_p (0 and 1: no restriction)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs >= top_p  # the tokens before it already reach top_p
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def check_sampling(temperature, top_k, top_p) -> None:
    """generate's sampling arguments, checked before any work."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ConfigError(f"temperature={temperature!r} is invalid; allowed: a float >= 0 (0: greedy)")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ConfigError(f"top_k={top_k!r} is invalid; allowed: an integer >= 0 (0: no limit)")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p={top_p!r} is invalid; allowed: a float in (0, 1]")


def sampling_generator(temperature: float, seed: int | None, device) -> torch.Generator | None:
    """The sampler's generator (None when greedy): seeded with `seed`, else afresh."""
    if temperature <= 0:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed) if seed is not None else torch.seed())
    return generator


@dataclass
class Sampler:
    """sample's settings and generator, shared by every draw of one generate call."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator | None

    def __call__(self, logits: torch.Tensor) -> list[int]:
        return sample(
            logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, generator=self.generator
        ).tolist()
