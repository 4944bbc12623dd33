#!/usr/bin/env python
"""Ascend compile gate (issue 7): compile every Triton kernel specialization for Ascend parts on a CPU-only machine.

Runs inside the triton-ascend environment (``scripts/setup_ascend_env.sh`` builds ``.venv-ascend``), never in the
main venv: triton-ascend installs its own ``triton`` module.

For each launch plan (a kernel, the arguments and constexprs the launcher would pass, its grid) and each Ascend
part, the gate does what triton-ascend's JIT would do on a device, up to the point where the CANN toolkit is needed:

1. bind the arguments exactly like ``JITFunction.run`` (same signature mangling, same value and alignment
   specialisation, same constants), build the ``ASTSource`` and run the ``ttir`` and ``ttadapter`` stages of the
   triton-ascend backend for ``GPUTarget("npu", part, 0)`` (Triton front end, TTIR passes, triton-adapter → linalg);
2. run ``bishengir-compile`` (shipped by the ``ascendnpu-ir`` wheel) on the adapter output with the options the
   backend's A2/A3 ``npubin`` stage would pass, which runs the whole BiShengIR HFusion/HIVM pipeline. Without
   CANN it stops at the external ``hivmc`` step ("Cannot find hivmc under $PATH").

A compile PASSES when BiShengIR reaches that ``hivmc`` step with no other error (or, on a machine with CANN,
produces the kernel binary). Anything else FAILS with the kernel, the specialization, the stage and the
compiler's message; a unified-buffer overflow is reported with the required bits. The grid is checked against
the Ascend cap of 65535 programs.

Where the plans come from: ``--plans MODULE[:FUNC]`` names a function returning launch plans (default: the
project's kernels, ``mimo_numerics.kernels``; see ``project_plans`` below). A plan is any object (or dict) with
``kernel`` (a ``triton.JITFunction``), ``args`` (positional arguments, tensors on any device: only dtype and
alignment matter), ``kwargs`` (constexprs and other keyword arguments), ``grid`` and ``name`` (a label of the
specialization).

    python scripts/ascend_compile_gate.py                       # all project plans, both parts, write the report
    python scripts/ascend_compile_gate.py --parts Ascend910B3 --filter dq --jobs 2
    python scripts/ascend_compile_gate.py --plans tests.ascend.toy_kernels:plans --no-report

Exit status: 0 when every compile passed, 1 when any failed, 2 when the environment is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES as _STAGE2_INPUTS
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES as _STAGE1_INPUTS
from mimo_numerics.ops.mamba_mimo_fwd.spec import INPUT_NAMES as _FORWARD_INPUTS

ROOT = Path(__file__).resolve().parent.parent

#: Parts compiled by default: Atlas A2 (910B3) and Atlas A3 (910_9382).
DEFAULT_PARTS: Tuple[str, ...] = ("Ascend910B3", "Ascend910_9382")

#: The Ascend limit on programs per launch (gridX·gridY·gridZ ≤ UINT16_MAX).
MAX_PROGRAMS = 65535

#: Longest a single bishengir-compile run may take (a UB overflow alone costs 30-120 s of retries).
DEFAULT_TIMEOUT_S = 300.0

#: Unified buffer of the A2/A3 vector core, in bits, as BiShengIR reports it.
UB_BITS = 1572864

# The marker of the expected stop: BiShengIR finished its own pipeline and tried to hand the module to `hivmc`.
# ("Cannot find hivmc under $PATH" alone is not enough: bishengir-compile prints it at start-up too, when it probes
# `hivmc --version`.)
_HIVMC_MARKER = "External hivmc run fails"
# Lines that accompany the probe and the expected stop at hivmc and are not errors of the kernel.
_BENIGN_LINES = (
    "Cannot find hivmc under $PATH",
    "External hivmc run fails",
    "Failed to run BiShengIR pipeline",
    "Failed to detect hivmc version",
    "Failed to run `hivmc --version`",
)
_ERROR_LINE_RE = re.compile(r"\berror\b|\[ERROR\]|LLVM ERROR|Assertion|Segmentation fault|Aborted", re.IGNORECASE)
# BiShengIR's own retry after a UB overflow: the kernel fits only with auto multi-buffering off (slower).
_NO_MULTIBUFFER_MARK = "set enable-auto-multi-buffer to false; compilation then succeeded"
_UB_RE = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")
_MIX_MODE_RE = re.compile(r', mix_mode\s*=\s*"[^"]*"')


class GateEnvironmentError(RuntimeError):
    """The interpreter running the gate is not a triton-ascend compile environment."""


# ---------------------------------------------------------------------------------------------- environment

def triton_ascend_version() -> Optional[str]:
    """The installed triton-ascend version, or None (NVIDIA triton or no triton at all)."""
    import importlib.metadata as md

    try:
        return md.version("triton-ascend")
    except md.PackageNotFoundError:
        return None


def find_bishengir() -> str:
    """Path of ``bishengir-compile``: ``$BISHENGIR_COMPILE``, else the ``ascendnpu-ir`` wheel's, else ``$PATH``."""
    explicit = os.environ.get("BISHENGIR_COMPILE")
    if explicit:
        return explicit
    try:
        import ascendnpuir

        cand = Path(ascendnpuir.__file__).resolve().parent / "bin" / "bishengir-compile"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    except ImportError:
        pass
    found = shutil.which("bishengir-compile")
    if found:
        return found
    raise GateEnvironmentError("bishengir-compile not found: install ascendnpu-ir==1.2.0 (scripts/setup_ascend_env.sh)")


def check_environment() -> Dict[str, str]:
    """Raise ``GateEnvironmentError`` unless triton-ascend and bishengir-compile are usable; return versions."""
    ver = triton_ascend_version()
    if ver is None:
        raise GateEnvironmentError(
            "the `triton` module here is not triton-ascend; run the gate with .venv-ascend/bin/python "
            "(scripts/setup_ascend_env.sh builds it)")
    import triton

    check_kernels_source()
    info = {"triton": triton.__version__, "triton-ascend": ver, "bishengir-compile": find_bishengir()}
    try:
        import importlib.metadata as md

        info["ascendnpu-ir"] = md.version("ascendnpu-ir")
    except Exception:  # pragma: no cover - reported only
        info["ascendnpu-ir"] = "?"
    return info


def check_kernels_source(root: Path = ROOT) -> None:
    """Raise ``GateEnvironmentError`` unless ``mimo_numerics.kernels`` is this checkout's ``kernels/``: a venv whose
    editable install was made from another checkout maps the package there, and the gate would then compile that
    checkout's kernels and plans while its report names this one's commit."""
    import mimo_numerics.kernels as project_kernels

    where = Path(project_kernels.__file__).resolve().parent
    if where != (root / "kernels").resolve():
        raise GateEnvironmentError(
            f"mimo_numerics.kernels is imported from {where}, not from this checkout's {root / 'kernels'}: the "
            "venv's editable install points at another checkout; run scripts/setup_ascend_env.sh from this one "
            "(it reinstalls the project) or `pip install --no-deps -e .` with the venv's pip")


@dataclass
class _BishengirFlavour:
    hivm_flag: str
    api_change: bool


_FLAVOUR: Dict[str, _BishengirFlavour] = {}


def _bishengir_flavour(path: str) -> _BishengirFlavour:
    # Same probes as the backend: a "reg-based" bishengir takes --reg-based=true instead of --enable-hivm-compile.
    if path not in _FLAVOUR:
        out = subprocess.run([path, "--help"], capture_output=True, text=True).stdout
        _FLAVOUR[path] = _BishengirFlavour(
            hivm_flag="--reg-based=true" if "reg-based" in out else "--enable-hivm-compile=true",
            api_change="limit-auto-multi-buffer-buffer" in out)
    return _FLAVOUR[path]


# ---------------------------------------------------------------------------------------------- plans

@dataclass
class LaunchPlan:
    """One launch the launcher would make: kernel, arguments, constexprs, grid, and a label."""

    kernel: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    grid: Tuple[int, ...] = (1,)
    name: str = ""
    group: str = ""   # e.g. the preset and shape class the plan came from (report only)

    @property
    def kernel_name(self) -> str:
        fn = getattr(self.kernel, "fn", self.kernel)
        return getattr(fn, "__name__", str(self.kernel))


def as_plan(obj: Any) -> LaunchPlan:
    """Accept a ``LaunchPlan``, a dict, or any object with the same attribute names (e.g. the kernels' own)."""
    if isinstance(obj, LaunchPlan):
        return obj
    get = obj.get if isinstance(obj, dict) else (lambda k, d=None: getattr(obj, k, d))
    kernel = get("kernel")
    if kernel is None:
        raise TypeError(f"launch plan {obj!r} has no `kernel`")
    grid = get("grid", (1,))
    if callable(grid):
        raise TypeError(f"launch plan for {kernel} has a callable grid; give the launcher's concrete grid")
    return LaunchPlan(kernel=kernel, args=tuple(get("args", ()) or ()), kwargs=dict(get("kwargs", {}) or {}),
                      grid=tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),),
                      name=str(get("name", "") or ""), group=str(get("group", "") or ""))


def spec_label(plan: LaunchPlan) -> str:
    """A readable label of the specialization: the plan's name, else its constexpr values."""
    if plan.name:
        return plan.name
    return " ".join(f"{k}={v}" for k, v in sorted(plan.kwargs.items()))


def load_plans(spec: str, **kw) -> List[LaunchPlan]:
    """``MODULE[:FUNC]`` → the plans that function returns (default FUNC: ``ascend_compile_plans``)."""
    mod_name, _, func_name = spec.partition(":")
    mod = importlib.import_module(mod_name)
    func = getattr(mod, func_name or "ascend_compile_plans")
    return [as_plan(p) for p in func(**kw)]


# ---------------------------------------------------------------------------------------------- compiling

@dataclass
class CompileResult:
    kernel: str
    spec: str
    part: str
    ok: bool
    stage: str                # "frontend", "ttadapter", "bishengir", "grid", "hivmc" (reached) or "binary"
    message: str = ""
    seconds: float = 0.0
    ub_required_bits: Optional[int] = None
    group: str = ""
    ub_peak_bytes: Optional[int] = None    # planned UB use of a passing compile (read from the HIVM module)
    log: str = ""                          # end of the compiler's raw output, for failures
    no_multibuffer: bool = False           # passed only after BiShengIR switched auto multi-buffering off
    skipped: bool = False                  # not compiled (``max_failures`` reached)
    index: int = 0                         # position of the plan, to keep reports in launcher order

    @property
    def status(self) -> str:
        return "pass" if self.ok else ("skipped" if self.skipped else "FAIL")

    def describe(self) -> str:
        head = f"{self.kernel} [{self.spec}] on {self.part}: {self.status} at {self.stage}"
        if self.ub_required_bits is not None:
            head += (f" (unified buffer overflow: requires {self.ub_required_bits} bits, "
                     f"{UB_BITS} available)")
        return head + (f"\n{self.message}" if self.message and not self.ok else "")


@dataclass
class _Frontend:
    linalg: Optional[str]
    options: Any
    stage: str
    message: str
    seconds: float
    tool_crash: bool = False  # is_tool_crash on the tool's whole output (the message keeps only part of it)


def _bind(fn, backend, args, kwargs):
    """Signature, constants and attrs exactly as ``JITFunction.run`` derives them."""
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, sig_and_spec, _cvals, _ncvals, excess = binder(*args, **kwargs)
    options = backend.parse_options(dict(excess))
    for k in excess:
        if k not in options.__dict__:
            raise KeyError(f"Keyword argument {k} was specified but unrecognised")
    bound_vals = tuple(bound_args.values())
    sigkeys = [fn.params[i].name for i in range(len(fn.params)) if not fn.params[i].is_constexpr]
    signature = {k: ("*i8" if v == "none" else v) for k, v in zip(sigkeys, sig_and_spec[:len(sigkeys)])}
    attrs = backend.get_attrs_descriptor(fn.params, bound_vals)
    constant_params = attrs.get_constants()
    constants = {p.name: v for v, p in zip(bound_vals, fn.params)
                 if p.is_constexpr or (p.num in constant_params) or v is None}
    return signature, constants, attrs, options


def specialization_key(plan: LaunchPlan, backend) -> Tuple:
    """What the JIT's kernel cache keys on: kernel, mangled signature + specialisation, constexprs, options."""
    from triton.runtime.jit import create_function_from_signature

    fn = plan.kernel
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    _bound, sig_and_spec, cvals, _ncvals, excess = binder(*plan.args, **plan.kwargs)
    if not isinstance(cvals, tuple):
        cvals = (cvals,)
    return (id(fn), tuple(sig_and_spec), repr(cvals), repr(sorted(excess.items())))


def dedupe_plans(plans: Sequence[LaunchPlan], part: str = DEFAULT_PARTS[0]) -> List[LaunchPlan]:
    """One plan per distinct compiled specialization (presets and shapes often give identical constexprs).
    The kept plan's ``group`` lists every group that maps to it; grids are checked on every plan."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("npu", part, 0))
    kept: Dict[Tuple, LaunchPlan] = {}
    out: List[LaunchPlan] = []
    for plan in plans:
        try:
            key = specialization_key(plan, backend)
        except Exception:          # binding errors are reported by the compile itself
            out.append(plan)
            continue
        first = kept.get(key)
        if first is None or _grid_programs(plan.grid) > MAX_PROGRAMS:
            kept.setdefault(key, plan)
            out.append(plan)
        elif plan.group and plan.group not in first.group.split(", "):
            first.group = f"{first.group}, {plan.group}" if first.group else plan.group
    return out


def _tail(text: str, limit: int = 4000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


#: Times the gate compiles a plan again after ``triton-adapter-opt`` crashes (an internal MLIR assertion or a fatal
#: signal, with LLVM's stack dump). Measured: one assertion abort in the CI runs of 2026-12-03 (``_mimo_out_kernel``
#: fwd_N128_P128_R4_C16_roZD, "Malformed type storage object"), on a plan that compiled in the run before it and in
#: isolation twice, with the same code; one crash with a stack dump and no assertion on 2026-12-07
#: (``_bwd2_kside_kernel`` bwd2_N16_P16_R2_C8_roZ-, both parts), on a plan that compiled in the run before it and
#: in nine isolated runs after it, with fresh caches: the tool is nondeterministic there. A plan that crashes every
#: time still fails the gate.
TOOL_CRASH_RETRIES = 2

#: What marks a crash of the tool itself in its output: a failed assertion, LLVM's crash banner and stack dump, or
#: the dump's frames in the tool (what is left of a long dump's end).
_TOOL_CRASH_RE = re.compile(
    r"Assertion .*failed|PLEASE submit a bug report|^Stack dump:|triton-adapter-opt\+0x[0-9a-f]+", re.MULTILINE)


def is_tool_crash(stage: str, message: str) -> bool:
    """A crash of ``triton-adapter-opt`` (an internal assertion or a fatal signal with LLVM's stack dump), not a
    diagnostic about the kernel."""
    return stage == "ttadapter" and bool(_TOOL_CRASH_RE.search(message))


def compile_frontend(plan: LaunchPlan, part: str) -> _Frontend:
    """Triton front end + TTIR passes + triton-adapter for ``GPUTarget("npu", part, 0)``."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    t0 = time.perf_counter()
    target = GPUTarget("npu", part, 0)
    backend = make_backend(target)
    fn = plan.kernel
    stage = "frontend"
    try:
        signature, constants, attrs, options = _bind(fn, backend, plan.args, plan.kwargs)
        src = ASTSource(fn, signature, constants, attrs)
        stages: Dict[str, Callable] = {}
        backend.add_stages(stages, options)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        metadata = {"hash": src.hash(), "target": target, **options.__dict__}
        module = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
        stage = "ttir"
        module = stages["ttir"](module, metadata)
        stage = "ttadapter"
        linalg = stages["ttadapter"](module, metadata)
        context.disable_multithreading()
    except subprocess.CalledProcessError as exc:
        msg = (exc.stderr or b"").decode("utf-8", "replace") + (exc.stdout or b"").decode("utf-8", "replace")
        return _Frontend(None, None, stage, summarize_failure(msg) if msg.strip() else str(exc),
                         time.perf_counter() - t0, tool_crash=is_tool_crash(stage, msg))
    except Exception as exc:  # CompilationError, MLIR pass failures, binder errors
        return _Frontend(None, None, stage, _tail(f"{type(exc).__name__}: {exc}"), time.perf_counter() - t0)
    return _Frontend(linalg, options, stage, "", time.perf_counter() - t0)


def bishengir_command(bishengir: str, part: str, options: Any, src: str, out: str,
                      save_temps: Optional[str] = None) -> List[str]:
    """The ``bishengir-compile`` command line of triton-ascend's A2/A3 ``npubin`` stage, for ``part``."""
    flav = _bishengir_flavour(bishengir)
    cmd = [bishengir, src, f"--target={part}"]
    o = options.__dict__ if options is not None else {}

    def opt(key: str, flag: str):
        val = o.get(key)
        if val is not None:
            cmd.append(f"{flag}={val}")

    opt("multibuffer", "--enable-auto-multi-buffer")
    opt("enable_auto_bind_sub_block", "--enable-auto-bind-sub-block")
    opt("enable_hivm_auto_cv_balance", "--enable-hivm-auto-cv-balance")
    opt("sync_solver", "--enable-hivm-graph-sync-solver")
    opt("unit_flag", "--enable-hivm-unit-flag-sync")
    opt("inject_barrier_all", "--enable-hivm-inject-barrier-all-sync")
    opt("inject_block_all", "--enable-hivm-inject-block-all-sync")
    opt("limit_auto_multi_buffer_only_for_local_buffer", "--limit-auto-multi-buffer-only-for-local-buffer")
    opt("set_workspace_multibuffer", "--set-workspace-multibuffer")
    opt("tile_mix_vector_loop", "--tile-mix-vector-loop")
    opt("tile_mix_cube_loop", "--tile-mix-cube-loop")
    opt("limit_auto_multi_buffer_of_local_buffer", "--limit-auto-multi-buffer-of-local-buffer")
    opt("disable_auto_inject_block_sync", "--disable-auto-inject-block-sync")
    cmd += ["--enable-hfusion-compile=true", flav.hivm_flag, "--enable-triton-kernel-compile=true"]
    if save_temps:
        cmd.append(f"--save-temps={save_temps}")   # keeps the planned HIVM module, read for the UB peak
    cmd += ["-o", out]
    return cmd


_CONST_RE = re.compile(r"(%[\w.]+)\s*=\s*arith\.constant\s+(-?\d+)\s*:\s*i(?:64|32)\b")
_PTR_CAST_RE = re.compile(r"hivm\.hir\.pointer_cast\(([^)]*)\)[^:]*:\s*memref<([^>]*?),\s*#hivm\.address_space<ub>>")
_ELEM_BITS = {"f32": 32, "f16": 16, "bf16": 16, "i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64, "f64": 64}


def ub_peak_bytes(hivm: str) -> Optional[int]:
    """Highest unified-buffer byte the planned HIVM module addresses (``pointer_cast`` offset + buffer size,
    over every buffer of every multi-buffer copy), or None when the module has no UB buffer we can read."""
    consts = {name: int(val) for name, val in _CONST_RE.findall(hivm)}
    peak = None
    for offsets, mtype in _PTR_CAST_RE.findall(hivm):
        parts = [p.strip() for p in mtype.split("x")]
        elem = parts[-1].split(",")[0].strip()
        if elem not in _ELEM_BITS or any(not p.isdigit() for p in parts[:-1]):
            continue
        n = 1
        for p in parts[:-1]:
            n *= int(p)
        size = (n * _ELEM_BITS[elem] + 7) // 8
        for off in (o.strip() for o in offsets.split(",") if o.strip()):
            if off not in consts:
                continue
            end = consts[off] + size
            peak = end if peak is None else max(peak, end)
    return peak


def error_lines(output: str) -> List[str]:
    """The lines of a BiShengIR log that report an error of the kernel (not the expected stop at hivmc)."""
    return [ln.strip() for ln in output.splitlines()
            if _ERROR_LINE_RE.search(ln) and not any(b in ln for b in _BENIGN_LINES)]


def summarize_failure(output: str) -> str:
    """The compiler's own error lines (what a reader needs), or the end of the log when it printed none; a tool's
    failed assertion goes first (a long stack dump after it would push it out of the end)."""
    errs = error_lines(output)
    if not errs:
        asserts = [ln.strip() for ln in output.splitlines() if "Assertion" in ln and "failed" in ln]
        return "\n".join(asserts[:1] + [_tail(output, 2000)])
    errs = sorted(dict.fromkeys(errs), key=lambda ln: 0 if _UB_RE.search(ln) else 1)   # the UB verdict first
    text = "\n".join(errs)
    return text if len(text) <= 3000 else text[:3000] + "…"


def classify_bishengir(returncode: int, output: str, produced_binary: bool) -> Tuple[bool, str, str, Optional[int]]:
    """(ok, stage, message, ub_required_bits) from one ``bishengir-compile`` run."""
    ub = _UB_RE.search(output)
    ub_bits = int(ub.group(1)) if ub else None
    errs = error_lines(output)
    if ub_bits is not None:
        return False, "bishengir", summarize_failure(output), ub_bits
    if _HIVMC_MARKER in output and not errs:
        return True, "hivmc", "", None
    if returncode == 0 and produced_binary and not errs:
        return True, "binary", "", None      # a machine with CANN: the whole compile succeeded
    if not output.strip():
        return False, "bishengir", f"bishengir-compile exited with {returncode} and printed nothing", None
    return False, "bishengir", summarize_failure(output), None


def compile_backend(linalg: str, options: Any, part: str, bishengir: Optional[str] = None,
                    timeout: float = 300.0) -> Tuple[bool, str, str, Optional[int], float, Optional[int], str, bool]:
    """Run BiShengIR on the adapter output;
    (ok, stage, message, ub_bits_required, seconds, ub_peak_bytes, log tail, needed the no-multi-buffer retry)."""
    bishengir = bishengir or find_bishengir()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ascend_gate_") as tmp:
        src = os.path.join(tmp, "kernel.ttadapter.mlir")
        Path(src).write_text(_MIX_MODE_RE.sub("", linalg))   # the backend strips mix_mode the same way
        out = os.path.join(tmp, "kernel")
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(bishengir) + os.pathsep + env.get("PATH", "")
        try:
            os.makedirs(os.path.join(tmp, "temps"))
            cmd = bishengir_command(bishengir, part, options, src, out, save_temps=os.path.join(tmp, "temps"))
            proc = subprocess.run(cmd, capture_output=True,
                                  text=True, env=env, cwd=tmp, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, "bishengir", f"bishengir-compile timed out after {timeout:.0f} s", None, \
                time.perf_counter() - t0, None, "", False
        output = (proc.stdout or "") + (proc.stderr or "")
        output = output.replace(tmp + os.sep, "")
        produced = any(Path(tmp, n).is_file() for n in ("kernel.o", "kernel_reloc.o"))
        ok, stage, msg, ub = classify_bishengir(proc.returncode, output, produced)
        peak = None
        hivm = Path(tmp, "temps", "module.hivm.opt.mlir")
        if ok and hivm.is_file():
            peak = ub_peak_bytes(hivm.read_text(errors="replace"))
        retried = ok and _NO_MULTIBUFFER_MARK in output
    return ok, stage, msg, ub, time.perf_counter() - t0, peak, ("" if ok else _tail(output, 2500)), retried


def _grid_programs(grid: Sequence[int]) -> int:
    n = 1
    for g in grid:
        n *= int(g)
    return n


def run_gate(plans: Iterable[Any], parts: Sequence[str] = DEFAULT_PARTS, jobs: int = 1,
             progress: Optional[Callable[[CompileResult], None]] = None, dedupe: bool = True,
             timeout: float = DEFAULT_TIMEOUT_S, max_failures: int = 0) -> List[CompileResult]:
    """Compile every plan for every part. The front end runs once per plan (it does not depend on the part:
    both A2 and A3 use the same adapter options), BiShengIR once per plan and part, ``jobs`` at a time.
    With ``max_failures`` > 0, plans not yet started once that many compiles failed are reported as skipped
    (a failing gate stays quick: one UB overflow costs BiShengIR 30–120 s of retries)."""
    check_environment()
    bishengir = find_bishengir()
    plans = [dataclasses.replace(as_plan(p)) for p in plans]
    if dedupe:
        plans = dedupe_plans(plans, parts[0])
    results: List[CompileResult] = []
    pending = []
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))

    def emit(res: CompileResult):
        results.append(res)
        if progress:
            progress(res)

    try:
        for index, plan in enumerate(plans):
            kname, spec = plan.kernel_name, spec_label(plan)
            if max_failures and sum(not r.ok and not r.skipped for r in results) >= max_failures:
                for part in parts:
                    emit(CompileResult(kname, spec, part, False, "skipped",
                                       f"not compiled: the gate stopped after {max_failures} failures",
                                       group=plan.group, index=index, skipped=True))
                continue
            nprog = _grid_programs(plan.grid)
            if nprog > MAX_PROGRAMS or nprog < 1:
                for part in parts:
                    emit(CompileResult(kname, spec, part, False, "grid",
                                       f"grid {plan.grid} has {nprog} programs; Ascend allows 1..{MAX_PROGRAMS}",
                                       group=plan.group, index=index))
                continue
            fe = compile_frontend(plan, parts[0])
            for _ in range(TOOL_CRASH_RETRIES):
                if fe.linalg is not None or not fe.tool_crash:
                    break
                print(f"ascend_compile_gate: {kname} [{spec}]: triton-adapter-opt crashed ({fe.message[:120]}); "
                      "compiling it again", file=sys.stderr, flush=True)
                fe = compile_frontend(plan, parts[0])
            if fe.linalg is None:
                for part in parts:
                    emit(CompileResult(kname, spec, part, False, fe.stage, fe.message, fe.seconds, group=plan.group,
                                       index=index))
                continue
            for part in parts:
                fut = pool.submit(compile_backend, fe.linalg, fe.options, part, bishengir, timeout)
                pending.append((fut, kname, spec, part, fe.seconds, plan.group, index))
            # keep memory bounded: drain finished work as we go
            while len(pending) > 4 * max(1, jobs):
                fut, *meta = pending.pop(0)
                emit(_finish(fut, *meta))
        for fut, *meta in pending:
            emit(_finish(fut, *meta))
    finally:
        pool.shutdown(wait=True)
    order = {p: i for i, p in enumerate(parts)}
    results.sort(key=lambda r: (r.index, order.get(r.part, 0)))
    return results


def _finish(fut, kname, spec, part, fe_seconds, group, index) -> CompileResult:
    ok, stage, msg, ub, secs, peak, log, retried = fut.result()
    return CompileResult(kname, spec, part, ok, stage, msg, seconds=fe_seconds + secs, ub_required_bits=ub,
                         group=group, ub_peak_bytes=peak, log=log, index=index, no_multibuffer=retried)


def compile_plan(plan: Any, part: str = DEFAULT_PARTS[0]) -> CompileResult:
    """Compile one plan for one part (used by the tests)."""
    return run_gate([plan], parts=(part,), jobs=1)[0]


# ---------------------------------------------------------------------------------------------- project plans

#: Presets the gate compiles: the issue's list (fp32, seed_bf16, upstream_sm90, the fp16 ones) plus upstream_sm80,
#: which the launcher can produce as well.
GATE_PRESETS: Tuple[str, ...] = ("fp32", "seed_bf16", "upstream_sm80", "upstream_sm90", "upstream_sm90_fp16",
                                 "upstream_sm80_fp16")
#: Supported state / value dims (the launcher's SUPPORTED_DIMS).
GATE_DIMS: Tuple[int, ...] = (16, 32, 64, 128)
#: (chunk_size C, rank R) classes: C·R from 16 to 128, powers of two and padded non-powers of two
#: (18 → 32, 24 → 32, 48 → 64, 100 → 128), R = 1 … 4, C below the 16-row minimum tile (C = 6, 8) and up to 128.
#: Together they give every (LP, CP) tile pair the launcher uses: (16,16) (32,16) (64,16) (128,32) (128,64) (128,128).
GATE_CR: Tuple[Tuple[int, int], ...] = ((16, 1), (8, 2), (6, 3), (16, 2), (8, 3), (16, 4), (16, 3), (32, 4),
                                        (64, 2), (25, 4), (128, 1))
#: (reduce_o, has_z, has_d): all eight branch combinations.
GATE_BRANCHES: Tuple[Tuple[bool, bool, bool], ...] = tuple(
    (ro, z, d) for ro in (True, False) for z in (False, True) for d in (False, True))

#: One launcher call: preset, N, P, C, R, reduce_o, has_z, has_d.
GateCase = Tuple[str, int, int, int, int, bool, bool, bool]


def full_cases(presets: Sequence[str] = GATE_PRESETS) -> List[GateCase]:
    """Every preset × N × P × (C, R) × branch combination (6 × 16 × 11 × 8 = 8448 launcher calls, about 8000
    distinct kernel specializations; at 1–120 s per BiShengIR compile that is days on two cores)."""
    return [(pr, n, p, c, r, ro, z, d) for pr in presets for n in GATE_DIMS for p in GATE_DIMS
            for c, r in GATE_CR for ro, z, d in GATE_BRANCHES]


def wide_cases(presets: Sequence[str] = GATE_PRESETS) -> List[GateCase]:
    """A covering subset of ``full_cases`` (200 calls: 352 distinct specializations of stage 1, 876 with the forward and
    stage 2; about an hour on 2 cores for both parts, reports/ascend_compile_wide.md).

    A specialization's unified-buffer use depends on its tile sizes (N, P, C, R and the tiles the launcher derives
    from them), its constructs on the policy switches and branches. So the subset crosses each group fully with one
    representative of the other:

    1. tiles: every (N, P) with N, P ∈ {16, 128} plus N = P ∈ {32, 64}, × every (C, R) class, with the branch
       combination that instantiates the most code (reduced DOUT, Z and D) and with full DOUT + Z, under
       ``upstream_sm90`` (every switch on, lp GEMM operands);
    2. the same tiles at N = P = 128 (the largest) under ``fp32`` (every switch off: FP32 GEMM operands, FP32
       workspaces, i.e. the biggest tiles in bytes);
    3. switches: every preset × every branch combination at N = P = 64, C = 16, R = 4.
    """
    out: List[GateCase] = []
    heavy = ((True, True, True), (False, True, False))
    nps = [(16, 16), (16, 128), (128, 16), (128, 128), (32, 32), (64, 64)]
    if "upstream_sm90" in presets:
        out += [("upstream_sm90", n, p, c, r, ro, z, d) for n, p in nps for c, r in GATE_CR for ro, z, d in heavy]
    if "fp32" in presets:
        out += [("fp32", 128, 128, c, r, ro, z, d) for c, r in GATE_CR for ro, z, d in heavy]
    out += [(pr, 64, 64, 16, 4, ro, z, d) for pr in presets for ro, z, d in GATE_BRANCHES]
    return _unique(out)


def bounds_cases(presets: Sequence[str] = GATE_PRESETS) -> List[GateCase]:
    """Every N × P × (C, R) class with the branch combination that instantiates the most code (reduced DOUT, Z and D),
    under ``upstream_sm90`` (176 calls): with ``--operators mamba_mimo_bwd_bwd`` every size class the stage-2
    launcher accepts on NPU (``kernels.mimo_bwd_bwd.backend_refusal`` leaves out the rest), i.e. a check of its
    bounds and of Ascend's tile plan (``kernels.mimo_bwd_bwd.npu_tiles``)."""
    if "upstream_sm90" not in presets:
        return []
    return [("upstream_sm90", n, p, c, r, True, True, True) for n in GATE_DIMS for p in GATE_DIMS for c, r in GATE_CR]


#: The CI scope of stage 1: 15 launcher calls chosen so that together they hit every preset, every branch
#: combination, every N and P value, the largest tiles of every (LP, CP) class the launcher derives at N = P = 128,
#: padded non-power-of-two C·R (18, 24, 48, 100) and C below the 16-row minimum. Each line says what it adds.
CI_CASES: Tuple[GateCase, ...] = (
    ("upstream_sm90", 128, 128, 16, 1, True, True, True),         # LP 16,  CP 16,  R = 1, largest N, P
    ("upstream_sm90", 128, 128, 8, 3, True, True, True),          # LP 32,  CP 16,  C·R = 24 padded, C < 16
    ("upstream_sm90", 128, 128, 16, 4, True, True, True),         # LP 64,  CP 16
    ("upstream_sm90", 128, 128, 25, 4, True, True, True),         # LP 128, CP 32,  C·R = 100 padded
    ("upstream_sm90", 128, 128, 64, 2, True, True, True),         # LP 128, CP 64
    ("upstream_sm90", 128, 128, 128, 1, True, True, True),        # LP 128, CP 128
    ("upstream_sm90", 128, 128, 32, 4, False, True, False),       # full DOUT + Z at LP 128
    ("fp32", 128, 128, 32, 4, True, True, True),                  # every switch off: FP32 operands and workspaces
    ("seed_bf16", 64, 64, 16, 4, False, False, True),             # separate state update, mul_then_add, fo-D
    ("upstream_sm90_fp16", 64, 64, 16, 4, True, True, True),      # fp16 lp format with Z and D
    ("upstream_sm80", 32, 32, 16, 2, True, False, True),          # sm80 knobs, ro-D, N = P = 32
    ("upstream_sm80_fp16", 16, 128, 6, 3, False, False, False),   # fo--, N != P, C·R = 18 padded, C < 16
    ("upstream_sm90_fp16", 32, 16, 16, 3, True, True, False),     # roZ-, P = 16, C·R = 48 padded
    ("fp32", 16, 16, 8, 2, False, True, True),                    # smallest tiles, foZD
    ("seed_bf16", 64, 32, 16, 4, True, False, False),             # ro--
)


#: The forward's CI scope (``mimo_numerics.kernels.mimo_fwd``): its angles, prep and state launches are stage 1's
#: specializations (deduplicated), so these calls add the output kernel with ``FORWARD``: every branch combination,
#: every preset with forward semantics (``seed_bf16`` has none), the largest tiles, R = 1 and C·R = 18 padded.
FORWARD_CI_CASES: Tuple[GateCase, ...] = (
    ("upstream_sm90", 128, 128, 16, 4, True, True, True),         # roZD: gate, phi_gate, out_proj, out_accum, d_term
    ("upstream_sm90", 128, 128, 32, 4, False, True, False),       # foZ- at LP 128: gate, the per-rank o store
    ("fp32", 128, 128, 32, 4, False, True, True),                 # foZD, every switch off: FP32 operands
    ("upstream_sm90_fp16", 64, 64, 16, 4, True, True, True),      # fp16, roZD
    ("upstream_sm90_fp16", 64, 64, 16, 4, False, False, True),    # fp16, fo-D
    ("upstream_sm80", 32, 32, 16, 2, True, False, True),          # mul_then_add diagonal, ro-D
    ("upstream_sm80_fp16", 16, 128, 6, 3, False, False, False),   # fo--, C·R = 18 padded
    ("fp32", 16, 16, 8, 2, True, True, False),                    # roZ-, smallest tiles
    ("upstream_sm90", 64, 32, 128, 1, True, False, False),        # ro--, R = 1, CP 128
)
#: Forward cases also planned with ``return_state=True``: the state walk with ``FINAL`` (its one extra store; the
#: other launches of such a build are those of the plain case, so only the walk's plan is kept).
FORWARD_FINAL_STATE_CASES: Tuple[GateCase, ...] = (FORWARD_CI_CASES[0], FORWARD_CI_CASES[3])
#: The operators the gate builds launches for, with the launcher module of each.
OPERATOR_LAUNCHERS = {"mamba_mimo_bwd_fwd": "mimo_numerics.kernels.mimo_bwd_fwd",
                      "mamba_mimo_fwd": "mimo_numerics.kernels.mimo_fwd",
                      "mamba_mimo_bwd_bwd": "mimo_numerics.kernels.mimo_bwd_bwd"}
#: The whole op's preprocessing and epilogue kernels (``mimo_numerics.kernels.chain_steps``): not an operator with a
#: policy section, planned by :func:`chain_plans` on :data:`CHAIN_CI_CASES`.
CHAIN = "mamba3_mimo_chain"
#: The operators the gate compiles by default (CI): all three, and the chain's kernels.
DEFAULT_OPERATORS = ("mamba_mimo_bwd_fwd", "mamba_mimo_fwd", "mamba_mimo_bwd_bwd", CHAIN)
#: The chain kernels' CI scope: preset (its lp dtype and helper_fma), N, C, rotary divisor, G (1: the sum over
#: heads; H: none), reduced DOUT and Z (the batch sums present): every constexpr class (C 8 to 64, K = N/d 4 to 64,
#: bf16/fp16, HELPER_FMA on and off).
CHAIN_CI_CASES: Tuple[Tuple[str, int, int, int, int, bool], ...] = (
    ("upstream_sm90", 64, 16, 4, 1, True),          # the benchmark shapes' class: K 16, C 16, G = 1
    ("fp32", 128, 64, 2, 2, False),                 # helper_fma separate, K 64, C 64, G = H, full DOUT
    ("upstream_sm90_fp16", 16, 8, 4, 1, True),      # fp16, K 4, C 8
    ("upstream_sm80", 32, 32, 2, 2, True),          # K 16 at N 32, C 32, G = H
)


def chain_plans(cases: Sequence[Tuple[str, int, int, int, int, bool]] = CHAIN_CI_CASES) -> List[LaunchPlan]:
    """The launches of ``kernels.chain_steps``' preprocessing and epilogue for each case, planned for NPU from small
    CPU inputs (B = 2, H = 2, S = 3·C; the epilogue's inputs from the reference chain: only their shapes and dtypes
    matter). Labelled ``chain_…``."""
    import torch

    from mimo_numerics import presets as _presets
    from mimo_numerics.kernels import chain_steps
    from mimo_numerics.ops.mamba3_mimo import chain
    from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs

    plans: List[LaunchPlan] = []
    for preset, n, c, divisor, groups, reduced in cases:
        policy = _presets.get(preset)
        spec = OpCaseSpec(batch=2, seqlen=3 * c, heads=2, groups=groups, state_dim=n, value_dim=16, rank=2,
                          chunk_size=c, rotary_dim_divisor=divisor, reduce_o=reduced, has_z=reduced,
                          dtype=policy.lp_dtype)
        x = make_op_inputs(spec)
        reference = "upstream_sm90" if policy.lp_dtype == "bfloat16" else "upstream_sm90_fp16"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*ccec.*", category=UserWarning)
            pre = chain.run_preprocess(x, reference)
            s1 = chain.run_stage1(x, pre, reference)
            s2 = chain.run_stage2(x, pre, s1, reference)
            builds = [chain_steps.build_preprocess_launches(x["ADT"], x["Angles"], x["DT"], c, policy=policy,
                                                            return_state=True, backend="npu"),
                      chain_steps.build_epilogue_launches(*chain.epilogue_args(x, pre, s1, s2),
                                                          **chain.epilogue_kwargs(x), policy=policy, backend="npu")]
        label = f"chain_N{n}_C{c}_d{divisor}_G{groups}_" + ("roZ" if reduced else "fo-")
        for prep in builds:
            for launch in prep.launches:
                plans.append(LaunchPlan(kernel=launch.kernel, args=tuple(launch.args),
                                        kwargs={**launch.constexprs, **launch.options}, grid=(int(launch.grid),),
                                        name=label, group=preset))
    return plans
#: The stage-2 kernels' scope (``mimo_numerics.kernels.mimo_bwd_bwd``): every branch combination across the presets
#: with stage-2 semantics, the largest dims within the kernels' Ascend bounds (``kernels.mimo_bwd_bwd.
#: backend_refusal``: N·P <= 64·64, LP·(N + P) <= 128·96; larger sizes are refused on NPU), the smallest, R = 1 and a
#: padded C·R.
STAGE2_CI_CASES: Tuple[GateCase, ...] = (
    ("upstream_sm90", 64, 64, 16, 4, True, True, True),
    ("upstream_sm90", 32, 128, 16, 2, False, True, False),
    ("upstream_sm90", 128, 32, 16, 2, True, False, True),
    ("fp32", 64, 64, 16, 4, False, True, True),
    ("upstream_sm90_fp16", 64, 64, 16, 4, True, False, True),
    ("upstream_sm80", 32, 32, 16, 2, False, False, True),
    ("upstream_sm80_fp16", 16, 128, 6, 3, False, False, False),
    ("fp32", 16, 16, 8, 2, True, True, False),
    ("upstream_sm90", 64, 32, 128, 1, True, False, False),
    # sizes that overflowed the unified buffer under an earlier Ascend plan (16 rows; 16 or 8 tokens), kept here for
    # kernels.mimo_bwd_bwd.npu_tiles: the k-side kernel at C·R = 16 with R > 1 and at N, P = 32, 128 with C·R = 64,
    # the token kernel at N = P = 16, C = 128, R = 1
    ("upstream_sm90", 32, 32, 8, 2, True, True, True),
    ("upstream_sm90", 32, 128, 16, 4, True, True, True),
    ("upstream_sm90", 16, 16, 128, 1, True, True, True),
)


def ci_cases(presets: Sequence[str] = GATE_PRESETS) -> List[GateCase]:
    """``CI_CASES`` restricted to ``presets`` (see there); 51 distinct specializations per part for all presets."""
    return [cs for cs in CI_CASES if cs[0] in presets]


def _unique(cases: Iterable[GateCase]) -> List[GateCase]:
    seen: set = set()
    return [cs for cs in cases if not (cs in seen or seen.add(cs))]


def project_plans(presets: Optional[Sequence[str]] = None, scope: str = "ci",
                  cases: Optional[Sequence[GateCase]] = None,
                  operators: Sequence[str] = DEFAULT_OPERATORS) -> List[LaunchPlan]:
    """The launches the project's launcher makes for the gated cases, asked from the launcher itself.

    ``mimo_numerics.kernels.mimo_bwd_fwd.build_launches(..., backend="npu")`` validates the inputs, derives the
    call's ``LaunchConfig`` (the policy's constexprs, the Ascend tile plan, the grids; no tuning overrides: the
    gate compiles the default plan), allocates the buffers and returns the launches without running them. The gate calls it on small CPU inputs of each case; the kernels, arguments,
    constexprs and grids it compiles are exactly the launcher's. Runtime ints (B, S, H, …) are one
    representative size per case: B = 2, H = 2, G = 1, S = 3·C − 1 (three chunks, the last one padded), so none is
    specialised as 1 or as a multiple of 16 the way a unit batch would be.

    ``operators``: stage 1 (``mamba_mimo_bwd_fwd``) on ``cases`` (or the scope's), and the forward
    (``mamba_mimo_fwd``, ``mimo_numerics.kernels.mimo_fwd.build_launches``) on :data:`FORWARD_CI_CASES` under the
    ci scope (the other scopes: on their stage-1 cases whose preset has forward semantics), or on ``cases`` when
    given. Forward plans are labelled ``fwd_…``. Stage 2 (``mamba_mimo_bwd_bwd``) on :data:`STAGE2_CI_CASES` under
    the ci scope, else as the forward; cases its launcher refuses on NPU (``backend_refusal``) are left out. Its plans
    are labelled ``bwd2_…``.
    """
    import torch

    from mimo_numerics import cases as _cases
    from mimo_numerics import presets as _presets

    presets = tuple(presets or GATE_PRESETS)
    chain_wanted = CHAIN in operators
    operators = tuple(o for o in operators if o != CHAIN)
    unknown = sorted(set(operators) - set(OPERATOR_LAUNCHERS))
    if unknown:
        raise ValueError(f"operators {unknown} unknown; known: {sorted(OPERATOR_LAUNCHERS) + [CHAIN]}")
    own_cases = {op: cases for op in OPERATOR_LAUNCHERS}
    if cases is None:
        if scope == "full":
            cases = full_cases(presets)
        elif scope == "wide":
            cases = wide_cases(presets)
        elif scope == "ci":
            cases = ci_cases(presets)
        elif scope == "bounds":
            cases = bounds_cases(presets)
        else:
            raise ValueError(f"scope must be 'ci', 'wide', 'bounds' or 'full', got {scope!r}")
        own_cases = {op: cases for op in OPERATOR_LAUNCHERS}
        if scope == "ci":
            own_cases["mamba_mimo_fwd"] = [cs for cs in FORWARD_CI_CASES if cs[0] in presets]
            own_cases["mamba_mimo_bwd_bwd"] = [cs for cs in STAGE2_CI_CASES if cs[0] in presets]
    jobs = []
    for operator in operators:
        module = OPERATOR_LAUNCHERS[operator]
        build = getattr(importlib.import_module(module), "build_launches", None)
        if build is None:
            raise GateEnvironmentError(f"{module} has no build_launches(); the gate needs the launcher to describe "
                                       "its launches without running them (docs/ascend_findings.md)")
        refusal = getattr(importlib.import_module(module), "backend_refusal", None)
        for case in own_cases[operator]:
            if not _presets.get(case[0]).defines(operator):  # seed_bf16 defines stage 1 only
                continue
            if refusal is not None and refusal("npu", case[1], case[2], case[3] * case[4]):
                continue  # sizes the launcher refuses on NPU (stage 2 beyond its Ascend bounds)
            jobs.append((operator, build, case, False))
            if operator == "mamba_mimo_fwd" and case in FORWARD_FINAL_STATE_CASES:
                jobs.append((operator, build, case, True))
    plans: List[LaunchPlan] = []
    inputs_cache: Dict[Tuple, Any] = {}
    for operator, build, (preset, n, p, c, r, ro, z, d), final in jobs:
        policy = _presets.get(preset)
        shape = (n, p, c, r, ro, z, d, policy.lp_dtype)
        if shape not in inputs_cache:
            inputs_cache.clear()          # cases come grouped; keep memory flat
            spec = _cases.CaseSpec(formula="realistic", batch=2, heads=2, groups=1, seqlen=3 * c - 1, state_dim=n,
                                   value_dim=p, rank=r, chunk_size=c, reduce_o=ro, has_z=z, has_d=d,
                                   dtype=policy.lp_dtype)
            inputs_cache[shape] = _gate_inputs(spec)
        inputs = inputs_cache[shape]
        label = _OPERATOR_LABELS[operator] + ("final_" if final else "") + f"N{n}_P{p}_R{r}_C{c}_" \
            + ("ro" if ro else "fo") + ("Z" if z else "-") + ("D" if d else "-")
        args = [inputs[name] for name in _OPERATOR_INPUTS[operator]]
        with torch.no_grad(), warnings.catch_warnings():
            # without CANN, triton-ascend's driver probe warns "No such file or directory: 'ccec'" on every call
            # (the launcher asks it for the core count and falls back to a default)
            warnings.filterwarnings("ignore", message=r".*ccec.*", category=UserWarning)
            extra = {"return_state": True} if final else {}
            prep = build(*args, **stage1_cases.as_kwargs(inputs), policy=policy, backend="npu", **extra)
        for launch in prep.launches:
            if final and launch.kernel.__name__ != "_mimo_state_kernel":
                continue  # the rest is the plain case's plan
            grid = launch.grid if isinstance(launch.grid, (tuple, list)) else (int(launch.grid),)
            plans.append(LaunchPlan(kernel=launch.kernel, args=tuple(launch.args),
                                    kwargs={**launch.constexprs, **launch.options}, grid=tuple(grid),
                                    name=label, group=preset))
    if chain_wanted:
        plans += chain_plans([cs for cs in CHAIN_CI_CASES if cs[0] in presets])
    return plans


#: Each operator's label prefix in the report and its tensor arguments, in launcher order.
_OPERATOR_LABELS = {"mamba_mimo_bwd_fwd": "", "mamba_mimo_fwd": "fwd_", "mamba_mimo_bwd_bwd": "bwd2_"}
_OPERATOR_INPUTS = {"mamba_mimo_bwd_fwd": _STAGE1_INPUTS, "mamba_mimo_fwd": _FORWARD_INPUTS,
                    "mamba_mimo_bwd_bwd": _STAGE2_INPUTS}


def _gate_inputs(spec) -> Dict[str, Any]:
    """Stage 1's CPU inputs for ``spec`` plus stage 2's ``states`` and ``qk_dot`` (zeros of the right shapes and lp
    dtype: a compile needs their shapes and dtypes only)."""
    import torch

    inputs = stage1_cases.make_inputs(spec, "cpu")
    q, v = inputs["q"], inputs["v"]
    B, S, R, _, N = q.shape
    H, P = v.shape[2], v.shape[3]
    nc = -(-S // spec.chunk_size)
    inputs["states"] = torch.zeros((B, H, nc, N, P), dtype=q.dtype)
    inputs["qk_dot"] = torch.zeros((B, H, S, R, R), dtype=q.dtype)
    return inputs


# ---------------------------------------------------------------------------------------------- report

def _provenance_header(command: str, prov: Optional[Dict[str, Any]] = None) -> str:
    """``mimo_numerics.provenance``'s header (commit, ``git describe --dirty``, clean or not, command, versions,
    machine) for ``command``; ``prov`` is a :func:`mimo_numerics.provenance.collect` dict collected earlier."""
    from mimo_numerics import provenance

    return provenance.markdown_header(prov if prov is not None else provenance.collect(command=command))


def write_report(results: Sequence[CompileResult], path: Path, info: Dict[str, str], wall: float,
                 command: str, n_launches: Optional[int] = None, expected: Optional[int] = None,
                 prov: Optional[Dict[str, Any]] = None) -> None:
    parts = list(dict.fromkeys(r.part for r in results))
    lines = [
        "# Ascend compile gate",
        "",
        _provenance_header(command, prov) + " Do not edit by hand.",
        "",
        "Each row: one kernel specialization the launcher produces, compiled for one Ascend part through the",
        "Triton front end, triton-adapter (linalg) and the BiShengIR HFusion/HIVM pipeline of `bishengir-compile`,",
        "stopping at the external `hivmc` step (CANN, not installable here). *pass* = the pipeline reached `hivmc`",
        "with no error. Not executed; NPU numerics unverified (docs/ascend.md). *UB used*: highest unified-buffer",
        "byte the planned kernel addresses (BiShengIR's auto-tiling may sub-tile a big kernel until it fills the",
        "buffer, so a value near 192 KiB is not by itself a warning); *(no multi-buffer)*: it fitted only after",
        "BiShengIR switched auto multi-buffering (double buffering) off, which costs speed.",
        "",
        *([f"**Partial: {len(results)} of {expected} compiles done so far (the run is still going or was "
           "stopped).**", ""] if expected is not None and len(results) < expected else []),
        "Environment: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "bishengir-compile")
        + f". Wall time {wall:.1f} s on a 2-core machine shared with other jobs (load "
        + f"{os.getloadavg()[0]:.1f} at the end): compile times are wall-clock and vary with load."
        + ("" if n_launches is None else
           f" {n_launches} launcher launches, {len({r.index for r in results})} distinct specializations "
           "(identical kernel + signature + constexprs compiled once; the group column lists who shares it)."),
        "",
        "## Summary",
        "",
        "| part | specializations | pass | fail | skipped | compile time total (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for part in parts:
        rs = [r for r in results if r.part == part]
        lines.append(f"| {part} | {len(rs)} | {sum(r.ok for r in rs)} | "
                     f"{sum(not r.ok and not r.skipped for r in rs)} | {sum(r.skipped for r in rs)} | "
                     f"{sum(r.seconds for r in rs):.1f} |")
    fails = [r for r in results if not r.ok and not r.skipped]
    if fails:
        lines += ["", "## Failures", ""]
        for r in fails:
            lines += [f"### {r.kernel} [{r.spec}] on {r.part} ({r.stage})", "", "```", _tail(r.message, 1500), "```"]
            if r.log:
                lines += ["", "<details><summary>end of the compiler log</summary>", "", "```",
                          _tail(r.log, 1500), "```", "", "</details>"]
            lines.append("")
    lines += ["", "## All compiles", "",
              "| kernel | specialization | group | part | result | stage | time (s) | UB used (KiB of 192) |",
              "|---|---|---|---|---|---|---:|---:|"]
    order = {p: i for i, p in enumerate(parts)}
    for r in sorted(results, key=lambda r: (r.index, order.get(r.part, 0))):
        if r.ub_required_bits is not None:
            ub = f"overflow: needs {r.ub_required_bits / 8192:.0f}"
        elif r.ub_peak_bytes is not None:
            ub = f"{r.ub_peak_bytes / 1024:.1f}" + (" (no multi-buffer)" if r.no_multibuffer else "")
        else:
            ub = ""
        lines.append(f"| {r.kernel} | {r.spec} | {r.group} | {r.part} | {r.status} | {r.stage} | "
                     f"{r.seconds:.2f} | {ub} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(without_machine_paths("\n".join(lines)) + "\n", encoding="utf-8")


def without_machine_paths(text: str) -> str:
    """``text`` with this machine's paths (the environment's ``sys.prefix`` and the repository root, which a tool's
    stack dump prints) replaced by ``<venv>`` and ``<repo>``: a report names no machine's folders."""
    for prefix, name in ((sys.prefix, "<venv>"), (str(ROOT), "<repo>")):
        text = text.replace(prefix.rstrip("/") + "/", name + "/")
    return text


# ---------------------------------------------------------------------------------------------- CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", default=None,
                    help="MODULE[:FUNC] returning launch plans (default: the project's kernels)")
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS), help="comma-separated Ascend parts")
    ap.add_argument("--presets", default=None, help="comma-separated presets (default: all gated presets)")
    ap.add_argument("--scope", choices=("ci", "wide", "bounds", "full"), default="ci",
                    help="ci: what CI compiles, every preset, branch, dim and tile class (reports/ascend_compile.md); "
                         "wide: all tile classes with the heavy branches and all switches with one tile "
                         "(reports/ascend_compile_wide.md); bounds: every N x P x (C, R) with the heaviest branches "
                         "(with --operators mamba_mimo_bwd_bwd: stage 2's NPU bounds); full: every preset x N x P x "
                         "(C, R) x branch (days). Times: docs/ascend.md")
    ap.add_argument("--operators", default=",".join(DEFAULT_OPERATORS),
                    help="comma-separated launchers to compile, of " + ", ".join(OPERATOR_LAUNCHERS))
    ap.add_argument("--filter", default=None, help="only plans whose kernel or specialization contains this")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel bishengir runs")
    ap.add_argument("--max-failures", type=int, default=0,
                    help="stop compiling new specializations after this many failures (0: never)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per bishengir-compile run")
    ap.add_argument("--report", default=str(ROOT / "reports" / "ascend_compile.md"))
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="print failures and the summary only")
    a = ap.parse_args(argv)

    try:
        info = check_environment()
        presets = a.presets.split(",") if a.presets else None
        if a.plans:
            plans = load_plans(a.plans, **({"presets": tuple(presets)} if presets else {}))
        else:
            plans = project_plans(presets, scope=a.scope, operators=tuple(o for o in a.operators.split(",") if o))
    except GateEnvironmentError as exc:
        print(f"ascend_compile_gate: {exc}", file=sys.stderr)
        return 2
    if a.filter:
        plans = [p for p in plans if a.filter in p.kernel_name or a.filter in spec_label(p)
                 or a.filter in p.group]
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    n_launches = len(plans)
    plans = dedupe_plans(plans, parts[0])
    print(f"ascend_compile_gate: {n_launches} launches -> {len(plans)} distinct specializations x {len(parts)} "
          f"parts ({', '.join(parts)}), triton-ascend {info['triton-ascend']}, "
          f"ascendnpu-ir {info['ascendnpu-ir']}", flush=True)

    partial: List[CompileResult] = []
    expected = len(plans) * len(parts)
    cmd = "python scripts/ascend_compile_gate.py" + ("" if argv is None else " " + " ".join(argv))
    if argv is None and len(sys.argv) > 1:
        cmd += " " + " ".join(sys.argv[1:])
    from mimo_numerics import provenance

    prov = provenance.collect(command=cmd)
    t0 = time.perf_counter()

    def progress(r: CompileResult):
        partial.append(r)
        if not a.no_report:      # rewrite as results come in, so a stopped run still leaves its table
            write_report(partial, Path(a.report), info, time.perf_counter() - t0, cmd, n_launches, expected,
                         prov)
        if r.skipped:
            return
        if not r.ok:
            print(r.describe(), flush=True)
        elif not a.quiet:
            print(f"  pass {r.part:<15} {r.seconds:6.2f}s  {r.kernel} [{r.spec}]", flush=True)

    results = run_gate(plans, parts, jobs=a.jobs, progress=progress, dedupe=False, timeout=a.timeout,
                       max_failures=a.max_failures)
    wall = time.perf_counter() - t0
    if not a.no_report:
        write_report(results, Path(a.report), info, wall, cmd, n_launches, expected, prov)
    n_fail = sum(not r.ok and not r.skipped for r in results)
    n_skip = sum(r.skipped for r in results)
    n_pass = sum(r.ok for r in results)
    for part in parts:
        rs = [r for r in results if r.part == part]
        print(f"ascend_compile_gate: {part}: {sum(r.ok for r in rs)} passed, "
              f"{sum(not r.ok and not r.skipped for r in rs)} failed, {sum(r.skipped for r in rs)} skipped")
    print(f"ascend_compile_gate: {n_pass} passed, {n_fail} failed, {n_skip} skipped in {wall:.1f} s")
    if not results:
        print("ascend_compile_gate: no specialization compiled", file=sys.stderr)
        return 1
    return 1 if (n_fail or n_skip) else 0


if __name__ == "__main__":
    sys.exit(main())
