"""The compiled CPU step kernel (looplab/models/cpu/cpu_step.py, opt-in with
LOOPLAB_CPU_STEP_KERNEL=1): checked against the Mamba-2 mixer written from its
definition (models/ops/reference.py) and, through decoding, against the full forward.
Skipped where no C++ toolchain can build it; the first test builds it (~25 s, cached
by torch)."""

import shutil

import pytest
import torch
from test_decode import batch, decode_token_by_token_against_the_full_forward, full_forward, model_for, policies
from test_depth_batching import teacher_forced

from looplab.models.cache import BlockCache, Layout, MambaState
from looplab.models.cpu import cpu_step
from looplab.models.mamba2 import Mamba2
from looplab.models.ops.dispatch import step_implementation
from looplab.models.ops.reference import mamba2_mixer_ref

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not (shutil.which("c++") or shutil.which("g++")) or not shutil.which("ninja"),
        reason="no C++ compiler or ninja to build the CPU step kernel",
    ),
]


@pytest.fixture
def kernel_on(monkeypatch):
    """The kernel requested, and every call of it counted (so a test knows it ran)."""
    monkeypatch.setenv(cpu_step.CPU_STEP_KERNEL_ENV, "1")
    built = cpu_step.kernel()
    calls = []

    class Counting:
        def mamba2_step(self, *args):
            calls.append(args[0].shape[0])
            return built.mamba2_step(*args)

    monkeypatch.setattr(cpu_step, "kernel", lambda: Counting())
    return calls


@pytest.mark.slow  # the kernel's C++ build: 47 s on 2 cores (.ci/run's slow tier)
@pytest.mark.parametrize("ngroups", [1, 2])
def test_kernel_steps_match_the_mixer_written_from_its_definition(kernel_on, ngroups):
    """Three sequences stepped token by token from zero states at scattered slots of a
    larger storage: each step's output is the definitional mixer's at that position,
    and the other slots' states are never touched."""
    torch.manual_seed(0)
    m = Mamba2(d_model=16, d_state=6, d_conv=4, expand=2, headdim=4, ngroups=ngroups).double()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)  # not all ones, so the norm's weight is checked too
        m.D.uniform_(-1, 1)
    u = torch.randn(3, 9, 16, dtype=torch.float64)
    ref = mamba2_mixer_ref(m, u)
    slots = torch.tensor([5, 0, 3])
    state = MambaState(
        conv=torch.randn(7, 3, m.conv_dim, dtype=torch.float64),
        ssm=torch.randn(7, m.nheads, m.headdim, m.d_state, dtype=torch.float64),
    )
    state.conv[slots] = 0
    state.ssm[slots] = 0
    others = [s for s in range(7) if s not in slots.tolist()]
    before = state.conv[others].clone(), state.ssm[others].clone()
    with torch.no_grad():
        for t in range(9):
            out = m.step(u[:, t : t + 1], BlockCache(state, Layout.one_token(slots)))
            torch.testing.assert_close(out[:, 0], ref[:, t], atol=1e-12, rtol=1e-10)
    assert kernel_on == [3] * 9
    assert torch.equal(state.conv[others], before[0]) and torch.equal(state.ssm[others], before[1])


@pytest.mark.slow  # the kernel's C++ build: 47 s on 2 cores (.ci/run's slow tier)
@pytest.mark.parametrize("arch", ["mamba2", "mamba2-2groups", "hybrid"])
@pytest.mark.parametrize("spec", ["skip:given", "dense:0.5", "skip:0.5"])
def test_decoding_with_the_kernel_reproduces_the_full_forward(kernel_on, arch, spec):
    """Lockstep decoding (rows joining at different positions, running tokens packed
    per loop) and depth batching (rows at different loops in one step, by slot):
    every position's logits and exit step are the full forward's."""
    m = model_for(arch, seed=2)
    ids, _ = batch(seed=5, bsz=3, width=16)
    policy = policies(*ids.shape, seed=1)[spec]
    decode_token_by_token_against_the_full_forward(m, ids, policy)
    lockstep_calls = len(kernel_on)
    assert lockstep_calls > 0

    start = torch.tensor([1, 4, 7])
    seen, _ = teacher_forced(m, ids, start, policy)
    ref = full_forward(m, ids, policy, "hole")
    assert len(seen) == int((16 - start).sum())  # every fed position, once
    for (b, t), (logits, exit_step, _) in seen.items():
        torch.testing.assert_close(logits, ref.logits[b, t], atol=1e-10, rtol=1e-10)
        assert exit_step == int(ref.exit_step[b, t])
    assert len(kernel_on) > lockstep_calls


def test_the_kernel_runs_only_where_asked_and_applicable(monkeypatch):
    """Off unless requested; under autograd, in bf16 or on non-contiguous states the
    torch step runs; step_implementation (the benchmark's record) says which runs."""
    x32 = torch.zeros(2, 3)
    monkeypatch.delenv(cpu_step.CPU_STEP_KERNEL_ENV, raising=False)
    assert not cpu_step.applies(x32, x32, x32) and step_implementation(x32) == "torch"
    monkeypatch.setenv(cpu_step.CPU_STEP_KERNEL_ENV, "1")
    assert step_implementation(x32) == "cpu-kernel"
    assert step_implementation(x32.bfloat16()) == "torch"
    with torch.no_grad():
        assert cpu_step.applies(x32, x32, x32)
        assert not cpu_step.applies(x32.bfloat16(), x32.bfloat16(), x32)  # a bf16 model keeps an fp32 SSM state
        assert not cpu_step.applies(x32, x32.t(), x32)  # states must be contiguous for in-place slots
    assert not cpu_step.applies(x32, x32, x32)  # grad enabled: the kernel has no backward


def test_a_failed_build_is_a_one_line_error_naming_the_switch(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension 'looplab_cpu_step'\nc++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    cpu_step.kernel.cache_clear()
    try:
        with pytest.raises(
            RuntimeError,
            match=r"^LOOPLAB_CPU_STEP_KERNEL=1 but the CPU step kernel did not build "
            r"\(Error building extension 'looplab_cpu_step'\)",
        ) as err:
            cpu_step.kernel()
        assert "\n" not in str(err.value)
    finally:
        cpu_step.kernel.cache_clear()


@pytest.mark.slow  # the kernel's C++ build: 47 s on 2 cores (.ci/run's slow tier)
def test_kernel_input_checks_name_the_problem(kernel_on):
    m = Mamba2(d_model=16, d_state=6, headdim=4).double()
    state = m.new_state(4, 0, "cpu", torch.float64)
    u = torch.randn(2, 1, 16, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(RuntimeError, match="slot 9 out of range"):
        m.step(u, BlockCache(state, Layout.one_token(torch.tensor([1, 9]))))
