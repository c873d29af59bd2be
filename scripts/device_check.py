"""The GPU machine's check, in one process (scripts/device_check.sh runs it): `looplab
doctor` in full, then the CUDA tests (pytest -m cuda), then a report in OUT:
doctor.json, doctor.md, cuda-tests.xml (JUnit) and report.md.

    python scripts/device_check.py OUT [--mamba-ssm-src DIR] [--preset paper-140m] [--quick | --gpu-claims]

--quick: `looplab doctor --quick` (environment, peaks, kernel correctness, generation,
compiled decoding) and no CUDA tests: the second pass, once causal-conv1d is built.

--gpu-claims: instead of the doctor, `python -m sweeps.gpu_claims OUT` (C4-batch1 and
C4-growth at the protocol's GPU setting) in this process, where the Triton kernels
that --mamba-ssm-src registers (below) serve its prefills. Exit status 0 whatever the verdicts, 2 on a bad
input, 1 on an error.

--mamba-ssm-src: a mamba-ssm source tree whose CUDA extension was not built
(MAMBA_SKIP_CUDA_BUILD): its package __init__ imports that extension and fails, so the
package is registered bare, with its folder as its path, and looplab imports the Triton
kernels it needs (mamba_ssm.ops.triton.*) from it. Only when `import mamba_ssm` fails.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import types
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def register_triton_only(src: Path) -> str:
    import importlib

    try:
        importlib.import_module("mamba_ssm")  # a full install needs nothing
        return "mamba_ssm imports as installed"
    except Exception as e:  # noqa: BLE001 - the CUDA extension is missing: fall back to the source
        reason = f"{type(e).__name__}: {e}"
    package = src / "mamba_ssm"
    if not (package / "ops" / "triton" / "ssd_combined.py").is_file():
        return f"mamba_ssm does not import ({reason}) and {src} holds no mamba_ssm source"
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        del sys.modules[name]
    module = types.ModuleType("mamba_ssm")
    module.__path__ = [str(package)]
    sys.modules["mamba_ssm"] = module
    return f"mamba_ssm's Triton kernels from {package} (its package import failed: {reason[:120]})"


def cuda_test_files() -> list[str]:
    """The test modules that hold CUDA tests. Collecting all of tests/ would import modules
    that need Ray, MLflow or polars at their top, which a GPU machine's image lacks: a
    collection error there stops pytest before any CUDA test runs."""
    return [str(p) for p in sorted((REPO / "tests").glob("test_*.py")) if "mark.cuda" in p.read_text()]


def judge_gpu_claims(out: Path) -> int:
    """sweeps.gpu_claims into OUT. In this process, not a `python -m` of its own: a new
    process would not see the kernels register_triton_only made importable, and would
    time the torch scan instead of the paper's kernels."""
    from sweeps.gpu_claims import main as gpu_claims

    return gpu_claims([str(out)])


def junit_counts(path: Path) -> dict[str, int]:
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    return {k: int(suite.get(k, 0)) for k in keys} if suite is not None else {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--mamba-ssm-src", default="")
    p.add_argument("--preset", default=None, help="the training probe's preset (default: the doctor's)")
    p.add_argument("--quick", action="store_true", help="the doctor's quick checks, no CUDA tests")
    p.add_argument("--gpu-claims", action="store_true", help="sweeps.gpu_claims into OUT instead of the doctor")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sys.path.insert(0, str(REPO))
    source = register_triton_only(Path(args.mamba_ssm_src)) if args.mamba_ssm_src else "as installed"
    print(f"[device_check] mamba-ssm: {source}", flush=True)
    if args.gpu_claims:
        return judge_gpu_claims(out)

    from looplab import doctor

    checks = doctor.run(quick=args.quick, preset=args.preset, progress=lambda c: print(c.line(), flush=True))
    doctor.report_json(checks, out / "doctor.json")
    (out / "doctor.md").write_text(doctor.report_markdown(checks) + "\n")

    code = 5  # pytest's "no tests collected": --quick runs none
    if not args.quick:
        import pytest

        code = pytest.main(
            [
                "-q",
                "-rs",
                "-m",
                "cuda",
                "-p",
                "no:cacheprovider",
                f"--junitxml={out / 'cuda-tests.xml'}",
                # tests/test_gpu.py's kernel and generation tests assert the doctor's own
                # checks, which ran above: on a lent machine's minutes they run once
                "-k",
                "not the_kernels_match_the_torch_path and not generation_in_every_policy",
                *cuda_test_files(),
            ]
        )
    tests = junit_counts(out / "cuda-tests.xml")
    failed = [c for c in checks if c.status == doctor.FAIL]
    lines = [
        f"# Device check: {platform.node()}",
        "",
        f"- mamba-ssm: {source}",
        f"- doctor: {len(checks) - len(failed)} of {len(checks)} checks passed or skipped, {len(failed)} failed",
        f"- CUDA tests (pytest -m cuda): {'not run (--quick)' if args.quick else tests or 'no report'} (exit {int(code)})",
        f"- {time.perf_counter() - started:.0f} s in all",
        "",
        doctor.report_markdown(checks),
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"[device_check] report: {out / 'report.md'}", flush=True)
    return 0 if not failed and int(code) in (0, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
