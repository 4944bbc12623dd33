"""Input validation of backward stage 1, ``mamba_mimo_bwd_fwd``: where its implementations check their arguments.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size) with a message that names the argument and says what was expected. The checks every
operator shares come from :mod:`mimo_numerics.validation`.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...validation import Dims, check_inputs, check_segsum_chunk  # noqa: F401  (check_segsum_chunk: public here)
from .outputs import INPUT_NAMES, OPTIONAL_INPUTS  # noqa: F401
from .spec import LP_INPUTS, OPERATOR  # noqa: F401  (LP_INPUTS: the inputs in the lp dtype)


def validate_inputs(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size, rotary_dim_divisor, *, lp_dtype: Optional[torch.dtype] = None,
) -> Dims:
    """Check the 17 tensors and two sizes of ``mamba_mimo_bwd_fwd`` and return their dimensions.

    Every check comes from the spec (``OPERATOR.input_shapes``, ``OPERATOR.lp_inputs``) through
    :func:`mimo_numerics.validation.check_inputs`; stage 1 has nothing special.

    Args:
        dout..segsum: the tensors of the API, see ``docs/semantics.md`` for shapes and dtypes.
        chunk_size (int): C >= 1. rotary_dim_divisor (int): 2 or 4, dividing N.
        lp_dtype (torch.dtype, optional): when given (a policy's ``lp_dtype``), the low-precision inputs must have it.

    Returns:
        Dims: the validated sizes and branch flags.
    """
    values = dict(zip(INPUT_NAMES, (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs,
                                    da_cs_rev, dt, trap, d, segsum)))
    return check_inputs(OPERATOR, values, chunk_size, rotary_dim_divisor, lp_dtype=lp_dtype)
