#!/usr/bin/env bash
# The GPU runs issue 44 owes, on a CUDA machine without a package registry, from the repository root; outputs under
# $OUT (default ./out/owed):
#
#   bash scripts/device_owed_runs.sh sigmoid     # scripts/check_cuda_sigmoid.py over all 2^32 float32 inputs
#   bash scripts/device_owed_runs.sh nonfinite   # scripts/gpu_nonfinite_upstream.py (upstream's TileLang stage 1;
#                                                #  needs wheelhouse/, scripts/use_upstream_wheels.sh)
#   bash scripts/device_owed_runs.sh ranking     # the whole op's one-site-off ranking on CUDA with backend="triton"
#                                                #  (every variant's kernels compiled ahead in parallel; RANKING_CASES:
#                                                #  comma-separated golden cases, default three)
#   bash scripts/device_owed_runs.sh kernels_golden  # issue 43, acceptance 3: the chain on the kernels against the
#                                                #  H200 on every golden case, the long ones included, beside the
#                                                #  reference chain under its three policies (same GPU)
#   bash scripts/device_owed_runs.sh native_lp   # issue 43: stage 2's cvt.rn rounding (Stage2Tiles.native_lp, plan
#                                                #  suffix n): its GPU bit test, then each stage-2 launch timed alone
#                                                #  at (d) under the default and the native plans (NATIVE_PLANS)
#   bash scripts/device_owed_runs.sh narrow      # issue 43: at N = 32, P = 64 the stage-2 forms the default leaves off
#                                                #  there (cvt.rn, 64-row k-side / q-side) against the reference, one
#                                                #  test per form (which gave the golden run's wrong dq at N = 32)
set -uo pipefail
OUT=${OUT:-out/owed}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
# no editable install on the device machine: let PYTHONPATH find mimo_numerics.kernels (the kernels/ folder)
python -c "import mimo_numerics.kernels" 2>/dev/null || ln -sfn ../kernels mimo_numerics/kernels
for what in "$@"; do
  case "$what" in
    sigmoid)
      timeout "${SIGMOID_TIMEOUT:-300}" python scripts/check_cuda_sigmoid.py --out "$OUT/cuda_sigmoid.md" 2>&1 \
        | tail -20 | tee -a "$OUT/log.txt" ;;
    nonfinite)
      # shellcheck disable=SC1091
      . scripts/use_upstream_wheels.sh wheelhouse /tmp/site
      timeout "${NONFINITE_TIMEOUT:-420}" python scripts/gpu_nonfinite_upstream.py \
        --out "$OUT/gpu_nonfinite_upstream.md" 2>&1 | tail -20 | tee -a "$OUT/log.txt" ;;
    ranking)
      timeout "${RANKING_TIMEOUT:-540}" python scripts/rank_whole_op_sites.py --device cuda --backend triton --quiet \
        --cases "${RANKING_CASES:-g_B1_S64_H2_N64_P64_R4_C16_zdo,g_B2_S48_H4_G1_N64_P64_R4_C16_gqa,g_B1_S64_H2_N64_P64_R4_C16_seedformula}" \
        --out "$OUT/mamba3_mimo_site_ranking_cuda_triton.md" 2>&1 | tail -20 | tee -a "$OUT/log.txt" ;;
    kernels_golden)
      timeout "${KERNELS_GOLDEN_TIMEOUT:-540}" python scripts/measure_fp32_level_whole_op.py --device cuda --kernels \
        --out "$OUT/fp32_level_whole_op_kernels_cuda.md" 2>&1 | tail -20 | tee -a "$OUT/log.txt" ;;
    native_lp)
      timeout "${NATIVE_TEST_TIMEOUT:-300}" python -m pytest -q -p no:cacheprovider \
        tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_kernels_gpu.py -k native_lp 2>&1 | tail -20 | tee -a "$OUT/log.txt"
      timeout "${NATIVE_BENCH_TIMEOUT:-240}" python benchmarks/bench_stage2_launches.py --shape d \
        --runs "${NATIVE_PLANS:-32x4k64q64,32x4k64q64n,16x4k64q64n,32x4k64x8q64n}" --out "$OUT" 2>&1 | tail -20 \
        | tee -a "$OUT/log.txt" ;;
    narrow)
      timeout "${NARROW_TIMEOUT:-300}" python -m pytest -q -s -p no:cacheprovider \
        tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_kernels_gpu.py -k plans_below_64 2>&1 | tail -30 \
        | tee -a "$OUT/log.txt" ;;
    *) echo "unknown run $what" >&2; exit 2 ;;
  esac
done
