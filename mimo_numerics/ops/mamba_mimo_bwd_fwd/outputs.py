"""The named tuple every implementation of ``mamba_mimo_bwd_fwd`` returns, and the input names in API order."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

#: The 17 tensor arguments of ``mamba_mimo_bwd_fwd``, in call order.
INPUT_NAMES = (
    "dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "mimo_z",
    "angles", "da_cs", "da_cs_rev", "dt", "trap", "d", "segsum",
)
#: Arguments that may be None.
OPTIONAL_INPUTS = ("mimo_o", "z", "mimo_z", "d")
#: The five outputs, in tuple order.
OUTPUT_NAMES = ("dmimo_o", "states", "dz", "dmimo_z", "qk_dot")


class MimoBwdFwdOutputs(NamedTuple):
    """Outputs of stage 1 of the Mamba-3 MIMO backward pass.

    Index by position (``out[0]``), attribute (``out.dz``) or name (``out["dz"]``).

    Attributes:
        dmimo_o (Tensor | None): ``[B, H, R, P]`` per-batch gradient of MIMO_O (reduced DOUT only).
        states (Tensor): ``[B, H, nchunks, N, P]`` recurrent state at the start of every chunk.
        dz (Tensor | None): ``[B, S, H, P]`` gradient of z (Z branch only).
        dmimo_z (Tensor | None): ``[B, H, R, P]`` per-batch gradient of MIMO_Z (Z branch only).
        qk_dot (Tensor): ``[B, H, S, R, R]`` same-step dot products of the biased, unrotated q and k.
    """

    dmimo_o: Optional[torch.Tensor]
    states: torch.Tensor
    dz: Optional[torch.Tensor]
    dmimo_z: Optional[torch.Tensor]
    qk_dot: torch.Tensor

    def __getitem__(self, key):
        """``out[0]`` or ``out["dz"]``: by position or by output name."""
        from ...operator import output_item

        return output_item(self, key)

    def as_dict(self) -> dict:
        """The outputs by name (None where a branch is off)."""
        return dict(zip(OUTPUT_NAMES, self))
