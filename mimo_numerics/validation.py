"""The argument checks every operator's validation uses: ``Dims``, the tensor-argument, size and lp-dtype checks.

Each operator's own validation lives in its folder (``ops/<operator>/validation.py``). ``validate_inputs`` and
``LP_INPUTS`` here are stage 1's (``ops/mamba_mimo_bwd_fwd/validation.py``), kept at this public path for users
(loaded on first use, so that this generic module imports no operator).

Every failure raises ``TypeError`` (wrong Python or torch type, wrong dtype) or ``ValueError`` (shape, device,
pairing, unsupported size) with a message that names the argument and says what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import torch

LOW_PRECISION_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_ROTARY_DIVISORS = (2, 4)
#: The ``chunk_size`` every implementation (reference, oracle, kernels, upstream) assumes when it is not passed.
DEFAULT_CHUNK_SIZE = 16


@dataclass(frozen=True)
class Dims:
    """Sizes and branch flags of one validated call.

    Attributes:
        batch, seqlen, heads, groups, state_dim, value_dim, rank (int): B, S, H, G, N, P, R.
        chunk_size (int): C. nchunks (int): ceil(S / C).
        rotary_dim_divisor (int): d.
        reduce_o, has_z, has_d (bool): which optional branches are on.
        lp_dtype (torch.dtype): dtype of the low-precision inputs.
        device (torch.device): device of every tensor.
    """

    batch: int
    seqlen: int
    heads: int
    groups: int
    state_dim: int
    value_dim: int
    rank: int
    chunk_size: int
    nchunks: int
    rotary_dim_divisor: int
    reduce_o: bool
    has_z: bool
    has_d: bool
    lp_dtype: torch.dtype
    device: torch.device

    @property
    def padded_seqlen(self) -> int:
        return self.nchunks * self.chunk_size

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.groups


def check_int(name: str, value, minimum: int) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_tensor(name: str, tensor, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """``tensor`` has exactly ``shape``, ``dtype`` and ``device`` (the message names ``name`` and the expected value)."""
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    if tensor.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} must be on device {device} (the device of q), got {tensor.device}")


@dataclass(frozen=True)
class Sizes:
    """B, S, R, G, N from ``q`` ``[B, S, R, G, N]``, H and P from ``v`` ``[B, S, H, P]``, and the checked ints."""

    batch: int
    seqlen: int
    rank: int
    groups: int
    state_dim: int
    heads: int
    value_dim: int
    chunk_size: int
    rotary_dim_divisor: int

    @property
    def nchunks(self) -> int:
        return -(-self.seqlen // self.chunk_size)


def check_tensor_arguments(values: Mapping[str, object], optional: Iterable[str], required_note: str = "") -> None:
    """Each of ``values`` (name -> argument) is a dense torch.Tensor; those named in ``optional`` may be None.

    ``required_note`` follows "is required" in the error of a missing one (e.g. why upstream cannot take None).
    Shared by every operator's validation: the checks before any shape is read.
    """
    optional = frozenset(optional)
    for name, value in values.items():
        if value is None:
            if name not in optional:
                raise TypeError(f"{name} is required{required_note}: expected a torch.Tensor, got None")
        elif not isinstance(value, torch.Tensor):
            kind = "a torch.Tensor or None" if name in optional else "a torch.Tensor"
            raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
        elif value.layout != torch.strided or value.is_nested:  # sparse, mkldnn, nested: no strided storage
            kind = "a nested tensor" if value.is_nested else f"a tensor of layout {value.layout}"
            raise TypeError(f"{name} must be a dense (strided) torch.Tensor, got {kind}")


def check_sizes(q: torch.Tensor, v: torch.Tensor, chunk_size, rotary_dim_divisor) -> Sizes:
    """``chunk_size`` (int >= 1), ``rotary_dim_divisor`` (2 or 4) and the sizes every operator reads from ``q``
    ``[B, S, R, G, N]`` and ``v`` ``[B, S, H, P]``: no empty dimension, H a multiple of G, N even and divisible by
    the rotary divisor. Shared by every operator's validation."""
    chunk_size = check_int("chunk_size", chunk_size, 1)
    rotary_dim_divisor = check_int("rotary_dim_divisor", rotary_dim_divisor, 1)
    if rotary_dim_divisor not in SUPPORTED_ROTARY_DIVISORS:
        raise ValueError(f"rotary_dim_divisor must be one of {SUPPORTED_ROTARY_DIVISORS}, got {rotary_dim_divisor}")
    if q.dim() != 5:
        raise ValueError(f"q must have 5 dimensions [B, S, R, G, N], got shape {list(q.shape)}")
    if v.dim() != 4:
        raise ValueError(f"v must have 4 dimensions [B, S, H, P], got shape {list(v.shape)}")
    batch, seqlen, rank, groups, state_dim = q.shape
    heads, value_dim = v.shape[2], v.shape[3]
    sources = {"q": q, "v": v}
    for dim_name, size, source in (("B", batch, "q"), ("S", seqlen, "q"), ("R", rank, "q"), ("G", groups, "q"),
                                   ("N", state_dim, "q"), ("H", heads, "v"), ("P", value_dim, "v")):
        if size == 0:
            raise ValueError(f"{source} has an empty dimension {dim_name} (shape {list(sources[source].shape)}); "
                             "every dimension must be >= 1")
    if heads % groups:
        raise ValueError(f"v has H={heads} heads, which is not a multiple of the G={groups} groups of q "
                         "(H % G must be 0)")
    if state_dim % 2 or state_dim % rotary_dim_divisor:
        raise ValueError(f"q has N={state_dim}, which must be even and divisible by "
                         f"rotary_dim_divisor={rotary_dim_divisor}")
    return Sizes(batch, seqlen, rank, groups, state_dim, heads, value_dim, chunk_size, rotary_dim_divisor)


def check_lp_dtype(q: torch.Tensor, lp_dtype: Optional[torch.dtype] = None,
                   allowed: tuple = LOW_PRECISION_DTYPES) -> torch.dtype:
    """The low-precision dtype of a call: ``q``'s, one of ``allowed``, equal to the policy's ``lp_dtype`` when one is
    given. Shared by every operator's validation."""
    lp = q.dtype
    if lp not in allowed:
        raise TypeError(f"q must have dtype {' or '.join(str(t) for t in allowed)}, got {lp}")
    if lp_dtype is not None and lp != lp_dtype:
        raise TypeError(f"q has dtype {lp} but the policy's lp_dtype is {lp_dtype}: the low-precision inputs must "
                        "match the policy (use policy.replace(lp_dtype=...))")
    return lp



#: Stage 1's names at their old public path (``mimo_numerics.validation.validate_inputs``), loaded on first use.
_STAGE1_NAMES = ("validate_inputs", "LP_INPUTS", "INPUT_NAMES", "OPTIONAL_INPUTS")

__all__ = ["LOW_PRECISION_DTYPES", "SUPPORTED_ROTARY_DIVISORS", "DEFAULT_CHUNK_SIZE", "Dims", "Sizes", "check_int",
           "check_tensor", "check_tensor_arguments", "check_sizes", "check_lp_dtype", *_STAGE1_NAMES]


def __getattr__(name):
    if name in _STAGE1_NAMES:
        import importlib

        return getattr(importlib.import_module("mimo_numerics.ops.mamba_mimo_bwd_fwd.validation"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
