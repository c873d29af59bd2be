"""LoopedLM: embedding → R applications of one N-layer backbone → final norm → head,
plus the token-level exit gate read after every non-final step.

The step API (embed, step, exit_prob, logits) is public so researchers can compose
their own execution; forward() runs the execution modes of models/execution.py,
which are built from it.
"""

from __future__ import annotations

import math
import torch
import torch.nn as nn

from looplab.config import ModelConfig
from looplab.models.execution import FULL_DEPTH, Execution, execute
from looplab.models.flops import linear_flops
from looplab.models.layers import Backbone, RMSNorm
from looplab.models.ops.precision import upcast
from looplab.policy import ExitPolicy


class LoopedLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.backbone = Backbone(cfg)
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # untied
        # λ = σ(wᵀh + b). Unused (and untrained) by fixed-loop pre-training; the
        # bias starts at −2 so a new gate exits rarely (σ(−2) ≈ 0.12).
        self.exit_gate = nn.Linear(cfg.d_model, 1)
        self.metadata: dict = {}  # carried into checkpoints (task, tokenizer, ...)
        self.checkpoint_steps = False  # recompute each loop in backward (step())
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        nn.init.normal_(self.embedding.weight, std=std)
        nn.init.normal_(self.lm_head.weight, std=std)
        nn.init.normal_(self.exit_gate.weight, std=std)
        nn.init.constant_(self.exit_gate.bias, -2.0)
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

    def step(self, h: torch.Tensor, positions: torch.Tensor | None = None,
             seq_idx: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """One application of the shared backbone M_θ to hidden states (B, L, d).
        positions (B, L) are the tokens' positions in the original sequence, used by
        attention's RoPE (default 0..L-1). seq_idx (B, L) packs several sequences
        into one row (Mamba-2-only backbones): nothing flows between them. cache: the
        loop's StepCache (models/cache.py), read and written by the stateful mixers.

        With checkpoint_steps set (train.activation_checkpointing), a training step
        keeps only each loop's input and recomputes the loop's activations in backward:
        activation memory of one loop instead of R, for one more forward per loop."""
        if self.checkpoint_steps and cache is None and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self.backbone, h, positions, seq_idx, None, use_reentrant=False)
        return self.backbone(h, positions, seq_idx, cache)

    def exit_logit(self, h: torch.Tensor) -> torch.Tensor:
        """The gate's logit wᵀh + b per token: (B, L, d) → (B, L), at least float32."""
        return upcast(self.exit_gate(h).squeeze(-1))

    def exit_prob(self, h: torch.Tensor) -> torch.Tensor:
        """λ = σ(wᵀh + b): the instantaneous probability of exiting after this step."""
        return torch.sigmoid(self.exit_logit(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: the readout shared by every recurrent step."""
        return self.lm_head(self.norm_f(h))

    # ---- execution ----------------------------------------------------------
    def forward(self, ids: torch.Tensor, policy: ExitPolicy = FULL_DEPTH, *, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, all_steps: bool = False, readout: str = "all",
                **execution) -> Execution:
        """Run the model under an exit policy (looplab/policy.py; default: full depth,
        the fixed-loop forward). all_steps keeps every step's hidden state and gate
        logits, and every step's logits unless readout="none" (no logits at all:
        losses and evaluations that read the hidden states themselves). Further
        keywords go to models/execution.execute (packing, gate_grad, on_step)."""
        out = execute(self, ids, policy, positions=positions, mask=mask, keep_steps=all_steps, readout=readout,
                      **execution)
        if all_steps and readout != "none":
            out.step_logits = [self.logits(h) for h in out.step_hidden]
        return out

    def generate(self, ids, max_new_tokens, policy: ExitPolicy = FULL_DEPTH, **options):
        """Prefill the prompt(s), then decode token by token from the per-(loop, layer)
        cache: looplab/generate.py's generate (sampling, stops, per-token loops)."""
        from looplab.generate import generate

        return generate(self, ids, max_new_tokens, policy, **options)

    # ---- accounting -------------------------------------------------------
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embedding.weight.numel() if exclude_embeddings else n

    def step_flops(self, seq_len: int) -> int:
        """Forward FLOPs per token of one backbone application at context seq_len."""
        return sum(block.inner.flops(seq_len) for block in self.backbone.residual_blocks())

    def flops_per_token(self, seq_len: int) -> dict[str, int]:
        """Forward FLOPs per token at context length seq_len (see models/flops.py).
        backbone_step: one application of M_θ; backbone: R of them; head: the
        readout of one step; total: backbone + one readout."""
        step = self.step_flops(seq_len)
        head = linear_flops(self.lm_head)
        backbone = step * self.cfg.n_loops
        return {"backbone_step": step, "backbone": backbone, "head": head, "total": backbone + head}

    def save(self, directory) -> None:
        """Write safetensors weights + JSON config that looplab.load_model reads."""
        from looplab.checkpoint import save_model

        save_model(self, directory)
