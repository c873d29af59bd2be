"""The Mamba-2 mixer: the block module, its weights and its three entry points
(forward over a sequence, new_state, step for one token per row).

Parameter names and shapes follow `mamba_ssm.modules.mamba2.Mamba2` for the same
constructor arguments (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj), so
weights move between the two. The operations live in models/ops/, as mamba-ssm's do:
the chunked SSD, the conv and the single-token step in torch, which path runs
(ops/dispatch.py: on CUDA, mamba-ssm's and causal-conv1d's kernels when they
import; LOOPLAB_FORCE_TORCH=1 forces torch; LOOPLAB_CPU_STEP_KERNEL=1 compiles the
CPU step, models/cpu/cpu_step.py), and the oracles the tests hold them to.

The SSM, per head h with scalar decay A_h < 0 and state S (headdim × d_state):
    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_tᵀ,    y_t = S_t C_t + D_h x_t
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from looplab.models.cache import RECURRENT, BlockCache, MambaState
from looplab.models.cpu import cpu_sequence, cpu_step
from looplab.models.flops import linear_flops
from looplab.models.ops import dispatch
from looplab.models.ops.causal_conv1d_layout import causal_conv1d_inputs
from looplab.models.ops.conv import causal_depthwise_conv, causal_depthwise_conv_step
from looplab.models.ops.precision import upcast
from looplab.models.ops.ssd import ssd_chunked
from looplab.models.ops.ssm_step import ssm_step


class RMSNormGated(nn.Module):
    """RMSNorm(x · silu(z)) · weight, normalised over groups of `group_size`
    channels (mamba-ssm's norm_before_gate=False)."""

    def __init__(self, d: int, group_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.group_size = group_size
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        g = (upcast(x) * F.silu(upcast(z))).unflatten(-1, (-1, self.group_size))
        g = F.rms_norm(g, (self.group_size,), eps=self.eps)
        return (g.flatten(-2) * upcast(self.weight)).to(dtype)


class Mamba2(nn.Module):
    """Mamba-2 mixer, forward(u: (B, L, d_model)) -> (B, L, d_model).

    With a cache (models/cache.py) a prefill also stores each row's conv and SSM
    states, and a decode layout runs `step`, the single-token recurrence."""

    cache_kind = RECURRENT

    def __init__(  # noqa: PLR0913 - mamba-ssm's Mamba2 constructor, argument for argument
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        chunk_size: int = 256,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        A_init_range: tuple[float, float] = (1.0, 16.0),
        norm_eps: float = 1e-5,
        conv_bias: bool = True,
        bias: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.expand, self.headdim, self.ngroups, self.chunk_size = expand, headdim, ngroups, chunk_size
        self.d_inner = expand * d_model
        if self.d_inner % headdim:
            raise ValueError(f"headdim={headdim} must divide expand*d_model={self.d_inner}")
        self.nheads = self.d_inner // headdim
        if self.nheads % ngroups:
            raise ValueError(f"ngroups={ngroups} must divide the number of heads {self.nheads}")
        self.layer_idx = layer_idx
        self.conv_dim = self.d_inner + 2 * ngroups * d_state

        # in_proj emits [z | x B C | dt] in that order, as mamba-ssm does.
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * ngroups * d_state + self.nheads, bias=bias)
        # Kept as a Conv1d for mamba-ssm's parameter names and shapes; the torch path
        # applies its weights with causal_depthwise_conv.
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1, bias=conv_bias
        )
        # dt_bias = softplus⁻¹(dt) with dt log-uniform in [dt_min, dt_max].
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        A = torch.empty(self.nheads).uniform_(*A_init_range)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(self.nheads))
        for p in (self.dt_bias, self.A_log, self.D):
            # mamba-ssm's marker (training/train.py reads it); setattr, as Parameter declares no such field
            setattr(p, "_no_weight_decay", True)  # noqa: B010
        self.norm = RMSNormGated(self.d_inner, group_size=self.d_inner // ngroups, eps=norm_eps)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)
        # Run the conv and the scan of a sequence as models/cpu_sequence's C++ kernels
        # instead of the torch ops where they apply: set by a compiled run on a CPU
        # (models/compiled.py).
        self.cpu_kernels = False

    def forward(
        self,
        u: torch.Tensor,
        positions: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        cache: BlockCache[MambaState] | None = None,
    ) -> torch.Tensor:
        """u (B, L, d_model) → (B, L, d_model). positions are not needed (the scan's
        order is the positions' order). seq_idx (B, L), non-decreasing along L, packs
        several sequences into one row with no information flowing between them
        (conv taps and SSM state are reset at each boundary). cache: store each cache
        row's final states (a prefill layout), or step one token per row from them
        (a decode layout)."""
        if cache is not None and cache.layout.decode:
            return self.step(u, cache)
        bsz, seqlen, _ = u.shape
        z, xBC, dt = torch.split(self.in_proj(u), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        A = -torch.exp(upcast(self.A_log))
        if dispatch.use_cuda_kernels(u) and cache is None:  # the kernels return no per-row states of a ragged layout
            y = self._scan_cuda(xBC, dt, A, seq_idx)
        else:
            y = self._scan_torch(xBC, dt, A, seq_idx, cache)
        return self.out_proj(self.norm(y.reshape(bsz, seqlen, self.d_inner), z))

    # ---- a sequence: the torch ops (models/ops/) or the CUDA kernels ----------------
    def _scan_torch(self, xBC, dt, A, seq_idx, cache: BlockCache[MambaState] | None = None) -> torch.Tensor:
        if cache is not None:
            self._store_conv_state(xBC, cache)
        kernels = self.cpu_kernels and cpu_sequence.applies(xBC)
        if kernels:
            xBC = cpu_sequence.conv_silu(xBC, self.conv1d.weight, self.conv1d.bias, seq_idx)
        else:
            xBC = F.silu(causal_depthwise_conv(xBC, self.conv1d.weight, self.conv1d.bias, seq_idx))
        x, B, C = self._split_xbc(xBC)
        dt = F.softplus(upcast(dt) + upcast(self.dt_bias))
        segments = None if cache is None else cache.layout.segments()
        # A prefill reads the state after each cache row's last real token.
        state_at = None if segments is None else (segments[0], (segments[2] - 1).clamp(min=0))
        x, B, C = upcast(x), upcast(B), upcast(C)
        if kernels and state_at is None:  # (x upcast from xBC: a dtype the kernels take too)
            y, states = cpu_sequence.ssm_scan(x, dt, A, B, C, seq_idx=seq_idx)
        else:
            y, states = ssd_chunked(x, dt, A, B, C, self.chunk_size, seq_idx=seq_idx, state_at=state_at)
        if cache is not None and segments is not None:  # a row without real tokens keeps the empty state
            _, start, end = segments
            cache.state.ssm.copy_(torch.where((end > start)[:, None, None, None], states, 0.0))
        y = y + x * upcast(self.D)[:, None]
        return y.to(xBC.dtype)

    def _store_conv_state(self, xBC: torch.Tensor, cache: BlockCache[MambaState]) -> None:
        """The conv's last d_conv − 1 inputs of each cache row's real tokens, zeros
        before the row's first token (as the causal conv reads them)."""
        (seq, start, end), k = cache.layout.segments(), self.d_conv - 1
        at = end[:, None] - k + torch.arange(k, device=xBC.device)  # (rows, k), oldest first
        inputs = xBC[seq[:, None], at.clamp(min=0)]  # (rows, k, conv_dim)
        cache.state.conv.copy_(torch.where((at >= start[:, None])[..., None], inputs, 0.0))

    def _scan_cuda(self, xBC, dt, A, seq_idx) -> torch.Tensor:
        causal_conv1d_fn, mamba_chunk_scan_combined = dispatch.cuda_scan_kernels()
        if seq_idx is not None:
            seq_idx = seq_idx.to(torch.int32).contiguous()  # the kernels' dtype and layout
        # xBC is a slice of in_proj's output: see causal_conv1d_inputs for why it is not
        # handed to the conv as is. The conv's output is channel-last too; [..., :conv_dim]
        # drops the zero channels that padding may have added.
        conv_x, weight, bias = causal_conv1d_inputs(xBC, self.conv1d.weight, self.conv1d.bias)
        xBC = causal_conv1d_fn(conv_x, weight, bias, seq_idx=seq_idx, activation="silu").transpose(1, 2)[
            ..., : self.conv_dim
        ]
        x, B, C = self._split_xbc(xBC)
        return mamba_chunk_scan_combined(
            x,
            dt,
            A,
            B,
            C,
            chunk_size=self.chunk_size,
            D=self.D,
            dt_bias=self.dt_bias,
            dt_softplus=True,
            seq_idx=seq_idx,
        )

    def _split_xbc(self, xBC: torch.Tensor):
        bsz, seqlen, _ = xBC.shape
        gn = self.ngroups * self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, gn, gn], dim=-1)
        return (
            x.reshape(bsz, seqlen, self.nheads, self.headdim),
            B.reshape(bsz, seqlen, self.ngroups, self.d_state),
            C.reshape(bsz, seqlen, self.ngroups, self.d_state),
        )

    # ---- inference state (models/cache.py) ------------------------------------------
    def new_state(self, batch: int, capacity: int, device, dtype) -> MambaState:
        """Zero states for `batch` rows; their size does not depend on the context."""
        ssm_dtype = torch.promote_types(dtype, torch.float32)  # the scan's precision
        return MambaState(
            conv=torch.zeros(batch, self.d_conv - 1, self.conv_dim, device=device, dtype=dtype),
            ssm=torch.zeros(batch, self.nheads, self.headdim, self.d_state, device=device, dtype=ssm_dtype),
        )

    def step(self, u: torch.Tensor, cache: BlockCache[MambaState]) -> torch.Tensor:
        """One new token for each of the layout's cache rows: u (n, 1, d_model). The
        conv reads the stored last d_conv − 1 inputs; the SSM advances one step,
        S ← exp(dt A) S + dt x Bᵀ, y = S C + D x. Both states are updated in place."""
        state, rows = cache.state, cache.layout.rows
        z, xBC, dt = torch.split(self.in_proj(u[:, 0]), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        A = -torch.exp(upcast(self.A_log))
        if cpu_step.applies(xBC, state.conv, state.ssm) and not dispatch.torch_forced():  # conv, SSM, norm in one call
            y = cpu_step.kernel().mamba2_step(
                xBC,
                dt,
                z,
                state.conv,
                state.ssm,
                rows,
                self.conv1d.weight,
                self.conv1d.bias,
                self.dt_bias,
                A.to(xBC.dtype),
                self.D,
                self.norm.weight,
                self.norm.eps,
                self.ngroups,
            )
            return self.out_proj(y)[:, None]
        if dispatch.use_cuda_step_kernels(u):
            y = self._step_cuda(xBC, dt, A, state, rows)
        else:
            y = self._step_torch(xBC, dt, A, state, rows)
        return self.out_proj(self.norm(y.reshape(u.shape[0], self.d_inner).to(u.dtype), z))[:, None]

    def _step_torch(self, xBC, dt, A, state: MambaState, rows: torch.Tensor | None) -> torch.Tensor:
        n, g, dstate = xBC.shape[0], self.ngroups, self.d_state
        xBC = causal_depthwise_conv_step(xBC, state.conv, self.conv1d.weight, self.conv1d.bias, rows)
        x, B, C = torch.split(F.silu(xBC), [self.d_inner, g * dstate, g * dstate], dim=-1)
        dt = F.softplus(upcast(dt) + upcast(self.dt_bias))  # (n, h)
        B, C = upcast(B).reshape(n, g, dstate), upcast(C).reshape(n, g, dstate)  # slices: not viewable
        return ssm_step(state.ssm, upcast(x).view(n, self.nheads, self.headdim), dt, A, B, C, upcast(self.D), rows)

    def _step_cuda(self, xBC, dt, A, state: MambaState, rows: torch.Tensor | None) -> torch.Tensor:
        causal_conv1d_update, selective_state_update = dispatch.cuda_step_kernels()
        index = None if rows is None else rows.to(torch.int32)  # the kernels gather and scatter the rows
        # The conv state is stored time-major; the kernel reads it through strides as (B, conv_dim, d_conv - 1).
        xBC = causal_conv1d_update(
            xBC.to(state.conv.dtype).contiguous(),
            state.conv.transpose(1, 2),
            self.conv1d.weight[:, 0],
            self.conv1d.bias,
            "silu",
            conv_state_indices=index,
        )
        n, h, p, dstate = xBC.shape[0], self.nheads, self.headdim, self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, self.ngroups * dstate, self.ngroups * dstate], dim=-1)
        # Per-head scalars broadcast over headdim (and d_state) as stride-0 views, as mamba-ssm's step does.
        return selective_state_update(
            state.ssm,
            x.reshape(n, h, p),
            dt[..., None].expand(n, h, p),
            A[:, None, None].expand(h, p, dstate),
            B.reshape(n, self.ngroups, dstate),
            C.reshape(n, self.ngroups, dstate),
            D=self.D[:, None].expand(h, p),
            dt_bias=self.dt_bias[:, None].expand(h, p),
            dt_softplus=True,
            state_batch_indices=index,
        )

    # ---- cost -----------------------------------------------------------------------
    def flops(self, seq_len: int) -> int:
        """Forward FLOPs per token at context seq_len (models/flops.py's convention).
        The SSD terms count the products the chunked algorithm runs (the full Q×Q
        chunk products, masked half included, and the state-passing product), so the
        figure matches the work done, not the minimum."""
        Q, h, p, n, g = self.chunk_size, self.nheads, self.headdim, self.d_state, self.ngroups
        nc = -(-seq_len // Q)  # chunks
        ssd: float = 2 * Q * n * g  # C·B within a chunk, shared by the heads of a group
        ssd += 2 * Q * h * p  # masked scores @ x
        ssd += 2 * h * p * n  # chunk-end states
        ssd += 2 * h * p * n  # state readout C·S
        ssd += 2 * (nc + 1) * nc * h * p * n / seq_len  # state passing: (nc+1)×nc decay matrix @ chunk states
        conv = 2 * self.conv_dim * self.d_conv
        return linear_flops(self.in_proj) + conv + round(ssd) + linear_flops(self.out_proj)
