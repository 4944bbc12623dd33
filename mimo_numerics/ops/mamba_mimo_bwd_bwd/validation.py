"""Input validation for ``mamba_mimo_bwd_bwd``: the one place its implementations check their arguments.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size or value) with a message that names the argument and says what was expected.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...validation import LOW_PRECISION_DTYPES, Dims, check_inputs
from .spec import INPUT_NAMES, OPERATOR

_LP_NAMES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


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

    The shapes and dtypes come from the spec (:func:`mimo_numerics.validation.check_inputs`); stage 2's own check
    is upstream's ``dtype`` argument.

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

    def kernel_dtype(lp):  # upstream's dtype argument, checked after q's dtype
        wanted = _lp_of(dtype)
        if wanted is not None and wanted != lp:
            raise ValueError(f"dtype={dtype!r} does not match the dtype {lp} of the low-precision inputs (q, ...)")

    return check_inputs(OPERATOR, values, chunk_size, rotary_dim_divisor, lp_dtype=lp_dtype, special=kernel_dtype)
