"""Input validation of the FP32 chain after stage 2: errors name the argument and what was expected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...validation import check_int, check_tensor_arguments
from .spec import INPUT_NAMES, OPTIONAL_INPUTS

LOW_PRECISION_DTYPES = (torch.bfloat16, torch.float16)
#: Arguments upstream holds in the low-precision dtype (the dtype of ``dq``).
LP_INPUTS = ("dq", "dk", "dv", "dz", "trap")
_REAL_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class EpilogueDims:
    """Sizes of one validated call.

    Attributes:
        batch, seqlen, rank, heads, groups, state_dim, value_dim, angle_dim (int): B, S, R, H, G, N, P and the
            number of rotary angles per head.
        chunk_size, nchunks (int): C and S / C.
        has_d, reduce_o, has_z (bool): which optional branches are on.
        lp_dtype (torch.dtype): dtype of ``dq``. device (torch.device).
    """

    batch: int
    seqlen: int
    rank: int
    heads: int
    groups: int
    state_dim: int
    value_dim: int
    angle_dim: int
    chunk_size: int
    nchunks: int
    has_d: bool
    reduce_o: bool
    has_z: bool
    lp_dtype: torch.dtype
    device: torch.device


def validate_inputs(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
                    dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum, *, groups, chunk_size,
                    strict_dtypes: bool) -> EpilogueDims:
    """Check the 21 tensors of the epilogue and return their sizes.

    Args:
        dq..segsum: see :mod:`.spec` and the reference's docstring for shapes.
        groups (int): G, the number of q/k groups (``Q.shape[3]``); upstream supports G == 1 and G == H only.
        chunk_size (int): C; upstream's Triton helpers need ``S % C == 0``.
        strict_dtypes (bool): True (the FP32 reference): upstream's dtypes, ``dq, dk, dv, dz, trap`` in one
            bfloat16/float16 dtype and every other tensor float32. False (the FP64 oracle): any real floating
            dtype.

    Raises:
        TypeError: a required tensor is None or not a dense tensor, a wrong dtype, a non-int size.
        ValueError: a shape or device, the pairing of ``dz`` and ``dmimo_z``, 1 < G < H, S % C != 0.
    """
    values = dict(zip(INPUT_NAMES, (dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA,
                                    ddA_cs_rev, ddA_cs, dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev,
                                    segsum)))
    check_tensor_arguments(values, OPTIONAL_INPUTS)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    groups = check_int("groups", groups, 1)
    if dq.dim() != 5:
        raise ValueError(f"dq must have 5 dimensions [B, S, R, H, N], got shape {list(dq.shape)}")
    if dv.dim() != 4:
        raise ValueError(f"dv must have 4 dimensions [B, S, H, P], got shape {list(dv.shape)}")
    if angles.dim() != 4:
        raise ValueError(f"angles must have 4 dimensions [B, S, H, N / rotary_dim_divisor], got shape "
                         f"{list(angles.shape)}")
    batch, seqlen, rank, heads, state_dim = dq.shape
    value_dim, angle_dim = dv.shape[3], angles.shape[3]
    if min(dq.shape) == 0 or value_dim == 0 or angle_dim == 0:
        raise ValueError("dq, dv and angles must have no empty dimension, got shapes "
                         f"{list(dq.shape)}, {list(dv.shape)}, {list(angles.shape)}")
    if heads % groups:
        raise ValueError(f"groups={groups} must divide the H={heads} heads of dq")
    if 1 < groups < heads:
        raise ValueError(f"groups={groups}: upstream's backward supports G == 1 or G == H (H={heads}) only "
                         f"(mamba_mimo_bwd_combined raises 'G value of {groups} is not currently supported!')")
    if seqlen % chunk_size:
        raise ValueError(f"S={seqlen} must be a multiple of chunk_size={chunk_size}: upstream's "
                         "bwd_dadt_fused_triton asserts it (and bwd_dtrap_ddt_triton would skip the tail)")
    if (dz is None) != (dmimo_z is None):
        raise ValueError("dz and dmimo_z must be given together: got dz "
                         f"{'None' if dz is None else 'present'} and dmimo_z "
                         f"{'None' if dmimo_z is None else 'present'}")
    nchunks = seqlen // chunk_size
    lp = dq.dtype
    if strict_dtypes and lp not in LOW_PRECISION_DTYPES:
        raise TypeError(f"dq must have dtype torch.bfloat16 or torch.float16, got {lp}")
    hs = (batch, heads, seqlen)
    hrp = (batch, heads, rank, value_dim)
    expected = {
        "dq": tuple(dq.shape), "dk": tuple(dq.shape), "dv": (batch, seqlen, heads, value_dim), "dmimo_v": hrp,
        "dD": (batch, heads), "dangles": (batch, seqlen, heads, angle_dim), "dfactor": hs, "dgamma_diag": hs,
        "ddA": hs, "dSSdA": (batch, heads, nchunks, chunk_size, chunk_size), "ddA_cs_rev": hs, "ddA_cs": hs,
        "dmimo_o": hrp, "dz": (batch, seqlen, heads, value_dim), "dmimo_z": hrp, "trap": hs, "dt": hs,
        "angles": (batch, seqlen, heads, angle_dim), "da_cs": hs, "da_cs_rev": hs,
        "segsum": (batch, heads, nchunks, chunk_size, chunk_size),
    }
    device = dq.device
    for name, value in values.items():
        if value is None:
            continue
        if tuple(value.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {list(expected[name])}, got {list(value.shape)}")
        want: Optional[torch.dtype] = (lp if name in LP_INPUTS else torch.float32) if strict_dtypes else None
        if want is not None and value.dtype != want:
            raise TypeError(f"{name} must have dtype {want}" + (" (the dtype of dq)" if name in LP_INPUTS else "")
                            + f", got {value.dtype}")
        if want is None and value.dtype not in _REAL_FLOATS:
            raise TypeError(f"{name} must have a real floating dtype, got {value.dtype}")
        if value.device != device:
            raise ValueError(f"{name} must be on device {device} (the device of dq), got {value.device}")
    return EpilogueDims(batch=batch, seqlen=seqlen, rank=rank, heads=heads, groups=groups, state_dim=state_dim,
                        value_dim=value_dim, angle_dim=angle_dim, chunk_size=chunk_size, nchunks=nchunks,
                        has_d=dD is not None, reduce_o=dmimo_o is not None, has_z=dz is not None, lp_dtype=lp,
                        device=device)
