"""The policy's switches of one operator, applied to tensors: ``rnd(site, x)``."""

from __future__ import annotations

import torch

from ...rounding import round_to_lp


class SiteRounder:
    """Rounds a tensor to the policy's lp dtype where a switch of ``operator``'s section is on.

    ``rnd(site, x)`` rounds ``x`` when ``policy.<operator>.<site>`` is on and returns it unchanged otherwise;
    :meth:`always` rounds unconditionally, :meth:`carried` forms a rank sum carried in lp, :meth:`output` is an lp
    output store (``round_outputs``).

    Attributes:
        policy: the ``RoundingPolicy``. sites: its section of ``operator``. lp (str): the lp dtype name.
    """

    def __init__(self, policy, operator: str):
        self.policy = policy
        self.sites = policy.section(operator)
        self.lp = policy.lp_dtype

    def on(self, site: str) -> bool:
        """Whether switch ``site`` is on."""
        return getattr(self.sites, site)

    def __call__(self, site: str, x: torch.Tensor) -> torch.Tensor:
        return round_to_lp(x, self.lp) if getattr(self.sites, site) else x

    def always(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to lp."""
        return round_to_lp(x, self.lp)

    def carried(self, site: str, terms: torch.Tensor) -> torch.Tensor:
        """Σ over dim -2 in ascending order from 0; with ``site`` on the sum is carried in lp (one rounding a step)."""
        acc = self(site, terms[..., 0, :])  # rnd(0 + x) = rnd(x)
        for r in range(1, terms.shape[-2]):
            acc = self(site, acc + terms[..., r, :])
        return acc

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """An lp output store: rounded and cast to lp, or unrounded in the math dtype (``round_outputs=False``)."""
        if self.policy.round_outputs:
            return round_to_lp(x, self.lp).to(self.policy.lp_torch_dtype)
        return x
