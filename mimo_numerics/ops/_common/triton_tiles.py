"""Triton's ``tl.cumsum`` and ``tl.sum`` along the rows of an FP32 ``[C, BLOCK_D]`` tile, operation for operation.

Upstream's FP32 Triton helpers (``angle_dt_fwd``, ``angle_dt_bwd``) load a ``[C, BLOCK_D]`` tile per chunk (C
tokens, ``BLOCK_D = next_power_of_2(D)`` columns) and scan or sum it over the tokens. The order of those FP32 adds
is fixed by the tile's register layout, which Triton 3.6's coalescing pass picks from ``num_warps`` and the
alignment of the columns (read from the TTGIR and PTX that Triton 3.6.0 compiles for ``sm_90``; no GPU needed):

* ``blocked<sizePerThread = [1, v], threadsPerWarp = [L, 32 / L], warpsPerCTA = [W, 1]>`` with ``v = min(4, C·BLOCK_D
  / (32·W))`` when the column count is a multiple of 16 (Triton's divisibility hint), else ``v = 1``; and
  ``32 / L = min(BLOCK_D / v, 32)``. So one row per thread: ``L`` lanes of a warp and ``W`` warps cover ``L·W``
  rows; a tile of more rows repeats that block ``R = C / (L·W)`` times, the repeats in the same threads.
* ``tl.cumsum`` (Hillis-Steele in the warp, then the warp totals in smem): each block of ``L`` lanes scans with
  ``shfl.up`` by 1, 2, 4, ... lanes, a lane adding the value ``k`` lanes before it; the totals of the ``W·R``
  lane blocks (warps, then repeats) are summed left to right and the running sum of the blocks before is added to
  every element of a block (the first block adds nothing).
* ``tl.sum``: each thread first adds its repeats (``((r_0 + r_1) + r_2) + ...``), then a butterfly over the ``L``
  lanes (``shfl.bfly`` by L/2, L/4, ..., 1 lane), then, through smem, a butterfly over the ``W`` warps' partials
  (W/2, ..., 1), whose result every thread reads back.
* Contraction (``helper_fma="contracted"``): where the scanned or summed term is a product ``a·b`` made in the same
  thread, LLVM fuses it with the first add that consumes it (``fma.rn.f32``): the first Hillis-Steele step
  (``fma(a_own, b_own, x_before)``), the first repeat pair of a sum (``fma(a_r0, b_r0, x_r1)``, then
  ``fma(a_rj, b_rj, acc)``) or, without repeats, the first butterfly step (``fma(a_own, b_own, x_partner)``). Every
  other operand is a rounded FP32 value (shuffled, or an earlier sum).

Which ``num_warps`` the autotuner of a helper picks is a runtime measurement, kept per process (reruns of the golden
cases in other processes gave other bits: ``docs/golden_data.md``); :data:`ANGLE_DT_FWD_NUM_WARPS` holds what the
H200 picked in the stored golden runs (it reproduces their ``angles_cumsum`` bit for bit on every stored case);
other tile shapes use :data:`DEFAULT_NUM_WARPS`, not verified.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

import torch

from ...rounding import fma_fp32
from ...validation import check_int

#: ``num_warps`` the autotuner of ``angle_dt_fwd_kernel`` chose on the H200 (Triton 3.6.0, TileLang 0.1.8 golden
#: runs), by ``(C, BLOCK_D, columns aligned)``; measured by reproducing the golden ``angles_cumsum`` bit for bit
#: (both golden runs picked the same).
ANGLE_DT_FWD_NUM_WARPS: Dict[Tuple[int, int, bool], int] = {
    (8, 16, True): 4, (16, 16, True): 8, (32, 32, True): 4, (64, 16, True): 4, (32, 8, False): 2,
}
#: The same for ``angle_dt_bwd_kernel``, measured by reproducing the golden ``dAngles`` and ``dDT_angle`` bit for bit
#: from upstream's own ``dangles``. Its pick is not stable across processes: the run of
#: ``upstream_h200_full_op_cases.pt`` chose 8 at (16, 16), that of ``..._extra_cases.pt`` 4 (the entry is the first
#: run's; the extra run's other shapes are its picks).
ANGLE_DT_BWD_NUM_WARPS: Dict[Tuple[int, int, bool], int] = {
    (8, 16, True): 4, (16, 16, True): 8, (32, 32, True): 8, (64, 16, True): 2, (32, 8, False): 4,
}
#: ``num_warps`` of tile shapes no golden run measured (the middle of the autotuner's 2, 4, 8; not verified).
DEFAULT_NUM_WARPS = 4
#: The autotuner's choices (``triton.Config(num_warps=w)`` for w in 2, 4, 8 in both helpers).
AUTOTUNED_NUM_WARPS = (2, 4, 8)


class TileLayout(NamedTuple):
    """An fp32 ``[C, block_d]`` tile: its rows over ``lanes`` per warp, ``warps`` and ``repeats`` (``C =
    lanes·warps·repeats``); each thread holds ``columns_per_thread`` consecutive columns."""

    lanes: int
    warps: int
    repeats: int
    columns_per_thread: int = 1
    block_d: int = 1


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_layout(chunk: int, columns: int, num_warps: int) -> TileLayout:
    """The rows' layout of an fp32 ``[chunk, next_power_of_2(columns)]`` tile under ``num_warps`` (module docstring).

    A block of rows taller than the tile (small tiles: Triton then holds some rows in several threads) is modelled
    as the tile's rows on the first lanes and warps, which no golden case verifies.

    Raises:
        ValueError: ``chunk`` not a power of 2, ``columns`` or ``num_warps`` not a positive integer.
    """
    chunk, columns, num_warps = (check_int(name, value, 1) for name, value in
                                 (("chunk", chunk), ("columns", columns), ("num_warps", num_warps)))
    if chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of 2, got {chunk}")
    block_d = _next_power_of_2(columns)
    aligned = columns % 16 == 0
    vec = max(1, min(4, chunk * block_d // (32 * num_warps))) if aligned else 1
    col_lanes = min(max(block_d // vec, 1), 32)
    lanes = min(32 // col_lanes, chunk)
    warps = max(1, min(num_warps, chunk // lanes))
    return TileLayout(lanes, warps, chunk // (lanes * warps), vec, block_d)


def angle_dt_layout(chunk: int, columns: int, backward: bool = False, num_warps: Optional[int] = None
                    ) -> TileLayout:
    """:func:`tile_layout` of ``angle_dt_fwd`` (``angle_dt_bwd`` with ``backward``) under ``num_warps``; None: the
    H200 autotuner's pick (:data:`ANGLE_DT_FWD_NUM_WARPS`, :data:`ANGLE_DT_BWD_NUM_WARPS`) or, for a tile no golden
    run measured, :data:`DEFAULT_NUM_WARPS` (not verified).

    Raises:
        ValueError: ``num_warps`` not one of the autotuner's 2, 4, 8; ``chunk`` not a power of 2.
    """
    if num_warps is not None:
        if num_warps not in AUTOTUNED_NUM_WARPS:
            raise ValueError(f"num_warps must be one of the autotuner's {AUTOTUNED_NUM_WARPS} or None, "
                             f"got {num_warps!r}")
        return tile_layout(chunk, columns, num_warps)
    table = ANGLE_DT_BWD_NUM_WARPS if backward else ANGLE_DT_FWD_NUM_WARPS
    key = (chunk, _next_power_of_2(columns), columns % 16 == 0)
    return tile_layout(chunk, columns, table.get(key, DEFAULT_NUM_WARPS))


def _blocks(x: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """``[..., C]`` -> ``[..., R, W, L]`` (row ``r = (rep·W + warp)·L + lane``)."""
    return x.reshape(*x.shape[:-1], layout.repeats, layout.warps, layout.lanes)


def tile_cumsum(x: torch.Tensor, layout: TileLayout, factors: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                ) -> torch.Tensor:
    """Inclusive ``tl.cumsum`` over the last dim ``[..., C]`` (fp32) in the order of ``layout``.

    ``factors``: ``(a, b)`` with ``x = fl(a·b)`` made in the same thread, which the first Hillis-Steele step
    contracts (``fma(a, b, x_before)``); None: ``x`` is a loaded value (no contraction).
    """
    _check_tile(x, layout)
    lanes = layout.lanes
    flat = TileLayout(lanes, layout.warps * layout.repeats, 1)  # the repeats scan like further warps
    v = _blocks(x, flat)[..., 0, :, :]  # [..., W·R, L]
    acc = v
    if lanes > 1:
        if factors is None:
            first = v[..., 1:] + v[..., :-1]
        else:
            a, b = (_blocks(f.expand_as(x), flat)[..., 0, :, :] for f in factors)
            first = fma_fp32(a[..., 1:], b[..., 1:], v[..., :-1])
        acc = torch.cat([v[..., :1], first], dim=-1)
        step = 2
        while step < lanes:
            acc = torch.cat([acc[..., :step], acc[..., step:] + acc[..., :-step]], dim=-1)
            step *= 2
    totals = acc[..., -1]  # [..., W·R]
    blocks = [acc[..., 0, :]]
    before = None
    for k in range(1, flat.warps):
        before = totals[..., 0] if before is None else before + totals[..., k - 1]
        blocks.append(acc[..., k, :] + before[..., None])
    return torch.stack(blocks, dim=-2).reshape(x.shape)


def _check_tile(x: torch.Tensor, layout: TileLayout) -> None:
    if x.dtype != torch.float32:
        raise TypeError(f"x must be float32, got {x.dtype}")
    rows = layout.lanes * layout.warps * layout.repeats
    if x.dim() < 1 or x.shape[-1] != rows:
        raise ValueError(f"x must be [..., C] with C = {rows} rows of the layout {layout}, got {list(x.shape)}")


def _thread_then_lanes(v: torch.Tensor, ab) -> torch.Tensor:
    """``v [..., lanes, k]``: each lane adds its ``k`` elements in order (with ``ab``, the products ``a·b`` of ``v``
    contracted: ``fma(a_0, b_0, v_1)``, then ``fma(a_j, b_j, acc)``), then a butterfly over the lanes (L/2, ..., 1;
    its first step contracted with ``ab`` when ``k == 1``). Lane 0's sum, ``[...]``."""
    lanes, k = v.shape[-2:]
    lane = torch.arange(lanes, device=v.device)
    mask = lanes // 2
    if k > 1:
        acc = v[..., 0] + v[..., 1] if ab is None else fma_fp32(ab[0][..., 0], ab[1][..., 0], v[..., 1])
        for j in range(2, k):
            acc = acc + v[..., j] if ab is None else fma_fp32(ab[0][..., j], ab[1][..., j], acc)
    elif ab is not None and mask >= 1:
        acc = fma_fp32(ab[0][..., 0], ab[1][..., 0], v[..., lane ^ mask, 0])
        mask //= 2
    else:
        acc = v[..., 0]
    while mask >= 1:
        acc = acc + acc[..., lane ^ mask]
        mask //= 2
    return acc[..., 0]


def tile_sum(x: torch.Tensor, layout: TileLayout, factors: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
             ) -> torch.Tensor:
    """``tl.sum`` over the last dim ``[..., C]`` (fp32) in the order of ``layout``: ``[...]``.

    ``factors`` as in :func:`tile_cumsum` (contracted into the first add of a thread's repeats, or into the first
    butterfly step without repeats).
    """
    _check_tile(x, layout)

    def per_thread(t):  # [..., C] -> [..., W, L, R]: a thread's repeats last
        return _blocks(t.expand_as(x), layout).movedim(-3, -1)

    ab = None if factors is None else tuple(per_thread(f) for f in factors)
    partial = _thread_then_lanes(per_thread(x), ab)  # [..., W]: lane 0 of each warp
    return _thread_then_lanes(partial[..., None], None)  # the warps' partials, through smem


def column_sum(x: torch.Tensor, layout: TileLayout,
               factors: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """``tl.sum(axis=1)`` over the last dim ``[..., D]`` (``D <= layout.block_d``; the masked columns up to
    ``block_d`` load as 0) of a tile whose threads hold ``layout.columns_per_thread`` consecutive columns across
    ``block_d / columns_per_thread`` lanes: ``[...]``.

    A thread adds its columns left to right (with ``factors``, ``fma(a_0, b_0, x_1)``, then ``fma(a_j, b_j, acc)``),
    then a butterfly over the lanes (the first step contracted with ``factors`` when a thread holds one column).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"x must be float32, got {x.dtype}")
    pad = layout.block_d - x.shape[-1]
    if pad < 0:
        raise ValueError(f"x has {x.shape[-1]} columns, more than the tile's {layout.block_d}")

    def per_thread(t):  # [..., D] -> [..., lanes, v], the masked columns as 0
        t = t.expand_as(x)
        t = torch.nn.functional.pad(t, (0, pad)) if pad else t
        return t.reshape(*x.shape[:-1], layout.block_d // layout.columns_per_thread, layout.columns_per_thread)

    return _thread_then_lanes(per_thread(x), None if factors is None else tuple(per_thread(f) for f in factors))
