"""The case model the kernels share: :class:`CaseSpec`, :class:`StoredCase`, the machine-independent draws.

The forward, stage 1 and stage 2 take their inputs from one kernel case: a :class:`CaseSpec` fixes every size,
branch flag, dtype, seed and the input formula. Stage 1's ``make_inputs`` (``ops/mamba_mimo_bwd_fwd/cases.py``,
where the formulas and the named grids live) turns it into the 17 tensors of its API (by name, ``None`` for
absent optional inputs) plus ``chunk_size`` and ``rotary_dim_divisor``. Inputs are always drawn on the CPU from a
``torch.Generator`` seeded with ``spec.seed`` and only then moved to the requested device, so the bits do not depend
on the target device.

Every draw is machine-independent: normals, uniforms and the softplus of the realistic formula come from
:mod:`mimo_numerics.exact_random` (the generator's bits, integer arithmetic and correctly rounded IEEE operations
only; no vectorised transcendental, no BLAS), so the inputs of a spec are the same bits on every CPU model, thread
count and torch build (``tests/test_case_digests.py`` pins them). Low-precision tensors are float32 draws rounded
to lp.

Formulas (``FORMULAS``; written in ``ops/mamba_mimo_bwd_fwd/cases.py``): ``"seed"``, the seed PR's unit test's
distributions and draw order, and ``"realistic"``, the upstream test's formula. The names ``make_inputs``,
``grid``, ``GRIDS``, ... of this module are stage 1's, kept at this public path (loaded on first use).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
import torch

from . import exact_random
from .validation import check_rotary_state_dim

FORMULAS = ("seed", "realistic")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_TAGS = {"bfloat16": "bf16", "float16": "fp16"}


#: The int fields of a case spec (kernel or whole op) and their minimum (``seed`` may be 0).
CASE_INT_FIELDS = ("batch", "seqlen", "heads", "groups", "state_dim", "value_dim", "rank", "chunk_size", "seed",
                   "rotary_dim_divisor")


def check_case_fields(spec, bool_fields: tuple, formulas: tuple) -> None:
    """The checks of a case spec, written once for :class:`CaseSpec` and the whole op's ``OpCaseSpec``: the int
    fields (:data:`CASE_INT_FIELDS`), ``bool_fields``, the formula, the dtype, H a multiple of G, and the rotary
    rule every implementation applies (``validation.check_rotary_state_dim``: N even and divisible by the divisor,
    2 or 4). ``ValueError`` naming the field."""
    for name in CASE_INT_FIELDS:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
        minimum = 0 if name == "seed" else 1
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    for name in bool_fields:
        value = getattr(spec, name)
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    if spec.formula not in formulas:
        raise ValueError(f"formula must be one of {formulas}, got {spec.formula!r}")
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {spec.dtype!r}")
    if spec.heads % spec.groups:
        raise ValueError(f"heads ({spec.heads}) must be a multiple of groups ({spec.groups})")
    check_rotary_state_dim(spec.state_dim, spec.rotary_dim_divisor, where="state_dim")


@dataclass(frozen=True)
class CaseDims:
    """The fields every case spec has (a kernel's :class:`CaseSpec`, the whole op's ``OpCaseSpec``), declared once
    with :class:`CaseSpec`'s defaults; a subclass redeclares only the defaults it changes (a redeclared field keeps
    its place, so the positional order is the same for every spec) and says its bool fields and formulas.

    Attributes:
        batch, seqlen, heads, groups (int): B, S, H, G (``heads % groups == 0``).
        state_dim, value_dim, rank (int): N, P, R.
        chunk_size (int): C.
        reduce_o (bool): reduced output (``mimo_o`` / ``MIMO_Out`` given, ``[B, S, H, P]``) or not
            (``[B, S, R, H, P]``).
        has_z (bool): give ``z`` and ``mimo_z``.
        has_d (bool): give ``d``.
        formula (str): how the inputs are drawn (the subclass's module docstring).
        dtype (str): low-precision dtype of ``dout, q, k, v, z, trap``: ``"bfloat16"`` or ``"float16"``.
        seed (int): seed of the CPU ``torch.Generator`` the inputs are drawn from (>= 0).
        rotary_dim_divisor (int): 2 or 4; ``angles`` is ``[B, S, H, N / rotary_dim_divisor]``.
    """

    batch: int = 1
    seqlen: int = 32
    heads: int = 1
    groups: int = 1
    state_dim: int = 64
    value_dim: int = 64
    rank: int = 4
    chunk_size: int = 16
    reduce_o: bool = True
    has_z: bool = False
    has_d: bool = False
    formula: str = "seed"
    dtype: str = "bfloat16"
    seed: int = 123
    rotary_dim_divisor: int = 4

    #: The bool fields ``__post_init__`` checks and the formulas it accepts (class attributes, not fields).
    BOOL_FIELDS = ("reduce_o", "has_z", "has_d")
    FORMULAS = FORMULAS

    def __post_init__(self):
        check_case_fields(self, self.BOOL_FIELDS, self.FORMULAS)

    @property
    def lp_dtype(self) -> torch.dtype:
        """The torch dtype of the low-precision inputs."""
        return DTYPES[self.dtype]

    def _id_text(self) -> str:
        """``<formula>_B.._S.._H.._G.._N.._P.._R.._C.._<branches>_<dtype>_s<seed>[_rd2]`` (see ``case_id``)."""
        branches = ("ro" if self.reduce_o else "fo") + ("Z" if self.has_z else "-") + ("D" if self.has_d else "-")
        text = (f"{self.formula}_B{self.batch}_S{self.seqlen}_H{self.heads}_G{self.groups}_N{self.state_dim}"
                f"_P{self.value_dim}_R{self.rank}_C{self.chunk_size}_{branches}_{_DTYPE_TAGS[self.dtype]}"
                f"_s{self.seed}")
        if self.rotary_dim_divisor != 4:
            text += f"_rd{self.rotary_dim_divisor}"
        return text

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields by name (plain Python values; JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        """Build a spec from :meth:`to_dict` output; missing fields take their defaults.

        Raises:
            ValueError: on unknown keys (named in the message) or invalid values.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; valid fields are {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class CaseSpec(CaseDims):
    """One input configuration of ``mamba_mimo_bwd_fwd`` (and of the other kernels): the fields of
    :class:`CaseDims` with its defaults; ``formula`` is ``"seed"`` or ``"realistic"`` (module docstring).

    Raises:
        ValueError: from ``__post_init__``, naming the offending field.
    """

    @property
    def nchunks(self) -> int:
        """ceil(S / C)."""
        return -(-self.seqlen // self.chunk_size)

    @property
    def case_id(self) -> str:
        """A readable id, unique per spec and usable as a pytest id.

        Example: ``seed_B1_S32_H1_G1_N64_P64_R4_C16_roZD_bf16_s123``. ``ro``/``fo`` is reduced/full DOUT, ``Z``/``-``
        and ``D``/``-`` the optional branches; ``_rd2`` is appended when ``rotary_dim_divisor`` is 2.
        """
        return self._id_text()


@dataclass(frozen=True)
class StoredCase(CaseSpec):
    """A case whose inputs are stored tensors (golden data), not drawn: usable wherever a ``CaseSpec`` is (gates,
    sweeps, reports). The size fields describe the stored inputs; ``make_inputs`` returns copies of them.

    Attributes:
        source (str): the stored case's name (its ``case_id``).
        inputs (dict): the tensors and ``chunk_size``/``rotary_dim_divisor`` (not part of equality or hash).
    """

    source: str = ""
    inputs: dict = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        super().__post_init__()
        if not self.source:
            raise ValueError("StoredCase needs a source name")
        if not isinstance(self.inputs, dict):
            raise ValueError(f"StoredCase {self.source}: inputs must be a dict of the stored tensors")

    @property
    def case_id(self) -> str:
        """The stored case's name."""
        return self.source


#: Keys of the seed test's ``_make_inputs`` (the golden file's ``kw``) that map 1:1 to CaseSpec fields.
SEED_KWARGS = ("seed", "batch", "seqlen", "heads", "groups", "state_dim", "value_dim", "rank", "chunk_size",
               "reduce_o", "has_z", "has_d")


def spec_from_seed_kwargs(kw: dict) -> CaseSpec:
    """The CaseSpec of a call ``_make_inputs(**kw)`` of the seed PR's test (``formula="seed"``, bfloat16, divisor 4).

    Args:
        kw (dict): keyword arguments of the seed formula, e.g. a golden case's ``"kw"``; absent keys take the seed
            test's defaults, which are CaseSpec's defaults.

    Raises:
        ValueError: on keys the seed formula does not have.
    """
    unknown = sorted(set(kw) - set(SEED_KWARGS))
    if unknown:
        raise ValueError(f"unknown seed-formula keyword(s) {unknown}; valid keys are {list(SEED_KWARGS)}")
    return CaseSpec(formula="seed", dtype="bfloat16", rotary_dim_divisor=4, **kw)


def normal(shape, gen: torch.Generator) -> torch.Tensor:
    """Standard normal float32 draws, the same bits on every machine (:func:`exact_random.normal`)."""
    return exact_random.normal(shape, gen).to(torch.float32)


def normal_lp(shape, gen: torch.Generator, lp: torch.dtype) -> torch.Tensor:
    """Standard normal draws rounded to ``lp`` (through float32, as a float32 draw cast to lp)."""
    return normal(shape, gen).to(lp)


def uniform(shape, gen: torch.Generator) -> torch.Tensor:
    """``U[0, 1)`` float64 draws on the 2**-24 grid (exact in float32; :func:`exact_random.uniform`)."""
    return exact_random.uniform(shape, gen)


def tensor_digests(inputs: dict) -> dict:
    """``{name: sha256 hex}`` of every tensor of ``inputs`` (dtype, shape and raw bytes; ``None`` for absent ones).

    Used to pin generated inputs (``tests/test_case_digests.py``) and to name the tensor that differs when two sets
    of inputs should be equal.
    """
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            out[name] = h.hexdigest()
        elif value is None:
            out[name] = None
    return out


def case_id(spec: CaseSpec) -> str:
    """``spec.case_id``, for ``pytest.mark.parametrize(..., ids=case_id)``."""
    return spec.case_id

#: Stage 1's formulas and grids at their old public path (``mimo_numerics.cases.make_inputs``, ``grid``, ...),
#: loaded on first use from ``ops/mamba_mimo_bwd_fwd/cases.py``.
_STAGE1_NAMES = ("make_inputs", "grids", "grid", "grid_names", "GRIDS", "chunk_cumsums", "as_args", "as_kwargs")

__all__ = ["FORMULAS", "DTYPES", "CASE_INT_FIELDS", "check_case_fields", "CaseSpec", "StoredCase", "normal",
           "normal_lp", "uniform", "tensor_digests",
           "case_id", "SEED_KWARGS", "spec_from_seed_kwargs", *_STAGE1_NAMES]


def __getattr__(name):
    if name in _STAGE1_NAMES:
        import importlib

        return getattr(importlib.import_module("mimo_numerics.ops.mamba_mimo_bwd_fwd.cases"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
