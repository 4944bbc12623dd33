"""Upstream oracle of the whole op: mamba-ssm's own ``mamba3_mimo`` run forward and backward on CUDA, with the
outputs of every kernel of its chain captured as the chain produces them.

The files are loaded below stub packages exactly as :mod:`mimo_numerics.upstream` loads stage 1 (no
``mamba_ssm/__init__.py`` is executed; :data:`FILES` lists them with their sha256 in ``mamba-ssm==2.3.2.post1``).
:func:`run_whole_op` calls ``mamba3_mimo(...)`` and ``Out.backward(dout)`` once; while it runs, the module globals
through which upstream's chain calls its kernels are wrapped so that each kernel's outputs are copied right after it
returns (before anything downstream changes them in place, such as ``ddA += ...``):

* ``pre``: ``angle_dt_fwd`` (``angles_cumsum``) and ``compute_dacs_segsum_triton`` (``da_cs``, ``da_cs_rev``,
  ``segsum``; the backward's recomputation is checked to give the same bits);
* ``fwd``: ``mamba_mimo_forward`` (``o``);
* ``bwd_fwd``: the stage-1 TileLang kernel ``mamba_mimo_bwd_fwd`` (``dmimo_o`` and ``dmimo_z`` per batch, ``states``,
  ``dz``, ``qk_dot``), read from its output buffers;
* ``bwd_bwd``: the stage-2 kernel ``mamba_mimo_bwd_bwd`` (``dq``, ``dk`` ``[B, S, R, H, N]``, ``dv``, ``dmimo_v``,
  ``dD``, ``dangles``, ``dfactor``, ``dgamma_diag``, ``ddA``, ``dSSdA``, ``ddA_cs_rev``, ``ddA_cs``), plus
  ``states_unchanged`` / ``qk_dot_unchanged`` (stage 2 did not write its stage-1 inputs);
* ``post``: ``bwd_dtrap_ddt_triton`` (``ddt_core``, ``dtrap``), the final ``dADT``, ``angle_dt_bwd``
  (``dAngles``, ``dDT_angle``) and ``dDT``;
* ``autograd``: ``Out`` and the 14 input gradients.

This is the format of ``tests/data/upstream_h200_full_op_cases.pt``. Upstream refusals (a tail S % C != 0 in the
backward, 1 < G < H, a compile failure) are caught and recorded; with ``backward=False`` only the forward runs.

Two runners launch one kernel each, with the arguments of the operator specs (tensors in the operator's API order,
``chunk_size``, ``rotary_dim_divisor``), for ``mimo-numerics run --backend upstream`` on the forward and stage 2:
:func:`run_forward` calls upstream's ``mamba_mimo_forward`` and :func:`run_stage2` launches the ``mamba_mimo_bwd_bwd``
TileLang kernel with the output allocation of ``mamba_mimo_bwd_combined``. Both were written against the upstream
source and tested on the CPU with stand-in modules (``tests/ops/mamba3_mimo/test_upstream_runners.py``); this change did not run them
on a GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional

import torch

from ..mamba_mimo_bwd_fwd import upstream as _stage1_upstream
from .cases import OP_INPUT_NAMES

# The errors and the CUDA check are the stage-1 runner's (one loader for every upstream file); the CLI finds them here
# too, next to the runners of this module.
UpstreamError = _stage1_upstream.UpstreamError
UpstreamUnavailable = _stage1_upstream.UpstreamUnavailable
UpstreamUnsupported = _stage1_upstream.UpstreamUnsupported
check_cuda = _stage1_upstream.check_cuda

_ROOT_T = "mamba_ssm/ops/tilelang/mamba3/"
_ROOT_TR = "mamba_ssm/ops/triton/mamba3/"
#: The upstream files of the whole op in import order: (module, path in the sdist, sha256 in 2.3.2.post1).
FILES = (
    ("mamba_ssm.ops.triton.mamba3.utils", _ROOT_TR + "utils.py",
     "9d93fd772c7f256f517e75445261773e469cfeddb8bb76c1f8f16e9feabb3c13"),
    ("mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils", _ROOT_TR + "mamba3_mimo_utils.py",
     "efbdd750f53c67fd882ffe7a3af3d51ac4aaa341e764e0efa92ce8ea51c27b7c"),
    ("mamba_ssm.ops.triton.mamba3.angle_dt", _ROOT_TR + "angle_dt.py",
     "7d99f8cff37371cfbfe9d4dd36f17a16135fb07f2c6e14add3ad4dd5c0034e2e"),
    ("mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd", _ROOT_T + "mamba3_mimo_fwd.py",
     "8bd934f3ebbad4b92df99726c67dec323f3f1ebc54c98fb0b89fc5037901e7a4"),
    ("mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd_varlen", _ROOT_T + "mamba3_mimo_fwd_varlen.py",
     "f65c5c576f2043ff9d1411ef696411fcb1efd8976328368fb4d557dfd3d78d73"),
    ("mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd", _ROOT_T + "mamba3_mimo_bwd.py",
     "76d0146c3c800f80597bf148c922b3d19cb55c1fe8d67f1c6d0ca8a834c752bd"),
    ("mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd_varlen", _ROOT_T + "mamba3_mimo_bwd_varlen.py",
     "3f025e0dc2932fd4db66bae9bb048a50082c7ab65bd70e7d7c03d583c8c424e6"),
    ("mamba_ssm.ops.tilelang.mamba3.mamba3_mimo", _ROOT_T + "mamba3_mimo.py",
     "c7b0c9e0073747493f629adbfd76ee892f4785223a7e35e2adc07008cec0d45a"),
)
#: The module of upstream's autograd function ``mamba3_mimo`` (a key of :func:`load`'s result).
OP_MODULE = "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo"
#: What ``mamba3_mimo(..., return_state=True)`` returns after ``Out``, in order.
STATE_NAMES = ("Final_Angle", "Final_SSM_State", "Final_K", "Final_V")
_BWD = "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd"

# Positions of the buffers in upstream's kernel calls (mamba_mimo_bwd_combined, mamba3_mimo_bwd.py 1221-1310).
_STAGE1_OUTPUTS = {"dmimo_o": 8, "states": 9, "dz": 12, "dmimo_z": 13, "qk_dot": 20}
_STAGE2_OUTPUTS = {"dk": 8, "dv": 9, "dmimo_v": 10, "dq": 12, "dfactor": 20, "dgamma_diag": 21, "dangles": 22,
                   "dD": 24, "ddA": 26, "dSSdA": 27, "ddA_cs_rev": 28, "ddA_cs": 29}
_STAGE2_INPUTS_KEPT = {"states": 11, "qk_dot": 25}


def load(source_dir=None, *, check_hash: bool = True) -> Dict[str, Any]:
    """The upstream modules of :data:`FILES` by name (see :func:`mimo_numerics.upstream.load_upstream_files`)."""
    files = tuple((name, path, digest if check_hash else None) for name, path, digest in FILES)
    return _stage1_upstream.load_upstream_files(files, source_dir)


def _cpu(x):
    return None if x is None else x.detach().to("cpu", copy=True)


@contextlib.contextmanager
def _patched(module, name: str, wrapper_factory: Callable[[Callable], Callable]):
    original = getattr(module, name)
    setattr(module, name, wrapper_factory(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def _kernel_capture(record: dict, key: str, outputs: Dict[str, int], kept: Optional[Dict[str, int]] = None,
                    reshape: Optional[Callable[[str, torch.Tensor], torch.Tensor]] = None):
    """A wrapper of a TileLang kernel factory whose kernels copy their output buffers into ``record[key]``."""
    def wrap_factory(factory):
        def factory_wrapper(*args, **kwargs):
            kernel = factory(*args, **kwargs)

            def kernel_wrapper(*kargs):
                before = {n: kargs[i].detach().clone() for n, i in (kept or {}).items()}
                result = kernel(*kargs)
                torch.cuda.synchronize()
                got = {}
                for n, i in outputs.items():
                    t = kargs[i]
                    got[n] = None if t is None else _cpu(reshape(n, t) if reshape else t)
                for n, t in before.items():
                    got[f"{n}_unchanged"] = torch.tensor(bool(torch.equal(t, kargs[_STAGE2_INPUTS_KEPT[n]])))
                record.setdefault(key, got)
                return result
            return kernel_wrapper
        return factory_wrapper
    return wrap_factory


def _call_capture(record: dict, key: str, convert: Callable[[Any], dict]):
    """A wrapper of a Python-level upstream function that stores ``convert(result)`` in ``record[key]`` (first call;
    later calls are compared with it and ``record["mismatch"]`` names any that differ)."""
    def wrap(fn):
        def wrapper(*args, **kwargs):
            result = fn(*args, **kwargs)
            got = {n: _cpu(t) for n, t in convert(result).items()}
            if key in record:
                same = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                           for a, b in ((record[key].get(n), got[n]) for n in got))
                if not same:
                    record.setdefault("mismatch", []).append(key)
            else:
                record[key] = got
            return result
        return wrapper
    return wrap


def run_whole_op(inputs: Dict[str, Any], *, backward: bool = True, source_dir=None, return_state: bool = False,
                 cu_seqlens: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """Run upstream's ``mamba3_mimo`` on ``inputs`` (a :func:`cases.make_op_inputs` dict or a golden ``inputs``
    entry, on any device: copied to CUDA) and return the golden-format dict (module docstring) on the CPU.

    Args:
        return_state (bool): call the op with ``return_state=True``; the four final-state tensors are returned
            under ``state`` (``Final_Angle``, ``Final_SSM_State``, ``Final_K``, ``Final_V``).
        cu_seqlens (Tensor, optional): ``[NS + 1]`` int32 offsets (B = 1): upstream's varlen path. Its stage-1 and
            stage-2 kernels live in the varlen module and are not captured (``bwd_fwd``/``bwd_bwd`` absent);
            ``pre``, ``fwd``, ``post`` and ``autograd`` are.

    Returns:
        dict: ``autograd``, ``pre``, ``fwd``, ``bwd_fwd``, ``bwd_bwd``, ``post`` (those that ran), ``state`` (with
        ``return_state``) and, where upstream refused, ``refused`` (``{"forward" | "backward": message}``).
    """
    modules = load(source_dir)
    op, bwd = modules[OP_MODULE], modules[_BWD]
    dev = torch.device("cuda")
    x = {n: (None if inputs[n] is None else inputs[n].detach().to(dev).requires_grad_(
        backward and inputs[n].is_floating_point())) for n in OP_INPUT_NAMES}
    dout = inputs["dout"].to(dev)
    C, divisor = int(inputs["chunk_size"]), int(inputs["rotary_dim_divisor"])
    dtype = x["Q"].dtype
    record: Dict[str, Any] = {}
    B, S, R, G, N = x["Q"].shape

    def qk_layout(name, t):
        return t.reshape(B, S, R, -1, N) if name in ("dq", "dk") else t

    patches = [
        (op, "angle_dt_fwd", _call_capture(record, "pre_angles", lambda r: {"angles_cumsum": r[0]})),
        (op, "compute_dacs_segsum_triton", _call_capture(
            record, "pre_dacs", lambda r: {"da_cs": r[0], "da_cs_rev": r[1], "segsum": r[2]})),
        (op, "compute_dacs_segsum_triton_varlen", _call_capture(
            record, "pre_dacs", lambda r: {"da_cs": r[0], "da_cs_rev": r[1], "segsum": r[2]})),
        (op, "mamba_mimo_forward", _call_capture(record, "fwd", lambda r: {"o": r[0]})),
        (op, "mamba_mimo_forward_varlen", _call_capture(record, "fwd", lambda r: {"o": r[0]})),
        (op, "angle_dt_bwd", _call_capture(record, "post_angles", lambda r: {"dAngles": r[0], "dDT_angle": r[1]})),
        (op, "mamba_mimo_bwd_combined", _call_capture(
            record, "post_combined", lambda r: {"dADT": r[3], "ddt_core": r[4], "dtrap": r[5]})),
        (op, "mamba_mimo_bwd_combined_varlen", _call_capture(
            record, "post_combined", lambda r: {"dADT": r[3], "ddt_core": r[4], "dtrap": r[5]})),
        (bwd, "mamba_mimo_bwd_fwd", _kernel_capture(record, "bwd_fwd", _STAGE1_OUTPUTS)),
        (bwd, "mamba_mimo_bwd_bwd", _kernel_capture(record, "bwd_bwd", _STAGE2_OUTPUTS, _STAGE2_INPUTS_KEPT,
                                                    qk_layout)),
    ]
    refused: Dict[str, str] = {}
    grads: Dict[str, Optional[torch.Tensor]] = {}
    with contextlib.ExitStack() as stack:
        for module, name, factory in patches:
            stack.enter_context(_patched(module, name, factory))
        args = [x[n] for n in OP_INPUT_NAMES]
        try:
            seqlens = None if cu_seqlens is None else cu_seqlens.to(dev, torch.int32)
            out = op.mamba3_mimo(*args, C, divisor, dtype, return_state, seqlens)
            torch.cuda.synchronize()
            if return_state:
                out, *final = out
                record["state"] = {n: _cpu(t) for n, t in zip(STATE_NAMES, final)}
        except Exception as exc:  # an upstream refusal or compile failure: recorded, not raised
            refused["forward"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:2000]}"
            out = None
        if out is not None and backward:
            try:
                out.backward(dout)
                torch.cuda.synchronize()
                grads = {"d" + n: _cpu(x[n].grad) if x[n] is not None else None for n in OP_INPUT_NAMES}
            except Exception as exc:
                refused["backward"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:2000]}"
    result: Dict[str, Any] = {}
    if out is not None:
        result["autograd"] = {"Out": _cpu(out), **grads}
        result["fwd"] = record.get("fwd")
        result["pre"] = {**record.get("pre_angles", {}), **record.get("pre_dacs", {})}
        if return_state:
            result["state"] = record.get("state")
    if grads:
        for key in ("bwd_fwd", "bwd_bwd"):
            if cu_seqlens is None:
                result[key] = record.get(key)
        post = {**record.get("post_combined", {}), **record.get("post_angles", {})}
        post["dDT"] = grads.get("dDT")
        result["post"] = {n: post.get(n) for n in ("ddt_core", "dtrap", "dADT", "dAngles", "dDT_angle", "dDT")}
    if refused:
        result["refused"] = refused
    if record.get("mismatch"):
        result["recompute_mismatch"] = list(record["mismatch"])
    return result


def identical(a: Any, b: Any) -> List[str]:
    """Paths of the tensors that differ between two :func:`run_whole_op` results (empty: bit-identical)."""
    bad = []
    for section in sorted(set(a) | set(b)):
        sa, sb = a.get(section), b.get(section)
        if not isinstance(sa, dict) or not isinstance(sb, dict):
            if sa != sb:
                bad.append(section)
            continue
        for name in sorted(set(sa) | set(sb)):
            ta, tb = sa.get(name), sb.get(name)
            if isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor):
                if ta.dtype != tb.dtype or ta.shape != tb.shape or not torch.equal(
                        ta.view(-1).view(torch.uint8), tb.view(-1).view(torch.uint8)):
                    bad.append(f"{section}.{name}")
            elif ta is not tb and ta != tb:
                bad.append(f"{section}.{name}")
    return bad


# ---------------------------------------------------------------------------------------------------------- runners
_FWD = "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd"
#: Launch constants of ``mamba_mimo_bwd_combined``'s second kernel (``bb_threads``, ``bb_num_stages``).
STAGE2_THREADS = 256
STAGE2_NUM_STAGES = 0
#: How the last runner call launched its kernel (recorded per case by the CLI): ``{"kernel", ...}``.
last_launch: Dict[str, Any] = {}
_stage2_kernels: Dict[tuple, Any] = {}


def _files(*modules: str, check_hash: bool = True):
    """The entries of :data:`FILES` for ``modules`` (in :data:`FILES` order), hashes dropped without ``check_hash``."""
    return tuple((name, path, digest if check_hash else None) for name, path, digest in FILES if name in modules)


def forward_module(source_dir=None, *, check_hash: bool = True):
    """Upstream's ``mamba3_mimo_fwd`` module (one file, no other ``mamba_ssm`` import)."""
    return _stage1_upstream.load_upstream_files(_files(_FWD, check_hash=check_hash), source_dir)[_FWD]


def stage2_module(source_dir=None, *, check_hash: bool = True):
    """Upstream's ``mamba3_mimo_bwd`` module (with the Triton utilities it imports)."""
    files = _files("mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils", _BWD, check_hash=check_hash)
    return _stage1_upstream.load_upstream_files(files, source_dir)[_BWD]


def source_info(source_dir=None) -> Dict[str, str]:
    """``{"source_dir", "mamba_ssm", "files_sha256"}``: the found source and the sha256 of every file of
    :data:`FILES` there (``mimo_numerics.upstream.source_info`` plus the whole op's files)."""
    info = dict(_stage1_upstream.source_info(source_dir))
    root = _stage1_upstream.find_source(source_dir)
    info["files_sha256"] = {path: (_stage1_upstream.sha256(root / path) if (root / path).is_file() else None)
                            for _, path, _ in FILES}
    return info


def _compile_failure(exc: Exception, kernel: str, dims) -> _stage1_upstream.UpstreamError:
    """An upstream failure as an error of this module: a TVM check that fails while compiling (``Check failed``,
    e.g. the forward's ``m_warp * n_warp == num_warps`` for R = 1, C = 16, recorded in the whole-op golden data) is an
    upstream limitation for these sizes (:class:`UpstreamUnsupported`); anything else an :class:`UpstreamError`."""
    text = str(exc)
    last = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
    sizes = (f"N={dims.state_dim} P={dims.value_dim} R={dims.rank} C={dims.chunk_size} "
             f"dtype={str(dims.lp_dtype).replace('torch.', '')}")
    if "Check failed" in text:
        return UpstreamUnsupported(f"upstream limitation: TileLang does not compile {kernel} for {sizes}: {last}")
    return UpstreamError(f"upstream's {kernel} failed to compile or run for {sizes}: {last}")


def _device_context(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def run_forward(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum,
                chunk_size: int = 16, rotary_dim_divisor: int = 4, *, source_dir=None, check_hash: bool = True):
    """Upstream's forward kernel on CUDA tensors: ``mamba_mimo_forward(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d,
    mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum, chunk_size=, rotary_dim_divisor=, dtype=)``, as
    ``mamba3_mimo`` calls it (``return_state=False``, upstream's launch defaults: 128 threads, 0 stages).

    On an H200 it reproduces the kernel outputs upstream's own ``mamba3_mimo`` recorded, bit for bit
    (``tests/ops/mamba3_mimo/test_upstream_runners_gpu.py``); its argument handling is also tested with a stand-in module on CPU.

    Args:
        q..segsum, chunk_size, rotary_dim_divisor: as the forward reference
            (``ops.mamba_mimo_fwd.reference.mamba_mimo_fwd``), all on one CUDA device; ``q, k, v, z, trap`` bfloat16
            or float16, which becomes upstream's ``dtype``.
        source_dir: the mamba-ssm source (``mimo_numerics.upstream.find_source``).
        check_hash (bool): require the 2.3.2.post1 kernel file.

    Returns:
        MimoFwdOutputs: ``o`` as upstream wrote it (``[B, S, H, P]`` with ``mimo_o``, else ``[B, S, R, H, P]``;
        lp).

    Raises:
        TypeError, ValueError: invalid inputs (the forward's ``validate_inputs``), before CUDA is looked for.
        UpstreamUnavailable: no CUDA, missing packages or source. UpstreamUnsupported: sizes TileLang does not
        compile (a failing TVM check). UpstreamError: another compile failure.
    """
    from ..mamba_mimo_fwd.spec import MimoFwdOutputs
    from ..mamba_mimo_fwd.validation import validate_inputs

    tensors = (q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum)
    dims = validate_inputs(*tensors, chunk_size, rotary_dim_divisor)
    check_cuda(dims.device)
    module = forward_module(source_dir, check_hash=check_hash)
    args = [None if t is None else t.contiguous() for t in tensors]
    last_launch.clear()
    last_launch.update(kernel="mamba_mimo_forward", dtype=str(dims.lp_dtype).replace("torch.", ""))
    with _device_context(dims.device):
        try:  # compiles (cached by TileLang) and launches
            o, _, _ = module.mamba_mimo_forward(*args, chunk_size=dims.chunk_size,
                                                rotary_dim_divisor=dims.rotary_dim_divisor, dtype=dims.lp_dtype)
        except Exception as exc:  # TileLang raises TVM errors of various types
            raise _compile_failure(exc, "mamba_mimo_fwd", dims) from exc
    return MimoFwdOutputs(o=o)


def _stage2_kernel(module, dims, threads: int, num_stages: int):
    """The compiled stage-2 kernel for these sizes (cached), as ``mamba_mimo_bwd_combined`` builds it."""
    dtype = str(dims.lp_dtype).replace("torch.", "")
    key = (id(module), dims.state_dim, dims.value_dim, dims.rank, dims.has_z, dims.has_d, dims.reduce_o,
           dims.chunk_size, dims.rotary_dim_divisor, dtype, threads, num_stages)
    if key not in _stage2_kernels:
        T = module.T
        try:
            _stage2_kernels[key] = module.mamba_mimo_bwd_bwd(
                T.dynamic("B"), T.dynamic("S"), T.dynamic("H"), T.dynamic("G"),
                dims.state_dim, dims.value_dim, dims.rank, dims.has_z, dims.has_d, dims.reduce_o,
                dims.chunk_size, dims.rotary_dim_divisor, dtype, threads, num_stages)
        except Exception as exc:  # TVM errors of various types
            raise _compile_failure(exc, "mamba_mimo_bwd_bwd", dims) from exc
    return _stage2_kernels[key]


def run_stage2(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
               d, qk_dot, segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4, *, source_dir=None,
               check_hash: bool = True, poison: bool = True, threads: int = STAGE2_THREADS,
               num_stages: int = STAGE2_NUM_STAGES):
    """Upstream's stage-2 TileLang kernel ``mamba_mimo_bwd_bwd`` on CUDA tensors, launched as
    ``mamba_mimo_bwd_combined`` launches it (``mamba3_mimo_bwd.py`` L1249-1310): B, S, H, G dynamic; N, P, R, the
    branch flags, C, the rotary divisor, ``dtype``, 256 threads and 0 stages compile-time; outputs allocated as
    upstream does (``dq``/``dk`` ``[B, S, R, H, N]`` in lp, passed as ``[B, S·R, H, N]`` views; ``dv`` like ``v``;
    ``dmimo_v`` ``[B, H, R, P]`` and ``dD`` ``[B, H]`` float32; the partial terms zero-filled); absent optional
    inputs and ``dD`` passed as None, as upstream passes them. The outputs are the raw per-head / per-batch tensors,
    before the wrapper's sums (which refuse 1 < G < H; the kernel itself does not).

    On an H200 it reproduces the kernel outputs upstream's own ``mamba3_mimo`` recorded, bit for bit
    (``tests/ops/mamba3_mimo/test_upstream_runners_gpu.py``); its argument handling is also tested with a stand-in module on CPU.

    Args:
        dout..segsum, chunk_size, rotary_dim_divisor: as the stage-2 reference
            (``ops.mamba_mimo_bwd_bwd.reference.mamba_mimo_bwd_bwd``; ``states`` and ``qk_dot`` stage 1's lp
            outputs), all on one CUDA device.
        source_dir: the mamba-ssm source. check_hash (bool): require the 2.3.2.post1 kernel file.
        poison (bool): fill the buffers upstream allocates with ``torch.empty`` (``dq, dk, dv, dmimo_v, dD``) with
            NaN, so that an element the kernel never writes shows up (default True).
        threads, num_stages (int): launch constants; upstream uses 256 and 0.

    Returns:
        MimoBwdBwdOutputs: the twelve raw outputs as the kernel wrote them.

    Raises:
        TypeError, ValueError: invalid inputs (stage 2's ``validate_inputs``), before CUDA is looked for.
        UpstreamUnavailable, UpstreamUnsupported, UpstreamError: as :func:`run_forward`.
    """
    from ..mamba_mimo_bwd_bwd.spec import MimoBwdBwdOutputs
    from ..mamba_mimo_bwd_bwd.validation import validate_inputs

    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                           da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor)
    check_cuda(dims.device)
    module = stage2_module(source_dir, check_hash=check_hash)
    kernel = _stage2_kernel(module, dims, threads, num_stages)
    B, S, H, N, P, R = dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank
    dev, lp, f32 = dims.device, dims.lp_dtype, torch.float32

    def empty(shape, dtype):
        t = torch.empty(shape, dtype=dtype, device=dev)
        return t.fill_(float("nan")) if poison else t

    def zeros(shape):
        return torch.zeros(shape, dtype=f32, device=dev)

    dq, dk = empty((B, S, R, H, N), lp), empty((B, S, R, H, N), lp)
    dv, dmimo_v = empty((B, S, H, P), lp), empty((B, H, R, P), f32)
    dD = empty((B, H), f32) if dims.has_d else None
    dangles = zeros((B, S, H, N // dims.rotary_dim_divisor))
    dfactor, dgamma_diag, ddA, ddA_cs_rev, ddA_cs = (zeros((B, H, S)) for _ in range(5))
    dSSdA = zeros((B, H, dims.nchunks, dims.chunk_size, dims.chunk_size))
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    args = [c(dout), c(q), c(k), c(v), c(q_bias), c(k_bias), c(mimo_v), c(mimo_o), dk.view(B, S * R, H, N), dv,
            dmimo_v, c(states), dq.view(B, S * R, H, N), c(z), c(mimo_z), c(angles), c(da_cs), c(da_cs_rev), c(dt),
            c(trap), dfactor, dgamma_diag, dangles, c(d), dD, c(qk_dot), ddA, dSSdA, ddA_cs_rev, ddA_cs, c(segsum)]
    last_launch.clear()
    last_launch.update(kernel="mamba_mimo_bwd_bwd", threads=threads, num_stages=num_stages,
                       dtype=str(lp).replace("torch.", ""))
    with _device_context(dev):
        kernel(*args)
    return MimoBwdBwdOutputs(dq=dq, dk=dk, dv=dv, dmimo_v=dmimo_v, dD=dD, dangles=dangles, dfactor=dfactor,
                             dgamma_diag=dgamma_diag, ddA=ddA, dSSdA=dSSdA, ddA_cs_rev=ddA_cs_rev, ddA_cs=ddA_cs)
