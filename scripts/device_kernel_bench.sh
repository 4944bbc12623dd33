#!/usr/bin/env bash
# One GPU session's kernel measurements (issue 43), on a CUDA machine without a package registry, from the
# repository root; everything it writes goes to $OUT (default ./out/kernel_bench). Two parts, each within one call
# of the device tool (10 minutes):
#
#   bash scripts/device_kernel_bench.sh bench [SHAPES=a,d] [PLANS=64x4,32x4,32x8,16x4,64x4w1,64x4w1s6,64x4w2s4]
#       the whole op on kernels step by step beside upstream's kernels (benchmarks/bench_steps.py; --upstream after
#       scripts/use_upstream_wheels.sh when wheelhouse/ was carried), stage 2 under each plan;
#   bash scripts/device_kernel_bench.sh checks
#       the GPU tests of the kernels (stage 2; the whole op on kernels at S = 2048, 8192), then the cold first call
#       with and without compiling ahead (benchmarks/bench_first_call.py, empty Triton caches).
set -uo pipefail
OUT=${OUT:-out/kernel_bench}
MODE=${1:-bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
# no editable install on the device machine: let PYTHONPATH find mimo_numerics.kernels (the kernels/ folder)
python -c "import mimo_numerics.kernels" 2>/dev/null || ln -sfn ../kernels mimo_numerics/kernels
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
if [ "$MODE" = bench ]; then
  UP=""
  if [ -f wheelhouse/upstream_wheels.tar.xz ]; then
    # shellcheck disable=SC1091
    . scripts/use_upstream_wheels.sh wheelhouse /tmp/site && UP="--upstream"
  fi
  export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
  timeout "${BENCH_TIMEOUT:-560}" python benchmarks/bench_steps.py --shapes "${2:-a,d}" $UP \
    --stage2-plans "${3:-64x4,32x4,32x8,16x4,64x4w1,64x4w1s6,64x4w2s4}" --out "$OUT" --note "${NOTE:-}" 2>&1 | tee -a "$OUT/bench_log.txt"
else
  export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
  timeout 260 python -m pytest -q -p no:cacheprovider -s tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_kernels_gpu.py \
    tests/ops/mamba3_mimo/test_whole_op_kernels_gpu.py -k "not golden" 2>&1 | tail -25 | tee -a "$OUT/checks_log.txt"
  for flag in "--per-kernel" "--precompile --workers 8"; do
    TRITON_CACHE_DIR=$(mktemp -d) timeout 100 python benchmarks/bench_first_call.py --policy upstream_sm90 $flag \
      2>&1 | tail -30 | tee -a "$OUT/checks_log.txt"
  done
fi
