"""The whole FP64 backward chain of ``mamba3_mimo`` and torch autograd of the FP64 forward, on raw inputs.

``fp64_chain``: FP64 preprocessing (``ops/mamba3_mimo/preprocess.py``) -> stage-1 FP64 oracle
(``mimo_numerics.oracle``) -> stage-2 FP64 oracle (``ops/mamba_mimo_bwd_bwd/oracle.py``) -> FP64 epilogue
(``ops/mamba3_mimo_epilogue/oracle.py``): upstream's backward with every step in float64.
``autograd_fp64``: the gradients of ``Σ dout · mamba3_mimo_fp64(...)`` (``ops/mamba3_mimo/fp64_model.py``).
Both live in the package (``mimo_numerics/ops/mamba3_mimo/chain.py``, used by ``mamba3_mimo(policy="fp64")``).
``draw_inputs``: raw inputs of one small case, in the golden file's names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs

_F64 = torch.float64


def fp64_pre(inputs: dict) -> dict:
    """Upstream's preprocessing in float64: ``angles_cumsum``, ``da_cs``, ``da_cs_rev``, ``segsum``."""
    return chain.preprocess(inputs, _F64)


#: The FP64 chain and autograd of the FP64 model, from the package (``mimo_numerics.ops.mamba3_mimo.chain``).
fp64_chain = chain.fp64_chain
autograd_fp64 = chain.autograd_fp64


@dataclass(frozen=True)
class ChainCase:
    """One drawn case of the chain test (sizes, branches, dtype, seed); ``seqlen`` = ``nchunks · chunk_size``."""

    rank: int
    state_dim: int
    dtype: str
    reduce_o: bool
    has_z: bool
    has_d: bool
    heads: int = 2
    groups: int = 1
    batch: int = 1
    chunk_size: int = 4
    nchunks: int = 3
    value_dim: int = 8
    rotary_dim_divisor: int = 4
    seed: int = 0
    positive_adt: bool = False

    @property
    def id(self) -> str:
        flags = "".join(f for f, on in (("o", self.reduce_o), ("z", self.has_z), ("d", self.has_d)) if on) or "plain"
        return (f"B{self.batch}_H{self.heads}_G{self.groups}_N{self.state_dim}_R{self.rank}_C{self.chunk_size}"
                f"x{self.nchunks}_div{self.rotary_dim_divisor}_{flags}_{self.dtype}"
                + ("_posADT" if self.positive_adt else ""))


def draw_inputs(case: ChainCase) -> dict:
    """Raw inputs of ``mamba3_mimo`` and ``dout`` (golden names), drawn by the package's whole-op generator
    (``ops.mamba3_mimo.cases``, machine-independent): ``ADT <= 0`` (upstream's clamp never fires), or with
    ``positive_adt`` some positive ADT so that partial sums are positive."""
    spec = OpCaseSpec(batch=case.batch, seqlen=case.nchunks * case.chunk_size, heads=case.heads, groups=case.groups,
                      state_dim=case.state_dim, value_dim=case.value_dim, rank=case.rank,
                      chunk_size=case.chunk_size, reduce_o=case.reduce_o, has_z=case.has_z, has_d=case.has_d,
                      dtype=case.dtype, seed=case.seed, rotary_dim_divisor=case.rotary_dim_divisor,
                      positive_adt=case.positive_adt)
    return make_op_inputs(spec)


def positive_partial_sums(inputs: dict) -> bool:
    """Whether the sum of ADT over some run of tokens inside a chunk is positive: then upstream's clamp of
    ``da_cs``, ``da_cs_rev`` or ``segsum`` (each such a run) fires."""
    C = inputs["chunk_size"]
    B, H, S = inputs["ADT"].shape
    x = inputs["ADT"].double().reshape(B, H, S // C, C)
    return any(bool((x[..., i:j].sum(-1) > 0).any()) for i in range(C) for j in range(i + 1, C + 1))
