"""Input validation for ``mamba_mimo_fwd`` (the forward kernel), in upstream's ``mamba_mimo_forward`` order.

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size) with a message that names the argument and says what was expected.

The forward takes ``z, d, mimo_z`` (``mamba3_mimo_fwd.py`` L417-422) where the backward takes ``z, mimo_z, ...,
d``: a ``d`` and ``mimo_z`` passed in each other's place fail the shape check of ``d`` (``[H]``) or of ``mimo_z``
(``[H, R, P]``) with a message that says so.
"""

from __future__ import annotations

import torch

from ...validation import Dims, _check_int

#: The 16 tensor arguments of ``mamba_mimo_forward``, in call order.
INPUT_NAMES = (
    "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "d", "mimo_z",
    "angles", "da_cs", "da_cs_rev", "dt", "trap", "segsum",
)
#: Arguments that may be None.
OPTIONAL_INPUTS = ("mimo_o", "z", "d", "mimo_z")
#: Activations: upstream's low-precision dtype; an FP64 oracle also takes float32/float64. One dtype for all.
ACTIVATIONS = ("q", "k", "v", "z", "trap")
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
#: Upstream's float32 tensors; float64 also accepted (e.g. FP64 preprocessing).
WIDE_DTYPES = (torch.float32, torch.float64)
SUPPORTED_ROTARY_DIVISORS = (2, 4)
_ORDER_HINT = "(mamba_mimo_forward takes z, d, mimo_z in this order; the backward takes z, mimo_z, ..., d)"


def _check(name: str, tensor: torch.Tensor, shape: tuple, dtypes: tuple, device: torch.device,
           hint: str = "") -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}{hint}")
    if tensor.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(str(t) for t in dtypes)}, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} must be on device {device} (the device of q), got {tensor.device}")


def validate_inputs(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
                    segsum, chunk_size, rotary_dim_divisor) -> Dims:
    """Check the 16 tensors and two sizes of ``mamba_mimo_forward`` and return their dimensions.

    Args:
        q, k (Tensor): ``[B, S, R, G, N]``. v (Tensor): ``[B, S, H, P]``. trap (Tensor): ``[B, H, S]``.
            z (Tensor | None): ``[B, S, H, P]``, with ``mimo_z``. These five share one dtype.
        q_bias, k_bias (Tensor): ``[H, R, N]``. mimo_v, mimo_o, mimo_z (Tensor): ``[H, R, P]`` (``mimo_o``
            None: non-reduced output). d (Tensor | None): ``[H]``. angles (Tensor): ``[B, S, H, N / divisor]``
            (cumulative). da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]``. segsum (Tensor): ``[B, H, nc, C, C]``.
            Each float32 or float64.
        chunk_size (int): C >= 1. rotary_dim_divisor (int): 2 or 4, dividing N.

    Returns:
        Dims: sizes and branch flags (``lp_dtype`` = the activations' dtype).
    """
    values = dict(zip(INPUT_NAMES, (q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs,
                                    da_cs_rev, dt, trap, segsum)))
    for name, value in values.items():
        if value is None:
            if name not in OPTIONAL_INPUTS:
                raise TypeError(f"{name} is required: expected a torch.Tensor, got None")
        elif not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor{' or None' if name in OPTIONAL_INPUTS else ''}, "
                            f"got {type(value).__name__}")
        elif value.layout != torch.strided or value.is_nested:
            raise TypeError(f"{name} must be a dense (strided) torch.Tensor, got layout {value.layout}")
    chunk_size = _check_int("chunk_size", chunk_size, 1)
    rotary_dim_divisor = _check_int("rotary_dim_divisor", rotary_dim_divisor, 1)
    if rotary_dim_divisor not in SUPPORTED_ROTARY_DIVISORS:
        raise ValueError(f"rotary_dim_divisor must be one of {SUPPORTED_ROTARY_DIVISORS}, got {rotary_dim_divisor}")
    if q.dim() != 5:
        raise ValueError(f"q must have 5 dimensions [B, S, R, G, N], got shape {list(q.shape)}")
    if v.dim() != 4:
        raise ValueError(f"v must have 4 dimensions [B, S, H, P], got shape {list(v.shape)}")
    batch, seqlen, rank, groups, state_dim = q.shape
    heads, value_dim = v.shape[2], v.shape[3]
    for dim_name, size, source in (("B", batch, "q"), ("S", seqlen, "q"), ("R", rank, "q"), ("G", groups, "q"),
                                   ("N", state_dim, "q"), ("H", heads, "v"), ("P", value_dim, "v")):
        if size == 0:
            raise ValueError(f"{source} has an empty dimension {dim_name} (shape {list(values[source].shape)}); "
                             "every dimension must be >= 1")
    if heads % groups:
        raise ValueError(f"v has H={heads} heads, which is not a multiple of the G={groups} groups of q "
                         "(H % G must be 0)")
    if state_dim % 2 or state_dim % rotary_dim_divisor:
        raise ValueError(f"q has N={state_dim}, which must be even and divisible by "
                         f"rotary_dim_divisor={rotary_dim_divisor}")
    device, act = q.device, q.dtype
    if act not in ACTIVATION_DTYPES:
        raise TypeError(f"q must have dtype torch.bfloat16, torch.float16, torch.float32 or torch.float64, got {act}")

    nchunks = -(-seqlen // chunk_size)
    bshp = (batch, seqlen, heads, value_dim)
    hrp = (heads, rank, value_dim)
    if d is not None and tuple(d.shape) != (heads,):
        raise ValueError(f"d must have shape {[heads]}, got {list(d.shape)}"
                         + (f" {_ORDER_HINT}" if tuple(d.shape) == hrp else ""))
    if mimo_z is not None and tuple(mimo_z.shape) != hrp:
        raise ValueError(f"mimo_z must have shape {list(hrp)}, got {list(mimo_z.shape)}"
                         + (f" {_ORDER_HINT}" if tuple(mimo_z.shape) == (heads,) else ""))
    has_z = z is not None
    if has_z != (mimo_z is not None):
        raise ValueError("z and mimo_z must be given together (upstream's forward reads an uninitialised "
                         f"placeholder for a missing mimo_z): got z {'present' if has_z else 'None'} and mimo_z "
                         f"{'None' if has_z else 'present'}")

    _check("k", k, tuple(q.shape), (act,), device)
    _check("v", v, bshp, (act,), device)
    _check("trap", trap, (batch, heads, seqlen), (act,), device)
    if has_z:
        _check("z", z, bshp, (act,), device)
        _check("mimo_z", mimo_z, hrp, WIDE_DTYPES, device)
    for name in ("q_bias", "k_bias"):
        _check(name, values[name], (heads, rank, state_dim), WIDE_DTYPES, device)
    _check("mimo_v", mimo_v, hrp, WIDE_DTYPES, device)
    if mimo_o is not None:
        _check("mimo_o", mimo_o, hrp, WIDE_DTYPES, device)
    if d is not None:
        _check("d", d, (heads,), WIDE_DTYPES, device)
    _check("angles", angles, (batch, seqlen, heads, state_dim // rotary_dim_divisor), WIDE_DTYPES, device)
    for name in ("da_cs", "da_cs_rev", "dt"):
        _check(name, values[name], (batch, heads, seqlen), WIDE_DTYPES, device)
    _check("segsum", segsum, (batch, heads, nchunks, chunk_size, chunk_size), WIDE_DTYPES, device)

    return Dims(batch=batch, seqlen=seqlen, heads=heads, groups=groups, state_dim=state_dim, value_dim=value_dim,
                rank=rank, chunk_size=chunk_size, nchunks=nchunks, rotary_dim_divisor=rotary_dim_divisor,
                reduce_o=mimo_o is not None, has_z=has_z, has_d=d is not None, lp_dtype=act, device=device)
