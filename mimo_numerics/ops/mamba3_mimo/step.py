"""The decode step of the Mamba-3 MIMO op in FP64: one token on from the state ``return_state=True`` leaves.

Upstream decodes with two kernels per token (mamba-ssm 2.3.2.post1, ``modules/mamba3.py`` ``Mamba3.step``):
``apply_rotary_qk_inference_fwd`` (``ops/triton/mamba3/mamba3_mimo_rotary_step.py``: the angle state advanced by
``π·tanh(angle)·dt``, q and k biased and rotated on the columns (a, N/2 + a) as the chunked kernels rotate them) and
``mamba3_step_fn`` (``ops/cute/mamba3/mamba3_step_fn.py``: the state update and the output). Written from the
definitions, per batch b and head h (group ``g = h // (H / G)``), with the state ``(θ, h, k_prev, v_prev)``::

    θ       <- θ + π·tanh(Angles)·DT                                   (returned mod 2π, as the prefill's)
    q̃, k̃   =  Q + Q_bias, K + K_bias rotated by θ                      [R, N]
    ΨV[r]   =  V ⊙ MIMO_V[h, r];   ΨV_prev[r] = v_prev ⊙ MIMO_V[h, r]
    α = exp(ADT),  β = σ(-Trap)·DT·α,  γ = σ(Trap)·DT
    h       <- α·h + β·Σ_r k_prev[r]ᵀ ΨV_prev[r] + γ·Σ_r k̃[r]ᵀ ΨV[r]   [N, P]
    o[r]    =  q̃[r]·h + D·ΨV[r];  Out = Σ_r o[r] ⊙ MIMO_Out[h, r] ⊙ silu(Z ⊙ MIMO_Z[h, r])  (or per rank)

This is the chunked op's recurrence one token at a time: the trapezoid's shifted term ``γ'[s] = DT[s+1]·σ(-Trap[s+1])``
of token s is the next step's ``β`` (so the prefill's final state holds ``γ`` but not ``γ'`` of its last token, and
the first decoded token adds it from ``k_prev``, ``v_prev``); the log-decays are not clamped (the prefill clamps its
chunk sums to ``<= 0``: the two agree when ``ADT <= 0``, as the op's inputs are). Nothing is rounded: this is the
FP64 truth a decode is measured against; the step under a policy (upstream's two step kernels in FP32 with their
lp output stores) is :func:`.decode.mamba3_mimo_step`.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from .fp64_model import rotate_pairs  # the FP64 model's rotation of the pairs (a, N/2 + a)

_F64 = torch.float64


class DecodeState(NamedTuple):
    """What a decode step carries, in upstream's layouts (``mamba3_mimo(..., return_state=True)``'s last four).

    Attributes:
        angle (Tensor): ``[B, H, K]`` the cumulative angle, mod 2π.
        ssm (Tensor): ``[B, H, P, N]`` the SSM state after the last token.
        k (Tensor): ``[B, R, H, N]`` the last token's biased, rotated k.
        v (Tensor): ``[B, H, P]`` the last token's V.
    """

    angle: torch.Tensor
    ssm: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def initial_state(batch: int, heads: int, angles: int, value_dim: int, state_dim: int, rank: int, *,
                  device=None) -> DecodeState:
    """The state before the first token (zeros, float64): decoding from it equals a prefill from the start."""
    zeros = torch.zeros
    return DecodeState(zeros((batch, heads, angles), dtype=_F64, device=device),
                       zeros((batch, heads, value_dim, state_dim), dtype=_F64, device=device),
                       zeros((batch, rank, heads, state_dim), dtype=_F64, device=device),
                       zeros((batch, heads, value_dim), dtype=_F64, device=device))


def check_step_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                      state: DecodeState) -> Tuple[int, ...]:
    """Check one token's inputs and the state (types, shapes, the Z/MIMO_Z pairing); ``(B, R, G, N, H, P)``.
    Errors name the argument."""
    for name, x in (("Q", Q), ("K", K), ("V", V), ("ADT", ADT), ("DT", DT), ("Trap", Trap), ("Q_bias", Q_bias),
                    ("K_bias", K_bias), ("MIMO_V", MIMO_V), ("Angles", Angles)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if Q.dim() != 4:
        raise ValueError(f"Q must be [B, R, G, N] (one token), got shape {list(Q.shape)}")
    B, R, G, N = Q.shape
    if V.dim() != 3 or V.shape[0] != B:
        raise ValueError(f"V must be [B, H, P] = [{B}, H, P] (one token), got shape {list(V.shape)}")
    H, P = V.shape[1], V.shape[2]
    if H % G:
        raise ValueError(f"Q has G={G} groups, which must divide the H={H} heads of V")
    expected = {"K": (K, (B, R, G, N)), "ADT": (ADT, (B, H)), "DT": (DT, (B, H)), "Trap": (Trap, (B, H)),
                "Q_bias": (Q_bias, (H, R, N)), "K_bias": (K_bias, (H, R, N)), "MIMO_V": (MIMO_V, (H, R, P)),
                "MIMO_Z": (MIMO_Z, (H, R, P)), "MIMO_Out": (MIMO_Out, (H, R, P)), "D": (D, (H,)),
                "Z": (Z, (B, H, P))}
    for name, (x, shape) in expected.items():
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if (Z is None) != (MIMO_Z is None):
        raise ValueError("Z and MIMO_Z must be given together (the gate) or both be None")
    if Angles.dim() != 3 or tuple(Angles.shape[:2]) != (B, H) or 2 * Angles.shape[2] > N:
        raise ValueError(f"Angles must be [B, H, K] = [{B}, {H}, K] with 2K <= N={N}, got {list(Angles.shape)}")
    K_angles = Angles.shape[2]
    if not isinstance(state, DecodeState):
        raise TypeError(f"state must be a DecodeState (angle, ssm, k, v), got {type(state).__name__}")
    for name, x, shape in (("state.angle", state.angle, (B, H, K_angles)), ("state.ssm", state.ssm, (B, H, P, N)),
                           ("state.k", state.k, (B, R, H, N)), ("state.v", state.v, (B, H, P))):
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    return B, R, G, N, H, P


def mamba3_mimo_step_fp64(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z: Optional[torch.Tensor],
                          MIMO_Out: Optional[torch.Tensor], Angles, D: Optional[torch.Tensor],
                          Z: Optional[torch.Tensor], state: DecodeState) -> Tuple[torch.Tensor, DecodeState]:
    """One decode step in float64 (module docstring for the math).

    Args (the op's names, one token each; any floating dtype, computed in float64):
        Q, K (Tensor): ``[B, R, G, N]``. V (Tensor): ``[B, H, P]``. ADT, DT, Trap (Tensor): ``[B, H]``.
        Q_bias, K_bias (Tensor): ``[H, R, N]``. MIMO_V (Tensor): ``[H, R, P]``.
        MIMO_Z (Tensor | None): ``[H, R, P]`` with Z ``[B, H, P]``. MIMO_Out (Tensor | None): ``[H, R, P]``.
        Angles (Tensor): ``[B, H, K]`` raw. D (Tensor | None): ``[H]``.
        state (DecodeState): from ``mamba3_mimo(..., return_state=True)``, the previous step or
            :func:`initial_state`.

    Returns:
        tuple: ``(out, next_state)``: ``out`` ``[B, H, P]`` with ``MIMO_Out``, else ``[B, R, H, P]``, float64.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    B, R, G, N, H, P = check_step_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles,
                                          D, Z, state)

    def f64(x):
        return None if x is None else x.to(_F64)

    group_of_head = torch.arange(H, device=Q.device) // (H // G)
    dt, trap = f64(DT), f64(Trap)
    theta = f64(state.angle) + math.pi * torch.tanh(f64(Angles)) * dt[..., None]  # [B, H, K]
    cos, sin = torch.cos(theta)[:, :, None], torch.sin(theta)[:, :, None]  # [B, H, 1, K]
    q_rot = rotate_pairs(f64(Q)[:, :, group_of_head].transpose(1, 2) + f64(Q_bias), cos, sin)  # [B, H, R, N]
    k_rot = rotate_pairs(f64(K)[:, :, group_of_head].transpose(1, 2) + f64(K_bias), cos, sin)
    psi_v = f64(V)[:, :, None, :] * f64(MIMO_V)  # [B, H, R, P]
    psi_v_prev = f64(state.v)[:, :, None, :] * f64(MIMO_V)
    alpha = torch.exp(f64(ADT))
    beta, gamma = torch.sigmoid(-trap) * dt * alpha, torch.sigmoid(trap) * dt
    h = (alpha[..., None, None] * f64(state.ssm).transpose(-1, -2)
         + beta[..., None, None] * torch.einsum("bhrn,bhrp->bhnp", f64(state.k).transpose(1, 2), psi_v_prev)
         + gamma[..., None, None] * torch.einsum("bhrn,bhrp->bhnp", k_rot, psi_v))  # [B, H, N, P]
    o = torch.einsum("bhrn,bhnp->bhrp", q_rot, h)
    if D is not None:
        o = o + f64(D)[None, :, None, None] * psi_v
    if Z is not None:
        x = f64(Z)[:, :, None, :] * f64(MIMO_Z)
        o = o * (x * torch.sigmoid(x))
    out = torch.einsum("bhrp,hrp->bhp", o, f64(MIMO_Out)) if MIMO_Out is not None else o.transpose(1, 2)
    next_state = DecodeState(torch.remainder(theta, 2.0 * math.pi), h.transpose(-1, -2).contiguous(),
                             k_rot.transpose(1, 2).contiguous(), f64(V).clone())
    return out, next_state
