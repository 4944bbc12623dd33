"""Stage 1's reference on any device, every stage a whole tensor (the path of every device but the CPU).

Built from the pieces the references share (``ops/_common``); the CPU path (``reference_cpu``) computes the same
bits block by block and mirrors this path's GEMM layouts (found by running this function on meta tensors). The
public entry point, its validation and the dispatch are ``reference.mamba_mimo_bwd_fwd``.
"""

from __future__ import annotations

import torch

from ...policy import RoundingPolicy
from ...rounding import fma_fp32
from ...validation import Dims
from .._common.chunked import (biased_heads, chunk_decay, chunk_outputs, diagonal_rank_sum, discretisation,
                               fused_first, pad_time, rotate, rotation_angles)
from .._common.gemm import policy_matmul
from .._common.recurrence import state_recurrence
from .._common.rounder import SiteRounder
from .._common.special import special_functions
from .outputs import MimoBwdFwdOutputs

#: The operator whose policy section this reference reads.
OPERATOR_NAME = "mamba_mimo_bwd_fwd"


def reference_generic(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
                       d, segsum, dims: Dims, policy: RoundingPolicy, record) -> MimoBwdFwdOutputs:
    """The reference on any device, every stage a whole tensor (validated, contiguous inputs)."""
    md = policy.math_torch_dtype
    rnd = SiteRounder(policy, OPERATOR_NAME)
    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    Sp, L = dims.padded_seqlen, C * R
    keep = record is not None
    matmul = policy_matmul(policy)  # the GEMMs G1–G4 (G5 is the state recurrence's) under policy.gemm_model
    fns = special_functions(policy)  # exp, σ, tanh, cos/sin under policy.special_functions

    def put(name, value):
        if keep:
            record[name] = value

    def tokens(x):  # [B, H, Sp, ...] -> [B, H, S, ...]
        return x[:, :, :S]

    # ---------------------------------------------------------------- per-token quantities, [B, H, Sp, R, *]
    q_biased = biased_heads(q, q_bias, dims, md, rnd)
    k_biased = biased_heads(k, k_bias, dims, md, rnd)
    qk_full = matmul(q_biased, k_biased.transpose(-1, -2))  # [B, H, Sp, R, R]
    qk_internal = rnd("qk_dot_internal", qk_full)
    put("q_biased", tokens(q_biased)), put("k_biased", tokens(k_biased)), put("qk_dot", tokens(qk_internal))

    cos, sin = rotation_angles(angles, dims, md, fns)  # [B, H, Sp, 1, N/d]
    q_rot = rotate(q_biased, cos, sin, dims, rnd, fma=policy.fp32_fma)
    k_rot = rotate(k_biased, cos, sin, dims, rnd, fma=policy.fp32_fma)
    put("q_rot", tokens(q_rot)), put("k_rot", tokens(k_rot))

    _, gamma, shifted, trap_scale = discretisation(dt, trap, dims, md, rnd, fns)  # [B, H, Sp]
    k_scaled = rnd("k_scaled", k_rot * trap_scale[..., None, None])
    put("gamma", tokens(gamma)), put("shifted_gamma", tokens(shifted)), put("trap_scale", tokens(trap_scale))
    put("k_scaled", tokens(k_scaled))

    psi = rnd("psi_weight", mimo_v.to(md))  # [H, R, P]
    v_h = pad_time(v, Sp, 1).to(md).permute(0, 2, 1, 3)  # [B, H, Sp, P]
    psiv = rnd("psiv", v_h[:, :, :, None, :] * psi[None, :, None])  # [B, H, Sp, R, P]
    put("psiv", tokens(psiv))

    # ---------------------------------------------------------------- state recurrence (S41–S45)
    exp_da_cs = fns.exp(pad_time(da_cs, Sp, 2).to(md))  # [B, H, Sp]
    exp_da_cs_rev = fns.exp(pad_time(da_cs_rev, Sp, 2).to(md))
    k_state = rnd("k_state", k_scaled * exp_da_cs_rev[..., None, None])
    put("k_state", tokens(k_state))
    decay = chunk_decay(exp_da_cs, dims)  # [B, H, nc]
    chunked = lambda x: x.reshape(B, H, nc, L, x.shape[-1])  # [B, H, Sp, R, X] -> [B, H, nc, L, X]
    psiv_c = chunked(psiv)
    state = state_recurrence(chunked(k_state), psiv_c, decay, policy)  # [B, H, nc, N, P]
    state_operand = rnd("state_operand", state)
    put("state", state), put("state_operand", state_operand)
    del k_state  # each dead intermediate is freed as soon as it is dead (memory only: the bits do not depend on it)

    # ---------------------------------------------------------------- chunk outputs, all chunks at once
    inter, masked, intra = chunk_outputs(chunked(q_rot), chunked(k_scaled), psiv_c, state_operand, exp_da_cs, segsum,
                                         dims, md, rnd, matmul, exp=fns.exp)
    unchunk = lambda x: x.reshape(B, H, Sp, R, x.shape[-1])
    put("inter", tokens(unchunk(inter))), put("causal_scores", masked), put("intra", tokens(unchunk(intra)))
    o = unchunk(intra + inter)  # [B, H, Sp, R, P]
    del inter, masked, intra, state_operand, q_rot, k_rot, k_scaled, q_biased, k_biased, cos, sin

    diag_acc = diagonal_rank_sum(qk_internal, psiv, policy, rnd.on("diag_accum"))
    diag = rnd("diag_gamma", diag_acc * gamma[..., None, None])
    put("diag_accum", tokens(diag_acc)), put("diag", tokens(diag))
    o = o + diag
    del diag_acc, diag, qk_internal
    if dims.has_d:
        o = o + d.to(md)[None, :, None, None, None] * psiv
    out = rnd("out", o)
    put("out", tokens(out))
    del o, psiv, psiv_c

    # ---------------------------------------------------------------- gradient branches (S31–S39)
    out_v = tokens(out)  # [B, H, S, R, P]
    dmimo_o = dz = dmimo_z = None
    out_fp = torch.float32 if policy.round_outputs else md
    if dims.has_z:
        z_h = z.to(md).permute(0, 2, 1, 3)  # [B, H, S, P]
        x = z_h[:, :, :, None, :] * mimo_z.to(md)[None, :, None]  # [B, H, S, R, P]
        if policy.silu_form == "tanh":
            half = x * 0.5
            gate = fused_first(half, fns.tanh(half), half, policy.fp32_fma)
        else:
            gate = x * fns.sigmoid(x)
        put("gate", gate)
    if dims.reduce_o:
        dout_h = dout.to(md).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, P]
        gated = gate * out_v if dims.has_z else out_v
        dmimo_o = time_sum_of_products(gated, dout_h, policy, dims).to(out_fp)
        if dims.has_z:
            phi = rnd("phi_weight", mimo_o.to(md))
            dphio = rnd("dphio", rnd("dphio", dout_h * phi[None, :, None]) * out_v)
    elif dims.has_z:
        dphio = rnd("dphio", dout.to(md).permute(0, 3, 1, 2, 4) * out_v)  # DOUT_r [B, H, S, R, P]
    if dims.has_z:
        put("dphio", dphio)
        dzz = dphio * fns.sigmoid(x) * fused_first(x, fns.sigmoid(-x), torch.ones_like(x), policy.fp32_fma)
        put("dzz", dzz)
        zeta = mimo_z.to(md)[None, :, None]  # [1, H, 1, R, P]
        terms = dzz * zeta
        acc = terms[..., 0, :]
        if rnd.on("dz_accum"):
            acc = rnd.always(acc)
        for r in range(1, R):
            acc = acc + terms[..., r, :]
            if rnd.on("dz_accum"):
                acc = rnd.always(acc)
        put("dz_accum", acc)
        dz = rnd.output(acc).permute(0, 2, 1, 3).contiguous()  # [B, S, H, P]
        dmimo_z = chunked_time_sum(dzz, z_h[:, :, :, None, :], policy, dims).to(out_fp)

    states = rnd.output(state).contiguous()
    qk_dot = rnd.output(tokens(qk_full)).contiguous()
    return MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states, dz=dz, dmimo_z=dmimo_z, qk_dot=qk_dot)


def time_sum_of_products(a: torch.Tensor, b: torch.Tensor, policy, dims: Dims) -> torch.Tensor:
    """Σ_t a·b over dim 2 (S33, dΦ): ``reduction_order="pairwise"``: torch's sum of the products;
    ``"sequential_time"``: upstream's one running FP32 FMA chain over t, ascending (``acc = fma(a_t, b_t, acc)``).

    Args:
        a (Tensor): ``[B, H, S, R, P]`` in the math dtype; b: broadcastable to it. Returns: ``[B, H, R, P]``.
    """
    if policy.reduction_order == "pairwise":
        return (a * b).sum(dim=2)
    b = b.expand_as(a)
    acc = torch.zeros_like(a[:, :, 0])
    for t in range(dims.seqlen):
        acc = fma_fp32(a[:, :, t], b[:, :, t], acc)
    return acc


def chunked_time_sum(a: torch.Tensor, b: torch.Tensor, policy, dims: Dims) -> torch.Tensor:
    """Σ_t a·b over dim 2 (S39, dζ): ``"pairwise"``: torch's sum of the products; ``"sequential_time"``: upstream's
    ``reduce_sum(dZetaZ, dZeta, clear=False)`` per chunk as the CUDA TileLang generates for it computes it: the
    chunk's sum from +0 over its tokens in order, then added to the running total. With reduced DOUT one thread
    holds all the chunk's tokens of an element; unreduced, the two halves of the block hold the even and the odd
    tokens, each summed in order, and one add joins them (``tl::AllReduce`` over the halves). Each term is
    ``a_t·b_t`` rounded, then added, or, with ``fp32_fma``, where nvcc contracts ``dZetaZ *= z`` into the sum, an
    FMA ``fma(a_t, b_t, part)``: unreduced always, reduced under ``tilelang="0.1.15"`` only (0.1.8 keeps the
    reduced fragment in local memory and rounds the products). Read from the CUDA both versions generate for
    N = P = 64, R = 4, C = 16 (threads 128) and bit-identical to the H200's ``dmimo_z`` on the golden cases of both
    (P = 64; R = 1 to 8, C = 8 to 64; ``tests/ops/mamba_mimo_bwd_fwd/test_fp32_level_models.py``).

    Args:
        a (Tensor): ``[B, H, S, R, P]``; b: broadcastable to it. Returns: ``[B, H, R, P]``.
    """
    if policy.reduction_order == "pairwise":
        return (a * b).sum(dim=2)
    b = b.expand_as(a)
    lanes = 1 if dims.reduce_o else 2
    fused = policy.fp32_fma and (lanes == 2 or policy.tilelang != "0.1.8")
    acc = torch.zeros_like(a[:, :, 0])
    for start in range(0, dims.seqlen, dims.chunk_size):
        stop = min(start + dims.chunk_size, dims.seqlen)
        halves = []
        for lane in range(lanes):
            part = torch.zeros_like(acc)
            for t in range(start + lane, stop, lanes):
                part = (fma_fp32(a[:, :, t].contiguous(), b[:, :, t].contiguous(), part) if fused
                        else part + a[:, :, t] * b[:, :, t])
            halves.append(part)
        acc = acc + (halves[0] if lanes == 1 else halves[0] + halves[1])
    return acc
