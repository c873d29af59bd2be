"""The kernel checks: the Mamba-2 scan and decode step in their kernels against the
torch path, on this node's device."""

from __future__ import annotations

import os

from looplab.doctor.checks import TF32_TOLERANCE, Check, max_error, skipped, within


def _mixer(device, dtype, seed: int = 0):
    """A small Mamba-2 block whose in_proj width suits causal-conv1d's stride rule."""
    import torch

    from looplab.models.mamba2 import Mamba2

    torch.manual_seed(seed)
    return Mamba2(d_model=64, d_state=16, headdim=16, chunk_size=16).to(device=device, dtype=dtype)


def forced_torch():
    """A context in which every Mamba-2 block runs its torch path (the reference)."""
    import contextlib

    from looplab.models.ops.dispatch import FORCE_TORCH_ENV

    @contextlib.contextmanager
    def ctx():
        before = os.environ.get(FORCE_TORCH_ENV)
        os.environ[FORCE_TORCH_ENV] = "1"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(FORCE_TORCH_ENV, None)
            else:
                os.environ[FORCE_TORCH_ENV] = before

    return ctx()


def scan_check(device, dtype) -> list[Check]:
    """The kernel scan against the torch scan: forward and the gradients of the input and
    every parameter, without and with seq_idx (two sequences packed in a row)."""
    import torch

    from looplab.models.ops.dispatch import kernel_path, use_cuda_kernels

    tf32 = dtype == torch.float32 and device.type == "cuda"  # Triton's dots on NVIDIA (TF32_TOLERANCE)
    name = f"scan kernel vs torch ({str(dtype).removeprefix('torch.')}{', TF32 dots' if tf32 else ''})"
    probe = torch.zeros(1, device=device, dtype=dtype)
    if not use_cuda_kernels(probe):
        return [skipped(name, f"the scan runs the torch path here: {kernel_path(probe)[1]}")]
    block = _mixer(device, dtype)
    u = torch.randn(2, 64, 64, device=device, dtype=dtype, generator=None)
    seq_idx = (torch.arange(64, device=device) >= 40).to(torch.int32).expand(2, 64).contiguous()
    out = []
    for label, idx in (("", None), (" with seq_idx", seq_idx)):
        results = []
        for reference in (False, True):
            x = u.clone().requires_grad_(True)
            block.zero_grad(set_to_none=True)
            if reference:
                with forced_torch():
                    y = block(x, seq_idx=idx)
            else:
                y = block(x, seq_idx=idx)
            y.float().pow(2).mean().backward()
            results.append(
                {"output": y.detach(), "d input": x.grad, **{f"d {n}": p.grad for n, p in block.named_parameters()}}
            )
        kernel, torch_path = results
        errors = {k: max_error(kernel[k], torch_path[k]) for k in torch_path if torch_path[k] is not None}
        out.append(within(name + label, errors, dtype, TF32_TOLERANCE if tf32 else None))
    return out


def step_check(device, dtype, *, kernel: str) -> list[Check]:
    """A decode step in a kernel ("cuda": mamba-ssm's, or "cpu": the compiled CPU step)
    against the torch step, from the same prefilled states, over several tokens: the
    outputs and the conv and SSM states after them."""
    import torch

    from looplab.models.cpu import cpu_step
    from looplab.models.ops.dispatch import use_cuda_step_kernels

    name = f"decode step {kernel} vs torch ({str(dtype).removeprefix('torch.')})"
    probe = torch.zeros(1, device=device, dtype=dtype)
    if kernel == "cuda" and not use_cuda_step_kernels(probe):
        return [skipped(name, "no CUDA step kernels here (mamba-ssm's selective_state_update, causal_conv1d_update)")]
    if kernel == "cpu" and not (device.type == "cpu" and cpu_step.requested()):
        return [skipped(name, "not asked for (LOOPLAB_CPU_STEP_KERNEL=1 compiles it)")]
    from looplab.models.cache import BlockCache, Layout

    block = _mixer(device, dtype).eval()
    prompt = torch.randn(3, 20, 64, device=device, dtype=dtype)
    tokens = torch.randn(3, 5, 1, 64, device=device, dtype=dtype)
    results = []
    for reference in (False, True):
        state = block.new_state(3, 3, device, dtype)
        lengths = torch.full((3,), 20, device=device)
        with torch.no_grad(), forced_torch() if reference else null_context():
            block(prompt, cache=BlockCache(state, Layout.padded(lengths)))
            outs = [block(tokens[:, k], cache=BlockCache(state, Layout.one_token(None))) for k in range(5)]
        results.append({"outputs": torch.cat(outs, 1), "conv state": state.conv, "ssm state": state.ssm})
    errors = {k: max_error(results[0][k], results[1][k]) for k in results[1]}
    return [within(name, errors, dtype)]


def null_context():
    import contextlib

    return contextlib.nullcontext()
