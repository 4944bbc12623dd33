#!/usr/bin/env bash
# Run the default test suite under emulated CPUs, BLAS code paths and thread counts (docs/reproducibility.md).
#
# No test may depend on the CPU model, the thread count or the BLAS. One x86 machine with AVX-512 can emulate others:
#   ATEN_CPU_CAPABILITY   torch's own vectorised kernels: avx512 (native here), avx2, default (scalar)
#   MKL_ENABLE_INSTRUCTIONS / MKL_CBWR   torch's CPU BLAS (MKL) and MKL VML, which torch also uses for exp, tanh, ...
#   OPENBLAS_CORETYPE     NumPy's BLAS (OpenBLAS; Triton's CPU interpreter computes tl.dot with NumPy)
#   thread counts         torch.set_num_threads (torch caps OMP_NUM_THREADS at the core count, so the count is set
#                         in-process too) and OMP/MKL/OPENBLAS_NUM_THREADS for BLAS and subprocesses
#
# Usage: bash scripts/cpu_emulation_suite.sh [CONFIG ...] [-- PYTEST_ARGS ...]
#   CONFIG: native avx2 scalar compatible cbwr_avx2 threads1 threads4 (default: all but native), run one after
#   another (each takes the whole machine: ~3 min per configuration on an idle 2-core machine, 15-30 min on a busy one).
#   Logs go to $LOG_DIR (default ${TMPDIR:-/tmp}/cpu_emulation_logs/), one <config>.log each; a summary of failures
#   is printed at the end and the exit status is non-zero if any configuration failed.
# Run inside the project's virtual environment (scripts/test.sh sets one up).
set -uo pipefail
cd "$(dirname "$0")/.."

configs=()
while (($#)); do
    if [[ $1 == -- ]]; then shift; break; fi
    configs+=("$1"); shift
done
((${#configs[@]})) || configs=(avx2 scalar compatible cbwr_avx2 threads1 threads4)
pytest_args=("$@")
LOG_DIR=${LOG_DIR:-${TMPDIR:-/tmp}/cpu_emulation_logs}
mkdir -p "$LOG_DIR"

# The environment of one configuration, as NAME=VALUE words; the last word TORCH_THREADS=n (0: torch's default).
config_env() {
    case $1 in
        native)     echo "TORCH_THREADS=0" ;;
        # an AVX2-only x86 machine (AMD EPYC Zen 2/3, e.g. the CI runner): OpenBLAS picks Haswell kernels on Zen
        avx2)       echo "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell" \
                         "TORCH_THREADS=0" ;;
        # no AVX at all: torch's scalar kernels, MKL's SSE4.2 path, OpenBLAS's Nehalem kernels
        scalar)     echo "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 OPENBLAS_CORETYPE=Nehalem" \
                         "TORCH_THREADS=0" ;;
        # MKL's conditional-numerical-reproducibility path (another GEMM/VML code path) under torch's AVX2 kernels
        compatible) echo "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE TORCH_THREADS=0" ;;
        # MKL's reproducible AVX2 code path, with an AVX2 machine's torch and OpenBLAS kernels
        cbwr_avx2)  echo "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 OPENBLAS_CORETYPE=Haswell TORCH_THREADS=0" ;;
        threads1)   echo "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TORCH_THREADS=1" ;;
        threads4)   echo "OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 TORCH_THREADS=4" ;;
        *) echo "unknown configuration $1 (native avx2 scalar compatible cbwr_avx2 threads1 threads4)" >&2; return 1 ;;
    esac
}

# pytest in-process after torch.set_num_threads(TORCH_THREADS), which prints what torch actually uses
RUNNER='import os, sys, torch
n = int(os.environ.pop("TORCH_THREADS"))
if n:
    torch.set_num_threads(n)
print(f"cpu emulation: capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads",
      flush=True)
import pytest
sys.exit(pytest.main(sys.argv[1:]))'

status=0
summary=()
for config in "${configs[@]}"; do
    words=$(config_env "$config") || exit 2
    log="$LOG_DIR/$config.log"
    echo "=== $config: $words (log $log)"
    start=$SECONDS
    # shellcheck disable=SC2086
    env $words python -c "$RUNNER" -q -p no:cacheprovider -rfE "${pytest_args[@]}" >"$log" 2>&1
    rc=$?
    ((rc == 0)) || status=1
    result=$(tail -n 1 "$log")
    summary+=("$config (rc $rc, $((SECONDS - start)) s): $result")
    grep '^FAILED\|^ERROR' "$log" | sed "s/^/    /"
    echo "    $result"
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $status
