#!/usr/bin/env bash
# Everything looplab checks on a GPU machine, in one command (docs/gpu.md):
#     bash scripts/device_check.sh OUT_DIR [WHEELS_DIR]
# For an offline GPU machine with its own CUDA build of torch: the checkout is used from
# PYTHONPATH (never pip-installed: its torch pin would ask an index), and what it lacks
# comes from WHEELS_DIR (default: ./wheels beside this checkout), installed offline:
#   einops           a wheel (pure Python)
#   mamba-ssm        its sdist, unpacked, not built: looplab needs only its Triton
#                    kernels (MAMBA_SKIP_CUDA_BUILD), imported from the source
#   causal-conv1d    its sdist, built here against this torch and nvcc, for this GPU's
#                    architecture only, in the background: it took 6 minutes on a
#                    16-core H200 node, and the checks do not wait for it
# scripts/device_check.py runs `looplab doctor` in full and the CUDA tests (pytest -m
# cuda) at once, the conv in torch until causal-conv1d is there (models/ops/conv.py),
# and writes doctor.json, doctor.md, cuda-tests.xml and report.md to OUT_DIR. Once the
# build is in, a second pass (`--quick`: the kernel checks, generation, compiled
# decoding) runs with causal-conv1d's kernels and writes OUT_DIR/causal-conv1d/. Between
# the two, once the build is over, C4-batch1 and C4-growth are judged at the protocol's
# GPU setting (sweeps/gpu_claims.py, judge_gpu_claims below) into OUT_DIR/gpu_claims/.
# Exit status 0 only when every check and test passes and the claims ran without an
# error (a verdict, whichever it is, is a result). On a machine without a GPU it builds
# nothing and the GPU checks skip, saying so.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:?usage: bash scripts/device_check.sh OUT_DIR [WHEELS_DIR]}"
WHEELS="${2:-$REPO/wheels}"
PY="${PYTHON:-$(command -v python || command -v python3)}"  # the GPU image has python3 alone
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
say() { echo "[device_check] $*" | tee -a "$LOG"; }
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
GPU=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
say "torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1), GPU: $GPU, wheels: $WHEELS"

offline_install() {  # name, then pip's arguments
    local name="$1"; shift
    if [ -d "$WHEELS" ]; then
        "$PY" -m pip install --no-index --find-links "$WHEELS" "$@" >>"$LOG" 2>&1 \
            && say "$name: installed from $WHEELS" || say "$name: could not be installed from $WHEELS (see $LOG)"
    else
        say "$name: missing, and no $WHEELS to install it from"
    fi
}

# causal-conv1d's setup.py compiles its kernels for nine GPU architectures (sm_75 to
# sm_121); built for this GPU's alone it takes a fraction of the time, which a lent
# machine's few minutes need. Its sdist is unpacked, and the other architectures' two
# lines each become `pass`; where this GPU's is not among them, it builds them all.
only_this_gpu() {  # setup.py, architecture ("90")
    "$PY" - "$1" "$2" <<'PY'
import re, sys
path, arch = sys.argv[1], sys.argv[2]
text = open(path).read()
pair = re.compile(r'cc_flag\.append\("-gencode"\)\n(\s*)cc_flag\.append\("arch=compute_(\d+),code=sm_\2"\)')
if arch not in [m.group(2) for m in pair.finditer(text)]:
    print(f"sm_{arch} is not among setup.py's architectures: building them all")
    sys.exit(0)
text = pair.sub(lambda m: m.group(0) if m.group(2) == arch else f"pass\n{m.group(1)}pass", text)
compile(text, path, "exec")
open(path, "w").write(text)
print(f"building for sm_{arch} only")
PY
}

build_causal_conv1d() {
    local sdist dir arch started
    sdist=$(ls "$WHEELS"/causal_conv1d-*.tar.gz 2>/dev/null | head -1)
    if [ -z "$sdist" ]; then
        say "causal-conv1d: missing, and no causal_conv1d-*.tar.gz in $WHEELS: the CUDA kernels will be off"
        return
    fi
    started=$SECONDS
    mkdir -p "$OUT/src" && tar -xzf "$sdist" -C "$OUT/src"
    dir=$(ls -d "$OUT"/src/causal_conv1d-*/ | head -1)
    arch=$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())')
    say "causal-conv1d: $(only_this_gpu "$dir/setup.py" "$arch")"
    if MAX_JOBS="${MAX_JOBS:-$(nproc)}" CAUSAL_CONV1D_FORCE_BUILD=TRUE "$PY" -m pip install --no-index --no-deps \
        --no-build-isolation "$dir" >>"$LOG" 2>&1; then
        say "causal-conv1d: built and installed in $((SECONDS - started)) s"
    else
        say "causal-conv1d: the build failed after $((SECONDS - started)) s (see $LOG)"
    fi
}

# C4-batch1 and C4-growth (sweeps/gpu_claims.py) at the protocol's GPU setting
# (sweeps/protocol.GpuSpeed: paper-140m's shape, 2048 tokens, batches 1 and 64, padded,
# bf16, skip:0.2, seeds 0-4), through device_check.py so that the Triton kernels it
# registers serve the prefills. They run once causal-conv1d's build is over (its nvcc
# jobs would slow the host's kernel launches, which batch 1 is bound by) and before the
# second pass (they have no GPU figure yet). Their time on an H200, estimated: a full
# prefill of 64 × 2048 tokens is 4 loops × 0.22 GFLOP a token (looplab/costs/resources.py
# prefill_flops) = 115 TFLOP, about 0.5 s at a third of the 790 TFLOP/s bf16 peak, and
# skip about 0.3 s; per seed at batch 64 a probe, 2 warm-ups and 5 repeats of both
# (gpu_claims.WARMUP, REPEATS) make about 7 s, at batch 1 (launch-bound, tens of ms a
# prefill) under 1 s; 5 seeds, each model built on the CPU (~2 s), then imports and
# Triton's first calls (~30 s): about 1.3 min, under 2. A verdict is a result: only an
# error (an exit status other than 0) fails the check.
judge_gpu_claims() {
    local code
    if [ "$GPU" != 1 ]; then
        say "GPU claims: skipped, no GPU (C4-batch1 and C4-growth are judged only on one; on a CPU they are descriptive)"
        return 0
    fi
    "$PY" "$REPO/scripts/device_check.py" "$OUT/gpu_claims" --gpu-claims ${MAMBA_SRC:+--mamba-ssm-src "$MAMBA_SRC"} \
        2>&1 | tee -a "$LOG"
    code=${PIPESTATUS[0]}
    say "GPU claims done (exit $code): $OUT/gpu_claims/gpu_claims.md"
    return "$code"
}

"$PY" -c 'import einops' 2>/dev/null || offline_install einops einops
BUILD_PID=""
if [ "$GPU" = 1 ] && ! "$PY" -c 'import causal_conv1d' 2>/dev/null; then
    build_causal_conv1d &
    BUILD_PID=$!
fi
MAMBA_SRC=""
if ! "$PY" -c 'import mamba_ssm' 2>/dev/null; then
    SDIST=$(ls "$WHEELS"/mamba_ssm-*.tar.gz 2>/dev/null | head -1)
    if [ -n "$SDIST" ]; then
        mkdir -p "$OUT/src" && tar -xzf "$SDIST" -C "$OUT/src"
        MAMBA_SRC=$(ls -d "$OUT"/src/mamba_ssm-*/ | head -1)
        say "mamba-ssm: its Triton kernels from $MAMBA_SRC (not built)"
    else
        say "mamba-ssm: not installed and no sdist in $WHEELS: the scan and step kernels will be skipped"
    fi
fi

"$PY" "$REPO/scripts/device_check.py" "$OUT" ${MAMBA_SRC:+--mamba-ssm-src "$MAMBA_SRC"} 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
say "first pass done (exit $status): $OUT/report.md"
if [ -n "$BUILD_PID" ]; then
    say "waiting for causal-conv1d's build"
    wait "$BUILD_PID"
fi
judge_gpu_claims || status=$?
if [ -n "$BUILD_PID" ]; then
    if "$PY" -c 'import causal_conv1d' 2>/dev/null; then
        "$PY" "$REPO/scripts/device_check.py" "$OUT/causal-conv1d" --quick ${MAMBA_SRC:+--mamba-ssm-src "$MAMBA_SRC"} \
            2>&1 | tee -a "$LOG"
        second=${PIPESTATUS[0]}
        say "second pass, with causal-conv1d, done (exit $second): $OUT/causal-conv1d/report.md"
        [ "$second" = 0 ] || status=$second
    fi
fi
exit "$status"
