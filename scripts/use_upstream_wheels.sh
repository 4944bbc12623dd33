# Source this on a CUDA machine without a package registry, from the repository root:
#
#     . scripts/use_upstream_wheels.sh [WHEEL_DIR=wheelhouse] [SITE=/tmp/site]
#
# It unpacks WHEEL_DIR/upstream_wheels.tar.xz (made by scripts/prepare_upstream_wheels.sh), re-zips the unpacked
# wheels, installs them with pip --no-index --no-deps --target SITE, unpacks the mamba-ssm sdist into SITE/src, and
# exports PYTHONPATH (SITE and the repository root, so `python -m mimo_numerics` works without installing it) and
# MIMO_NUMERICS_UPSTREAM_SRC (where mimo_numerics.upstream finds the kernel source). Idempotent: a second run reuses
# SITE when its stamp matches the tarball.

_uw_untar() {  # python's tarfile: no dependency on xz-utils being installed
  python - "$1" "$2" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(sys.argv[2], filter="data")
    else:
        tar.extractall(sys.argv[2])
PY
}

_uw_main() {
  local wheel_dir=${1:-wheelhouse} site=${2:-/tmp/site}
  local tarball="$wheel_dir/upstream_wheels.tar.xz"
  local repo
  repo=$(pwd)
  if [ ! -f "$tarball" ]; then
    echo "use_upstream_wheels: $tarball not found (run scripts/prepare_upstream_wheels.sh where pip can reach PyPI," \
         "then carry $wheel_dir to this machine)" >&2
    return 1
  fi
  if [ -f "$wheel_dir/upstream_wheels.tar.xz.sha256" ]; then
    (cd "$wheel_dir" && sha256sum -c --quiet upstream_wheels.tar.xz.sha256) || {
      echo "use_upstream_wheels: $tarball does not match its sha256 file" >&2; return 1; }
  fi
  local stamp
  stamp=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$stamp" ]; then
    local work
    work=$(mktemp -d) || return 1
    _uw_untar "$tarball" "$work" || return 1
    python - "$work/wheels" <<'PY' || return 1
import os, sys, zipfile
root = sys.argv[1]
for name in sorted(os.listdir(root)):
    src = os.path.join(root, name)
    with zipfile.ZipFile(src + ".rezipped", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for folder, dirs, files in os.walk(src):
            dirs.sort()
            for f in sorted(files):
                path = os.path.join(folder, f)
                zf.write(path, os.path.relpath(path, src))
    os.rename(src, src + ".dir")
    os.rename(src + ".rezipped", src)
PY
    rm -rf "$site" && mkdir -p "$site/src" || return 1
    python -m pip install --no-index --no-deps --no-compile --quiet --target "$site" "$work"/wheels/*.whl || return 1
    _uw_untar "$work"/sdist/mamba_ssm-*.tar.gz "$site/src" || return 1
    cp "$work/README.txt" "$site/WHEELHOUSE_README.txt"
    rm -rf "$work"
    echo "$stamp" > "$site/.stamp"
  fi
  local src
  src=$(ls -d "$site"/src/mamba_ssm-* | head -1)
  export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
  export MIMO_NUMERICS_UPSTREAM_SRC="$src"
  echo "use_upstream_wheels: PYTHONPATH=$PYTHONPATH" >&2
  echo "use_upstream_wheels: MIMO_NUMERICS_UPSTREAM_SRC=$MIMO_NUMERICS_UPSTREAM_SRC" >&2
  command -v nvcc >/dev/null 2>&1 || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || \
    echo "use_upstream_wheels: warning: no nvcc on PATH or in \${CUDA_HOME:-/usr/local/cuda}/bin; TileLang compiles" \
         "its kernels with nvcc" >&2
}
_uw_main "$@"
