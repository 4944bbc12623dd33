"""Developer tools: compile the kernels of a call for an NVIDIA target without a GPU, and read their resources.

Triton ships ptxas and cuobjdump with its NVIDIA backend, so ``triton.compile`` can produce sm_90 cubins on a CPU-only
machine. ``compile_launches`` compiles every launch of ``mimo_bwd_fwd.build_launches(..., backend="cuda")`` exactly
as the CUDA launcher would (same constexprs, options, 16-byte pointer alignment); ``resource_usage`` reports
registers, stack (spills), shared memory and the static SASS instruction count. Used by ``tests/test_kernels.py``
(the compiled path is checked in CI) and for cost estimates (``docs/kernels.md``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Dict, List

import torch

_TYPES = {torch.int16: "*i16", torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}


def nvidia_toolchain_available() -> bool:
    """True when the installed Triton has its NVIDIA backend with ptxas (no GPU needed)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return os.path.exists(ptxas)


def compile_launch(launch, arch: int = 90):
    """Compile one ``Launch`` (from ``build_launches(..., backend="cuda")``) for ``sm_<arch>``; returns the kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = launch.kernel.arg_names
    values = dict(zip(names, launch.args))
    values.update(launch.constexprs)
    signature, constexprs = {}, {}
    for name in names:
        value = values[name]
        if name in launch.constexprs:
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = _TYPES[value.dtype]
        else:
            signature[name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if signature[name].startswith("*")}
    src = ASTSource(launch.kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(launch.options))


def resource_usage(compiled) -> Dict[str, int]:
    """Registers, stack bytes (spills), shared bytes and static SASS instruction count of a compiled kernel."""
    import triton

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        res = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout

    def field(name):
        m = re.search(rf"{name}:(\d+)", res)
        return int(m.group(1)) if m else -1

    return {"regs": field("REG"), "stack": field("STACK"), "shared": compiled.metadata.shared,
            "num_warps": compiled.metadata.num_warps,
            "sass": len(re.findall(r"^\s+/\*[0-9a-f]+\*/", sass, re.M))}


def compile_launches(prepared, arch: int = 90) -> List[dict]:
    """Compile every launch of a ``Prepared`` call; one dict per launch with its name, grid and resources."""
    rows = []
    for launch in prepared.launches:
        compiled = compile_launch(launch, arch)
        rows.append(dict(name=launch.name, grid=launch.grid, **resource_usage(compiled)))
    return rows
