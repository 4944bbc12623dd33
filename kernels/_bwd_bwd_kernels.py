"""Triton kernels of ``mamba_mimo_bwd_bwd`` (Mamba-3 MIMO backward, stage 2) under a ``RoundingPolicy``.

One source for NVIDIA GPUs, Triton-Ascend and Triton's CPU interpreter, the rules of ``_mimo_kernels.py`` (lp values
as int16 bits, integer RNE helpers, FP32 math, masked in-bounds accesses, 1-D grids). The math is the stage-2
reference's (``mimo_numerics/ops/mamba_mimo_bwd_bwd/reference.py``, ``docs/stage2.md``); the site names are those of
``mimo_numerics/ops/mamba_mimo_bwd_bwd/sites.py``, each an upper-case bool constexpr. Fused rows of a chunk are
i = t_local·R + r (C·R of them, padded to LP); rows past C·R or past S are zero in every workspace.

Upstream walks all chunks of a (batch, head) in one program; here only the reverse dstates walk is sequential. The
plan (``kernels.mimo_bwd_bwd.Stage2Tiles``): BR fused rows per program, BT tokens per program (constexprs; CUDA
up to 32 rows of a chunk; Ascend 8 rows, 16 tokens, ``npu_tiles``):

1. ``_bwd2_rows_kernel``   grid B·H·nc·LP/BR: per fused row q̃, k̃ and their rotations, k̂ = R(k_rot·trap_scale),
   ΨV, dΦO (with the Z gate), R(dΦO·exp(da_cs)) and the row's D terms. Sites: qk_bias, qk_biased, rotary, dt_input,
   shifted_gamma, trap_scale, k_scaled, psi_weight, psiv, phi_weight, dphio, zeta_weight, z_zeta, dphio_gate,
   dphio_scaled, dd_term. Writes FP32 workspaces (values on the lp grid where the policy rounds them).
2. ``_bwd2_dstates_kernel`` grid B·H·(N tiles)·(P tiles): the reverse walk D_{nc−1} = 0, D_{c−1} = D_c·decay_c (+)
   q_rot_cᵀ·R(dΦO_c·exp(da_cs)) (``state_update``), FP32 D_c stored for every chunk (stage 1's state step, run
   backwards over other operands).
3. ``_bwd2_kside_kernel``  grid B·H·nc·LP/BR: the k-side rows' gradients against D_c and every row of the chunk:
   dΨV (inter, the reverse-causal scores, the D term, the diagonal terms), dk (inter, intra, the scaled
   dk), the rows' dSSdA terms by column token, the per-row parts of ddA_cs_rev, dfactor and dγ_diag. Sites:
   dstates_operand, lkq, lkq_masked, dpsiv_diag_qk, gamma_diag, dpsiv_diag_gamma, dpsiv, dk_inter, dssda_term,
   dkq_masked, dk_scaled.
4. ``_bwd2_qside_kernel``  grid B·H·nc·LP/BR: the q-side rows' dq (inter, combined with Σ_i dkq·k̂ over the k-side
   rows), the per-row part of ddA_cs, the chunk's ddA. Sites: dkq_masked, dq_inter, dq_combined.
5. ``_bwd2_token_kernel``  grid B·H·nc·CP/BT: per token, over its R rows in ascending rank order: dv (dv_accum,
   ``diag_mode``), the dmimo_v partials, dangles, the inverse rotations (dk_unrotate, dq_unrotate), the same-token
   terms of dq and dk, the token sums, dSSdA's rows; writes every output but dmimo_v (then ``_mimo_reduce_kernel``).

FP32-level orders that differ from upstream (none is a site): GEMMs as ``tl.dot``, with bf16/fp16 operands on devices
where both operands are on the lp grid (``DOT_*_LP``: exact products, FP32 accumulation in the backend's order) and
IEEE FP32 otherwise (the interpreter always; upstream: wgmma with bf16 operands and its truncating alignment); dq's Σ_i dkq·k̂ is computed as
(dΦO·ΨVᵀ)ᵀ per q-side block (the same products); the token and chunk sums (chunk_sum, dSSdA's rank-pair sums — by
column token first, then the R rows of a row token —, dD, ddA, dmimo_v) as tree sums in the program, then in block
and chunk order (upstream: its own thread layout and a running sum over time); special functions as in
``_mimo_kernels.py`` (``_rounding.sincos``, ``tl.exp``, the Z gate's ``silu_parts``); no FP32 FMA contraction on
CUDA (upstream contracts).
"""

import triton
import triton.language as tl

from ._mimo_kernels import biased_rotated, gamma_trap_scale, rank_rows, rotation
from ._rounding import bits_operand, dec, enc, fzeros, mma, operand, rnd, rnd_if, rnd_sum, silu_parts, tsum


@triton.jit
def _ws_store(ptr, offs, x, AS_LP: tl.constexpr, LPK: tl.constexpr):
    """Store an FP32 workspace tile, as lp bits when its values are on the lp grid (AS_LP: exact) else FP32."""
    if AS_LP:
        tl.store(ptr + offs, enc(x, LPK))
    else:
        tl.store(ptr + offs, x)


@triton.jit
def _ws_value(raw, AS_LP: tl.constexpr, LPK: tl.constexpr):
    """A loaded workspace tile (lp bits or FP32) as FP32 values."""
    if AS_LP:
        return dec(raw, LPK)
    else:
        return raw


@triton.jit
def _ws_operand(raw, AS_LP: tl.constexpr, LP_OPS: tl.constexpr, LPK: tl.constexpr):
    """A loaded workspace tile as a ``tl.dot`` operand: lp bits feeding an lp GEMM reinterpreted as bf16/fp16 (no FP32
    round trip), everything else as FP32 (cast to lp when LP_OPS: exact, the values are on the grid)."""
    if AS_LP:
        if LP_OPS:
            return bits_operand(raw, LPK)
        else:
            return dec(raw, LPK)
    else:
        return operand(raw, LP_OPS, LPK)


@triton.jit
def _ws_load_m(ptr, offs, mask, AS_LP: tl.constexpr, LPK: tl.constexpr):
    """A masked load of a workspace tile as FP32 values (0 where ``mask`` is false)."""
    if AS_LP:
        return dec(tl.load(ptr + offs, mask=mask, other=0), LPK)
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def _rows_of_block(c, i0, S, R: tl.constexpr, C: tl.constexpr, BR: tl.constexpr):
    """Fused rows i0 … i0 + BR − 1 of chunk c: (i, t_local, rank, token t, ok = i < C·R and t < S)."""
    i = i0 + tl.arange(0, BR)
    t_loc = i // R
    t = c * C + t_loc
    ok = (i < C * R) & (t < S)
    return i, t_loc, i % R, t, ok


@triton.jit
def _bwd2_rows_kernel(
    dout_ptr, q_ptr, k_ptr, v_ptr, z_ptr, q_bias_ptr, k_bias_ptr, mimo_v_ptr, mimo_o_ptr, mimo_z_ptr, cs_ptr, sn_ptr,
    dt_ptr, trap_ptr, da_cs_ptr, qb_ptr, kb_ptr, qrot_ptr, krot_ptr, khat_ptr, dphio_ptr, dps_ptr, psiv_ptr, dd_ptr,
    S, H, HPG, nc,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, BR: tl.constexpr,
    AW: tl.constexpr, LPK: tl.constexpr, QK_BIAS: tl.constexpr, QK_BIASED: tl.constexpr, ROTARY: tl.constexpr,
    DT_INPUT: tl.constexpr, SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr, K_SCALED: tl.constexpr,
    PSI_WEIGHT: tl.constexpr, PSIV: tl.constexpr, PHI_WEIGHT: tl.constexpr, DPHIO: tl.constexpr,
    ZETA_WEIGHT: tl.constexpr, Z_ZETA: tl.constexpr, DPHIO_GATE: tl.constexpr, DPHIO_SCALED: tl.constexpr,
    DD_TERM: tl.constexpr, SILU_TANH: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
    REDUCE_O: tl.constexpr, WS_QB: tl.constexpr, WS_QROT: tl.constexpr, WS_KHAT: tl.constexpr,
    WS_DPHIO: tl.constexpr, WS_DPS: tl.constexpr, WS_PSIV: tl.constexpr,
):
    """The per-row quantities of one block of BR fused rows (program → (b, h, chunk c, row block)).

    Inputs: dout, q, k, v, z, trap (int16 bits) and the FP32 tensors of the API; cs, sn [B, S, H, AW] from
    ``_mimo_angles_kernel``. Outputs (FP32, [B·H·nc, LP, N] or [B·H·nc, LP, P], invalid rows 0): qb = q̃, kb = k̃,
    qrot, krot (rotated), khat = k̂, dphio = dΦO (after the Z gate), dps = R(dΦO·exp(da_cs)), psiv = ΨV; dd
    [B·H·nc·LP/BR]: the block's Σ R(dΦO·(v·Ψ)) (HAS_D).

    Compile-time constants: N, P, R, C, LP, BR (rows per program, dividing LP), AW (rotated columns per half), LPK;
    the policy switches named as the sites; SILU_TANH (``silu_form``); HAS_Z, HAS_D, REDUCE_O (branches); WS_QB,
    WS_QROT, WS_KHAT, WS_DPHIO, WS_DPS, WS_PSIV: the workspace holds lp bits (its values are on the lp grid under the
    policy: ``kernels.mimo_bwd_bwd.workspace_formats``) instead of FP32.
    """
    pid = tl.program_id(0)
    NRB: tl.constexpr = LP // BR
    bhc = pid // NRB
    c = bhc % nc
    bh = bhc // nc
    b = bh // H
    h = bh % H
    g = h // HPG
    G = H // HPG
    i, t_loc, r_i, t, ok = _rows_of_block(c, (pid % NRB) * BR, S, R, C, BR)
    t_s = tl.where(ok, t, 0)
    i_s = tl.where(ok, i, 0)
    n = tl.arange(0, N)
    p = tl.arange(0, P)
    row0 = b.to(tl.int64) * S + c * C
    hs_base = bh.to(tl.int64) * S
    qk_base = (row0 * R * G + g) * N
    v_base = (row0 * H + h) * P
    a_base = (row0 * H + h) * AW
    tok_p = tl.where(ok, t_loc, 0)[:, None] * (H * P) + p[None, :]
    # per-rank rows of the parameters; with R = 1 one row, loaded once (a zero-stride view is rejected on Ascend)
    ONE: tl.constexpr = R == 1
    if ONE:
        prow_n = 0
        prow_p = 0
    else:
        prow_n = r_i * N
        prow_p = r_i * P

    _, _, ts = gamma_trap_scale(dt_ptr + hs_base, trap_ptr + hs_base, t, ok, S, LPK, DT_INPUT, SHIFTED_GAMMA,
                                 TRAP_SCALE)
    cs, sn = rotation(cs_ptr + a_base, sn_ptr + a_base, tl.where(ok, t_loc, 0) * (H * AW), ok, N, AW)
    qb, qr = biased_rotated(q_ptr + qk_base, q_bias_ptr + h * (R * N), i_s * (G * N), prow_n, ok, cs, sn, N, AW, LPK,
                             QK_BIAS, QK_BIASED, ROTARY, ONE)
    kb, kr = biased_rotated(k_ptr + qk_base, k_bias_ptr + h * (R * N), i_s * (G * N), prow_n, ok, cs, sn, N, AW, LPK,
                             QK_BIAS, QK_BIASED, ROTARY, ONE)
    khat = rnd_if(kr * ts[:, None], K_SCALED, LPK)

    vv = dec(tl.load(v_ptr + v_base + tok_p, mask=ok[:, None], other=0), LPK)
    psi_raw = rank_rows(mimo_v_ptr + h * (R * P), prow_p, p, ONE)
    psiv = rnd_if(vv * rnd_if(psi_raw, PSI_WEIGHT, LPK), PSIV, LPK)
    if REDUCE_O:
        do_t = dec(tl.load(dout_ptr + v_base + tok_p, mask=ok[:, None], other=0), LPK)
        phi = rnd_if(rank_rows(mimo_o_ptr + h * (R * P), prow_p, p, ONE), PHI_WEIGHT, LPK)
        dphio = rnd_if(do_t * phi, DPHIO, LPK)
    else:
        # DOUT_r [B, S, R, H, P], read exactly
        dfull = (row0 * R * H + h) * P + i_s[:, None] * (H * P) + p[None, :]
        dphio = dec(tl.load(dout_ptr + dfull, mask=ok[:, None], other=0), LPK)
    if HAS_Z:
        z_t = dec(tl.load(z_ptr + v_base + tok_p, mask=ok[:, None], other=0), LPK)
        zeta = rnd_if(rank_rows(mimo_z_ptr + h * (R * P), prow_p, p, ONE), ZETA_WEIGHT, LPK)
        x = rnd_if(z_t * zeta, Z_ZETA, LPK)
        gate, _, _ = silu_parts(x, SILU_TANH, False)
        dphio = rnd_if(dphio * gate, DPHIO_GATE, LPK)
    e_cs = tl.exp(tl.load(da_cs_ptr + hs_base + t_s, mask=ok, other=0.0))
    dps = rnd_if(dphio * e_cs[:, None], DPHIO_SCALED, LPK)
    if HAS_D:
        dd = rnd_if(dphio * (vv * psi_raw), DD_TERM, LPK)
        tl.store(dd_ptr + pid, tsum(tsum(tl.where(ok[:, None], dd, 0.0), axis=1), axis=0))

    okn = ok[:, None]
    rows_n = bhc.to(tl.int64) * (LP * N) + i[:, None] * N + n[None, :]
    rows_p = bhc.to(tl.int64) * (LP * P) + i[:, None] * P + p[None, :]
    _ws_store(qb_ptr, rows_n, tl.where(okn, qb, 0.0), WS_QB, LPK)
    _ws_store(kb_ptr, rows_n, tl.where(okn, kb, 0.0), WS_QB, LPK)
    _ws_store(qrot_ptr, rows_n, tl.where(okn, qr, 0.0), WS_QROT, LPK)
    _ws_store(krot_ptr, rows_n, tl.where(okn, kr, 0.0), WS_QROT, LPK)
    _ws_store(khat_ptr, rows_n, tl.where(okn, khat, 0.0), WS_KHAT, LPK)
    _ws_store(dphio_ptr, rows_p, tl.where(okn, dphio, 0.0), WS_DPHIO, LPK)
    _ws_store(dps_ptr, rows_p, tl.where(okn, dps, 0.0), WS_DPS, LPK)
    _ws_store(psiv_ptr, rows_p, tl.where(okn, psiv, 0.0), WS_PSIV, LPK)


@triton.jit
def _bwd2_dstates_kernel(
    qrot_ptr, dps_ptr, da_cs_ptr, dst_ptr, S, nc, n_nt, n_pt,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, BN: tl.constexpr,
    BP: tl.constexpr, LPK: tl.constexpr, ACCUMULATE: tl.constexpr, DOT_WALK_LP: tl.constexpr,
    WS_QROT: tl.constexpr, WS_DPS: tl.constexpr,
):
    """The reverse walk over the chunks: dst[c] = D_c, D_{nc−1} = 0, D_{c−1} = D_c·decay_c (+) q_rot_cᵀ·dps_c.

    Grid: 1-D, B·H·n_nt·n_pt programs; program → (b, h, N tile of BN rows, P tile of BP columns), walking the chunks
    from the last one down. Inputs: qrot [B·H·nc, LP, N], dps [B·H·nc, LP, P] (FP32, from ``_bwd2_rows_kernel``),
    da_cs [B, H, S]. Output: dst [B, H, nc, N, P] FP32. ACCUMULATE: ``state_update="accumulate_into"`` (16 rows at a
    time into the decayed D) else ``"separate"``. DOT_WALK_LP (devices): both operands hold lp values (q_rot and
    R(dΦO·exp(da_cs)) rounded under the policy), so the GEMM takes them as bf16/fp16 (exact products, FP32
    accumulation). WS_QROT, WS_DPS: those workspaces hold lp bits. No rounding site (dstates_operand is applied
    where D is read).
    """
    pid = tl.program_id(0)
    pt = pid % n_pt
    rest = pid // n_pt
    nt = rest % n_nt
    bh = rest // n_nt
    nn = nt * BN + tl.arange(0, BN)
    pp = pt * BP + tl.arange(0, BP)
    hs_base = bh.to(tl.int64) * S
    st_offs = nn[:, None] * P + pp[None, :]
    state = fzeros(BN, BP)
    for cc in range(0, nc):
        c = nc - 1 - cc
        tl.store(dst_ptr + (bh.to(tl.int64) * nc + c) * (N * P) + st_offs, state)
        last = tl.minimum((c + 1) * C, S) - 1
        decay = tl.exp(tl.load(da_cs_ptr + hs_base + last))
        chunk = bh.to(tl.int64) * nc + c
        state = _walk_step(state, decay, qrot_ptr, dps_ptr, chunk, nn, pp, N, P, LP, LPK, ACCUMULATE, DOT_WALK_LP,
                           WS_QROT, WS_DPS)


@triton.jit
def _walk_step(state, decay, qrot_ptr, dps_ptr, chunk, nn, pp, N: tl.constexpr, P: tl.constexpr, LP: tl.constexpr,
               LPK: tl.constexpr, ACCUMULATE: tl.constexpr, DOT_WALK_LP: tl.constexpr, WS_QROT: tl.constexpr,
               WS_DPS: tl.constexpr):
    """D ← D·decay (+) q_rotᵀ·dps of chunk ``chunk`` on the tile (rows ``nn``, columns ``pp``): ``accumulate_into``
    one slice of 16 fused rows at a time into the decayed D, ``separate`` the chunk's sum first."""
    if ACCUMULATE:
        state = state * decay
        for s in tl.static_range(LP // 16):
            i = s * 16 + tl.arange(0, 16)
            qt = _ws_operand(tl.load(qrot_ptr + chunk * (LP * N) + nn[:, None] + i[None, :] * N), WS_QROT,
                             DOT_WALK_LP, LPK)
            pv = _ws_operand(tl.load(dps_ptr + chunk * (LP * P) + i[:, None] * P + pp[None, :]), WS_DPS,
                             DOT_WALK_LP, LPK)
            state = state + mma(qt, pv, DOT_WALK_LP, LPK)
    else:
        i = tl.arange(0, LP)
        qt = _ws_operand(tl.load(qrot_ptr + chunk * (LP * N) + nn[:, None] + i[None, :] * N), WS_QROT, DOT_WALK_LP,
                         LPK)
        pv = _ws_operand(tl.load(dps_ptr + chunk * (LP * P) + i[:, None] * P + pp[None, :]), WS_DPS, DOT_WALK_LP,
                         LPK)
        state = state * decay + mma(qt, pv, DOT_WALK_LP, LPK)
    return state


@triton.jit
def _reverse_causal(x, rc, seg_ptr, seg_offs):
    """x·exp(segsum[t_j, t_i]) where t_i < t_j (``rc``), else 0: the reverse-causal decay of the stage-2 scores."""
    seg = tl.load(seg_ptr + seg_offs)
    return tl.where(rc, x * tl.exp(tl.where(rc, seg, 0.0)), 0.0)


@triton.jit
def _chunk_block(pid, S, nc, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, BR: tl.constexpr):
    """Program → (chunk bhc, its index c, b·H + h, the block's rows (i, t_local, rank, token, ok))."""
    NRB: tl.constexpr = LP // BR
    bhc = pid // NRB
    c = bhc % nc
    i, t_loc, r_i, t, ok = _rows_of_block(c, (pid % NRB) * BR, S, R, C, BR)
    return bhc, c, bhc // nc, i, t_loc, r_i, t, ok


@triton.jit
def _bwd2_kside_kernel(
    qk_ptr, dt_ptr, trap_ptr, da_cs_rev_ptr, d_ptr, segsum_ptr, qrot_ptr, krot_ptr, khat_ptr, dphio_ptr, psiv_ptr,
    dst_ptr, dpsiv_ptr, dqk_ptr, dkrot_ptr, rowsum_ptr, pairs_ptr, S, H, nc,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, CP: tl.constexpr,
    BR: tl.constexpr, LPK: tl.constexpr, DT_INPUT: tl.constexpr, SHIFTED_GAMMA: tl.constexpr,
    TRAP_SCALE: tl.constexpr, DSTATES_OPERAND: tl.constexpr, LKQ: tl.constexpr, LKQ_MASKED: tl.constexpr,
    DPSIV_DIAG_QK: tl.constexpr, GAMMA_DIAG: tl.constexpr, DPSIV_DIAG_GAMMA: tl.constexpr, DPSIV: tl.constexpr,
    DK_INTER: tl.constexpr, DSSDA_TERM: tl.constexpr, DKQ_MASKED: tl.constexpr, DK_SCALED: tl.constexpr,
    HAS_D: tl.constexpr, DOT_KD_LP: tl.constexpr, DOT_KQ_LP: tl.constexpr, DOT_SD_LP: tl.constexpr,
    DOT_PD_LP: tl.constexpr, DOT_PP_LP: tl.constexpr, DOT_DQ_LP: tl.constexpr, WS_QROT: tl.constexpr,
    WS_KHAT: tl.constexpr, WS_DPHIO: tl.constexpr, WS_PSIV: tl.constexpr, WS_DPSIV: tl.constexpr,
    WS_DKROT: tl.constexpr, SIDES: tl.constexpr,
):
    """The gradients of the k-side rows of one block (program → (b, h, chunk c, block of BR fused rows i)): the
    rows' dΨV, dk and their dSSdA terms, against every row j of the chunk and D_c.

    Inputs: qk_dot [B, H, S, R, R] (stage 1's, int16 bits); dt, trap, da_cs_rev, d, segsum as in the API; the
    workspaces of ``_bwd2_rows_kernel`` and dst (D_c) of ``_bwd2_dstates_kernel``. Outputs (FP32 workspaces, rows
    as the inputs'): dpsiv = R(dΨV) [.., LP, P]; dqk [.., LP, R]: row (t, r_out), column r_in: Σ_p dΦO[t, r_out]·
    ΨV[t, r_in] (not rounded); dkrot = R(dk_nodiag·trap_scale) [.., LP, N]; rowsum [.., 4, LP] rows 0, 1, 3: per
    row Σ_n k̂·dk_inter_raw, Σ_n k_rot·dk_nodiag, Σ_r_in qk·dqk; pairs [B·H·nc, LP, CP]: per row i and token u of
    the chunk, Σ over the rows j of u of R(lkq·dk_intra)[i, j] (the token kernel adds the R rows of a token).

    Compile-time constants: N, P, R, C, LP, CP (padded tokens per chunk), BR (rows per program, dividing LP), LPK,
    the policy switches named as the sites, HAS_D. DOT_*_LP (devices): both operands of that GEMM hold lp values
    under the policy, so it takes them as bf16/fp16 (exact products, FP32 accumulation; else IEEE FP32): KD k̂·D,
    KQ k̂·q_rotᵀ, SD scores·dΦO, PD ΨV·Dᵀ, PP ΨV·dΦOᵀ, DQ dkq·q_rot. WS_*: which workspaces hold lp bits (read and
    written so; the values are the same). SIDES: which outputs this launch writes, a bit mask: 1 the dΨV side
    (dpsiv, dqk, rowsum row 3), 2 dSSdA's terms (pairs), 4 dk (dkrot, rowsum rows 0 and 1); 7 all of them. Launches
    with complementary masks split the work, each with fewer live tiles a program (``Stage2Tiles.kside_parts``).
    Each output is computed by the same operations in the same order whatever SIDES (a launch that needs lkq =
    k̂·q_rotᵀ or dk_intra = ΨV·dΦOᵀ computes it itself: the same GEMM on the same operands).
    """
    bhc, c, bh, i, t_loc, r_i, t, ok = _chunk_block(tl.program_id(0), S, nc, R, C, LP, BR)
    DPSIV_SIDE: tl.constexpr = (SIDES & 1) != 0
    PAIRS_SIDE: tl.constexpr = (SIDES & 2) != 0
    DK_SIDE: tl.constexpr = (SIDES & 4) != 0
    NEEDS_LKQ: tl.constexpr = (SIDES & 3) != 0
    NEEDS_DK_INTRA: tl.constexpr = (SIDES & 6) != 0
    NEEDS_GAMMA: tl.constexpr = (SIDES & 5) != 0
    h = bh % H
    t_s = tl.where(ok, t, 0)
    n = tl.arange(0, N)
    p = tl.arange(0, P)
    j = tl.arange(0, LP)  # every row of the chunk (q side)
    t_j = j // R
    ok_j = (j < C * R) & (c * C + t_j < S)
    hs_base = bh.to(tl.int64) * S
    okn = ok[:, None]
    rows_n = bhc.to(tl.int64) * (LP * N) + i[:, None] * N + n[None, :]
    rows_p = bhc.to(tl.int64) * (LP * P) + i[:, None] * P + p[None, :]
    khat_raw = tl.load(khat_ptr + rows_n)
    qrot_all = tl.load(qrot_ptr + bhc.to(tl.int64) * (LP * N) + j[:, None] * N + n[None, :])
    dphio_all = tl.load(dphio_ptr + bhc.to(tl.int64) * (LP * P) + j[:, None] * P + p[None, :])
    dop = rnd_if(tl.load(dst_ptr + bhc.to(tl.int64) * (N * P) + n[:, None] * P + p[None, :]), DSTATES_OPERAND, LPK)
    e_rev = tl.exp(tl.load(da_cs_rev_ptr + hs_base + t_s, mask=ok, other=0.0))

    # reverse-causal mask t_i < t_j and exp(segsum[t_j, t_i]) (rows i: k side, columns j: q side)
    rc = (t_loc[:, None] < t_j[None, :]) & okn & ok_j[None, :]
    seg_offs = bhc.to(tl.int64) * (C * C) + tl.minimum(t_j, C - 1)[None, :] * C + tl.minimum(t_loc, C - 1)[:, None]
    if NEEDS_LKQ:
        lkq = mma(_ws_operand(khat_raw, WS_KHAT, DOT_KQ_LP, LPK),
                  tl.trans(_ws_operand(qrot_all, WS_QROT, DOT_KQ_LP, LPK)), DOT_KQ_LP, LPK)
        lkq_st = rnd_if(lkq, LKQ, LPK)
    if NEEDS_DK_INTRA:
        psiv_raw = tl.load(psiv_ptr + rows_p)
        dk_intra = mma(_ws_operand(psiv_raw, WS_PSIV, DOT_PP_LP, LPK),
                       tl.trans(_ws_operand(dphio_all, WS_DPHIO, DOT_PP_LP, LPK)), DOT_PP_LP, LPK)
    qk_tok = (hs_base + t_s) * (R * R)
    tok_rows = bhc.to(tl.int64) * LP + (tl.where(ok, t_loc, 0) * R)
    rs = rowsum_ptr + bhc.to(tl.int64) * (4 * LP) + i
    if NEEDS_GAMMA:  # γ for the dΨV side, trap_scale for dk
        gamma, _, ts = gamma_trap_scale(dt_ptr + hs_base, trap_ptr + hs_base, t, ok, S, LPK, DT_INPUT,
                                        SHIFTED_GAMMA, TRAP_SCALE)

    if DPSIV_SIDE:
        # ---- dΨV
        dphio = _ws_value(tl.load(dphio_ptr + rows_p), WS_DPHIO, LPK)
        dpsiv = mma(_ws_operand(khat_raw, WS_KHAT, DOT_KD_LP, LPK), dop, DOT_KD_LP, LPK) * e_rev[:, None]
        if R == 1:
            lkq_m = rnd_if(_reverse_causal(lkq_st, rc, segsum_ptr, seg_offs), LKQ_MASKED, LPK)
        else:
            lkq_m = rnd_if(_reverse_causal(lkq, rc, segsum_ptr, seg_offs), LKQ_MASKED, LPK)
        dpsiv = dpsiv + mma(lkq_m, _ws_operand(dphio_all, WS_DPHIO, DOT_SD_LP, LPK), DOT_SD_LP, LPK)
        if HAS_D:
            dpsiv = dpsiv + dphio * tl.load(d_ptr + h)
        # same-token terms: dΨV[t, r_in] += R(R(dΦO[t, r_out]·qk[t, r_out, r_in])·R(γ_t)) for r_out ascending
        gamma_lp = rnd_if(gamma, GAMMA_DIAG, LPK)
        for r_out in range(R):
            d_out = _ws_load_m(dphio_ptr, (tok_rows + r_out)[:, None] * P + p[None, :], okn, WS_DPHIO, LPK)
            qk = dec(tl.load(qk_ptr + qk_tok + r_out * R + r_i, mask=ok, other=0), LPK)
            term = rnd_if(d_out * qk[:, None], DPSIV_DIAG_QK, LPK)
            dpsiv = dpsiv + rnd_if(term * gamma_lp[:, None], DPSIV_DIAG_GAMMA, LPK)
        dpsiv = tl.where(okn, rnd_if(dpsiv, DPSIV, LPK), 0.0)
        _ws_store(dpsiv_ptr, rows_p, dpsiv, WS_DPSIV, LPK)

        # ---- same-token dqk = dΦO[t, r_out]·ΨV[t, r_in] and its γ sum term Σ_r_in qk·dqk
        dg_row = tl.full([BR], 0.0, tl.float32)
        for r_in in range(R):
            ps_in = _ws_load_m(psiv_ptr, (tok_rows + r_in)[:, None] * P + p[None, :], okn, WS_PSIV, LPK)
            dqk = tsum(dphio * ps_in, axis=1)
            tl.store(dqk_ptr + (bhc.to(tl.int64) * LP + i) * R + r_in, tl.where(ok, dqk, 0.0))
            qk = dec(tl.load(qk_ptr + qk_tok + r_i * R + r_in, mask=ok, other=0), LPK)
            dg_row = dg_row + qk * dqk
        tl.store(rs + 3 * LP, tl.where(ok, dg_row, 0.0))

    if PAIRS_SIDE:
        # ---- dSSdA's terms, by column token: Σ over the R rows j of each token u, as a one-hot GEMM (exact
        # selections)
        dssda = rnd_if(lkq_st * dk_intra, DSSDA_TERM, LPK)
        u = tl.arange(0, CP)
        pair_offs = bhc.to(tl.int64) * (LP * CP) + i[:, None] * CP + u[None, :]
        if R == 1:
            tl.store(pair_offs + pairs_ptr, dssda)  # LP == CP: row j is token j
        else:
            sel = tl.where((t_j[None, :] == u[:, None]) & ok_j[None, :], 1.0, 0.0)  # [CP, LP]
            tl.store(pairs_ptr + pair_offs, tl.dot(dssda, tl.trans(sel), input_precision="ieee"))

    if DK_SIDE:
        # ---- dk
        khat = _ws_value(khat_raw, WS_KHAT, LPK)
        dk_inter_raw = mma(_ws_operand(psiv_raw, WS_PSIV, DOT_PD_LP, LPK), tl.trans(dop), DOT_PD_LP, LPK)
        s_dacs_rev = tsum(khat * dk_inter_raw, axis=1)
        dk_inter = rnd_if(dk_inter_raw * e_rev[:, None], DK_INTER, LPK)
        dkq = rnd_if(_reverse_causal(dk_intra, rc, segsum_ptr, seg_offs), DKQ_MASKED, LPK)
        dk_nodiag = dk_inter + mma(dkq, _ws_operand(qrot_all, WS_QROT, DOT_DQ_LP, LPK), DOT_DQ_LP, LPK)
        krot = _ws_value(tl.load(krot_ptr + rows_n), WS_QROT, LPK)
        s_dfactor = tsum(krot * dk_nodiag, axis=1)
        dk_rot = rnd_if(dk_nodiag * ts[:, None], DK_SCALED, LPK)
        _ws_store(dkrot_ptr, rows_n, tl.where(okn, dk_rot, 0.0), WS_DKROT, LPK)
        tl.store(rs, tl.where(ok, s_dacs_rev, 0.0))
        tl.store(rs + LP, tl.where(ok, s_dfactor, 0.0))


@triton.jit
def _bwd2_qside_kernel(
    states_ptr, da_cs_ptr, segsum_ptr, qrot_ptr, khat_ptr, dphio_ptr, psiv_ptr, dst_ptr, dqrot_ptr, rowsum_ptr,
    dda_ptr, S, nc,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, BR: tl.constexpr,
    LPK: tl.constexpr, DKQ_MASKED: tl.constexpr, DQ_INTER: tl.constexpr, DQ_COMBINED: tl.constexpr,
    DOT_PP_LP: tl.constexpr, DOT_QS_LP: tl.constexpr, DOT_DK_LP: tl.constexpr, WS_QROT: tl.constexpr,
    WS_KHAT: tl.constexpr, WS_DPHIO: tl.constexpr, WS_PSIV: tl.constexpr, WS_DQROT: tl.constexpr,
):
    """dq of the q-side rows of one block (program → (b, h, chunk c, block of BR fused rows j)), and the chunk's ddA.

    dq_rot[j] = R(R(dΦO[j]·statesᵀ·exp(da_cs)) + Σ_i dkq[i, j]·k̂[i]) with dkq the masked, rounded ΨV·dΦOᵀ of the
    k-side kernel (recomputed here as dΦO[j]·ΨVᵀ: the same products). Inputs: states [B, H, nc, N, P] (stage 1's,
    int16 bits), da_cs, segsum, the workspaces of ``_bwd2_rows_kernel`` and dst. Outputs: dqrot [.., LP, N]; rowsum
    row 2 (per row Σ_n q_rot·dq_inter_raw); dda [B·H·nc]: Σ states·D·decay (written by each chunk's first block).

    Compile-time constants: N, P, R, C, LP, BR, LPK, the sites DKQ_MASKED, DQ_INTER, DQ_COMBINED; DOT_*_LP as in
    ``_bwd2_kside_kernel`` (PP dΦO·ΨVᵀ, QS dΦO·statesᵀ, DK dkqᵀ·k̂); WS_*: which workspaces hold lp bits.
    """
    pid = tl.program_id(0)
    bhc, c, bh, j, t_loc, _, t, ok = _chunk_block(pid, S, nc, R, C, LP, BR)
    t_s = tl.where(ok, t, 0)
    n = tl.arange(0, N)
    p = tl.arange(0, P)
    i = tl.arange(0, LP)  # every row of the chunk (k side)
    t_i = i // R
    ok_i = (i < C * R) & (c * C + t_i < S)
    hs_base = bh.to(tl.int64) * S
    okn = ok[:, None]
    rows_n = bhc.to(tl.int64) * (LP * N) + j[:, None] * N + n[None, :]
    dphio = tl.load(dphio_ptr + bhc.to(tl.int64) * (LP * P) + j[:, None] * P + p[None, :])
    qrot = _ws_value(tl.load(qrot_ptr + rows_n), WS_QROT, LPK)
    psiv_all = tl.load(psiv_ptr + bhc.to(tl.int64) * (LP * P) + i[:, None] * P + p[None, :])
    khat_all = tl.load(khat_ptr + bhc.to(tl.int64) * (LP * N) + i[:, None] * N + n[None, :])
    st_offs = bhc.to(tl.int64) * (N * P) + n[:, None] * P + p[None, :]
    states = dec(tl.load(states_ptr + st_offs), LPK)
    e_cs = tl.exp(tl.load(da_cs_ptr + hs_base + t_s, mask=ok, other=0.0))

    # the chunk's ddA = Σ states·D_c·decay_c, once per chunk
    last = tl.minimum((c + 1) * C, S) - 1
    decay = tl.exp(tl.load(da_cs_ptr + hs_base + last))
    if (pid % (LP // BR)) == 0:
        dst = tl.load(dst_ptr + st_offs)
        tl.store(dda_ptr + bhc, tsum(tsum(states * dst * decay, axis=1), axis=0))

    dq_inter_raw = mma(_ws_operand(dphio, WS_DPHIO, DOT_QS_LP, LPK), tl.trans(states), DOT_QS_LP, LPK)
    s_dacs = tsum(qrot * dq_inter_raw, axis=1)
    dq_inter = rnd_if(dq_inter_raw * e_cs[:, None], DQ_INTER, LPK)
    # dkqᵀ[j, i]: t_i < t_j, times exp(segsum[t_j, t_i])
    rc = (t_i[None, :] < t_loc[:, None]) & okn & ok_i[None, :]
    seg_offs = bhc.to(tl.int64) * (C * C) + tl.minimum(t_loc, C - 1)[:, None] * C + tl.minimum(t_i, C - 1)[None, :]
    pp_dot = mma(_ws_operand(dphio, WS_DPHIO, DOT_PP_LP, LPK), tl.trans(_ws_operand(psiv_all, WS_PSIV, DOT_PP_LP, LPK)),
                 DOT_PP_LP, LPK)
    dkq_t = rnd_if(_reverse_causal(pp_dot, rc, segsum_ptr, seg_offs), DKQ_MASKED, LPK)
    dq_rot = rnd_if(dq_inter + mma(dkq_t, _ws_operand(khat_all, WS_KHAT, DOT_DK_LP, LPK), DOT_DK_LP, LPK), DQ_COMBINED,
                    LPK)
    _ws_store(dqrot_ptr, rows_n, tl.where(okn, dq_rot, 0.0), WS_DQROT, LPK)
    tl.store(rowsum_ptr + bhc.to(tl.int64) * (4 * LP) + 2 * LP + j, tl.where(ok, s_dacs, 0.0))


@triton.jit
def _angle_pair(g1, g2, p1, p2, cs, sn):
    """The two dangles products of one rotated tensor, added: g1·(−p1·s − p2·c) + g2·(p1·c − p2·s) (g: the gradient
    of the rotated tensor, p: the tensor before the rotation; the rotated column pairs j, N/2 + j, j < AW)."""
    return g1 * (-p1 * sn - p2 * cs) + g2 * (p1 * cs - p2 * sn)


@triton.jit
def _bwd2_token_kernel(
    v_ptr, mimo_v_ptr, cs_ptr, sn_ptr, dt_ptr, trap_ptr, qb_ptr, kb_ptr, dpsiv_ptr, dqk_ptr, dkrot_ptr, dqrot_ptr,
    rowsum_ptr, pairs_ptr, dda_ptr, dq_ptr, dk_ptr, dv_ptr, dangles_ptr, part_ptr, tok_out_ptr, dssda_ptr,
    S, H, nc, BHS,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, CP: tl.constexpr,
    BT: tl.constexpr, AW: tl.constexpr, LPK: tl.constexpr, PSI_WEIGHT: tl.constexpr, DV_ACCUM: tl.constexpr,
    DIAG_FMA: tl.constexpr, DK_UNROTATE: tl.constexpr, DQ_UNROTATE: tl.constexpr, DT_INPUT: tl.constexpr,
    SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr, WS_QB: tl.constexpr, WS_DPSIV: tl.constexpr,
    WS_DKROT: tl.constexpr, WS_DQROT: tl.constexpr,
):
    """Per token of one block of BT tokens, over its R rows in ascending rank order (program → (b, h, chunk c, token
    block)).

    Outputs: dv [B, S, H, P], dq, dk [B, S, R, H, N] (int16 bits), dangles [B, S, H, AW] FP32; part
    [B·H·nc·CP/BT, R·P]: the block's Σ_t dΨV·v (dmimo_v partials); tok_out [5, B, H, S] FP32 (BHS = B·H·S):
    ddA_cs_rev, dfactor, ddA_cs, dγ_diag (the token sums of the chunk kernels' row terms, ranks ascending), ddA (the
    chunk's value on each token); dssda [B·H·nc, CP, CP]: the block's token rows, Σ over each token's R rows of the
    k-side kernel's pairs, ranks ascending.

    Compile-time constants: N, P, R, C, LP, CP, BT (tokens per program, dividing CP), AW, LPK; PSI_WEIGHT, DV_ACCUM,
    DK_UNROTATE, DQ_UNROTATE, DT_INPUT, SHIFTED_GAMMA, TRAP_SCALE (sites); DIAG_FMA (``diag_mode="fma"``: dv's rank
    steps rounded once); WS_QB, WS_DPSIV, WS_DKROT, WS_DQROT: those workspaces hold lp bits. The rank loops are
    runtime loops (one body each, whatever R).
    """
    pid = tl.program_id(0)
    NTB: tl.constexpr = CP // BT
    bhc = pid // NTB
    c = bhc % nc
    bh = bhc // nc
    b = bh // H
    h = bh % H
    tt = (pid % NTB) * BT + tl.arange(0, BT)
    t = c * C + tt
    ok = (tt < C) & (t < S)
    okc = ok[:, None]
    t_s = tl.where(ok, t, 0)
    tt_s = tl.where(ok, tt, 0)
    p = tl.arange(0, P)
    w = tl.arange(0, AW)
    HALF: tl.constexpr = N // 2
    j = tl.arange(0, HALF)
    rot = (j < AW)[None, :]
    hs_base = bh.to(tl.int64) * S
    row0 = b.to(tl.int64) * S + c * C
    v_offs = (row0 * H + h) * P + tt_s[:, None] * (H * P) + p[None, :]
    vv = dec(tl.load(v_ptr + v_offs, mask=okc, other=0), LPK)
    a_row = (row0 * H + h) * AW + tt_s[:, None] * (H * AW)
    a_offs = a_row + w[None, :]
    cs = tl.load(cs_ptr + a_offs, mask=okc, other=1.0)
    sn = tl.load(sn_ptr + a_offs, mask=okc, other=0.0)
    ch = tl.load(cs_ptr + a_row + tl.where(okc & rot, j[None, :], 0), mask=okc & rot, other=1.0)
    sh = tl.load(sn_ptr + a_row + tl.where(okc & rot, j[None, :], 0), mask=okc & rot, other=0.0)
    gamma, _, _ = gamma_trap_scale(dt_ptr + hs_base, trap_ptr + hs_base, t, ok, S, LPK, DT_INPUT, SHIFTED_GAMMA,
                                    TRAP_SCALE)
    rows = bhc.to(tl.int64) * LP + tt_s * R  # the token's first fused row
    dv_acc = tl.full([BT, P], -0.0, tl.float32)
    dang = tl.full([BT, AW], -0.0, tl.float32)
    for r in range(R):
        row = rows + r
        dps = _ws_load_m(dpsiv_ptr, row[:, None] * P + p[None, :], okc, WS_DPSIV, LPK)
        psi = rnd_if(tl.load(mimo_v_ptr + h * (R * P) + r * P + p), PSI_WEIGHT, LPK)
        prod = dps * psi[None, :]
        if DV_ACCUM:
            if DIAG_FMA:
                dv_acc = rnd_sum(dv_acc, prod, LPK)
            else:
                dv_acc = rnd(dv_acc + rnd(prod, LPK), LPK)
        else:
            dv_acc = dv_acc + prod
        pm = tsum(tl.where(okc, dps * vv, 0.0), axis=0)
        tl.store(part_ptr + pid.to(tl.int64) * (R * P) + r * P + p, pm)
        # dangles: the k and the q products of rank r, (k pair) + (q pair), ranks ascending
        nk = row[:, None] * N
        g1 = _ws_load_m(dkrot_ptr, nk + w[None, :], okc, WS_DKROT, LPK)
        g2 = _ws_load_m(dkrot_ptr, nk + HALF + w[None, :], okc, WS_DKROT, LPK)
        p1 = _ws_load_m(kb_ptr, nk + w[None, :], okc, WS_QB, LPK)
        p2 = _ws_load_m(kb_ptr, nk + HALF + w[None, :], okc, WS_QB, LPK)
        k_pair = _angle_pair(g1, g2, p1, p2, cs, sn)
        g1 = _ws_load_m(dqrot_ptr, nk + w[None, :], okc, WS_DQROT, LPK)
        g2 = _ws_load_m(dqrot_ptr, nk + HALF + w[None, :], okc, WS_DQROT, LPK)
        p1 = _ws_load_m(qb_ptr, nk + w[None, :], okc, WS_QB, LPK)
        p2 = _ws_load_m(qb_ptr, nk + HALF + w[None, :], okc, WS_QB, LPK)
        q_pair = _angle_pair(g1, g2, p1, p2, cs, sn)
        dang = dang + (k_pair + q_pair)
        # dk, dq of rank r by column halves: the inverse rotation of the rotated columns, then the same-token terms
        # dk[t, r] += Σ_{r2 ascending} dqk[t, r2, r]·γ·q̃[t, r2], dq[t, r] += Σ_{r2} dqk[t, r, r2]·γ·k̃[t, r2]
        x1 = _ws_load_m(dkrot_ptr, nk + j[None, :], okc, WS_DKROT, LPK)
        x2 = _ws_load_m(dkrot_ptr, nk + HALF + j[None, :], okc, WS_DKROT, LPK)
        dk1 = tl.where(rot, rnd_if(ch * x1 + sh * x2, DK_UNROTATE, LPK), x1)
        dk2 = tl.where(rot, rnd_if(-sh * x1 + ch * x2, DK_UNROTATE, LPK), x2)
        x1 = _ws_load_m(dqrot_ptr, nk + j[None, :], okc, WS_DQROT, LPK)
        x2 = _ws_load_m(dqrot_ptr, nk + HALF + j[None, :], okc, WS_DQROT, LPK)
        dq1 = tl.where(rot, rnd_if(ch * x1 + sh * x2, DQ_UNROTATE, LPK), x1)
        dq2 = tl.where(rot, rnd_if(-sh * x1 + ch * x2, DQ_UNROTATE, LPK), x2)
        for r2 in range(R):
            row2 = rows + r2
            g_k = tl.load(dqk_ptr + row2 * R + r, mask=ok, other=0.0) * gamma
            g_q = tl.load(dqk_ptr + row * R + r2, mask=ok, other=0.0) * gamma
            n2 = row2[:, None] * N
            dk1 = dk1 + g_k[:, None] * _ws_load_m(qb_ptr, n2 + j[None, :], okc, WS_QB, LPK)
            dk2 = dk2 + g_k[:, None] * _ws_load_m(qb_ptr, n2 + HALF + j[None, :], okc, WS_QB, LPK)
            dq1 = dq1 + g_q[:, None] * _ws_load_m(kb_ptr, n2 + j[None, :], okc, WS_QB, LPK)
            dq2 = dq2 + g_q[:, None] * _ws_load_m(kb_ptr, n2 + HALF + j[None, :], okc, WS_QB, LPK)
        out_n = ((row0 + tt_s) * R + r)[:, None] * (H * N) + h * N + j[None, :]
        tl.store(dk_ptr + out_n, enc(dk1, LPK), mask=okc)
        tl.store(dk_ptr + out_n + HALF, enc(dk2, LPK), mask=okc)
        tl.store(dq_ptr + out_n, enc(dq1, LPK), mask=okc)
        tl.store(dq_ptr + out_n + HALF, enc(dq2, LPK), mask=okc)
    tl.store(dv_ptr + v_offs, enc(dv_acc, LPK), mask=okc)
    tl.store(dangles_ptr + a_offs, dang, mask=okc)
    # token sums of the chunk kernels' row terms and of dSSdA's rows, ranks ascending; the chunk's ddA on each token
    so = hs_base + t_s
    for q in range(4):
        acc = tl.full([BT], -0.0, tl.float32)
        for r in range(R):
            acc = acc + tl.load(rowsum_ptr + bhc.to(tl.int64) * (4 * LP) + q * LP + tt_s * R + r, mask=ok, other=0.0)
        tl.store(tok_out_ptr + q * BHS + so, acc, mask=ok)
    tl.store(tok_out_ptr + 4 * BHS + so, tl.full([BT], 0.0, tl.float32) + tl.load(dda_ptr + bhc), mask=ok)
    u = tl.arange(0, CP)
    pair = tl.full([BT, CP], -0.0, tl.float32)
    for r in range(R):
        pair = pair + tl.load(pairs_ptr + (rows + r)[:, None] * CP + u[None, :], mask=okc, other=0.0)
    tl.store(dssda_ptr + bhc.to(tl.int64) * (CP * CP) + tt[:, None] * CP + u[None, :], tl.where(okc, pair, 0.0))
