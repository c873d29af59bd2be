"""LoopedLM: embedding → R applications of one N-layer backbone → final norm → head.

The step API (embed, step, logits) is public so researchers can compose their own
execution; forward() is the dense fixed-loop pass built from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from looplab.config import ModelConfig
from looplab.models.flops import linear_flops, mixer_flops
from looplab.models.layers import Backbone, RMSNorm


@dataclass
class LoopedOutput:
    logits: torch.Tensor  # (B, L, V) read out after the final step R
    hidden: torch.Tensor  # (B, L, d) hidden state after step R
    step_hidden: tuple[torch.Tensor, ...] | None = None  # h^(1..R), when asked for
    step_logits: tuple[torch.Tensor, ...] | None = None  # logits of h^(1..R), when asked for


class LoopedLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.backbone = Backbone(cfg)
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # untied
        self.metadata: dict = {}  # carried into checkpoints (task, tokenizer, ...)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        nn.init.normal_(self.embedding.weight, std=std)
        nn.init.normal_(self.lm_head.weight, std=std)
        # Residual writes are scaled down by the number of residual blocks the
        # signal passes through (N·R blocks with looping), GPT-2 style, so the
        # residual stream's variance does not grow with the effective depth.
        blocks = self.backbone.residual_blocks()
        out_std = std / math.sqrt(2 * len(blocks) * self.cfg.n_loops)
        for block in blocks:
            inner = block.inner
            for name, module in inner.named_modules():
                if isinstance(module, nn.Linear):
                    is_out = name in ("out_proj", "fc2")
                    nn.init.normal_(module.weight, std=out_std if is_out else std)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)

    # ---- step API ---------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """h^(0) = emb(ids): (B, L) → (B, L, d)."""
        return self.embedding(ids)

    def step(self, h: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """One application of the shared backbone M_θ to hidden states (B, L, d).
        positions (B, L) are the tokens' positions in the original sequence, used by
        attention's RoPE (default 0..L-1)."""
        return self.backbone(h, positions)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: the readout shared by every recurrent step."""
        return self.lm_head(self.norm_f(h))

    # ---- dense fixed-loop forward -----------------------------------------
    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, *,
                all_steps: bool = False, n_loops: int | None = None) -> LoopedOutput:
        """Run R = n_loops (default cfg.n_loops) steps on every token. With
        all_steps, also return every step's hidden state and logits."""
        R = self.cfg.n_loops if n_loops is None else n_loops
        if R < 1:
            raise ValueError(f"n_loops={R} is invalid; allowed: an integer >= 1")
        h = self.embed(ids)
        hs = []
        for _ in range(R):
            h = self.step(h, positions)
            hs.append(h)
        if not all_steps:
            return LoopedOutput(logits=self.logits(h), hidden=h)
        step_logits = tuple(self.logits(x) for x in hs)
        return LoopedOutput(logits=step_logits[-1], hidden=h, step_hidden=tuple(hs), step_logits=step_logits)

    # ---- accounting -------------------------------------------------------
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embedding.weight.numel() if exclude_embeddings else n

    def flops_per_token(self, seq_len: int) -> dict[str, int]:
        """Forward FLOPs per token at context length seq_len (see models/flops.py).
        backbone_step: one application of M_θ; backbone: R of them; head: the
        readout of one step; total: backbone + one readout."""
        step = sum(mixer_flops(block.inner, seq_len) for block in self.backbone.residual_blocks())
        head = linear_flops(self.lm_head)
        backbone = step * self.cfg.n_loops
        return {"backbone_step": step, "backbone": backbone, "head": head, "total": backbone + head}

    def save(self, directory) -> None:
        """Write safetensors weights + JSON config that looplab.load_model reads."""
        from looplab.checkpoint import save_model

        save_model(self, directory)
