"""Input validation for ``mamba_mimo_fwd``: argument checks of the reference and (``wide=True``) of the oracle.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size) with a message that names the argument and says what was expected. The shapes and
dtypes are the spec's (``spec.OPERATOR.input_shapes``, ``lp_inputs``), checked by
``mimo_numerics.validation.check_inputs``.

Beyond upstream: upstream reads an uninitialised ``torch.empty`` placeholder for ``MIMO_Z`` when ``z`` is given
without ``mimo_z`` (``mamba3_mimo_fwd.py`` L462); here that raises. The forward takes ``z, d, mimo_z`` where stage
1 of the backward takes ``z, mimo_z`` and ``d`` near the end: a shape error on one of these three says so.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...validation import LOW_PRECISION_DTYPES, Dims, check_inputs
from .spec import INPUT_NAMES, OPERATOR

#: With ``wide=True`` (the FP64 oracle): activations in any of these, and float64 where upstream takes float32.
WIDE_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
WIDE_DTYPES = (torch.float32, torch.float64)
_ORDER_HINT = (" (the forward takes z, d, mimo_z in this order; stage 1 of the backward takes z, mimo_z and d "
               "elsewhere: were the arguments given in the backward's order?)")


def _check_dtype_argument(dtype, lp: torch.dtype) -> None:
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (torch.bfloat16 or torch.float16) or None, got "
                        f"{type(dtype).__name__} ({dtype!r})")
    if dtype not in LOW_PRECISION_DTYPES:
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    if dtype != lp:
        raise TypeError(f"dtype is {dtype} but q has dtype {lp}: upstream declares q, k, v, z, trap with dtype")


def validate_inputs(
    q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum,
    chunk_size, rotary_dim_divisor, dtype=None, *, lp_dtype: Optional[torch.dtype] = None, wide: bool = False,
) -> Dims:
    """Check the 16 tensors, the two sizes and ``dtype`` of ``mamba_mimo_fwd``; return their dimensions.

    The shapes and dtypes come from the spec (:func:`mimo_numerics.validation.check_inputs`); the forward's own
    checks are upstream's ``dtype`` argument, the pairing of ``z`` and ``mimo_z`` (upstream would read a
    placeholder) and the argument-order hint: ``z``, ``d``, ``mimo_z`` are checked first, and a shape error of one
    of them says that the backward takes them in another order.

    Args:
        q..segsum: the tensors of the API in upstream's order (shapes and dtypes in ``docs/forward.md``).
        chunk_size (int): C >= 1. rotary_dim_divisor (int): 2 or 4; N must be even and divisible by it.
        dtype (torch.dtype | None): upstream's ``dtype`` argument; when given it must equal q's dtype.
        lp_dtype (torch.dtype, optional): a policy's lp dtype; the low-precision inputs must have it.
        wide (bool): the FP64 oracle's rule: the activations (q, k, v, z, trap) share any float dtype and the
            float32 tensors may also be float64 (e.g. FP64 preprocessing).

    Returns:
        Dims: the validated sizes and branch flags.
    """
    values = dict(zip(INPUT_NAMES, (q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs,
                                    da_cs_rev, dt, trap, segsum)))

    def forward_checks(lp):
        _check_dtype_argument(dtype, lp)
        has_z = z is not None
        if has_z != (mimo_z is not None):
            got = ("present and mimo_z None (upstream would read an uninitialised placeholder for MIMO_Z)" if has_z
                   else "None and mimo_z present")
            misplaced = d is not None and d.dim() != 1  # e.g. mimo_z given in d's place
            raise ValueError(f"z and mimo_z must be given together: got z {got}{_ORDER_HINT if misplaced else ''}")

    return check_inputs(OPERATOR, values, chunk_size, rotary_dim_divisor, lp_dtype=lp_dtype,
                        lp_allowed=WIDE_ACTIVATION_DTYPES if wide else LOW_PRECISION_DTYPES,
                        fp32_allowed=WIDE_DTYPES if wide else (torch.float32,),
                        required_note=" (upstream cannot take None)", first=("z", "mimo_z", "d"),
                        first_hint=_ORDER_HINT, special=forward_checks)


def check_final_tokens(final_tokens, batch: int, seqlen: int) -> tuple:
    """One token per batch row for ``FINAL_K`` (``return_state``): ``final_tokens`` checked, or S − 1 for every row
    when None. ValueError naming ``final_tokens`` otherwise."""
    if final_tokens is None:
        return (seqlen - 1,) * batch
    tokens = tuple(int(t) for t in final_tokens)
    if len(tokens) != batch or not all(0 <= t < seqlen for t in tokens):
        raise ValueError(f"final_tokens must give one token in [0, {seqlen}) per batch row ({batch}), "
                         f"got {list(tokens)}")
    return tokens
