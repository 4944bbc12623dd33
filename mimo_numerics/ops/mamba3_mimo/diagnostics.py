"""Diagnostics of the whole-op gradients: the terms of ``dD`` (a sum with heavy cancellation).

``D`` enters the op as ``o += D[h]·ΨV`` before the gate, so ``dD[h] = Σ_{b, t, r, p} G[b, t, h, r, p] ·
ΨV[b, t, h, r, p]`` with ``G = ∂loss/∂o`` = ``dout ⊙ MIMO_Out ⊙ gate`` (reduced output) or ``dout ⊙ gate``, ``gate =
silu(Z ⊙ MIMO_Z)`` (1 without Z), ``ΨV = V ⊙ MIMO_V``. The terms have both signs and their absolute values sum to
hundreds of times ``|dD|``, so ``dD``'s relative error says little; its error relative to ``Σ |terms|`` does.
"""

from __future__ import annotations

from typing import Optional

import torch

_F64 = torch.float64


def d_skip_terms(dout: torch.Tensor, V: torch.Tensor, MIMO_V: torch.Tensor, MIMO_Z: Optional[torch.Tensor],
                 MIMO_Out: Optional[torch.Tensor], Z: Optional[torch.Tensor]) -> torch.Tensor:
    """The terms ``G · ΨV`` whose sum over (b, t, r, p) is ``dD[h]``, in float64.

    Args:
        dout (Tensor): ``[B, S, H, P]`` with ``MIMO_Out``, else ``[B, S, R, H, P]``.
        V (Tensor): ``[B, S, H, P]``. MIMO_V (Tensor): ``[H, R, P]``. MIMO_Z (Tensor | None): ``[H, R, P]``.
        MIMO_Out (Tensor | None): ``[H, R, P]``. Z (Tensor | None): ``[B, S, H, P]``.

    Returns:
        Tensor: ``[B, S, R, H, P]`` float64.
    """
    psi_v = V.to(_F64)[:, :, None] * MIMO_V.to(_F64).permute(1, 0, 2)[None, None]  # [B, S, R, H, P]
    if MIMO_Out is not None:
        grad_o = dout.to(_F64)[:, :, None] * MIMO_Out.to(_F64).permute(1, 0, 2)[None, None]
    else:
        grad_o = dout.to(_F64)
    if Z is not None:
        x = Z.to(_F64)[:, :, None] * MIMO_Z.to(_F64).permute(1, 0, 2)[None, None]
        grad_o = grad_o * (x * torch.sigmoid(x))
    return grad_o * psi_v
