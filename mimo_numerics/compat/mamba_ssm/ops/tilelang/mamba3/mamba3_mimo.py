"""Upstream's ``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo``: the whole op, ``mamba3_mimo`` (``mimo_numerics.compat``).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from mimo_numerics import compat
from mimo_numerics.ops.mamba3_mimo.autograd import mamba3_mimo as _mamba3_mimo


def mamba3_mimo(Q: Tensor, K: Tensor, V: Tensor, ADT: Tensor, DT: Tensor, Trap: Tensor, Q_bias: Tensor,
                K_bias: Tensor, MIMO_V: Tensor, MIMO_Z: Optional[Tensor], MIMO_Out: Optional[Tensor], Angles: Tensor,
                D: Optional[Tensor], Z: Optional[Tensor], chunk_size: int, rotary_dim_divisor: int, dtype,
                return_state: bool = False, cu_seqlens: Optional[Tensor] = None, *, policy=None):
    """Upstream's ``mamba3_mimo`` (same arguments and returns) under ``policy`` (default
    ``compat.default_policy()``): ``mimo_numerics.mamba3_mimo``.

    Args:
        Q ... Z: upstream's 14 tensors (``mimo_numerics.mamba3_mimo``'s docstring has the shapes).
        chunk_size (int), rotary_dim_divisor (int): as upstream.
        dtype (torch.dtype | str): upstream's computation dtype; it must be ``Q``'s (its name is accepted too).
        return_state (bool): also ``(Final_Angle, Final_SSM_State, Final_K, Final_V)``.
        cu_seqlens: varlen, not implemented (``NotImplementedError``).
        policy: a ``RoundingPolicy``, a preset name or a policy JSON path.

    Returns:
        Tensor ``Out``, or with ``return_state`` upstream's 5-tuple.
    """
    dtype = compat.check_dtype(dtype, Q.dtype)
    return _mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                        chunk_size, rotary_dim_divisor, dtype, policy=compat.policy_for(policy, Q),
                        backend=compat.default_backend(), return_state=return_state, cu_seqlens=cu_seqlens)
