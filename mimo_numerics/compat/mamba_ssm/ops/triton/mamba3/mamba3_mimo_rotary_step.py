"""Upstream's ``mamba_ssm.ops.triton.mamba3.mamba3_mimo_rotary_step``: ``apply_rotary_qk_inference_fwd``, the first
kernel of upstream's decode step (``mimo_numerics.compat``; the policy step is ``ops/mamba3_mimo/decode.py``)."""

from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor

from mimo_numerics import compat
from mimo_numerics.ops.mamba3_mimo.decode import rotary_step


def apply_rotary_qk_inference_fwd(q: Tensor, k: Tensor, angle_state: Tensor, angle_proj: Tensor, dt: Tensor,
                                  bias_q: Optional[Tensor] = None, bias_k: Optional[Tensor] = None,
                                  inplace: bool = False, conjugate: bool = False, rotate_pairwise: bool = True, *,
                                  policy=None) -> Tuple[Tensor, Tensor, Tensor]:
    """Upstream's rotary step under ``policy`` (default ``compat.default_policy()``).

    Args: upstream's: q, k ``[B, R, H, D]``; angle_state, angle_proj ``[B, H, K]``; dt ``[B, H]``; bias_q,
    bias_k ``[R, H, D]``; ``inplace`` writes the results into q, k and angle_state; ``conjugate`` rotates by -θ;
    ``rotate_pairwise`` (upstream's default True) pairs ``(2a, 2a+1)``, False pairs ``(a, D/2 + a)`` (Mamba-3 MIMO).

    Returns:
        tuple: ``(q_out, k_out, angle_state_out)``: the rotated q, k in q's dtype (the policy's ``round_outputs``
        site) and the new angle state in float32, not reduced mod 2π, as upstream's; under the ``fp64`` policy all
        three in float64 (``docs/compat.md``). With ``inplace`` the three input tensors, written.
    """
    policy = compat.policy_for(policy, q)
    q_out, k_out, theta = rotary_step(q, k, angle_state, angle_proj, dt, bias_q, bias_k, conjugate=conjugate,
                                      rotate_pairwise=rotate_pairwise, policy=policy)
    if inplace:
        q.copy_(q_out)
        k.copy_(k_out)
        angle_state.copy_(theta)
        return q, k, angle_state
    return q_out, k_out, theta
