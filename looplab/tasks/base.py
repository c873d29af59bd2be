"""What every task hands the trainer: batches of token ids with per-position targets.

Torch is imported where tensors are made, not at the top: the task configs live beside
their tasks (tasks/mano.py, phop.py, text.py) and config.py reads them without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch

IGNORE_INDEX = -100  # target value at positions that carry no loss


@dataclass
class Batch:
    """ids (B, T) are the model inputs; targets (B, T) hold the token to predict at
    each position, or IGNORE_INDEX where no loss applies (e.g. everything but the
    answer position in p-hop)."""

    ids: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if self.ids.shape != self.targets.shape or self.ids.dim() != 2:
            raise ValueError(
                f"Batch: ids {tuple(self.ids.shape)} and targets {tuple(self.targets.shape)} must both be (B, T)"
            )

    def __len__(self) -> int:
        return self.ids.shape[0]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.ids.to(device), self.targets.to(device))

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(self.ids[start:stop], self.targets[start:stop])


def batch_from_numpy(ids: np.ndarray, targets: np.ndarray) -> Batch:
    """A Batch of tensors sharing the memory of two int64 arrays (torch.from_numpy)."""
    import torch

    return Batch(torch.from_numpy(ids), torch.from_numpy(targets))


def stream_rng(seed: int, step: int, batch_size: int, start: int = 0) -> np.random.Generator:
    """The rng of a synthetic task's training batch at `step` of a run whose stream starts
    `start` samples in (TrainConfig.data_start). Batches are drawn one rng per step, so a
    stream continues exactly only at a whole number of batches: then it is the stream's
    own step start // batch_size + step (start 0: the batches of before data_start
    existed). Otherwise the rng is keyed by start as well, a stream of its own that no
    other start draws (p-hop and Mano share this rule)."""
    import numpy as np

    if start % batch_size == 0:
        return np.random.default_rng([seed, start // batch_size + step, 0])
    return np.random.default_rng([seed, step, 0, start])


def exact_match_counts(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(correct, total) over positions with a target: argmax of the logits there
    equals the target. With one answer position per sample this is exact match."""
    mask = targets != IGNORE_INDEX
    pred = logits.argmax(dim=-1)
    return int((pred[mask] == targets[mask]).sum()), int(mask.sum())


def heldout_ids(model, task, batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """(batch, seq_len) token ids from the task's held-out set, read as one stream
    and cut into rows (repeated if short): the prompts the speed benchmarks and the
    arrivals stream decode from. Without a task, seeded random ids of the model's
    vocabulary (model.cfg.vocab_size)."""
    import torch

    if task is not None:
        stream = task.eval_batch().ids.flatten()
        reps = -(-batch * seq_len // stream.numel())
        return stream.repeat(reps)[: batch * seq_len].view(batch, seq_len).clone()
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.vocab_size, (batch, seq_len), generator=gen)
