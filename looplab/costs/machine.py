"""This machine's capacity, read in one place, and the checks that hold a command's plan
to it before anything is allocated: train and the sweeps' stages (check_training),
generate and bench-arrivals (check_new_tokens, check_decoding), bench (check_grid), eval
(check_forward).

    available_memory(device)  bytes a new allocation can have now: on a CPU, MemAvailable
                              (/proc/meminfo), capped by a container's memory cgroup (its
                              limit less its usage; v2 or v1); on a GPU, the free bytes
                              torch.cuda.mem_get_info reports. None where neither can be
                              read (not Linux): then nothing is refused.

A figure fits when it is at most (1 − MARGIN) of what is available: the estimates leave
out the allocator's slack, Python's objects and the libraries' buffers. A refusal is one
line naming the flag, the figure and the machine's limit.

The figures: a training step's peak from the memory model (looplab/costs/memory.py,
checked against measured peaks) plus the global batch of token ids every rank builds
(the task's rows, int64 ids and targets); for inference, a forward without a graph
(memory.forward_memory, an estimate that leans high) and the decoding cache exactly
(memory.decode_cache_bytes: attention's keys and values grow with the tokens, Mamba-2's
states do not), beside the token ids a command draws up front.

Time and counts: a stage's FLOPs at a speed above any device's give its time a floor,
which must stay under MAX_RUN_DAYS (train.steps itself is bounded where every config value
is, config.MAX_STEPS); new tokens are bounded by MAX_NEW_TOKENS.

Only the memory check can be overridden (LOOPLAB_MEMORY_CHECK=off): its figures are
estimates and a reading can be wrong (memory another job is about to free, swap). Counts
and time have no override: no estimate stands between a user and a run of 10²⁰ steps that
cannot end, or a generation of 10¹² tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

from looplab.errors import invalid

MARGIN = 0.1  # of the available memory, left to what the figures do not count
MEMORY_CHECK_ENV = "LOOPLAB_MEMORY_CHECK"  # "off": skip the memory checks (the one override)
# A run's time has a floor: its FLOPs at a peak above any device's (dense bf16: H100 989
# TFLOP/s, B200 2.25 PFLOP/s). A stage that needs more than MAX_RUN_DAYS on each of its
# devices even at that speed cannot be meant.
FASTEST_DEVICE_FLOPS = 1e16
MAX_RUN_DAYS = 365
# Tokens a row decodes in one command (generate, bench --decode, bench-arrivals): generate
# keeps each in its record and decodes the row's text again after each (stop strings), so
# its work grows with the square of the count; a benchmark times each point many times.
MAX_NEW_TOKENS = 1 << 20


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_room(root: str | Path = "/sys/fs/cgroup") -> int | None:
    """A container's memory limit less what its processes use (cgroup v2, else v1); None
    without a limit. A v1 'no limit' is a huge number, above any machine's memory."""
    root = Path(root)
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            limit, usage = (root / limit_file).read_text().strip(), (root / usage_file).read_text().strip()
        except OSError:
            continue
        if limit == "max" or not limit.isdigit() or not usage.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(0, int(limit) - int(usage))
    return None


def available_memory(device=None) -> int | None:
    """Bytes a new allocation on `device` (a torch.device or its name; default the CPU)
    can have now (module docstring); None where it cannot be read."""
    kind = getattr(device, "type", str(device or "cpu").partition(":")[0])
    if kind == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    readings = [r for r in (_meminfo_available(), cgroup_room()) if r is not None]
    return min(readings) if readings else None


def checking_memory() -> bool:
    return os.environ.get(MEMORY_CHECK_ENV, "on").strip().lower() != "off"


def check_memory(need: int, name: str, value, what: str, device=None, advice: str = "") -> None:
    """need bytes on device (CPU memory by default) against its available memory less
    MARGIN: a ConfigError naming `name`=`value`, the figure and the limit."""
    from looplab.costs.memory import gib

    if not checking_memory():
        return
    available = available_memory(device)
    if available is None or need <= (1 - MARGIN) * available:
        return
    where = "GPU memory" if getattr(device, "type", str(device or "cpu")).startswith("cuda") else "memory"
    raise invalid(
        name,
        value,
        f"a plan that fits this machine's available {where} ({gib(available)}, less a "
        f"{MARGIN:.0%} margin): {what} {gib(need)}{advice}; or {MEMORY_CHECK_ENV}=off to run "
        "it anyway",
    )


# ---- training -------------------------------------------------------------------------


def batch_bytes(cfg) -> int:
    """The global batch's int64 ids and targets, which every rank builds each step."""
    return 2 * 8 * cfg.train.batch_size * cfg.task.row_length(cfg.train.seq_len)


def check_training(cfg, device=None, ranks: int = 1, memory: bool = True) -> None:
    """cfg's stage on `ranks` devices of this kind: its time floor always (no override),
    then with `memory` the step's peak and the batch against this machine's memory. The
    flag named: the row's length where one row cannot fit whatever the batch (with
    activation checkpointing), else the (micro-)batch."""
    import torch

    from looplab.costs.memory import step_memory
    from looplab.costs.resources import plan_stage

    device = torch.device(device or "cpu")
    path = _path(device)
    plan = plan_stage(cfg, ranks=ranks, path=path)
    _check_time(cfg, plan.flops, ranks)
    if not memory:
        return
    t, L = cfg.train, cfg.task.row_length(cfg.train.seq_len)
    gpu = device.type == "cuda"
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))  # ranks sharing this machine's memory
    data = batch_bytes(cfg)
    one_row = step_memory(cfg, 1, ranks=ranks, path=path, checkpointing=True).peak + (0 if gpu else 2 * 8 * L)
    row, length = ("train.seq_len", t.seq_len) if L == t.seq_len else ("task.n", L - 4)  # a p-hop row: n + 4
    check_memory(
        (1 if gpu else local_ranks) * one_row,
        row,
        length,
        f"one row of {L} tokens with activation checkpointing needs ≈",
        device,
        f"; or a smaller {row} or model",
    )
    name, value = (
        ("train.micro_batch_size", t.micro_batch_size) if t.micro_batch_size else ("train.batch_size", t.batch_size)
    )
    advice = (
        "; or a smaller train.batch_size or train.micro_batch_size (gradients accumulate), "
        "train.activation_checkpointing=true, a smaller model or train.seq_len"
    )
    if gpu:
        check_memory(plan.memory.peak, name, value, "its step's peak is ≈", device, advice)
        check_memory(
            local_ranks * data, "train.batch_size", t.batch_size, "its batches of token ids need ≈", None, advice
        )
    else:
        check_memory(
            local_ranks * (plan.memory.peak + data), name, value, "its step's peak with its batch is ≈", None, advice
        )


def _path(device) -> str:
    """The memory model's path on device: mamba-ssm's kernels where a GPU runs them."""
    import torch

    device = torch.device(device or "cpu")
    if device.type != "cuda":
        return "torch"
    from looplab.models.ops.dispatch import kernel_path

    return kernel_path(torch.empty(0, device=device))[0]


def _check_time(cfg, flops: float, ranks: int) -> None:
    seconds = flops / (max(1, ranks) * FASTEST_DEVICE_FLOPS)
    limit = MAX_RUN_DAYS * 86400
    if seconds > limit:
        steps = cfg.train.steps
        most = max(1, int(steps * limit / seconds))
        years = seconds / 86400 / 365
        raise invalid(
            "train.steps",
            steps,
            f"a run that can end: {flops:.2g} FLOPs take ≥ {years:.3g} years on "
            f"{ranks} device(s) even at {FASTEST_DEVICE_FLOPS / 1e15:g} PFLOP/s each; "
            f"at most {MAX_RUN_DAYS} days (train.steps ≤ {most:,} at this batch and "
            "model)",
        )


# ---- inference ------------------------------------------------------------------------


def check_new_tokens(name: str, new_tokens: int) -> None:
    if new_tokens > MAX_NEW_TOKENS:
        raise invalid(
            name,
            new_tokens,
            f"at most {MAX_NEW_TOKENS:,} new tokens (each is kept and the text decoded "
            "again after it: the work grows with their square)",
        )


def check_forward(model_cfg, rows: int, tokens: int, name: str, value, device=None, steps_kept: int = 0) -> None:
    """A forward over rows × tokens against the device's memory; steps_kept: loops whose
    fp32 output states it keeps (an evaluation reads every step's)."""
    from looplab.costs.memory import FP32, forward_memory

    states = steps_kept * rows * tokens * FP32 * model_cfg.d_model
    need = forward_memory(model_cfg, rows, tokens, _path(device)) + states
    check_memory(need, name, value, "its forward needs ≈", device)


def check_decoding(
    model_cfg, rows: int, prompt: int, new_tokens: int, name: str, value, device=None, inputs: int = 0, advice: str = ""
) -> None:
    """Decoding new_tokens after a prompt, for `rows` rows (its count checked first,
    check_new_tokens): the prompt's prefill, the cache of prompt + new tokens and
    `inputs` bytes of token ids drawn beforehand, against the device's memory."""
    from looplab.costs.memory import decode_cache_bytes, forward_memory

    kind = "growing with the tokens" if "attention" in model_cfg.layer_kinds() else "of a fixed size"
    need = (
        inputs
        + forward_memory(model_cfg, rows, prompt, _path(device))
        + (decode_cache_bytes(model_cfg, rows, prompt + new_tokens) if new_tokens else 0)
    )
    what = (
        f"its token ids, prefill and decoding cache ({kind}) need ≈"
        if new_tokens
        else "its token ids and prefill need ≈"
    )
    check_memory(need, name, value, what, device, advice)


def check_grid(model_cfg, batches, seq_lens, new_tokens: int = 0, device=None) -> None:
    """bench's grid (looplab/costs/timing.py): every (batch, seq_len) point's ids are
    drawn up front (seq_len + new_tokens each, with an oracle's exit steps of the same
    shape); then each point runs a prefill over seq_len and, with new_tokens, decodes.
    The largest point is checked, said about the larger of its two flags."""
    check_new_tokens("--new-tokens", new_tokens)
    inputs = sum(2 * 8 * b * (L + new_tokens) for b in batches for L in seq_lens)
    b, L = max(((b, L) for b in batches for L in seq_lens), key=lambda point: point[0] * (point[1] + new_tokens))
    name, value = ("--seq-len", L) if L >= b else ("--batch", b)
    others = "; or smaller --batch, --seq-len" + (" or --new-tokens" if new_tokens else "")
    check_decoding(model_cfg, b, L, new_tokens, name, value, device, inputs, others)


def check_stream(
    model_cfg, slots: int, requests: int, prompt_len: tuple[int, int], new_tokens: tuple[int, int], device=None
) -> None:
    """bench-arrivals' stream (looplab/inference/arrivals.py): the requests' prompts drawn
    up front, then `slots` cache rows sized for the longest request, each request
    prefilled alone as it joins."""
    from looplab.costs.memory import decode_cache_bytes, forward_memory

    check_new_tokens("--new-tokens", new_tokens[1])
    check_memory(2 * 8 * requests * prompt_len[0], "--requests", requests, "its prompts need at least", None)
    longest = prompt_len[1] + new_tokens[1]
    need = forward_memory(model_cfg, 1, prompt_len[1], _path(device)) + decode_cache_bytes(model_cfg, slots, longest)
    check_memory(
        need,
        "--slots",
        slots,
        f"a prefill and the decoding cache of {slots} rows of up to {longest} tokens need ≈",
        device,
        "; or fewer --slots, a shorter --prompt-len or --new-tokens",
    )
