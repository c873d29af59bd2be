"""Measured peak memory of a call (looplab/costs/memory.py is the model it is checked against).

Two numbers per call (-1 where they cannot be measured):
    delta      the peak above what was in use before the call: what the call needed
    absolute   the peak during the call: weights, inputs and (CPU) the process's own
               footprint included

On CUDA: torch.cuda.max_memory_allocated after resetting the peak stats; the delta
subtracts the allocation before the call. In-process, nothing else to arrange.

On CPU (Linux, glibc): the peak resident set size (VmHWM in /proc/self/status) after
resetting it to the current RSS through /proc/self/clear_refs, the heap trimmed
first; the delta subtracts the RSS before the call. The RSS follows live tensors only
if every large block is mapped on allocation and returned on free, which glibc does
only with its mmap threshold fixed from the process's start (by default it raises the
threshold as large blocks are freed and keeps later ones in the heap, where the RSS
no longer sees them go). So CPU measurements run in a child process started with
MALLOC_MMAP_THRESHOLD_ = 128 KiB (`in_rss_process`). Timing stays in the caller,
under the allocator's normal behaviour: with the threshold fixed, every large block
costs fresh page faults, which slowed a `local` pre-training step from 2.2 to 4.0 s.
Allocations below the threshold are not seen.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

# A process started with this environment maps every block of 128 KiB or more on
# allocation and unmaps it on free, from its first allocation on (mallopt(3)).
RSS_FOLLOWS_TENSORS = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


@dataclass(frozen=True)
class Peak:
    """A call's peak memory in bytes: above what was in use before it, and absolute;
    -1 where it cannot be measured."""

    delta: int
    absolute: int


UNKNOWN_PEAK = Peak(-1, -1)


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"{field} missing from /proc/self/status")


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim


def peak_memory(fn: Callable[[], object], device: torch.device) -> Peak:
    """fn()'s peak memory in this process (module docstring). On CPU the figure is
    exact only in a process that `in_rss_process` started."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return Peak(peak - base, peak)
    try:
        _malloc_trim()
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        base = _rss_kb("VmRSS")
        fn()
        peak = _rss_kb("VmHWM")
        return Peak(max(0, peak - base) * 1024, peak * 1024)
    except OSError:
        return UNKNOWN_PEAK  # not Linux: unknown


def _with_threads(threads: int, fn: Callable[..., T], args: tuple) -> T:
    torch.set_num_threads(threads)
    return fn(*args)


def in_rss_process(fn: Callable[..., T], *args) -> T:
    """fn(*args) in a fresh process whose RSS follows live tensors, with this
    process's torch thread count; fn and args must pickle (a module-level function;
    tensors and modules are copied). For CPU peak memory (module docstring)."""
    saved = {key: os.environ.get(key) for key in RSS_FOLLOWS_TENSORS}
    os.environ.update(RSS_FOLLOWS_TENSORS)  # the child inherits the environment at its start
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_with_threads, torch.get_num_threads(), fn, args).result()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
