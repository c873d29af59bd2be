"""A GPU node with mamba-ssm's Triton kernels but no causal-conv1d build runs the conv in
torch, through causal-conv1d's own calling conventions (ops/conv.py), so the CUDA path
reads the same either way. Checked here against causal-conv1d's definition
(ops/reference.py's causal_conv1d_ref) and, for a whole Mamba-2 block, against the
torch path, with the dispatch forced onto CPU tensors."""

import pytest
import torch

from looplab.models.mamba2 import Mamba2
from looplab.models.ops import dispatch
from looplab.models.ops.causal_conv1d_layout import causal_conv1d_inputs
from looplab.models.ops.conv import causal_conv1d_fn_torch, causal_conv1d_update_torch
from looplab.models.ops.reference import causal_conv1d_ref, mamba_chunk_scan_combined_ref


def _seq_idx(bsz, lengths):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)]).expand(bsz, -1)


@pytest.mark.parametrize("lengths", [[7], [3, 4]])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_the_sequence_conv_keeps_causal_conv1d_fn_s_contract(lengths, activation):
    torch.manual_seed(0)
    c, k = 12, 4
    # A slice of a wider projection, as Mamba2 hands it over (channel-last, padded to 8).
    xBC = torch.randn(2, sum(lengths), 40)[..., 5 : 5 + c]
    x, weight, bias = causal_conv1d_inputs(xBC, torch.randn(c, 1, k), torch.randn(c))
    seq_idx = _seq_idx(2, lengths) if len(lengths) > 1 else None
    out = causal_conv1d_fn_torch(x, weight, bias, seq_idx=seq_idx, activation=activation)
    ref = causal_conv1d_ref(x, weight, bias, seq_idx=seq_idx, activation=activation)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, ref)


def test_the_update_steps_through_the_sequence_conv_in_the_rows_it_names():
    torch.manual_seed(1)
    batch, c, k, steps = 3, 8, 4, 6
    x = torch.randn(batch, c, steps)
    weight, bias = torch.randn(c, k), torch.randn(c)
    ref = causal_conv1d_ref(x, weight, bias, activation="silu")  # (batch, c, steps)
    storage = torch.zeros(batch, k - 1, c)  # time-major, as looplab's cache keeps it
    rows = torch.tensor([2, 0], dtype=torch.int32)  # row 1 is never stepped: its state stays zero
    for t in range(steps):
        out = causal_conv1d_update_torch(
            x[rows.long(), :, t], storage.transpose(1, 2), weight, bias, "silu", conv_state_indices=rows
        )
        torch.testing.assert_close(out, ref[rows.long(), :, t])
    assert storage[1].abs().sum() == 0
    torch.testing.assert_close(storage[2], x[2, :, -(k - 1) :].t())


def test_without_causal_conv1d_the_cuda_path_keeps_the_triton_kernels(monkeypatch):
    def fake_import(*names):
        module = names[0][0]
        if module == "causal_conv1d":
            dispatch.IMPORT_ERRORS[module] = "ModuleNotFoundError: No module named 'causal_conv1d'"
            return None
        return (f"{module}.{names[0][1]}",)

    monkeypatch.setattr(dispatch, "_guarded_import", fake_import)
    dispatch.cuda_scan_kernels.cache_clear()
    dispatch.cuda_step_kernels.cache_clear()
    try:
        assert dispatch.cuda_scan_kernels() == (
            causal_conv1d_fn_torch,
            "mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined",
        )
        assert dispatch.cuda_step_kernels()[0] is causal_conv1d_update_torch
        assert "torch conv (causal-conv1d: ModuleNotFoundError" in dispatch.conv_implementation()
        assert "torch conv (causal-conv1d: ModuleNotFoundError" in dispatch.conv_implementation(step=True)
    finally:
        dispatch.cuda_scan_kernels.cache_clear()
        dispatch.cuda_step_kernels.cache_clear()
        dispatch.IMPORT_ERRORS.pop("causal_conv1d", None)


@pytest.mark.parametrize("lengths", [[10], [4, 6]])
def test_a_block_on_the_cuda_path_with_the_torch_conv_matches_the_torch_path(lengths, monkeypatch):
    torch.manual_seed(2)
    m = Mamba2(d_model=32, d_state=8, headdim=8, chunk_size=4).double()
    u = torch.randn(2, sum(lengths), 32, dtype=torch.float64, requires_grad=True)
    seq_idx = _seq_idx(2, lengths).long() if len(lengths) > 1 else None

    def run():
        u.grad = None
        for p in m.parameters():
            p.grad = None
        y = m(u, seq_idx=seq_idx)
        (y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype)).sum().backward()
        return [y.detach(), u.grad.clone()] + [p.grad.clone() for p in m.parameters()]

    reference = run()  # the torch path: CPU tensors never take the CUDA branch
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t: True)
    monkeypatch.setattr(dispatch, "cuda_scan_kernels", lambda: (causal_conv1d_fn_torch, mamba_chunk_scan_combined_ref))
    for got, want in zip(run(), reference):
        torch.testing.assert_close(got, want)
