"""FP32 reference of the chain after stage 2, computed as upstream computes it (mamba-ssm 2.3.2.post1).

Steps and source lines (``docs/stage2_oracle.md`` has the formulas):

1. torch sums in ``mamba_mimo_bwd_combined`` (``mamba3_mimo_bwd.py`` L1312-1327): ``dQ_bias``/``dK_bias`` =
   ``dq``/``dk`` summed over ``(B, S)``, a sum of a bf16 tensor, so accumulated in fp32 and rounded once to the lp
   dtype (autograd then casts it to the fp32 dtype of ``Q_bias``); for G == 1 ``dQ``/``dK`` = the lp sum over
   heads; ``dMIMO_V``, ``dMIMO_Z``, ``dD`` (and ``dMIMO_Out``, L1245-1246) summed over B in fp32; 1 < G < H
   raises ``ValueError``.
2. ``bwd_dtrap_ddt_triton`` (``mamba3_mimo_utils.py`` L235-351, L575-608) -> ``ddt_core`` (fp32) and ``dTrap``
   (stored in the dtype of ``Trap``). The code uses σ(-Trap[t+1]) for the shifted γ (its docstring says
   σ(Trap[t+1])); this follows the code.
3. ``bwd_dadt_fused_triton`` (L72-128, L148-217, L520-573) -> added to stage 2's ``ddA`` (L1333-1335) = ``dADT``.
   Its docstring says the caller multiplies by -log2 e; nobody does (the natural-log convention is used
   throughout): this follows the code.
4. ``angle_dt_bwd`` (``angle_dt.py`` L232-342, called from ``mamba3_mimo.py`` L194-202) -> ``dAngles``,
   ``dDT_angle``; ``dDT = ddt_core + dDT_angle`` (L202).

The clamp: upstream's preprocessing clamps ``da_cs``, ``da_cs_rev`` and ``segsum`` to ``<= 0``
(``compute_dacs_segsum_triton``, L486-508) and every step above differentiates as if there were no clamp: the
exponentials use the clamped values, and no indicator of the clamp appears. This reference (and the FP64 oracle)
do the same. Where ADT makes a partial sum positive, upstream's ``dADT`` is therefore not the gradient of its own
forward (``docs/stage2_oracle.md``).

FP32-level details:

* modelled, as parameters: ``fma`` (Triton contracts ``a * b + c`` into one fused multiply-add: the two
  ``x + dgamma * y`` of ``bwd_dtrap_ddt`` and ``1 - tanh² `` of ``sech2_approx``), ``bias_sums_in_lp``
  (2.3.2.post1 rounds ``dQ_bias``/``dK_bias`` to lp; later upstream, #967, keeps fp32);
* modelled, fixed: upstream's forms and operation orders: the sech² as ``1 - tanh(x)²``; the reverse cumulative
  sum of ``angle_dt_bwd`` as ``chunk_sum - cumsum + x`` plus the carried sum of later chunks; the exclusive cumsum
  of ``ddA_cs_rev`` as an inclusive cumsum shifted; the segsum term as a reverse cumsum over the target, masked,
  then a row sum; ``((grad · dt) · π) · sech²`` with π rounded to fp32; ``dADT = ddA + (cumsum terms + segsum
  term)``;
* modelled, as a parameter: ``special_functions="fast_sm90"``: ``tanh.approx.f32`` in ``tanh_approx``/
  ``sech2_approx``, ``tl.exp`` through ``ex2.approx`` and ``tl.sigmoid`` as MUFU.RCP of ``1 + tl.exp(-x)`` (its
  ``div.full.f32`` of 1) bit for bit (subnormal results of ``tl.exp`` flushed, which Triton's non-ftz
  ``ex2.approx.f32`` keeps); torch's functions otherwise;
* modelled: ``angle_dt_bwd``'s ``tl.sum``/``tl.cumsum`` over its ``[C, BLOCK_D]`` tile and its ``tl.sum`` over the
  columns (``dDT_angle``, products contracted under ``fma``) in the order of the tile's layout under the
  autotuner's ``num_warps`` (:mod:`.._common.triton_tiles`; ``angle_dt_bwd_warps``): with the fast special
  functions ``dAngles``, ``dDT_angle``, ``ddt_core`` and ``dDT`` are bit-identical to the H200's on every golden
  case;
* not modelled: the orders of ``bwd_dadt_fused``'s ``tl.cumsum``/``tl.sum`` (``dADT``) and of torch's CUDA sums
  (sequential orders here; the bias sums over B·S tokens sequential in blocks of :data:`BIAS_SUM_BLOCK` tokens,
  then over the blocks). The fused multiply-adds are ``_common.chunked.fused_first``: one correctly rounded FMA
  (``rounding.fma_fp32``).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np
import torch

from ...rounding import round_to_lp
from .._common import triton_tiles
from .._common.chunked import fused_first
from .._common.cuda_graph import replayed
from .._common.special import SpecialFunctions
from .spec import OUTPUT_NAMES
from .validation import validate_inputs

_F32 = torch.float32
#: Triton's ``PI = 3.141592653589793`` used with fp32 operands: rounded to fp32.
_PI_F32 = float(torch.tensor(math.pi, dtype=_F32))


#: Sums over more terms than this run in numpy on the host instead of one torch add per term (a device launch each
#: on CUDA: the bias sums over B·S tokens were 16 384 launches per call at S = 8192).
SEQUENTIAL_LOOP_MAX = 64
#: The bias sums over the B·S tokens run in blocks of this many consecutive tokens, each block summed in order, then
#: the blocks' sums in order (:func:`_sum_blocked`): the order of the Triton epilogue's two-level sum, whose first
#: level runs the blocks in parallel (one sequential chain over all B·S tokens is latency-bound: 8.1 ms of the 47.8 ms
#: at shape (d), ``reports/bench/ncu_whole_op_triton.md``). Upstream sums with torch's CUDA reduction, an order
#: neither models; up to this many tokens (every short golden case) the blocked sum is the sequential one.
BIAS_SUM_BLOCK = 256
#: Sequential sums and scans over more terms than this replay their adds from a CUDA graph on CUDA
#: (``_common.cuda_graph``: the same kernels, the same bits); shorter ones launch them directly.
GRAPH_MIN_TERMS = 8


def _ordered_sums(x: torch.Tensor):
    """``mimo_numerics.kernels.ordered_sums`` for a CUDA ``x`` when it and ``triton`` import, else None (the torch
    loops, replayed from CUDA graphs, or numpy then)."""
    if not x.is_cuda or x.dtype != _F32:
        return None
    try:
        from ... import kernels
        from ...kernels import ordered_sums
    except ImportError:
        return None
    return ordered_sums if kernels.triton_available() else None


def _sum_sequential(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` in fp32, left to right (one IEEE add per element: no BLAS, no vector order).

    On CUDA with Triton: the chain of IEEE fp32 adds in one launch (``kernels/ordered_sums.py``). Otherwise up to
    :data:`SEQUENTIAL_LOOP_MAX` terms a torch add per term (replayed from a CUDA graph on CUDA beyond
    :data:`GRAPH_MIN_TERMS`); longer sums on the host in numpy (one ``np.add`` per term over a contiguous row). The
    same bits every way; NaN payloads of a CUDA input may differ (the GPU returns its canonical NaN).
    """
    x = x.movedim(dim, 0)
    ordered_sums = _ordered_sums(x)
    if ordered_sums is not None:  # the same chain of adds in one Triton launch
        return ordered_sums.ordered_row_sum(x)
    if x.shape[0] > SEQUENTIAL_LOOP_MAX and x.dtype == _F32:
        terms = x.detach().to("cpu").contiguous().numpy().reshape(x.shape[0], -1)
        total = terms[0].copy()
        with np.errstate(all="ignore"):  # inf - inf and overflow are values here, as in torch, not warnings
            for row in terms[1:]:  # row by row: contiguous, where an accumulate along axis 0 walks columns
                np.add(total, row, out=total)
        return torch.from_numpy(total.reshape(x.shape[1:])).to(x.device)
    return replayed(_sum_loop, x) if x.shape[0] > GRAPH_MIN_TERMS else _sum_loop(x)


def _sum_loop(x: torch.Tensor) -> torch.Tensor:
    """``((x[0] + x[1]) + x[2]) + ...`` over dim 0, one torch add per term."""
    acc = x[0].clone()
    for i in range(1, x.shape[0]):
        acc = acc + x[i]
    return acc


def _sum_blocked(x: torch.Tensor, block: int) -> torch.Tensor:
    """Sum over dim 0 in fp32 in blocks: each run of ``block`` consecutive rows summed left to right (the last run
    shorter), then the runs' sums left to right (:func:`_sum_sequential` for both levels: the same bits on every
    device, and the order of the kernels' ``_block_sum_kernel`` and ``_bias_total_kernel``).

    Args:
        x (Tensor): ``[T, ...]`` float32. block (int): rows per run, >= 1. Returns: ``[...]``.
    """
    T = x.shape[0]
    full = T // block
    parts = []
    if full:
        runs = x[:full * block].reshape(full, block, *x.shape[1:]).movedim(1, 0)  # [block, full, ...]
        parts.append(_sum_sequential(runs, dim=0))
    if T > full * block:
        parts.append(_sum_sequential(x[full * block:], dim=0).unsqueeze(0))
    return _sum_sequential(torch.cat(parts, dim=0), dim=0)


def _cumsum_sequential(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Inclusive cumulative sum over the last dim in fp32, left to right (right to left with ``reverse``): one
    Triton launch on CUDA (``kernels/ordered_sums.py``, the same adds), else the torch loop."""
    ordered_sums = _ordered_sums(x)
    if ordered_sums is not None:
        return ordered_sums.ordered_scan(x.movedim(-1, 0), reverse=reverse).movedim(0, -1)
    if x.shape[-1] > GRAPH_MIN_TERMS:
        return replayed(_cumsum_loop, x, reverse=reverse)
    return _cumsum_loop(x, reverse=reverse)


def _cumsum_loop(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """:func:`_cumsum_sequential`, one torch add per element (replayed from a CUDA graph on CUDA)."""
    out = torch.empty_like(x)
    order = range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])
    acc = None
    for i in order:
        acc = x[..., i].clone() if acc is None else acc + x[..., i]
        out[..., i] = acc
    return out


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """``out[..., t] = x[..., t - 1]``, ``out[..., 0] = 0`` (over the last dim)."""
    out = torch.zeros_like(x)
    out[..., 1:] = x[..., :-1]
    return out


def _dtrap_ddt(trap, dt, dfactor, dgamma_diag, *, fma: bool, sigmoid=torch.sigmoid):
    """``bwd_dtrap_ddt_kernel``: ``ddt_core`` and ``dtrap`` (unrounded fp32), all ``[B, H, S]``.

    γ_t = dt_t σ(trap_t) and γ'_t = dt_{t+1} σ(-trap_{t+1}) (0 at S - 1) enter as ``dgamma = dfactor + dgamma_diag``
    and ``dsgamma = dfactor``; the γ' gradient lands one token later (shift right, 0 at t = 0).
    """
    trap32 = trap.to(_F32)
    sig, sig_neg = sigmoid(trap32), sigmoid(-trap32)
    zero = torch.zeros_like(dt[..., :1])
    trap_next = torch.cat([trap32[..., 1:], zero], dim=-1)
    dt_next = torch.cat([dt[..., 1:], zero], dim=-1)
    dgamma = dfactor + dgamma_diag
    d_dt_next = sigmoid(-trap_next) * dfactor
    d_trap_next = -dt_next * dfactor
    ddt = fused_first(dgamma, sig, _shift_right(d_dt_next), fma)
    dtrap = fused_first(dgamma, dt, _shift_right(d_trap_next), fma) * (sig * sig_neg)
    return ddt, dtrap


def _dadt(dSSdA, segsum, ddA_cs, ddA_cs_rev, da_cs, da_cs_rev, chunk_size: int, exp=torch.exp) -> torch.Tensor:
    """``bwd_dadt_fused_triton`` (its two kernels): ``[B, H, S]`` fp32, to be added to stage 2's ``ddA``."""
    B, H, S = ddA_cs.shape
    C, nc = chunk_size, S // chunk_size

    def chunks(x):
        return x.reshape(B, H, nc, C)

    # kernel 1: reverse cumsum of exp(da_cs)·ddA_cs plus the exclusive cumsum of exp(da_cs_rev)·ddA_cs_rev
    from_cs = _cumsum_sequential(exp(chunks(da_cs)) * chunks(ddA_cs), reverse=True)
    from_cs_rev = _shift_right(_cumsum_sequential(exp(chunks(da_cs_rev)) * chunks(ddA_cs_rev)))
    total = from_cs + from_cs_rev
    # kernel 2: block[a, b] = dSSdA[b, a]·exp(segsum[a, b]), reverse cumsum over a, keep a > b, sum over b
    block = dSSdA.transpose(-1, -2) * exp(segsum)
    block = _cumsum_sequential(block.transpose(-1, -2), reverse=True).transpose(-1, -2)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=dSSdA.device), diagonal=-1)
    block = torch.where(lower, block, torch.zeros((), dtype=_F32, device=dSSdA.device))
    return (total + _sum_sequential(block, dim=-1)).reshape(B, H, S)


def _later_chunks_sum(chunk_sum: torch.Tensor) -> torch.Tensor:
    """``carried[:, :, c] = 0 + sum[:, :, nc-1] + ... + sum[:, :, c+1]``, added from the last chunk down.

    Args:
        chunk_sum (Tensor): ``[B, H, nc, A]``. Returns: ``[B, H, nc, A]``.
    """
    carried = torch.empty_like(chunk_sum)
    acc = torch.zeros_like(chunk_sum[:, :, 0])
    for c in range(chunk_sum.shape[2] - 1, -1, -1):
        carried[:, :, c] = acc
        acc = acc + chunk_sum[:, :, c]
    return carried


def _angle_dt_bwd(dangles, angles, dt, chunk_size: int, *, fma: bool, tanh_fn=torch.tanh,
                  num_warps: Optional[int] = None):
    """``angle_dt_bwd_kernel`` without initial or output state: ``dAngles [B, S, H, A]``, ``dDT_angle [B, H, S]``.

    Reverse cumulative sum of ``dangles`` over the whole sequence, chunk by chunk from the last: within a chunk as
    ``(tl.sum - tl.cumsum) + x`` in the order of the kernel's ``[C, BLOCK_D]`` tile under ``num_warps``
    (:mod:`.._common.triton_tiles`; None: the H200 autotuner's pick), plus the sum of the later chunks; then
    ``((grad · dt) · π) · sech²(angle)`` and ``tl.sum(grad · tanh(angle)·π, axis=1)`` (its products contracted into
    the first adds under ``fma``).
    """
    B, S, H, A = dangles.shape
    C, nc = chunk_size, S // chunk_size
    layout = triton_tiles.angle_dt_layout(C, A, backward=True, num_warps=num_warps)
    # every chunk at once: the operations on an element are the kernel's, only the sum over chunks is sequential
    part = dangles.permute(0, 2, 1, 3).reshape(B, H, nc, C, A).transpose(-1, -2)  # [B, H, nc, A, C]
    chunk_sum = triton_tiles.tile_sum(part, layout)  # [B, H, nc, A]
    rev = (chunk_sum[..., None] - triton_tiles.tile_cumsum(part, layout)) + part
    # carried[c] = Σ of the later chunks' sums, added from the last chunk down (0 + sum[nc-1] + ... + sum[c+1])
    ordered_sums = _ordered_sums(chunk_sum)
    if ordered_sums is not None:  # the same adds in one Triton launch
        carried = ordered_sums.ordered_scan(chunk_sum.movedim(2, 0), reverse=True, exclusive=True).movedim(0, 2)
    else:
        carried = replayed(_later_chunks_sum, chunk_sum)  # one graph replay on CUDA
    grad = rev.transpose(-1, -2) + carried[:, :, :, None, :]  # [B, H, nc, C, A]
    tanh = tanh_fn(angles.permute(0, 2, 1, 3).reshape(B, H, nc, C, A))
    sech2 = fused_first(-tanh, tanh, torch.ones_like(tanh), fma)
    dt_c = dt.reshape(B, H, nc, C, 1)
    grad_angle = (((grad * dt_c) * _PI_F32) * sech2).reshape(B, H, S, A)
    turned = tanh * _PI_F32
    grad_dt = triton_tiles.column_sum(grad * turned, layout, (turned, grad) if fma else None).reshape(B, H, S)
    return grad_angle.permute(0, 2, 1, 3).contiguous(), grad_dt


def mamba3_mimo_epilogue_reference(
    dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
    dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum,
    *, groups: int, chunk_size: int, fma: bool = True, bias_sums_in_lp: bool = True,
    special_functions: str = "accurate", angle_dt_bwd_warps: Optional[int] = None,
) -> Dict[str, Optional[torch.Tensor]]:
    """The chain after stage 2 in FP32, as upstream computes it (module docstring).

    Args:
        dq, dk (Tensor): ``[B, S, R, H, N]`` lp, stage 2 per head.
        dv (Tensor): ``[B, S, H, P]`` lp.
        dmimo_v (Tensor): ``[B, H, R, P]`` fp32 per batch. dD (Tensor | None): ``[B, H]`` fp32 per batch.
        dangles (Tensor): ``[B, S, H, A]`` fp32 (gradient of the cumulative angles).
        dfactor, dgamma_diag, ddA, ddA_cs_rev, ddA_cs (Tensor): ``[B, H, S]`` fp32.
        dSSdA (Tensor): ``[B, H, nc, C, C]`` fp32.
        dmimo_o (Tensor | None): ``[B, H, R, P]`` fp32 per batch (stage 1; reduced output only).
        dz (Tensor | None): ``[B, S, H, P]`` lp, with dmimo_z (Tensor | None): ``[B, H, R, P]`` fp32 (stage 1).
        trap (Tensor): ``[B, H, S]`` lp (the op's ``Trap``). dt (Tensor): ``[B, H, S]`` fp32 (``DT``).
        angles (Tensor): ``[B, S, H, A]`` fp32 (the op's ``Angles``, before the cumulative sum).
        da_cs, da_cs_rev (Tensor): ``[B, H, S]`` fp32; segsum (Tensor): ``[B, H, nc, C, C]`` fp32 (preprocessing).
        groups (int): G (1 or H). chunk_size (int): C, dividing S.
        fma (bool): contract the ``a * b + c`` of the Triton helpers into one rounding (upstream: True).
        bias_sums_in_lp (bool): round ``dQ_bias``/``dK_bias`` to the lp dtype (2.3.2.post1: True).
        special_functions (str): ``"accurate"`` (torch's tanh and exp) or ``"fast_sm90"``: ``tanh_approx`` /
            ``sech2_approx`` through ``tanh.approx.f32`` and ``tl.exp`` through ``ex2.approx`` bit for bit
            (:mod:`mimo_numerics.ops._common.special`), ``tl.sigmoid`` as MUFU.RCP of ``1 + tl.exp(-x)``.
        angle_dt_bwd_warps (int, optional): the ``num_warps`` (2, 4, 8) upstream's autotuner gave
            ``angle_dt_bwd_kernel`` in the process being reproduced; it fixes the order of the kernel's sums and
            scans. None: the H200's pick in the main golden run (``_common.triton_tiles``).

    Returns:
        dict: by :data:`.spec.OUTPUT_NAMES`, dtypes as upstream returns them: ``dQ, dK`` ``[B, S, R, G, N]``,
        ``dV``, ``dZ`` and ``dTrap`` in lp; ``dQ_bias``, ``dK_bias`` ``[H, R, N]`` fp32 (lp values when
        ``bias_sums_in_lp``); ``dMIMO_V``, ``dMIMO_Z``, ``dMIMO_Out`` ``[H, R, P]``, ``dD`` ``[H]``, ``dADT``,
        ``dDT``, ``ddt_core``, ``dDT_angle`` ``[B, H, S]``, ``dAngles`` ``[B, S, H, A]`` fp32. None where a branch
        is off.

    Raises:
        TypeError, ValueError: from :func:`.validation.validate_inputs` (strict dtypes).
    """
    dims = validate_inputs(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
                           dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum, groups=groups,
                           chunk_size=chunk_size, strict_dtypes=True)
    if angle_dt_bwd_warps not in (None,) + triton_tiles.AUTOTUNED_NUM_WARPS:
        raise ValueError(f"angle_dt_bwd_warps must be None or one of the autotuner's "
                         f"{triton_tiles.AUTOTUNED_NUM_WARPS}, got {angle_dt_bwd_warps!r}")
    lp = dims.lp_dtype
    out: Dict[str, Optional[torch.Tensor]] = {}

    def bias_sum(x):  # [B, S, R, H, N] lp -> [H, R, N] fp32
        total = _sum_blocked(x.to(_F32).flatten(0, 1), BIAS_SUM_BLOCK).permute(1, 0, 2)
        return round_to_lp(total, lp) if bias_sums_in_lp else total

    def group_sum(x):  # G == 1: lp sum over heads, else unchanged
        if dims.groups == dims.heads:
            return x.clone()
        return round_to_lp(_sum_sequential(x.to(_F32), dim=3).unsqueeze(3), lp).to(lp)

    def batch_sum(x):
        return None if x is None else _sum_sequential(x, dim=0)

    fns = SpecialFunctions(special_functions)
    ddt_core, dtrap = _dtrap_ddt(trap, dt, dfactor, dgamma_diag, fma=fma, sigmoid=fns.triton_sigmoid)
    d_angles, d_dt_angle = _angle_dt_bwd(dangles, angles, dt, chunk_size, fma=fma, tanh_fn=fns.tanh,
                                         num_warps=angle_dt_bwd_warps)
    out["dQ"], out["dK"], out["dV"] = group_sum(dq), group_sum(dk), dv.clone()
    out["dADT"] = ddA + _dadt(dSSdA, segsum, ddA_cs, ddA_cs_rev, da_cs, da_cs_rev, chunk_size, fns.triton_exp)
    out["dDT"] = ddt_core + d_dt_angle
    out["dTrap"] = round_to_lp(dtrap, lp).to(lp)
    out["dQ_bias"], out["dK_bias"] = bias_sum(dq), bias_sum(dk)
    out["dMIMO_V"], out["dMIMO_Z"], out["dMIMO_Out"] = batch_sum(dmimo_v), batch_sum(dmimo_z), batch_sum(dmimo_o)
    out["dAngles"], out["dD"] = d_angles, batch_sum(dD)
    out["dZ"] = None if dz is None else dz.clone()
    out["ddt_core"], out["dDT_angle"] = ddt_core, d_dt_angle
    return {name: out[name] for name in OUTPUT_NAMES}
