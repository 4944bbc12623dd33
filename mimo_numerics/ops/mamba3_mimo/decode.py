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
``g = ½·z·MIMO_Z``, ``"sigmoid"`` is ``x·σ(x)``), ``helper_fma`` (the rotary step is one of upstream's FP32 Triton
helpers: ``"contracted"`` forms the new angle and the rotation's ``a·b ± c·d`` with one fused multiply-add each, as
Triton compiles them), and two of issue 24's FP32-level knobs (below); the others (``diag_mode``, ``state_update``,
``gemm_model``, ...) act on the chunked kernels' lp sums and products and have nothing to act on in the step. The
FP32 formulas follow upstream's kernels:

* rotary step: ``tanh(a) = 2·σ(2a) - 1``; ``θ = θ_state + (tanh(a)·dt)·π`` (one FMA when contracted), **not**
  reduced mod 2π (upstream keeps the raw FP32 sum in its angle state; the chunked op's ``Final_Angle`` is
  reduced); ``q + bias_q`` in FP32, then rotated by ``(cos θ, sin θ)`` on the pairs ``(a, N/2 + a)``
  (``rotate_pairwise=False``, the MIMO layout) or ``(2a, 2a + 1)``; columns past the rotary dims pass through;
* state update: ``α = exp(ADT)``, ``γ = σ(Trap)·dt``, ``β = ((1 - σ(Trap))·dt)·α``; ``xg_r = (V·γ)·MIMO_V[r]``,
  ``xb_r = (v_prev·β)·MIMO_V[r]``; ``new = Σ_r (xg_r ⊗ k̃[r] + xb_r ⊗ k_prev[r])`` added rank by rank, the two
  products alternately; ``h = h_prev·α + new``;
* output: ``y_r = h·q̃[r] + (D·V)·MIMO_V[r]``, gated, then ``Σ_r y_r·MIMO_Out[r]`` rank by rank.

FP32-level, as the compiled kernels compute (read from their PTX and SASS: the rotary kernel compiled by Triton 3.6
for sm_90, the CuTe kernel by ``golden/build_cute_step.py``; ``docs/compat.md``):

* ``special_functions="fast_sm90"``: the rotary step's ``tl.sigmoid`` is MUFU.EX2 of ``fl(-2a·log2 e)`` and
  ``div.full.f32`` (MUFU.RCP of ``1 + e``); its ``cos``/``sin`` are libdevice's accurate ``cosf``/``sinf``, not MUFU
  (torch's are used). The CuTe kernel's ``exp(A·dt)`` is MUFU.EX2 (``.ftz``) and its gate's ``tanh`` the CuTe DSL's
  fast form (:func:`_cute_tanh`). The gate ``σ(trap_proj)``, formed by ``Mamba3.step`` with ``torch.sigmoid`` on the
  device, is torch's CUDA kernel (``SpecialFunctions.torch_sigmoid``: CUDA's accurate ``expf``, IEEE division).
  Checked on the rotary kernel's golden data: every FP32 angle state bit-identical.
* ``fp32_fma=True`` (the CuTe kernel; the rotary kernel's contractions are ``helper_fma``'s): the first rank's
  ``fma(xg, k̃, fl(xb·k_prev))``, then ``fma(xb, k_prev, fma(xg, k̃, new))``; ``h = fma(α, h_prev, new)``; the
  N-sum per lane (``N/32`` consecutive n, an FMA chain) then by halves across the 32 lanes (:func:`_lane_sum`);
  ``fma(fl(D·V), MIMO_V[r], y_r)``; the gate ``fma(g, tanh g, g)``; ``Σ_r`` as ``fma(y_r, MIMO_Out[r], out)``.
  Checked on the step's golden data (both kernels chained on the H200,
  ``tests/ops/mamba3_mimo/test_decode_step_golden.py``): with every FP32-level model the gate, the angle state and
  on the two short bf16 chains the output, the rotated k and the state are upstream's bits; elsewhere a few rotated
  k values differ (their angles are upstream's bits: torch's ``cos``/``sin`` against libdevice's, or the rotation)
  and carry into the state.

The FP64 truth is :func:`.step.mamba3_mimo_step_fp64`; under the ``fp64`` preset this step equals it (angle mod 2π).

The two kernels in upstream's layouts are :func:`rotary_step` and :func:`state_update` (the compat layer's
``apply_rotary_qk_inference_fwd`` and ``mamba3_step_fn`` call them); :func:`mamba3_mimo_step` chains them in the op's.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ... import presets
from ...rounding import fma_fp32
from .._common.special import SpecialFunctions, f32_constant, special_functions
from .step import DecodeState, check_step_inputs

#: The π upstream's rotary kernel multiplies by (``3.141592653589793`` in its source), and as an fp32 operand.
_PI = math.pi
_PI_F32 = float(torch.tensor(math.pi, dtype=torch.float32))


def _tanh_as_sigmoid(x: torch.Tensor, functions: SpecialFunctions) -> torch.Tensor:
    """``2·σ(2x) - 1`` in ``x``'s dtype, upstream's rotary-step tanh (``tl.sigmoid`` under ``fast_sm90``: MUFU.EX2 and
    ``div.full.f32``, read from the kernel's SASS; ``2σ - 1`` is exact, so its FMA changes nothing)."""
    return functions.triton_sigmoid(2.0 * x) * 2.0 - 1.0


def _store(x: torch.Tensor, policy) -> torch.Tensor:
    """An output store: rounded to the lp dtype when the policy rounds outputs, else kept in the math dtype."""
    return x.to(policy.lp_torch_dtype) if policy.round_outputs else x


def _check_lp(name: str, x: torch.Tensor, policy) -> None:
    """An lp input must be in the policy's lp dtype (the stores round to it): else ``TypeError`` naming it."""
    if x.dtype in (torch.bfloat16, torch.float16) and x.dtype != policy.lp_torch_dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the policy's lp_dtype is {policy.lp_torch_dtype} "
                        "(policy.replace(lp_dtype=...) or a preset of that dtype)")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairwise: bool, contracted: bool) -> torch.Tensor:
    """``x [..., D]`` rotated by ``cos, sin [..., D/2]`` on ``(a, D/2 + a)`` or, ``pairwise``, ``(2a, 2a + 1)``;
    ``contracted`` (FP32): the first product fused, ``fma(x0, cos, -fl(x1·sin))``, ``fma(x0, sin, fl(x1·cos))``, as
    Triton compiles upstream's rotary kernel (its PTX)."""
    half = x.shape[-1] // 2
    x0, x1 = (x[..., 0::2], x[..., 1::2]) if pairwise else (x[..., :half], x[..., half:])
    if contracted:
        first = fma_fp32(x0, cos.expand_as(x0), -(x1 * sin))
        second = fma_fp32(x0, sin.expand_as(x0), x1 * cos)
    else:
        first, second = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    if pairwise:
        return torch.stack((first, second), dim=-1).flatten(-2)
    return torch.cat((first, second), dim=-1)


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
    contracted = policy.helper_fma == "contracted" and math_dtype == torch.float32
    turn = _tanh_as_sigmoid(angle_proj.to(math_dtype), special_functions(policy)) * dt.to(math_dtype)[..., None]
    if contracted:
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
        rotated.append(_store(_rotate(x, cos, sin, rotate_pairwise, contracted), policy))
    return rotated[0], rotated[1], theta


#: The CuTe DSL's fast-math tanh as upstream's step kernel compiles it (its PTX): 2·log2 e, the switch from the odd
#: polynomial to ``1 - 2/(e^{2|x|} + 1)`` at |x| = 0.6, the saturation at |x| >= 9.0109, the polynomial's
#: coefficients (highest first).
_CUTE_TANH = dict(two_log2e=f32_constant(0x4038AA3B), switch=f32_constant(0x3F19999A),
                  saturate=f32_constant(0x41102CB4),
                  poly=tuple(f32_constant(b) for b in (0x3C80F082, 0xBD563CAE, 0x3E085941, 0xBEAAA9ED)))


def _cute_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) of float32 ``x`` as upstream's CuTe step computes it with ``fastmath=True`` (read from its PTX, MUFU.EX2
    and MUFU.RCP through :mod:`mimo_numerics.mufu`): for |x| >= 0.6 ``±(1 - 2·rcp(fl(ex2(fl(|x|·2 log2 e)) + 1)))``
    (±1 from |x| >= 9.0109), below it ``fma(p(x²)·x², x, x)`` with p a cubic in Horner form of FMAs."""
    from .._common.special import models

    units = models(x.device)
    c = _CUTE_TANH
    magnitude = x.abs()
    e = units["ex2"](magnitude * c["two_log2e"])
    large = 1.0 - 2.0 * units["rcp"](e + 1.0)  # 2·r is exact: one rounding, as the kernel's fma(r, -2, 1)
    large = torch.where(magnitude >= c["saturate"], torch.ones_like(x), large).copysign(x)
    square = x * x
    poly = fma_fp32(square, torch.full_like(x, c["poly"][0]), torch.full_like(x, c["poly"][1]))
    for coefficient in c["poly"][2:]:
        poly = fma_fp32(poly, square, torch.full_like(x, coefficient))
    small = fma_fp32(poly * square, x, x)
    return torch.where(magnitude >= c["switch"], large, small)


def _lane_sum(h: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``Σ_n h[b, h, p, n]·q[b, r, h, n]`` in float32 as upstream's CuTe kernel sums it: each of 32 lanes holds
    ``N/32`` consecutive n and chains them (``fl(h·q)``, then FMAs), then the lanes are added by halves (lane l with
    l + 16, then + 8, 4, 2, 1: its butterfly shuffles). ``h [B, H, P, N]``, ``q [B, R, H, N]`` -> ``[B, R, H, P]``."""
    B, H, P, N = h.shape
    if N not in (32, 64, 128):
        raise NotImplementedError(f"fp32_fma=True: upstream's CuTe step kernel takes a state dim N of 32, 64 or 128, "
                                  f"got N={N}")
    per_lane = N // 32
    hv = h.reshape(B, 1, H, P, 32, per_lane)
    qv = q.reshape(B, q.shape[1], H, 1, 32, per_lane)
    lanes = hv[..., 0] * qv[..., 0]  # [B, R, H, P, 32]
    for v in range(1, per_lane):
        lanes = fma_fp32(hv[..., v].expand_as(lanes), qv[..., v].expand_as(lanes), lanes)
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    return lanes[..., 0]


def state_update(q_rot: torch.Tensor, k_rot: torch.Tensor, v: torch.Tensor, adt: torch.Tensor, dt: torch.Tensor,
                 gate: torch.Tensor, proj_v: torch.Tensor, proj_z: Optional[torch.Tensor],
                 proj_o: Optional[torch.Tensor], d: Optional[torch.Tensor], z: Optional[torch.Tensor],
                 ssm_prev: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, *,
                 policy) -> Tuple[torch.Tensor, torch.Tensor]:
    """The decode step's second kernel (upstream's CuTe ``mamba3_step_fn``) in its layouts, under a resolved policy.

    Args (one token, upstream's layouts; any dtypes, computed in the policy's math dtype):
        q_rot, k_rot (Tensor): ``[B, R, H, N]`` the rotary step's outputs. v (Tensor): ``[B, H, P]``.
        adt (Tensor): ``[B, H]`` the log-decay ``A·dt`` (``α = exp(adt)``). dt (Tensor): ``[B, H]``.
        gate (Tensor): ``[B, H]`` the trapezoid gate ``σ(Trap)`` (``γ = gate·dt``, ``β = ((1 - gate)·dt)·α``).
        proj_v (Tensor): ``[R, H, P]``. proj_z, z (Tensor | None): ``[R, H, P]``, ``[B, H, P]`` (the gate, applied
            when both are given). proj_o (Tensor | None): ``[R, H, P]``. d (Tensor | None): ``[H]``.
        ssm_prev (Tensor): ``[B, H, P, N]``. k_prev (Tensor): ``[B, R, H, N]``. v_prev (Tensor): ``[B, H, P]``.
        policy (RoundingPolicy): resolved. ``special_functions="fast_sm90"``: ``exp`` and the gate's ``tanh`` as the
            kernel computes them (MUFU); ``fp32_fma=True``: its FMA contractions and the lane order of the N-sum
            (module docstring). Both FP32 only.

    Returns:
        tuple: ``(out, ssm)``: ``out`` ``[B, H, P]`` with ``proj_o``, else ``[B, R, H, P]`` (the output store: lp
        when the policy rounds outputs), and the new state ``[B, H, P, N]`` in the math dtype.
    """
    f = policy.math_torch_dtype
    functions = special_functions(policy)
    fused = policy.fp32_fma and f == torch.float32
    B, R, H, N = q_rot.shape
    P = v.shape[-1]
    dt, gate = dt.to(f), gate.to(f)
    alpha = functions.exp(adt.to(f))
    gamma, beta = gate * dt, ((1.0 - gate) * dt) * alpha  # [B, H]
    proj_v = proj_v.to(f)  # [R, H, P]
    xg = (v.to(f) * gamma[..., None])[:, None] * proj_v  # [B, R, H, P]
    xb = (v_prev.to(f) * beta[..., None])[:, None] * proj_v
    k_new, k_old = k_rot.to(f), k_prev.to(f)
    new = None
    for r in range(R):  # rank by rank, the two outer products alternately (upstream's CuTe order)
        g_term = (xg[:, r, :, :, None], k_new[:, r, :, None, :])  # [B, H, P, 1], [B, H, 1, N]
        b_term = (xb[:, r, :, :, None], k_old[:, r, :, None, :])
        if not fused:
            new = (g_term[0] * g_term[1] if new is None else new + g_term[0] * g_term[1]) + b_term[0] * b_term[1]
        elif new is None:  # the kernel's first rank: fma(xg, k, fl(xb·k_prev))
            new = fma_fp32(*(t.expand(B, H, P, N) for t in g_term), b_term[0] * b_term[1])
        else:
            new = fma_fp32(*(t.expand(B, H, P, N) for t in g_term), new)
            new = fma_fp32(*(t.expand(B, H, P, N) for t in b_term), new)
    decay = alpha[..., None, None]
    h = fma_fp32(decay.expand(B, H, P, N), ssm_prev.to(f), new) if fused else ssm_prev.to(f) * decay + new

    q = q_rot.to(f)
    y = _lane_sum(h, q) if fused else torch.einsum("bhpn,brhn->brhp", h, q)  # [B, R, H, P]
    if d is not None:
        dv = (d.to(f)[None, :, None] * v.to(f))[:, None]  # [B, 1, H, P]
        y = fma_fp32(dv.expand_as(y), proj_v.expand_as(y), y) if fused else y + dv * proj_v
    if z is not None and proj_z is not None:
        zx = z.to(f)[:, None] * proj_z.to(f)  # [B, R, H, P]
        if policy.silu_form == "tanh":
            g = 0.5 * zx
            tanh = _cute_tanh(g) if functions.fast else torch.tanh(g)
            y = y * (fma_fp32(g, tanh, g) if fused else g * tanh + g)
        else:
            y = y * (zx * functions.sigmoid(zx))
    if proj_o is not None:
        proj_o = proj_o.to(f)
        out = y[:, 0] * proj_o[0]
        for r in range(1, R):
            out = fma_fp32(y[:, r], proj_o[r].expand_as(out), out) if fused else out + y[:, r] * proj_o[r]
    else:
        out = y
    return _store(out, policy), h


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
    B, R, G, N, H, P = check_step_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles,
                                          D, Z, state)
    _check_lp("Q", Q, policy)
    f = policy.math_torch_dtype

    heads = torch.arange(H, device=Q.device) // (H // G)
    q_rot, k_rot, theta = rotary_step(Q[:, :, heads], K[:, :, heads], state.angle, Angles, DT,
                                      Q_bias.transpose(0, 1), K_bias.transpose(0, 1), rotate_pairwise=False,
                                      policy=policy)  # [B, R, H, N]
    gate = special_functions(policy).torch_sigmoid(Trap.to(f))  # Mamba3.step's σ(trap_proj): torch's, on the device
    out, h = state_update(q_rot, k_rot, V, ADT.to(f), DT, gate, MIMO_V.transpose(0, 1),
                          None if MIMO_Z is None else MIMO_Z.transpose(0, 1),
                          None if MIMO_Out is None else MIMO_Out.transpose(0, 1), D, Z, state.ssm, state.k,
                          state.v, policy=policy)
    next_state = DecodeState(theta, h, k_rot, V.clone())
    return out, next_state
