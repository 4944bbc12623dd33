"""An FP64 model of the whole Mamba-3 MIMO op, ``mamba3_mimo``, from its raw inputs; differentiable by autograd.

Written from the definitions (``docs/fp64_model.md``), independently of the forward oracle
(``ops/mamba_mimo_fwd/oracle.py``, token-pair and chunk-pair sums) and of ``preprocess.py``: this is the chunked **state
recurrence** form, with its own log-decays (triangular-mask sums), angles (``torch.cumsum``) and rotation. Per batch
b, head h (group ``g = h // (H / G)``) and chunk c of C tokens, in float64:

* angles ``θ[t] = Σ_{u <= t} π·tanh(Angles[u])·DT[u]`` over the whole sequence (upstream stores it mod 2π; cos and
  sin do not see the difference, and the mod's derivative is 1);
* log-decays of the chunk, ``x = ADT`` of its tokens: ``A[t] = min(0, Σ_{u <= t} x_u)``, ``A_rev[s] = min(0,
  Σ_{u > s} x_u)``, ``A_seg[t, s] = min(0, Σ_{s < u <= t} x_u)`` (sums over the chunk);
* ``q̂ = Q + Q_bias``, ``k̂ = K + K_bias`` (biased per head), ``q̃, k̃`` rotated on columns (a, N/2 + a),
  a < N / divisor; ``γ[t] = DT[t]·σ(Trap[t])``, ``γ'[t] = DT[t+1]·σ(-Trap[t+1])`` (0 at t = S-1), ``ΨV[t, r] =
  V[t] ⊙ MIMO_V[h, r]``;
* the state ``h`` ([N, P], zero before chunk 0) is read, then updated::

      o[t, r] = exp(A[t]) · q̃[t, r] h                                          (earlier chunks)
              + Σ_{s in c, s < t} exp(A_seg[t, s]) (γ + γ')[s] Σ_{r'} (q̃[t, r]·k̃[s, r']) ΨV[s, r']
              + γ[t] Σ_{r'} (q̂[t, r]·k̂[t, r']) ΨV[t, r']  +  D[h] ΨV[t, r]
      h      <- exp(A[last]) · h + Σ_{s in c, r'} exp(A_rev[s]) (γ + γ')[s] k̃[s, r']ᵀ ΨV[s, r']

  (``last`` = the chunk's last real token);
* ``Out[t] = Σ_r o[t, r] ⊙ MIMO_Out[h, r] ⊙ silu(Z[t] ⊙ MIMO_Z[h, r])`` (gate 1 without Z), ``[B, S, H, P]``; without
  ``MIMO_Out``: ``Out[t, r] = o[t, r] ⊙ silu(...)``, ``[B, S, R, H, P]``.

**The clamp.** Upstream's forward clamps the three log-decays to ``<= 0`` (``compute_dacs_segsum_triton``,
``mamba3_mimo_utils.py`` L487, L495, L508) per chunk, as above; its backward (``bwd_dadt_fused_triton`` and the
stage-2 kernel) differentiates as if there were no clamp. ``clamp_backward="upstream"`` (default) reproduces both:
the forward value is clamped and the gradient passes through the clamp unchanged (``x - relu(x).detach()``);
``"exact"`` differentiates the clamped forward (zero gradient where a clamp is active). They agree wherever ADT <= 0
makes every sum non-positive, as in the golden data.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...validation import SUPPORTED_ROTARY_DIVISORS  # noqa: F401  (public here since the model was written)
from .validation import CLAMP_BACKWARDS, INPUT_NAMES, OPTIONAL_INPUTS, check_op_inputs  # noqa: F401

_F64 = torch.float64


def _clamp_nonpositive(x: torch.Tensor, clamp_backward: str) -> torch.Tensor:
    if clamp_backward == "exact":
        return torch.clamp(x, max=0)
    return x - torch.relu(x).detach()  # value min(x, 0), gradient 1


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (a, N/2 + a), a < K, of ``x [..., N]`` by angles with ``cos, sin [..., K]``."""
    width, half = cos.shape[-1], x.shape[-1] // 2
    x1, x2 = x[..., :width], x[..., half:half + width]
    return torch.cat([x1 * cos - x2 * sin, x[..., width:half], x1 * sin + x2 * cos, x[..., half + width:]], dim=-1)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def mamba3_mimo_fp64(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                     chunk_size: int = 16, rotary_dim_divisor: int = 4, *,
                     clamp_backward: str = "upstream", return_state: bool = False):
    """``mamba3_mimo``'s output in float64 from its raw inputs (module docstring for the math).

    Args (upstream's ``mamba3_mimo`` order; any floating dtype, computed in float64; give float64 leaves with
    ``requires_grad`` to take gradients):
        Q, K (Tensor): ``[B, S, R, G, N]``. V (Tensor): ``[B, S, H, P]``.
        ADT, DT, Trap (Tensor): ``[B, H, S]`` (A·dt, dt, trap before the sigmoid).
        Q_bias, K_bias (Tensor): ``[H, R, N]``. MIMO_V (Tensor): ``[H, R, P]``.
        MIMO_Z (Tensor | None): ``[H, R, P]``, with Z. MIMO_Out (Tensor | None): ``[H, R, P]``; None: non-reduced.
        Angles (Tensor): ``[B, S, H, N / rotary_dim_divisor]``, raw (before tanh and the cumulative sum).
        D (Tensor | None): ``[H]``. Z (Tensor | None): ``[B, S, H, P]``.
        chunk_size (int): C >= 1 (where the clamps apply). rotary_dim_divisor (int): 2 or 4.
        clamp_backward (str): ``"upstream"`` (gradient through the clamp as if absent, as upstream's backward) or
            ``"exact"``.
        return_state (bool): also the state a decode step continues from (upstream's ``return_state=True``).

    Returns:
        Tensor: float64, ``[B, S, H, P]`` with ``MIMO_Out``, else ``[B, S, R, H, P]``; part of the autograd graph.
        With ``return_state``: ``(Out, angle [B, H, K], ssm [B, H, P, N], k [B, R, H, N], v [B, H, P])``: ``θ`` of
        the last token mod 2π, the state ``h`` after the last chunk (transposed, as upstream returns it), the last
        token's ``k̃`` and ``V``.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    tensors = dict(zip(INPUT_NAMES, (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D,
                                     Z)))
    B, S, R, G, N, H, P, C, divisor = check_op_inputs(tensors, chunk_size, rotary_dim_divisor, clamp_backward)
    x64 = {name: (None if value is None else value.to(_F64)) for name, value in tensors.items()}
    device = Q.device

    # ---- per token, layout [B, H, S, ...] ----
    theta = torch.cumsum(math.pi * torch.tanh(x64["Angles"]) * x64["DT"].permute(0, 2, 1)[..., None], dim=1)
    theta = theta.permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, K]
    cos, sin = torch.cos(theta), torch.sin(theta)
    group_of_head = torch.arange(H, device=device) // (H // G)
    q_hat = x64["Q"][:, :, :, group_of_head].permute(0, 3, 1, 2, 4) + x64["Q_bias"][None, :, None]  # [B,H,S,R,N]
    k_hat = x64["K"][:, :, :, group_of_head].permute(0, 3, 1, 2, 4) + x64["K_bias"][None, :, None]
    q_rot, k_rot = rotate_pairs(q_hat, cos, sin), rotate_pairs(k_hat, cos, sin)
    dt, trap = x64["DT"], x64["Trap"]
    gamma = dt * torch.sigmoid(trap)  # [B, H, S]
    gamma_next = torch.nn.functional.pad(dt[..., 1:] * torch.sigmoid(-trap[..., 1:]), (0, 1))
    factor = gamma + gamma_next
    psi_v = x64["V"].permute(0, 2, 1, 3)[:, :, :, None, :] * x64["MIMO_V"][None, :, None]  # [B, H, S, R, P]

    state = torch.zeros((B, H, N, P), dtype=_F64, device=device)
    chunks = []
    for lo in range(0, S, C):
        hi = min(lo + C, S)
        n = hi - lo
        a = x64["ADT"][..., lo:hi]  # [B, H, n]
        index = torch.arange(n, device=device)
        upto = (index[:, None] <= index[None, :]).to(_F64)  # upto[u, t]: u <= t
        log_decay = _clamp_nonpositive(a @ upto, clamp_backward)  # A[t]
        log_decay_rev = _clamp_nonpositive(a @ (index[:, None] > index[None, :]).to(_F64), clamp_backward)
        between = (index[None, :, None] < index[None, None, :]) & (index[None, None, :] <= index[:, None, None])
        # between[t, s, u]: s < u <= t
        log_seg = _clamp_nonpositive(torch.einsum("bhu,tsu->bhts", a, between.to(_F64)), clamp_backward)
        causal = index[:, None] > index[None, :]
        seg_weight = torch.where(causal, torch.exp(torch.where(causal, log_seg, torch.zeros_like(log_seg))),
                                 torch.zeros_like(log_seg))  # [B, H, t, s]

        qc, kc, vc, fc = q_rot[:, :, lo:hi], k_rot[:, :, lo:hi], psi_v[:, :, lo:hi], factor[:, :, lo:hi]
        inter = torch.exp(log_decay)[..., None, None] * torch.einsum("bhtrn,bhnp->bhtrp", qc, state)
        scores = torch.einsum("bhtrn,bhsun->bhtrsu", qc, kc) * (seg_weight * fc[:, :, None, :])[:, :, :, None, :,
                                                                                                     None]
        intra = torch.einsum("bhtrsu,bhsup->bhtrp", scores, vc)
        diag = gamma[:, :, lo:hi, None, None] * torch.einsum(
            "bhtrn,bhtun,bhtup->bhtrp", q_hat[:, :, lo:hi], k_hat[:, :, lo:hi], vc)
        o = inter + intra + diag
        if D is not None:
            o = o + x64["D"][None, :, None, None, None] * vc
        chunks.append(o)
        k_state = kc * (torch.exp(log_decay_rev) * fc)[..., None, None]
        state = torch.exp(log_decay[..., -1])[..., None, None] * state + torch.einsum("bhsun,bhsup->bhnp", k_state,
                                                                                       vc)
    o = torch.cat(chunks, dim=2)  # [B, H, S, R, P]

    if Z is not None:
        o = o * _silu(x64["Z"].permute(0, 2, 1, 3)[:, :, :, None, :] * x64["MIMO_Z"][None, :, None])
    if MIMO_Out is not None:
        out = torch.einsum("bhsrp,hrp->bshp", o, x64["MIMO_Out"])
    else:
        out = o.permute(0, 2, 3, 1, 4)  # [B, S, R, H, P]
    if not return_state:
        return out
    final_angle = torch.remainder(theta[:, :, -1, 0], 2.0 * math.pi)  # [B, H, K]
    return (out, final_angle, state.transpose(-1, -2), k_rot[:, :, -1].transpose(1, 2), x64["V"][:, -1])
