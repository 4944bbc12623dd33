"""Drawn inputs of the whole Mamba-3 MIMO op (``mamba3_mimo``), for tests and measurement scripts.

The formula is the one of the golden whole-op data (``upstream_h200_full_op_cases.pt``, its README: "realistic"):
Q, K, V ~ N(0, 1) in the lp dtype; Q_bias, K_bias ~ N(0, 1); MIMO_V ~ N(0, 1)/R; MIMO_Z ~ N(0, 1) (with Z);
MIMO_Out ~ N(0, 1)/R (reduced); D ~ N(0, 1); Z ~ N(0, 1) in lp; DT = softplus(-3 + N(0, 1)); ADT = -DT·(U[0, 1) +
0.5); Trap ~ N(0, 1) in lp; Angles = 2·U[0, 1); dout ~ N(0, 1) in lp. ``positive_adt=True`` draws ADT = DT·(U[0, 1)
- 0.6) instead, so that some chunk sums are positive and upstream's clamp to <= 0 is active. The draw order is fixed
and every tensor comes from one CPU ``torch.Generator`` seeded with ``seed``, so a case is reproducible on any
machine; it is not bit-identical to the golden draw (which interleaves the optional tensors differently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from .fp64_model import INPUT_NAMES


@dataclass(frozen=True)
class FullOpCase:
    """Shape and branches of one drawn case (dimension letters as upstream: B, S, H, G, N, P, R, C)."""

    batch: int = 1
    seqlen: int = 32
    heads: int = 2
    groups: int = 1
    state_dim: int = 32
    value_dim: int = 16
    rank: int = 2
    chunk_size: int = 8
    rotary_dim_divisor: int = 4
    reduce_o: bool = True
    has_z: bool = True
    has_d: bool = True
    positive_adt: bool = False
    lp_dtype: torch.dtype = torch.bfloat16
    seed: int = 0


def case_id(case: FullOpCase) -> str:
    """A short readable id, e.g. ``B1_S32_H2_G1_N32_P16_R2_C8_ro1_z1_d1_s0``."""
    flags = f"ro{int(case.reduce_o)}_z{int(case.has_z)}_d{int(case.has_d)}"
    extra = ("_div2" if case.rotary_dim_divisor == 2 else "") + ("_adtpos" if case.positive_adt else "")
    return (f"B{case.batch}_S{case.seqlen}_H{case.heads}_G{case.groups}_N{case.state_dim}_P{case.value_dim}_"
            f"R{case.rank}_C{case.chunk_size}_{flags}{extra}_s{case.seed}")


def make_inputs(case: FullOpCase, device="cpu") -> Dict[str, Optional[torch.Tensor]]:
    """The 14 inputs of ``mamba3_mimo`` by name (absent optional ones None), plus ``dout``.

    Returns:
        dict: ``INPUT_NAMES`` -> Tensor | None (upstream's dtypes: lp activations, float32 parameters) and
        ``"dout"``: ``[B, S, H, P]`` (reduced) or ``[B, S, R, H, P]`` in lp, all on ``device``.
    """
    B, S, H, G, N, P, R = (case.batch, case.seqlen, case.heads, case.groups, case.state_dim, case.value_dim,
                           case.rank)
    gen = torch.Generator().manual_seed(case.seed)
    lp = case.lp_dtype

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float32)

    x = {"Q": randn(B, S, R, G, N).to(lp), "K": randn(B, S, R, G, N).to(lp), "V": randn(B, S, H, P).to(lp),
         "Q_bias": randn(H, R, N), "K_bias": randn(H, R, N), "MIMO_V": randn(H, R, P) / R}
    x["MIMO_Z"] = randn(H, R, P) if case.has_z else None
    x["MIMO_Out"] = randn(H, R, P) / R if case.reduce_o else None
    x["D"] = randn(H) if case.has_d else None
    x["Z"] = randn(B, S, H, P).to(lp) if case.has_z else None
    x["DT"] = torch.nn.functional.softplus(-3.0 + randn(B, H, S))
    x["ADT"] = x["DT"] * (rand(B, H, S) - 0.6) if case.positive_adt else -x["DT"] * (rand(B, H, S) + 0.5)
    x["Trap"] = randn(B, H, S).to(lp)
    x["Angles"] = 2.0 * rand(B, S, H, N // case.rotary_dim_divisor)
    x["dout"] = (randn(B, S, H, P) if case.reduce_o else randn(B, S, R, H, P)).to(lp)
    ordered = {name: x[name] for name in INPUT_NAMES}
    ordered["dout"] = x["dout"]
    return {name: (None if t is None else t.to(device)) for name, t in ordered.items()}


#: Drawn cases on which the forward oracle and the FP64 model are compared: every branch (reduced or not, Z, D),
#: GQA with G = 1 < H, 1 < G < H and G = H, tails (S % C != 0), R in {1, 2, 4, 8}, N in {32, 64}, both rotary
#: divisors, fp16 activations, S = 1, and positive ADT (the clamp active).
ORACLE_GRID = (
    FullOpCase(),
    FullOpCase(batch=2, seqlen=20, heads=4, groups=1, state_dim=64, rank=4, has_d=False, seed=1),
    FullOpCase(seqlen=24, heads=2, groups=2, value_dim=8, rank=8, chunk_size=4, reduce_o=False, seed=2),
    FullOpCase(seqlen=13, heads=3, groups=3, state_dim=64, value_dim=8, rank=1, chunk_size=4, reduce_o=False,
               has_z=False, has_d=False, seed=3),
    FullOpCase(seqlen=19, heads=4, groups=2, value_dim=8, has_z=False, seed=4),
    FullOpCase(seqlen=16, value_dim=8, rank=4, chunk_size=16, rotary_dim_divisor=2, seed=5),
    FullOpCase(batch=2, seqlen=21, value_dim=8, chunk_size=4, positive_adt=True, seed=6),
    FullOpCase(seqlen=1, heads=1, value_dim=8, chunk_size=4, seed=7),
    FullOpCase(seqlen=40, state_dim=64, rank=4, chunk_size=16, has_z=False, has_d=False, seed=8),
    FullOpCase(seqlen=17, groups=2, value_dim=8, reduce_o=False, has_d=False, lp_dtype=torch.float16, seed=9),
)
