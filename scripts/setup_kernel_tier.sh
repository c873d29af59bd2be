#!/usr/bin/env bash
# Setup for the opt-in `kernels` test tier (tests/test_kernels_triton.py): mamba-ssm's
# Triton SSD kernels run on CPU under Triton's interpreter, so looplab's CUDA dispatch
# is checked without a GPU. Then: python -m pytest -m kernels -q
#
# Installs into the current Python environment, without dependencies (so torch stays
# the CPU wheel): triton 3.9.0 (a ~290 MB download, ~1 GB installed), einops,
# packaging. Downloads mamba-ssm's source (a 216 kB sdist; nothing is built or
# installed) and unpacks it into the cache directory below, where the tests look for
# it unless LOOPLAB_MAMBA_SSM_SRC names another mamba_ssm-2.3.2.post1 folder.
set -euo pipefail

MAMBA_SSM_VERSION=2.3.2.post1
CACHE="${LOOPLAB_KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/looplab/kernel-tier}"
SRC="$CACHE/mamba_ssm-$MAMBA_SSM_VERSION"
PYTHON="${PYTHON:-python}"

"$PYTHON" -m pip install --no-deps triton==3.9.0 einops packaging wheel

if [ ! -f "$SRC/mamba_ssm/ops/triton/ssd_combined.py" ]; then
    mkdir -p "$CACHE"
    # The sdist's setup.py imports torch (and wheel) to prepare metadata: without
    # build isolation it finds the installed torch; MAMBA_SKIP_CUDA_BUILD keeps it
    # from looking for CUDA.
    MAMBA_SKIP_CUDA_BUILD=TRUE "$PYTHON" -m pip download --no-deps --no-build-isolation \
        --no-binary :all: "mamba-ssm==$MAMBA_SSM_VERSION" -d "$CACHE"
    tar -xzf "$CACHE/mamba_ssm-$MAMBA_SSM_VERSION.tar.gz" -C "$CACHE"
fi

echo "mamba-ssm source: $SRC"
if [ "$SRC" != "${XDG_CACHE_HOME:-$HOME/.cache}/looplab/kernel-tier/mamba_ssm-$MAMBA_SSM_VERSION" ]; then
    echo "not the tests' default location: export LOOPLAB_MAMBA_SSM_SRC=$SRC"
fi
