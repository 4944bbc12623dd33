"""Upstream's ``mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils``: ``compute_dacs_segsum_triton`` and its varlen
form (``mimo_numerics.compat``)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from mimo_numerics.ops.mamba3_mimo import varlen
from mimo_numerics.ops.mamba3_mimo.preprocess import dacs_segsum


def compute_dacs_segsum_triton(da: Tensor, chunk_size: int) -> Tuple[Tensor, Tensor, Tensor]:
    """``(da_cs [B, H, S], da_cs_rev [B, H, S], segsum [B, H, nc, C, C])`` of ``da [B, H, S]`` (float32), in
    upstream's FP32 scan order (``mimo_numerics.ops.mamba3_mimo.preprocess.dacs_segsum``); a float64 ``da`` gives
    the float64 definitions."""
    math_dtype = torch.float64 if da.dtype == torch.float64 else torch.float32
    return dacs_segsum(da, chunk_size, math_dtype=math_dtype)


def compute_dacs_segsum_triton_varlen(da: Tensor, chunk_size: int, cu_seqlens: Optional[Tensor] = None
                                      ) -> Tuple[Tensor, Tensor, Tensor]:
    """Upstream's varlen form: each sequence of ``cu_seqlens`` on its own chunks (``dacs_segsum`` of the
    sequence), ``segsum`` in upstream's global chunk layout ``[B, H, S // C + NS, C, C]`` (sequence i's chunk j at
    ``start_i // C + i + j``; slots no sequence uses are 0). ``cu_seqlens`` None: :func:`compute_dacs_segsum_triton`.
    """
    if cu_seqlens is None:
        return compute_dacs_segsum_triton(da, chunk_size)
    bounds = varlen.sequence_bounds(cu_seqlens, da.shape[0], da.shape[-1])
    math_dtype = torch.float64 if da.dtype == torch.float64 else torch.float32
    B, H, S = da.shape
    da_cs, da_cs_rev = torch.empty_like(da, dtype=math_dtype), torch.empty_like(da, dtype=math_dtype)
    segsum = torch.zeros((B, H, S // chunk_size + len(bounds), chunk_size, chunk_size), dtype=math_dtype,
                         device=da.device)
    for (a, b), slots in zip(bounds, varlen.chunk_slots(bounds, chunk_size)):
        cs, cs_rev, seg = dacs_segsum(da[..., a:b], chunk_size, math_dtype=math_dtype)
        da_cs[..., a:b], da_cs_rev[..., a:b] = cs, cs_rev
        segsum[:, :, slots] = seg
    return da_cs, da_cs_rev, segsum
