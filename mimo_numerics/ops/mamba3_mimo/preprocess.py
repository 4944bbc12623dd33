"""Upstream's preprocessing of the Mamba-3 MIMO op, in torch, on any device.

``mamba3_mimo`` (mamba-ssm 2.3.2.post1, ``ops/tilelang/mamba3/mamba3_mimo.py`` L71-76 and L93) runs two FP32
Triton kernels before the forward kernel. Line numbers below are of that sdist.

**Cumulative angles** (``angle_dt_fwd``, ``ops/triton/mamba3/angle_dt.py`` L24-122). One program per (head, batch)
walks the chunks of the sequence carrying a state, so the sum runs over the whole sequence, not per chunk::

    θ[b, t, h, a] = ( Σ_{u <= t} tanh(angles[b, u, h, a]) · π · dt[b, h, u] )  mod 2π        [B, S, H, K]

with ``K = N / rotary_dim_divisor``. In FP32 upstream evaluates, per chunk of ``C`` tokens (L86-117):
``vals = fl(fl(tanh_approx(angle) · π₃₂) · dt)`` (L94, L101; ``π₃₂`` = fp32(π)); ``out = chunk_cumsum(vals) +
state`` (L104-105); ``out = out - 2π₃₂ · floor(out / 2π₃₂)`` (L108); ``state = state + tl.sum(vals)`` then the
same mod (L115-117). Out-of-range rows load as 0 (L93, L98).

**Chunk log-decays** (``compute_dacs_segsum_triton``, ``ops/triton/mamba3/mamba3_mimo_utils.py`` L444-513,
L691-731). One program per (batch, head, chunk); with ``x = adt`` of the chunk (rows past ``S`` masked to 0, L484)::

    da_cs[t]       = min(0, Σ_{chunk start <= u <= t} x_u)                 inclusive cumsum, L486-487
    da_cs_rev[t]   = min(0, Σ_{t < u <= chunk end} x_u)                    reverse inclusive cumsum rolled one
                                                                           to the left (L489-495; 0 at the
                                                                           chunk's last row)
    segsum[c, i, j] = min(0, Σ_{j < u <= i} x_u)   (0 for i <= j)          cumsum over i of where(i > j, x_i, 0),
                                                                           L503-508

``segsum`` is built from an **unmasked** load (L503): on a tail chunk its rows ``i >= S - c·C`` read whatever
memory follows the row of ``adt`` (the next (b, h) row, or past the allocation for the last one). Those rows only
feed outputs of padded tokens, which no kernel stores; here they are computed from zero padding instead (so a row
past ``S`` repeats the last valid row), and ``da_cs``/``da_cs_rev`` exist for the ``S`` real tokens only.

Upstream does not use the ``chunk_sum - cumsum + x`` form in these forward kernels (it uses it in the backward,
``angle_dt.py`` L310-312); the clamp ``min(·, 0)`` is applied to each of the three outputs, and upstream's backward
differentiates as if it were absent (``docs/fp64_model.md``).

**FP32 (``math_dtype=torch.float32``): what is reproduced to the bit.** Triton's ``tl.cumsum`` is a
Hillis-Steele scan across the lanes that hold the scanned axis, after a sequential scan of the elements each thread
holds (``_triton_scan``). Measured against the golden H200 data (``upstream_h200_full_op_cases.pt``, Triton of
torch 2.11): every element of ``da_cs``, ``da_cs_rev`` and ``segsum`` of the 12 short cases (C = 8, 16, 32, 64)
and the sampled S = 2048 and 8192 cases is bit-equal with the layouts of :data:`SCAN_LAYOUTS_1D` and
:data:`SEGSUM_LAYOUTS`, read from the TTGIR of ``dacs_segsum_kernel`` (1-D scans: one element per lane, 32 lanes a
warp, two warps at C = 64; ``segsum``'s [C, C] scan: 4 lanes x 2 warps at C = 8, 1 x 16 lanes or, under 4 warps,
2 elements per thread x 8 lanes at C = 16, 4 x 8 at C = 32, 4 x 16 at C = 64). The kernel is autotuned over
``num_warps``; the pick, kept per process, changes ``segsum`` at C = 16 (``segsum_num_warps``: the main golden run
picked 8, the extra run's fp16 case and the long reduced cases 4). Other chunk sizes are **not verified**. For the
angles, ``tanh_approx`` is the hardware ``tanh.approx.f32`` (MUFU.TANH: on the golden inputs median 35, up to 118
fp32 ulps from torch's tanh; ``measure.tanh_ulp_offsets_at_first_token``).
``tanh="upstream"`` computes it bit for bit (:mod:`mimo_numerics.mufu`'s table model, proven on all 2^32 inputs on
the H200; the whole op uses it under ``special_functions="fast_sm90"``), ``tanh="accurate"`` is torch's tanh. The
chunk's ``tl.cumsum`` and ``tl.sum`` follow the ``[C, BLOCK_D]`` tile's register layout under the ``num_warps`` the
H200's autotuner picked, with the product ``fl(tanh·π₃₂)·dt`` contracted into the first add that consumes it
(``fma=True``, the policy's ``helper_fma="contracted"``; :mod:`.._common.triton_tiles`, read from the PTX Triton
3.6 emits): with ``tanh="upstream"`` every ``angles_cumsum`` of the 11 golden whole-op cases and of the sampled
S = 2048 and 8192 cases is bit-identical to the H200's. The mod with ``2π₃₂`` rounds ``out - 2π₃₂·k`` once (an
FMA); the exact division ``out / 2π₃₂`` stands for Triton's ``div.full.f32`` (they differ only within 2 ulp of a
multiple of 2π, which no golden case reached).

**FP64 (``math_dtype=torch.float64``).** The same definitions evaluated in float64 (``torch.cumsum`` order) with
the true 2π in the mod. Upstream's mod by ``2π₃₂ = 2π + 1.75e-7`` makes its angle ``k · 1.75e-7`` smaller than
the exact one after ``k`` wraps; that is an FP32 effect of upstream, modelled by the fp32 form only.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple, Union

import torch

from ...validation import check_int
from .._common.cuda_graph import replayed
from .._common import triton_tiles
from .._common.special import SpecialFunctions

#: ``tanh`` forms of :func:`angle_cumsum`.
TANH_FORMS = ("accurate", "upstream")
#: ``(elements per thread, lanes, warps)`` of Triton's scans in ``dacs_segsum_kernel``, read from the TTGIR Triton
#: 3.6.0 compiles for sm_90 (on a CPU) and bit-identical to the H200's outputs on every golden case. The 1-D scans
#: (``da_cs``, ``da_cs_rev``) hold one element per thread on 32 lanes a warp (C <= 32: one warp; C = 64: two), by C.
#: ``segsum``'s ``[C, C]`` scan along its rows, by ``(C, num_warps)``: the kernel is autotuned over ``num_warps``
#: in {4, 8}, which changes the layout at C = 16 only.
SCAN_LAYOUTS_1D: Dict[int, Tuple[int, int, int]] = {8: (1, 8, 1), 16: (1, 16, 1), 32: (1, 32, 1), 64: (1, 32, 2)}
SEGSUM_LAYOUTS: Dict[Tuple[int, int], Tuple[int, int, int]] = {
    (8, 4): (1, 4, 2), (8, 8): (1, 4, 2), (16, 4): (2, 8, 1), (16, 8): (1, 16, 1),
    (32, 4): (4, 8, 1), (32, 8): (4, 8, 1), (64, 4): (4, 16, 1), (64, 8): (4, 16, 1),
}
#: ``dacs_segsum_kernel``'s autotuner choices, and the pick of the main golden run (``upstream_h200_full_op_cases.pt``,
#: all at C = 16). The pick is kept per process: the extra run's fp16 case and the long reduced cases got 4.
SEGSUM_AUTOTUNED_NUM_WARPS = (4, 8)
SEGSUM_DEFAULT_NUM_WARPS = 8

_PI_F32 = torch.tensor(math.pi, dtype=torch.float32).item()  # fp32(π) as a Python float (exact)
_TWO_PI_F32 = 2.0 * _PI_F32  # = fp32(2π): doubling is exact

DtypeLike = Union[torch.dtype, str]


def _resolve_math_dtype(math_dtype: DtypeLike) -> torch.dtype:
    named = {"float32": torch.float32, "float64": torch.float64}
    if isinstance(math_dtype, str) and math_dtype in named:
        return named[math_dtype]
    if math_dtype in (torch.float32, torch.float64):
        return math_dtype
    raise ValueError(f"math_dtype must be torch.float32 or torch.float64 (or 'float32'/'float64'), got {math_dtype!r}")


def _check_float_tensor(name: str, x, ndim: int, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must have dtype torch.float32 (upstream) or torch.float64, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {layout}, got shape {list(x.shape)}")
    if any(size == 0 for size in x.shape):
        raise ValueError(f"{name} has an empty dimension (shape {list(x.shape)}); every dimension must be >= 1")


def _check_chunk_size(chunk_size, math_dtype: torch.dtype) -> int:
    chunk_size = check_int("chunk_size", chunk_size, 1)
    if math_dtype == torch.float32 and chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of 2 for the float32 form (Triton's tl.arange), got {chunk_size}")
    return chunk_size


def check_preprocess_inputs(adt, angles, dt, chunk_size) -> int:
    """The checks of :func:`angle_cumsum` and :func:`dacs_segsum` (float32 form) on the three inputs together, and
    that they share one device: ``chunk_size`` as an int.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    _check_float_tensor("adt", adt, 3, "[B, H, S]")
    _check_float_tensor("angles", angles, 4, "[B, S, H, K]")
    _check_float_tensor("dt", dt, 3, "[B, H, S]")
    chunk_size = _check_chunk_size(chunk_size, torch.float32)
    B, S, H, _ = angles.shape
    for name, x in (("dt", dt), ("adt", adt)):
        if tuple(x.shape) != (B, H, S):
            raise ValueError(f"{name} must have shape {[B, H, S]} ([B, H, S] of angles [B, S, H, K]), got "
                             f"{list(x.shape)}")
        if x.device != angles.device:
            raise ValueError(f"{name} must be on device {angles.device} (the device of angles), got {x.device}")
    return chunk_size


def _layout_1d(chunk_size: int) -> Tuple[int, int, int]:
    """Measured sizes from :data:`SCAN_LAYOUTS_1D`; others one element per thread, 32 lanes a warp (not verified)."""
    return SCAN_LAYOUTS_1D.get(chunk_size, (1, min(chunk_size, 32), max(1, chunk_size // 32)))


def _segsum_layout(chunk_size: int, num_warps: Optional[int]) -> Tuple[int, int, int]:
    if num_warps is None:
        num_warps = SEGSUM_DEFAULT_NUM_WARPS
    if num_warps not in SEGSUM_AUTOTUNED_NUM_WARPS:
        raise ValueError(f"segsum_num_warps must be one of the autotuner's {SEGSUM_AUTOTUNED_NUM_WARPS} or None, "
                         f"got {num_warps!r}")
    return SEGSUM_LAYOUTS.get((chunk_size, num_warps), _layout_1d(chunk_size))


def _scan(x: torch.Tensor, layout: Tuple[int, int, int], reverse: bool = False) -> torch.Tensor:
    """``tl.cumsum`` along the last dim in ``layout``'s order: in one warp :func:`_triton_scan`; across warps (one
    element per thread) ``triton_tiles.tile_cumsum``, each warp's block offset by the totals of the blocks before."""
    per_thread, lanes, warps = layout
    if warps == 1:
        return _triton_scan(x, per_thread, lanes, reverse=reverse)
    if per_thread != 1 or x.shape[-1] != lanes * warps:
        raise ValueError(f"scan layout {layout} does not cover an axis of {x.shape[-1]}")
    tiles = triton_tiles.TileLayout(lanes, warps, 1)
    if reverse:
        return triton_tiles.tile_cumsum(x.flip(-1), tiles).flip(-1)
    return triton_tiles.tile_cumsum(x, tiles)


def _triton_scan(x: torch.Tensor, per_thread: int, lanes: int, reverse: bool = False) -> torch.Tensor:
    """Inclusive prefix sum along the last dim in the order of Triton's ``tl.cumsum`` (one warp, one block).

    Each of ``lanes`` threads holds ``per_thread`` consecutive elements: a sequential scan inside the thread, a
    Hillis-Steele scan of the threads' last elements across lanes (``acc[l] += acc[l - d]`` for d = 1, 2, 4, ...),
    then every other element adds the inclusive value of the lane before it. ``reverse`` scans from the end (the
    mirror image; verified for one element per lane only).

    Args:
        x (Tensor): ``[..., L]`` with ``L = per_thread · lanes``; every addition is done in ``x.dtype``.
    """
    if reverse:
        return _triton_scan(x.flip(-1), per_thread, lanes).flip(-1)
    if x.shape[-1] != per_thread * lanes:
        raise ValueError(f"scan layout {per_thread} x {lanes} does not cover an axis of {x.shape[-1]}")
    v = x.reshape(*x.shape[:-1], lanes, per_thread)
    partial = [v[..., 0]]
    for e in range(1, per_thread):
        partial.append(partial[-1] + v[..., e])
    last = partial[-1]  # [..., lanes]
    step = 1
    while step < lanes:
        last = torch.cat([last[..., :step], last[..., :-step] + last[..., step:]], dim=-1)
        step *= 2
    columns = []
    previous = torch.cat([torch.zeros_like(last[..., :1]), last[..., :-1]], dim=-1)  # lane l-1's inclusive value
    for e in range(per_thread - 1):
        # lane 0 has nothing before it: its partial stays as it is (adding 0 is exact but keeps -0, as upstream)
        rest = previous[..., 1:] + partial[e][..., 1:]
        columns.append(torch.cat([partial[e][..., :1], rest], dim=-1))
    columns.append(last)
    return torch.stack(columns, dim=-1).reshape(x.shape)


def _mod_two_pi_f32(x: torch.Tensor) -> torch.Tensor:
    """``x - 2π₃₂ · floor(x / 2π₃₂)`` in float32, the product and difference rounded once (an FMA).

    The quotient is an IEEE float32 division on every device. The exact ``x - 2π₃₂·k`` is formed in float64
    (24-bit times small-integer product, exact there) and rounded once to float32, so this form needs a device with
    float64 (CPU, CUDA).
    """
    # a divisor tensor on x's device: torch's CUDA division by a Python scalar multiplies by its reciprocal instead;
    # filled on the device (no host copy), so the walk can be captured into a CUDA graph
    turns = torch.floor(x / torch.full((), _TWO_PI_F32, dtype=x.dtype, device=x.device))
    return (x.double() - _TWO_PI_F32 * turns.double()).float()


def _angle_chunk_walk(sums: torch.Tensor) -> torch.Tensor:
    """The angle state entering each chunk: 0, then ``state = (state + sums[:, c]) mod 2π`` chunk after chunk.

    Args:
        sums (Tensor): ``[B, nc, H, K]`` float32, each chunk's sum. Returns: ``[B, nc, H, K]``.
    """
    entering = torch.empty_like(sums)
    state = torch.zeros_like(sums[:, 0])
    for c in range(sums.shape[1]):
        entering[:, c] = state
        state = _mod_two_pi_f32(state + sums[:, c])
    return entering


def _entering_angles(sums: torch.Tensor) -> torch.Tensor:
    """:func:`_angle_chunk_walk` of ``sums [B, nc, H, K]``: one Triton launch on CUDA (``kernels/ordered_sums.py``,
    the same operations), else one CUDA graph replay (or the loop on the CPU)."""
    if sums.is_cuda:
        try:
            from ... import kernels
            from ...kernels import ordered_sums
        except ImportError:
            kernels = None
        if kernels is not None and kernels.triton_available():
            return ordered_sums.angle_state_walk(sums.movedim(1, 0)).movedim(0, 1)
    return replayed(_angle_chunk_walk, sums)


def angle_cumsum(angles: torch.Tensor, dt: torch.Tensor, chunk_size: int, *, math_dtype: DtypeLike,
                 tanh: str = "accurate", fma: bool = True, num_warps: Optional[int] = None,
                 return_final_state: bool = False):
    """Cumulative rotary angles of ``angle_dt_fwd``: ``(Σ_{u <= t} π·tanh(angles_u)·dt_u) mod 2π``.

    Args:
        angles (Tensor): ``[B, S, H, K]`` raw angles (upstream: float32), ``K = N / rotary_dim_divisor``.
        dt (Tensor): ``[B, H, S]`` (upstream: float32).
        chunk_size (int): C, the chunk of upstream's walk (float32 form: a power of 2; the float64 result does not
            depend on it beyond validation).
        math_dtype (torch.dtype | str): ``torch.float32`` for upstream's FP32 evaluation order (module docstring:
            module docstring), ``torch.float64`` for the definition in float64.
        tanh (str): ``"accurate"``: torch's tanh in the math dtype; ``"upstream"``: ``tanh.approx.f32`` bit for bit
            (float32 math only).
        fma (bool): float32 form: the product ``fl(tanh·π₃₂)·dt`` contracted into the first add of the scan and
            of the chunk sum that consumes it, as Triton compiles them (the policy's ``helper_fma="contracted"``);
            False: every product rounded first.
        num_warps (int, optional): float32 form: the ``num_warps`` of upstream's autotuned kernel (2, 4 or 8), which
            fixes the order of its scan and sum (``_common.triton_tiles``); None: the H200's pick.
        return_final_state (bool): also return the walk's state after the last chunk, ``[B, H, K]`` (upstream's
            ``return_output_state=True``: in float32 ``(state + Σ chunk) mod 2π₃₂`` after the last chunk, so not
            the last token's cumulative angle bit for bit; in float64 the total mod 2π).

    Returns:
        Tensor: ``[B, S, H, K]`` in the math dtype, in ``[0, 2π)``, on the input device; with
        ``return_final_state`` a pair ``(cumulative angles, final state [B, H, K])``.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    math_dtype = _resolve_math_dtype(math_dtype)
    if tanh not in TANH_FORMS:
        raise ValueError(f"tanh must be one of {TANH_FORMS}, got {tanh!r}")
    if tanh == "upstream" and math_dtype != torch.float32:
        raise ValueError(f"tanh='upstream' (tanh.approx.f32) needs math_dtype=torch.float32, got {math_dtype}")
    _check_float_tensor("angles", angles, 4, "[B, S, H, K]")
    _check_float_tensor("dt", dt, 3, "[B, H, S]")
    chunk_size = _check_chunk_size(chunk_size, math_dtype)
    B, S, H, K = angles.shape
    if tuple(dt.shape) != (B, H, S):
        raise ValueError(f"dt must have shape {[B, H, S]} ([B, H, S] of angles [B, S, H, K]), got {list(dt.shape)}")
    if dt.device != angles.device:
        raise ValueError(f"dt must be on device {angles.device} (the device of angles), got {dt.device}")

    if math_dtype == torch.float64:
        angles64 = angles.to(torch.float64)
        increments = math.pi * torch.tanh(angles64) * dt.to(torch.float64).permute(0, 2, 1)[..., None]
        cumsum = torch.remainder(torch.cumsum(increments, dim=1), 2.0 * math.pi)
        return (cumsum, cumsum[:, -1].clone()) if return_final_state else cumsum

    fns = SpecialFunctions("fast_sm90" if tanh == "upstream" else "accurate")
    nc = -(-S // chunk_size)

    def per_chunk(x):  # [B, S, H, K or 1] -> [B, nc, H, K, C] (rows past S zero, as upstream's masked loads)
        padded = torch.zeros((B, nc * chunk_size, H, K), dtype=torch.float32, device=angles.device)
        padded[:, :S] = x
        return padded.reshape(B, nc, chunk_size, H, K).permute(0, 1, 3, 4, 2)  # scan axis last

    turned = per_chunk(fns.tanh(angles.to(torch.float32)) * _PI_F32)
    steps = per_chunk(dt.to(torch.float32).permute(0, 2, 1)[..., None])
    chunks = turned * steps
    layout = triton_tiles.angle_dt_layout(chunk_size, K, num_warps=num_warps)
    factors = (turned, steps) if fma else None
    # every chunk's scan and sum at once (the same operations per element); only the state walks chunk by chunk
    scans = triton_tiles.tile_cumsum(chunks, layout, factors)  # [B, nc, H, K, C]
    sums = triton_tiles.tile_sum(chunks, layout, factors)  # [B, nc, H, K]
    entering = _entering_angles(sums)
    out = _mod_two_pi_f32(scans + entering[..., None])
    out = out.permute(0, 1, 4, 2, 3).reshape(B, nc * chunk_size, H, K)[:, :S].contiguous()
    if return_final_state:  # the walk's next step after the last chunk (padded rows added 0)
        return out, _mod_two_pi_f32(entering[:, -1] + sums[:, -1])
    return out


def dacs_segsum(adt: torch.Tensor, chunk_size: int, *, math_dtype: DtypeLike, segsum_num_warps: Optional[int] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``da_cs``, ``da_cs_rev`` and ``segsum`` of ``compute_dacs_segsum_triton``, each clamped to ``<= 0``.

    Args:
        adt (Tensor): ``[B, H, S]`` A·dt (upstream: float32).
        chunk_size (int): C (float32 form: a power of 2).
        math_dtype (torch.dtype | str): ``torch.float32``: upstream's Triton scan orders, bit-exact where
            :data:`SCAN_LAYOUTS_1D` and :data:`SEGSUM_LAYOUTS` are measured (C = 8 to 64); ``torch.float64``: the
            definitions in float64.
        segsum_num_warps (int, optional): float32 form: the ``num_warps`` (4 or 8) upstream's autotuner gave
            ``dacs_segsum_kernel`` in the run being modelled (it changes ``segsum``'s order at C = 16); None:
            :data:`SEGSUM_DEFAULT_NUM_WARPS`.

    Returns:
        tuple: ``da_cs [B, H, S]``, ``da_cs_rev [B, H, S]``, ``segsum [B, H, nc, C, C]`` (``segsum[..., i, j]`` is
        the log-decay from row j to row i of the chunk, 0 for ``i <= j``; rows past ``S`` from zero padding), in
        the math dtype on the input device.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    math_dtype = _resolve_math_dtype(math_dtype)
    _check_float_tensor("adt", adt, 3, "[B, H, S]")
    chunk_size = _check_chunk_size(chunk_size, math_dtype)
    B, H, S = adt.shape
    C, nc = chunk_size, -(-S // chunk_size)
    x = torch.zeros((B, H, nc * C), dtype=math_dtype, device=adt.device)
    x[..., :S] = adt.to(math_dtype)
    x = x.reshape(B, H, nc, C)
    strictly_below = torch.arange(C, device=adt.device)[:, None] > torch.arange(C, device=adt.device)[None, :]
    masked = torch.where(strictly_below, x[..., :, None], torch.zeros((), dtype=math_dtype, device=adt.device))

    if math_dtype == torch.float64:
        inclusive = torch.cumsum(x, dim=-1)
        reverse = torch.cumsum(x.flip(-1), dim=-1).flip(-1)
        segsum = torch.cumsum(masked, dim=-2)
    else:
        inclusive = _scan(x, _layout_1d(C))
        reverse = _scan(x, _layout_1d(C), reverse=True)
        segsum = _scan(masked.transpose(-1, -2), _segsum_layout(C, segsum_num_warps)).transpose(-1, -2)
    exclusive_reverse = torch.cat([reverse[..., 1:], torch.zeros_like(reverse[..., :1])], dim=-1)
    da_cs = torch.clamp(inclusive, max=0).reshape(B, H, nc * C)[..., :S]
    da_cs_rev = torch.clamp(exclusive_reverse, max=0).reshape(B, H, nc * C)[..., :S]
    return da_cs.contiguous(), da_cs_rev.contiguous(), torch.clamp(segsum, max=0).contiguous()
