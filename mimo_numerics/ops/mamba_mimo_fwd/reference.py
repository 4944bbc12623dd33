"""PyTorch reference of the forward kernel ``mamba_mimo_fwd``, parameterised by a rounding policy.

Chunked and vectorised over batch, heads and chunks; only the inter-chunk state recurrence loops in Python. Runs on
any torch device. Every rounding goes through ``mimo_numerics.rounding``; each one is a site of ``sites.SITES``,
switched by ``policy.mamba_mimo_fwd.<site>``, except the output store (``policy.round_outputs``). The math is
written out in ``docs/forward.md``; ``spec.STAGES`` lists what ``record`` receives.

Shared with the other references (``mimo_numerics/ops/_common``), because the forward does the same thing there:
the zero padding of a tail chunk, the discretisation, the biased q/k per head, the rotation (L255-257 and
L271-273 here), the diagonal rank sum under ``diag_mode`` (L319-323), the state recurrence under ``state_update``
(L405-407), the chunk outputs (L243-316) and the TF32 guard; the policy is read through a
:class:`~mimo_numerics.ops._common.rounder.SiteRounder` of the forward's section.

Where the forward differs from stage 1's recomputation of ``o``: the intra GEMM accumulates onto the scaled inter
term (L316) instead of starting from zero; the diagonal term, with D·ΨV added, is rounded to lp before it is added
to ``o`` (``d_term``, L333); ``o`` itself is never rounded before the gate; the reduced output is a rank sum carried
in lp (``out_proj``, ``out_accum``).

FP32-level models: the GEMMs under ``gemm_model`` (the intra GEMM's k16 steps into the inter term under a
tensor-core model), the MUFU ``tanh``/``ex2``/``sin``/``cos``/``rcp`` approximations of fast math under
``special_functions="fast_sm90"`` (``tanh`` feeds the lp rounding of the gate), nvcc's FMA contraction of the
rotation of q and k under ``fp32_fma`` (``fma(c, x1, −fl(s·x2))``, ...). Not modelled: other FP32 contractions.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from ... import presets as _presets
from ...validation import Dims
from .._common.chunked import (biased_heads, chunk_decay, chunk_outputs, diagonal_rank_sum, discretisation,
                               fused_first, ieee_fp32_matmul, pad_time, rotate, rotation_angles)
from .._common.gemm import policy_matmul
from .._common.recurrence import state_recurrence
from .._common.rounder import SiteRounder
from .._common.special import special_functions
from .sites import SITES  # noqa: F401  (the forward's sites, for readers of this module)
from .spec import MimoFwdOutputs, MimoFwdStateOutputs
from .validation import check_final_tokens, validate_inputs

#: The policy section this reference reads.
OPERATOR_NAME = "mamba_mimo_fwd"


@torch.no_grad()
def mamba_mimo_fwd(
    q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype: Optional[torch.dtype] = None, *, policy,
    record: Optional[Dict[str, torch.Tensor]] = None, return_state: bool = False, cu_seqlens=None,
    final_tokens: Optional[Sequence[int]] = None,
) -> MimoFwdOutputs:
    """The Mamba-3 MIMO forward kernel, rounded as ``policy`` says.

    Args:
        q, k (Tensor): ``[B, S, R, G, N]`` lp. v (Tensor): ``[B, S, H, P]`` lp.
        q_bias, k_bias (Tensor): ``[H, R, N]`` fp32. mimo_v (Tensor): Ψ ``[H, R, P]`` fp32.
        mimo_o (Tensor | None): Φ ``[H, R, P]`` fp32; selects the reduced output.
        z (Tensor | None): ``[B, S, H, P]`` lp, with mimo_z. d (Tensor | None): ``[H]`` fp32.
        mimo_z (Tensor | None): ζ ``[H, R, P]`` fp32, with z.
        angles (Tensor): cumulative angles ``[B, S, H, N/d]`` fp32. da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]``
            fp32. trap (Tensor): ``[B, H, S]`` lp. segsum (Tensor): ``[B, H, ceil(S/C), C, C]`` fp32.
        chunk_size (int): C. rotary_dim_divisor (int): d, 2 or 4.
        dtype (torch.dtype | None): upstream's argument; when given, it must be the dtype of the lp inputs.
        policy (RoundingPolicy | str): a policy or a preset name (its ``mamba_mimo_fwd`` section and knobs; a
            preset that defines no forward semantics, such as ``seed_bf16``, raises ``PolicyUndefined``); the lp
            inputs must have its ``lp_dtype``.
        record (dict, optional): filled with the stages of ``spec.STAGES`` (math dtype, S tokens).
        return_state (bool): also return upstream's ``FINAL_STATE`` and ``FINAL_K`` (``spec.MimoFwdStateOutputs``).
        cu_seqlens: upstream's varlen path, not implemented here (it raises; the whole op packs sequences as batch
            rows, ``ops/mamba3_mimo/varlen.py``).
        final_tokens (sequence of int, optional): with ``return_state``, the token of each batch row whose k is
            ``FINAL_K`` (default the last, S − 1; zero-padded rows give their last real token).

    Returns:
        MimoFwdOutputs: ``o`` ``[B, S, H, P]`` (reduced) or ``[B, S, R, H, P]``, in lp, or unrounded in the
        math dtype when ``policy.round_outputs`` is false. With ``return_state``: ``MimoFwdStateOutputs``, adding
        ``final_state`` ``[B, H, N, P]`` (the state after the last chunk, the walk's next step: fp32, unrounded)
        and ``final_k`` ``[B, R, H, N]`` (the last token's biased, rotated k, stored as ``o`` is).
    """
    if cu_seqlens is not None:
        raise NotImplementedError("cu_seqlens (the varlen kernel mamba3_mimo_fwd_varlen.py) is not implemented "
                                  "by the reference")
    policy = _presets.resolve(policy)
    switches = policy.section(OPERATOR_NAME)
    dims = validate_inputs(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt,
                           trap, segsum, chunk_size, rotary_dim_divisor, dtype, lp_dtype=policy.lp_torch_dtype)
    # contiguous inputs: torch's reduction order follows the operands' strides
    tensors = [None if t is None else t.contiguous() for t in (q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d,
                                                                mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum)]
    with ieee_fp32_matmul():
        return _forward(*tensors, dims=dims, policy=policy, switches=switches, record=record,
                        return_state=bool(return_state),
                        final_tokens=check_final_tokens(final_tokens, dims.batch, dims.seqlen))


def _forward(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum, *,
             dims: Dims, policy, switches, record, return_state: bool = False,
             final_tokens: Tuple[int, ...] = ()):
    md = policy.math_torch_dtype
    rnd = SiteRounder(policy, OPERATOR_NAME)
    matmul = policy_matmul(policy)  # the GEMMs under policy.gemm_model (the state update's: state_recurrence)
    fns = special_functions(policy)  # exp, σ, tanh, cos/sin under policy.special_functions
    B, S, H, R, C, nc = dims.batch, dims.seqlen, dims.heads, dims.rank, dims.chunk_size, dims.nchunks
    Sp, L = dims.padded_seqlen, C * R

    def put(name, value):
        if record is not None:
            record[name] = value

    def tokens(x):  # [B, H, Sp, ...] -> [B, H, S, ...]
        return x[:, :, :S]

    # ---------------------------------------------------------------- per token, [B, H, Sp, R, *] (L174-219)
    _, gamma, shifted, trap_scale = discretisation(dt, trap, dims, md, rnd, fns)  # [B, H, Sp]
    put("gamma", tokens(gamma)), put("shifted_gamma", tokens(shifted)), put("trap_scale", tokens(trap_scale))

    psi = rnd("psi_weight", mimo_v.to(md))  # [H, R, P]
    v_h = pad_time(v, Sp, 1).to(md).permute(0, 2, 1, 3)  # [B, H, Sp, P]
    psiv = rnd("psiv", v_h[:, :, :, None, :] * psi[None, :, None])  # [B, H, Sp, R, P]
    put("psiv", tokens(psiv))

    q_biased = biased_heads(q, q_bias, dims, md, rnd)
    k_biased = biased_heads(k, k_bias, dims, md, rnd)
    qk = rnd("qk_dot", matmul(q_biased, k_biased.transpose(-1, -2)))  # [B, H, Sp, R, R]
    put("q_biased", tokens(q_biased)), put("k_biased", tokens(k_biased)), put("qk_dot", tokens(qk))

    cos, sin = rotation_angles(angles, dims, md, fns)  # [B, H, Sp, 1, N/d]
    q_rot = rotate(q_biased, cos, sin, dims, rnd, fma=policy.fp32_fma)
    k_rot = rotate(k_biased, cos, sin, dims, rnd, fma=policy.fp32_fma)
    k_scaled = rnd("k_scaled", k_rot * trap_scale[..., None, None])
    put("q_rot", tokens(q_rot)), put("k_rot", tokens(k_rot)), put("k_scaled", tokens(k_scaled))
    # FINAL_K (L275-279): the last real token's rotated k (as the kernel holds it, before the trapezoid scale)
    rows = torch.arange(B, device=k_rot.device)
    last = torch.tensor(final_tokens, dtype=torch.long, device=k_rot.device) if return_state else None
    final_k = k_rot[rows, :, last].permute(0, 2, 1, 3) if return_state else None  # [B, R, H, N]
    del k_rot  # each dead intermediate is freed as soon as it is dead (memory only: the bits do not depend on it)

    # ---------------------------------------------------------------- state recurrence (L386-407)
    exp_da_cs = fns.exp(pad_time(da_cs, Sp, 2).to(md))  # [B, H, Sp]
    k_state = rnd("k_state", k_scaled * fns.exp(pad_time(da_cs_rev, Sp, 2).to(md))[..., None, None])
    put("k_state", tokens(k_state))
    decay = chunk_decay(exp_da_cs, dims)  # [B, H, nc] (L398-404)

    def chunked(x):  # [B, H, Sp, R, X] -> [B, H, nc, L, X]
        return x.reshape(B, H, nc, L, x.shape[-1])

    def unchunked(x):  # [B, H, nc, L, X] -> [B, H, Sp, R, X]
        return x.reshape(B, H, Sp, R, x.shape[-1])

    psiv_c = chunked(psiv)
    state = state_recurrence(chunked(k_state), psiv_c, decay, policy, final=return_state)  # [B, H, nc, N, P]
    state, final_state = state if return_state else (state, None)  # final: [B, H, N, P] (L406-413)
    state_operand = rnd("state_operand", state)
    put("state", state), put("state_operand", state_operand)
    del state, k_state

    # ---------------------------------------------------------------- chunk outputs, all chunks at once (L243-316)
    # the intra GEMM accumulates onto the scaled inter term (L316): with FP32 GEMMs that is inter + intra, under a
    # tensor-core gemm_model one GEMM into inter, whose "intra" record is then (inter + intra) − inter
    into_inter = policy.gemm_model != "fp32"
    inter, masked, intra = chunk_outputs(chunked(q_rot), chunked(k_scaled), psiv_c, state_operand, exp_da_cs,
                                         segsum, dims, md, rnd, matmul, intra_into_inter=into_inter, exp=fns.exp)
    chunk_sum = intra if into_inter else inter + intra  # [B, H, nc, L, P]
    put("inter", tokens(unchunked(inter))), put("causal_scores", masked)
    put("intra", tokens(unchunked(chunk_sum - inter if into_inter else intra)))
    del masked, state_operand, q_rot, k_scaled, q_biased, k_biased, cos, sin

    # ---------------------------------------------------------------- diagonal and D terms (L318-336)
    diag_acc = diagonal_rank_sum(qk, psiv, policy, rnd.on("diag_accum"))  # [B, H, Sp, R, P]
    diag = rnd("diag_gamma", diag_acc * gamma[..., None, None])
    put("diag_accum", tokens(diag_acc)), put("diag", tokens(diag))
    del diag_acc, qk
    if dims.has_d:
        diag = rnd("d_term", diag + d.to(md)[None, :, None, None, None] * psiv)
        put("d_term", tokens(diag))
    out = tokens(unchunked(chunk_sum) + diag)  # [B, H, S, R, P]
    put("out", out)
    del inter, intra, chunk_sum, diag, psiv, psiv_c

    # ---------------------------------------------------------------- gate and output (L338-384)
    if dims.has_z:
        x = z.to(md).permute(0, 2, 1, 3)[:, :, :, None, :] * mimo_z.to(md)[None, :, None]  # [B, H, S, R, P]
        if policy.silu_form == "tanh":
            half = x * 0.5
            gate = rnd("gate", fused_first(half, fns.tanh(half), half, policy.fp32_fma))
        else:
            gate = rnd("gate", x * fns.sigmoid(x))
        put("gate", gate)
    if dims.reduce_o:
        phi = rnd("phi_weight", mimo_o.to(md))[None, :, None]  # [1, H, 1, R, P]
        if dims.has_z:
            phi = rnd("phi_gate", phi * gate)
            put("phi_gate", phi)
        o_rank = rnd("out_proj", out * phi)
        o_sum = rnd.carried("out_accum", o_rank)  # [B, H, S, P]
        put("o_rank", o_rank), put("o_sum", o_sum)
        o = rnd.output(o_sum).permute(0, 2, 1, 3)  # [B, S, H, P]
    else:
        gated = out * gate if dims.has_z else out
        o = rnd.output(gated).permute(0, 2, 3, 1, 4)  # [B, S, R, H, P]
    o = o.contiguous()
    put("o", o.to(md))
    if return_state:
        return MimoFwdStateOutputs(o=o, final_state=final_state.contiguous(),
                                   final_k=rnd.output(final_k).contiguous())
    return MimoFwdOutputs(o=o)
