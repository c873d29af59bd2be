"""The C++ conv and scan of a compiled CPU run (looplab/models/cpu/cpu_sequence.py), forward
and backward, against the oracles written from their definitions (models/ops/
reference.py's ssm_scan_ref and causal_conv1d_ref, differentiated by autograd) and
against a packed row's sequences run one at a time. Skipped where no C++ toolchain can
build them; the first test builds them (~35 s, cached by torch)."""

import shutil

import pytest
import torch

from looplab.models import compiled
from looplab.models.cpu import cpu_sequence, native
from looplab.models.mamba2 import Mamba2
from looplab.models.ops import dispatch
from looplab.models.ops.reference import causal_conv1d_ref, ssm_scan_ref

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not (shutil.which("c++") or shutil.which("g++")) or not shutil.which("ninja"),
        reason="no C++ compiler or ninja to build the CPU sequence kernels",
    ),
]


def inputs(batch, length, heads, headdim, groups, d_state, seed=0):
    g = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64, generator=g)
    return (
        torch.randn(batch, length, heads, headdim, **f64),
        torch.rand(batch, length, heads, **f64) * 0.5 + 0.01,  # dt > 0
        -(torch.rand(heads, **f64) * 2 + 0.1),  # A < 0
        torch.randn(batch, length, groups, d_state, **f64),
        torch.randn(batch, length, groups, d_state, **f64),
    )


def grads(fn, tensors, weights):
    """fn's outputs, and the gradients of Σ output · weight with respect to `tensors`."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    outputs = fn(*leaves)
    sum(((o * w).sum() for o, w in zip(outputs, weights)), torch.zeros((), dtype=torch.float64)).backward()
    return [o.detach() for o in outputs], [t.grad for t in leaves]


# 75 tokens: two full spans of the backward's checkpoints and a partial one. The kernel is
# compiled for common (d_state, headdim) pairs (16, 16), for common d_states alone (16, 3),
# and for any size (5, 3); 2 groups share B and C by head.
@pytest.mark.parametrize("groups,d_state,headdim", [(1, 16, 16), (1, 16, 3), (2, 5, 3)])
def test_the_kernel_follows_the_recurrence_and_its_gradients(groups, d_state, headdim):
    x, dt, A, B, C = inputs(2, 75, 4, headdim, groups, d_state)
    init = torch.randn(2, 4, headdim, d_state, dtype=torch.float64)
    weights = [
        torch.randn(2, 75, 4, headdim, dtype=torch.float64),
        torch.randn(2, 4, headdim, d_state, dtype=torch.float64),
    ]
    want, want_grads = grads(ssm_scan_ref, (x, dt, A, B, C, init), weights)
    got, got_grads = grads(
        lambda *t: cpu_sequence.ssm_scan(*t[:5], initial_state=t[5]), (x, dt, A, B, C, init), weights
    )
    for name, g, w in zip(("y", "final state"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=name)
    for name, g, w in zip(("x", "dt", "A", "B", "C", "initial state"), got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=f"d{name}")


def test_packed_sequences_scan_as_if_alone():
    """seq_idx packs sequences into a row: each starts from a zero state and passes no
    gradient back to the one before, so the packed row's outputs and gradients are those
    of each sequence scanned on its own (sequences cut mid-span and at a span's start)."""
    lengths = [20, 12, 33, 10]  # starts at 0, 20, 32 (a checkpoint), 65
    x, dt, A, B, C = inputs(1, sum(lengths), 4, 3, 2, 5)
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]
    weight = torch.randn(1, sum(lengths), 4, 3, dtype=torch.float64)
    (y,), packed = grads(lambda *t: cpu_sequence.ssm_scan(*t, seq_idx=seq_idx)[:1], (x, dt, A, B, C), [weight])
    start = 0
    dA = torch.zeros_like(A)
    for n in lengths:
        part = slice(start, start + n)
        pieces = [t[:, part] for t in (x, dt)] + [A] + [t[:, part] for t in (B, C)]
        (y_alone,), alone = grads(lambda *t: ssm_scan_ref(*t)[:1], pieces, [weight[:, part]])
        torch.testing.assert_close(y[:, part], y_alone, rtol=1e-10, atol=1e-10)
        for got, want in zip([g[:, part] for g in (packed[0], packed[1], packed[3], packed[4])], alone[:2] + alone[3:]):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        dA += alone[2]
        start += n
    torch.testing.assert_close(packed[2], dA, rtol=1e-10, atol=1e-10)


def conv_silu_ref(x, weight, bias, seq_idx=None):
    """The conv from its windows, then SiLU, on channels-last x (b, l, c)."""
    return causal_conv1d_ref(x.transpose(1, 2), weight[:, 0], bias, seq_idx, activation="silu").transpose(1, 2)


# 70 channels: a full block of the kernel's 64 and a partial one; sequences that start
# one token before a row's end and two tokens after another's start (taps cut short).
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_conv_follows_its_windows_and_their_gradients(with_bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 37, 70, dtype=torch.float64, generator=g)
    weight = torch.randn(70, 1, 4, dtype=torch.float64, generator=g)
    bias = torch.randn(70, dtype=torch.float64, generator=g) if with_bias else None
    dy = torch.randn(3, 37, 70, dtype=torch.float64, generator=g)
    packed = torch.tensor([[0] * 10 + [1] * 2 + [2] * 25, [0] * 37, [0] * 36 + [1]])
    for seq_idx in (None, packed):
        tensors = (x, weight) + ((bias,) if with_bias else ())
        (want,), want_grads = grads(
            lambda x, w, *b, s=seq_idx: (conv_silu_ref(x, w, *(b or [None]), s),), tensors, [dy]
        )
        (got,), got_grads = grads(
            lambda x, w, *b, s=seq_idx: (cpu_sequence.conv_silu(x, w, *(b or [None]), s),), tensors, [dy]
        )
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        for name, gr, w in zip(("x", "weight", "bias"), got_grads, want_grads):
            torch.testing.assert_close(gr, w, rtol=1e-10, atol=1e-10, msg=f"d{name}")


def test_the_operators_are_registered_for_compilation():
    """looplab::ssm_scan's and looplab::conv_silu's fake (shape) functions and autograd
    agree with the kernels, as dynamo and AOT autograd need them to."""
    x, dt, A, B, C = inputs(2, 40, 4, 3, 2, 5)
    torch.library.opcheck(torch.ops.looplab.ssm_scan, (x, dt, A, B, C, None, torch.randn(2, 4, 3, 5).double()))
    seq_idx = torch.tensor([[0] * 15 + [1] * 25, [0] * 40])
    torch.library.opcheck(torch.ops.looplab.ssm_scan, (x.requires_grad_(), dt, A, B, C, seq_idx, None))
    u, w = torch.randn(2, 40, 6, dtype=torch.float64, requires_grad=True), torch.randn(6, 1, 4, dtype=torch.float64)
    torch.library.opcheck(torch.ops.looplab.conv_silu, (u, w, torch.randn(6, dtype=torch.float64), seq_idx))
    torch.library.opcheck(torch.ops.looplab.conv_silu, (u, w.requires_grad_(), None, None))


def test_a_block_with_the_kernels_matches_the_torch_ops():
    """A Mamba-2 block running the kernels gives the torch ops' outputs and parameter
    gradients, for dense and packed rows (the two ways training calls it)."""
    torch.manual_seed(0)
    block = Mamba2(d_model=16, d_state=16, headdim=8, chunk_size=8).double()
    u = torch.randn(2, 37, 16, dtype=torch.float64)
    for seq_idx in (None, torch.tensor([[0] * 10 + [1] * 27, [0] * 30 + [1] * 7])):
        results = []
        for kernels in (False, True):
            block.cpu_kernels = kernels
            block.zero_grad()
            out = block(u, seq_idx=seq_idx)
            out.pow(2).sum().backward()
            results.append((out.detach(), {n: p.grad.clone() for n, p in block.named_parameters()}))
        (torch_out, torch_grads), (kernel_out, kernel_grads) = results
        torch.testing.assert_close(kernel_out, torch_out, rtol=1e-9, atol=1e-9)
        for name, g in torch_grads.items():
            torch.testing.assert_close(kernel_grads[name], g, rtol=1e-9, atol=1e-9, msg=name)


def test_a_second_copy_of_the_module_keeps_the_operators_it_found(tmp_path):
    """An exported Hugging Face folder carries the model's source but not its C++: its copy
    of this module, loaded beside looplab, must leave the operators that can build."""
    import importlib.util
    import shutil as sh

    sh.copy(cpu_sequence.__file__, tmp_path / "copied_cpu_sequence.py")  # no .cpp beside it
    spec = importlib.util.spec_from_file_location("copied_cpu_sequence", tmp_path / "copied_cpu_sequence.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    x, dt, A, B, C = inputs(1, 9, 2, 3, 1, 4)
    torch.testing.assert_close(cpu_sequence.ssm_scan(x, dt, A, B, C)[0], ssm_scan_ref(x, dt, A, B, C)[0])


def test_a_compiled_cpu_run_uses_the_kernels_unless_torch_is_forced(monkeypatch):
    from test_hf_export import tiny_model

    model = tiny_model("mamba2")
    blocks = [m for m in model.modules() if isinstance(m, Mamba2)]
    assert compiled.compile_backbone(model, "on", torch.device("cpu"))
    assert blocks and all(b.cpu_kernels for b in blocks)
    compiled.compile_backbone(model, "off", torch.device("cpu"))
    assert not any(b.cpu_kernels for b in blocks)  # eager runs keep the torch ops
    monkeypatch.setenv("LOOPLAB_FORCE_TORCH", "1")
    compiled.compile_backbone(model, "on", torch.device("cpu"))
    assert not any(b.cpu_kernels for b in blocks)


def test_the_doctor_says_whether_compiled_cpu_runs_get_the_kernels(monkeypatch):
    from looplab import doctor

    check = doctor.cpu_sequence_kernels()
    assert check.status == doctor.PASS and "cpu_sequence" in check.figure
    monkeypatch.setenv("LOOPLAB_FORCE_TORCH", "1")
    check = doctor.cpu_sequence_kernels()
    assert check.status == doctor.SKIP and "LOOPLAB_FORCE_TORCH=1" in check.reason
    monkeypatch.delenv("LOOPLAB_FORCE_TORCH")

    def no_compiler():
        raise RuntimeError("c++: not found\nmore")

    monkeypatch.setattr(cpu_sequence, "kernel", no_compiler)
    check = doctor.cpu_sequence_kernels()
    assert check.status == doctor.SKIP and check.reason.startswith("did not build (c++: not found)")


def test_kernels_that_cannot_build_warn_once_and_leave_the_torch_ops(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension 'looplab_cpu_sequence'\nc++: not found")

    monkeypatch.setattr(native, "build", no_compiler)
    cpu_sequence.kernel.cache_clear()
    cpu_sequence.available.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"did not build \(Error building extension 'looplab_cpu_sequence'\)"):
            assert not cpu_sequence.available()
        assert not dispatch.cpu_sequence_kernels_serve()
    finally:
        cpu_sequence.kernel.cache_clear()
        cpu_sequence.available.cache_clear()


def test_bad_inputs_name_the_problem():
    x, dt, A, B, C = inputs(1, 8, 4, 3, 2, 5)
    with pytest.raises(ValueError, match="initial_state with seq_idx"):
        cpu_sequence.ssm_scan(
            x, dt, A, B, C, seq_idx=torch.zeros(1, 8, dtype=torch.long), initial_state=torch.zeros(1, 4, 3, 5)
        )
    with pytest.raises(RuntimeError, match=r"dt has shape \[1, 8, 3\], expected \[1, 8, 4\]"):
        cpu_sequence.ssm_scan(x, dt[..., :3], A, B, C)
    with pytest.raises(RuntimeError, match="heads must split into groups"):
        cpu_sequence.ssm_scan(x, dt, A, torch.cat([B, B[:, :, :1]], 2), torch.cat([C, C[:, :, :1]], 2))
    with pytest.raises(RuntimeError, match=r"conv weight has shape \[5, 1, 4\], expected \[6, 1, 4\]"):
        cpu_sequence.conv_silu(
            torch.zeros(1, 8, 6, dtype=torch.float64), torch.zeros(5, 1, 4, dtype=torch.float64), None
        )
