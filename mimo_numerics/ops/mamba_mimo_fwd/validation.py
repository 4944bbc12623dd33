"""Input validation for ``mamba_mimo_fwd``: argument checks of the reference and (``wide=True``) of the oracle.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size) with a message that names the argument and says what was expected. The generic checks
come from ``mimo_numerics.validation`` (stage 1's module, not modified here).

Beyond upstream: upstream reads an uninitialised ``torch.empty`` placeholder for ``MIMO_Z`` when ``z`` is given
without ``mimo_z`` (``mamba3_mimo_fwd.py`` L462); here that raises. The forward takes ``z, d, mimo_z`` where stage
1 of the backward takes ``z, mimo_z`` and ``d`` near the end: a shape error on one of these three says so.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...validation import (LOW_PRECISION_DTYPES, Dims, check_tensor, check_lp_dtype, check_sizes,
                           check_tensor_arguments)
from .spec import INPUT_NAMES, OPTIONAL_INPUTS

#: With ``wide=True`` (the FP64 oracle): activations in any of these, and float64 where upstream takes float32.
WIDE_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
WIDE_DTYPES = (torch.float32, torch.float64)
_ORDER_HINT = (" (the forward takes z, d, mimo_z in this order; stage 1 of the backward takes z, mimo_z and d "
               "elsewhere: were the arguments given in the backward's order?)")


def _check_ordered(name: str, tensor, shape: tuple, dtype, device: torch.device) -> None:
    """``_check_any`` for z, d and mimo_z: a shape error also names the argument-order mistake."""
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}{_ORDER_HINT}")
    _check_any(name, tensor, shape, dtype, device)


def _check_any(name: str, tensor, shape: tuple, dtypes, device: torch.device) -> None:
    """``check_tensor`` accepting one dtype or a tuple of them."""
    if isinstance(dtypes, torch.dtype):
        check_tensor(name, tensor, shape, dtypes, device)
        return
    if tensor.dtype not in dtypes:
        check_tensor(name, tensor, shape, dtypes[0], device)  # raises, naming the expected dtype
    check_tensor(name, tensor, shape, tensor.dtype, device)


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
    check_tensor_arguments(values, OPTIONAL_INPUTS, " (upstream cannot take None)")
    sizes = check_sizes(q, v, chunk_size, rotary_dim_divisor)
    batch, seqlen, rank, groups, state_dim = sizes.batch, sizes.seqlen, sizes.rank, sizes.groups, sizes.state_dim
    heads, value_dim = sizes.heads, sizes.value_dim
    chunk_size, rotary_dim_divisor = sizes.chunk_size, sizes.rotary_dim_divisor

    device = q.device
    lp = check_lp_dtype(q, lp_dtype, allowed=WIDE_ACTIVATION_DTYPES if wide else LOW_PRECISION_DTYPES)
    _check_dtype_argument(dtype, lp)
    has_z = z is not None
    if has_z != (mimo_z is not None):
        got = ("present and mimo_z None (upstream would read an uninitialised placeholder for MIMO_Z)" if has_z
               else "None and mimo_z present")
        misplaced = d is not None and d.dim() != 1  # e.g. mimo_z given in d's place
        raise ValueError(f"z and mimo_z must be given together: got z {got}{_ORDER_HINT if misplaced else ''}")
    nchunks = sizes.nchunks
    bshp = (batch, seqlen, heads, value_dim)
    weight = (heads, rank, value_dim)
    f32 = WIDE_DTYPES if wide else torch.float32
    # z, d, mimo_z first: a call in the backward's argument order fails here with the order hint
    if has_z:
        _check_ordered("z", z, bshp, lp, device)
        _check_ordered("mimo_z", mimo_z, weight, f32, device)
    if d is not None:
        _check_ordered("d", d, (heads,), f32, device)
    _check_any("k", k, tuple(q.shape), lp, device)
    _check_any("v", v, bshp, lp, device)
    _check_any("trap", trap, (batch, heads, seqlen), lp, device)
    for name in ("q_bias", "k_bias"):
        _check_any(name, values[name], (heads, rank, state_dim), f32, device)
    _check_any("mimo_v", mimo_v, weight, f32, device)
    if mimo_o is not None:
        _check_any("mimo_o", mimo_o, weight, f32, device)
    _check_any("angles", angles, (batch, seqlen, heads, state_dim // rotary_dim_divisor), f32, device)
    for name in ("da_cs", "da_cs_rev", "dt"):
        _check_any(name, values[name], (batch, heads, seqlen), f32, device)
    _check_any("segsum", segsum, (batch, heads, nchunks, chunk_size, chunk_size), f32, device)

    return Dims(batch=batch, seqlen=seqlen, heads=heads, groups=groups, state_dim=state_dim, value_dim=value_dim,
                rank=rank, chunk_size=chunk_size, nchunks=nchunks, rotary_dim_divisor=rotary_dim_divisor,
                reduce_o=mimo_o is not None, has_z=has_z, has_d=d is not None, lp_dtype=lp, device=device)
