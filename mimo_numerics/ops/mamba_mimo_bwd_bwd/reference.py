"""PyTorch reference of ``mamba_mimo_bwd_bwd`` (backward stage 2) parameterised by a rounding policy.

Chunked and vectorised over batch, heads and chunks; only the reverse dstates recurrence loops in Python (and the
rank loops of the diagonal terms, R <= 8 steps, kept sequential because upstream adds them in that order). Runs on
any torch device. Every rounding goes through ``mimo_numerics.rounding``; the sites are ``sites.SITES`` (switches
``policy.mamba_mimo_bwd_bwd.<site>``), the math is ``docs/stage2.md``, the recorded stages ``spec.STAGES``.

Scope beyond what upstream runs:

* GQA: any G dividing H. Upstream's kernel maps head h to group h // (H / G) for every such G, but
  ``mamba_mimo_bwd_combined`` refuses 1 < G < H (``ValueError`` after the kernel ran); the golden data covers
  G == 1 and G == H only.
* Tails (S % C != 0): handled as the kernel's predicated loads do (rows t >= S read as 0, DA_CS[S − 1] is the tail
  chunk's decay). Upstream's full backward asserts S % C == 0 in its Triton helpers, so no upstream run confirms
  the tail results.
* float16: the same sites with lp = float16; no upstream fp16 run exists.

FP32-level models: tensor-core accumulation under ``gemm_model`` (with the accumulating GEMMs L846, L980, L1050),
the MUFU approximations of exp/sin/cos/tanh/σ (fast math) under ``special_functions``, nvcc's FMA contraction of
the rotations and of DANGLES under ``fp32_fma``. Not modelled: other FP32 contractions and the reduction orders
(dD's 256-thread all-reduce, DMIMO_V's sequential sum over t, the reduces to DSSDA/DDA*/DFACTOR/DGAMMA_DIAG).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ... import presets as _presets
from ...policy import require_default
from ...rounding import round_sum_to_lp, round_to_lp
from ...validation import Dims
from .._common.chunked import (biased_heads, chunk_decay, discretisation, fused_first, ieee_fp32_matmul, pad_time,
                               rotate, rotation_angles)
from .._common.gemm import policy_matmul
from .._common.recurrence import STATE_ACCUMULATE_ROWS, chunk_recurrence, modelled_state_recurrence
from .._common.rounder import SiteRounder
from .._common.special import special_functions
from .sites import OPERATOR_NAME
from .spec import MimoBwdBwdOutputs
from .validation import validate_inputs


def _angle_products(grad: torch.Tensor, pre: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    dims: Dims) -> torch.Tensor:
    """The two products of DANGLES for one of q, k, each rounded (the record's ``dangles_terms``):
    ``g1·(−p1·s − p2·c)`` and ``g2·(p1·c − p2·s)``, [B, H, T, R, 2, N/d]."""
    width, half = dims.state_dim // dims.rotary_dim_divisor, dims.state_dim // 2
    g1, g2 = grad[..., :width], grad[..., half:half + width]
    p1, p2 = pre[..., :width], pre[..., half:half + width]
    return torch.stack((g1 * (-p1 * sin - p2 * cos), g2 * (p1 * cos - p2 * sin)), dim=-2)


def _angle_terms(grad: torch.Tensor, pre: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 dims: Dims, fma: bool = False) -> torch.Tensor:
    """The DANGLES contribution of one of q, k (L1067-1069, L1108-1110): [B, H, T, R, N/d].

    ``grad`` is the gradient of the rotated tensor (lp), ``pre`` the tensor before the rotation (lp):
    g1·(−p1·s − p2·c) + g2·(p1·c − p2·s). ``fma`` (``fp32_fma``): as nvcc contracts it, the first product of each
    sum fused, ``fma(g1, fma(−p1, s, −fl(p2·c)), fl(g2·fma(p1, c, −fl(p2·s))))`` (bit-equal to upstream's DANGLES
    on 99.95 % to 100 % of the golden elements; without it about 53 %).
    """
    width, half = dims.state_dim // dims.rotary_dim_divisor, dims.state_dim // 2
    g1, g2 = grad[..., :width], grad[..., half:half + width]
    p1, p2 = pre[..., :width], pre[..., half:half + width]
    along_sin = fused_first(-p1, sin, -(p2 * cos), fma)
    along_cos = fused_first(p1, cos, -(p2 * sin), fma)
    return fused_first(g1, along_sin, g2 * along_cos, fma)


def _dv_rank_sum(dpsiv: torch.Tensor, psi: torch.Tensor, rnd: SiteRounder, policy) -> torch.Tensor:
    """dv[..., p] = Σ_{r ascending} dpsiv[..., r, p]·psi[r, p] (L875-880) under ``dv_accum`` and ``diag_mode``.

    dpsiv [B, H, T, R, P]; psi [1, H, 1, R, P]. The product of two lp values is exact in fp32, so ``fma`` is one
    correctly rounded step rnd(acc + a·b), ``mul_then_add`` rnd(acc + rnd(a·b)).
    """
    terms = dpsiv * psi
    if not rnd.on("dv_accum"):
        acc = terms[..., 0, :]
        for r in range(1, terms.shape[-2]):
            acc = acc + terms[..., r, :]
        return acc
    acc = round_to_lp(terms[..., 0, :], policy.lp_dtype)  # rnd(0 + a·b) = rnd(a·b) under both modes
    for r in range(1, terms.shape[-2]):
        if policy.diag_mode == "fma":
            acc = round_sum_to_lp(acc, terms[..., r, :], policy.lp_dtype)
        else:
            acc = round_to_lp(acc + round_to_lp(terms[..., r, :], policy.lp_dtype), policy.lp_dtype)
    return acc


def _reverse_dstates(q_rot_c: torch.Tensor, dphio_scaled_c: torch.Tensor, decay: torch.Tensor,
                     policy) -> torch.Tensor:
    """The fp32 dstates seen by every chunk (L1139-1148): D_{nc−1} = 0, D_{c−1} = D_c·decay_c + q_rot_cᵀ·dΦO_c.

    Args:
        q_rot_c (Tensor): [B, H, nc, L, N]. dphio_scaled_c (Tensor): [B, H, nc, L, P].
        decay (Tensor): [B, H, nc] exp(da_cs) at the last valid token of each chunk.

    Returns:
        Tensor: [B, H, nc, N, P]; entry c is the dstates while chunk c is processed. Under
        ``state_update="accumulate_into"`` the GEMM adds into the decayed state in slices of 16 rows, ascending.
    """
    rows = q_rot_c.shape[3]
    qt = q_rot_c.transpose(-1, -2)  # [B, H, nc, N, L]
    if policy.gemm_model != "fp32":  # the mma.sync accumulating into D·decay (tensor-core model)
        return modelled_state_recurrence(qt, dphio_scaled_c, decay, policy, reverse=True)
    if policy.state_update == "separate":
        steps = [qt @ dphio_scaled_c]
    else:
        steps = [qt[..., s:s + STATE_ACCUMULATE_ROWS] @ dphio_scaled_c[..., s:s + STATE_ACCUMULATE_ROWS, :]
                 for s in range(0, rows, STATE_ACCUMULATE_ROWS)]
    # D_{c-1} = ((D_c·decay_c) + step_0[c]) + ...: the shared chunk walk run backwards (one graph replay on CUDA)
    return chunk_recurrence(torch.stack(steps, dim=3), decay, reverse=True)


@torch.no_grad()
def mamba_mimo_bwd_bwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, qk_dot,
    segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype=None, *, policy,
    record: Optional[Dict[str, torch.Tensor]] = None,
) -> MimoBwdBwdOutputs:
    """Stage 2 of the Mamba-3 MIMO backward pass, rounded as ``policy`` says.

    Args:
        dout (Tensor): ``[B, S, H, P]`` when ``mimo_o`` is given, else ``[B, S, R, H, P]``; lp.
        q, k (Tensor): ``[B, S, R, G, N]`` lp. v (Tensor): ``[B, S, H, P]`` lp.
        q_bias, k_bias (Tensor): ``[H, R, N]`` fp32. mimo_v (Tensor): Ψ ``[H, R, P]`` fp32.
        mimo_o (Tensor | None): Φ ``[H, R, P]`` fp32; selects reduced DOUT.
        states (Tensor): ``[B, H, nc, N, P]`` lp, stage 1's state at the start of every chunk.
        z (Tensor | None): ``[B, S, H, P]`` lp, with mimo_z (ζ ``[H, R, P]`` fp32).
        angles (Tensor): ``[B, S, H, N/d]`` fp32, the cumulative angles (``angle_dt_fwd``'s output).
        da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]`` fp32. trap (Tensor): ``[B, H, S]`` lp.
        d (Tensor | None): ``[H]`` fp32.
        qk_dot (Tensor): ``[B, H, S, R, R]`` lp, stage 1's same-token q̃·k̃ᵀ.
        segsum (Tensor): ``[B, H, nc, C, C]`` fp32.
        chunk_size (int): C. rotary_dim_divisor (int): d, 2 or 4.
        dtype (torch.dtype | str | None): upstream's kernel dtype; when given it must match the lp inputs.
        policy: an object with the knobs ``lp_dtype``, ``lp_torch_dtype``, ``math_dtype``, ``math_torch_dtype``,
            ``diag_mode``, ``silu_form``, ``state_update``, ``round_outputs`` and a section ``mamba_mimo_bwd_bwd``
            with one bool per site of ``sites.SITES``; lp inputs must have its ``lp_dtype``.
        record (dict, optional): filled with the stages of ``spec.STAGES``.

    Returns:
        MimoBwdBwdOutputs: upstream's raw outputs (``spec.MimoBwdBwdOutputs``); lp outputs in lp and fp32 outputs in
        float32, or every output unrounded in the math dtype when ``policy.round_outputs`` is false.
    """
    policy = _presets.resolve(policy)
    require_default(policy, "reduction_order", "stage 2's reference (its sums over time keep torch's order)")
    policy.section(OPERATOR_NAME)  # PolicyUndefined when the policy defines no stage-2 semantics (seed_bf16)
    with ieee_fp32_matmul():
        return _reference(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                          da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor, dtype, policy,
                          record)


def _reference(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
               d, qk_dot, segsum, chunk_size, rotary_dim_divisor, dtype, policy, record) -> MimoBwdBwdOutputs:
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                           da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor, dtype,
                           lp_dtype=policy.lp_torch_dtype)
    # contiguous inputs: torch reduces in the order of the operands' strides, so a strided view of an input would
    # change FP32 sums by an ulp; with this the bits depend on the values only
    (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, qk_dot,
     segsum) = (None if t is None else t.contiguous() for t in (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states,
                                                                 z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
                                                                 qk_dot, segsum))
    md = policy.math_torch_dtype
    rnd = SiteRounder(policy, OPERATOR_NAME)
    matmul = policy_matmul(policy)  # the nine wgmma GEMMs under policy.gemm_model (dstates: _reverse_dstates)
    fns = special_functions(policy)  # exp, σ, tanh, cos/sin under policy.special_functions
    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    Sp, L = dims.padded_seqlen, C * R
    out_fp = torch.float32 if policy.round_outputs else md

    def put(name, value):
        if record is not None:
            record[name] = value

    def tokens(x):  # [B, H, Sp, ...] -> [B, H, S, ...]
        return x[:, :, :S]

    def chunked(x):  # [B, H, Sp, R, X] -> [B, H, nc, L, X]
        return x.reshape(B, H, nc, L, x.shape[-1])

    def unchunk(x):  # [B, H, nc, L, X] -> [B, H, Sp, R, X]
        return x.reshape(B, H, Sp, R, x.shape[-1])

    def per_token(x):  # [B, H, Sp] -> [B, H, nc, L], each token's value on its R fused rows
        return x.reshape(B, H, nc, C).repeat_interleave(R, dim=3)

    def chunk_sum(x):  # [B, H, nc, L, X] -> [B, H, Sp]: sum over the R rows of each token and over X
        return x.reshape(B, H, nc, C, R * x.shape[-1]).sum(-1).reshape(B, H, Sp)

    # ---------------------------------------------------------------- discretisation (L689-722, L863-864)
    _, gamma, shifted, trap_scale = discretisation(dt, trap, dims, md, rnd, fns)  # [B, H, Sp]
    gamma_lp = rnd("gamma_diag", gamma)
    put("gamma", tokens(gamma)), put("shifted_gamma", tokens(shifted)), put("trap_scale", tokens(trap_scale))

    # ---------------------------------------------------------------- dΦO, the Z gate and dD (L724-755)
    v_h = pad_time(v, Sp, 1).to(md).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, Sp, 1, P]
    if dims.reduce_o:
        phi = rnd("phi_weight", mimo_o.to(md))  # [H, R, P]
        dout_h = pad_time(dout, Sp, 1).to(md).permute(0, 2, 1, 3)[:, :, :, None, :]
        dphio = rnd("dphio", dout_h * phi[None, :, None])  # [B, H, Sp, R, P]
        del dout_h  # each dead intermediate is freed as soon as it is dead (memory only: the bits do not depend on it)
    else:
        dphio = pad_time(dout, Sp, 1).to(md).permute(0, 3, 1, 2, 4)  # DOUT_r [B, H, Sp, R, P], read exactly
    if dims.has_z:
        zeta = rnd("zeta_weight", mimo_z.to(md))
        z_h = pad_time(z, Sp, 1).to(md).permute(0, 2, 1, 3)[:, :, :, None, :]
        x = rnd("z_zeta", z_h * zeta[None, :, None])
        if policy.silu_form == "tanh":
            half = x * 0.5
            gate = fused_first(half, fns.tanh(half), half, policy.fp32_fma)
        else:
            gate = x * fns.sigmoid(x)
        dphio = rnd("dphio_gate", dphio * gate)
        put("gate", tokens(gate))
        del z_h, x, gate
    put("dphio", tokens(dphio))
    dD = None
    if dims.has_d:
        dd_terms = rnd("dd_term", dphio * (v_h * mimo_v.to(md)[None, :, None]))
        put("dd_terms", tokens(dd_terms))
        dD = dd_terms.sum(dim=(2, 3, 4)).to(out_fp)  # [B, H]
        del dd_terms

    # ---------------------------------------------------------------- q, k, rotation, trap scaling (L757-807)
    q_biased = biased_heads(q, q_bias, dims, md, rnd)
    k_biased = biased_heads(k, k_bias, dims, md, rnd)
    cos, sin = rotation_angles(angles, dims, md, fns)  # [B, H, Sp, 1, N/d]
    q_rot = rotate(q_biased, cos, sin, dims, rnd, "rotary", fma=policy.fp32_fma)
    k_rot = rotate(k_biased, cos, sin, dims, rnd, "rotary", fma=policy.fp32_fma)
    k_scaled = rnd("k_scaled", k_rot * trap_scale[..., None, None])
    put("q_biased", tokens(q_biased)), put("k_biased", tokens(k_biased)), put("q_rot", tokens(q_rot))
    put("k_rot", tokens(k_rot)), put("k_scaled", tokens(k_scaled))

    psi = rnd("psi_weight", mimo_v.to(md))[None, :, None]  # [1, H, 1, R, P]
    psiv = rnd("psiv", v_h * psi)  # [B, H, Sp, R, P] (L894-896)
    q_c, k_c, dphio_c, psiv_c = chunked(q_rot), chunked(k_scaled), chunked(dphio), chunked(psiv)

    # ---------------------------------------------------------------- reverse dstates recurrence (L1133-1149)
    exp_da_cs = fns.exp(pad_time(da_cs, Sp, 2).to(md))  # [B, H, Sp]
    exp_da_cs_rev = fns.exp(pad_time(da_cs_rev, Sp, 2).to(md))
    row_cs, row_rev = per_token(exp_da_cs)[..., None], per_token(exp_da_cs_rev)[..., None]  # [B, H, nc, L, 1]
    decay = chunk_decay(exp_da_cs, dims)  # [B, H, nc]
    dphio_scaled = rnd("dphio_scaled", dphio_c * row_cs)
    dstates = _reverse_dstates(q_c, dphio_scaled, decay, policy)  # [B, H, nc, N, P]
    dstates_op = rnd("dstates_operand", dstates)
    put("dphio_scaled", tokens(unchunk(dphio_scaled))), put("dstates", dstates)
    put("dstates_operand", dstates_op)
    del dphio_scaled

    # ---------------------------------------------------------------- dΨV (L809-871)
    dpsiv_inter = matmul(k_c, dstates_op) * row_rev  # [B, H, nc, L, P]
    lkq = matmul(k_c, q_c.transpose(-1, -2))  # [B, H, nc, L(k rows i), L(q rows j)]
    lkq_stored = rnd("lkq", lkq)
    # reverse-causal mask t_i < t_j and decay exp(segsum[t_j, t_i]) at token granularity, broadcast over the ranks
    step = torch.arange(C, device=dims.device)
    reverse_causal = (step[:, None] < step[None, :])[:, None, :, None]  # [C, 1, C, 1]
    seg_t = segsum.to(md).transpose(-1, -2)[:, :, :, :, None, :, None]  # [B, H, nc, C(i), 1, C(j), 1]
    decay_ij = fns.exp(torch.where(reverse_causal, seg_t, torch.zeros_like(seg_t)))
    zero = torch.zeros((), dtype=md, device=dims.device)

    def masked(scores):  # [B, H, nc, L, L] -> reverse-causal, decayed
        s7 = scores.view(B, H, nc, C, R, C, R)
        return torch.where(reverse_causal, s7 * decay_ij, zero).reshape(B, H, nc, L, L)

    lkq_masked = rnd("lkq_masked", masked(lkq_stored if R == 1 else lkq))
    del lkq
    dpsiv = matmul(lkq_masked, dphio_c, dpsiv_inter)  # the GEMM accumulates into dΨV (L846)
    if dims.has_d:
        dpsiv = dpsiv + dphio_c * d.to(md)[None, :, None, None, None]
    dpsiv = unchunk(dpsiv)  # [B, H, Sp, R(in), P]
    qk = pad_time(qk_dot, Sp, 2).to(md)  # [B, H, Sp, R(out), R(in)]
    for r_out in range(R):
        term = rnd("dpsiv_diag_qk", dphio[:, :, :, r_out, None, :] * qk[:, :, :, r_out, :, None])
        dpsiv = dpsiv + rnd("dpsiv_diag_gamma", term * gamma_lp[..., None, None])
    put("dpsiv_inter", tokens(unchunk(dpsiv_inter))), put("lkq", lkq_stored), put("lkq_masked", lkq_masked)
    put("dpsiv_accum", tokens(dpsiv)), put("gamma_lp", tokens(gamma_lp))
    del dpsiv_inter, lkq_masked, term
    dpsiv = rnd("dpsiv", dpsiv)
    put("dpsiv", tokens(dpsiv))

    # ---------------------------------------------------------------- DV and dΨ (L873-889)
    dv_acc = _dv_rank_sum(dpsiv, psi, rnd, policy)  # [B, H, Sp, P]
    put("dv_accum", tokens(dv_acc)), put("psiv", tokens(psiv))
    dv = rnd.output(tokens(dv_acc)).permute(0, 2, 1, 3).contiguous()  # [B, S, H, P]
    dmimo_v = (dpsiv * v_h).sum(dim=2).to(out_fp)  # [B, H, R, P]
    del dv_acc, dpsiv

    # ---------------------------------------------------------------- same-token (diagonal) terms (L903-926)
    dqk_diag = matmul(dphio, psiv.transpose(-1, -2))  # [B, H, Sp, R(out), R(in)]
    dgamma_diag = (qk * dqk_diag).sum(dim=(-1, -2))  # [B, H, Sp]
    dqk_gamma = dqk_diag * gamma[..., None, None]
    put("dqk_diag", tokens(dqk_diag))
    del dqk_diag

    # ---------------------------------------------------------------- dk (L928-995)
    dk_inter_raw = matmul(psiv_c, dstates_op.transpose(-1, -2))  # [B, H, nc, L, N]
    ddA_cs_rev = chunk_sum(k_c * dk_inter_raw)
    dk_inter = rnd("dk_inter", dk_inter_raw * row_rev)
    del dk_inter_raw
    dk_intra = matmul(psiv_c, dphio_c.transpose(-1, -2))  # [B, H, nc, L(i), L(j)]
    dssda_terms = rnd("dssda_term", lkq_stored * dk_intra)
    dSSdA = dssda_terms.view(B, H, nc, C, R, C, R).sum(dim=6).sum(dim=4)  # [B, H, nc, C(k token), C(q token)]
    del lkq_stored, psiv_c, psiv
    dkq = rnd("dkq_masked", masked(dk_intra))
    dk_nodiag = matmul(dkq, q_c, dk_inter)  # the GEMM accumulates into the rounded dk_inter (L977-980)
    dfactor = chunk_sum(chunked(k_rot) * dk_nodiag)
    dk_rot = rnd("dk_scaled", dk_nodiag * per_token(trap_scale)[..., None])
    put("dk_inter", tokens(unchunk(dk_inter))), put("dk_intra_scores", dk_intra), put("dssda_terms", dssda_terms)
    put("dkq_masked", dkq), put("dk_nodiag", tokens(unchunk(dk_nodiag))), put("dk_rot", tokens(unchunk(dk_rot)))
    del dk_inter, dk_intra, dssda_terms, dk_nodiag, k_rot

    # ---------------------------------------------------------------- state passing and dq (L997-1051)
    states_md = states.to(md)  # [B, H, nc, N, P]
    dda_terms = states_md * dstates * decay[..., None, None]
    ddA = dda_terms.sum(dim=(-1, -2)).repeat_interleave(C, dim=2)  # [B, H, Sp]
    dq_inter_raw = matmul(dphio_c, states_md.transpose(-1, -2))  # [B, H, nc, L, N]
    ddA_cs = chunk_sum(q_c * dq_inter_raw)
    dq_inter = rnd("dq_inter", dq_inter_raw * row_cs)
    dq_rot = rnd("dq_combined", matmul(dkq.transpose(-1, -2), k_c, dq_inter))  # accumulates into dq_inter
    put("dda_terms", dda_terms), put("dq_inter", tokens(unchunk(dq_inter))), put("dq_rot", tokens(unchunk(dq_rot)))
    del dda_terms, dq_inter_raw, dq_inter, dkq, states_md, dstates, dstates_op, k_scaled, k_c

    # ---------------------------------------------------------------- inverse rotary, dangles, dq/dk (L1053-1131)
    dk_rot, dq_rot = unchunk(dk_rot), unchunk(dq_rot)  # [B, H, Sp, R, N]
    # the dk part, then the dq part added to it (L1066-1112), per rank; then Σ_r ascending (L1113-1116)
    per_rank = (_angle_terms(dk_rot, k_biased, cos, sin, dims, policy.fp32_fma)
                + _angle_terms(dq_rot, q_biased, cos, sin, dims, policy.fp32_fma))  # [B, H, Sp, R, N/d]
    dangles = per_rank[..., 0, :]
    for r in range(1, R):
        dangles = dangles + per_rank[..., r, :]
    del per_rank
    if record is not None:
        put("dangles_terms", tokens(torch.cat((_angle_products(dk_rot, k_biased, cos, sin, dims),
                                               _angle_products(dq_rot, q_biased, cos, sin, dims)), dim=-2)))
    dk_unrot = rotate(dk_rot, cos, sin, dims, rnd, "dk_unrotate", inverse=True, fma=policy.fp32_fma)
    dq_unrot = rotate(dq_rot, cos, sin, dims, rnd, "dq_unrotate", inverse=True, fma=policy.fp32_fma)
    put("dk_unrotated", tokens(dk_unrot)), put("dq_unrotated", tokens(dq_unrot))
    dk_full, dq_full = dk_unrot, dq_unrot
    for r in range(R):  # dk[r_in] += dqk[r, r_in]·q̃[r] (ascending r_out); dq[r_out] += dqk[r_out, r]·k̃[r]
        dk_full = dk_full + dqk_gamma[..., r, :, None] * q_biased[:, :, :, r, None, :]
        dq_full = dq_full + dqk_gamma[..., :, r, None] * k_biased[:, :, :, r, None, :]

    def lp_heads(x):  # [B, H, Sp, R, N] -> [B, S, R, H, N] lp output
        return rnd.output(tokens(x)).permute(0, 2, 3, 1, 4).contiguous()

    def fp32_out(x):
        return x.to(out_fp).contiguous()

    return MimoBwdBwdOutputs(
        dq=lp_heads(dq_full), dk=lp_heads(dk_full), dv=dv, dmimo_v=fp32_out(dmimo_v), dD=dD,
        dangles=fp32_out(tokens(dangles).permute(0, 2, 1, 3)), dfactor=fp32_out(tokens(dfactor)),
        dgamma_diag=fp32_out(tokens(dgamma_diag)), ddA=fp32_out(tokens(ddA)), dSSdA=fp32_out(dSSdA),
        ddA_cs_rev=fp32_out(tokens(ddA_cs_rev)), ddA_cs=fp32_out(tokens(ddA_cs)))
