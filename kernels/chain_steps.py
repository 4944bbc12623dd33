"""Launchers of the whole op's preprocessing and FP32 epilogue on Triton kernels (``_chain_kernels.py``).

``preprocess(adt, angles, dt, chunk_size, policy=...)`` returns what ``ops.mamba3_mimo.chain.preprocess`` returns
(``angles_cumsum``, ``da_cs``, ``da_cs_rev``, ``segsum``, with ``return_state`` ``final_angle``) and
``epilogue(*21 tensors, groups, chunk_size, policy=...)`` what ``ops.mamba3_mimo_epilogue.reference`` returns (the
14 gradients, ``ddt_core``, ``dDT_angle``), after the same validation. Each builds its launches first
(:func:`build_preprocess_launches`, :func:`build_epilogue_launches`: a list of ``_launch.Launch`` and a ``finish``,
so the Ascend compile gate and ``compile_ahead`` see every launch), then runs them. The ordered sums and scans over
chunks or over the batch are ``ordered_sums``' kernels, launched the same way.

The policy reaches these kernels through :func:`chain_constexprs`: ``helper_fma`` (``HELPER_FMA``: the helpers'
``a·b + c`` written as one ``tl.fma``), ``round_outputs`` (the bias sums rounded to lp, as 2.3.2.post1 stores
them: the kernels, like the operator kernels, take ``round_outputs=True`` policies only). ``special_functions`` must
be ``"accurate"`` (the kernels' ``exp``, ``tanh``, σ are not the H200's MUFU forms) and ``math_dtype`` float32:
other values raise ``UnsupportedPolicyError`` naming the field. The other FP32-level knobs do not act on these steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.ops.mamba3_mimo_epilogue.reference import BIAS_SUM_BLOCK
from mimo_numerics.ops.mamba3_mimo_epilogue.spec import OUTPUT_NAMES
from mimo_numerics.ops.mamba3_mimo_epilogue.validation import validate_inputs as _validate_epilogue
from mimo_numerics.policy import RoundingPolicy

from . import _backend, ordered_sums
from ._config import UnsupportedPolicyError, per_policy
from ._launch import LP_NAN_BITS, Launch, require_triton

#: Elements per program of the element-wise and column-block launches.
_BLOCK = 256
#: Columns per program of the bias sums.
_SUM_COLS = 128
#: Rows per program of the sum over heads.
_HEAD_ROWS = 16
#: Tokens per step of ``_dadt_kernel``, on every backend (so the order is the same everywhere): at C = 64 one
#: [C, C] tile overflowed Ascend's unified buffer (7.4 Mbit of 1.57), 16-token steps too (2.2 Mbit); 8 fit
#: (``scripts/ascend_compile_gate.py --operators mamba3_mimo_chain``).
DADT_ROWS = 8
_LP_CODE = {torch.bfloat16: 0, torch.float16: 1}


@per_policy
def chain_constexprs(policy) -> Dict[str, object]:
    """The policy as the chain kernels' constexprs: ``HELPER_FMA`` (``helper_fma == "contracted"``) and ``ROUND``
    (``round_outputs``, always True here).

    Raises:
        UnsupportedPolicyError: ``math_dtype`` other than float32, ``round_outputs=False`` or ``special_functions``
            other than ``"accurate"`` (the message names the field). TypeError: not a policy.
    """
    policy = _presets.resolve(policy)
    if not isinstance(policy, RoundingPolicy):
        raise TypeError(f"policy must resolve to a RoundingPolicy, got {type(policy).__name__}")
    if policy.math_dtype != "float32":
        raise UnsupportedPolicyError(f"RoundingPolicy.math_dtype={policy.math_dtype!r} cannot be expressed by the "
                                     "preprocessing and epilogue kernels: they compute in float32 only")
    if policy.round_outputs is not True:
        raise UnsupportedPolicyError("RoundingPolicy.round_outputs=False cannot be expressed by the preprocessing "
                                     "and epilogue kernels: their lp outputs are always stored in the lp dtype")
    if policy.special_functions != "accurate":
        raise UnsupportedPolicyError(
            f"RoundingPolicy.special_functions={policy.special_functions!r} is not implemented by the preprocessing "
            "and epilogue kernels (their exp, tanh and sigmoid are portable FP32 forms, not the H200's MUFU ones)")
    return {"HELPER_FMA": policy.helper_fma == "contracted", "ROUND": True}


@dataclass
class ChainLaunches:
    """The launches of one preprocessing or epilogue call; ``run()`` launches them and returns ``finish()``."""

    launches: List[Launch]
    backend: str
    finish: Callable[[], Dict[str, Optional[torch.Tensor]]]

    def run(self) -> Dict[str, Optional[torch.Tensor]]:
        if self.backend != "interpreter" and any(_backend.is_interpreted(la.kernel) for la in self.launches):
            raise RuntimeError("TRITON_INTERPRET=1 is set, so the kernels for these device tensors would run in "
                               "Triton's interpreter; unset it")
        for launch in self.launches:
            launch.run()
        return self.finish()


def _options(backend: str) -> dict:
    return {"enable_fp_fusion": False} if backend == "cuda" else {}


def _ordered(backend: str, name: str, grid: int, args: tuple, **constexprs) -> Launch:
    """A launch of one of ``ordered_sums``' kernels (rows walked in order, ``ordered_sums.CUDA_BLOCK`` columns a
    program)."""
    kernel = ordered_sums.compiled_kernels(backend == "interpreter")[name]
    return Launch(f"ordered_{name}", kernel, grid, args, dict(BLOCK=ordered_sums.CUDA_BLOCK, **constexprs),
                  _options(backend))


def _cols_grid(n_cols: int) -> int:
    return -(-n_cols // ordered_sums.CUDA_BLOCK)


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


# ---------------------------------------------------------------------------------------------------- preprocessing
def build_preprocess_launches(adt, angles, dt, chunk_size: int, *, policy="upstream_sm90", return_state: bool = False,
                              backend: Optional[str] = None) -> ChainLaunches:
    """Validate, allocate and describe the preprocessing's launches without running them (``backend``: plan a device
    launch from CPU tensors, e.g. for the Ascend compile gate)."""
    from mimo_numerics.ops.mamba3_mimo.preprocess import check_preprocess_inputs

    require_triton()
    chain_constexprs(policy)
    check_preprocess_inputs(adt, angles, dt, chunk_size)
    for name, x in (("adt", adt), ("angles", angles), ("dt", dt)):
        if x.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (upstream's dtype) for the kernels, got {x.dtype}")
    backend = backend or _backend.backend_of(adt.device)
    mod = _backend.chain_module(backend == "interpreter")
    adt, angles, dt = adt.contiguous(), angles.contiguous(), dt.contiguous()
    B, H, S = adt.shape
    K = angles.shape[3]
    C, nc = chunk_size, -(-S // chunk_size)
    dev, f32 = adt.device, torch.float32
    da_cs = torch.empty((B, H, S), dtype=f32, device=dev)
    da_cs_rev = torch.empty((B, H, S), dtype=f32, device=dev)
    segsum = torch.empty((B, H, nc, C, C), dtype=f32, device=dev)
    # one more walk row (zero terms) gives the state after the last chunk (upstream's output state)
    rows = nc + 1 if return_state else nc
    sums = torch.empty((rows, B, H, K), dtype=f32, device=dev)
    if return_state:
        sums[nc].zero_()
    entering = torch.empty_like(sums)
    out = torch.empty((B, S, H, K), dtype=f32, device=dev)
    opts = _options(backend)
    KP = _pow2(K)
    residual64 = backend == "interpreter"
    launches = [
        Launch("dacs_segsum", mod._dacs_segsum_kernel, B * H * nc, (adt, da_cs, da_cs_rev, segsum, S, nc),
               {"C": C}, dict(opts)),
        Launch("angle_sum", mod._angle_sum_kernel, B * nc * H, (angles, dt, sums, B, S, H, K, nc),
               {"C": C, "KP": KP}, dict(opts)),
        _ordered(backend, "angle_walk", _cols_grid(B * H * K), (sums, entering, rows, B * H * K),
                 TWO_PI=ordered_sums.TWO_PI_F32, RESIDUAL_IN_F64=residual64),
        Launch("angle_out", mod._angle_out_kernel, B * nc * H, (angles, dt, entering, out, B, S, H, K, nc),
               {"C": C, "KP": KP, "TWO_PI": ordered_sums.TWO_PI_F32, "RESIDUAL_IN_F64": residual64}, dict(opts)),
    ]

    def finish():
        pre = {"angles_cumsum": out, "da_cs": da_cs, "da_cs_rev": da_cs_rev, "segsum": segsum}
        if return_state:
            pre["final_angle"] = entering[nc]
        return pre

    return ChainLaunches(launches, backend, finish)


def preprocess(adt, angles, dt, chunk_size: int, *, policy="upstream_sm90",
               return_state: bool = False) -> Dict[str, torch.Tensor]:
    """Upstream's preprocessing (``angle_dt_fwd``, ``compute_dacs_segsum_triton``) on kernels, 4 launches.

    Args:
        adt (Tensor): ``[B, H, S]`` float32 (A·dt). angles (Tensor): ``[B, S, H, K]`` float32, raw.
        dt (Tensor): ``[B, H, S]`` float32. chunk_size (int): C, a power of 2.
        policy: a policy the kernels express (:func:`chain_constexprs`).
        return_state (bool): also ``final_angle [B, H, K]``, the angle walk's state after the last chunk.

    Returns:
        dict: ``angles_cumsum [B, S, H, K]``, ``da_cs``, ``da_cs_rev [B, H, S]``, ``segsum [B, H, nc, C, C]``
        (float32), and with ``return_state`` ``final_angle``.

    Raises:
        ImportError: no Triton. UnsupportedPolicyError: see :func:`chain_constexprs`. TypeError, ValueError: bad
        inputs, naming the argument.
    """
    return build_preprocess_launches(adt, angles, dt, chunk_size, policy=policy, return_state=return_state).run()


# ---------------------------------------------------------------------------------------------------- epilogue
def build_epilogue_launches(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
                            dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum, *, groups: int,
                            chunk_size: int, policy="upstream_sm90", backend: Optional[str] = None,
                            poison: bool = False) -> ChainLaunches:
    """Validate, allocate and describe the epilogue's launches without running them (``backend`` as in
    :func:`build_preprocess_launches`; ``poison``: NaN-fill the outputs first, a test hook)."""
    require_triton()
    cx = chain_constexprs(policy)
    dims = _validate_epilogue(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
                              dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum, groups=groups,
                              chunk_size=chunk_size, strict_dtypes=True)
    backend = backend or _backend.backend_of(dims.device)
    mod = _backend.chain_module(backend == "interpreter")
    (dq, dk, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs, trap, dt, angles, da_cs, da_cs_rev,
     segsum) = (x.contiguous() for x in (dq, dk, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs, trap,
                                         dt, angles, da_cs, da_cs_rev, segsum))
    B, S, R, H, N = dq.shape
    A, C, nc = dims.angle_dim, dims.chunk_size, dims.nchunks
    lp, dev, f32 = dims.lp_dtype, dims.device, torch.float32
    LPK = _LP_CODE[lp]
    opts = _options(backend)
    n_bhs = B * H * S

    def bits(x):
        return x.view(torch.int16)

    outputs: Dict[str, Optional[torch.Tensor]] = {}
    launches: List[Launch] = []
    fills: List[torch.Tensor] = []
    # ---- bias sums over (B, S): TB-row blocks in order, then the blocks in order; rounded to lp (ROUND)
    T, cols = B * S, R * H * N
    n_blocks = -(-T // BIAS_SUM_BLOCK)
    n_cb = -(-cols // _SUM_COLS)
    for name, x in (("dQ_bias", dq), ("dK_bias", dk)):
        part = torch.empty((n_blocks, cols), dtype=f32, device=dev)
        total = torch.empty((H, R, N), dtype=f32, device=dev)
        launches.append(Launch(f"block_sum_{name}", mod._block_sum_kernel, n_blocks * n_cb,
                               (bits(x), part, T, cols, n_cb), {"TB": BIAS_SUM_BLOCK, "BLOCK": _SUM_COLS, "LPK": LPK},
                               dict(opts)))
        launches.append(Launch(f"bias_total_{name}", mod._bias_total_kernel, n_cb, (part, total, n_blocks, R, H, N),
                               {"BLOCK": _SUM_COLS, "LPK": LPK, "ROUND": cx["ROUND"]}, dict(opts)))
        outputs[name] = total
        fills.append(total)
    # ---- dQ, dK: the lp sum over the heads of a group (G == 1); per head (G == H) stage 2's own tensors
    for name, x in (("dQ", dq), ("dK", dk)):
        if dims.groups == H:
            outputs[name] = x
            continue
        out = torch.empty((B, S, R, 1, N), dtype=lp, device=dev)
        launches.append(Launch(f"head_sum_{name}", mod._head_sum_kernel, -(-(T * R) // _HEAD_ROWS),
                               (bits(x), bits(out), T * R, H, N), {"BT": _HEAD_ROWS, "NP": _pow2(N), "LPK": LPK},
                               dict(opts)))
        outputs[name] = out
        fills.append(out)
    # ---- sums over the batch, in order
    for name, x in (("dMIMO_V", dmimo_v), ("dMIMO_Z", dmimo_z), ("dMIMO_Out", dmimo_o), ("dD", dD)):
        if x is None:
            outputs[name] = None
            continue
        x = x.contiguous()
        out = torch.empty(x.shape[1:], dtype=f32, device=dev)
        n_cols = out.numel()
        launches.append(_ordered(backend, "row_sum", _cols_grid(n_cols), (x, out, B, n_cols)))
        outputs[name] = out
        fills.append(out)
    # ---- angle_dt_bwd: chunk sums, the later chunks' sums (exclusive reverse scan), then dAngles and dDT_angle
    AP = _pow2(A)
    sums = torch.empty((nc, B, H, A), dtype=f32, device=dev)
    later = torch.empty_like(sums)
    d_angles = torch.empty((B, S, H, A), dtype=f32, device=dev)
    ddt_angle = torch.empty((B, H, S), dtype=f32, device=dev)
    launches.append(Launch("angle_grad_sum", mod._angle_grad_sum_kernel, B * nc * H, (dangles, sums, B, S, H, A, nc),
                           {"C": C, "AP": AP}, dict(opts)))
    launches.append(_ordered(backend, "scan", _cols_grid(B * H * A), (sums, later, nc, B * H * A), REVERSE=True,
                             EXCLUSIVE=True))
    launches.append(Launch("angle_grad", mod._angle_grad_kernel, B * nc * H,
                           (dangles, angles, dt, sums, later, d_angles, ddt_angle, B, S, H, A, nc),
                           {"C": C, "AP": AP, "HELPER_FMA": cx["HELPER_FMA"]}, dict(opts)))
    # ---- bwd_dtrap_ddt (after angle_dt_bwd: it adds dDT_angle into dDT)
    ddt_core = torch.empty((B, H, S), dtype=f32, device=dev)
    ddt = torch.empty((B, H, S), dtype=f32, device=dev)
    dtrap = torch.empty((B, H, S), dtype=lp, device=dev)
    launches.append(Launch("dtrap_ddt", mod._dtrap_ddt_kernel, -(-n_bhs // _BLOCK),
                           (bits(trap), dt, dfactor, dgamma_diag, ddt_angle, ddt_core, ddt, bits(dtrap), S, n_bhs),
                           {"BLOCK": _BLOCK, "LPK": LPK, "HELPER_FMA": cx["HELPER_FMA"]}, dict(opts)))
    # ---- bwd_dadt_fused, added to stage 2's ddA
    dadt = torch.empty((B, H, S), dtype=f32, device=dev)
    launches.append(Launch("dadt", mod._dadt_kernel, B * H * nc,
                           (dSSdA, segsum, ddA_cs, ddA_cs_rev, da_cs, da_cs_rev, ddA, dadt, S, nc),
                           {"C": C, "RB": min(C, DADT_ROWS)}, dict(opts)))
    fills += [d_angles, ddt_angle, ddt_core, ddt, dtrap, dadt]
    if poison:
        for x in fills:
            if x.dtype == f32:
                x.fill_(float("nan"))
            else:
                x.view(torch.int16).fill_(LP_NAN_BITS[lp])
    outputs.update(dV=dv, dZ=dz, dAngles=d_angles, dDT_angle=ddt_angle, ddt_core=ddt_core, dDT=ddt, dTrap=dtrap,
                   dADT=dadt)

    def finish():
        return {name: outputs[name] for name in OUTPUT_NAMES}

    return ChainLaunches(launches, backend, finish)


def epilogue(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs, dmimo_o, dz,
             dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum, *, groups: int, chunk_size: int,
             policy="upstream_sm90") -> Dict[str, Optional[torch.Tensor]]:
    """The chain after stage 2 on kernels: the 14 gradients, ``ddt_core`` and ``dDT_angle``, as
    ``ops.mamba3_mimo_epilogue.reference.mamba3_mimo_epilogue_reference`` returns them (arguments, shapes, dtypes
    and validation the same; ``dV``, ``dZ`` and, with G == H, ``dQ``, ``dK`` are stage 2's and stage 1's tensors
    themselves, not copies).

    Raises:
        ImportError: no Triton. UnsupportedPolicyError: see :func:`chain_constexprs`. TypeError, ValueError: bad
        inputs (the reference's validation).
    """
    return build_epilogue_launches(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev,
                                   ddA_cs, dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum,
                                   groups=groups, chunk_size=chunk_size, policy=policy).run()
