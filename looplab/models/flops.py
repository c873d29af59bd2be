"""The FLOP-counting convention every mixer's `flops(seq_len)` follows.

Forward FLOPs per token, counted as 2 per multiply-add of the matrix products
(linear layers, the SSD's chunk products, attention scores); elementwise work,
norms and the softmax are left out, as is usual. Training costs about 3× this.
Each mixer (models/mamba2.py, models/attention.py, models/layers.py's GatedMLP)
reports its own count, so the layer stack and the model sum them without knowing
which mixer is which.
"""

from __future__ import annotations

import torch.nn as nn


def linear_flops(layer: nn.Linear) -> int:
    """2 per multiply-add of one token through a linear layer."""
    return 2 * layer.in_features * layer.out_features
