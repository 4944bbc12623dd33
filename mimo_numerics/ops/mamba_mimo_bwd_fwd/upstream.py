"""Upstream oracle: the real TileLang kernel ``mamba_mimo_bwd_fwd`` of ``mamba-ssm==2.3.2.post1``, run on CUDA.

Same arguments as ``mimo_numerics.reference.mamba_mimo_bwd_fwd`` (the 17 tensors, ``chunk_size``,
``rotary_dim_divisor``) and the same ``MimoBwdFwdOutputs``; there is no policy: the numerics are whatever the
kernel does. ``dmimo_o``/``dmimo_z`` are returned per batch (``[B, H, R, P]``), as the kernel writes them and as the
reference returns them (upstream's ``mamba_mimo_bwd_combined`` sums ``dmimo_o`` over B afterwards; this module does
not).

How the kernel is launched mirrors stage 1 of upstream's ``mamba_mimo_bwd_combined``: ``dtype`` is the string
``"bfloat16"``/``"float16"`` of the low-precision inputs; ``B, S, H, G`` are ``T.dynamic``; ``N, P, R, hasZ, hasD,
reduceO, chunk_size, rotary_dim_divisor, dtype``, ``threads=128`` and ``num_stages=0`` are compile-time constants;
outputs are allocated as upstream does (``states``/``dz`` in the lp dtype, ``qk_dot`` zero-filled, ``dmimo_o``/
``dmimo_z`` float32); absent optional buffers are passed as ``None`` (zero-filled placeholders if TileLang rejects
``None``, see ``absent=``). One difference, on by default
(``poison=True``): buffers upstream leaves uninitialised (``torch.empty``) are filled with NaN, so an element the
kernel never writes shows up as NaN instead of as stale memory.

Why the modules are loaded by hand. ``mamba_ssm/__init__.py`` imports ``selective_scan_interface`` and the model
classes, which import the compiled CUDA extension ``selective_scan_cuda`` (and ``causal_conv1d``); the sdist built
with ``MAMBA_SKIP_CUDA_BUILD=TRUE`` has no such extension, so ``import mamba_ssm.ops...`` fails before reaching the
kernel. The stage-1 kernel needs only two files: ``ops/tilelang/mamba3/mamba3_mimo_bwd.py`` and the module it
imports, ``ops/triton/mamba3/mamba3_mimo_utils.py``. :func:`load_upstream` therefore registers *stub* packages
(``mamba_ssm``, ``mamba_ssm.ops``, ...: empty modules whose ``__path__`` points into the source tree; no
``__init__.py`` is executed) in ``sys.modules`` and executes exactly those two files with
``importlib.util.spec_from_file_location`` under their real dotted names, so that the kernel's own absolute import
``from mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils import ...`` resolves. Consequence: in a process that used this
module, ``import mamba_ssm`` gives the stub; :func:`unload_upstream` removes what was registered. If the real
``mamba_ssm`` is already imported, it is used as is.

Where the source is found (:func:`find_source`), first match wins:

1. the ``source_dir`` argument (no environment needed);
2. the environment variable ``MIMO_NUMERICS_UPSTREAM_SRC``;
3. an installed ``mamba_ssm`` package (located with ``importlib.util.find_spec``, which does not execute it);
4. an unpacked sdist ``mamba_ssm-<version>/`` directly inside a ``sys.path`` entry or the current directory.

Each may be the sdist root (the directory holding ``mamba_ssm/``), the ``mamba_ssm`` package directory itself, or the
sdist tarball ``mamba_ssm-2.3.2.post1.tar.gz`` (unpacked once into a cache directory under the system temp dir).
The kernel file's sha256 must be :data:`KERNEL_SHA256` (the file of state-spaces/mamba 48582f0) unless
``check_hash=False``.

Errors: :class:`UpstreamUnavailable` when CUDA, TileLang, einops or the source is missing; :class:`UpstreamUnsupported`
for shapes the upstream kernel does not compile (``C·R`` not 4 and not a multiple of 8, e.g. ``C·R = 18``: TileLang
0.1.15 stops with ``Check failed: (stride == 4 || stride % 8 == 0) ... stride=18`` in its swizzled layout); both are
:class:`UpstreamError`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import tarfile
import tempfile
import types
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .outputs import MimoBwdFwdOutputs
from ...validation import Dims
from .validation import validate_inputs

#: The upstream release this oracle runs.
UPSTREAM_VERSION = "2.3.2.post1"
#: sha256 of ``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py`` in that sdist (= state-spaces/mamba 48582f0).
KERNEL_SHA256 = "76d0146c3c800f80597bf148c922b3d19cb55c1fe8d67f1c6d0ca8a834c752bd"
#: sha256 of ``mamba_ssm/ops/triton/mamba3/mamba3_mimo_utils.py`` in that sdist (informational).
UTILS_SHA256 = "efbdd750f53c67fd882ffe7a3af3d51ac4aaa341e764e0efa92ce8ea51c27b7c"
KERNEL_RELPATH = "mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py"
UTILS_RELPATH = "mamba_ssm/ops/triton/mamba3/mamba3_mimo_utils.py"
KERNEL_MODULE = "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd"
UTILS_MODULE = "mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils"
#: Environment variable consulted by :func:`find_source` when no ``source_dir`` is given.
ENV_VAR = "MIMO_NUMERICS_UPSTREAM_SRC"
#: The launch constants of upstream's ``mamba_mimo_bwd_combined`` for stage 1.
THREADS = 128
NUM_STAGES = 0

_STUB_PACKAGES = ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.mamba3",
                  "mamba_ssm.ops.tilelang", "mamba_ssm.ops.tilelang.mamba3")
_STUB_MARK = "__mimo_numerics_stub__"
_INSTALL_HINT = ("install the [upstream] extra (pip install 'mimo_numerics[upstream]'), or on a machine without a "
                 "package registry use the wheel folder: see docs/workflow.md and scripts/use_upstream_wheels.sh")

_loaded: Dict[str, Any] = {}  # "root", "module", "registered" (names we put in sys.modules)
_kernels: Dict[tuple, Any] = {}
PathLike = Union[str, os.PathLike]


class UpstreamError(RuntimeError):
    """Base class of the errors of this module."""


class UpstreamUnavailable(UpstreamError):
    """The upstream kernel cannot run here: no CUDA, no TileLang/einops, or no mamba-ssm source."""


class UpstreamUnsupported(UpstreamError):
    """An upstream limitation: the kernel does not compile or accept this shape (not a bug of this package)."""


# ---------------------------------------------------------------------------------------------------------- source
def sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extract_sdist(tarball: Path) -> Path:
    digest = sha256(tarball)[:16]
    target = Path(tempfile.gettempdir()) / "mimo_numerics_upstream" / digest
    done = target / ".complete"
    if not done.exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers()
                       if (m.isfile() or m.isdir()) and not m.name.startswith("/") and ".." not in Path(m.name).parts]
            tar.extractall(target, members=members)
        done.write_text("ok\n")
    roots = [p for p in target.iterdir() if (p / KERNEL_RELPATH).is_file()]
    if not roots:
        raise UpstreamUnavailable(f"{tarball}: the archive has no {KERNEL_RELPATH}; is it the mamba-ssm sdist?")
    return roots[0]


def _as_root(candidate: PathLike) -> Optional[Path]:
    """The sdist root (the directory holding ``mamba_ssm/``) that ``candidate`` designates, or None."""
    path = Path(candidate).expanduser()
    if path.is_file() and (path.name.endswith(".tar.gz") or path.name.endswith(".tgz")):
        return _extract_sdist(path)
    if (path / KERNEL_RELPATH).is_file():
        return path
    if path.name == "mamba_ssm" and (path.parent / KERNEL_RELPATH).is_file():
        return path.parent
    return None


def find_source(source_dir: Optional[PathLike] = None) -> Path:
    """The mamba-ssm source root (the directory that contains ``mamba_ssm/``), found as the module docstring says.

    Raises:
        UpstreamUnavailable: ``source_dir`` (or the environment variable) does not hold the kernel, or nothing found.
    """
    for label, value in (("source_dir", source_dir), (ENV_VAR, os.environ.get(ENV_VAR))):
        if value:
            root = _as_root(value)
            if root is None:
                raise UpstreamUnavailable(f"{label}={value}: no {KERNEL_RELPATH} there; pass the unpacked "
                                          f"mamba-ssm=={UPSTREAM_VERSION} sdist, its mamba_ssm/ directory or its "
                                          ".tar.gz")
            return root
    try:
        spec = importlib.util.find_spec("mamba_ssm")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        for location in spec.submodule_search_locations or ():
            root = _as_root(location)
            if root is not None:
                return root
    for entry in list(sys.path) + [os.getcwd()]:
        base = Path(entry or ".")
        if not base.is_dir():
            continue
        for child in sorted(base.glob("mamba_ssm-*")):
            if child.is_dir():
                root = _as_root(child)
                if root is not None:
                    return root
    raise UpstreamUnavailable(f"mamba-ssm=={UPSTREAM_VERSION} source not found: pass source_dir= (--upstream-src), "
                              f"set {ENV_VAR}, or {_INSTALL_HINT}")


def source_info(source_dir: Optional[PathLike] = None) -> Dict[str, str]:
    """``{"source_dir", "mamba_ssm" (version from PKG-INFO or __init__), "kernel_sha256"}`` of the found source."""
    root = find_source(source_dir)
    info = {"source_dir": str(root), "kernel_sha256": sha256(root / KERNEL_RELPATH)}
    for meta in (root / "PKG-INFO", root / "mamba_ssm" / "__init__.py"):
        if meta.is_file():
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:") or line.startswith("__version__"):
                    info["mamba_ssm"] = line.split(":", 1)[1].strip() if line.startswith("Version:") else \
                        line.split("=", 1)[1].strip().strip("\"'")
                    break
        if "mamba_ssm" in info:
            break
    return info


# ---------------------------------------------------------------------------------------------------------- loading
def _exec_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)  # as the import system does for submodules
    return module


def _real_package_loaded() -> bool:
    module = sys.modules.get("mamba_ssm")
    return module is not None and not getattr(module, _STUB_MARK, False)


def load_upstream(source_dir: Optional[PathLike] = None, *, check_hash: bool = True) -> types.ModuleType:
    """The upstream kernel module ``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd``, loaded without executing
    ``mamba_ssm/__init__.py`` (see the module docstring). Cached: later calls with the same source return it.

    Args:
        source_dir: where the source is (see :func:`find_source`); None for the documented lookup.
        check_hash (bool): require the kernel file to be the one of ``mamba-ssm==2.3.2.post1`` (default).

    Raises:
        UpstreamUnavailable: no source, a kernel file with another hash, a missing dependency (tilelang, einops,
            triton), or a different ``mamba_ssm`` already imported.
    """
    if _real_package_loaded() and source_dir is None and not os.environ.get(ENV_VAR):
        try:
            return importlib.import_module(KERNEL_MODULE)
        except ImportError as exc:
            raise UpstreamUnavailable(f"mamba_ssm is imported but its TileLang kernel does not import: {exc}; "
                                      f"{_INSTALL_HINT}") from exc
    files = ((UTILS_MODULE, UTILS_RELPATH, None),
             (KERNEL_MODULE, KERNEL_RELPATH, KERNEL_SHA256 if check_hash else None))
    return load_upstream_files(files, source_dir)[KERNEL_MODULE]


def load_upstream_files(files, source_dir: Optional[PathLike] = None) -> Dict[str, types.ModuleType]:
    """Execute upstream source files under their dotted names below stub packages (the module docstring says why).

    Args:
        files: ``(module_name, relpath, sha256 | None)`` in import order (a file's own absolute imports of other
            listed modules must come after them); a given sha256 must match the file.
        source_dir: where the source is (see :func:`find_source`).

    Returns:
        dict: module name -> module. Modules already loaded from the same source are reused.

    Raises:
        UpstreamUnavailable: as :func:`load_upstream`.
    """
    root = find_source(source_dir)
    for _, relpath, digest in files:
        if digest is not None and sha256(root / relpath) != digest:
            raise UpstreamUnavailable(f"{root / relpath}: sha256 {sha256(root / relpath)[:16]}... is not the kernel "
                                      f"of mamba-ssm=={UPSTREAM_VERSION} ({digest[:16]}...); pass check_hash=False "
                                      "to run it anyway")
    if _loaded.get("root") not in (None, root):
        unload_upstream()
    if _real_package_loaded():
        raise UpstreamUnavailable(f"a real mamba_ssm package is already imported from "
                                  f"{getattr(sys.modules['mamba_ssm'], '__file__', '?')}; load the upstream source "
                                  f"{root} in a fresh process")
    registered = _loaded.setdefault("registered", [])
    _loaded["root"] = root
    modules = _loaded.setdefault("modules", {})
    try:
        for name in _STUB_PACKAGES:
            if name in sys.modules:
                continue
            stub = types.ModuleType(name, f"stub package registered by mimo_numerics.upstream (source {root}); "
                                          "its __init__.py was not executed")
            stub.__path__ = [str(root.joinpath(*name.split(".")))]
            setattr(stub, _STUB_MARK, True)
            sys.modules[name] = stub
            registered.append(name)
            if "." in name:
                parent, _, child = name.rpartition(".")
                setattr(sys.modules[parent], child, stub)
        for name, relpath, _ in files:
            if name not in modules:
                modules[name] = _exec_file(name, root / relpath)
                registered.append(name)
    except ModuleNotFoundError as exc:
        unload_upstream()
        raise UpstreamUnavailable(f"the upstream kernel needs the Python package {exc.name!r}, which is not "
                                  f"installed; {_INSTALL_HINT}") from exc
    except ImportError as exc:
        unload_upstream()
        raise UpstreamUnavailable(f"the upstream kernel failed to import: {exc}; {_INSTALL_HINT}") from exc
    except BaseException:
        unload_upstream()
        raise
    _loaded["module"] = modules.get(KERNEL_MODULE)
    return {name: modules[name] for name, _, _ in files}


def _unregister(names) -> None:
    for name in reversed(list(names)):
        sys.modules.pop(name, None)


def unload_upstream() -> None:
    """Remove the stub packages and the two modules :func:`load_upstream` registered (and the compiled-kernel
    cache)."""
    _unregister(_loaded.get("registered", ()))
    _loaded.clear()
    _kernels.clear()


# ---------------------------------------------------------------------------------------------------------- checks
def refusal_reason(dims: Dims) -> Optional[str]:
    """Why the upstream kernel refuses these sizes, or None when it is expected to compile them.

    Known limitation (TileLang 0.1.15): the fused chunk ``C·R`` is the row stride of swizzled shared buffers, which
    must be 4 or a multiple of 8. Other failures are reported from the compiler when they happen.
    """
    fused = dims.chunk_size * dims.rank
    if fused != 4 and fused % 8:
        return (f"upstream limitation: the TileLang kernel does not compile chunk_size*rank = {dims.chunk_size}*"
                f"{dims.rank} = {fused} (its swizzled shared layouts need a stride of 4 or a multiple of 8; TileLang "
                f"0.1.15 stops with 'Check failed: (stride == 4 || stride % 8 == 0) is false: stride={fused}')")
    return None


def check_supported(dims: Dims) -> None:
    """Raise :class:`UpstreamUnsupported` when :func:`refusal_reason` gives a reason."""
    reason = refusal_reason(dims)
    if reason:
        raise UpstreamUnsupported(reason)


def check_cuda(device: Union[str, torch.device, None] = None) -> None:
    """Raise :class:`UpstreamUnavailable` unless CUDA is usable and ``device`` (when given) is a CUDA device."""
    if device is not None and torch.device(device).type != "cuda":
        raise UpstreamUnavailable(f"the upstream kernel runs on CUDA only; the inputs are on {device} (use "
                                  "--device cuda, or the reference/triton backends elsewhere)")
    if not torch.cuda.is_available():
        raise UpstreamUnavailable(f"CUDA is not available (torch {torch.__version__}); the upstream TileLang kernel "
                                  "needs an NVIDIA GPU: run it on a GPU machine (docs/workflow.md)")


def availability(source_dir: Optional[PathLike] = None) -> Tuple[bool, str]:
    """``(True, "ok")`` when CUDA, tilelang, einops and the source are present, else ``(False, reason)``.

    Does not load the kernel module.
    """
    try:
        check_cuda()
        for package in ("tilelang", "einops", "triton"):
            if importlib.util.find_spec(package) is None:
                raise UpstreamUnavailable(f"the Python package {package!r} is not installed; {_INSTALL_HINT}")
        find_source(source_dir)
    except UpstreamError as exc:
        return False, str(exc)
    return True, "ok"


# ---------------------------------------------------------------------------------------------------------- kernel
def _compile(module, dims: Dims, threads: int, num_stages: int):
    dtype = str(dims.lp_dtype).replace("torch.", "")
    key = (id(module), dims.state_dim, dims.value_dim, dims.rank, dims.has_z, dims.has_d, dims.reduce_o,
           dims.chunk_size, dims.rotary_dim_divisor, dtype, threads, num_stages)
    if key in _kernels:
        return _kernels[key]
    T = module.T
    try:
        kernel = module.mamba_mimo_bwd_fwd(
            T.dynamic("B"), T.dynamic("S"), T.dynamic("H"), T.dynamic("G"),
            dims.state_dim, dims.value_dim, dims.rank, dims.has_z, dims.has_d, dims.reduce_o,
            dims.chunk_size, dims.rotary_dim_divisor, dtype, threads, num_stages)
    except Exception as exc:  # TileLang raises TVM errors of various types
        text = str(exc)
        last = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
        if "Check failed" in text and "stride" in text:
            raise UpstreamUnsupported(f"upstream limitation: TileLang does not compile N={dims.state_dim} "
                                      f"P={dims.value_dim} R={dims.rank} C={dims.chunk_size}: {last}") from exc
        raise UpstreamError(f"TileLang failed to compile the upstream kernel for N={dims.state_dim} "
                            f"P={dims.value_dim} R={dims.rank} C={dims.chunk_size} dtype={dtype}: {last}") from exc
    _kernels[key] = kernel
    return kernel


def mamba_mimo_bwd_fwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, *, source_dir: Optional[PathLike] = None,
    check_hash: bool = True, poison: bool = True, absent: str = "auto", threads: int = THREADS,
    num_stages: int = NUM_STAGES,
) -> MimoBwdFwdOutputs:
    """Run the upstream TileLang stage-1 kernel on CUDA tensors.

    Args:
        dout..segsum, chunk_size, rotary_dim_divisor: as ``mimo_numerics.reference.mamba_mimo_bwd_fwd`` (all on one
            CUDA device; ``dout, q, k, v, z, trap`` bfloat16 or float16, which becomes the kernel's ``dtype``).
        source_dir: the mamba-ssm source (see :func:`find_source`).
        check_hash (bool): require the 2.3.2.post1 kernel file.
        poison (bool): NaN-fill the buffers upstream allocates with ``torch.empty`` (default True).
        absent (str): how absent optional buffers (``mimo_o``/``dmimo_o`` without reduced DOUT, ``z``/``mimo_z``/
            ``dz``/``dmimo_z`` without Z, ``d``) are passed: ``"none"`` as upstream does (``None``), ``"zeros"`` as
            zero-filled buffers of the declared shape (never read: the branch is compiled out), or ``"auto"``
            (default): ``None``, and zeros if TileLang rejects a ``None`` argument. :data:`last_launch` records which.
        threads, num_stages (int): launch constants; upstream uses 128 and 0.

    Returns:
        MimoBwdFwdOutputs: as the kernel wrote them (``dmimo_o``/``dmimo_z`` per batch, float32; the rest lp).

    Raises:
        UpstreamUnsupported: a shape upstream does not compile (checked first, on any machine).
        UpstreamUnavailable: no CUDA, missing packages or source.
        UpstreamError: another TileLang compile failure.
        TypeError, ValueError: invalid inputs (``validation.validate_inputs``).
    """
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                           trap, d, segsum, chunk_size, rotary_dim_divisor)
    check_supported(dims)
    check_cuda(dims.device)
    module = load_upstream(source_dir, check_hash=check_hash)
    kernel = _compile(module, dims, threads, num_stages)

    B, S, H, N, P, R = dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank
    dev, lp, f32 = dims.device, dims.lp_dtype, torch.float32

    def empty(shape, dtype):
        t = torch.empty(shape, dtype=dtype, device=dev)
        return t.fill_(float("nan")) if poison else t

    dmimo_o = empty((B, H, R, P), f32) if dims.reduce_o else None
    states = empty((B, H, dims.nchunks, N, P), lp)
    dz = empty((B, S, H, P), lp) if dims.has_z else None
    dmimo_z = empty((B, H, R, P), f32) if dims.has_z else None
    qk_dot = torch.zeros((B, H, S, R, R), dtype=lp, device=dev)
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    args = [c(dout), c(q), c(k), c(v), c(q_bias), c(k_bias), c(mimo_v), c(mimo_o), dmimo_o, states, c(z), c(mimo_z),
            dz, dmimo_z, c(angles), c(da_cs), c(da_cs_rev), c(dt), c(trap), c(d), qk_dot, c(segsum)]
    if absent not in ("auto", "none", "zeros"):
        raise ValueError(f"absent must be 'auto', 'none' or 'zeros', got {absent!r}")
    has_absent = any(a is None for a in args)
    last_launch.clear()
    with torch.cuda.device(dev):
        if absent == "zeros" and has_absent:
            kernel(*_zero_fill_absent(args, dims))
            mode = "zeros"
        else:
            try:
                kernel(*args)
                mode = "none"
            except (TypeError, ValueError, RuntimeError) as exc:
                if absent == "none" or not has_absent:
                    raise
                first_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                kernel(*_zero_fill_absent(args, dims))
                mode = "zeros"
                last_launch["none_error"] = first_error
    last_launch["absent"] = mode
    return MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states, dz=dz, dmimo_z=dmimo_z, qk_dot=qk_dot)


#: How the last call passed absent optional buffers: ``{"absent": "none" | "zeros"}`` (plus ``"none_error"`` when
#: ``absent="auto"`` fell back to zeros). Recorded by the CLI in the bundle.
last_launch: Dict[str, str] = {}

# Declared shapes of the optional kernel parameters (argument position -> shape builder, dtype: "lp" or "f32").
_OPTIONAL_PARAMS = {
    7: (lambda d: (d.heads, d.rank, d.value_dim), "f32"),               # MIMO_O
    8: (lambda d: (d.batch, d.heads, d.rank, d.value_dim), "f32"),      # DMIMO_O
    10: (lambda d: (d.batch, d.seqlen, d.heads, d.value_dim), "lp"),    # Z
    11: (lambda d: (d.heads, d.rank, d.value_dim), "f32"),              # MIMO_Z
    12: (lambda d: (d.batch, d.seqlen, d.heads, d.value_dim), "lp"),    # DZ
    13: (lambda d: (d.batch, d.heads, d.rank, d.value_dim), "f32"),     # DMIMO_Z
    19: (lambda d: (d.heads,), "f32"),                                  # D
}


def _zero_fill_absent(args, dims: Dims):
    out = list(args)
    for index, (shape, kind) in _OPTIONAL_PARAMS.items():
        if out[index] is None:
            dtype = dims.lp_dtype if kind == "lp" else torch.float32
            out[index] = torch.zeros(shape(dims), dtype=dtype, device=dims.device)
    return out
