"""Data-parallel training over a torch.distributed process group (gloo on CPU,
NCCL on GPU), when the caller (Ray Train's TorchTrainer, torchrun) has set one up.

Every rank builds the same global batch from (seed, step) and trains on its own
contiguous rows of it; gradients are averaged after backward. With equal shards
this is the single-process step on the global batch (up to float summation order):
the same data, the same holes, the same schedule, so a sweep's results do not
depend on how many workers ran it. Only rank 0 evaluates, logs and writes
checkpoints; it broadcasts what it logs so every rank can report the same records
(Ray Train's report is a barrier that every worker must reach equally often).

Gradients are averaged by hand rather than through DistributedDataParallel: the
losses call the model's step API (embed/step/exit_logit), not just forward(), which
DDP's hooks would not see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from looplab.errors import ConfigError


@dataclass(frozen=True)
class Rows:
    """Which rows of a step's global batch a minibatch holds: [start, stop) of total.
    What is drawn per step for the whole batch (CHASE's depth holes) is drawn for all
    `total` rows and sliced, so ranks and micro-batches see the holes one process
    training the whole batch at once would see."""

    start: int
    stop: int
    total: int

    @classmethod
    def whole(cls, rows: int) -> "Rows":
        return cls(0, rows, rows)

    def split(self, size: int) -> list["Rows"]:
        """Consecutive parts of at most `size` rows (0: one part, all of them)."""
        size = size or self.stop - self.start
        return [Rows(i, min(i + size, self.stop), self.total) for i in range(self.start, self.stop, size)]


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def current(cls) -> "Shard":
        """This process's place in the initialised process group (rank 0 of 1 without one)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size % self.world:
            raise ConfigError(
                f"TrainConfig.batch_size={batch_size} is invalid with {self.world} workers; "
                f"allowed: a multiple of {self.world} (every rank trains an equal share)"
            )

    def rows(self, batch_size: int) -> Rows:
        """This rank's rows of a global batch."""
        per = batch_size // self.world
        return Rows(self.rank * per, (self.rank + 1) * per, batch_size)

    def average_gradients(self, params: list[torch.Tensor]) -> None:
        """All-reduce the gradients (one flat buffer: one collective per step) and
        divide by the world size. Parameters without a gradient have none on every
        rank (the graph is the same everywhere), so they are left out."""
        if self.world == 1:
            return
        import torch.distributed as dist

        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def average(self, values: dict[str, float]) -> dict[str, float]:
        """The mean of per-rank scalars (keys must be the same on every rank)."""
        if self.world == 1 or not values:
            return values
        import torch.distributed as dist

        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return {k: float(v) / self.world for k, v in zip(keys, t.tolist())}

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's obj on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
