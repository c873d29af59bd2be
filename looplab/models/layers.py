"""Building blocks of the shared backbone: RMSNorm, the gated MLP, pre-norm
residual blocks, and the N-layer stack that a looped model applies R times."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from looplab.config import ModelConfig
from looplab.models.attention import CausalSelfAttention
from looplab.models.flops import linear_flops
from looplab.models.mamba2 import Mamba2
from looplab.models.ops.precision import upcast


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(upcast(x), (x.shape[-1],), upcast(self.weight), self.eps).to(x.dtype)


class GatedMLP(nn.Module):
    """SwiGLU MLP: fc2(silu(gate) · up), with [up | gate] from one fc1."""

    def __init__(self, d_model: int, d_intermediate: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 2 * d_intermediate, bias=False)
        self.fc2 = nn.Linear(d_intermediate, d_model, bias=False)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, seq_idx: torch.Tensor | None = None, cache=None
    ) -> torch.Tensor:
        up, gate = self.fc1(x).chunk(2, dim=-1)  # per token: positions, sequences and caches do not matter
        return self.fc2(up * F.silu(gate))

    def flops(self, seq_len: int) -> int:
        return linear_flops(self.fc1) + linear_flops(self.fc2)


class Residual(nn.Module):
    """x + f(norm(x)): one pre-norm residual sub-block around a mixer or an MLP.
    Every inner module has the mixer interface: forward(x, positions=None,
    seq_idx=None, cache=None) and flops(seq_len); each uses what it needs. Stateful
    mixers also have cache_kind and new_state (models/cache.py)."""

    def __init__(self, d_model: int, inner: Mamba2 | CausalSelfAttention | GatedMLP, eps: float):
        super().__init__()
        self.norm = RMSNorm(d_model, eps)
        self.inner = inner

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, seq_idx: torch.Tensor | None = None, cache=None
    ) -> torch.Tensor:
        return x + self.inner(self.norm(x), positions, seq_idx, cache)


def make_layer(cfg: ModelConfig, kind: str, layer_idx: int) -> nn.ModuleList:
    """The residual sub-blocks of one layer.
    mamba2:    mixers_per_layer × [norm → Mamba-2 mixer] (no MLP)
    attention: [norm → attention] + [norm → gated MLP] when d_intermediate > 0
               (transformer layers; hybrid attention layers have no MLP)."""
    d, eps = cfg.d_model, cfg.norm_eps
    if kind == "mamba2":
        return nn.ModuleList(
            Residual(
                d,
                Mamba2(
                    d,
                    cfg.d_state,
                    cfg.d_conv,
                    cfg.expand,
                    cfg.headdim,
                    cfg.ngroups,
                    cfg.chunk_size,
                    norm_eps=eps,
                    layer_idx=layer_idx,
                ),
                eps,
            )
            for _ in range(cfg.mixers_per_layer)
        )
    blocks = [Residual(d, CausalSelfAttention(d, cfg.attn_head_dim, cfg.rope_dim, cfg.rope_theta), eps)]
    if cfg.arch == "transformer" and cfg.d_intermediate:  # resolved by ModelConfig: an int, 0 = no MLP
        blocks.append(Residual(d, GatedMLP(d, cfg.d_intermediate), eps))
    return nn.ModuleList(blocks)


class Backbone(nn.Module):
    """M_θ: the N-layer stack that is applied at every recurrent step."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(make_layer(cfg, kind, i) for i, kind in enumerate(cfg.layer_kinds()))

    def residual_blocks(self) -> list[Residual]:
        # Each layer is make_layer's ModuleList of Residual blocks (ModuleList's items are typed Module).
        return [cast(Residual, block) for layer in self.layers for block in cast(nn.ModuleList, layer)]

    def forward(
        self, h: torch.Tensor, positions: torch.Tensor | None = None, seq_idx: torch.Tensor | None = None, cache=None
    ) -> torch.Tensor:
        """cache: one loop's StepCache (models/cache.py); block j reads and writes its
        own state, cache.block(j), in the order of residual_blocks()."""
        for j, block in enumerate(self.residual_blocks()):
            h = block(h, positions, seq_idx, None if cache is None else cache.block(j))
        return h
