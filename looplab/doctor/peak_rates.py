"""The peaks measured here: GEMM FLOP/s (what MFU divides by) and memory bandwidth."""

from __future__ import annotations

from looplab.doctor.checks import Check, passed


def gemm_flops(device, dtype, n: int) -> float:
    """FLOP/s of an n×n×n matmul on the device (the median of three after a warm-up),
    into an output allocated once: on a CPU a fresh result is memory mapped anew and
    first touched by the kernel each call, which slows the product itself
    (docs/benchmarks.md)."""
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
