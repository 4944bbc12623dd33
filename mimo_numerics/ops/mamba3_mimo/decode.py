"""The decode step under a rounding policy: upstream's two step kernels, one token on from a ``DecodeState``.

mamba-ssm 2.3.2.post1 decodes a token with two kernels (``Mamba3.step``): the Triton rotary step
``apply_rotary_qk_inference_fwd`` (``ops/triton/mamba3/mamba3_mimo_rotary_step.py``) and the CuTe
``mamba3_step_fn`` (``ops/cute/mamba3/mamba3_step_fn.py``). Both compute in FP32; their lp rounding sites are the
stores of their outputs (read from the source, ``docs/compat.md``):

* the rotated q and k (``[B, R, H, N]``, stored in q's dtype; the rotated k is also the next step's ``k_state``);
* the step's output (``[B, H, P]``, stored in the model's dtype).

These are output stores, so the policy's ``round_outputs`` knob switches them (as it switches every operator's
output store); no policy section is added. The other knobs that act here: ``lp_dtype``, ``math_dtype`` (FP32; FP64
under the ``fp64`` preset), ``silu_form`` (the gate: ``"tanh"`` is upstream's ``g·tanh(g) + g`` with
``g = ½·z·MIMO_Z``, ``"sigmoid"`` is ``x·σ(x)``) and ``helper_fma`` (the rotary step is one of upstream's FP32 Triton
helpers: ``"contracted"`` forms the new angle as one fused multiply-add, as Triton compiles it; FP32 math only); the
others (``diag_mode``, ``state_update``, ...) act on the chunked kernels' lp sums and have nothing to act on in the
step. The FP32 formulas follow upstream's kernels:

* rotary step: ``tanh(a) = 2·σ(2a) - 1``; ``θ = θ_state + (tanh(a)·dt)·π`` (one FMA when contracted), **not**
  reduced mod 2π (upstream keeps
  the raw FP32 sum in its angle state; the chunked op's ``Final_Angle`` is reduced); ``q + bias_q`` in FP32, then
  rotated by ``(cos θ, sin θ)`` on the pairs ``(a, N/2 + a)`` (``rotate_pairwise=False``, the MIMO layout) or
  ``(2a, 2a + 1)``; columns past the rotary dims pass through (``θ = 0`` there);
* state update: ``α = exp(ADT)``, ``γ = σ(Trap)·dt``, ``β = ((1 - σ(Trap))·dt)·α``; ``xg_r = (V·γ)·MIMO_V[r]``,
  ``xb_r = (v_prev·β)·MIMO_V[r]``; ``new = Σ_r (xg_r ⊗ k̃[r] + xb_r ⊗ k_prev[r])`` added rank by rank, the two
  products alternately; ``h = h_prev·α + new``;
* output: ``y_r = h·q̃[r] + (D·V)·MIMO_V[r]``, gated, then ``Σ_r y_r·MIMO_Out[r]`` rank by rank.

What is FP32-level and not modelled (issue 24): upstream's fast-math special functions (``exp``, ``sin``/``cos``,
``tanh`` as MUFU approximations), the warp-butterfly order of the N-sum of ``h·q̃``, FMA contraction outside the
angle (the rotation's products, the CuTe step's, which its golden data does not exist to check). The FP64
truth is :func:`.step.mamba3_mimo_step_fp64`; under the ``fp64`` preset this step equals it (angle mod 2π).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ... import presets
from ...policy import require_default
from .step import DecodeState, check_step_inputs

#: The π upstream's rotary kernel multiplies by (``3.141592653589793`` in its source), and as an fp32 operand.
_PI = math.pi
_PI_F32 = float(torch.tensor(math.pi, dtype=torch.float32))


def _tanh_as_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``2·σ(2x) - 1`` in ``x``'s dtype, upstream's rotary-step tanh."""
    return torch.sigmoid(2.0 * x) * 2.0 - 1.0


def _store(x: torch.Tensor, policy) -> torch.Tensor:
    """An output store: rounded to the lp dtype when the policy rounds outputs, else kept in the math dtype."""
    return x.to(policy.lp_torch_dtype) if policy.round_outputs else x


def _check_lp(name: str, x: torch.Tensor, policy) -> None:
    """An lp input must be in the policy's lp dtype (the stores round to it): else ``TypeError`` naming it."""
    if x.dtype in (torch.bfloat16, torch.float16) and x.dtype != policy.lp_torch_dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the policy's lp_dtype is {policy.lp_torch_dtype} "
                        "(policy.replace(lp_dtype=...) or a preset of that dtype)")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairwise: bool) -> torch.Tensor:
    """``x [..., D]`` rotated by ``cos, sin [..., D/2]`` on ``(a, D/2 + a)`` or, ``pairwise``, ``(2a, 2a + 1)``."""
    half = x.shape[-1] // 2
    if pairwise:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


def rotary_step(q: torch.Tensor, k: torch.Tensor, angle_state: torch.Tensor, angle_proj: torch.Tensor,
                dt: torch.Tensor, bias_q: Optional[torch.Tensor] = None, bias_k: Optional[torch.Tensor] = None, *,
                conjugate: bool = False, rotate_pairwise: bool = False,
                policy="upstream_sm90") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's rotary step in its own layouts (``apply_rotary_qk_inference_fwd``) under ``policy``.

    Args:
        q, k (Tensor): ``[B, R, H, D]`` (one token, per head), any floating dtype.
        angle_state (Tensor): ``[B, H, K]`` with ``2K <= D`` (the angle sum so far, float32 in ``Mamba3``).
        angle_proj (Tensor): ``[B, H, K]`` the token's raw angles. dt (Tensor): ``[B, H]``.
        bias_q, bias_k (Tensor, optional): ``[R, H, D]``, added in the math dtype before the rotation.
        conjugate (bool): rotate by ``-θ``. rotate_pairwise (bool): pairs ``(2a, 2a+1)`` instead of
            ``(a, D/2 + a)`` (upstream's default is True; ``Mamba3`` MIMO passes False).
        policy: a preset name, ``RoundingPolicy`` or policy file.

    Returns:
        tuple: ``(q_out, k_out, angle_state_out)``: rotated q, k ``[B, R, H, D]`` (lp when the policy rounds its
        outputs, else the math dtype) and the new angle state ``[B, H, K]`` in the math dtype, not reduced mod 2π.

    Raises:
        ValueError: naming the argument whose shape is wrong. TypeError: q in an lp dtype other than the policy's.
    """
    policy = presets.resolve(policy)
    _check_lp("q", q, policy)
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, R, H, D], got {list(q.shape)} and {list(k.shape)}")
    B, R, H, D = q.shape
    if D % 2:
        raise ValueError(f"q's head dim D={D} must be even (pairs are rotated)")
    if angle_state.dim() != 3 or tuple(angle_state.shape[:2]) != (B, H) or 2 * angle_state.shape[2] > D:
        raise ValueError(f"angle_state must be [B, H, K] = [{B}, {H}, K] with 2K <= D={D}, got "
                         f"{list(angle_state.shape)}")
    if angle_proj.shape != angle_state.shape:
        raise ValueError(f"angle_proj must have angle_state's shape {list(angle_state.shape)}, got "
                         f"{list(angle_proj.shape)}")
    if tuple(dt.shape) != (B, H):
        raise ValueError(f"dt must be [B, H] = [{B}, {H}], got {list(dt.shape)}")
    for name, bias in (("bias_q", bias_q), ("bias_k", bias_k)):
        if bias is not None and tuple(bias.shape) != (R, H, D):
            raise ValueError(f"{name} must be [R, H, D] = [{R}, {H}, {D}], got {list(bias.shape)}")
    math_dtype = policy.math_torch_dtype
    turn = _tanh_as_sigmoid(angle_proj.to(math_dtype)) * dt.to(math_dtype)[..., None]  # tanh(a)·dt
    if policy.helper_fma == "contracted" and math_dtype == torch.float32:
        # θ_state + turn·π in one rounding, as Triton contracts it: the product of two fp32 is exact in float64
        theta = (turn.double() * _PI_F32 + angle_state.double()).to(torch.float32)
    else:
        theta = angle_state.to(math_dtype) + turn * _PI  # [B, H, K]
    pad = D // 2 - theta.shape[-1]
    angle = torch.nn.functional.pad(theta, (0, pad))[:, None]  # [B, 1, H, D/2]: zero angle past the rotary dims
    cos, sin = torch.cos(angle), torch.sin(angle)
    if conjugate:
        sin = -sin
    rotated = []
    for x, bias in ((q, bias_q), (k, bias_k)):
        x = x.to(math_dtype)
        if bias is not None:
            x = x + bias.to(math_dtype)
        rotated.append(_store(_rotate(x, cos, sin, rotate_pairwise), policy))
    return rotated[0], rotated[1], theta


def mamba3_mimo_step(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z: Optional[torch.Tensor],
                     MIMO_Out: Optional[torch.Tensor], Angles, D: Optional[torch.Tensor], Z: Optional[torch.Tensor],
                     state: DecodeState, *, policy="upstream_sm90") -> Tuple[torch.Tensor, DecodeState]:
    """One decode step of the op under ``policy`` (module docstring), the op's layouts.

    Args (one token each, as :func:`.step.mamba3_mimo_step_fp64`):
        Q, K (Tensor): ``[B, R, G, N]``. V (Tensor): ``[B, H, P]``. ADT, DT, Trap (Tensor): ``[B, H]``.
        Q_bias, K_bias (Tensor): ``[H, R, N]``. MIMO_V (Tensor): ``[H, R, P]``.
        MIMO_Z (Tensor | None): ``[H, R, P]`` with Z ``[B, H, P]``. MIMO_Out (Tensor | None): ``[H, R, P]``.
        Angles (Tensor): ``[B, H, K]`` raw. D (Tensor | None): ``[H]``.
        state (DecodeState): from ``mamba3_mimo(..., return_state=True)`` (``Final_Angle``, ``Final_SSM_State``,
            ``Final_K``, ``Final_V``), the previous step, or :func:`.step.initial_state`.
        policy: a preset name, ``RoundingPolicy`` or policy file (default ``upstream_sm90``).

    Returns:
        tuple: ``(out, next_state)``: ``out`` ``[B, H, P]`` with ``MIMO_Out``, else ``[B, R, H, P]`` (lp when the
        policy rounds outputs); ``next_state``: angle ``[B, H, K]`` (math dtype, not reduced mod 2π, as upstream's
        step keeps it), ssm ``[B, H, P, N]`` (math dtype), k ``[B, R, H, N]`` (the stored rotated k), v = ``V``.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    policy = presets.resolve(policy)
    require_default(policy, "gemm_model", "the decode step")
    require_default(policy, "special_functions", "the decode step")
    require_default(policy, "fp32_fma", "the decode step")
    B, R, G, N, H, P = check_step_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles,
                                          D, Z, state)
    _check_lp("Q", Q, policy)
    f = policy.math_torch_dtype

    heads = torch.arange(H, device=Q.device) // (H // G)
    q_rot, k_rot, theta = rotary_step(Q[:, :, heads], K[:, :, heads], state.angle, Angles, DT,
                                      Q_bias.transpose(0, 1), K_bias.transpose(0, 1), rotate_pairwise=False,
                                      policy=policy)  # [B, R, H, N]
    dt, trap = DT.to(f), Trap.to(f)
    alpha = torch.exp(ADT.to(f))
    sig = torch.sigmoid(trap)
    gamma, beta = sig * dt, ((1.0 - sig) * dt) * alpha  # [B, H]
    proj_v = MIMO_V.to(f).transpose(0, 1)  # [R, H, P]
    xg = (V.to(f) * gamma[..., None])[:, None] * proj_v  # [B, R, H, P]
    xb = (state.v.to(f) * beta[..., None])[:, None] * proj_v
    new = torch.zeros(B, H, P, N, dtype=f, device=Q.device)
    k_new, k_prev = k_rot.to(f), state.k.to(f)
    for r in range(R):  # rank by rank, the two outer products alternately (upstream's CuTe order)
        new = new + xg[:, r, :, :, None] * k_new[:, r, :, None, :]
        new = new + xb[:, r, :, :, None] * k_prev[:, r, :, None, :]
    h = state.ssm.to(f) * alpha[..., None, None] + new  # [B, H, P, N]

    y = torch.einsum("bhpn,brhn->brhp", h, q_rot.to(f))  # [B, R, H, P]
    if D is not None:
        y = y + (D.to(f)[None, :, None] * V.to(f))[:, None] * proj_v
    if Z is not None:
        zx = Z.to(f)[:, None] * MIMO_Z.to(f).transpose(0, 1)  # [B, R, H, P]
        if policy.silu_form == "tanh":
            g = 0.5 * zx
            y = y * (g * torch.tanh(g) + g)
        else:
            y = y * (zx * torch.sigmoid(zx))
    if MIMO_Out is not None:
        proj_o = MIMO_Out.to(f).transpose(0, 1)  # [R, H, P]
        out = torch.zeros(B, H, P, dtype=f, device=Q.device)
        for r in range(R):
            out = out + y[:, r] * proj_o[r]
    else:
        out = y
    next_state = DecodeState(theta, h, k_rot, V.clone())
    return _store(out, policy), next_state
