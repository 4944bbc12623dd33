"""Which Triton build runs a launch: compiled (CUDA, Ascend) or interpreted (CPU tensors), in one process.

``@triton.jit`` decides at decoration time whether it returns a compiled ``JITFunction`` or an interpreted
``InterpretedFunction`` (``TRITON_INTERPRET``), and a kernel calls its helpers through its module's globals. So the
kernel modules are loaded twice: once normally (compiled; used for ``cuda`` and ``npu`` tensors) and once, as a
private copy under ``mimo_numerics.kernels._interpreted``, with interpretation switched on only while that copy is
executed (used for ``cpu`` tensors). The user never has to export anything, and CPU and CUDA tensors can be used
in the same process. Nothing here changes numerics: the backend only selects where the same source runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import types

_KERNEL_MODULES = ("_rounding", "_mimo_kernels", "_bwd_bwd_kernels", "_chain_kernels")
_PKG = __name__.rsplit(".", 1)[0]
_INTERP_PKG = _PKG + "._interpreted"
_lock = threading.Lock()
_cache = {}


def set_interpret(value):
    """Switch ``TRITON_INTERPRET`` (env and, when present, ``triton.knobs``); returns a restore callable. Switching
    it on also applies :func:`_interpreter_index_shim` (every kernel defined for the interpreter needs it)."""
    import triton

    if value:
        _interpreter_index_shim()

    old_env = os.environ.get("TRITON_INTERPRET")
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None) if knobs is not None else None
    had_override = runtime is not None and "interpret" in getattr(runtime, "__dict__", {})
    old_override = runtime.__dict__["interpret"] if had_override else None
    os.environ["TRITON_INTERPRET"] = "1" if value else "0"
    if runtime is not None and hasattr(type(runtime), "interpret"):
        runtime.__dict__["interpret"] = bool(value)

    def restore():
        if old_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old_env
        if runtime is not None and hasattr(type(runtime), "interpret"):
            if had_override:
                runtime.__dict__["interpret"] = old_override
            else:
                runtime.__dict__.pop("interpret", None)

    return restore


def _interpreter_index_shim():
    """Triton <= 3.6's interpreter converts loop bounds with ``int(array)``, which NumPy >= 2.3 rejects for the
    1-element 1-D arrays that hold scalar kernel arguments ("only 0-dimensional arrays can be converted"); 3.9 fixed
    it with ``squeeze()``. Re-apply ``tensor.__index__`` in the fixed form after the interpreter's own patching
    (restored with it after every interpreted launch). Changes nothing for compiled kernels."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_mimo_index_shim", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._mimo_index_shim = True
    interpreter._patch_lang_tensor = patched


def _load_interpreted():
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = sys.modules.get(_INTERP_PKG)
    if pkg is None:
        pkg = types.ModuleType(_INTERP_PKG)
        pkg.__path__ = []  # a namespace for the copies; nothing is imported from disk through it
        pkg.__package__ = _INTERP_PKG
        sys.modules[_INTERP_PKG] = pkg
    restore = set_interpret(True)
    try:
        mods = {}
        for name in _KERNEL_MODULES:
            full = f"{_INTERP_PKG}.{name}"
            spec = importlib.util.spec_from_file_location(full, os.path.join(here, name + ".py"))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[full] = mod
            spec.loader.exec_module(mod)
            setattr(pkg, name, mod)
            mods[name] = mod
    finally:
        restore()
    return mods["_mimo_kernels"]


def kernel_module(interpreted: bool):
    """The ``_mimo_kernels`` module: the interpreted copy, or the normally imported (compiled) one."""
    with _lock:
        if interpreted not in _cache:
            if interpreted:
                _cache[interpreted] = _load_interpreted()
            else:
                _cache[interpreted] = importlib.import_module(f"{_PKG}._mimo_kernels")
        return _cache[interpreted]


def stage2_module(interpreted: bool):
    """The ``_bwd_bwd_kernels`` module (stage 2) of the same build as ``kernel_module(interpreted)``."""
    kernel_module(interpreted)
    if interpreted:
        return sys.modules[f"{_INTERP_PKG}._bwd_bwd_kernels"]
    return importlib.import_module(f"{_PKG}._bwd_bwd_kernels")


def chain_module(interpreted: bool):
    """The ``_chain_kernels`` module (the whole op's preprocessing and epilogue) of the same build as
    ``kernel_module(interpreted)``."""
    kernel_module(interpreted)
    if interpreted:
        return sys.modules[f"{_INTERP_PKG}._chain_kernels"]
    return importlib.import_module(f"{_PKG}._chain_kernels")


def rounding_module(interpreted: bool):
    """The ``_rounding`` module of the same build as ``kernel_module(interpreted)`` (used by tests)."""
    kernel_module(interpreted)
    if interpreted:
        return sys.modules[f"{_INTERP_PKG}._rounding"]
    return importlib.import_module(f"{_PKG}._rounding")


def is_interpreted(fn) -> bool:
    """True when ``fn`` (a kernel object) runs in Triton's interpreter."""
    return type(fn).__name__ == "InterpretedFunction"


def backend_of(device) -> str:
    """``"interpreter"`` for CPU tensors, ``"cuda"`` or ``"npu"`` for device tensors; ValueError otherwise."""
    kind = device.type
    if kind == "cpu":
        return "interpreter"
    if kind in ("cuda", "npu"):
        return kind
    raise ValueError(f"tensors on device {device} are not supported by the Triton kernels (cpu -> Triton's "
                     "interpreter, cuda -> NVIDIA, npu -> triton-ascend)")
