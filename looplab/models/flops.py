"""Forward FLOPs per token, counted as 2 per multiply-add of the matrix products
(linear layers, the SSD's chunk products, attention scores); elementwise work,
norms and the softmax are left out, as is usual. Training costs about 3× this.

The SSD terms count the products the chunked algorithm runs (the full Q×Q chunk
products, masked half included, and the state-passing product), so the figure
matches the work done, not the minimum.
"""

from __future__ import annotations

import torch.nn as nn

from looplab.models.attention import CausalSelfAttention
from looplab.models.layers import GatedMLP
from looplab.models.mamba2 import Mamba2


def linear_flops(layer: nn.Linear) -> int:
    return 2 * layer.in_features * layer.out_features


def mamba2_flops(m: Mamba2, seq_len: int) -> int:
    Q, h, p, n, g = m.chunk_size, m.nheads, m.headdim, m.d_state, m.ngroups
    nc = -(-seq_len // Q)  # chunks
    ssd = 2 * Q * n * g  # C·B within a chunk, shared by the heads of a group
    ssd += 2 * Q * h * p  # masked scores @ x
    ssd += 2 * h * p * n  # chunk-end states
    ssd += 2 * h * p * n  # state readout C·S
    ssd += 2 * (nc + 1) * nc * h * p * n / seq_len  # state passing: (nc+1)×nc decay matrix @ chunk states
    conv = 2 * m.conv_dim * m.d_conv
    return linear_flops(m.in_proj) + conv + round(ssd) + linear_flops(m.out_proj)


def attention_flops(a: CausalSelfAttention, seq_len: int) -> int:
    d = a.n_heads * a.head_dim
    context = (seq_len + 1) / 2  # mean number of keys a causal query attends to
    return linear_flops(a.qkv) + linear_flops(a.out_proj) + int(2 * 2 * context * d)


def mixer_flops(module: nn.Module, seq_len: int) -> int:
    if isinstance(module, Mamba2):
        return mamba2_flops(module, seq_len)
    if isinstance(module, CausalSelfAttention):
        return attention_flops(module, seq_len)
    if isinstance(module, GatedMLP):
        return linear_flops(module.fc1) + linear_flops(module.fc2)
    raise TypeError(f"no FLOP count for {type(module).__name__}")
