"""Input validation of backward stage 1, ``mamba_mimo_bwd_fwd``: the one place its implementations check their arguments.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size) with a message that names the argument and says what was expected. The checks every
operator shares come from :mod:`mimo_numerics.validation`.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...validation import (DEFAULT_CHUNK_SIZE, Dims, check_lp_dtype, check_sizes, check_tensor,
                           check_tensor_arguments)
from .outputs import INPUT_NAMES, OPTIONAL_INPUTS

#: The inputs in the low-precision dtype (the policy's ``lp_dtype``); every other tensor is float32.
LP_INPUTS = ("dout", "q", "k", "v", "z", "trap")


def check_segsum_chunk(segsum: torch.Tensor, chunk_size: int) -> None:
    """Name ``chunk_size`` (and its default) when segsum ``[B, H, nchunks, C, C]`` was made with another C."""
    if segsum.dim() != 5 or segsum.shape[-1] != segsum.shape[-2] or segsum.shape[-1] == chunk_size:
        return
    found = segsum.shape[-1]
    default = " (the default when chunk_size is not passed)" if chunk_size == DEFAULT_CHUNK_SIZE else ""
    raise ValueError(f"segsum has chunk size {found} (shape {list(segsum.shape)} = [B, H, nchunks, C, C]) but "
                     f"chunk_size={chunk_size}{default}: pass chunk_size={found}, or a segsum made with chunk size "
                     f"{chunk_size}")


def validate_inputs(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size, rotary_dim_divisor, *, lp_dtype: Optional[torch.dtype] = None,
) -> Dims:
    """Check the 17 tensors and two sizes of ``mamba_mimo_bwd_fwd`` and return their dimensions.

    Args:
        dout..segsum: the tensors of the API, see ``docs/semantics.md`` for shapes and dtypes.
        chunk_size (int): C >= 1. rotary_dim_divisor (int): 2 or 4, dividing N.
        lp_dtype (torch.dtype, optional): when given (a policy's ``lp_dtype``), the low-precision inputs must have it.

    Returns:
        Dims: the validated sizes and branch flags.
    """
    values = dict(zip(INPUT_NAMES, (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs,
                                    da_cs_rev, dt, trap, d, segsum)))
    check_tensor_arguments(values, OPTIONAL_INPUTS)
    sizes = check_sizes(q, v, chunk_size, rotary_dim_divisor)
    batch, seqlen, rank, groups, state_dim = sizes.batch, sizes.seqlen, sizes.rank, sizes.groups, sizes.state_dim
    heads, value_dim = sizes.heads, sizes.value_dim
    chunk_size, rotary_dim_divisor = sizes.chunk_size, sizes.rotary_dim_divisor

    device = q.device
    lp = check_lp_dtype(q, lp_dtype)
    nchunks = sizes.nchunks
    reduce_o = mimo_o is not None
    has_z = z is not None
    if has_z != (mimo_z is not None):
        raise ValueError("z and mimo_z must be given together: got z "
                         f"{'present' if has_z else 'None'} and mimo_z {'None' if has_z else 'present'}")

    bshp = (batch, seqlen, heads, value_dim)
    check_tensor("dout", dout, bshp if reduce_o else (batch, seqlen, rank, heads, value_dim), lp, device)
    check_tensor("k", k, tuple(q.shape), lp, device)
    check_tensor("v", v, bshp, lp, device)
    check_tensor("trap", trap, (batch, heads, seqlen), lp, device)
    for name in ("q_bias", "k_bias"):
        check_tensor(name, values[name], (heads, rank, state_dim), torch.float32, device)
    check_tensor("mimo_v", mimo_v, (heads, rank, value_dim), torch.float32, device)
    check_tensor("angles", angles, (batch, seqlen, heads, state_dim // rotary_dim_divisor), torch.float32, device)
    for name in ("da_cs", "da_cs_rev", "dt"):
        check_tensor(name, values[name], (batch, heads, seqlen), torch.float32, device)
    check_segsum_chunk(segsum, chunk_size)
    check_tensor("segsum", segsum, (batch, heads, nchunks, chunk_size, chunk_size), torch.float32, device)
    if reduce_o:
        check_tensor("mimo_o", mimo_o, (heads, rank, value_dim), torch.float32, device)
    if has_z:
        check_tensor("z", z, bshp, lp, device)
        check_tensor("mimo_z", mimo_z, (heads, rank, value_dim), torch.float32, device)
    if d is not None:
        check_tensor("d", d, (heads,), torch.float32, device)

    return Dims(batch=batch, seqlen=seqlen, heads=heads, groups=groups, state_dim=state_dim, value_dim=value_dim,
                rank=rank, chunk_size=chunk_size, nchunks=nchunks, rotary_dim_divisor=rotary_dim_divisor,
                reduce_o=reduce_o, has_z=has_z, has_d=d is not None, lp_dtype=lp, device=device)
