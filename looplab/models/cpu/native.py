"""looplab's C++ CPU kernels (models/*.cpp), built on first use with torch's C++
extension loader: a C++ compiler and ninja, 25-35 s a kernel, cached by torch under
~/.cache/torch_extensions and rebuilt when the source changes. One home for how they
are built, so that every kernel is compiled the same way."""

from __future__ import annotations

from pathlib import Path


def build(name: str, source: Path):
    """The extension module `name` compiled from `source`; raises what the build raised."""
    import torch
    from torch.utils import cpp_extension

    # -march=native: built where it runs; -fopenmp-simd: the loops' simd pragmas, no OpenMP
    # runtime; CPU_CAPABILITY_*: ATen's vector type (at::vec::Vectorized) at this CPU's
    # width, with Sleef's vector exp, as Inductor builds its kernels.
    flags = ["-O3", "-march=native", "-fopenmp-simd"]
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
    if capability in ("AVX512", "AVX2"):
        flags.append(f"-DCPU_CAPABILITY_{capability}")
    return cpp_extension.load(name, [str(source)], extra_cflags=flags)


def first_line(e: BaseException) -> str:
    """A build failure in one line (compiler, ninja or header problems print pages)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
