"""Upstream's ``mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils``: ``compute_dacs_segsum_triton``
(``mimo_numerics.compat``)."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from mimo_numerics.ops.mamba3_mimo.preprocess import dacs_segsum


def compute_dacs_segsum_triton(da: Tensor, chunk_size: int) -> Tuple[Tensor, Tensor, Tensor]:
    """``(da_cs [B, H, S], da_cs_rev [B, H, S], segsum [B, H, nc, C, C])`` of ``da [B, H, S]`` (float32), in
    upstream's FP32 scan order (``mimo_numerics.ops.mamba3_mimo.preprocess.dacs_segsum``); a float64 ``da`` gives
    the float64 definitions."""
    math_dtype = torch.float64 if da.dtype == torch.float64 else torch.float32
    return dacs_segsum(da, chunk_size, math_dtype=math_dtype)
