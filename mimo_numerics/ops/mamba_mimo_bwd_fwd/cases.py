"""Cases of backward stage 1, ``mamba_mimo_bwd_fwd``: its two input formulas and the named grids.

:func:`make_inputs` turns a :class:`~mimo_numerics.cases.CaseSpec` into the 17 tensors of the API (by name, ``None``
for absent optional inputs) plus ``chunk_size`` and ``rotary_dim_divisor``. Inputs are always drawn on the CPU
from a ``torch.Generator`` seeded with ``spec.seed`` and only then moved to the requested device, so the bits do
not depend on the target device; every draw is machine-independent (:mod:`mimo_numerics.cases`). The forward and
stage 2 derive their inputs and grids from these.

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

import math
from typing import Union

import torch

from ... import exact_random
from ...cases import CaseSpec, StoredCase, normal, normal_lp, uniform
from .outputs import INPUT_NAMES


def _seed_formula(spec: CaseSpec, gen: torch.Generator) -> dict:
    # The seed test's draw order, shapes and scalings, with machine-independent draws (module docstring).
    B, S, H, G, N, P, R, C = (spec.batch, spec.seqlen, spec.heads, spec.groups, spec.state_dim, spec.value_dim,
                              spec.rank, spec.chunk_size)
    lp = spec.lp_dtype
    f32 = torch.float32
    q = normal_lp((B, S, R, G, N), gen, lp)
    k = normal_lp(q.shape, gen, lp)
    v = normal_lp((B, S, H, P), gen, lp)
    dout = normal_lp((B, S, H, P) if spec.reduce_o else (B, S, R, H, P), gen, lp)
    q_bias = normal((H, R, N), gen) / 8
    k_bias = normal(q_bias.shape, gen)  # the seed test does not scale k_bias
    mimo_v = normal((H, R, P), gen) / 4
    mimo_o = normal((H, R, P), gen) / 4 if spec.reduce_o else None
    z = normal_lp((B, S, H, P), gen, lp) if spec.has_z else None
    mimo_z = normal((H, R, P), gen) / 4 if spec.has_z else None
    angles = uniform((B, S, H, N // spec.rotary_dim_divisor), gen).to(f32)
    da_cs = normal((B, H, S), gen) / 8
    da_cs_rev = normal(da_cs.shape, gen) / 8
    dt = (uniform(da_cs.shape, gen) / 10 + 0.05).to(f32)
    trap = normal_lp((B, H, S), gen, lp)
    d = normal((H,), gen) / 8 if spec.has_d else None
    segsum = normal((B, H, spec.nchunks, C, C), gen) / 8
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
    q = normal_lp((B, S, R, G, N), gen, lp)
    k = normal_lp((B, S, R, G, N), gen, lp)
    v = normal_lp((B, S, H, P), gen, lp)
    q_bias = normal((H, R, N), gen) / 8
    k_bias = normal((H, R, N), gen) / 8
    mimo_v = normal((H, R, P), gen) / 4
    angles = (uniform((B, S, H, N // spec.rotary_dim_divisor), gen) * (2 * math.pi)).to(f32)
    dt = exact_random.softplus(normal((B, H, S), gen).to(torch.float64) - 3.0).to(f32)
    da = -dt * uniform((B, H, S), gen).to(f32)
    trap = uniform((B, H, S), gen).to(f32).to(lp)
    dout = normal_lp((B, S, H, P) if spec.reduce_o else (B, S, R, H, P), gen, lp)
    mimo_o = normal((H, R, P), gen) / 4 if spec.reduce_o else None
    z = normal_lp((B, S, H, P), gen, lp) if spec.has_z else None
    mimo_z = normal((H, R, P), gen) / 4 if spec.has_z else None
    d = normal((H,), gen) / 8 if spec.has_d else None
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


