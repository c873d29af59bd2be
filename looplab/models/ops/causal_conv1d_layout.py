"""What causal-conv1d's CUDA conv (`causal_conv1d_fn`) requires of its inputs' layout,
and the adapter that meets it without a copy where it can.

A module of its own because it is the contract of another library's kernel, not an
operation of ours: the CPU tests hold it against a stand-in that restates the
library's checks (tests/causal_conv1d_standin.py), where no GPU can.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_inputs(xBC: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """xBC (b, l, c), conv weight (c, 1, k) and bias (c,) as causal-conv1d's
    `causal_conv1d_fn` takes them on the fused CUDA path: x (b, c8, l) channel-last,
    weight (c8, k), bias (c8,), where c8 is c rounded up to a multiple of 8 (the extra
    channels are zero in all three, so their outputs are zero and can be dropped).

    Why: causal-conv1d takes `seq_idx` only for channel-last input (stride(1) == 1),
    and for that layout it checks c % 8 == 0 and stride(0), stride(2) % 8 == 0; its
    kernel also reads 16-byte vectors along c, so the data must start 16-byte aligned.
    xBC is a slice of in_proj's output: its row stride is that output's width,
    2·d_inner + 2·ngroups·d_state + nheads, which need not be a multiple of 8 (164 in
    `phop-debug`). A slice that already fits is used in place, as mamba-ssm's
    `ensure_stride` does; otherwise xBC is copied into a dense (b, l, c8) buffer.
    """
    c = xBC.shape[-1]
    pad = (-c) % 8
    fits = (
        pad == 0
        and xBC.stride(2) == 1
        and xBC.stride(1) % 8 == 0
        and xBC.stride(0) % 8 == 0
        and xBC.storage_offset() % 8 == 0
    )
    if not fits:  # a fresh buffer (not .contiguous(), which keeps a view with size-1 dims)
        xBC = F.pad(xBC, (0, pad)) if pad else xBC.clone(memory_format=torch.contiguous_format)
    weight = weight.squeeze(1)
    if pad:
        weight = F.pad(weight, (0, 0, 0, pad))
        bias = F.pad(bias, (0, pad)) if bias is not None else None
    return xBC.transpose(1, 2), weight, bias
