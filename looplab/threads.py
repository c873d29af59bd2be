"""How many CPU threads torch uses: chosen from the CPUs a process was given, never
inherited. torch's default is every core of the machine, whoever else is on it; under
load from another process that oversubscribed the cores and made decoding 11-30x and a
training step 3.3x slower than one thread in the same process (2-core machine).

In order of precedence, a process's threads are:
  1. what it was told (--threads N);
  2. the machine's free cores within its allocation: the CPUs it was allocated (a
     trial's or a stage's share, `within`; else the CPUs Ray assigned it inside a Ray
     task or actor, fractional shares rounded down to at least 1; else the CPUs it may
     run on) and of those no more than the machine has free: the CPUs less the cores
     busy right now (CPU time over a quarter second, from /proc/stat; the 1-minute load
     average where there is none, which lags: a job that ended a minute ago still
     counts), at least 1. An allocation is a promise of the scheduler, not of the
     machine: a neighbour outside Ray (another user's job) takes cores Ray believes
     free, and two threads on one free core made a shared stage 12-30x slower than
     the same stage in a trial (issue 53).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Threads:
    count: int
    why: str  # where the count came from, for the line a command prints

    def line(self) -> str:
        return f"torch threads: {self.count} ({self.why})"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_load(window: float = 0.25) -> float:
    """How many cores are busy now: the busy share of all CPUs' time over `window`
    seconds times the CPU count (/proc/stat); elsewhere the 1-minute load average."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
        if total1 > total0:
            return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / (total1 - total0))
    except (OSError, ValueError, IndexError):
        pass
    return load_average()


def load_average() -> float:
    """The 1-minute load average (0 where the system does not say)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def ray_cpus() -> int | None:
    """The CPUs Ray assigned this process, inside a Ray worker; None elsewhere. Ray is
    asked only where it is already imported (the library never imports it itself)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        context = ray.get_runtime_context()
        if context.worker.mode != ray.WORKER_MODE:  # the driver holds no allocation
            return None
        cpus = context.get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - an older or newer runtime context: fall back to the machine
        return None
    return None if cpus is None else max(1, int(cpus))


def choose(requested: int = 0, load: float | None = None, within: int | None = None) -> Threads:
    """The threads for this process (the module's docstring says in what order);
    `within`: the CPUs it was allocated, when its caller knows them."""
    if requested:
        return Threads(requested, "asked for")
    cpus = usable_cpus()
    load = machine_load() if load is None else load
    free = max(1, min(cpus, int(cpus - load + 0.5)))
    allocated = within if within is not None else ray_cpus()
    if allocated is None:
        return Threads(free, f"free cores: {cpus} CPUs, {load:.1f} busy")
    return Threads(min(max(1, allocated), free), f"allocated {allocated}; free cores: {cpus} CPUs, {load:.1f} busy")


_chosen: Threads | None = None  # what use() set in this process


def use(requested: int = 0, within: int | None = None) -> Threads:
    """Choose this process's threads and set torch's intra-op count to them."""
    import torch

    global _chosen
    _chosen = choose(requested, within=within)
    torch.set_num_threads(_chosen.count)
    return _chosen


def current() -> Threads:
    """torch's threads now, and where they came from (use(), or whoever set them)."""
    import torch

    count = torch.get_num_threads()
    if _chosen is not None and _chosen.count == count:
        return _chosen
    return Threads(count, "set by the caller" if _chosen is not None else "torch's default")
