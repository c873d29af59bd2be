"""The training probe: K steps of a preset with the plan's micro-batch, tokens/s, MFU
and peak memory against looplab/costs/memory.py's prediction; compiled beside eager
where training compiles."""

from __future__ import annotations

from looplab.doctor.checks import Check, failed, passed, skipped

MEMORY_RATIO = (0.5, 1.5)  # measured peak ÷ predicted: outside, memory.py's model is wrong for this node


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
    from looplab.costs.measured_memory import in_rss_process
    from looplab.costs.timing import median_seconds
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
