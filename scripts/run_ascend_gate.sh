#!/usr/bin/env bash
# Run the Ascend compile gate (issue 7) in the triton-ascend environment built by scripts/setup_ascend_env.sh.
#
#   scripts/run_ascend_gate.sh                 # the gate (CI scope, ~11 min on 2 cores) + the gate's own tests
#   scripts/run_ascend_gate.sh --no-report     # what .ci/run runs (the same, without rewriting the report)
#   scripts/run_ascend_gate.sh --filter dq     # extra arguments go to scripts/ascend_compile_gate.py
#
# 1. scripts/ascend_compile_gate.py compiles the kernel specializations the launcher produces for the CI scope
#    (--scope ci: the launcher calls of CI_CASES, FORWARD_CI_CASES and STAGE2_CI_CASES: every preset, branch, dim
#    and tile class) for Ascend910B3 and Ascend910_9382 and rewrites reports/ascend_compile.md (pass --no-report in
#    CI). A failing gate stops after 10 failures and a single BiShengIR run after 900 s (the slowest specialization
#    took 130 s in reports/ascend_compile.md);
# 2. pytest runs tests/ascend (the gate catches a unified-buffer overflow and rejected constructs).
# Exits non-zero if either fails.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ASCEND_VENV:-$ROOT/.venv-ascend}"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "run_ascend_gate: $VENV missing; run scripts/setup_ascend_env.sh first" >&2
  exit 2
fi
cd "$ROOT"
# bishengir-compile from the ascendnpu-ir wheel on PATH (the gate finds it anyway; this helps manual runs).
BIN="$("$PY" -c 'import ascendnpuir, os; print(os.path.join(os.path.dirname(ascendnpuir.__file__), "bin"))')"
export PATH="$BIN:$PATH"

status=0
"$PY" scripts/ascend_compile_gate.py --quiet --max-failures 10 --timeout 900 "$@" || status=$?
"$PY" -m pytest tests/ascend -q -p no:cacheprovider
prc=$?
if [[ $status -eq 0 ]]; then status=$prc; fi
exit "$status"
