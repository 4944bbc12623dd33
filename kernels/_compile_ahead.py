"""Compile the kernels a call would launch, in parallel, before running it.

Triton compiles a kernel specialization on its first launch, one after another, so the first forward + backward
of the whole op under a policy not seen before waits for every specialization of the chain in turn (the measured
cost is in ``docs/kernels.md``; a policy sweep pays it per policy). :func:`compile_ahead` runs a callable once with
every launch of this package (``_launch.Launch.run`` and the ordered sums' launches, both through :func:`launch`)
turned into a compile request (process-wide while it runs, the backward's autograd thread included):
``kernel.warmup(...)`` with the launch's own arguments, constexprs and options,
inside Triton's ``AsyncCompileMode`` on a thread pool (the MLIR passes and ``ptxas`` release the GIL, so the
compiles overlap). No kernel runs. When the callable returns, it waits for every compile; later calls find the
kernels in Triton's in-memory cache (and the next process in its disk cache).

After the compiles, each compiled kernel's C launcher (the host stub that ``kernel[grid](...)`` calls; Triton builds
it with the host C compiler, ``gcc -O3``, on a kernel's first run and caches it on disk) is built on the same pool
(:func:`build_launchers`; CUDA only): in a cold process the first real call otherwise built them one after another,
0.15 to 0.36 s each (measured on a 2-core CPU for stage 1's five kernels), about as much as that call took on top of
the compiles (``reports/gpu_tests_h100_issue43.md``).

What the callable computes inside is meaningless (the kernels' outputs are never written): run it for its launches
only. The kernels compiled are exactly those the real call compiles (same arguments, same specialization), so
nothing here changes a result. A Triton without ``AsyncCompileMode`` (before 3.4, e.g. older triton-ascend
builds) compiles the same requests one after another (``CompileAheadReport.parallel`` is False). Launches of
interpreted kernels (CPU tensors) are counted and skipped: the interpreter compiles nothing.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from . import _backend


@dataclasses.dataclass
class _Requests:
    mode: object = None  # Triton's AsyncCompileMode, None where this Triton has none
    launches: int = 0
    interpreted: int = 0


#: The requests of the active ``compile_ahead``, process-wide (not a context variable: autograd runs the backward
#: of CUDA tensors on its own device thread, whose launches must be caught too).
_active: "_Requests | None" = None
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class CompileAheadReport:
    """What :func:`compile_ahead` did.

    Attributes:
        launches: launches turned into compile requests (or skipped, for interpreted kernels).
        compiled: kernel specializations compiled (those not yet in Triton's in-memory cache); None where Triton
            has no ``AsyncCompileMode`` (the requests were compiled one after another and not counted).
        interpreted: launches of interpreted kernels (CPU tensors), skipped.
        workers: compile threads.
        parallel: whether the compiles overlapped (Triton's ``AsyncCompileMode``).
        seconds: wall time of the whole call, the callable, the wait for the compiles and the launcher builds.
        launchers: C launchers built (or found in Triton's disk cache) ahead, one per compiled kernel; 0 where none
            was built (no compile, a non-CUDA backend, or a Triton without ``AsyncCompileMode``).
    """

    launches: int
    compiled: Optional[int]
    interpreted: int
    workers: int
    parallel: bool
    seconds: float
    launchers: int = 0


def compiling_ahead() -> bool:
    """True while :func:`compile_ahead` runs (in any thread, launches compile and do not run)."""
    return _active is not None


def launch(kernel, grid: tuple, args: tuple, kwargs: dict) -> None:
    """``kernel[grid](*args, **kwargs)``; inside :func:`compile_ahead` its compile request only (nothing runs)."""
    requests = _active
    if requests is None:
        kernel[grid](*args, **kwargs)
        return
    requests.launches += 1
    if _backend.is_interpreted(kernel):
        requests.interpreted += 1
        return
    if requests.mode is None:
        kernel.warmup(*args, grid=grid, **kwargs)
        return
    # Triton finds its AsyncCompileMode through a context variable, set in the thread that entered it; autograd's
    # device thread (the backward) does not see it, so it is set here around the request
    from triton.runtime import _async_compile

    token = _async_compile.active_mode.set(requests.mode) if _async_compile.active_mode.get() is None else None
    try:
        kernel.warmup(*args, grid=grid, **kwargs)
    finally:
        if token is not None:
            _async_compile.active_mode.reset(token)


def _async_compile_mode():
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # Triton < 3.4 (older triton-ascend builds)
        return None
    return AsyncCompileMode


def compile_ahead(fn: Callable, *args, workers: Optional[int] = None, **kwargs) -> CompileAheadReport:
    """Run ``fn(*args, **kwargs)`` with every kernel launch of this package turned into a parallel compile request,
    then wait for the compiles (module docstring). The callable's return value is discarded: it is not a result.

    Args:
        fn: a callable that makes the launches to compile, e.g. one forward + backward of the whole op on
            ``backend="triton"`` with the shapes, dtypes and policy of the later calls (``mamba3_mimo``'s
            ``precompile_mamba3_mimo`` does this).
        workers (int, optional): compile threads (default: the CPU count, at most 32).

    Returns:
        CompileAheadReport.

    Raises:
        RuntimeError: called inside another ``compile_ahead``.
        TypeError: ``fn`` not callable. ValueError: ``workers`` below 1.
        The first compile error of a kernel, after the other compiles finished.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable that makes the launches to compile, got {type(fn).__name__}")
    if workers is None:
        workers = max(1, min(32, os.cpu_count() or 1))
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    global _active
    mode_class = _async_compile_mode()
    requests = _Requests()
    start = time.perf_counter()
    with _lock:
        if _active is not None:
            raise RuntimeError("compile_ahead is already active: it does not nest")
        _active = requests
    try:
        launchers = 0
        if mode_class is None:
            fn(*args, **kwargs)
            compiled = None
        else:
            with ThreadPoolExecutor(max_workers=workers) as executor:
                with mode_class(executor) as mode:
                    requests.mode = mode
                    fn(*args, **kwargs)
                    # read inside: Triton 3.9 empties future_kernels when the mode exits
                    futures = list(mode.future_kernels.values())
                compiled = len(futures)
                # the mode's exit waited for every compile, so each result is at hand
                launchers = build_launchers([future.result() for future in futures], executor)
    finally:
        _active = None
    return CompileAheadReport(launches=requests.launches, compiled=compiled, interpreted=requests.interpreted,
                              workers=workers, parallel=mode_class is not None,
                              seconds=time.perf_counter() - start, launchers=launchers)


def _cuda_launcher_class():
    """The active Triton driver's launcher class where that driver is CUDA's, else None (the interpreter, no GPU,
    triton-ascend: their launchers are not built ahead)."""
    try:
        from triton.runtime import driver

        active = driver.active
        if active.get_current_target().backend != "cuda":
            return None
        return active.launcher_cls
    except Exception:  # no active driver (a CPU-only machine): nothing to build
        return None


def build_launchers(compiled_kernels, executor, launcher_class=None) -> int:
    """Build the C launcher of each compiled kernel on ``executor``, as its first run would
    (``launcher_class(kernel.src, kernel.metadata)``, which compiles the launcher's C source into Triton's disk
    cache, or loads it from there); the launcher objects are dropped: the first run then loads the cached module
    instead of compiling it. ``launcher_class``: default the CUDA driver's (none elsewhere: returns 0). A build error is
    raised here, as the first run would raise it. Returns the number of launchers built or found."""
    launcher_class = launcher_class or _cuda_launcher_class()
    if launcher_class is None or not compiled_kernels:
        return 0
    jobs = [executor.submit(launcher_class, kernel.src, kernel.metadata) for kernel in compiled_kernels]
    for job in jobs:
        job.result()
    return len(jobs)
