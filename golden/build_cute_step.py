#!/usr/bin/env python
"""Compile upstream's CuTe decode kernel (``mamba3_step_fn``) ahead of time on a machine without a GPU, for the
decode step's golden run.

Why: upstream's kernel is written in the CuTe DSL; compiling it just in time needs the DSL's MLIR compiler
(``nvidia-cutlass-dsl-libs-base``, a 75 MB wheel, 190 MB unpacked), more than a device call carries beside the
repository. The DSL also compiles ahead of time (its AOT export): the kernel's host code and its SASS cubin go into
one object file, linked here into a small shared library (about 100 KB) that ``tvm_ffi.load_module`` loads on the
GPU machine, which then needs only ``apache-tvm-ffi`` (2.3 MB).

What is compiled is upstream's own code path: the script executes upstream's ``mamba3_step_fn.py`` (mamba-ssm
2.3.2.post1, sha256-checked) and calls its ``mamba3_step_fn`` with CPU tensors that report ``is_cuda``; the function
checks them, builds its fake tensors and compiles exactly as on a GPU (``cute.compile(..., options="--enable-tvm-ffi")``
with ``tile_D=64, num_warps=4``, ``Mamba3.step``'s launch), stores the compiled function in its cache and then fails
to launch it on CPU tensors. The script takes the compiled function from the cache and exports it. The target is
``CUTE_DSL_ARCH=sm_90a``, the arch the DSL detects on an H100/H200. One module per specialization of
:data:`mimo_numerics.ops.mamba3_mimo.decode_cases.STEP_CASES` (state dim, head dim, rank, lp dtype, gate, output
projection; float32 for the state, A, D, dt, the gate and the projections, as the op's convention).

Versions: those current when mamba-ssm 2.3.2.post1 was released (2026-05-09), which also meet its pins
(``apache-tvm-ffi<=0.1.9``, ``quack-kernels>=0.3.4``): ``nvidia-cutlass-dsl==4.5.0`` (and its ``-libs-base``),
``quack-kernels==0.4.1``, ``apache-tvm-ffi==0.1.9``, ``cuda-bindings``, ``torch-c-dlpack-ext`` and a torch built for
CUDA 13 (its ``libcudart.so.13``, the runtime the GPU machine's torch loads). A newer DSL (4.8.1) does not work with
``apache-tvm-ffi`` 0.1.9.

Usage (Python 3.10+, no GPU needed; ``docs/golden_data.md`` has the whole recipe)::

    CUTE_DSL_ARCH=sm_90a python golden/build_cute_step.py --upstream-src MAMBA_SRC --out .cute_step

writes ``.cute_step/<function>.so`` and ``.cute_step/manifest.json`` (specializations, versions, source sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from mimo_numerics.ops.mamba3_mimo.decode_cases import STEP_CASES, cute_function_name, cute_specializations
from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream as _loader

STEP_FN_RELPATH = "mamba_ssm/ops/cute/mamba3/mamba3_step_fn.py"
STEP_FN_SHA256 = "5c82f3936308cfc90bb3bcdfd410c60fc80dfc3afe72c4338831341398cd7ca4"
ARCH = "sm_90a"
LAUNCH = dict(tile_D=64, num_warps=4)
PACKAGES = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "quack-kernels", "apache-tvm-ffi", "cuda-bindings",
            "torch")


class _ReportsCuda(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` is True: it passes upstream's device check, so the function compiles."""

    @property
    def is_cuda(self):  # noqa: D401 (a property)
        return True


def _load_step_module(root: Path):
    path = root / STEP_FN_RELPATH
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != STEP_FN_SHA256:
        raise SystemExit(f"{path}: sha256 {digest[:16]}... is not mamba-ssm 2.3.2.post1's ({STEP_FN_SHA256[:16]}...)")
    spec = importlib.util.spec_from_file_location("upstream_mamba3_step_fn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_arguments(spec: dict) -> dict:
    """Zero CPU tensors of one specialization's shapes and dtypes (batch 1, two heads), reporting ``is_cuda``."""
    N, P, R, lp = spec["N"], spec["P"], spec["R"], getattr(torch, spec["dtype"])
    B, H, f32 = 1, 2, torch.float32

    def t(*shape, dtype=f32):
        return torch.zeros(*shape, dtype=dtype).as_subclass(_ReportsCuda)

    return dict(state=t(B, H, P, N), Bstate=t(B, R, H, N, dtype=lp), Xstate=t(B, H, P, dtype=lp), A=t(B, H),
                B=t(B, R, H, N, dtype=lp), C=t(B, R, H, N, dtype=lp), D=t(H), x=t(B, H, P, dtype=lp), dt=t(B, H),
                trap=t(B, H), xproj=t(R, H, P), outproj=t(R, H, P) if spec["has_outproj"] else None,
                state_out=t(B, H, P, N),
                out=t(B, H, P, dtype=lp) if spec["has_outproj"] else t(B, R, H, P, dtype=lp),
                z=t(B, H, P, dtype=lp) if spec["has_z"] else None, zproj=t(R, H, P) if spec["has_z"] else None)


def _compile(module, spec: dict):
    """Upstream's compiled function for ``spec``, taken from its cache after its own compile."""
    cache = module.mamba3_step_fn.compile_cache
    before = set(cache)
    try:
        module.mamba3_step_fn(**_fake_arguments(spec), **LAUNCH)
    except Exception as error:  # the launch on CPU tensors fails after the compile; anything earlier is real
        new = set(cache) - before
        if not new:
            raise SystemExit(f"upstream's mamba3_step_fn failed before compiling {spec}: {error!r}") from error
    new = set(cache) - before
    if len(new) != 1:
        raise SystemExit(f"expected one new compiled specialization for {spec}, got {len(new)}")
    key = new.pop()
    return key, cache[key]


def _library(name: str, dist_relpath: str, package: str) -> Path:
    files = importlib.metadata.files(package) or []
    for file in files:
        if str(file).endswith(dist_relpath):
            return Path(file.locate()).resolve()
    raise SystemExit(f"{name} not found in the installed {package} ({dist_relpath})")


def _link(obj: Path, target: Path, cudart: Path) -> None:
    runtime = _library("the DSL's static CUDA-dialect runtime", "lib/libcuda_dialect_runtime_static.a",
                       "nvidia-cutlass-dsl-libs-base")
    tvm = _library("libtvm_ffi.so", "tvm_ffi/lib/libtvm_ffi.so", "apache-tvm-ffi")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler (cc/gcc) on PATH to link the shared library")
    command = [compiler, "-shared", "-o", str(target), str(obj), str(runtime), "-L", str(cudart.parent),
               f"-l:{cudart.name}", "-L", str(tvm.parent), "-ltvm_ffi"]
    subprocess.run(command, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream-src", default=None, help="the mamba-ssm 2.3.2.post1 source root or sdist")
    parser.add_argument("--out", required=True, help="the folder to write the modules and manifest.json into")
    parser.add_argument("--cudart", default=None, help="libcudart.so.13 to link against (default: torch's)")
    args = parser.parse_args(argv)
    if os.environ.get("CUTE_DSL_ARCH") != ARCH:
        raise SystemExit(f"set CUTE_DSL_ARCH={ARCH} (the arch the DSL detects on an H100/H200)")
    cudart = Path(args.cudart) if args.cudart else _library("libcudart.so.13", "lib/libcudart.so.13",
                                                            "nvidia-cuda-runtime")
    module = _load_step_module(_loader.find_source(args.upstream_src))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in cute_specializations():
            name = cute_function_name(spec)
            key, compiled = _compile(module, spec)
            obj = Path(tmp) / f"{name}.o"
            compiled.export_to_c(str(obj), function_name=name)
            target = out / f"{name}.so"
            _link(obj, target, cudart)
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            entries.append({"function": name, "file": target.name, "sha256": digest, "spec": spec,
                            "compile_key": repr(key), "cases": [n for n, f in STEP_CASES.items()
                                                                if cute_function_name(f) == name]})
            print(f"{name}: {target.stat().st_size} bytes", file=sys.stderr)
    versions = {p: importlib.metadata.version(p) for p in PACKAGES}
    versions["python"] = platform.python_version()
    manifest = {"source": {"relpath": STEP_FN_RELPATH, "sha256": STEP_FN_SHA256, "mamba_ssm": "2.3.2.post1"},
                "arch": ARCH, "launch": LAUNCH, "versions": versions, "modules": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(entries)} module(s) and manifest.json to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
