"""Cases of the whole op ``mamba3_mimo``: its 14 raw inputs and ``dout``, drawn the same on every machine.

:class:`OpCaseSpec` fixes the sizes, branches, dtype, seed and formula; :func:`make_op_inputs` draws the inputs of
``mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z, chunk_size,
rotary_dim_divisor)`` plus ``dout``, on the CPU, from ``torch.Generator().manual_seed(seed)``, with the
machine-independent draws of :mod:`mimo_numerics.exact_random` (the stage-1 formulas of :mod:`mimo_numerics.cases`
follow the same rule).

Formulas (the one of the whole-op golden data, ``tests/data/README.md``, under names of their own; its values
differ from the golden inputs, which were drawn with ``torch.randn`` and are stored, not regenerated):

* ``"whole_op"``: in this order, Q, K ``randn`` lp ``[B, S, R, G, N]``; V ``randn`` lp ``[B, S, H, P]``; Q_bias,
  K_bias ``randn`` ``[H, R, N]``; MIMO_V ``randn / R`` ``[H, R, P]``; MIMO_Z ``randn`` (Z); MIMO_Out ``randn / R``
  (reduced output); D ``randn`` ``[H]`` (D); Z ``randn`` lp ``[B, S, H, P]`` (Z); DT ``softplus(randn - 3)``
  ``[B, H, S]``; ADT ``-DT·(U[0, 1) + 0.5)``; Trap ``randn`` lp ``[B, H, S]``; Angles ``2·U[0, 1)``
  ``[B, S, H, N / d]``; dout ``randn`` lp (``[B, S, H, P]`` reduced, else ``[B, S, R, H, P]``).
* ``"whole_op_seed"``: the same draws with the seed test's scales: biases ``/ 8``, MIMO_V, MIMO_Z, MIMO_Out ``/ 4``,
  D ``/ 8``.

``positive_adt=True`` draws ADT ``= DT·(U[0, 1) - 0.6)`` instead, so that some chunk sums are positive and
upstream's clamp of the cumulative sums to ``<= 0`` acts (its backward ignores the clamp: ``docs/fp64_model.md``).

"randn" is :func:`exact_random.normal` rounded to float32 (then to lp for "lp" tensors), "U[0, 1)" is
:func:`exact_random.uniform`; softplus and the products are formed in float64 and rounded once to float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from ... import exact_random
from ...cases import CaseDims

FORMULAS = ("whole_op", "whole_op_seed")
#: The 14 inputs of ``mamba3_mimo`` in upstream's positional order.
OP_INPUT_NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out", "Angles",
                  "D", "Z")
#: The gradients of the 14 inputs, in the same order.
OP_GRAD_NAMES = tuple("d" + name for name in OP_INPUT_NAMES)


@dataclass(frozen=True)
class OpCaseSpec(CaseDims):
    """One input configuration of the whole op: the fields of :class:`~mimo_numerics.cases.CaseDims` with other
    defaults (S = 64, H = 2, Z and D given, seed 0), ``formula`` ``"whole_op"`` or ``"whole_op_seed"`` (module
    docstring), and:

    Attributes:
        positive_adt (bool): draw ADT > 0 (a stress case; every real use has ADT <= 0).

    Raises:
        ValueError: from ``__post_init__``, naming the offending field.
    """

    seqlen: int = 64
    heads: int = 2
    has_z: bool = True
    has_d: bool = True
    formula: str = "whole_op"
    seed: int = 0
    positive_adt: bool = False

    BOOL_FIELDS = ("reduce_o", "has_z", "has_d", "positive_adt")
    FORMULAS = FORMULAS

    @property
    def case_id(self) -> str:
        """A readable unique id, e.g. ``whole_op_B1_S64_H2_G1_N64_P64_R4_C16_roZD_bf16_s0``."""
        return self._id_text() + ("_adtpos" if self.positive_adt else "")


def _normal(shape, gen) -> torch.Tensor:
    return exact_random.normal(shape, gen).to(torch.float32)


def make_op_inputs(spec: OpCaseSpec, device: Union[str, torch.device] = "cpu") -> dict:
    """The 14 inputs of ``mamba3_mimo`` by name (None for absent optional ones), ``dout``, ``chunk_size`` and
    ``rotary_dim_divisor``, drawn as the module docstring says and then moved to ``device``."""
    if not isinstance(spec, OpCaseSpec):
        raise TypeError(f"spec must be an OpCaseSpec, got {type(spec).__name__}")
    gen = torch.Generator().manual_seed(spec.seed)
    B, S, H, G, N, P, R = (spec.batch, spec.seqlen, spec.heads, spec.groups, spec.state_dim, spec.value_dim,
                           spec.rank)
    lp = spec.lp_dtype
    seed_scales = spec.formula == "whole_op_seed"
    bias_scale = 8.0 if seed_scales else 1.0
    proj_scale = 4.0 if seed_scales else float(R)
    x = {}
    x["Q"] = _normal((B, S, R, G, N), gen).to(lp)
    x["K"] = _normal((B, S, R, G, N), gen).to(lp)
    x["V"] = _normal((B, S, H, P), gen).to(lp)
    x["Q_bias"] = _normal((H, R, N), gen) / bias_scale
    x["K_bias"] = _normal((H, R, N), gen) / bias_scale
    x["MIMO_V"] = _normal((H, R, P), gen) / proj_scale
    x["MIMO_Z"] = (_normal((H, R, P), gen) / (4.0 if seed_scales else 1.0)) if spec.has_z else None
    x["MIMO_Out"] = _normal((H, R, P), gen) / proj_scale if spec.reduce_o else None
    x["D"] = _normal((H,), gen) / (8.0 if seed_scales else 1.0) if spec.has_d else None
    x["Z"] = _normal((B, S, H, P), gen).to(lp) if spec.has_z else None
    dt = exact_random.softplus(_normal((B, H, S), gen).to(torch.float64) - 3.0)
    x["DT"] = dt.to(torch.float32)
    u = exact_random.uniform((B, H, S), gen)
    adt = x["DT"].to(torch.float64) * (u - 0.6) if spec.positive_adt else -x["DT"].to(torch.float64) * (u + 0.5)
    x["ADT"] = adt.to(torch.float32)
    x["Trap"] = _normal((B, H, S), gen).to(lp)
    x["Angles"] = (2.0 * exact_random.uniform((B, S, H, N // spec.rotary_dim_divisor), gen)).to(torch.float32)
    x["dout"] = _normal((B, S, H, P) if spec.reduce_o else (B, S, R, H, P), gen).to(lp)
    out = {name: (None if x[name] is None else x[name].contiguous().to(device)) for name in OP_INPUT_NAMES}
    out["dout"] = x["dout"].contiguous().to(device)
    out["chunk_size"] = spec.chunk_size
    out["rotary_dim_divisor"] = spec.rotary_dim_divisor
    return out


def case_id(spec: OpCaseSpec) -> str:
    """``spec.case_id``, for ``pytest.mark.parametrize(..., ids=case_id)``."""
    return spec.case_id


def small_case(**fields) -> OpCaseSpec:
    """A small case (S=32, N=32, P=16, R=2, C=8, H=2, every branch on) with ``fields`` changed."""
    base = dict(seqlen=32, state_dim=32, value_dim=16, rank=2, chunk_size=8)
    base.update(fields)
    return OpCaseSpec(**base)


#: Drawn cases on which the forward oracle and the FP64 model are compared: every branch (reduced or not, Z, D),
#: GQA with G = 1 < H, 1 < G < H and G = H, tails (S % C != 0), R in {1, 2, 4, 8}, N in {32, 64}, both rotary
#: divisors, fp16 activations, S = 1, and positive ADT (the clamp active).
ORACLE_GRID = (
    small_case(),
    small_case(batch=2, seqlen=20, heads=4, groups=1, state_dim=64, rank=4, has_d=False, seed=1),
    small_case(seqlen=24, heads=2, groups=2, value_dim=8, rank=8, chunk_size=4, reduce_o=False, seed=2),
    small_case(seqlen=13, heads=3, groups=3, state_dim=64, value_dim=8, rank=1, chunk_size=4, reduce_o=False,
               has_z=False, has_d=False, seed=3),
    small_case(seqlen=19, heads=4, groups=2, value_dim=8, has_z=False, seed=4),
    small_case(seqlen=16, value_dim=8, rank=4, chunk_size=16, rotary_dim_divisor=2, seed=5),
    small_case(batch=2, seqlen=21, value_dim=8, chunk_size=4, positive_adt=True, seed=6),
    small_case(seqlen=1, heads=1, value_dim=8, chunk_size=4, seed=7),
    small_case(seqlen=40, state_dim=64, rank=4, chunk_size=16, has_z=False, has_d=False, seed=8),
    small_case(seqlen=17, groups=2, value_dim=8, reduce_o=False, has_d=False, dtype="float16", seed=9),
)
