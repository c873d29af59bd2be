"""Opt-in tier `kernels`: looplab's CUDA dispatch checked on a CPU.

`Mamba2._scan_cuda` is forced for CPU tensors and runs mamba-ssm 2.3.2.post1's own
Triton SSD kernels (`mamba_chunk_scan_combined`) under Triton's interpreter, with
causal-conv1d replaced by causal_conv1d_standin (the library's layout and dtype
checks restated, the conv computed in torch); it must match looplab's torch path,
forward and gradients of the input and every parameter, in fp32.

Set up once, then run (about a minute; the interpreter is slow):
    bash scripts/setup_kernel_tier.sh && python -m pytest -m kernels -q
The tier is off by default (pyproject's addopts deselect the `kernels` marker). It
installs nothing: without triton, einops or the mamba-ssm source it skips, saying so.
The source is looked up in $LOOPLAB_MAMBA_SSM_SRC, by default where the setup
script unpacks it. Everything that makes the kernels run on a CPU is patched here,
for this module only, never in looplab.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from causal_conv1d_standin import CausalConv1dStandIn, causal_conv1d_update_standin

from looplab.models.mamba2 import Mamba2
from looplab.models.ops import dispatch
from looplab.presets import PRESETS

pytestmark = pytest.mark.kernels

MAMBA_SSM_VERSION = "2.3.2.post1"
SRC_ENV = "LOOPLAB_MAMBA_SSM_SRC"
DEFAULT_SRC = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "looplab"
    / "kernel-tier"
    / f"mamba_ssm-{MAMBA_SSM_VERSION}"
)
SETUP = "bash scripts/setup_kernel_tier.sh"

RTOL = 1e-4  # fp32; the kernels' errors against a float64 recurrence are ~3e-6


def _modules(top: str) -> list[str]:
    return [n for n in sys.modules if n == top or n.startswith(top + ".")]


@pytest.fixture(scope="module")
def triton_chunk_scan():
    """mamba-ssm's `mamba_chunk_scan_combined`, imported from its source under
    TRITON_INTERPRET=1, with the CPU patches in place for this module's tests."""
    for module in ("triton", "einops"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: run `{SETUP}`")
    src = Path(os.environ.get(SRC_ENV) or DEFAULT_SRC)
    if not (src / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py").is_file():
        pytest.skip(f"no mamba-ssm {MAMBA_SSM_VERSION} source at {src}: run `{SETUP}` or set {SRC_ENV}")

    cuda_device, cuda_properties = torch.cuda.device, torch.cuda.get_device_properties

    def device(d):  # the kernels enter torch.cuda.device(x.device.index): None for CPU tensors
        return contextlib.nullcontext() if d is None else cuda_device(d)

    def get_device_properties(d=None):  # the backward sizes its grid by the SM count
        if torch.device(d if d is not None else "cpu").type == "cpu":
            return types.SimpleNamespace(multi_processor_count=4)
        return cuda_properties(d)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # read when the kernels are decorated: set before import
        mp.setenv("MAMBA_DETERMINISTIC", "1")  # one config per kernel: the autotuner's benchmark needs a GPU
        mp.setattr(torch.cuda, "device", device)
        mp.setattr(torch.cuda, "get_device_properties", get_device_properties)
        # triton's own @triton.jit helpers (tl.cdiv, ...) run in interpreted kernels only
        # if triton.language was imported under TRITON_INTERPRET=1, and torch may have
        # imported it already (torch.utils.flop_counter does): triton's Python modules
        # are imported afresh (its compiled extension stays: it cannot load twice), and
        # stay interpreted for the rest of this process (dropping them after kernels ran
        # makes nanobind report leaks at exit; nothing else here runs triton kernels).
        for name in _modules("triton"):
            if not name.startswith("triton._C"):
                del sys.modules[name]
        # A bare package object instead of mamba_ssm/__init__.py, which imports the CUDA
        # extension; an installed mamba_ssm is set aside until the module ends.
        for name in _modules("mamba_ssm"):
            mp.delitem(sys.modules, name)
        package = types.ModuleType("mamba_ssm")
        package.__path__ = [str(src / "mamba_ssm")]
        mp.setitem(sys.modules, "mamba_ssm", package)
        try:
            with warnings.catch_warnings():  # deterministic mode's advice on cached autotuning
                warnings.filterwarnings("ignore", "Deterministic mode", UserWarning)
                from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
            yield mamba_chunk_scan_combined
        finally:
            for name in _modules("mamba_ssm"):
                del sys.modules[name]


def _mixer(**shape) -> Mamba2:
    torch.manual_seed(0)
    m = Mamba2(**shape)
    with torch.no_grad():  # off the init, so that every parameter matters
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


_PHOP_DEBUG = PRESETS["phop-debug"]().model
SHAPES = {
    # The preset whose in_proj width (164) the raw xBC slice failed on.
    "phop-debug": dict(
        d_model=_PHOP_DEBUG.d_model,
        d_state=_PHOP_DEBUG.d_state,
        d_conv=_PHOP_DEBUG.d_conv,
        expand=_PHOP_DEBUG.expand,
        headdim=_PHOP_DEBUG.headdim,
        ngroups=_PHOP_DEBUG.ngroups,
        chunk_size=_PHOP_DEBUG.chunk_size,
    ),
    # in_proj width 152: xBC is used in place; two groups of B/C.
    "in-place": dict(d_model=32, d_state=8, d_conv=4, expand=2, headdim=8, ngroups=2, chunk_size=8),
    # 44 conv channels: padded to 48 for causal-conv1d.
    "padded": dict(d_model=16, d_state=6, d_conv=3, expand=2, headdim=8, ngroups=1, chunk_size=8),
}


def _run(m: Mamba2, u, seq_idx, weights):
    out = m(u, seq_idx=seq_idx)
    params = [u] + list(m.parameters())
    return [out] + list(torch.autograd.grad((out * weights).sum(), params))


@pytest.mark.parametrize("packed", [False, True], ids=["one-sequence", "seq_idx"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_cuda_dispatch_matches_torch_path(triton_chunk_scan, monkeypatch, shape, packed):
    m = _mixer(**SHAPES[shape])
    bsz, lengths = 2, [5, 19, 1, 12]  # sequences across chunk boundaries, one of length 1
    seqlen = sum(lengths)
    gen = torch.Generator().manual_seed(1)
    u = torch.randn(bsz, seqlen, m.d_model, generator=gen, requires_grad=True)
    weights = torch.randn(bsz, seqlen, m.d_model, generator=gen)
    seq_idx = None
    if packed:  # the second row is packed differently
        first = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        second = torch.cat([torch.full((n,), i) for i, n in enumerate([20, 17])])
        seq_idx = torch.stack([first, second])

    expected = _run(m, u, seq_idx, weights)  # the torch path (CPU tensors)
    conv = CausalConv1dStandIn()
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t: True)
    monkeypatch.setattr(dispatch, "cuda_scan_kernels", lambda: (conv, triton_chunk_scan))
    got = _run(m, u, seq_idx, weights)
    assert len(conv.calls) == 1 and conv.calls[0][3] == packed

    names = ["output", "grad u"] + [f"grad {n}" for n, _ in m.named_parameters()]
    errors = {}
    for name, g, e in zip(names, got, expected):
        errors[name] = ((g - e).abs().max() / e.abs().max()).item()
        torch.testing.assert_close(g, e, rtol=RTOL, atol=RTOL * e.abs().max().item(), msg=lambda s, n=name: f"{n}: {s}")
    print(
        f"{shape} {'seq_idx' if packed else 'one sequence'}: max error / max |value|: "
        + ", ".join(f"{n} {v:.1e}" for n, v in errors.items())
    )


@pytest.fixture(scope="module")
def triton_state_update(triton_chunk_scan):
    """mamba-ssm's single-token `selective_state_update`, under the same CPU patches."""
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update

    return selective_state_update


@pytest.mark.parametrize("packed", [False, True], ids=["every-row", "packed-rows"])
@pytest.mark.parametrize("shape", ["in-place", "padded"])
def test_cuda_decode_step_matches_torch_step(triton_state_update, monkeypatch, shape, packed):
    """Mamba2.step through mamba-ssm's Triton state update and a causal_conv1d_update
    stand-in (the decoding kernels, with their gather/scatter by row index) against
    the torch step: outputs and both updated states."""
    from causal_conv1d_standin import causal_conv1d_update_standin

    from looplab.models.cache import BlockCache, Layout

    m = _mixer(**SHAPES[shape])
    gen = torch.Generator().manual_seed(2)
    batch, rows = 5, (torch.tensor([0, 2, 3]) if packed else None)
    n = 3 if packed else batch
    u = torch.randn(n, 1, m.d_model, generator=gen)
    start = m.new_state(batch, 0, "cpu", torch.float32)
    start.conv.normal_(generator=gen)
    start.ssm.normal_(generator=gen)

    def step():
        state = type(start)(start.conv.clone(), start.ssm.clone())
        with torch.no_grad():
            return m(u, cache=BlockCache(state, Layout.one_token(rows))), state

    expected, expected_state = step()  # the torch step
    monkeypatch.setattr(dispatch, "use_cuda_step_kernels", lambda t: True)
    monkeypatch.setattr(dispatch, "cuda_step_kernels", lambda: (causal_conv1d_update_standin, triton_state_update))
    got, got_state = step()
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())
    torch.testing.assert_close(got_state.conv, expected_state.conv, rtol=0, atol=0)
    torch.testing.assert_close(
        got_state.ssm, expected_state.ssm, rtol=RTOL, atol=RTOL * expected_state.ssm.abs().max().item()
    )
    if packed:  # rows that did not run keep their states
        assert torch.equal(got_state.ssm[[1, 4]], start.ssm[[1, 4]])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cuda_path_saves_what_the_memory_model_counts(triton_chunk_scan, monkeypatch, shape):
    """looplab/costs/memory.py's per-token count for a Mamba-2 block on the fused path (fp32
    here, so no autocast copies) against the tensors autograd actually keeps when the
    block runs through mamba-ssm's scan and the causal-conv1d stand-in (which saves
    what the library saves)."""
    from test_memory import saved_bytes

    from looplab.config import ModelConfig
    from looplab.costs.memory import mamba2_block
    from looplab.models.layers import Residual

    s = SHAPES[shape]
    cfg = ModelConfig(vocab_size=64, n_layers=1, n_loops=1, **{k: v for k, v in s.items()})
    torch.manual_seed(0)
    block = Residual(s["d_model"], _mixer(**s), 1e-5)
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t: True)
    monkeypatch.setattr(dispatch, "cuda_scan_kernels", lambda: (CausalConv1dStandIn(), triton_chunk_scan))
    bsz, seqlen = 2, 24
    u = torch.randn(bsz, seqlen, s["d_model"], requires_grad=True)
    counted = saved_bytes(block.parameters(), lambda: block(u)) / (bsz * seqlen)
    assert mamba2_block(cfg, seqlen, "cuda", 4) == pytest.approx(counted, rel=0.02)


def test_the_doctors_scan_check_passes_on_the_triton_kernels(triton_chunk_scan, monkeypatch):
    """`looplab doctor`'s correctness check of the scan (looplab/doctor/kernels.py), run on
    mamba-ssm's own kernels: forward and every gradient, without and with seq_idx."""
    import looplab.doctor as doctor

    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t: not dispatch.torch_forced())
    monkeypatch.setattr(dispatch, "cuda_scan_kernels", lambda: (CausalConv1dStandIn(), triton_chunk_scan))
    checks = doctor.scan_check(torch.device("cpu"), torch.float32)
    assert [c.status for c in checks] == [doctor.PASS, doctor.PASS], [c.line() for c in checks]


def test_the_doctors_step_check_passes_on_the_triton_kernel(triton_state_update, monkeypatch):
    """`looplab doctor`'s decode-step check on mamba-ssm's selective_state_update (and the
    causal_conv1d_update stand-in): outputs and both states over five tokens."""
    import looplab.doctor as doctor

    monkeypatch.setattr(dispatch, "use_cuda_step_kernels", lambda t: not dispatch.torch_forced())
    monkeypatch.setattr(dispatch, "cuda_step_kernels", lambda: (causal_conv1d_update_standin, triton_state_update))
    (check,) = doctor.step_check(torch.device("cpu"), torch.float32, kernel="cuda")
    assert check.status == doctor.PASS, check.line()
