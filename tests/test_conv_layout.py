"""The CUDA path's conv input against causal-conv1d's layout rules, without a GPU.

`Mamba2._scan_cuda` hands the conv to causal-conv1d, which rejects (at the first
forward, on a GPU) a channel-last input whose strides are not multiples of 8. Here
the dispatch is forced on CPU/meta tensors with the kernels replaced by stand-ins:
causal_conv1d_standin restates the library's checks, so every preset's mixers, run
forward and backward on the meta device, must hand it tensors a GPU would accept.
"""

import pytest
import torch
from causal_conv1d_standin import CausalConv1dCheckError, CausalConv1dStandIn, check_forward

from looplab.models.looped import LoopedLM
from looplab.models.mamba2 import Mamba2
from looplab.models.ops import dispatch
from looplab.models.ops.causal_conv1d_layout import causal_conv1d_inputs
from looplab.models.ops.reference import mamba_chunk_scan_combined_ref
from looplab.presets import PRESETS


def _meta_scan(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    dt_softplus=False,
    **unused,
):
    """mamba_chunk_scan_combined's output shape on meta tensors; it touches every input
    so that gradients reach the conv, whose backward layout is checked too."""
    return x * 1 + (dt.sum() + B.sum() + C.sum() + D.sum() + dt_bias.sum()) * 0


def _force_cuda_dispatch(monkeypatch, conv, scan):
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t: True)
    monkeypatch.setattr(dispatch, "cuda_scan_kernels", lambda: (conv, scan))


def _segments(bsz, lengths):
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]).expand(bsz, -1)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_hands_causal_conv1d_an_accepted_layout(name, monkeypatch):
    cfg = PRESETS[name]().model
    with torch.device("meta"):
        model = LoopedLM(cfg)
    mixers = [m for m in model.modules() if isinstance(m, Mamba2)]
    conv = CausalConv1dStandIn()
    _force_cuda_dispatch(monkeypatch, conv, _meta_scan)
    for m in mixers:
        for bsz, lengths in ((2, [5]), (2, [2, 3]), (1, [1])):  # size-1 dims: strides still count
            seqlen = sum(lengths)
            seq_idx = _segments(bsz, lengths).to("meta") if len(lengths) > 1 else None
            u = torch.empty(bsz, seqlen, cfg.d_model, device="meta", requires_grad=True)
            calls = len(conv.calls)
            m(u, seq_idx=seq_idx).sum().backward()  # the stand-in checks forward and backward
            assert len(conv.calls) == calls + 1, "the forced dispatch did not reach causal_conv1d_fn"
            assert conv.calls[-1][3] == (seq_idx is not None)


def test_the_stand_in_rejects_what_causal_conv1d_rejects():
    # phop-debug's in_proj width 164: the raw slice, as _scan_cuda passed it before.
    d_inner, conv_dim = 64, 96
    zxbcdt = torch.randn(2, 5, 164)
    xBC = zxbcdt[..., d_inner : d_inner + conv_dim]
    w, b = torch.randn(conv_dim, 4), torch.randn(conv_dim)
    seq = torch.zeros(2, 5, dtype=torch.int32)
    with pytest.raises(CausalConv1dCheckError, match="multiples of 8"):
        check_forward(xBC.transpose(1, 2), w, b)
    with pytest.raises(CausalConv1dCheckError, match="channel last"):  # channel-first + seq_idx
        check_forward(xBC.transpose(1, 2).contiguous(), w, b, seq)
    ok = xBC.contiguous().transpose(1, 2)
    check_forward(ok, w, b, seq)
    with pytest.raises(CausalConv1dCheckError, match="int32"):
        check_forward(ok, w, b, seq.long())
    with pytest.raises(CausalConv1dCheckError, match="dim % 8"):
        check_forward(ok[:, :92], w[:92], b[:92], seq)
    with pytest.raises(CausalConv1dCheckError, match="16-byte"):  # strides fit, starts 8 bytes in
        check_forward(torch.randn(2, 5, 104)[..., 2:98].transpose(1, 2), w, b)
    with pytest.raises(CausalConv1dCheckError, match="float32"):
        check_forward(ok.double(), w, b)


@pytest.mark.parametrize(
    "width,offset,dim,copies",
    [
        (152, 64, 80, False),  # already fits: used in place, as mamba-ssm's ensure_stride does
        (164, 64, 96, True),  # phop-debug: row stride 164
        (160, 4, 96, True),  # strides fit, start misaligned
        (80, 32, 44, True),  # 44 channels: padded to 48
    ],
)
def test_conv_inputs_layout(width, offset, dim, copies):
    for bsz, seqlen in ((2, 7), (1, 1)):
        zxbcdt = torch.randn(bsz, seqlen, width, requires_grad=True)
        xBC = zxbcdt[..., offset : offset + dim]
        weight, bias = torch.randn(dim, 1, 4), torch.randn(dim)
        x, w, b = causal_conv1d_inputs(xBC, weight, bias)
        dim8 = -(-dim // 8) * 8
        assert x.shape == (bsz, dim8, seqlen) and w.shape == (dim8, 4) and b.shape == (dim8,)
        check_forward(x, w, b, torch.zeros(bsz, seqlen, dtype=torch.int32))
        assert (x.data_ptr() == xBC.data_ptr()) == (not copies)
        torch.testing.assert_close(x[:, :dim], xBC.transpose(1, 2), rtol=0, atol=0)
        assert not x[:, dim:].any() and not w[dim:].any() and not b[dim:].any()
        torch.testing.assert_close(w[:dim], weight[:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("d_state,headdim", [(8, 8), (6, 8)])  # in_proj widths 84 (copied), 80 (44 channels, padded)
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_dispatch_with_reference_kernels_matches_torch_path(monkeypatch, d_state, headdim, packed):
    """The wiring of _scan_cuda (conv layout, padding, seq_idx, dt_bias, D) in fp32,
    forward and gradients, with both kernels replaced by torch references."""
    torch.manual_seed(0)
    m = Mamba2(d_model=16, d_state=d_state, d_conv=4, expand=2, headdim=headdim, ngroups=1, chunk_size=4)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    u = torch.randn(2, 11, 16, requires_grad=True)
    seq_idx = _segments(2, [3, 6, 2]) if packed else None
    w = torch.randn(2, 11, 16)
    params = [u] + list(m.parameters())

    ref = m(u, seq_idx=seq_idx)
    g_ref = torch.autograd.grad((ref * w).sum(), params)
    conv = CausalConv1dStandIn()
    _force_cuda_dispatch(monkeypatch, conv, mamba_chunk_scan_combined_ref)
    out = m(u, seq_idx=seq_idx)
    g_out = torch.autograd.grad((out * w).sum(), params)
    assert len(conv.calls) == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip([("u", None)] + list(m.named_parameters()), g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda s, n=name: f"gradient of {n}: {s}")
