"""The looped model's config: its architecture and sizes, each checked on construction
within bounds far beyond any model of the paper."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from looplab.errors import check
from looplab.fields import check_choice, check_finite, check_ints, is_int, keyed

Arch = Literal["mamba2", "transformer", "hybrid"]
ARCHS: tuple[str, ...] = get_args(Arch)
MODEL_BOUNDS = {
    "vocab_size": 1 << 20,
    "d_model": 1 << 16,
    "n_layers": 1024,
    "n_loops": 128,
    "d_state": 4096,
    "headdim": 4096,
    "attn_head_dim": 4096,
    "chunk_size": 1 << 16,
    "expand": 16,
    "d_conv": 64,
    "ngroups": 1024,
}


@dataclass(frozen=True)
class ModelConfig:
    """A looped language model N⊗R: one N-layer backbone applied n_loops times."""

    arch: Arch = keyed("mamba2")  # mamba2 | transformer (LLaMA layers) | hybrid (Mamba-2, attention at attn_layer_idx)
    vocab_size: int = keyed(64)  # ids of embedding and head: at least the task's vocabulary (followed unless set)
    d_model: int = keyed(256)  # width of the residual stream
    n_layers: int = keyed(2)  # N: independently parameterised layers
    n_loops: int = keyed(4)  # R: applications of the shared backbone
    # Two residual mixer blocks per Mamba-2 layer: the paper's proxy for the
    # attention+MLP pair of a Transformer layer (Mano / p-hop models).
    mixers_per_layer: int = keyed(1)
    # Mamba-2 mixer (names as in mamba_ssm.modules.mamba2.Mamba2).
    d_state: int = keyed(64)  # SSM state size
    d_conv: int = keyed(4)  # width of the causal depthwise convolution before the scan
    expand: int = keyed(2)  # the mixer's inner width, as a multiple of d_model
    headdim: int = keyed(64)  # channels per SSM head: expand*d_model/headdim heads
    ngroups: int = keyed(1)  # groups of SSM heads sharing B and C (a divisor of the number of heads)
    chunk_size: int = keyed(64)  # chunk length of the chunked (SSD) scan
    # Attention layers (transformer, hybrid).
    attn_head_dim: int = keyed(64)  # channels per attention head: d_model/attn_head_dim heads
    rope_dim: int = keyed(64)  # channels of each head RoPE rotates (even, <= attn_head_dim); the rest pass through
    rope_theta: float = keyed(10000.0)  # RoPE's base
    # Gated-MLP width of a transformer layer; 0 means "no MLP". None resolves to
    # the LLaMA default (8/3 d rounded up to a multiple of 64) for transformers
    # and to 0 for Mamba-2 and hybrid stacks, which have no external MLP.
    d_intermediate: int | None = keyed(None)
    attn_layer_idx: tuple[int, ...] = keyed(())  # hybrid only, 0-based
    norm_eps: float = keyed(1e-5)  # epsilon of the RMSNorms
    init_std: float = keyed(0.02)  # std of the normal initialisation; residual writes scaled down with depth (GPT-2)

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_attn_layer_idx_type()
        self._resolve_mlp_width()
        self._check_floats()
        self._check_head_shapes()
        self._check_attention_layers()

    def _check_sizes(self) -> None:
        """The architecture, and every size an integer within MODEL_BOUNDS."""
        name = "ModelConfig"
        check_choice(self, "arch", ARCHS)
        check_ints(self, "vocab_size", minimum=2)
        check_ints(
            self,
            "d_model",
            "n_layers",
            "n_loops",
            "d_state",
            "expand",
            "headdim",
            "ngroups",
            "chunk_size",
            "attn_head_dim",
        )
        check_ints(self, "d_conv", minimum=2)
        # Bounds far beyond any model of the paper (R ≤ 12, N ≤ 48, d ≤ 1024, 32k vocab), so a
        # config (a checkpoint's, say) can never make looplab build or allocate absurdly.
        for field_name, most in MODEL_BOUNDS.items():
            value = getattr(self, field_name)
            check(value <= most, f"{name}.{field_name}", value, f"an integer in [1, {most}]")
        check(self.mixers_per_layer in (1, 2), f"{name}.mixers_per_layer", self.mixers_per_layer, "1 | 2")

    def _check_attn_layer_idx_type(self) -> None:
        """attn_layer_idx a list of indices (a JSON list arrives as one), kept as a tuple."""
        check(
            isinstance(self.attn_layer_idx, (list, tuple)),
            "ModelConfig.attn_layer_idx",
            self.attn_layer_idx,
            "a list of layer indices, e.g. [1, 3]",
        )
        object.__setattr__(self, "attn_layer_idx", tuple(self.attn_layer_idx))

    def _resolve_mlp_width(self) -> None:
        """d_intermediate: None resolved to the architecture's default, then checked."""
        name = "ModelConfig"
        d_intermediate = self.d_intermediate
        if d_intermediate is None:
            d_intermediate = -(-8 * self.d_model // 3 // 64) * 64 if self.arch == "transformer" else 0
            object.__setattr__(self, "d_intermediate", d_intermediate)
        check_ints(self, "d_intermediate", minimum=0)
        check(d_intermediate <= 1 << 20, f"{name}.d_intermediate", d_intermediate, f"an integer in [0, {1 << 20}]")
        if self.arch == "transformer":
            check(
                d_intermediate > 0,
                f"{name}.d_intermediate",
                d_intermediate,
                "an integer >= 1 for arch='transformer' (LLaMA layers have a gated MLP)",
            )

    def _check_floats(self) -> None:
        """The norm's epsilon, the initialisation's std and RoPE's base: finite and > 0."""
        name = "ModelConfig"
        check_finite(self, "norm_eps", "init_std", "rope_theta")
        check(self.norm_eps > 0, f"{name}.norm_eps", self.norm_eps, "a float > 0")
        check(self.init_std > 0, f"{name}.init_std", self.init_std, "a float > 0")
        check(self.rope_theta > 0, f"{name}.rope_theta", self.rope_theta, "a float > 0")

    def _check_head_shapes(self) -> None:
        """SSM heads that split expand*d_model and their groups; attention heads that split d_model."""
        name = "ModelConfig"
        if self.arch in ("mamba2", "hybrid"):
            d_inner = self.expand * self.d_model
            check(
                d_inner % self.headdim == 0, f"{name}.headdim", self.headdim, f"a divisor of expand*d_model={d_inner}"
            )
            nheads = d_inner // self.headdim
            check(
                nheads % self.ngroups == 0,
                f"{name}.ngroups",
                self.ngroups,
                f"a divisor of the number of SSM heads ({nheads})",
            )
        if self.arch in ("transformer", "hybrid"):
            check(
                self.d_model % self.attn_head_dim == 0,
                f"{name}.attn_head_dim",
                self.attn_head_dim,
                f"a divisor of d_model={self.d_model}",
            )
            check(
                is_int(self.rope_dim) and 0 < self.rope_dim <= self.attn_head_dim and self.rope_dim % 2 == 0,
                f"{name}.rope_dim",
                self.rope_dim,
                f"an even integer in [2, attn_head_dim={self.attn_head_dim}]",
            )

    def _check_attention_layers(self) -> None:
        """A hybrid's attention layers: distinct indices of its layers; none elsewhere."""
        name = "ModelConfig"
        if self.arch == "hybrid":
            idx = self.attn_layer_idx
            check(len(idx) > 0, f"{name}.attn_layer_idx", idx, "a non-empty tuple of layer indices for arch='hybrid'")
            check(
                all(is_int(i) and 0 <= i < self.n_layers for i in idx) and len(set(idx)) == len(idx),
                f"{name}.attn_layer_idx",
                idx,
                f"distinct integers in [0, n_layers={self.n_layers})",
            )
        else:
            check(not self.attn_layer_idx, f"{name}.attn_layer_idx", self.attn_layer_idx, "() unless arch='hybrid'")

    def layer_kinds(self) -> list[str]:
        """The mixer kind of each of the N layers: 'mamba2' or 'attention'."""
        if self.arch == "transformer":
            return ["attention"] * self.n_layers
        if self.arch == "hybrid":
            return ["attention" if i in self.attn_layer_idx else "mamba2" for i in range(self.n_layers)]
        return ["mamba2"] * self.n_layers
