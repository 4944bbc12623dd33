"""The references' GEMMs under the policy's ``gemm_model`` (plain FP32, or a tensor-core model).

``policy_matmul(policy)`` returns ``matmul(a, b, c=None)``: ``c + a @ b`` (``a @ b`` without ``c``, a cleared GEMM),
``[..., M, K] @ [..., K, N]``. Under ``gemm_model="fp32"`` it is torch's matmul (then an FP32 add of ``c``); under
a tensor-core model it is :func:`mimo_numerics.tensor_core.tensor_core_matmul`, adding in ascending k steps of the
model's depth *into* ``c`` (upstream's ``clear_accum=False``). Each operand's format (the exponent floor of the
model's alignment) is the policy's lp dtype when every value of the operand is on that grid (the kernel fed it from
an lp buffer) and FP32 otherwise (a policy with the operand's rounding site off).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ...rounding import round_to_lp
from ...tensor_core import tensor_core_matmul

Matmul = Callable[..., torch.Tensor]


def operand_format(x: torch.Tensor, lp_dtype: str) -> str:
    """``lp_dtype`` when every finite value of ``x`` is on its grid, else ``"float32"``."""
    finite = torch.isfinite(x)
    on_grid = bool(torch.all(~finite | (round_to_lp(x, lp_dtype) == x)))
    return lp_dtype if on_grid else "float32"


def plain_matmul(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``c + a @ b`` in the operands' dtype (torch's matmul, then one add)."""
    product = a @ b
    return product if c is None else c + product


def policy_matmul(policy) -> Matmul:
    """The GEMM of ``policy.gemm_model`` (see the module docstring)."""
    if policy.gemm_model == "fp32":
        return plain_matmul
    gemm_model, lp_dtype = policy.gemm_model, policy.lp_dtype

    def modelled(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None) -> torch.Tensor:
        return tensor_core_matmul(a, b, c, gemm_model, operand_format(a, lp_dtype), operand_format(b, lp_dtype))

    return modelled
