"""Upstream's ``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd``: ``mamba_mimo_forward`` (``mimo_numerics.compat``)."""

from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor

from mimo_numerics import compat
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd as _forward_reference


def mamba_mimo_forward(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, D, mimo_z, angles, dA_cs, dA_cs_rev, dt, trap,
                       segsum, chunk_size, rotary_dim_divisor, dtype, return_state: bool = False, threads: int = 128,
                       num_stages: int = 0, *, policy=None) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """Upstream's forward kernel call under ``policy`` (default ``compat.default_policy()``).

    Args: upstream's, in its order (``mimo_numerics.ops.mamba_mimo_fwd.reference.mamba_mimo_fwd`` has the shapes);
    ``dtype`` a ``torch.dtype`` or its name, equal to ``q``'s; ``threads``, ``num_stages`` ignored (launch knobs).

    Returns:
        tuple: upstream's ``(o, final_state, final_k)``: ``o`` as upstream; with ``return_state`` the state after
        the last chunk ``[B, H, N, P]`` (fp32) and the last token's rotated k ``[B, R, H, N]`` (lp), else None, None.
    """
    del threads, num_stages  # launch knobs of upstream's TileLang kernel: nothing to compute differently
    compat.check_dtype(dtype, q.dtype)
    policy = compat.policy_for(policy, q)
    args = (q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, D, mimo_z, angles, dA_cs, dA_cs_rev, dt, trap, segsum)
    if compat.default_backend() == "triton":
        from mimo_numerics import kernels

        forward = kernels.mamba_mimo_fwd
    else:
        forward = _forward_reference
    out = forward(*args, chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor, policy=policy,
                  return_state=bool(return_state))
    if return_state:
        return out.o, out.final_state, out.final_k
    return out.o, None, None
