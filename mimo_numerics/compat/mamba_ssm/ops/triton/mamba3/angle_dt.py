"""Upstream's ``mamba_ssm.ops.triton.mamba3.angle_dt``: ``angle_dt_fwd`` (``mimo_numerics.compat``)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from mimo_numerics.ops.mamba3_mimo.preprocess import angle_cumsum


def angle_dt_fwd(angle: Tensor, dt: Tensor, init_state: Optional[Tensor] = None, chunk_size: int = 64,
                 return_output_state: bool = False, cu_seqlens: Optional[Tensor] = None):
    """The cumulative angles ``(Σ π·tanh(angle)·dt) mod 2π`` of ``angle [B, S, H, K]`` and ``dt [B, H, S]`` in
    upstream's FP32 order (``preprocess.angle_cumsum``: Triton's scan order, the products contracted; torch's tanh,
    not ``tanh.approx.f32``); with
    ``return_output_state`` also the walk's state after the last chunk ``[B, H, K]``. ``init_state`` and
    ``cu_seqlens`` (varlen) raise ``NotImplementedError``."""
    if init_state is not None:
        raise NotImplementedError("init_state (an angle walk continued from a given state) is not implemented by "
                                  "mimo_numerics.compat")
    if cu_seqlens is not None:
        raise NotImplementedError("cu_seqlens (varlen) is not implemented by mimo_numerics.compat")
    math_dtype = torch.float64 if angle.dtype == torch.float64 else torch.float32
    return angle_cumsum(angle, dt, chunk_size, math_dtype=math_dtype, return_final_state=return_output_state)
