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

from looplab.models.cache import KEYS, BlockCache, KVState
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
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    compute = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos.to(compute), sin.to(compute)
    xf1, xf2 = x1.to(compute), x2.to(compute)
    rotated = torch.cat([xf1 * cos - xf2 * sin, xf2 * cos + xf1 * sin], dim=-1).to(x.dtype)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


class CausalSelfAttention(nn.Module):
    cache_kind = KEYS  # with a cache (models/cache.py) it stores keys and values per (loop, layer)

    def __init__(self, d_model: int, head_dim: int = 64, rope_dim: int = 64, rope_theta: float = 10000.0):
        super().__init__()
        if d_model % head_dim:
            raise ValueError(f"head_dim={head_dim} must divide d_model={d_model}")
        self.n_heads, self.head_dim = d_model // head_dim, head_dim
        self.rope_dim, self.rope_theta = rope_dim, rope_theta
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        cache: BlockCache[KVState] | None = None,
    ) -> torch.Tensor:
        """x (B, L, d) → (B, L, d), causal over the row's order; positions (B, L) are
        the tokens' true positions for RoPE (default 0..L-1). cache: also attend to the
        stored keys at earlier positions, then store the real tokens' keys and values."""
        if seq_idx is not None:
            raise ValueError(
                "seq_idx (several sequences in one row) needs a Mamba-2-only backbone; "
                "attention layers take the padded layout"
            )
        bsz, seqlen, d = x.shape
        if positions is None:
            positions = torch.arange(seqlen, device=x.device).expand(bsz, seqlen)
        q, k, v = self.qkv(x).view(bsz, seqlen, 3, self.n_heads, self.head_dim).unbind(2)
        cos, sin = rope_angles(positions, self.rope_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        elif cache.layout.decode:
            y = self._attend_decode(q, k, v, positions, cache)
        else:
            y = self._attend_prefill(q, k, v, positions, cache)
        return self.out_proj(y.transpose(1, 2).reshape(bsz, seqlen, d))

    # ---- inference state (models/cache.py) ------------------------------------------
    def new_state(self, batch: int, capacity: int, device, dtype) -> KVState:
        shape = (batch, capacity, self.n_heads, self.head_dim)
        return KVState(
            k=torch.zeros(shape, device=device, dtype=dtype),
            v=torch.zeros(shape, device=device, dtype=dtype),
            pos=torch.zeros(batch, capacity, dtype=torch.long, device=device),
            length=torch.zeros(batch, dtype=torch.long, device=device),
        )

    def key_value(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (RoPE at positions) and values of normed states x (m, d): what an exited
        token leaves under attention_fill="exit_state" (models/cache.py)."""
        _, k, v = self.qkv(x).view(x.shape[0], 3, self.n_heads, self.head_dim).unbind(1)
        cos, sin = rope_angles(positions[None], self.rope_dim, self.rope_theta)
        return apply_rope(k[None], cos, sin)[0], v

    def _attend_decode(self, q, k, v, positions, cache: BlockCache[KVState]) -> torch.Tensor:
        """One query per row over its stored entries and itself: store first, then
        attend to every entry (all of them are at earlier positions)."""
        state, rows = cache.state, cache.layout.rows
        state.append_one(rows, k[:, 0], v[:, 0], positions[:, 0])
        length = state.length if rows is None else state.length[rows]
        width = int(length.max())
        keys = state.k[:, :width] if rows is None else state.k[rows, :width]
        values = state.v[:, :width] if rows is None else state.v[rows, :width]
        seen = (torch.arange(width, device=q.device) < length[:, None])[:, None, None, :]
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.to(q.dtype).transpose(1, 2), values.to(q.dtype).transpose(1, 2), attn_mask=seen
        )

    def _attend_prefill(self, q, k, v, positions, cache: BlockCache[KVState]) -> torch.Tensor:
        """A padded layout (row b is cache row b): causal attention over the row, plus
        the entries already stored at earlier positions (under attention_fill=
        "exit_state", the frozen states of tokens that left before this loop); then
        the row's real tokens are stored."""
        state, (_, start, end) = cache.state, cache.layout.segments()
        bsz, seqlen = q.shape[:2]
        stored = int(state.length.max())
        if stored == 0:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        else:
            slots = torch.arange(stored, device=q.device)
            seen = (slots < state.length[:, None])[:, None, :] & (
                state.pos[:, None, :stored] <= positions[:, :, None]
            )  # (B, L, stored)
            causal = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device).tril()
            mask = torch.cat([seen, causal.expand(bsz, seqlen, seqlen)], dim=-1)[:, None]
            keys = torch.cat([state.k[:, :stored].to(k.dtype), k], dim=1)
            values = torch.cat([state.v[:, :stored].to(v.dtype), v], dim=1)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask
            )
        slots = torch.arange(seqlen, device=q.device)
        rows, cols = ((slots >= start[:, None]) & (slots < end[:, None])).nonzero(as_tuple=True)
        state.append(rows, k[rows, cols], v[rows, cols], positions[rows, cols])
        return y

    def flops(self, seq_len: int) -> int:
        """Forward FLOPs per token at context seq_len (models/flops.py's convention):
        the projections, plus scores and values over the mean causal context."""
        d = self.n_heads * self.head_dim
        context = (seq_len + 1) / 2  # mean number of keys a causal query attends to
        return linear_flops(self.qkv) + linear_flops(self.out_proj) + int(2 * 2 * context * d)
