#!/usr/bin/env bash
# One device call: upstream's decode step, both kernels chained as Mamba3.step chains them (the Triton rotary kernel
# from .upstream_src, the CuTe state update from the modules golden/build_cute_step.py compiled ahead of time in
# .cute_step), on decode_cases.STEP_CASES. Carry .whl (apache-tvm-ffi 0.1.9), .cute_step and .upstream_src
# (docs/golden_data.md). Usage on the GPU machine, repository root: bash golden/device_decode_step_run.sh OUT_DIR
set -uo pipefail
out=${1:?usage: device_decode_step_run.sh OUT_DIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/apache_tvm_ffi-*.whl \
  || exit 2
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, triton, tvm_ffi; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 golden/make_golden_decode.py --part step --cute-lib .cute_step --upstream-src .upstream_src \
  --out "$out/upstream_h200_decode_step_cases.pt" 2>&1 | tee "$out/decode_step.log"
rc=${PIPESTATUS[0]}
sha256sum "$out/upstream_h200_decode_step_cases.pt" 2>/dev/null
exit "$rc"
