"""FP64 oracle of the chain after stage 2: upstream's definitions, evaluated in float64 by explicit sums.

Each output is written as a sum over the tokens it depends on, with 0/1 weight matrices for the ranges (no
cumulative-sum code, nothing shared with the FP32 reference), per chunk (``[C, C]`` and ``[C, C, C]`` matrices) and,
for the whole-sequence sum of the angles, a ``[nc, nc]`` matrix over the chunks' totals: memory linear in S. Per batch and head, token ``t`` in chunk ``c``:

* ``dQ``/``dK``: ``dq``/``dk`` summed over the heads of a group (G == 1: all heads; G == H: unchanged);
  ``dQ_bias``/``dK_bias[h, r, n] = Σ_{b, s} dq/dk[b, s, r, h, n]``; ``dMIMO_V``, ``dMIMO_Z``, ``dMIMO_Out``, ``dD``:
  sums over B.
* ``dgamma_t = dfactor_t + dgamma_diag_t``; ``ddt_core_t = σ(trap_t) dgamma_t + σ(-trap_t) dfactor_{t-1}``;
  ``dTrap_t = σ(trap_t) σ(-trap_t) dt_t (dgamma_t - dfactor_{t-1})`` (``dfactor_{-1} = 0``): from
  ``γ_t = dt_t σ(trap_t)`` and ``γ'_{t-1} = dt_t σ(-trap_t)``.
* ``dADT_t = ddA_t + Σ_{t' ∈ c, t' >= t} e^{da_cs[t']} ddA_cs[t'] + Σ_{t' ∈ c, t' < t} e^{da_cs_rev[t']}
  ddA_cs_rev[t'] + Σ_{j ∈ c, j >= t} Σ_{i ∈ c, i < t} e^{segsum[c, j, i]} dSSdA[c, i, j]``: from
  ``da_cs[t'] = Σ_{k ∈ c, k <= t'} ADT_k``, ``da_cs_rev[t'] = Σ_{k ∈ c, k > t'} ADT_k``,
  ``segsum[c, j, i] = Σ_{i < k <= j} ADT_k``, with stage 2's partial derivatives (``mimo_numerics.ops.
  mamba_mimo_bwd_bwd.oracle``). As upstream, no clamp indicator: the exponentials use the given (clamped) values.
* ``θ_{t,a} = Σ_{t' <= t} π tanh(Angles_{t',a}) DT_{t'}`` (mod 2π, derivative 1):
  ``dAngles_{t,a} = π DT_t sech²(Angles_{t,a}) Σ_{t' >= t} dangles_{t',a}``,
  ``dDT_angle_t = π Σ_a tanh(Angles_{t,a}) Σ_{t' >= t} dangles_{t',a}``; ``dDT = ddt_core + dDT_angle``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from .spec import INPUT_NAMES, OUTPUT_NAMES
from .validation import validate_inputs

_F64 = torch.float64


def mamba3_mimo_epilogue_oracle(
    dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
    dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum,
    *, groups: int, chunk_size: int,
) -> Dict[str, Optional[torch.Tensor]]:
    """The chain after stage 2 in float64 (module docstring).

    Args:
        Same tensors and shapes as :func:`.reference.mamba3_mimo_epilogue_reference`, any real floating dtype (the
        FP64 chain passes stage 2's float64 outputs). groups (int): G (1 or H). chunk_size (int): C, dividing S.

    Returns:
        dict: float64 tensors by :data:`.spec.OUTPUT_NAMES` (``dQ``/``dK`` ``[B, S, R, G, N]``), None where a branch
        is off.

    Raises:
        TypeError, ValueError: from :func:`.validation.validate_inputs`.
    """
    dims = validate_inputs(dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs,
                           dmimo_o, dz, dmimo_z, trap, dt, angles, da_cs, da_cs_rev, segsum, groups=groups,
                           chunk_size=chunk_size, strict_dtypes=False)
    x = {name: (None if t is None else t.to(_F64)) for name, t in zip(INPUT_NAMES, (
        dq, dk, dv, dmimo_v, dD, dangles, dfactor, dgamma_diag, ddA, dSSdA, ddA_cs_rev, ddA_cs, dmimo_o, dz, dmimo_z,
        trap, dt, angles, da_cs, da_cs_rev, segsum))}
    S, C, nc, device = dims.seqlen, dims.chunk_size, dims.nchunks, dims.device
    local = torch.arange(C, device=device)
    at_or_after = (local[None, :] >= local[:, None]).to(_F64)  # [t, t'] in one chunk: t' >= t
    before = (local[None, :] < local[:, None]).to(_F64)  # [t, t'] in one chunk: t' < t
    chunk = torch.arange(nc, device=device)
    later_chunk = (chunk[None, :] > chunk[:, None]).to(_F64)  # [c, c']: c' > c

    def per_chunk(x):  # [B, H, S] -> [B, H, nc, C] (C divides S)
        return x.reshape(*x.shape[:-1], nc, C)

    out: Dict[str, Optional[torch.Tensor]] = {}

    def group_sum(g):  # [B, S, R, H, N]
        return g.clone() if dims.groups == dims.heads else g.sum(dim=3, keepdim=True)

    out["dQ"], out["dK"], out["dV"] = group_sum(x["dq"]), group_sum(x["dk"]), x["dv"].clone()
    out["dQ_bias"] = x["dq"].sum(dim=(0, 1)).permute(1, 0, 2).contiguous()
    out["dK_bias"] = x["dk"].sum(dim=(0, 1)).permute(1, 0, 2).contiguous()
    for name, src in (("dMIMO_V", "dmimo_v"), ("dMIMO_Z", "dmimo_z"), ("dMIMO_Out", "dmimo_o"), ("dD", "dD")):
        out[name] = None if x[src] is None else x[src].sum(dim=0)
    out["dZ"] = None if x["dz"] is None else x["dz"].clone()

    # γ and γ' gradients
    sig, sig_neg = torch.sigmoid(x["trap"]), torch.sigmoid(-x["trap"])
    dgamma = x["dfactor"] + x["dgamma_diag"]
    dfactor_prev = torch.cat([torch.zeros_like(x["dfactor"][..., :1]), x["dfactor"][..., :-1]], dim=-1)  # t - 1
    out["ddt_core"] = sig * dgamma + sig_neg * dfactor_prev
    out["dTrap"] = sig * sig_neg * x["dt"] * (dgamma - dfactor_prev)

    # ADT: da_cs (t' >= t in the chunk), da_cs_rev (t' < t in the chunk), segsum (j >= t > i in the chunk)
    from_cs = torch.einsum("ts,bhcs->bhct", at_or_after, per_chunk(torch.exp(x["da_cs"]) * x["ddA_cs"]))
    from_cs_rev = torch.einsum("ts,bhcs->bhct", before, per_chunk(torch.exp(x["da_cs_rev"]) * x["ddA_cs_rev"]))
    # e^{segsum[c, j, i]}·dSSdA[c, i, j] over the pairs (j, i) of one chunk, [B, H, nc, C(j), C(i)]
    d_pair = torch.exp(x["segsum"]) * x["dSSdA"].transpose(-1, -2)
    # crosses[t, j, i] = 1 if j >= t > i, all in one chunk
    crosses = ((local[None, :, None] >= local[:, None, None]) & (local[None, None, :] < local[:, None, None])).to(_F64)
    from_seg = torch.einsum("tji,bhcji->bhct", crosses, d_pair)
    out["dADT"] = x["ddA"] + (from_cs + from_cs_rev + from_seg).reshape(x["ddA"].shape)

    # cumulative angles
    # Σ_{t' >= t} over the whole sequence: the rest of t's chunk, then every later chunk's total
    dangles = x["dangles"].reshape(dims.batch, nc, C, *x["dangles"].shape[2:])  # [B, nc, C, H, a]
    in_chunk = torch.einsum("ts,bcsha->bctha", at_or_after, dangles)
    later = torch.einsum("cd,bdha->bcha", later_chunk, dangles.sum(dim=2))
    grad_theta = (in_chunk + later[:, :, None]).reshape(x["dangles"].shape)
    angle = x["angles"]
    dt_bsh = x["dt"].permute(0, 2, 1)[..., None]  # [B, S, H, 1]
    out["dAngles"] = math.pi * dt_bsh * grad_theta / torch.cosh(angle) ** 2
    out["dDT_angle"] = (math.pi * torch.tanh(angle) * grad_theta).sum(dim=-1).permute(0, 2, 1).contiguous()
    out["dDT"] = out["ddt_core"] + out["dDT_angle"]
    return {name: out[name] for name in OUTPUT_NAMES}
