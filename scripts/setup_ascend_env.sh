#!/usr/bin/env bash
# Build the triton-ascend compile environment used by the Ascend compile gate (issue 7).
#
# triton-ascend installs the Python module `triton` itself, so it can never share a virtual
# environment with NVIDIA triton (the main .venv that runs the interpreter tests). This script
# creates a second one, .venv-ascend at the repository root (git-ignored through `.venv-*/`).
#
#   scripts/setup_ascend_env.sh            # create or reuse .venv-ascend
#   ASCEND_VENV=/some/dir scripts/setup_ascend_env.sh
#   scripts/setup_ascend_env.sh --force    # recreate from scratch
#
# Only PyPI packages are needed: the CANN toolkit (hivmc, ccec, ...) is not, and cannot be,
# installed here; the gate stops at the external `hivmc` step on purpose (see docs/ascend.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ASCEND_VENV:-$ROOT/.venv-ascend}"
PYTHON="${PYTHON:-python3}"

# Pinned set. torch must stay pinned at 2.13.0: the machines carry that wheel locally, a plain
# `torch` would download gigabytes. triton-ascend imports pybind11 without declaring it.
PKGS=(
  "torch==2.13.0"
  "triton-ascend==3.2.0"
  "ascendnpu-ir==1.2.0"
  "pybind11"
  "numpy"
  "pytest"
)

if [[ "${1:-}" == "--force" ]]; then
  rm -rf "$VENV"
fi

stamp="$VENV/.mimo-ascend-stamp"
want="$(printf '%s\n' "${PKGS[@]}")"
install_project() {
  # The project itself (no dependencies: they are all above, and matplotlib is not needed here).
  local log="$VENV/.mimo-install.log"
  if ! "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
}

if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup_ascend_env: reusing $VENV"
  # an editable install made from another checkout would compile that checkout's kernels: point it here
  where="$(cd / && "$VENV/bin/python" -c 'import mimo_numerics.kernels as k, os; print(os.path.dirname(os.path.realpath(k.__file__)))' 2>/dev/null || true)"
  if [[ "$where" != "$(cd "$ROOT/kernels" && pwd -P)" ]]; then
    echo "setup_ascend_env: the project was installed from ${where:-nowhere}; reinstalling it from $ROOT"
    install_project
  fi
else
  start=$(date +%s)
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip "setuptools>=64"
  # triton-ascend declares no dependency on NVIDIA triton, but torch's Linux wheel may: install
  # torch first, then remove any NVIDIA triton so triton-ascend owns the `triton` module.
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  "$VENV/bin/python" -m pip uninstall --quiet -y triton >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install --quiet "${PKGS[@]}"
  install_project
  echo "$want" > "$stamp"
  echo "setup_ascend_env: built $VENV in $(( $(date +%s) - start )) s"
fi

# Sanity check: the `triton` module must be triton-ascend and bishengir-compile must be shipped.
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, os, sys
import triton
try:
    md.version("triton-ascend")
except md.PackageNotFoundError:
    sys.exit("setup_ascend_env: triton-ascend is not installed in this venv")
import ascendnpuir  # noqa: F401  (ships bishengir-compile)
binp = os.path.join(os.path.dirname(ascendnpuir.__file__), "bin", "bishengir-compile")
if not os.access(binp, os.X_OK):
    sys.exit(f"setup_ascend_env: {binp} missing or not executable")
print(f"setup_ascend_env: triton {triton.__version__} (triton-ascend {md.version('triton-ascend')}), "
      f"ascendnpu-ir {md.version('ascendnpu-ir')}, bishengir-compile at {binp}")
EOF
