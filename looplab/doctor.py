"""`looplab doctor`: does this node work? One command that checks a machine before a
sweep schedules on it, and says in one line per check what passed, what failed and why.

    looplab doctor                  every check (under a minute on a 2-core CPU)
    looplab doctor --quick          environment, peaks and kernel correctness (seconds):
                                    what cluster.yaml runs on every worker at `ray up`
    looplab doctor --json FILE      every check as JSON as well (name, status, figure,
                                    value, unit, reason, and the seconds its group took)

Checks, each pass | fail | skip (a skipped check says why; exit status 0 only when none
fails):
  environment   Python, torch (its CUDA build), the CUDA devices and their memory, the
                versions of mamba-ssm, causal-conv1d, triton, ray and mlflow, and which
                Mamba-2 scan and decode step will run on this node, with the reason
                (an import failure is named, not swallowed)
  peaks         GEMM FLOP/s (bf16 and fp32 on a GPU; fp32 on a CPU) and memory
                bandwidth (a device-to-device copy), measured here: MFU divides by them
  correctness   on this node's device, the kernel path against the torch path with a
                tolerance per dtype: the Mamba-2 scan (forward and every gradient, with
                and without seq_idx; float32 at TF32's tolerance on a GPU, where Triton's
                dots round to TF32), the decode step (conv + SSM, states included), the
                compiled CPU step when it is asked for; for every exit policy, a
                prompt prefilled then decoded token by token against the full forward;
                on a GPU, the compiled decode step's tokens against the eager step's,
                and its milliseconds a token against eager's
  training      K steps of a preset (paper-140m on a GPU, local on a CPU) in its
                production dtype with the resource plan's micro-batch, eager: tokens/s,
                MFU against the measured peak, and peak memory against
                looplab/costs/memory.py's prediction for the same plan (the ratio must lie
                in MEMORY_RATIO); then compiled where train.compile compiles (a GPU):
                tokens/s against eager's and the first step's seconds
  ray           the CPUs and GPUs Ray sees, and one Ray Train worker's step on them
                (skipped where Ray is not installed)

The training probe runs right after the production dtype's kernel checks (bf16 on a
GPU), then compiled decoding and generation, and the other dtype's kernel checks last:
on a fresh GPU node Triton's autotuning and Inductor's compilations take minutes, and
each line ends with the seconds its group took.

Every figure is measured in this run: nothing is read from a table.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Callable

PASS, FAIL, SKIP = "pass", "fail", "skip"
PACKAGES = ("torch", "mamba-ssm", "causal-conv1d", "triton", "ray", "mlflow")
TOLERANCE = {"float32": 2e-4, "bfloat16": 3e-2, "float64": 1e-9}  # max |Δ| / max |reference|, per dtype
# Triton's tl.dot takes float32 inputs in TF32 on NVIDIA GPUs unless told otherwise
# (input_precision, TRITON_F32_DEFAULT), so mamba-ssm's scan kernels in float32 carry
# TF32's rounding (unit roundoff 2^-11, bf16's is 2^-8): on an H200 a parameter's
# gradient was off by 1.9e-3 of its largest entry, bf16's were 1.9e-2. Its tolerance
# is bf16's scaled by the ratio of the roundoffs (8x smaller). The decode step's
# kernel has no dot and keeps float32's.
TF32_TOLERANCE = TOLERANCE["bfloat16"] / 8
MEMORY_RATIO = (0.5, 1.5)  # measured peak ÷ predicted: outside, memory.py's model is wrong for this node


@dataclass
class Check:
    name: str
    status: str
    figure: str = ""
    value: float | None = None
    unit: str = ""
    reason: str = ""
    seconds: float | None = None  # the wall time of the group that made it (run() sets it)

    def line(self) -> str:
        text = f"{self.status.upper():4s}  {self.name:34s} {self.figure}"
        text += f"  ({self.reason})" if self.reason else ""
        return text + (f"  [{self.seconds:.0f} s]" if self.seconds is not None and self.seconds >= 1 else "")


def passed(name: str, figure: str = "", value: float | None = None, unit: str = "") -> Check:
    return Check(name, PASS, figure, value, unit)


def skipped(name: str, reason: str) -> Check:
    return Check(name, SKIP, reason=reason)


def failed(name: str, reason: str, figure: str = "", value: float | None = None, unit: str = "") -> Check:
    return Check(name, FAIL, figure, value, unit, reason)


def guarded(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    """A check that raises fails with its exception in one line, and the others run on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a broken node is what the doctor reports
        return [failed(name, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")]


# ---- environment ---------------------------------------------------------------------------


def environment(device) -> list[Check]:
    import torch

    from looplab.models import cpu_step
    from looplab.models.ops import dispatch

    out = [
        passed("python", platform.python_version()),
        passed("torch", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})"),
    ]
    for name in PACKAGES[1:]:
        try:
            out.append(passed(f"version {name}", metadata.version(name)))
        except metadata.PackageNotFoundError:
            out.append(skipped(f"version {name}", "not installed"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(
                passed(f"cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB", p.total_memory / 2**30, "GiB")
            )
    else:
        out.append(skipped("cuda devices", "torch sees no CUDA device"))
    probe = torch.zeros(1, device=device)
    path, why = dispatch.kernel_path(probe)
    out.append(passed("mamba-2 scan path", f"{path}: {why}"))
    step = dispatch.step_implementation(probe)
    reason = (
        f"mamba-ssm's selective_state_update + {dispatch.conv_implementation(step=True)}"
        if step == "cuda"
        else "compiled (LOOPLAB_CPU_STEP_KERNEL=1)"
        if step == "cpu-kernel"
        else "torch ops"
        + ("" if cpu_step.requested() or device.type == "cuda" else " (LOOPLAB_CPU_STEP_KERNEL=1 compiles a CPU step)")
    )
    out.append(passed("mamba-2 decode step", f"{step}: {reason}"))
    if device.type == "cpu":
        out.append(cpu_sequence_kernels())
    return out


def cpu_sequence_kernels() -> Check:
    """Whether a compiled CPU run (train.compile=on) can run the Mamba-2 conv and scan as
    C++ kernels: built here (the first time, ~35 s), or why not (a skip: the torch ops
    serve)."""
    from looplab.models import cpu_sequence, native
    from looplab.models.ops import dispatch

    name = "mamba-2 compiled CPU conv and scan"
    if dispatch.torch_forced():
        return skipped(name, f"torch ops ({dispatch.FORCE_TORCH_ENV}=1)")
    try:
        cpu_sequence.kernel()
    except Exception as e:  # noqa: BLE001 - a toolchain problem is what the doctor reports
        return skipped(name, f"did not build ({native.first_line(e)}); compiled runs use the torch ops")
    return passed(name, "C++ kernels (looplab/models/cpu_sequence.py) under train.compile=on")


# ---- peaks -----------------------------------------------------------------------------------


def gemm_flops(device, dtype, n: int) -> float:
    """FLOP/s of an n×n×n matmul on the device (the median of three after a warm-up),
    into an output allocated once: on a CPU a fresh result is memory mapped anew and
    first touched by the kernel each call, which read up to a third below the product's
    own rate (benchmarks/suite.py)."""
    import torch

    from looplab.costs.timing import median_seconds

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    return 2 * n**3 / median_seconds(lambda: torch.mm(a, b, out=c), 3, warmup=1, device=device)


def bandwidth(device, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    import torch

    from looplab.costs.timing import median_seconds

    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_seconds(lambda: dst.copy_(src), 3, warmup=1, device=device)


def peaks(device, quick: bool) -> tuple[list[Check], float]:
    """The GEMM peaks and the bandwidth; returns the peak MFU divides by (bf16 on a GPU)."""
    import torch

    gpu = device.type == "cuda"
    n = (4096 if quick else 8192) if gpu else (1024 if quick else 2048)
    # On a CPU, with the threads this process trains with (set by looplab/threads.py):
    # a peak measured with more threads than training uses overstates what MFU divides by.
    threads = "" if gpu else f" with {torch.get_num_threads()} threads, as training here"
    out, peak = [], 0.0
    for dtype in (torch.bfloat16, torch.float32) if gpu else (torch.float32,):
        f = gemm_flops(device, dtype, n)
        name = str(dtype).removeprefix("torch.")
        out.append(passed(f"gemm {name} {n}³", f"{f / 1e12:.2f} TFLOP/s{threads}", f / 1e12, "TFLOP/s"))
        peak = peak or f
    b = bandwidth(device, (1 << 30 if gpu else 1 << 28) // (4 if quick else 1))
    out.append(passed("memory bandwidth (copy)", f"{b / 1e9:.1f} GB/s", b / 1e9, "GB/s"))
    return out, peak


# ---- correctness -------------------------------------------------------------------------------


def max_error(a, b) -> float:
    """max |a − b| / max |b| (b the reference), in float64."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _within(name: str, errors: dict[str, float], dtype, tol: float | None = None) -> Check:
    tol = TOLERANCE[str(dtype).removeprefix("torch.")] if tol is None else tol
    worst = max(errors, key=lambda name: errors[name])
    figure = f"max error {errors[worst]:.1e} ({worst}) against {tol:.0e}"
    return (
        passed(name, figure, errors[worst])
        if errors[worst] <= tol
        else failed(name, f"{worst} is off by {errors[worst]:.1e} > {tol:.0e}", figure, errors[worst])
    )


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
        out.append(_within(name + label, errors, dtype, TF32_TOLERANCE if tf32 else None))
    return out


def step_check(device, dtype, *, kernel: str) -> list[Check]:
    """A decode step in a kernel ("cuda": mamba-ssm's, or "cpu": the compiled CPU step)
    against the torch step, from the same prefilled states, over several tokens: the
    outputs and the conv and SSM states after them."""
    import torch

    from looplab.models import cpu_step
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
        with torch.no_grad(), forced_torch() if reference else _nothing():
            block(prompt, cache=BlockCache(state, Layout.padded(lengths)))
            outs = [block(tokens[:, k], cache=BlockCache(state, Layout.one_token(None))) for k in range(5)]
        results.append({"outputs": torch.cat(outs, 1), "conv state": state.conv, "ssm state": state.ssm})
    errors = {k: max_error(results[0][k], results[1][k]) for k in results[1]}
    return [_within(name, errors, dtype)]


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def generation_check(device) -> list[Check]:
    """For every exit policy kind, a prompt prefilled and three tokens decoded one by one
    give the logits of the full forward over the same tokens in the same policy."""
    import torch

    from looplab.checkpoint import load_model
    from looplab.inference.generate import decode_step, prefill
    from looplab.policy import ExitPolicy

    dtype = torch.float32
    model = load_model("debug", seed=0).to(device).eval()
    with torch.no_grad():  # a gate that exits: the untrained bias of −2 would rarely leave
        model.exit_gate.bias.fill_(0.0)
    torch.manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 24), device=device)
    prompt, new = 20, 4
    out = []
    for spec in ("full", "forced:2", "dense:0.5", "skip:0.5", "skip-entropy:2.0"):
        policy = ExitPolicy.parse(spec)
        with torch.no_grad():
            full = model(ids, policy).logits[:, prompt - 1 :]
            state = prefill(model, ids[:, :prompt], policy, capacity=ids.shape[1])
            logits = [state.logits]
            for k in range(new - 1):
                step = decode_step(model, state.cache, ids[:, prompt + k], policy).logits
                assert step is not None  # decode_step reads out unless told readout=False
                logits.append(step)
        decoded = torch.stack(logits, 1)
        out.append(_within(f"generation {spec} vs full forward", {"logits": max_error(decoded, full[:, :new])}, dtype))
    return out


def compiled_decoding_check(device) -> list[Check]:
    """The compiled one-token step (looplab/models/compiled.py) generates the eager step's
    tokens and loops, lockstep and depth-batched, on this node's device. On a CPU it is
    skipped: compiling costs tens of seconds there and tests/test_compile.py checks it."""
    import torch

    from looplab.checkpoint import load_model
    from looplab.inference.generate import generate
    from looplab.models.compiled import compile_decoding
    from looplab.policy import ExitPolicy

    if device.type != "cuda":
        return [
            skipped(
                "compiled decoding vs eager",
                "CPU: tests/test_compile.py checks it (compiling takes tens of seconds here)",
            )
        ]
    model = load_model("debug", seed=0).to(device).eval()
    with torch.no_grad():
        # A gate that exits for some tokens and not others, its logits spread wide (a unit
        # weight on a normalized state: std about 4). With bias 0 and the initial weights
        # every λ sat near 0.5, so skip:0.5's decisions lay on the threshold, where another
        # kernel's float rounding flips them: on an H200, skip:0.5 lockstep differed.
        model.exit_gate.bias.fill_(0.0)
        model.exit_gate.weight.mul_(4.0 / model.exit_gate.weight.norm())
    torch.manual_seed(0)
    prompts = torch.randint(0, model.cfg.vocab_size, (4, 16)).tolist()
    cases = [(spec, schedule) for spec in ("full", "skip:0.5") for schedule in ("lockstep", "depth")]

    def generations():
        return [generate(model, prompts, 8, ExitPolicy.parse(spec), schedule=schedule) for spec, schedule in cases]

    eager = generations()
    out = []
    for label, cuda_graphs in (("compiled decoding", False), ("cuda-graph decoding", True)):
        compile_decoding(model, cuda_graphs=cuda_graphs)  # once: every case after it runs the same step
        skips_before = _cudagraph_skips()
        for (spec, schedule), e, c in zip(cases, eager, generations()):
            name = f"{label} {spec} {schedule}"
            difference = first_difference(e, c)
            out.append(
                passed(name, "tokens and loops equal eager's")
                if difference is None
                else failed(name, f"{difference} differ from the eager step's")
            )
        if cuda_graphs:
            # Inductor skips a capture it cannot make sound (a mutated input not marked
            # static, a CPU tensor) and runs the graph uncaptured: tokens still equal.
            skips = _cudagraph_skips() - skips_before
            out.append(
                passed("cuda-graph captures", "no capture skipped", 0, "skips")
                if skips == 0
                else failed(
                    "cuda-graph captures", f"Inductor skipped {skips} CUDA-graph capture(s)", "", skips, "skips"
                )
            )
    return out + decoding_speed(model, prompts, device)


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


TIMED_TOKENS = 32  # the decoding speed check's new tokens per prompt


def decoding_speed(model, prompts, device) -> list[Check]:
    """Seconds a token of `model`'s compiled decode step (compile_decoding), and on a GPU
    of the step captured in CUDA graphs, each against the eager step: full lockstep
    generation of TIMED_TOKENS after the prompts, the median of three after a warm-up,
    every arm on the same prompts. Leaves the model eager. Figures, not pass marks: where
    compiled is not faster, the node's decode is bound by something compiling does not
    remove (on a GPU: kernel launches, which CUDA graphs remove)."""
    from looplab.costs.timing import median_seconds
    from looplab.inference.generate import generate
    from looplab.models.compiled import compile_decoding
    from looplab.policy import ExitPolicy

    def per_token() -> float:
        def run():
            return generate(model, prompts, TIMED_TOKENS, ExitPolicy.parse("full"))

        return median_seconds(run, 3, warmup=1, device=device) / TIMED_TOKENS

    arms = [("compiled", False)] + ([("cuda-graph", True)] if device.type == "cuda" else [])
    seconds = {}
    for label, cuda_graphs in arms:
        compile_decoding(model, cuda_graphs=cuda_graphs)
        seconds[label] = per_token()
    compile_decoding(model, enabled=False)
    eager = per_token()
    shape = f"full lockstep, batch {len(prompts)}, {TIMED_TOKENS} tokens after a {len(prompts[0])}-token prompt"
    return [
        passed(
            f"{label} decoding speed",
            f"{s * 1e3:.2f} ms a token {label}, {eager * 1e3:.2f} eager ({s / eager:.2f}×): {shape}",
            s / eager,
            "ratio",
        )
        for label, s in seconds.items()
    ]


def first_difference(eager, compiled) -> str | None:
    """Where two generations first part: "row r, token t: tokens 5 vs 7, loops 2 vs 3"."""
    for row, (et, ct, el, cl) in enumerate(zip(eager.tokens, compiled.tokens, eager.loops, compiled.loops)):
        for t in range(max(len(et), len(ct), len(el), len(cl))):
            pair = [(a[t] if t < len(a) else None, b[t] if t < len(b) else None) for a, b in ((et, ct), (el, cl))]
            if any(a != b for a, b in pair):
                (te, tc), (le, lc) = pair
                return f"row {row}, token {t}: tokens {te} vs {tc}, loops {le} vs {lc}"
    return None


# ---- training --------------------------------------------------------------------------------


PROBE_MICRO_BATCHES = 2  # the training probe's step: the plan's micro-batch, accumulated twice


def training_probe(device, preset: str, steps: int, peak_flops: float) -> list[Check]:
    """`steps` optimizer steps of the preset's pre-training in its production dtype, with the
    resource plan's micro-batch for this device's memory, eager: tokens/s, MFU, and the peak
    memory of a step against the memory model's prediction of the same plan. Then, where
    train.compile compiles on this device, the same steps compiled: tokens/s against
    eager's, and the first step's seconds (the compilation's).

    A step holds PROBE_MICRO_BATCHES of the plan's micro-batches, not the preset's whole
    batch: tokens/s, MFU and a step's peak (the gradients plus one micro-batch's
    activations) are what more micro-batches repeat, and paper-140m's batch of 2M tokens
    (128 micro-batches on an H200) would make each step about 20 s: on the first GPU
    runs the probe did not finish inside the device's minutes."""
    import torch

    from looplab.config import apply_overrides
    from looplab.costs.resources import flops_per_token, plan_stage
    from looplab.devices import resolved_precision
    from looplab.models.compiled import compiles
    from looplab.presets import get_preset

    cfg = get_preset(preset)
    gpu = device.type == "cuda"
    budget = torch.cuda.get_device_properties(device).total_memory / 2**30 if gpu else None
    plan = plan_stage(cfg, path="cuda" if gpu else "torch", device_memory_gib=budget)
    rows = min(cfg.train.batch_size, PROBE_MICRO_BATCHES * plan.micro_batch)
    production_compile = cfg.train.compile
    cfg = apply_overrides(
        cfg,
        {
            "train.batch_size": rows,
            "train.micro_batch_size": plan.micro_batch,
            "train.activation_checkpointing": plan.checkpointing,
            "train.device": device.type,
            "train.compile": "off",
        },
    )
    predicted = predicted_peak(plan)
    measured, seconds, _ = measure_steps(cfg, steps, device)
    tokens = rows * cfg.train.seq_len
    rate = tokens / seconds
    mfu = flops_per_token(cfg, plan.checkpointing) * rate / peak_flops if peak_flops else float("nan")
    precision = resolved_precision(cfg.train.precision, device)
    head = (
        f"{preset} pre-training, {precision}, steps of {rows} × {cfg.train.seq_len} tokens in micro-batches "
        f"of {plan.micro_batch}, eager"
    )
    out = [
        passed(f"training {preset} tokens/s", f"{rate:,.0f} tokens/s ({head})", rate, "tokens/s"),
        passed(f"training {preset} MFU", f"{mfu:.1%} of the measured GEMM peak", mfu, "fraction"),
        memory_check(f"training {preset} memory vs plan", measured, predicted),
    ]
    name = f"training {preset} compiled tokens/s"
    if not compiles(production_compile, device):
        return out + [skipped(name, f"train.compile={production_compile} does not compile on {device.type}")]
    compiled = apply_overrides(cfg, {"train.compile": "on"})
    _, compiled_seconds, first = measure_steps(compiled, steps, device, peak=False)
    compiled_rate = tokens / compiled_seconds
    figure = f"{compiled_rate:,.0f} tokens/s, {seconds / compiled_seconds:.2f}× eager's; first step {first:.0f} s"
    return out + [passed(name, figure, compiled_rate, "tokens/s")]


def predicted_peak(plan) -> int:
    """The memory model's peak of one step above the weights and AdamW's moments (what a
    measurement from just before the step sees)."""
    return plan.memory.peak - plan.memory.persistent


def memory_check(name: str, measured: int, predicted: int) -> Check:
    ratio = measured / predicted if predicted else float("inf")
    lo, hi = MEMORY_RATIO
    figure = f"measured {measured / 2**20:,.0f} MiB, predicted {predicted / 2**20:,.0f} MiB (ratio {ratio:.2f})"
    if lo <= ratio <= hi:
        return passed(name, figure, ratio, "ratio")
    return failed(
        name,
        f"the ratio {ratio:.2f} is outside [{lo}, {hi}]: looplab/costs/memory.py's model does not hold here",
        figure,
        ratio,
        "ratio",
    )


def measure_steps(cfg, steps: int, device, peak: bool = True) -> tuple[int, float, float]:
    """(peak bytes of one optimizer step above the level before it, or 0 where peak is
    False; seconds per step: the median of `steps` after the first; the first step's
    seconds, compilations included). On a CPU the resident set follows live tensors only
    in a child process (looplab/costs/measured_memory.py), where the peak is measured."""
    from looplab.costs.timing import median_seconds
    from looplab.costs.measured_memory import in_rss_process
    from looplab.training.steps import optimizer_step

    step, _ = optimizer_step(cfg, device)
    first = median_seconds(step, 1, warmup=0, device=device)
    seconds = median_seconds(step, steps, warmup=0, device=device)
    if not peak:
        return 0, seconds, first
    if device.type == "cuda":
        import torch

        del step
        torch.cuda.empty_cache()
        return step_peak(cfg, device), seconds, first
    return in_rss_process(step_peak, cfg, device), seconds, first


def step_peak(cfg, device) -> int:
    """One optimizer step's peak above the memory in use before it (after a warm-up step,
    so AdamW's moments already exist)."""
    from looplab.costs.measured_memory import peak_memory
    from looplab.training.steps import optimizer_step

    step, _ = optimizer_step(cfg, device)
    step()
    return peak_memory(step, device).delta


# ---- Ray ---------------------------------------------------------------------------------------


def ray_check(device) -> list[Check]:
    """The resources a local Ray sees, and one Ray Train worker's training step on them.
    Skipped where Ray is not installed (a GPU machine without the platform extra): a
    cluster's node always has it, since Ray runs the node."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return [skipped("ray", "Ray is not installed (pip install '.[platform]')")]
    import ray
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    import contextlib
    import io

    started = not ray.is_initialized()
    if started:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # Ray's banners
            ray.init(
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                runtime_env={"env_vars": {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60"}},
            )
    try:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        out = [passed("ray resources", f"{resources.get('CPU', 0):g} CPUs, {gpus} GPUs")]
        if device.type == "cuda" and gpus == 0:
            out.append(failed("ray sees the GPUs", "torch sees CUDA devices but Ray reports no GPU"))
        use_gpu = gpus > 0
        t = time.perf_counter()
        # The worker raises when its step is not finite: the result's error is the verdict
        # (Ray Train V2 keeps no metrics reported without a checkpoint).
        result = TorchTrainer(
            _ray_worker_step,
            scaling_config=ScalingConfig(
                num_workers=1, use_gpu=use_gpu, resources_per_worker={"CPU": 1, **({"GPU": 1} if use_gpu else {})}
            ),
        ).fit()
        where = "a GPU" if use_gpu else "a CPU"
        if result.error:
            reason = (str(result.error).strip().splitlines() or ["the step failed"])[-1][:300]
            out.append(failed("ray train worker step", reason))
        else:
            out.append(
                passed(
                    "ray train worker step",
                    f"one training step on {where}, {time.perf_counter() - t:.1f} s with the worker group's start",
                )
            )
        return out
    finally:
        if started:
            ray.shutdown()


def _ray_worker_step(config=None) -> None:
    """One optimizer step of a small model on the worker's device; raises if the loss is not finite."""
    import torch

    from looplab.config import apply_overrides
    from looplab.presets import get_preset

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from looplab.training.steps import optimizer_step

    cfg = apply_overrides(get_preset("debug"), {"train.batch_size": 2, "train.seq_len": 32})
    loss = optimizer_step(cfg, device)[0]()
    if not math.isfinite(loss):
        raise FloatingPointError(f"the worker's training step gave a loss of {loss} on {device}")


# ---- the report ----------------------------------------------------------------------------------


def run(
    *,
    quick: bool = False,
    preset: str | None = None,
    steps: int = 3,
    device: str = "auto",
    ray: bool = True,
    progress: Callable[[Check], None] | None = None,
) -> list[Check]:
    import torch

    from looplab.devices import resolve_device

    dev = resolve_device(device)
    checks: list[Check] = []

    def add(found: list[Check]) -> None:
        for check in found:
            checks.append(check)
            if progress is not None:
                progress(check)

    def timed(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
        # A group's wall time on its first check: on a fresh GPU node Triton's
        # autotuning and Inductor's compilations take minutes, and the report says where.
        t = time.perf_counter()
        found = guarded(name, fn)
        if found:
            found[0].seconds = time.perf_counter() - t
        return found

    add(timed("environment", lambda: environment(dev)))
    peak_holder: list[float] = []

    def measured_peaks():
        found, peak = peaks(dev, quick)
        peak_holder.append(peak)
        return found

    add(timed("peaks", measured_peaks))
    dtypes = (torch.bfloat16, torch.float32) if dev.type == "cuda" else (torch.float32,)
    name = preset or ("paper-140m" if dev.type == "cuda" else "local")

    def kernel_checks(dtype):
        add(timed("scan kernel vs torch", lambda: scan_check(dev, dtype)))
        add(timed("decode step cuda vs torch", lambda: step_check(dev, dtype, kernel="cuda")))

    # The production dtype's kernels first, then what rests on them: the training probe
    # (what a sweep's plan rests on, reusing their autotuned kernels), compiled decoding
    # and generation; the other dtype's kernel checks last. On a fresh GPU node each
    # dtype's autotuning and each compilation take minutes, and a lent machine's check
    # may end before the last line.
    kernel_checks(dtypes[0])
    if not quick:
        peak = peak_holder[0] if peak_holder else 0.0
        add(timed(f"training {name}", lambda: training_probe(dev, name, steps, peak)))
    add(timed("compiled decoding vs eager", lambda: compiled_decoding_check(dev)))
    add(timed("generation vs full forward", lambda: generation_check(dev)))
    for dtype in dtypes[1:]:
        kernel_checks(dtype)
    add(timed("decode step cpu vs torch", lambda: step_check(dev, torch.float32, kernel="cpu")))
    if quick:
        add([skipped("training probe", "--quick"), skipped("ray", "--quick")])
        return checks
    add(timed("ray", lambda: ray_check(dev)) if ray else [skipped("ray", "--no-ray")])
    return checks


def report_json(checks: list[Check], path: str | os.PathLike) -> None:
    from looplab.destinations import write_text

    write_text(
        path,
        json.dumps(
            {
                "host": platform.node(),
                "checks": [asdict(c) for c in checks],
                "failed": sum(c.status == FAIL for c in checks),
            },
            indent=2,
        )
        + "\n",
    )


def report_markdown(checks: list[Check]) -> str:
    rows = ["| check | status | figure | reason | seconds |", "|---|---|---|---|---|"]
    rows += [
        f"| {c.name} | {c.status} | {c.figure} | {c.reason} | {'' if c.seconds is None else f'{c.seconds:.1f}'} |"
        for c in checks
    ]
    return "\n".join(rows)


def main(args) -> int:
    """The `looplab doctor` command: one line per check as it finishes, then the verdict."""
    started = time.perf_counter()
    checks = run(
        quick=args.quick,
        preset=args.preset,
        steps=args.steps,
        device=args.device,
        ray=not args.no_ray,
        progress=lambda c: print(c.line(), flush=True),
    )
    if args.json:
        report_json(checks, args.json)
    if getattr(args, "markdown", None):
        from looplab.destinations import write_text

        write_text(args.markdown, report_markdown(checks) + "\n")
    bad = [c for c in checks if c.status == FAIL]
    print(
        f"doctor: {len(checks) - len(bad)} of {len(checks)} checks passed or skipped, {len(bad)} failed "
        f"({time.perf_counter() - started:.0f} s)"
        + (f"; first failure: {bad[0].name}: {bad[0].reason}" if bad else ""),
        file=sys.stderr,
    )
    return 1 if bad else 0


__all__ = ["Check", "FAIL", "PASS", "SKIP", "main", "report_json", "report_markdown", "run"]
