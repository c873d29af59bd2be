"""The Mamba-2 mixer: a pure-PyTorch chunked SSD with a depthwise causal conv.

Parameter names and shapes follow `mamba_ssm.modules.mamba2.Mamba2` for the same
constructor arguments (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj), so
weights move between the two. On CUDA, when mamba-ssm and causal-conv1d import, the
conv and the scan run in their fused kernels; `LOOPLAB_FORCE_TORCH=1` forces the
torch path everywhere. On a CPU, LOOPLAB_CPU_STEP_KERNEL=1 runs decoding's
single-token step in a compiled kernel (models/cpu_step.py).

The SSM, per head h with scalar decay A_h < 0 and state S (headdim × d_state):
    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_tᵀ,    y_t = S_t C_t + D_h x_t
The chunked form (the Mamba-2 paper's "SSD") splits the sequence into chunks of Q
tokens: inside a chunk the recurrence is a masked Q×Q matrix product (quadratic but
matmul-friendly); between chunks only the (headdim × d_state) states are passed on.
"""

from __future__ import annotations

import functools
import importlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from looplab.models import cpu_step
from looplab.models.cache import RECURRENT, BlockCache, MambaState
from looplab.models.flops import linear_flops

FORCE_TORCH_ENV = "LOOPLAB_FORCE_TORCH"


def upcast(t: torch.Tensor) -> torch.Tensor:
    """At least float32 for the numerically delicate parts (float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


IMPORT_ERRORS: dict[str, str] = {}  # kernel module -> why it did not import (looplab doctor names it)


def _guarded_import(*names: tuple[str, str]):
    """The named objects, or None. Imported lazily and guarded broadly: on a CPU build
    or a version mismatch these packages fail with ImportError, OSError or "undefined
    symbol", none of which may break the torch path; the failure is kept in
    IMPORT_ERRORS, so a health check can say why the kernels are off."""
    found = []
    for module, name in names:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except Exception as e:  # noqa: BLE001 - any failure means "no kernels"
            IMPORT_ERRORS[module] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            return None
    return tuple(found)


def kernel_path(t: torch.Tensor) -> tuple[str, str]:
    """Which prefill scan a Mamba-2 block on t's device runs, and why: ("cuda", ...) for
    mamba-ssm's and causal-conv1d's kernels, else ("torch", the reason)."""
    if torch_forced():
        return "torch", f"{FORCE_TORCH_ENV}=1"
    if not t.is_cuda:
        return "torch", f"{t.device.type} tensors (the kernels are CUDA's)"
    if _cuda_kernels() is None:
        return "torch", "; ".join(f"{m}: {e}" for m, e in IMPORT_ERRORS.items()) or "the kernels did not import"
    return "cuda", "mamba_chunk_scan_combined + causal_conv1d_fn"


@functools.cache
def _cuda_kernels():
    """(causal_conv1d_fn, mamba_chunk_scan_combined) or None."""
    return _guarded_import(("causal_conv1d", "causal_conv1d_fn"),
                           ("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined"))


@functools.cache
def _cuda_step_kernels():
    """(causal_conv1d_update, selective_state_update): the single-token kernels of
    decoding, or None."""
    return _guarded_import(("causal_conv1d", "causal_conv1d_update"),
                           ("mamba_ssm.ops.triton.selective_state_update", "selective_state_update"))


def torch_forced() -> bool:
    """LOOPLAB_FORCE_TORCH=1: every Mamba-2 block runs its torch path, the CPU step too."""
    return os.environ.get(FORCE_TORCH_ENV, "0") == "1"


def _kernels_apply(t: torch.Tensor, kernels) -> bool:
    return t.is_cuda and not torch_forced() and kernels() is not None


def use_cuda_kernels(t: torch.Tensor) -> bool:
    return _kernels_apply(t, _cuda_kernels)


def use_cuda_step_kernels(t: torch.Tensor) -> bool:
    return _kernels_apply(t, _cuda_step_kernels)


def step_implementation(t: torch.Tensor) -> str:
    """Which single-token step decoding a model of t's device and dtype runs, for
    benchmark records: "cuda" (mamba-ssm's kernels), "cpu-kernel" or "torch"."""
    if use_cuda_step_kernels(t):
        return "cuda"
    if cpu_step.serves(t) and not torch_forced():
        return "cpu-kernel"
    return "torch"


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    state_at: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked state-space duality scan (without the D skip term).

    x (b, l, h, p), dt (b, l, h) already positive, A (h,) negative, B and C
    (b, l, g, n) with h divisible by g; initial_state (b, h, p, n) or None.
    seq_idx (b, l), non-decreasing along l, packs several sequences into one row:
    no state flows from one sequence into the next (the ragged layout of skip
    execution). Returns y (b, l, h, p) and the final state (b, h, p, n), which with
    seq_idx is the state of each row's last sequence.

    state_at (rows, positions), two (k,) index tensors: return instead of the final
    state the states right after those positions (k, h, p, n), each the state of the
    sequence its position belongs to. Prefill reads the state of every sequence of a
    ragged layout this way (each row's real tokens end at a different position).
    """
    if seq_idx is not None and initial_state is not None:
        raise ValueError("ssd_chunked: initial_state with seq_idx is not supported")
    bsz, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    hpg = nheads // ngroups  # heads per group share B and C
    Q = chunk_size
    pad = (-seqlen) % Q
    if pad:  # dt = 0 on pads: an identity step that adds nothing to the state
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
        if seq_idx is not None:  # pads continue the last sequence (as identity steps)
            seq_idx = torch.cat([seq_idx, seq_idx[:, -1:].expand(-1, pad)], dim=1)
    nc = (seqlen + pad) // Q
    if seq_idx is not None:
        seq = seq_idx.reshape(bsz, nc, 1, 1, Q)  # broadcasts over (group, head)

    # Layout (batch, chunk, group, head-in-group, position, feature) throughout.
    x = x.reshape(bsz, nc, Q, ngroups, hpg, headdim).permute(0, 1, 3, 4, 2, 5)
    dt = dt.reshape(bsz, nc, Q, ngroups, hpg).permute(0, 1, 3, 4, 2)
    B = B.reshape(bsz, nc, Q, ngroups, dstate).transpose(2, 3).unsqueeze(3)  # b c g 1 q n
    C = C.reshape(bsz, nc, Q, ngroups, dstate).transpose(2, 3).unsqueeze(3)
    a_cum = torch.cumsum(dt * A.reshape(ngroups, hpg, 1), dim=-1)  # b c g h q, decreasing

    xdt = x * dt.unsqueeze(-1)  # every input enters the state scaled by its dt

    # 1. Within a chunk: y_i = Σ_{j≤i} (C_i·B_j) exp(a_i − a_j) dt_j x_j.
    #    Masking before exp keeps the (positive) upper triangle from overflowing.
    keep = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    if seq_idx is not None:
        keep = keep & (seq.unsqueeze(-1) == seq.unsqueeze(-2))
    decay = _SegmentDecay.apply(a_cum, keep)
    y = ((C @ B.transpose(-1, -2)) * decay) @ xdt  # b c g h q p

    # 2. Each chunk's contribution to the state at its end.
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # b c g h q
    if seq_idx is not None:  # only the sequence still running at the chunk's end
        to_end = to_end * (seq == seq[..., -1:])
    chunk_states = (xdt * to_end.unsqueeze(-1)).transpose(-1, -2) @ B  # b c g h p n

    # 3. Pass states across chunks, in closed form: the state entering chunk z is
    #    Σ_{c<z} exp(a_tot[c+1..z-1]) chunk_states[c] + exp(a_tot[0..z-1]) S_init.
    #    One small (nc+1)×nc matrix product per head instead of a sequential loop
    #    (whose per-chunk slicing would cost O(nc²) memory traffic in backward);
    #    row nc is the final state.
    totals = a_cum[..., -1].permute(0, 2, 3, 1)  # b g h c: log-decay across each chunk
    inclusive = torch.cumsum(totals, dim=-1)
    exclusive = F.pad(inclusive, (1, 0))  # b g h (c+1): decay from the start to chunk z
    later = torch.ones(nc + 1, nc, dtype=torch.bool, device=x.device).tril(-1)  # chunk c ends before z
    if seq_idx is not None:
        # A chunk's end state reaches chunk z only within one sequence; sequences are
        # contiguous, so "same sequence at c's end and at z's start" says it all.
        ends = seq[:, :, 0, 0, -1]  # b c
        starts = torch.cat([seq[:, :, 0, 0, 0], seq[:, -1:, 0, 0, -1]], dim=1)  # b (c+1); row c+1: the end
        later = later & (starts.unsqueeze(-1) == ends.unsqueeze(-2))[:, None, None]
    passing = torch.exp((exclusive.unsqueeze(-1) - inclusive.unsqueeze(-2)).masked_fill(~later, float("-inf")))
    states = passing @ chunk_states.permute(0, 2, 3, 1, 4, 5).reshape(bsz, ngroups, hpg, nc, headdim * dstate)
    if initial_state is not None:
        init = initial_state.reshape(bsz, ngroups, hpg, 1, headdim * dstate).to(x.dtype)
        states = states + torch.exp(exclusive).unsqueeze(-1) * init
    states = states.reshape(bsz, ngroups, hpg, nc + 1, headdim, dstate)
    entering = states[:, :, :, :nc].permute(0, 3, 1, 2, 4, 5)  # b c g h p n
    state = states[:, :, :, nc]

    # 4. The state entering a chunk, read out at every position of it.
    from_start = torch.exp(a_cum)
    if seq_idx is not None:  # positions of a sequence that began inside this chunk
        from_start = from_start * (seq == seq[..., :1])
    y = y + (C @ entering.transpose(-1, -2)) * from_start.unsqueeze(-1)

    y = y.permute(0, 1, 4, 2, 3, 5).reshape(bsz, nc * Q, nheads, headdim)[:, :seqlen]
    if state_at is not None:
        return y, _states_after(state_at, Q, a_cum, xdt, B, entering, seq if seq_idx is not None else None)
    return y, state.reshape(bsz, nheads, headdim, dstate)


def _states_after(state_at, Q, a_cum, xdt, B, entering, seq) -> torch.Tensor:
    """ssd_chunked's states after chosen positions, from its chunk layout: the state
    entering the position's chunk, decayed to the position, plus the chunk's inputs
    up to it: S_t = exp(a_t) S_enter + Σ_{j≤t} exp(a_t − a_j) dt_j x_j B_jᵀ, within
    the position's own sequence."""
    rows, pos = state_at
    c, i = pos // Q, (pos % Q)[:, None, None, None]  # chunk, offset in it
    a = a_cum[rows, c]  # k g h q
    a_t = a.gather(-1, i.expand(*a.shape[:-1], 1))  # k g h 1
    keep = torch.arange(Q, device=a.device) <= i  # j ≤ t
    if seq is not None:
        s = seq[rows, c, 0, 0]  # k q
        s_t = s.gather(-1, i[:, 0, 0])  # k 1
        keep = keep & (s == s_t)[:, None, None]
        from_start = torch.exp(a_t) * (s[:, :1] == s_t)[:, None, None]  # the entering state is this sequence's
    else:
        from_start = torch.exp(a_t)
    w = torch.exp((a_t - a).masked_fill(~keep, float("-inf")))  # k g h q
    states = (xdt[rows, c] * w.unsqueeze(-1)).transpose(-1, -2) @ B[rows, c]  # k g h p n
    states = states + from_start.unsqueeze(-1) * entering[rows, c]
    return states.reshape(rows.shape[0], -1, *states.shape[-2:])


class _SegmentDecay(torch.autograd.Function):
    """d_ij = exp(a_i − a_j) where keep[i, j], else 0: the intra-chunk decay
    matrix, a (…, Q) → (…, Q, Q). Autograd of the plain expression makes four
    passes over the (…, Q, Q) tensor in backward before its two reductions (exp's
    product, masked_fill's copy and fill, sub's negation) and one more copy in
    forward; here backward forms m = g ⊙ d once (zero where masked, as d is) and
    reduces it along both axes: ∂/∂a_k = Σ_j m_kj − Σ_i m_ik."""

    @staticmethod
    def forward(ctx, a, keep):
        d = (a.unsqueeze(-1) - a.unsqueeze(-2)).masked_fill_(~keep, float("-inf")).exp_()
        ctx.save_for_backward(d)
        return d

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (d,) = ctx.saved_tensors
        m = grad * d
        return m.sum(-1) - m.sum(-2), None


class _CausalDepthwiseConv(torch.autograd.Function):
    """Depthwise causal conv on channels-last input as k shifted multiply-adds,
    accumulated in place. On CPU this is several times faster than F.conv1d's
    grouped path, forward and backward, and it needs no transposes; the explicit
    backward avoids the zero-filled buffers that autograd of slices would allocate.
    With seq_idx, a tap that would reach into another sequence reads zero."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx):
        k = weight.shape[-1]
        w = weight[:, 0, :]
        out = x * w[:, k - 1]
        for shift, j, src in _taps(x, k, seq_idx):
            out[:, shift:].addcmul_(src, w[:, j])
        if bias is not None:
            out += bias
        ctx.save_for_backward(x, weight, seq_idx)
        ctx.has_bias, ctx.has_seq = bias is not None, seq_idx is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, seq_idx = ctx.saved_tensors
        seq_idx = seq_idx if ctx.has_seq else None
        k, seqlen = weight.shape[-1], x.shape[1]
        w = weight[:, 0, :]
        grad = grad.contiguous()
        grad_x = grad * w[:, k - 1]
        grad_w = torch.zeros_like(w)
        grad_w[:, k - 1] = (grad * x).sum((0, 1))
        for shift, j, src in _taps(x, k, seq_idx):
            g = grad[:, shift:]
            if seq_idx is not None:
                g = g * _same_seq(seq_idx, shift)
            grad_x[:, :seqlen - shift].addcmul_(g, w[:, j])
            grad_w[:, j] = (grad[:, shift:] * src).sum((0, 1))
        grad_b = grad.sum((0, 1)) if ctx.has_bias else None
        return grad_x, grad_w.unsqueeze(1), grad_b, None


def _same_seq(seq_idx: torch.Tensor, shift: int) -> torch.Tensor:
    """(b, l-shift, 1): 1 where position t and t-shift belong to the same sequence."""
    return (seq_idx[:, shift:] == seq_idx[:, :-shift]).unsqueeze(-1)


def _taps(x: torch.Tensor, k: int, seq_idx: torch.Tensor | None):
    """(shift, tap index, source slice) for the taps that read earlier tokens."""
    seqlen = x.shape[1]
    for j in range(k - 1):
        shift = k - 1 - j  # tap j reads the token `shift` positions back
        if shift < seqlen:
            src = x[:, :seqlen - shift]
            yield shift, j, src if seq_idx is None else src * _same_seq(seq_idx, shift)


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          seq_idx: torch.Tensor | None = None) -> torch.Tensor:
    """x (b, l, c), weight (c, 1, k): out_t = bias + Σ_j weight[:, j] · x_{t-(k-1)+j},
    with zeros before the start of the sequence (of the token's own sequence when
    seq_idx (b, l) marks several sequences packed into one row)."""
    return _CausalDepthwiseConv.apply(x.contiguous(), weight, bias, seq_idx)


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
    fits = (pad == 0 and xBC.stride(2) == 1 and xBC.stride(1) % 8 == 0 and xBC.stride(0) % 8 == 0
            and xBC.storage_offset() % 8 == 0)
    if not fits:  # a fresh buffer (not .contiguous(), which keeps a view with size-1 dims)
        xBC = F.pad(xBC, (0, pad)) if pad else xBC.clone(memory_format=torch.contiguous_format)
    weight = weight.squeeze(1)
    if pad:
        weight = F.pad(weight, (0, 0, 0, pad))
        bias = F.pad(bias, (0, pad)) if bias is not None else None
    return xBC.transpose(1, 2), weight, bias


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

    def __init__(
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
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim,
                                padding=d_conv - 1, bias=conv_bias)
        # dt_bias = softplus⁻¹(dt) with dt log-uniform in [dt_min, dt_max].
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        A = torch.empty(self.nheads).uniform_(*A_init_range)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(self.nheads))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.norm = RMSNormGated(self.d_inner, group_size=self.d_inner // ngroups, eps=norm_eps)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)

    def forward(self, u: torch.Tensor, positions: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None, cache: BlockCache | None = None) -> torch.Tensor:
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
        if use_cuda_kernels(u) and cache is None:  # the kernels return no per-row states of a ragged layout
            y = self._scan_cuda(xBC, dt, A, seq_idx)
        else:
            y = self._scan_torch(xBC, dt, A, seq_idx, cache)
        return self.out_proj(self.norm(y.reshape(bsz, seqlen, self.d_inner), z))

    # ---- inference state (models/cache.py) ------------------------------------------
    def new_state(self, batch: int, capacity: int, device, dtype) -> MambaState:
        """Zero states for `batch` rows; their size does not depend on the context."""
        ssm_dtype = torch.promote_types(dtype, torch.float32)  # the scan's precision
        return MambaState(conv=torch.zeros(batch, self.d_conv - 1, self.conv_dim, device=device, dtype=dtype),
                          ssm=torch.zeros(batch, self.nheads, self.headdim, self.d_state, device=device,
                                          dtype=ssm_dtype))

    def step(self, u: torch.Tensor, cache: BlockCache) -> torch.Tensor:
        """One new token for each of the layout's cache rows: u (n, 1, d_model). The
        conv reads the stored last d_conv − 1 inputs; the SSM advances one step,
        S ← exp(dt A) S + dt x Bᵀ, y = S C + D x. Both states are updated in place."""
        state, rows = cache.state, cache.layout.rows
        z, xBC, dt = torch.split(self.in_proj(u[:, 0]), [self.d_inner, self.conv_dim, self.nheads], dim=-1)
        A = -torch.exp(upcast(self.A_log))
        if cpu_step.applies(xBC, state.conv, state.ssm) and not torch_forced():  # conv, SSM, gated norm in one call
            y = cpu_step.kernel().mamba2_step(xBC, dt, z, state.conv, state.ssm, rows, self.conv1d.weight,
                                              self.conv1d.bias, self.dt_bias, A.to(xBC.dtype), self.D,
                                              self.norm.weight, self.norm.eps, self.ngroups)
            return self.out_proj(y)[:, None]
        if use_cuda_step_kernels(u):
            y = self._step_cuda(xBC, dt, A, state, rows)
        else:
            y = self._step_torch(xBC, dt, A, state, rows)
        return self.out_proj(self.norm(y.reshape(u.shape[0], self.d_inner).to(u.dtype), z))[:, None]

    def _step_torch(self, xBC, dt, A, state: MambaState, rows: torch.Tensor | None) -> torch.Tensor:
        n, h, p, g, dstate = xBC.shape[0], self.nheads, self.headdim, self.ngroups, self.d_state
        # Packed rows are gathered with index_select (a row copy; advanced indexing is
        # several times slower on CPU) and written back after the step.
        conv = state.conv if rows is None else state.conv.index_select(0, rows)  # (n, d_conv - 1, conv_dim)
        window = torch.cat([conv, xBC.to(conv.dtype)[:, None]], dim=1)  # (n, d_conv, conv_dim), oldest first
        if rows is None:
            state.conv.copy_(window[:, 1:])
        else:
            state.conv.index_copy_(0, rows, window[:, 1:])
        xBC = (window * self.conv1d.weight[:, 0].t().contiguous()).sum(1)  # a contiguous (d_conv, conv_dim) is 3× faster
        if self.conv1d.bias is not None:
            xBC = xBC + self.conv1d.bias
        x, B, C = torch.split(F.silu(xBC), [self.d_inner, g * dstate, g * dstate], dim=-1)
        x = upcast(x).view(n, h, p)
        dt = F.softplus(upcast(dt) + upcast(self.dt_bias))  # (n, h)
        decay = torch.exp(dt * A)[..., None]  # (n, h, 1)
        xdt = (dt[..., None] * x).view(n, g, -1, 1)
        B, C = upcast(B).reshape(n, g, 1, dstate), upcast(C).reshape(n, g, 1, dstate)  # slices: not viewable
        batch = state.ssm.shape[0]
        if rows is not None and 2 * n >= batch:
            # Most rows run: the update is memory-bound, and gathering the running rows'
            # states and writing them back costs about two more passes over them than
            # updating every row in place. So every row steps, the others by an exact
            # identity (decay 1, input 0), and only the running rows' y is read.
            decay = torch.ones(batch, h, 1, dtype=decay.dtype, device=decay.device).index_copy_(0, rows, decay)
            xdt = xdt.new_zeros(batch, *xdt.shape[1:]).index_copy_(0, rows, xdt)
            B = B.new_zeros(batch, *B.shape[1:]).index_copy_(0, rows, B)
            C = C.new_zeros(batch, *C.shape[1:]).index_copy_(0, rows, C)
            n, rows, out_rows = batch, None, rows
        else:
            out_rows = None
        # The heads of a group share B and C, so each (row, group) is one block of
        # heads·headdim state rows: dt x Bᵀ is an outer product added in place, and
        # y = S C is read as the row vector Cᵀ Sᵀ (one small GEMM per block; the
        # batched matrix-vector form is several times slower on CPU).
        xdt, B, C = xdt.view(n * g, -1, 1), B.reshape(n * g, 1, dstate), C.reshape(n * g, 1, dstate)
        if rows is None:
            ssm = state.ssm.view(n * g, -1, dstate)  # in place
            ssm.view(n, h, -1).mul_(decay)
            ssm.addcmul_(xdt, B)
            y = torch.bmm(C, ssm.transpose(1, 2)).view(n, h, p)
            if out_rows is not None:
                y = y.index_select(0, out_rows)
        else:
            # A few rows run (or rows of different loops: looplab/depth_batching.py): their
            # states are gathered, stepped, and the change S_new − S added back with
            # index_add_ (its per-row fast path beats index_copy_'s several times on CPU).
            old = state.ssm.index_select(0, rows).view(n * g, -1, dstate)
            ssm = (old.view(n, h, -1) * decay).view(n * g, -1, dstate)
            ssm.addcmul_(xdt, B)
            y = torch.bmm(C, ssm.transpose(1, 2)).view(n, h, p)
            state.ssm.index_add_(0, rows, torch.sub(ssm, old, out=old).view(n, h, p, dstate))
        return y + x * upcast(self.D)[:, None]

    def _step_cuda(self, xBC, dt, A, state: MambaState, rows: torch.Tensor | None) -> torch.Tensor:
        causal_conv1d_update, selective_state_update = _cuda_step_kernels()
        index = None if rows is None else rows.to(torch.int32)  # the kernels gather and scatter the rows
        # The conv state is stored time-major; the kernel reads it through strides as (B, conv_dim, d_conv - 1).
        xBC = causal_conv1d_update(xBC.to(state.conv.dtype).contiguous(), state.conv.transpose(1, 2),
                                   self.conv1d.weight[:, 0], self.conv1d.bias, "silu", conv_state_indices=index)
        n, h, p, dstate = xBC.shape[0], self.nheads, self.headdim, self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, self.ngroups * dstate, self.ngroups * dstate], dim=-1)
        # Per-head scalars broadcast over headdim (and d_state) as stride-0 views, as mamba-ssm's step does.
        return selective_state_update(
            state.ssm, x.reshape(n, h, p), dt[..., None].expand(n, h, p), A[:, None, None].expand(h, p, dstate),
            B.reshape(n, self.ngroups, dstate), C.reshape(n, self.ngroups, dstate),
            D=self.D[:, None].expand(h, p), dt_bias=self.dt_bias[:, None].expand(h, p), dt_softplus=True,
            state_batch_indices=index)

    def flops(self, seq_len: int) -> int:
        """Forward FLOPs per token at context seq_len (models/flops.py's convention).
        The SSD terms count the products the chunked algorithm runs (the full Q×Q
        chunk products, masked half included, and the state-passing product), so the
        figure matches the work done, not the minimum."""
        Q, h, p, n, g = self.chunk_size, self.nheads, self.headdim, self.d_state, self.ngroups
        nc = -(-seq_len // Q)  # chunks
        ssd = 2 * Q * n * g  # C·B within a chunk, shared by the heads of a group
        ssd += 2 * Q * h * p  # masked scores @ x
        ssd += 2 * h * p * n  # chunk-end states
        ssd += 2 * h * p * n  # state readout C·S
        ssd += 2 * (nc + 1) * nc * h * p * n / seq_len  # state passing: (nc+1)×nc decay matrix @ chunk states
        conv = 2 * self.conv_dim * self.d_conv
        return linear_flops(self.in_proj) + conv + round(ssd) + linear_flops(self.out_proj)

    def _split_xbc(self, xBC: torch.Tensor):
        bsz, seqlen, _ = xBC.shape
        gn = self.ngroups * self.d_state
        x, B, C = torch.split(xBC, [self.d_inner, gn, gn], dim=-1)
        return (x.reshape(bsz, seqlen, self.nheads, self.headdim),
                B.reshape(bsz, seqlen, self.ngroups, self.d_state),
                C.reshape(bsz, seqlen, self.ngroups, self.d_state))

    def _scan_torch(self, xBC, dt, A, seq_idx, cache: BlockCache | None = None) -> torch.Tensor:
        if cache is not None:
            self._store_conv_state(xBC, cache)
        xBC = F.silu(causal_depthwise_conv(xBC, self.conv1d.weight, self.conv1d.bias, seq_idx))
        x, B, C = self._split_xbc(xBC)
        dt = F.softplus(upcast(dt) + upcast(self.dt_bias))
        lay = None if cache is None else cache.layout
        # A prefill reads the state after each cache row's last real token.
        state_at = None if lay is None else (lay.seq, (lay.end - 1).clamp(min=0))
        y, states = ssd_chunked(upcast(x), dt, A, upcast(B), upcast(C), self.chunk_size, seq_idx=seq_idx,
                                state_at=state_at)
        if cache is not None:  # a row without real tokens in this layout keeps the empty state
            cache.state.ssm.copy_(torch.where((lay.end > lay.start)[:, None, None, None], states, 0.0))
        y = y + upcast(x) * upcast(self.D)[:, None]
        return y.to(xBC.dtype)

    def _store_conv_state(self, xBC: torch.Tensor, cache: BlockCache) -> None:
        """The conv's last d_conv − 1 inputs of each cache row's real tokens, zeros
        before the row's first token (as the causal conv reads them)."""
        lay, k = cache.layout, self.d_conv - 1
        at = lay.end[:, None] - k + torch.arange(k, device=xBC.device)  # (rows, k), oldest first
        inputs = xBC[lay.seq[:, None], at.clamp(min=0)]  # (rows, k, conv_dim)
        cache.state.conv.copy_(torch.where((at >= lay.start[:, None])[..., None], inputs, 0.0))

    def _scan_cuda(self, xBC, dt, A, seq_idx) -> torch.Tensor:
        causal_conv1d_fn, mamba_chunk_scan_combined = _cuda_kernels()
        if seq_idx is not None:
            seq_idx = seq_idx.to(torch.int32).contiguous()  # the kernels' dtype and layout
        # xBC is a slice of in_proj's output: see causal_conv1d_inputs for why it is not
        # handed to the conv as is. The conv's output is channel-last too; [..., :conv_dim]
        # drops the zero channels that padding may have added.
        conv_x, weight, bias = causal_conv1d_inputs(xBC, self.conv1d.weight, self.conv1d.bias)
        xBC = causal_conv1d_fn(conv_x, weight, bias, seq_idx=seq_idx,
                               activation="silu").transpose(1, 2)[..., :self.conv_dim]
        x, B, C = self._split_xbc(xBC)
        return mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=self.chunk_size, D=self.D,
                                         dt_bias=self.dt_bias, dt_softplus=True, seq_idx=seq_idx)
