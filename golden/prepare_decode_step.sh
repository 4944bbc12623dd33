#!/usr/bin/env bash
# Prepare, on a machine where pip reaches PyPI (no GPU needed), the three git-ignored folders the decode step's golden
# run carries to the GPU machine (docs/golden_data.md, "Making the decode step's golden data"):
#   .upstream_src  the three upstream files it runs, from a mamba-ssm git checkout at v2.3.2.post1;
#   .cute_step     upstream's CuTe mamba3_step_fn compiled ahead of time for sm_90a (golden/build_cute_step.py);
#   .whl           apache-tvm-ffi 0.1.9 for CPython 3.12 (the GPU image's Python), to load those modules.
# Usage, from the repository root:  bash golden/prepare_decode_step.sh MAMBA_GIT_DIR [PYTHON3.12]
# (CUTE_VENV=/tmp/cute by default: a Python 3.12 venv with the CuTe DSL's pinned versions, built if missing.)
# Then one device call carrying .whl, .cute_step and .upstream_src: bash golden/device_decode_step_run.sh $OUT
set -euo pipefail
mamba=${1:?usage: prepare_decode_step.sh MAMBA_GIT_DIR [PYTHON3.12]}
py312=${2:-python3.12}
venv=${CUTE_VENV:-/tmp/cute}
tag=v2.3.2.post1

if [[ ! -x "$venv/bin/python" ]]; then
  "$py312" -m venv "$venv"
  # nvidia-cuda-runtime: the libcudart.so.13 the compiled modules link against
  "$venv/bin/pip" install -q torch numpy nvidia-cutlass-dsl==4.5.0 quack-kernels==0.4.1 apache-tvm-ffi==0.1.9 \
    torch-c-dlpack-ext cuda-bindings nvidia-cuda-runtime==13.0.96 einops safetensors tqdm matplotlib
fi
"$venv/bin/pip" install -q --no-deps -e .

for f in mamba_ssm/ops/cute/mamba3/mamba3_step_fn.py mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py \
    mamba_ssm/ops/triton/mamba3/mamba3_mimo_rotary_step.py; do
  mkdir -p ".upstream_src/$(dirname "$f")"
  git -C "$mamba" show "$tag:$f" > ".upstream_src/$f"
done
CUTE_DSL_ARCH=sm_90a "$venv/bin/python" golden/build_cute_step.py --upstream-src .upstream_src --out .cute_step
"$venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d .whl apache-tvm-ffi==0.1.9
du -sh .upstream_src .cute_step .whl
