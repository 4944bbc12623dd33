"""Input validation for ``mamba_mimo_bwd_bwd``: the one place its implementations check their arguments.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size or value) with a message that names the argument and says what was expected.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...validation import (LOW_PRECISION_DTYPES, Dims, check_tensor, check_lp_dtype, check_sizes,
                           check_tensor_arguments)
from .sites import OP_NAME, SITES
from .spec import INPUT_NAMES, OPTIONAL_INPUTS

_LP_NAMES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: Knobs the reference reads, with their allowed values.


def _lp_of(dtype) -> Optional[torch.dtype]:
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in LOW_PRECISION_DTYPES:
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16 (or None), got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype in _LP_NAMES:
        return _LP_NAMES[dtype]
    raise TypeError(f"dtype must be None, torch.bfloat16, torch.float16, 'bfloat16' or 'float16', got {dtype!r}")


def validate_inputs(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, qk_dot,
    segsum, chunk_size, rotary_dim_divisor, dtype=None, *, lp_dtype: Optional[torch.dtype] = None,
) -> Dims:
    """Check the 19 tensors, two sizes and ``dtype`` of ``mamba_mimo_bwd_bwd`` and return their dimensions.

    Args:
        dout..segsum: the tensors of the API in upstream's order (see ``docs/stage2.md`` for shapes and dtypes);
            ``states`` ``[B, H, nc, N, P]`` and ``qk_dot`` ``[B, H, S, R, R]`` are stage 1's lp outputs.
        chunk_size (int): C >= 1. rotary_dim_divisor (int): 2 or 4, dividing N.
        dtype (torch.dtype | str | None): upstream's kernel ``dtype``; when given it must equal the lp inputs'
            dtype (and ``lp_dtype``).
        lp_dtype (torch.dtype, optional): the policy's lp dtype; the lp inputs must have it.

    Returns:
        Dims: the validated sizes and branch flags.
    """
    values = dict(zip(INPUT_NAMES, (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                                    da_cs_rev, dt, trap, d, qk_dot, segsum)))
    check_tensor_arguments(values, OPTIONAL_INPUTS)
    sizes = check_sizes(q, v, chunk_size, rotary_dim_divisor)
    batch, seqlen, rank, groups, state_dim = sizes.batch, sizes.seqlen, sizes.rank, sizes.groups, sizes.state_dim
    heads, value_dim = sizes.heads, sizes.value_dim
    chunk_size, rotary_dim_divisor = sizes.chunk_size, sizes.rotary_dim_divisor

    device = q.device
    lp = check_lp_dtype(q, lp_dtype)
    kernel_dtype = _lp_of(dtype)
    if kernel_dtype is not None and kernel_dtype != lp:
        raise ValueError(f"dtype={dtype!r} does not match the dtype {lp} of the low-precision inputs (q, ...)")
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
    check_tensor("states", states, (batch, heads, nchunks, state_dim, value_dim), lp, device)
    check_tensor("trap", trap, (batch, heads, seqlen), lp, device)
    check_tensor("qk_dot", qk_dot, (batch, heads, seqlen, rank, rank), lp, device)
    for name in ("q_bias", "k_bias"):
        check_tensor(name, values[name], (heads, rank, state_dim), torch.float32, device)
    check_tensor("mimo_v", mimo_v, (heads, rank, value_dim), torch.float32, device)
    check_tensor("angles", angles, (batch, seqlen, heads, state_dim // rotary_dim_divisor), torch.float32, device)
    for name in ("da_cs", "da_cs_rev", "dt"):
        check_tensor(name, values[name], (batch, heads, seqlen), torch.float32, device)
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
