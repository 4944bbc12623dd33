#!/usr/bin/env bash
# Prepare what a CUDA machine without a package registry needs to run the upstream oracle (mimo_numerics.upstream):
# TileLang 0.1.8 (mamba-ssm 2.3.2.post1's own pin) and the runtime dependencies the GPU image lacks, as CPython 3.12 manylinux x86_64 wheels, plus the
# mamba-ssm 2.3.2.post1 sdist, packed into ONE xz tarball in a git-ignored folder (default: wheelhouse/).
#
# The wheels are stored unpacked inside the tarball because xz compresses the unpacked files far better than the
# deflate-compressed wheels (all five are ~82 MB as wheels, the tarball ~40 MB): that keeps the
# folder under the 64 MiB a device run may carry. scripts/use_upstream_wheels.sh re-zips them into wheels and installs
# them with pip --no-index --target.
#
# What the GPU image already has, so is NOT downloaded: torch (2.11 cu130), triton (3.6), numpy, cloudpickle,
# ml-dtypes, psutil, tqdm, typing-extensions. TileLang 0.1.8's Requires-Dist beyond those: apache-tvm-ffi (~=0.1.0,
# >=0.1.2; 0.1.8.post2 is the release current with it: newer ones fail to import tilelang 0.1.8), torch-c-dlpack-ext,
# z3-solver (>=4.13.0,<4.15.5); the upstream kernel files also import einops. (TileLang 0.1.15 runs stage 1 only:
# stage 2 does not compile under it; docs/workflow.md says how to install it by hand.)
#
# Usage: scripts/prepare_upstream_wheels.sh [OUT_DIR]      (run from the repository root, in the project venv: the
#        mamba-ssm sdist's metadata step imports torch, hence --no-build-isolation)
set -euo pipefail

OUT=${1:-wheelhouse}
PIP=${PIP:-"python -m pip"}
MAX_BYTES=$((64 * 1024 * 1024))
TARBALL=upstream_wheels.tar.xz

# Pinned so that every preparation gives the same environment.
WHEELS=(
  "tilelang==0.1.8"
  "apache-tvm-ffi==0.1.8.post2"
  "torch-c-dlpack-ext==0.1.5"
  "z3-solver==4.15.4.0"
  "einops==0.8.2"
)
SDIST="mamba-ssm==2.3.2.post1"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/dl" "$work/tree/wheels" "$work/tree/sdist" "$OUT"

echo "== downloading wheels for CPython 3.12, manylinux x86_64" >&2
$PIP download --no-deps --only-binary :all: --dest "$work/dl" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  "${WHEELS[@]}"

echo "== downloading the $SDIST sdist" >&2
# Preparing the sdist's metadata runs its setup.py, which imports torch and would try to build CUDA code:
# skip the build and reuse this environment's torch.
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=FALSE \
  $PIP download --no-deps --no-binary :all: --no-build-isolation --dest "$work/tree/sdist" "$SDIST"

echo "== unpacking wheels" >&2
for wheel in "$work"/dl/*.whl; do
  name=$(basename "$wheel")
  python -m zipfile -e "$wheel" "$work/tree/wheels/$name"
  echo "$(sha256sum "$wheel" | cut -d' ' -f1)  $name" >> "$work/tree/ORIGINAL_WHEELS.sha256"
done
(cd "$work/tree" && sha256sum sdist/* > SDIST.sha256)
{
  echo "prepared: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "target: CPython 3.12 manylinux x86_64 (GPU image: torch 2.11.0+cu130, triton 3.6.0, CUDA 13)"
  echo "wheels: ${WHEELS[*]}"
  echo "sdist: $SDIST"
  echo "install: . scripts/use_upstream_wheels.sh $OUT"
} > "$work/tree/README.txt"

echo "== compressing (xz -9e, this takes a few minutes)" >&2
tar -C "$work/tree" -cf - . | xz -9e -T1 > "$OUT/$TARBALL.part"
mv "$OUT/$TARBALL.part" "$OUT/$TARBALL"
(cd "$OUT" && sha256sum "$TARBALL" > "$TARBALL.sha256")

size=$(du -cb "$OUT" | tail -1 | cut -f1)
echo "== $OUT: $size bytes ($(du -sh "$OUT" | cut -f1))" >&2
ls -l "$OUT" >&2
if [ "$size" -ge "$MAX_BYTES" ]; then
  echo "error: $OUT is $size bytes, over the 64 MiB a device run may carry" >&2
  exit 1
fi
