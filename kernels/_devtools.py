"""Developer tools: compile the kernels of a call for an NVIDIA target without a GPU, and read their resources.

Triton ships ptxas and cuobjdump with its NVIDIA backend, so ``triton.compile`` can produce sm_90 cubins on a CPU-only
machine. ``compile_launches`` compiles every launch of ``mimo_bwd_fwd.build_launches(..., backend="cuda")`` exactly
as a real launch would: same constexprs and options, and the JIT's own argument binder for the specialization
(integers equal to 1 become constexprs, 16-divisibility of integers and pointers). ``resource_usage`` reports
registers, stack (spills), shared memory and the static SASS instruction count. Used by ``tests/ops/mamba_mimo_bwd_fwd/test_kernels.py``
(the compiled path is checked in CI) and for cost estimates (``docs/kernels.md``). Tested with Triton 3.6 and 3.9
(it uses the JIT's internal binder API).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Dict, List


def nvidia_toolchain_available() -> bool:
    """True when the installed Triton has its NVIDIA backend with ptxas (no GPU needed)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False
    import triton.runtime.jit as jit

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return (os.path.exists(ptxas) and hasattr(jit, "create_function_from_signature")
            and hasattr(jit.JITFunction, "_pack_args"))


def compile_launch(launch, arch: int = 90):
    """Compile one ``Launch`` (from ``build_launches(..., backend="cuda")``) for ``sm_<arch>``; returns the kernel.

    Uses the JIT's own argument binder, so the specialization is the one a real launch gets: integer arguments
    equal to 1 become constexprs, integers and pointers divisible by 16 get the divisibility attribute.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(launch.constexprs)
    kwargs.update(launch.options)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    src = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


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
