"""Test cases of ``mamba_mimo_bwd_fwd``: a case spec, two input formulas, and the named grids.

A :class:`CaseSpec` fixes every size, branch flag, dtype, seed and the input formula. :func:`make_inputs` turns it
into the 17 tensors of the API (by name, ``None`` for absent optional inputs) plus ``chunk_size`` and
``rotary_dim_divisor``. Inputs are always drawn on the CPU from a ``torch.Generator`` seeded with ``spec.seed`` and
only then moved to the requested device, so the bits do not depend on the target device.

Every draw is machine-independent: normals, uniforms and the softplus of the realistic formula come from
:mod:`mimo_numerics.exact_random` (the generator's bits, integer arithmetic and correctly rounded IEEE operations
only; no vectorised transcendental, no BLAS), so the inputs of a spec are the same bits on every CPU model, thread
count and torch build (``tests/test_case_digests.py`` pins them). Low-precision tensors are float32 draws rounded
to lp.

Formulas:

* ``"seed"``: the distributions, shapes, scalings and draw order of the seed PR's unit test (``_make_inputs`` in
  ``tests/unit_tests/triton/test_mamba_mimo_bwd_fwd.py`` of MindSpeed-Ops PR 125). Its draws are not torch's, so
  the values differ from the seed test's (and from the stored golden inputs, which were drawn with ``torch.randn``
  under torch 2.11 and are kept as stored tensors: ``docs/golden_data.md``). It draws ``da_cs``, ``da_cs_rev`` and
  ``segsum`` independently (not consistent with one another, may be positive), and ``k_bias`` is unscaled while
  ``q_bias`` is ``/ 8``, as the seed test does.
* ``"realistic"``: the upstream test's formula (``upstream_rounding_sites.md`` §4), with ``da_cs``, ``da_cs_rev``
  and ``segsum`` derived from one ``dA`` as ``compute_dacs_segsum_triton`` does. See :func:`make_inputs`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Union

import torch

from . import exact_random
from .outputs import INPUT_NAMES

FORMULAS = ("seed", "realistic")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_TAGS = {"bfloat16": "bf16", "float16": "fp16"}
_ROTARY_DIVISORS = (2, 4)


@dataclass(frozen=True)
class CaseSpec:
    """One input configuration of ``mamba_mimo_bwd_fwd``.

    Attributes:
        batch, seqlen, heads, groups (int): B, S, H, G (``heads % groups == 0``).
        state_dim, value_dim, rank (int): N, P, R.
        chunk_size (int): C.
        reduce_o (bool): give ``mimo_o`` (reduced DOUT ``[B, S, H, P]``) or not (DOUT ``[B, S, R, H, P]``).
        has_z (bool): give ``z`` and ``mimo_z``.
        has_d (bool): give ``d``.
        formula (str): ``"seed"`` or ``"realistic"`` (module docstring).
        dtype (str): low-precision dtype of ``dout, q, k, v, z, trap``: ``"bfloat16"`` or ``"float16"``.
        seed (int): seed of the CPU ``torch.Generator`` the inputs are drawn from (>= 0).
        rotary_dim_divisor (int): 2 or 4; ``angles`` is ``[B, S, H, N / rotary_dim_divisor]``.

    Raises:
        ValueError: from ``__post_init__``, naming the offending field.
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

    def __post_init__(self):
        for name in ("batch", "seqlen", "heads", "groups", "state_dim", "value_dim", "rank", "chunk_size",
                     "seed", "rotary_dim_divisor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
            minimum = 0 if name == "seed" else 1
            if value < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {value}")
        for name in ("reduce_o", "has_z", "has_d"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
        if self.formula not in FORMULAS:
            raise ValueError(f"formula must be one of {FORMULAS}, got {self.formula!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.rotary_dim_divisor not in _ROTARY_DIVISORS:
            raise ValueError(f"rotary_dim_divisor must be one of {_ROTARY_DIVISORS}, got {self.rotary_dim_divisor}")
        if self.heads % self.groups:
            raise ValueError(f"heads ({self.heads}) must be a multiple of groups ({self.groups})")
        if self.state_dim % 2 or self.state_dim % self.rotary_dim_divisor:
            raise ValueError(f"state_dim ({self.state_dim}) must be even and divisible by rotary_dim_divisor "
                             f"({self.rotary_dim_divisor})")

    @property
    def nchunks(self) -> int:
        """ceil(S / C)."""
        return -(-self.seqlen // self.chunk_size)

    @property
    def lp_dtype(self) -> torch.dtype:
        """The torch dtype of the low-precision inputs."""
        return DTYPES[self.dtype]

    @property
    def case_id(self) -> str:
        """A readable id, unique per spec and usable as a pytest id.

        Example: ``seed_B1_S32_H1_G1_N64_P64_R4_C16_roZD_bf16_s123``. ``ro``/``fo`` is reduced/full DOUT, ``Z``/``-``
        and ``D``/``-`` the optional branches; ``_rd2`` is appended when ``rotary_dim_divisor`` is 2.
        """
        branches = ("ro" if self.reduce_o else "fo") + ("Z" if self.has_z else "-") + ("D" if self.has_d else "-")
        text = (f"{self.formula}_B{self.batch}_S{self.seqlen}_H{self.heads}_G{self.groups}_N{self.state_dim}"
                f"_P{self.value_dim}_R{self.rank}_C{self.chunk_size}_{branches}_{_DTYPE_TAGS[self.dtype]}"
                f"_s{self.seed}")
        if self.rotary_dim_divisor != 4:
            text += f"_rd{self.rotary_dim_divisor}"
        return text

    def replace(self, **changes) -> "CaseSpec":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields by name (plain Python values; JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CaseSpec":
        """Build a spec from :meth:`to_dict` output; missing fields take their defaults.

        Raises:
            ValueError: on unknown keys (named in the message) or invalid values.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown CaseSpec field(s) {unknown}; valid fields are {sorted(known)}")
        return cls(**data)


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


def _normal(shape, gen: torch.Generator) -> torch.Tensor:
    """Standard normal float32 draws, the same bits on every machine (:func:`exact_random.normal`)."""
    return exact_random.normal(shape, gen).to(torch.float32)


def _normal_lp(shape, gen: torch.Generator, lp: torch.dtype) -> torch.Tensor:
    """Standard normal draws rounded to ``lp`` (through float32, as a float32 draw cast to lp)."""
    return _normal(shape, gen).to(lp)


def _uniform(shape, gen: torch.Generator) -> torch.Tensor:
    """``U[0, 1)`` float64 draws on the 2**-24 grid (exact in float32; :func:`exact_random.uniform`)."""
    return exact_random.uniform(shape, gen)


def _seed_formula(spec: CaseSpec, gen: torch.Generator) -> dict:
    # The seed test's draw order, shapes and scalings, with machine-independent draws (module docstring).
    B, S, H, G, N, P, R, C = (spec.batch, spec.seqlen, spec.heads, spec.groups, spec.state_dim, spec.value_dim,
                              spec.rank, spec.chunk_size)
    lp = spec.lp_dtype
    f32 = torch.float32
    q = _normal_lp((B, S, R, G, N), gen, lp)
    k = _normal_lp(q.shape, gen, lp)
    v = _normal_lp((B, S, H, P), gen, lp)
    dout = _normal_lp((B, S, H, P) if spec.reduce_o else (B, S, R, H, P), gen, lp)
    q_bias = _normal((H, R, N), gen) / 8
    k_bias = _normal(q_bias.shape, gen)  # the seed test does not scale k_bias
    mimo_v = _normal((H, R, P), gen) / 4
    mimo_o = _normal((H, R, P), gen) / 4 if spec.reduce_o else None
    z = _normal_lp((B, S, H, P), gen, lp) if spec.has_z else None
    mimo_z = _normal((H, R, P), gen) / 4 if spec.has_z else None
    angles = _uniform((B, S, H, N // spec.rotary_dim_divisor), gen).to(f32)
    da_cs = _normal((B, H, S), gen) / 8
    da_cs_rev = _normal(da_cs.shape, gen) / 8
    dt = (_uniform(da_cs.shape, gen) / 10 + 0.05).to(f32)
    trap = _normal_lp((B, H, S), gen, lp)
    d = _normal((H,), gen) / 8 if spec.has_d else None
    segsum = _normal((B, H, spec.nchunks, C, C), gen) / 8
    return dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v, mimo_o=mimo_o, z=z,
                mimo_z=mimo_z, angles=angles, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt, trap=trap, d=d,
                segsum=segsum)


def chunk_cumsums(da: torch.Tensor, chunk_size: int):
    """``da_cs``, ``da_cs_rev`` and ``segsum`` of a per-step log decay ``dA``, as ``compute_dacs_segsum_triton``.

    Sums are formed in float64 from the float32 ``dA``, one addition per step in token order (so the bits do not
    depend on a library's summation order), rounded once to float32, then clipped to ``<= 0``. Steps past S (padding
    of the last chunk) count as ``dA = 0``.

    Args:
        da (Tensor): ``[B, H, S]`` float32, ``dA <= 0``.
        chunk_size (int): C.

    Returns:
        tuple: ``da_cs [B, H, S]`` (inclusive within-chunk cumsum), ``da_cs_rev [B, H, S]`` (exclusive reverse
        within-chunk cumsum, ``sum_{k > t in the chunk} dA_k``), ``segsum [B, H, nc, C, C]``
        (``sum_{k=j+1..i} dA_{cC+k}`` for ``i > j``, else 0), all float32.
    """
    B, H, S = da.shape
    C = chunk_size
    nc = -(-S // C)
    padded = torch.zeros((B, H, nc * C), dtype=torch.float64)
    padded[..., :S] = da.to(torch.float64)
    blocks = padded.view(B, H, nc, C)
    # running sums one step at a time (a fixed order of IEEE additions, not a library cumsum)
    incl = torch.empty_like(blocks)
    rev_excl = torch.empty_like(blocks)
    incl[..., 0] = blocks[..., 0]
    rev_excl[..., C - 1] = 0.0
    for t in range(1, C):
        incl[..., t] = incl[..., t - 1] + blocks[..., t]
        rev_excl[..., C - 1 - t] = rev_excl[..., C - t] + blocks[..., C - t]
    diff = incl[..., :, None] - incl[..., None, :]  # [.., i, j] = sum_{k=j+1..i} dA for i > j
    lower = torch.ones((C, C), dtype=torch.bool).tril(diagonal=-1)
    segsum = torch.where(lower, diff, torch.zeros((), dtype=torch.float64))

    def finish(x):
        return x.to(torch.float32).clamp(max=0.0)

    da_cs = finish(incl.reshape(B, H, nc * C)[..., :S])
    da_cs_rev = finish(rev_excl.reshape(B, H, nc * C)[..., :S])
    return da_cs.contiguous(), da_cs_rev.contiguous(), finish(segsum).contiguous()


def _realistic_formula(spec: CaseSpec, gen: torch.Generator) -> dict:
    # Core tensors first, optional ones last, so that toggling a branch leaves the core tensors unchanged.
    B, S, H, G, N, P, R, C = (spec.batch, spec.seqlen, spec.heads, spec.groups, spec.state_dim, spec.value_dim,
                              spec.rank, spec.chunk_size)
    lp = spec.lp_dtype
    f32 = torch.float32
    q = _normal_lp((B, S, R, G, N), gen, lp)
    k = _normal_lp((B, S, R, G, N), gen, lp)
    v = _normal_lp((B, S, H, P), gen, lp)
    q_bias = _normal((H, R, N), gen) / 8
    k_bias = _normal((H, R, N), gen) / 8
    mimo_v = _normal((H, R, P), gen) / 4
    angles = (_uniform((B, S, H, N // spec.rotary_dim_divisor), gen) * (2 * math.pi)).to(f32)
    dt = exact_random.softplus(_normal((B, H, S), gen).to(torch.float64) - 3.0).to(f32)
    da = -dt * _uniform((B, H, S), gen).to(f32)
    trap = _uniform((B, H, S), gen).to(f32).to(lp)
    dout = _normal_lp((B, S, H, P) if spec.reduce_o else (B, S, R, H, P), gen, lp)
    mimo_o = _normal((H, R, P), gen) / 4 if spec.reduce_o else None
    z = _normal_lp((B, S, H, P), gen, lp) if spec.has_z else None
    mimo_z = _normal((H, R, P), gen) / 4 if spec.has_z else None
    d = _normal((H,), gen) / 8 if spec.has_d else None
    da_cs, da_cs_rev, segsum = chunk_cumsums(da, C)
    return dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v, mimo_o=mimo_o, z=z,
                mimo_z=mimo_z, angles=angles, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt, trap=trap, d=d,
                segsum=segsum)


def make_inputs(spec: CaseSpec, device: Union[str, torch.device] = "cpu") -> dict:
    """The inputs of one case, drawn on the CPU from ``torch.Generator().manual_seed(spec.seed)``.

    "randn" and "U[0, 1)" below are the machine-independent draws of :mod:`mimo_numerics.exact_random` (Box-Muller
    normals, uniforms on the 2**-24 grid); "lp" tensors are float32 draws rounded to lp.

    ``"seed"`` formula (seed PR test, draw order as listed): q, k ``randn`` lp ``[B, S, R, G, N]``; v ``randn`` lp
    ``[B, S, H, P]``; dout ``randn`` lp (``[B, S, H, P]`` reduced, else ``[B, S, R, H, P]``); q_bias ``randn / 8``
    fp32 ``[H, R, N]``; k_bias ``randn`` (unscaled); mimo_v ``randn / 4`` ``[H, R, P]``; mimo_o ``randn / 4`` if
    reduce_o; z ``randn`` lp if has_z; mimo_z ``randn / 4`` if has_z; angles ``U[0, 1)`` ``[B, S, H, N / d]``;
    da_cs, da_cs_rev ``randn / 8`` ``[B, H, S]``; dt ``U[0, 1) / 10 + 0.05``; trap ``randn`` lp; d ``randn / 8``
    ``[H]`` if has_d; segsum ``randn / 8`` ``[B, H, nc, C, C]``.

    ``"realistic"`` formula (upstream test, §4 of ``upstream_rounding_sites.md``), draw order as listed: q, k, v
    ``randn`` lp; q_bias, k_bias ``randn / 8`` fp32; mimo_v ``randn / 4``; angles ``U[0, 1)·2π`` fp32 (the upstream test uses ``U[0, 1)``; the full circle exercises every
    rotation quadrant); dt ``softplus(randn - 3)`` fp32 ``[B, H, S]`` (softplus in float64 by
    ``exact_random.softplus``, rounded once); ``dA = -dt·U[0, 1)``; trap ``U[0, 1)``
    rounded to lp (so 1.0 can occur); then the optional ones: dout ``randn`` lp; mimo_o ``randn / 4``; z ``randn``
    lp; mimo_z ``randn / 4``; d ``randn / 8`` (projection scale 1/4 and
    bias/D scale 1/8 as in the seed formula: the upstream test's own weights come from its module, not a formula).
    da_cs, da_cs_rev, segsum follow from dA by :func:`chunk_cumsums`. Because the optional tensors are drawn last,
    toggling ``has_z``/``has_d``/``reduce_o`` does not change q, k, v, the weights, angles, dt, dA or trap.

    Args:
        spec (CaseSpec): the case.
        device (str | torch.device): where the tensors end up.

    Returns:
        dict: the 17 tensors by name (``INPUT_NAMES``; ``None`` for absent optional inputs), plus ``chunk_size`` and
        ``rotary_dim_divisor`` (ints).
    """
    if not isinstance(spec, CaseSpec):
        raise TypeError(f"spec must be a CaseSpec, got {type(spec).__name__}")
    if isinstance(spec, StoredCase):
        return {name: (value.clone().to(device) if isinstance(value, torch.Tensor) else value)
                for name, value in spec.inputs.items()}
    gen = torch.Generator().manual_seed(spec.seed)
    tensors = _seed_formula(spec, gen) if spec.formula == "seed" else _realistic_formula(spec, gen)
    inputs = {name: (None if tensors[name] is None else tensors[name].contiguous().to(device))
              for name in INPUT_NAMES}
    inputs["chunk_size"] = spec.chunk_size
    inputs["rotary_dim_divisor"] = spec.rotary_dim_divisor
    return inputs


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


def as_args(inputs: dict) -> tuple:
    """The 17 tensors of ``inputs`` in API order (``INPUT_NAMES``), for ``fn(*as_args(x), **as_kwargs(x))``."""
    return tuple(inputs[name] for name in INPUT_NAMES)


def as_kwargs(inputs: dict) -> dict:
    """``{"chunk_size": ..., "rotary_dim_divisor": ...}`` of ``inputs``."""
    return {"chunk_size": inputs["chunk_size"], "rotary_dim_divisor": inputs["rotary_dim_divisor"]}


def _seed_case(**kw) -> CaseSpec:
    return CaseSpec(formula="seed", **kw)


def _realistic_case(**kw) -> CaseSpec:
    return CaseSpec(formula="realistic", **kw)


_SMOKE = (
    _seed_case(seqlen=16, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True),
    _realistic_case(seqlen=20, heads=2, state_dim=32, value_dim=16, rank=2, chunk_size=8, reduce_o=False,
                    has_z=True),
    _seed_case(seqlen=12, state_dim=16, value_dim=16, rank=1, chunk_size=4, has_d=True, dtype="float16",
               rotary_dim_divisor=2),
)

# The first six have the shapes and branches of golden cases of the seed PR (tests/data/upstream_h200_seed_cases.pt
# holds those cases' own inputs and upstream outputs). Together the ten cover all eight (reduce_o, has_z, has_d)
# combinations.
_GATE = (
    _seed_case(),                                                          # ro-- (as golden seed_branch_ro1_z0_d0)
    _seed_case(has_z=True, has_d=True),                                    # roZD (as golden seed_branch_ro1_z1_d1)
    _seed_case(reduce_o=False, has_d=True),                                # fo-D (as golden seed_branch_ro0_z0_d1)
    _seed_case(reduce_o=False, has_z=True),                                # foZ- (as golden seed_branch_ro0_z1_d0)
    _seed_case(heads=2, groups=1, has_z=True, has_d=True),                 # GQA (as golden seed_gqa)
    _seed_case(batch=2, heads=4, groups=2, seqlen=20, has_z=True, has_d=True),  # B>1, GQA, tail (golden shape)
    _seed_case(seqlen=13, rank=3, chunk_size=6, has_z=True),               # roZ-, C·R = 18, tail
    _realistic_case(batch=2, seqlen=40, heads=2, groups=1, state_dim=32, value_dim=32, rank=2, chunk_size=8,
                    reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2),  # foZD, realistic
    _seed_case(seqlen=35, heads=2, groups=2, has_d=True, dtype="float16"),  # ro-D, fp16, tail
    _seed_case(seqlen=20, state_dim=32, value_dim=32, rank=1, chunk_size=8, reduce_o=False),  # fo--, R=1, tail
)

_SWEEP = (
    _realistic_case(batch=2, seqlen=256, heads=2, rank=4, chunk_size=16, has_z=True, has_d=True),
    _realistic_case(seqlen=2048, rank=4, chunk_size=16, has_z=True, has_d=True),
    _realistic_case(seqlen=1024, state_dim=128, rank=4, chunk_size=16, has_z=True, has_d=True),
    _realistic_case(seqlen=512, heads=2, rank=2, chunk_size=32, reduce_o=False, has_z=True),
    _realistic_case(seqlen=1000, heads=2, state_dim=128, value_dim=128, rank=4, chunk_size=16, has_z=True,
                    has_d=True, dtype="float16"),
    _realistic_case(seqlen=1024, rank=1, chunk_size=64, has_z=True, has_d=True),
)

#: Named grids of cases: ``smoke`` (tiny, seconds), ``gate`` (small, every branch and shape feature), ``sweep``
#: (long realistic sequences; mark tests that use it ``slow``).
GRIDS = {"smoke": _SMOKE, "gate": _GATE, "sweep": _SWEEP}


def grids() -> dict:
    """``{grid name: cases}`` (:data:`GRIDS`)."""
    return dict(GRIDS)


def grid_names() -> tuple:
    """Names of the grids in :data:`GRIDS`."""
    return tuple(GRIDS)


def grid(name: str) -> tuple:
    """The cases of grid ``name``.

    Raises:
        ValueError: for an unknown name (the message lists the valid ones).
    """
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; valid grids are {list(GRIDS)}")
    return GRIDS[name]


def case_id(spec: CaseSpec) -> str:
    """``spec.case_id``, for ``pytest.mark.parametrize(..., ids=case_id)``."""
    return spec.case_id
