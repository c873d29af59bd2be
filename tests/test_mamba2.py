"""The Mamba-2 mixer against independent references (float64)."""

import pytest
import torch
import torch.nn.functional as F

from looplab.models.mamba2 import Mamba2
from looplab.models.ops.conv import causal_depthwise_conv
from looplab.models.ops.dispatch import use_cuda_kernels
from looplab.models.ops.reference import mamba2_mixer_ref, ssm_scan_ref
from looplab.models.ops.ssd import ssd_chunked


def _ssm_inputs(b, l, h, p, g, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, l, h, p, generator=gen, dtype=torch.float64)
    dt = F.softplus(torch.randn(b, l, h, generator=gen, dtype=torch.float64))
    A = -torch.rand(h, generator=gen, dtype=torch.float64) * 3 - 0.1
    B = torch.randn(b, l, g, n, generator=gen, dtype=torch.float64)
    C = torch.randn(b, l, g, n, generator=gen, dtype=torch.float64)
    return x, dt, A, B, C


@pytest.mark.parametrize("l,chunk,g", [(32, 8, 1), (37, 8, 2), (5, 16, 1), (64, 64, 4), (1, 4, 2)])
def test_chunked_ssd_matches_sequential_scan(l, chunk, g):
    x, dt, A, B, C = _ssm_inputs(2, l, 4, 3, g, 5)
    init = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    y, state = ssd_chunked(x, dt, A, B, C, chunk, initial_state=init)
    y_ref, state_ref = ssm_scan_ref(x, dt, A, B, C, initial_state=init)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(state, state_ref, atol=1e-10, rtol=1e-10)


def test_chunked_ssd_gradients_match_sequential_scan():
    inputs = [t.requires_grad_() for t in _ssm_inputs(2, 23, 4, 3, 2, 5, seed=1)]
    weights = torch.randn(2, 23, 4, 3, dtype=torch.float64)
    w_state = torch.randn(2, 4, 3, 5, dtype=torch.float64)

    def loss(fn):
        y, s = fn(*inputs)
        return (y * weights).sum() + (s * w_state).sum()

    grads = torch.autograd.grad(loss(lambda *a: ssd_chunked(*a, chunk_size=8)), inputs)
    grads_ref = torch.autograd.grad(loss(ssm_scan_ref), inputs)
    for name, g, r in zip("x dt A B C".split(), grads, grads_ref):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10, msg=f"gradient of {name}")


def test_mixer_matches_reference_forward():
    torch.manual_seed(0)
    m = Mamba2(d_model=16, d_state=8, d_conv=4, expand=2, headdim=8, ngroups=2, chunk_size=8).double()
    with torch.no_grad():  # move off the init so every parameter matters
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    u = torch.randn(2, 21, 16, dtype=torch.float64)
    torch.testing.assert_close(m(u), mamba2_mixer_ref(m, u), atol=1e-10, rtol=1e-10)


def test_parameter_names_and_shapes_follow_mamba_ssm():
    d_model, d_state, d_conv, expand, headdim, ngroups = 64, 16, 4, 2, 16, 2
    m = Mamba2(d_model, d_state, d_conv, expand, headdim, ngroups, chunk_size=32)
    d_inner, nheads = expand * d_model, expand * d_model // headdim
    conv_dim = d_inner + 2 * ngroups * d_state
    expected = {
        "in_proj.weight": (2 * d_inner + 2 * ngroups * d_state + nheads, d_model),
        "conv1d.weight": (conv_dim, 1, d_conv),
        "conv1d.bias": (conv_dim,),
        "dt_bias": (nheads,),
        "A_log": (nheads,),
        "D": (nheads,),
        "norm.weight": (d_inner,),
        "out_proj.weight": (d_model, d_inner),
    }
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == expected


def test_dt_and_A_initialisation_ranges():
    m = Mamba2(64, 16, headdim=8, chunk_size=16)
    dt = F.softplus(m.dt_bias.detach())
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6
    A = torch.exp(m.A_log.detach())
    assert A.min() >= 1.0 and A.max() <= 16.0


def test_right_padding_cannot_leak_into_real_positions():
    torch.manual_seed(0)
    m = Mamba2(16, 8, headdim=8, chunk_size=8).double()
    real = torch.randn(2, 13, 16, dtype=torch.float64)
    outs = []
    for fill in (0.0, 1e3, -7.5):
        pad = torch.full((2, 6, 16), fill, dtype=torch.float64) + torch.randn(2, 6, 16, dtype=torch.float64)
        outs.append(m(torch.cat([real, pad], dim=1))[:, :13])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    torch.testing.assert_close(outs[0], m(real))


def test_cpu_tensors_never_use_cuda_kernels(monkeypatch):
    assert not use_cuda_kernels(torch.zeros(1))
    monkeypatch.setenv("LOOPLAB_FORCE_TORCH", "1")
    assert not use_cuda_kernels(torch.zeros(1))


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available()
    or not use_cuda_kernels(torch.zeros(1, device="cuda") if torch.cuda.is_available() else torch.zeros(1)),
    reason="needs CUDA with mamba-ssm's Triton kernels",
)
def test_cuda_kernels_match_torch_path(monkeypatch):
    torch.manual_seed(0)
    m = Mamba2(256, 64, headdim=64, chunk_size=64).cuda()
    u = torch.randn(2, 300, 256, device="cuda")
    fast = m(u)
    monkeypatch.setenv("LOOPLAB_FORCE_TORCH", "1")
    torch.testing.assert_close(fast, m(u), atol=2e-3, rtol=2e-3)


def test_causal_conv_forward_and_gradients_match_conv1d():
    for seqlen in (1, 2, 9):
        x = torch.randn(2, seqlen, 6, dtype=torch.float64, requires_grad=True)
        w = torch.randn(6, 1, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(6, dtype=torch.float64, requires_grad=True)
        ref = F.conv1d(x.transpose(1, 2), w, b, padding=3, groups=6)[..., :seqlen].transpose(1, 2)
        torch.testing.assert_close(causal_depthwise_conv(x, w, b), ref)
        assert torch.autograd.gradcheck(causal_depthwise_conv, (x, w, b))


def _segments(lengths):
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])


@pytest.mark.parametrize("lengths,chunk", [([5, 9, 3], 4), ([8, 8], 8), ([1, 20, 2, 7], 8), ([13], 4)])
def test_ssd_with_seq_idx_equals_each_sequence_alone(lengths, chunk):
    L = sum(lengths)
    x, dt, A, B, C = _ssm_inputs(1, L, 4, 3, 2, 5, seed=7)
    seq_idx = _segments(lengths)[None]
    y, state = ssd_chunked(x, dt, A, B, C, chunk, seq_idx=seq_idx)
    start = 0
    for n in lengths:
        part = slice(start, start + n)
        y_ref, s_ref = ssm_scan_ref(x[:, part], dt[:, part], A, B[:, part], C[:, part])
        torch.testing.assert_close(y[:, part], y_ref, atol=1e-10, rtol=1e-10)
        start += n
    torch.testing.assert_close(state, s_ref, atol=1e-10, rtol=1e-10)  # the last sequence's state


def test_mixer_with_seq_idx_equals_each_sequence_alone_with_gradients():
    torch.manual_seed(0)
    m = Mamba2(d_model=16, d_state=8, d_conv=4, expand=2, headdim=8, ngroups=2, chunk_size=8).double()
    lengths = [6, 11, 2, 9]
    u = torch.randn(1, sum(lengths), 16, dtype=torch.float64, requires_grad=True)
    packed = m(u, seq_idx=_segments(lengths)[None])
    alone = torch.cat([m(part) for part in torch.split(u, lengths, dim=1)], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-10, rtol=1e-10)
    w = torch.randn_like(packed)
    g_packed = torch.autograd.grad((packed * w).sum(), [u, m.conv1d.weight, m.in_proj.weight])
    g_alone = torch.autograd.grad((alone * w).sum(), [u, m.conv1d.weight, m.in_proj.weight])
    for a, b in zip(g_packed, g_alone):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("rows", [[9, 1, 6], [9, 1, 6, 0, 11, 3, 4], None], ids=["few", "most", "every"])
def test_the_ssm_step_at_scattered_slots_matches_the_recurrence_row_by_row(compiled, rows):
    """ssm_step at a few rows of a larger store (depth batching's slots), most of them
    (eager: every row steps, the others by identity) or every row, eager and traced
    (its compiled form, one read and one write): each row's state follows
    S ← exp(dt A) S + dt x Bᵀ and y = S C + D x, written out per row and head, with
    groups sharing B and C; the other rows are untouched."""
    from looplab.models.ops.ssm_step import ssm_step

    torch.manual_seed(0)
    store, h, p, g, dstate = 12, 4, 2, 2, 5
    n = store if rows is None else len(rows)
    ssm = torch.randn(store, h, p, dstate, dtype=torch.float64)
    x, dt = torch.randn(n, h, p, dtype=torch.float64), torch.rand(n, h, dtype=torch.float64)
    A, D = -torch.rand(h, dtype=torch.float64), torch.randn(h, dtype=torch.float64)
    B, C = torch.randn(n, g, dstate, dtype=torch.float64), torch.randn(n, g, dstate, dtype=torch.float64)
    at = list(range(store)) if rows is None else rows
    expected, y_ref = ssm.clone(), torch.empty(n, h, p, dtype=torch.float64)
    for i, row in enumerate(at):
        for head in range(h):
            group = head // (h // g)
            S = torch.exp(dt[i, head] * A[head]) * expected[row, head] + dt[i, head] * torch.outer(
                x[i, head], B[i, group]
            )
            expected[row, head] = S
            y_ref[i, head] = S @ C[i, group] + D[head] * x[i, head]
    step = torch.compile(ssm_step, backend="aot_eager", fullgraph=True) if compiled else ssm_step
    y = step(ssm, x, dt, A, B, C, D, None if rows is None else torch.tensor(rows))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ssm, expected)  # the other rows too: unchanged
