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
    """``tensor`` has exactly ``shape``, ``dtype`` and ``device`` (the message names ``name`` and what is expected)."""
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


def check_sizes(q: torch.Tensor, v: torch.Tensor, chunk_size, rotary_dim_divisor,
                names: tuple = ("q", "v")) -> Sizes:
    """``chunk_size`` (int >= 1), ``rotary_dim_divisor`` (2 or 4) and the sizes every operator reads from ``q``
    ``[B, S, R, G, N]`` and ``v`` ``[B, S, H, P]``: no empty dimension, H a multiple of G, N even and divisible by
    the rotary divisor. Shared by every operator's validation (and the whole op's, ``names=("Q", "V")``)."""
    qn, vn = names
    chunk_size = check_int("chunk_size", chunk_size, 1)
    rotary_dim_divisor = check_int("rotary_dim_divisor", rotary_dim_divisor, 1)
    check_rotary_divisor(rotary_dim_divisor)  # before any shape is read
    if q.dim() != 5:
        raise ValueError(f"{qn} must have 5 dimensions [B, S, R, G, N], got shape {list(q.shape)}")
    if v.dim() != 4:
        raise ValueError(f"{vn} must have 4 dimensions [B, S, H, P], got shape {list(v.shape)}")
    batch, seqlen, rank, groups, state_dim = q.shape
    heads, value_dim = v.shape[2], v.shape[3]
    sources = {qn: q, vn: v}
    for dim_name, size, source in (("B", batch, qn), ("S", seqlen, qn), ("R", rank, qn), ("G", groups, qn),
                                   ("N", state_dim, qn), ("H", heads, vn), ("P", value_dim, vn)):
        if size == 0:
            raise ValueError(f"{source} has an empty dimension {dim_name} (shape {list(sources[source].shape)}); "
                             "every dimension must be >= 1")
    if heads % groups:
        raise ValueError(f"{vn} has H={heads} heads, which is not a multiple of the G={groups} groups of {qn} "
                         "(H % G must be 0)")
    check_rotary_state_dim(state_dim, rotary_dim_divisor, where=f"{qn} has N")
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




def check_rotary_divisor(rotary_dim_divisor: int) -> None:
    """``rotary_dim_divisor`` is one of :data:`SUPPORTED_ROTARY_DIVISORS`."""
    if rotary_dim_divisor not in SUPPORTED_ROTARY_DIVISORS:
        raise ValueError(f"rotary_dim_divisor must be one of {SUPPORTED_ROTARY_DIVISORS}, got {rotary_dim_divisor}")


def check_rotary_state_dim(state_dim: int, rotary_dim_divisor: int, where: str = "q has N") -> None:
    """The one rule on N and the rotary divisor (kernels, kernel case specs, whole-op case specs, the whole op): the
    divisor one of :data:`SUPPORTED_ROTARY_DIVISORS`, N even and divisible by it (the N/d rotated columns j pair with
    N/2 + j). ``where`` starts the message (``"state_dim"`` for a case spec)."""
    check_rotary_divisor(rotary_dim_divisor)
    if state_dim % 2 or state_dim % rotary_dim_divisor:
        raise ValueError(f"{where}={state_dim}, which must be even and divisible by "
                         f"rotary_dim_divisor={rotary_dim_divisor}")


def check_segsum_chunk(segsum: torch.Tensor, chunk_size: int) -> None:
    """Name ``chunk_size`` (and its default) when segsum ``[B, H, nchunks, C, C]`` was made with another C."""
    if segsum.dim() != 5 or segsum.shape[-1] != segsum.shape[-2] or segsum.shape[-1] == chunk_size:
        return
    found = segsum.shape[-1]
    default = " (the default when chunk_size is not passed)" if chunk_size == DEFAULT_CHUNK_SIZE else ""
    raise ValueError(f"segsum has chunk size {found} (shape {list(segsum.shape)} = [B, H, nchunks, C, C]) but "
                     f"chunk_size={chunk_size}{default}: pass chunk_size={found}, or a segsum made with chunk size "
                     f"{chunk_size}")


def _letter_sizes(sizes: Sizes) -> dict:
    return {"B": sizes.batch, "S": sizes.seqlen, "R": sizes.rank, "(R)": sizes.rank, "G": sizes.groups,
            "N": sizes.state_dim, "H": sizes.heads, "P": sizes.value_dim, "C": sizes.chunk_size, "nc": sizes.nchunks,
            "N/d": sizes.state_dim // sizes.rotary_dim_divisor}


def _letter_sources(sizes: Sizes, q: torch.Tensor, v: torch.Tensor) -> dict:
    """letter -> (size, where it was read), for the messages of :func:`check_inputs`."""
    q_at, v_at = f"q {list(q.shape)}", f"v {list(v.shape)}"
    where = {"B": q_at, "S": q_at, "R": q_at, "(R)": q_at, "G": q_at, "N": q_at, "H": v_at, "P": v_at,
             "C": "chunk_size", "nc": f"ceil(S / C) with S from {q_at} and chunk_size={sizes.chunk_size}",
             "N/d": f"N / rotary_dim_divisor with N from {q_at}"}
    return {letter: (size, where[letter]) for letter, size in _letter_sizes(sizes).items()}


def expected_shape(letters, sizes: Sizes, reduce_o: bool) -> tuple:
    """The sizes of dimension ``letters`` (``"(R)"`` is left out when ``reduce_o``)."""
    return _expected(letters, _letter_sizes(sizes), reduce_o)


def _expected(letters, known: dict, reduce_o: bool) -> tuple:
    return tuple(known[letter] for letter in letters if not (letter == "(R)" and reduce_o))


def _shape_message(name: str, tensor: torch.Tensor, letters, shape: tuple, sources: dict, reduce_o: bool) -> str:
    """``"<name> must have shape [...], got [...]"`` and, where the ranks agree, for each disagreeing dimension the
    tensor the expected size was read from (so a wrong ``v`` is not reported as a wrong ``mimo_v`` alone)."""
    text = f"{name} must have shape {list(shape)}, got {list(tensor.shape)}"
    used = [letter for letter in letters if not (letter == "(R)" and reduce_o)]
    if tensor.dim() != len(shape):
        return text
    notes = []
    for letter, want, got in zip(used, shape, tensor.shape):
        if want != got:
            size, where = sources[letter]
            notes.append(f"{letter.strip('()')} = {size} is read from {where}")
    return text + (f" ({'; '.join(notes)}: is {name} or that tensor wrong?)" if notes else "")


def check_inputs(op, values: Mapping[str, object], chunk_size, rotary_dim_divisor, *,
                 lp_dtype: Optional[torch.dtype] = None, lp_allowed: tuple = LOW_PRECISION_DTYPES,
                 fp32_allowed: tuple = (torch.float32,), required_note: str = "", first: tuple = (),
                 first_hint: str = "", special=None) -> Dims:
    """Check a kernel operator's tensors against its spec and return their ``Dims``.

    The order of the checks (the first failure is the message): the tensor arguments
    (:func:`check_tensor_arguments`), the sizes of ``q`` and ``v`` (:func:`check_sizes`), ``q``'s lp dtype
    (:func:`check_lp_dtype`), ``special(lp)`` (an operator's own checks, e.g. a ``dtype`` argument), the pairing of
    ``z`` and ``mimo_z``, then every other input's shape (from ``op.input_shapes``), dtype (``op.lp_inputs`` take
    q's dtype, the others one of ``fp32_allowed``) and device (q's), ``first`` before the rest (a shape error of one
    of them ends with ``first_hint``).

    Args:
        op: the ``Operator`` (its ``input_names``, ``optional_inputs``, ``input_shapes``, ``lp_inputs``).
        values (mapping): input name -> argument. chunk_size, rotary_dim_divisor: the scalar arguments.
        lp_dtype: the policy's lp dtype, when the lp inputs must have it. lp_allowed: q's allowed dtypes.
        required_note (str): follows "is required" in the error of a missing input.

    Returns:
        Dims: the validated sizes and branch flags.
    """
    check_tensor_arguments(values, op.optional_inputs, required_note)
    q, v = values["q"], values["v"]
    sizes = check_sizes(q, v, chunk_size, rotary_dim_divisor)
    lp = check_lp_dtype(q, lp_dtype, allowed=lp_allowed)
    if special is not None:
        special(lp)
    has_z = values.get("z") is not None
    if "z" in values and has_z != (values.get("mimo_z") is not None):
        raise ValueError("z and mimo_z must be given together: got z "
                         f"{'present' if has_z else 'None'} and mimo_z {'None' if has_z else 'present'}")
    reduce_o = values.get("mimo_o") is not None
    device = q.device
    known = _letter_sizes(sizes)
    order = tuple(first) + tuple(n for n in op.input_names if n not in first and n != "q")
    for name in order:
        tensor = values[name]
        if tensor is None:
            continue
        letters = op.input_shapes[name]
        shape = _expected(letters, known, reduce_o)
        if name == "segsum":
            check_segsum_chunk(tensor, sizes.chunk_size)
        if tuple(tensor.shape) != shape:
            sources = _letter_sources(sizes, q, v)  # the message's "read from" notes, built for a failure only
            raise ValueError(_shape_message(name, tensor, letters, shape, sources, reduce_o)
                             + (first_hint if name in first else ""))
        if name in op.lp_inputs:
            check_tensor(name, tensor, shape, lp, device)
        elif tensor.dtype not in fp32_allowed:
            check_tensor(name, tensor, shape, fp32_allowed[0], device)  # raises, naming the expected dtype
        else:
            check_tensor(name, tensor, shape, tensor.dtype, device)
    return Dims(batch=sizes.batch, seqlen=sizes.seqlen, heads=sizes.heads, groups=sizes.groups,
                state_dim=sizes.state_dim, value_dim=sizes.value_dim, rank=sizes.rank, chunk_size=sizes.chunk_size,
                nchunks=sizes.nchunks, rotary_dim_divisor=sizes.rotary_dim_divisor, reduce_o=reduce_o, has_z=has_z,
                has_d=values.get("d") is not None, lp_dtype=lp, device=device)

#: Stage 1's names at their old public path (``mimo_numerics.validation.validate_inputs``), loaded on first use.
_STAGE1_NAMES = ("validate_inputs", "LP_INPUTS", "INPUT_NAMES", "OPTIONAL_INPUTS")

__all__ = ["LOW_PRECISION_DTYPES", "SUPPORTED_ROTARY_DIVISORS", "DEFAULT_CHUNK_SIZE", "Dims", "Sizes", "check_int",
           "check_tensor", "check_tensor_arguments", "check_sizes", "check_lp_dtype", "check_rotary_state_dim",
           "check_segsum_chunk", "check_inputs", "expected_shape", *_STAGE1_NAMES]


def __getattr__(name):
    if name in _STAGE1_NAMES:
        import importlib

        return getattr(importlib.import_module("mimo_numerics.ops.mamba_mimo_bwd_fwd.validation"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
