"""Causal self-attention with rotary position embeddings (LLaMA style).

Positions are explicit: `positions` (B, L) are the tokens' positions in the original
sequence. Skip execution packs the surviving tokens of a sequence together, and RoPE
on the true positions keeps their distances; causality follows the packed order,
which preserves the original order.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from looplab.models.flops import linear_flops


def rope_angles(positions: torch.Tensor, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, L, 1, rope_dim/2) for integer positions (B, L), in
    float64 so that angles stay exact at long contexts; apply_rope casts them."""
    inv_freq = theta ** (-torch.arange(0, rope_dim, 2, device=positions.device, dtype=torch.float32) / rope_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq.double()  # exact angles for long contexts
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rope_dim channels of each head (x: B, L, H, head_dim) as
    pairs (i, i + rope_dim/2); the remaining channels pass through."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    compute = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos.to(compute), sin.to(compute)
    xf1, xf2 = x1.to(compute), x2.to(compute)
    rotated = torch.cat([xf1 * cos - xf2 * sin, xf2 * cos + xf1 * sin], dim=-1).to(x.dtype)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, head_dim: int = 64, rope_dim: int = 64, rope_theta: float = 10000.0):
        super().__init__()
        if d_model % head_dim:
            raise ValueError(f"head_dim={head_dim} must divide d_model={d_model}")
        self.n_heads, self.head_dim = d_model // head_dim, head_dim
        self.rope_dim, self.rope_theta = rope_dim, rope_theta
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, d) → (B, L, d), causal over the row's order; positions (B, L) are
        the tokens' true positions for RoPE (default 0..L-1)."""
        if seq_idx is not None:
            raise ValueError("seq_idx (several sequences in one row) needs a Mamba-2-only backbone; "
                             "attention layers take the padded layout")
        bsz, seqlen, d = x.shape
        if positions is None:
            positions = torch.arange(seqlen, device=x.device).expand(bsz, seqlen)
        q, k, v = self.qkv(x).view(bsz, seqlen, 3, self.n_heads, self.head_dim).unbind(2)
        cos, sin = rope_angles(positions, self.rope_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(bsz, seqlen, d))

    def flops(self, seq_len: int) -> int:
        """Forward FLOPs per token at context seq_len (models/flops.py's convention):
        the projections, plus scores and values over the mean causal context."""
        d = self.n_heads * self.head_dim
        context = (seq_len + 1) / 2  # mean number of keys a causal query attends to
        return linear_flops(self.qkv) + linear_flops(self.out_proj) + int(2 * 2 * context * d)
