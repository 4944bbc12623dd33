"""Triton kernels of ``mamba_mimo_bwd_fwd`` (Mamba-3 MIMO backward, stage 1) under a ``RoundingPolicy``.

One source for NVIDIA GPUs, Triton-Ascend NPUs and Triton's CPU interpreter (``triton_portability.md``): lp inputs
and outputs travel as int16 bit patterns, every rounding is an integer RNE helper of ``_rounding.py``, all math is
FP32, every access has a mask and an in-bounds address, no inline assembly, no fp64, a 1-D grid. The math is
``docs/semantics.md``; site numbers S… are those of ``upstream_rounding_sites.md``. Every compile-time constant
named below comes from one frozen ``LaunchConfig`` per call (``_config.launch_config``, from the policy, the
backend and optional tuning overrides): the policy's switches and knobs through ``policy_constexprs`` (the only
place the policy reaches Triton), tiles and grids from the plan, the CUDA code forms (``BackendSwitches``:
bit-identical on or off); the launcher (``mimo_bwd_fwd.py``) passes each kernel only the constants it declares.

Work is split so that chunks run in parallel (upstream walks all chunks of a (batch, head) in one program); fused
rows of a chunk are i = t_local·R + r (C·R of them, padded to LP, a power of two ≥ 16):

0. ``_mimo_angles_kernel`` grid cdiv(B·S·H·N/d, BLOCK): cos and sin of every angle, once (FP32 workspace).
1. ``_mimo_prep_kernel``   grid B·H·nc·(LP/RB), chunk-parallel, everything that does not need the state: per
   fused row k̃, the rotation, k̂, k_state, q̃, the same-step q̃·k̃ᵀ (the ``qk_dot`` output) and ΨV. Writes
   k_state, k̂ and ΨV (lp bits when the policy rounds them, else FP32) for the next two kernels.
   Sites: S3, S4, S5, S6, S8 (dt), S9, S10, S11, S12, S13, S14 (+ S15 store), S17, S18, S42.
2. ``_mimo_state_kernel``  grid B·H·(N tiles)·(P tiles), one sequential walk over the chunks per program:
   h ← h·decay (S43, S44), the state GEMM k_stateᵀ·ΨV (S45, ``state_update``), ``states`` = rnd(h_c) (S41), FP32
   h_c when needed (``state_operand`` off, or a record). Per chunk it only loads two lp tiles and runs K=16 MMAs
   (on CUDA with many walk programs per SM, ΨV recomputed from v and Ψ instead of loaded: S3, S11 again, same bits).
3. ``_mimo_out_kernel``    grid B·H·nc·(CP/TB)·(P tiles), chunk-parallel, from rnd(h_c): q rotation (S12, S16), inter
   (S19, S23), scores (S20–S22), intra (S24), o (S25), diagonal (S26–S28), D (S29), out (S30), gate (S31), dmimo_o
   partials (S32, S33), dΦO (S34–S36), dZζ (S37), dz (S38), dmimo_z partials (S39). A program takes TB tokens and
   loops over blocks of RBK ranks (rows = RBK·TB, one GEMM for all of them) in ascending rank order, so the rank
   sums of the diagonal (per row) and of dz (across the blocks) run in ascending order inside one program.
4. ``_mimo_reduce_kernel`` grid NS·B·H·(column blocks): the per-chunk dmimo partials summed over the chunks in a
   fixed order (no atomics: the result is deterministic); dmimo_o and dmimo_z stacked, one launch for both.

FP32-level orders that differ from upstream (none of them is a rounding site; all are below bf16 resolution):

* GEMMs: on devices tl.dot with bf16/fp16 operands when both are on the lp grid (exact products, FP32 tensor-core
  accumulation in the backend's own order), otherwise FP32 operands with ``input_precision="ieee"``. Under the
  interpreter every dot is an FP32 numpy matmul. Upstream: wgmma k16 steps with its truncating alignment. For
  N ≥ 32 the inter and scores GEMMs (K = N) run as two chained GEMMs over the column halves of q̃ (the same k16
  steps in the same order on tensor cores; two numpy matmuls added under the interpreter).
* The state GEMM: ``accumulate_into`` adds one K=16 slice of rows at a time into the live state (as upstream's k16
  steps and the reference; on CUDA one K = C·R GEMM with the live state as accumulator, which the tensor cores run
  as those k16 steps); ``separate`` forms the chunk's K=C·R sum first, then adds it (the seed's order).
* dmimo_o / dmimo_z: per (chunk, token block) a tree sum over its rows, then the partials summed in blocks
  (upstream: one running FP32 sum over time; reference: torch's sum over t).
* Intra GEMM: one GEMM over the chunk's LP fused rows, or (JB < LP, Ascend) accumulated over blocks of JB rows.
* The diagonal rank sum with ``diag_accum`` off is a sequential FP32 sum over r_in (reference: a matmul).
* Special functions: sin/cos are ``_rounding.sincos`` (Cody–Waite + minimax polynomials, ~1 ulp, same formula on
  every backend, evaluated once per angle by kernel 0); ``tl.exp`` (ex2.approx on NVIDIA, numpy under the
  interpreter); sigmoid as 1/(1+exp(−x)); the Z gate's σ(x), σ(−x) and tanh(x/2) from one e = exp(−|x|) and
  one reciprocal (``_rounding.silu_parts``; on CUDA div.approx, which gives the bits of the div.full.f32 that
  ``/`` compiles to there). The reference uses torch's accurate functions; upstream uses CUDA fast math.
* FP32 FMA contraction: the CUDA launch passes ``enable_fp_fusion=False`` (the policy's ``fp32_fma=False``);
  upstream contracts. Other backends: the backend's default.
* FP32 denormals: the backend's default (upstream flushes them).
"""

import triton
import triton.language as tl

from ._rounding import (bits_operand, dec, enc, fzeros, mma, mma_acc, operand, rnd, rnd_if, rnd_sum, sigmoid,
                        silu_parts, sincos, tsum)

#: record slots of ``rec_ptr`` ([NSLOT, B, H, S, R, W] FP32); the launcher maps them to the reference's stage names
#: (``tl.constexpr``: compiled kernels may read only constexpr globals; ``int(SLOT_X)`` on the host)
SLOT_Q_ROT = tl.constexpr(0)
SLOT_K_SCALED = tl.constexpr(1)
SLOT_K_STATE = tl.constexpr(2)
SLOT_PSIV = tl.constexpr(3)
SLOT_INTER = tl.constexpr(4)
SLOT_INTRA = tl.constexpr(5)
SLOT_DIAG_ACCUM = tl.constexpr(6)
SLOT_DIAG = tl.constexpr(7)
SLOT_OUT = tl.constexpr(8)
SLOT_GATE = tl.constexpr(9)
SLOT_DPHIO = tl.constexpr(10)
SLOT_DZZ = tl.constexpr(11)
SLOT_DZ_ACCUM = tl.constexpr(12)
SLOT_QK_DOT = tl.constexpr(13)
SLOT_GAMMA = tl.constexpr(14)
SLOT_TRAP_SCALE = tl.constexpr(15)
SLOT_Q_BIASED = tl.constexpr(16)
SLOT_K_BIASED = tl.constexpr(17)
SLOT_K_ROT = tl.constexpr(18)
SLOT_SHIFTED_GAMMA = tl.constexpr(19)
# the forward's own stages (FORWARD)
SLOT_D_TERM = tl.constexpr(20)
SLOT_PHI_GATE = tl.constexpr(21)
SLOT_O_RANK = tl.constexpr(22)
SLOT_O_SUM = tl.constexpr(23)
NSLOT = tl.constexpr(24)


@triton.jit
def rotation(cs_ptr, sn_ptr, a_row, ok, N: tl.constexpr, AW: tl.constexpr):
    """cos θ and sin θ on [rows, N] from the ``_mimo_angles_kernel`` workspace: column n uses angle j = n mod N/2
    when j < AW (rotated columns), else θ = 0 (cos 1, sin 0). ``a_row``: element offsets of the angle rows, clamped
    (0 where ``ok`` is false)."""
    j = tl.arange(0, N) % (N // 2)
    m = ok[:, None] & (j < AW)[None, :]
    offs = a_row[:, None] + tl.where(m, j[None, :], 0)
    return tl.load(cs_ptr + offs, mask=m, other=1.0), tl.load(sn_ptr + offs, mask=m, other=0.0)


@triton.jit
def _rotation_half(cs_ptr, sn_ptr, a_row, ok, HALF: tl.constexpr, AW: tl.constexpr):
    """``rotation`` for one half of the columns: cos θ and sin θ on [rows, HALF] (column j uses angle j when
    j < AW, else cos 1, sin 0); both halves of a row use the same values."""
    j = tl.arange(0, HALF)
    m = ok[:, None] & (j < AW)[None, :]
    offs = a_row[:, None] + tl.where(m, j[None, :], 0)
    return tl.load(cs_ptr + offs, mask=m, other=1.0), tl.load(sn_ptr + offs, mask=m, other=0.0)


@triton.jit
def _mimo_angles_kernel(angles_ptr, cs_ptr, sn_ptr, n, BLOCK: tl.constexpr):
    """cos and sin of every angle, once: cs, sn [B, S, H, AW] FP32 (``_rounding.sincos``, the same formula on every
    backend), for the prep and output kernels.

    Grid: 1-D, cdiv(n, BLOCK) programs over the n = B·S·H·AW angles (int32 offsets: n < 2**31). Compile-time
    constants: BLOCK. Rounding sites: none (FP32; feeds S16/S17).
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    theta = tl.load(angles_ptr + tl.minimum(offs, n - 1), mask=m, other=0.0)
    sn, cs = sincos(theta)
    tl.store(cs_ptr + offs, cs, mask=m)
    tl.store(sn_ptr + offs, sn, mask=m)


@triton.jit
def biased_rotated(x_ptr, bias_ptr, x_row, b_row, ok, cs, sn,
                    N: tl.constexpr, AW: tl.constexpr, LPK: tl.constexpr,
                    QK_BIAS: tl.constexpr, QK_BIASED: tl.constexpr, ROTARY: tl.constexpr, BIAS_ROW: tl.constexpr):
    """Rows of q̃ = R(q + R(b)) (S4, S12/S13) and of the rotated q̃ (S16/S17); rows are element offsets.

    ``x_row`` must already be clamped (0 where ``ok`` is false). ``b_row``: bias row offsets per row, or with
    ``BIAS_ROW`` one scalar offset whose row is loaded once and broadcast (a row-offset vector that is constant along
    the rows is a zero-stride view, which triton-ascend rejects). Column n is paired with n ± N/2; columns j and
    N/2 + j with j < AW = N/d rotate by θ (``cs``, ``sn`` from ``rotation``).
    """
    HALF: tl.constexpr = N // 2
    n = tl.arange(0, N)
    npart = (n + HALF) % N
    m2 = ok[:, None]
    x = dec(tl.load(x_ptr + x_row[:, None] + n[None, :], mask=m2, other=0), LPK)
    xp = dec(tl.load(x_ptr + x_row[:, None] + npart[None, :], mask=m2, other=0), LPK)
    bias = rnd_if(rank_rows(bias_ptr, b_row, n, BIAS_ROW), QK_BIAS, LPK)
    bias_p = rnd_if(rank_rows(bias_ptr, b_row, npart, BIAS_ROW), QK_BIAS, LPK)
    xb = rnd_if(x + bias, QK_BIASED, LPK)
    xbp = rnd_if(xp + bias_p, QK_BIASED, LPK)
    first = (n < HALF)[None, :]
    rot = ((n % HALF) < AW)[None, :]
    turned = tl.where(first, cs * xb - sn * xbp, sn * xbp + cs * xb)
    xr = tl.where(rot, rnd_if(turned, ROTARY, LPK), xb)
    return xb, xr


@triton.jit
def _biased_rotated_halves(x_ptr, bias_ptr, x_row, b_row, ok, cs, sn,
                           N: tl.constexpr, AW: tl.constexpr, LPK: tl.constexpr, QK_BIAS: tl.constexpr,
                           QK_BIASED: tl.constexpr, ROTARY: tl.constexpr, BIAS_ROW: tl.constexpr):
    """``biased_rotated`` by halves: (x̃₁, x̃₂, rotated x̃₁, rotated x̃₂), each [rows, N/2], x̃₁ the columns j < N/2
    and x̃₂ the columns N/2 + j (``cs``, ``sn`` from ``_rotation_half``). Every element is loaded, biased and rounded
    once (the full-width form loads each row a second time with its halves swapped) and the rotation evaluates
    only its own formula per half; the FP32 operations per element are the same, so are the values.
    """
    HALF: tl.constexpr = N // 2
    j = tl.arange(0, HALF)
    m2 = ok[:, None]
    x1 = dec(tl.load(x_ptr + x_row[:, None] + j[None, :], mask=m2, other=0), LPK)
    x2 = dec(tl.load(x_ptr + x_row[:, None] + (HALF + j)[None, :], mask=m2, other=0), LPK)
    xb1 = rnd_if(x1 + rnd_if(rank_rows(bias_ptr, b_row, j, BIAS_ROW), QK_BIAS, LPK), QK_BIASED, LPK)
    xb2 = rnd_if(x2 + rnd_if(rank_rows(bias_ptr, b_row, HALF + j, BIAS_ROW), QK_BIAS, LPK), QK_BIASED, LPK)
    rot = (j < AW)[None, :]
    xr1 = tl.where(rot, rnd_if(cs * xb1 - sn * xb2, ROTARY, LPK), xb1)
    xr2 = tl.where(rot, rnd_if(sn * xb1 + cs * xb2, ROTARY, LPK), xb2)
    return xb1, xb2, xr1, xr2


@triton.jit
def gamma_trap_scale(dt_ptr, trap_ptr, t, ok, S, LPK: tl.constexpr, DT_INPUT: tl.constexpr,
                      SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr):
    """γ_t = R(dt_t)·σ(trap_t) (S8, S9; never rounded), shifted γ (S5, S6) and trap_scale_t = R(γ + sγ) (S10).

    ``dt_ptr``/``trap_ptr`` point at the (b, h) row of [B, H, S]; rows where ``ok`` is false read 0 (γ = ts = 0).
    """
    ts0 = tl.where(ok, t, 0)
    dt = rnd_if(tl.load(dt_ptr + ts0, mask=ok, other=0.0), DT_INPUT, LPK)
    trap = dec(tl.load(trap_ptr + ts0, mask=ok, other=0), LPK)
    gamma = dt * sigmoid(trap)
    okn = ok & (t + 1 < S)
    tn = tl.where(okn, t + 1, 0)
    dtn = rnd_if(tl.load(dt_ptr + tn, mask=okn, other=0.0), DT_INPUT, LPK)
    trapn = dec(tl.load(trap_ptr + tn, mask=okn, other=0), LPK)
    shifted = tl.where(okn, rnd_if(dtn * sigmoid(-trapn), SHIFTED_GAMMA, LPK), 0.0)
    trap_scale = rnd_if(gamma + shifted, TRAP_SCALE, LPK)
    return gamma, shifted, trap_scale


@triton.jit
def _store_tile(ptr, offs, x, AS_LP: tl.constexpr, LPK: tl.constexpr):
    """Store an FP32 tile as lp bits (exact when the values are on the grid) or as FP32."""
    if AS_LP:
        tl.store(ptr + offs, enc(x, LPK))
    else:
        tl.store(ptr + offs, x)


@triton.jit
def _load_tile(ptr, offs, AS_LP: tl.constexpr, LPK: tl.constexpr):
    """Load a tile written by ``_store_tile`` as FP32."""
    if AS_LP:
        return dec(tl.load(ptr + offs), LPK)
    else:
        return tl.load(ptr + offs)


@triton.jit
def _k_scaled_state(kb, krot, cols, ts, e_rev, ok, kst_ptr, khat_ptr, nk_rows, rec, slot_stride, LPK: tl.constexpr,
                    K_SCALED: tl.constexpr, K_STATE: tl.constexpr, RECORD: tl.constexpr):
    """k̂ = R(k_rot·ts) (S18) and k_state = R(k̂·exp(da_cs_rev)) (S42) on the columns ``cols`` of the prep rows,
    stored to the workspaces (rows ``nk_rows``; 0 on invalid rows) and, with RECORD, k̃, k_rot, k̂, k_state."""
    k_hat = tl.where(ok[:, None], rnd_if(krot * ts[:, None], K_SCALED, LPK), 0.0)
    k_state = tl.where(ok[:, None], rnd_if(k_hat * e_rev[:, None], K_STATE, LPK), 0.0)
    _store_tile(kst_ptr, nk_rows + cols[None, :], k_state, K_STATE, LPK)
    _store_tile(khat_ptr, nk_rows + cols[None, :], k_hat, K_SCALED, LPK)
    if RECORD:
        tl.store(rec + SLOT_K_BIASED * slot_stride + cols[None, :], kb, mask=ok[:, None])
        tl.store(rec + SLOT_K_ROT * slot_stride + cols[None, :], krot, mask=ok[:, None])
        tl.store(rec + SLOT_K_SCALED * slot_stride + cols[None, :], k_hat, mask=ok[:, None])
        tl.store(rec + SLOT_K_STATE * slot_stride + cols[None, :], k_state, mask=ok[:, None])


@triton.jit
def _prep_program(
    pid, q_ptr, k_ptr, v_ptr, q_bias_ptr, k_bias_ptr, mimo_v_ptr, cs_ptr, sn_ptr, dt_ptr, trap_ptr, da_cs_rev_ptr,
    kst_ptr, khat_ptr, psiv_ptr, qk_ptr, qkf_ptr, rec_ptr, B, S, H, HPG, nc, n_rb, N: tl.constexpr, P: tl.constexpr,
    R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, RB: tl.constexpr, AW: tl.constexpr, W: tl.constexpr,
    LPK: tl.constexpr, PSI_WEIGHT: tl.constexpr, QK_BIAS: tl.constexpr, DT_INPUT: tl.constexpr,
    QK_BIASED: tl.constexpr, PSIV: tl.constexpr, SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr,
    ROTARY: tl.constexpr, K_SCALED: tl.constexpr, K_STATE: tl.constexpr, QK_DOT_INTERNAL: tl.constexpr,
    QK_GEMM: tl.constexpr, DOT_QK_LP: tl.constexpr, RECORD: tl.constexpr,
):
    """Body of ``_mimo_prep_kernel`` for one (virtual) program ``pid``: RB fused rows of one chunk."""
    rb = pid % n_rb
    bhc = pid // n_rb
    c = bhc % nc
    bh = bhc // nc
    b = bh // H
    h = bh % H
    g = h // HPG
    G = H // HPG
    L: tl.constexpr = C * R
    cC = c * C
    row0 = b.to(tl.int64) * S + cC
    qk_base = (row0 * R * G + g) * N
    a_base = (row0 * H + h) * AW
    v_base = (row0 * H + h) * P
    hs_base = bh.to(tl.int64) * S

    i = rb * RB + tl.arange(0, RB)
    t_loc = i // R
    r_i = i % R
    t = cC + t_loc
    ok = (i < L) & (t < S)
    i_s = tl.where(ok, i, 0)
    t_loc_s = tl.where(ok, t_loc, 0)
    n = tl.arange(0, N)
    p = tl.arange(0, P)

    # ---- k side: k̃, rotation, k̂ = R(k_rot·ts), k_state = R(k̂·exp(da_cs_rev)); by column halves unless the
    # whole k̃ feeds the [LP, LP] same-step GEMM (QK_GEMM) or N < 32 (halves of 8 columns overflowed the Ascend UB
    # at N = 16, P = 128)
    # per-rank parameter rows: with R = 1 one scalar row (a constant offset vector is a zero stride on Ascend)
    if R == 1:
        prow_n = 0
        prow_p = 0
    else:
        prow_n = r_i * N
        prow_p = r_i * P
    gamma, shifted, ts = gamma_trap_scale(dt_ptr + hs_base, trap_ptr + hs_base, t, ok, S, LPK, DT_INPUT,
                                           SHIFTED_GAMMA, TRAP_SCALE)
    e_rev = tl.exp(tl.load(da_cs_rev_ptr + hs_base + tl.where(ok, t, 0), mask=ok, other=0.0))
    nk_rows = bhc.to(tl.int64) * (LP * N) + i[:, None] * N
    # B may arrive as the constexpr 1 (the JIT specializes integer arguments equal to 1): no .to() on it
    slot_stride = tl.cast(B, tl.int64) * H * S * R * W
    rec_base = (bh.to(tl.int64) * S + cC) * R * W
    rec = rec_ptr + rec_base + i_s[:, None] * W
    if QK_GEMM or N < 32:
        cs, sn = rotation(cs_ptr + a_base, sn_ptr + a_base, t_loc_s * (H * AW), ok, N, AW)
        kb, krot = biased_rotated(k_ptr + qk_base, k_bias_ptr + h * (R * N), i_s * (G * N), prow_n, ok, cs, sn,
                                   N, AW, LPK, QK_BIAS, QK_BIASED, ROTARY, R == 1)
        _k_scaled_state(kb, krot, n, ts, e_rev, ok, kst_ptr, khat_ptr, nk_rows, rec, slot_stride, LPK, K_SCALED,
                        K_STATE, RECORD)
    else:
        HALF: tl.constexpr = N // 2
        jh = tl.arange(0, HALF)
        cs, sn = _rotation_half(cs_ptr + a_base, sn_ptr + a_base, t_loc_s * (H * AW), ok, HALF, AW)
        kb1, kb2, kr1, kr2 = _biased_rotated_halves(k_ptr + qk_base, k_bias_ptr + h * (R * N), i_s * (G * N),
                                                    prow_n, ok, cs, sn, N, AW, LPK, QK_BIAS, QK_BIASED, ROTARY,
                                                    R == 1)
        _k_scaled_state(kb1, kr1, jh, ts, e_rev, ok, kst_ptr, khat_ptr, nk_rows, rec, slot_stride, LPK, K_SCALED,
                        K_STATE, RECORD)
        _k_scaled_state(kb2, kr2, HALF + jh, ts, e_rev, ok, kst_ptr, khat_ptr, nk_rows, rec, slot_stride, LPK,
                        K_SCALED, K_STATE, RECORD)

    # ---- same-step q̃·k̃ᵀ (S14) for every r_in: qk[t_i, r_i, r_in] = Σ_n q̃[i, n]·k̃[t_i·R + r_in, n]
    q = dec(tl.load(q_ptr + qk_base + (i_s * (G * N))[:, None] + n[None, :], mask=ok[:, None], other=0), LPK)
    qbias = rnd_if(rank_rows(q_bias_ptr + h * (R * N), prow_n, n, R == 1), QK_BIAS, LPK)
    qb = rnd_if(q + qbias, QK_BIASED, LPK)
    if QK_GEMM:
        # the whole chunk in this program (RB = LP): one [LP, LP] GEMM, same-step entries picked per r_in
        qk_all = mma(qb, tl.trans(kb), DOT_QK_LP, LPK)
    qk_base_out = (bh.to(tl.int64) * S + cC) * (R * R)
    for r_in in tl.static_range(R):
        if QK_GEMM:
            sel = i[None, :] == (t_loc[:, None] * R + r_in)
            qk = tsum(tl.where(sel, qk_all, -0.0), axis=1)  # adding -0.0 is exact: the entry's own bits
        else:
            # row products with k̃ of rows (t_i, r_in) reloaded: no [LP, LP] tile (Ascend UB)
            j_s = t_loc_s * R + r_in
            kx = dec(tl.load(k_ptr + qk_base + (j_s * (G * N))[:, None] + n[None, :], mask=ok[:, None], other=0),
                     LPK)
            kbias = rnd_if(tl.load(k_bias_ptr + h * (R * N) + r_in * N + n), QK_BIAS, LPK)
            kb_in = rnd_if(kx + kbias[None, :], QK_BIASED, LPK)
            qk = tsum(qb * kb_in, axis=1)
        tl.store(qk_ptr + qk_base_out + i_s * R + r_in, enc(qk, LPK), mask=ok)
        if not QK_DOT_INTERNAL:
            tl.store(qkf_ptr + qk_base_out + i_s * R + r_in, qk, mask=ok)
        if RECORD:
            tl.store(rec_ptr + SLOT_QK_DOT * slot_stride + rec_base + i_s * W + r_in,
                     rnd_if(qk, QK_DOT_INTERNAL, LPK), mask=ok)

    # ---- ΨV = R(v·R(Ψ)) (S3, S11)
    psi = rnd_if(rank_rows(mimo_v_ptr + h * (R * P), prow_p, p, R == 1), PSI_WEIGHT, LPK)
    vv = dec(tl.load(v_ptr + v_base + (t_loc_s * (H * P))[:, None] + p[None, :], mask=ok[:, None], other=0), LPK)
    psiv = tl.where(ok[:, None], rnd_if(vv * psi, PSIV, LPK), 0.0)
    _store_tile(psiv_ptr, bhc.to(tl.int64) * (LP * P) + i[:, None] * P + p[None, :], psiv, PSIV, LPK)

    if RECORD:
        tl.store(rec + SLOT_PSIV * slot_stride + p[None, :], psiv, mask=ok[:, None])


@triton.jit
def _mimo_prep_kernel(
    q_ptr, k_ptr, v_ptr, q_bias_ptr, k_bias_ptr, mimo_v_ptr, cs_ptr, sn_ptr, dt_ptr, trap_ptr, da_cs_rev_ptr,
    kst_ptr, khat_ptr, psiv_ptr, qk_ptr, qkf_ptr, rec_ptr,
    B, S, H, HPG, nc, n_rb, n_virtual,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr, RB: tl.constexpr,
    AW: tl.constexpr, W: tl.constexpr, LPK: tl.constexpr,
    PSI_WEIGHT: tl.constexpr, QK_BIAS: tl.constexpr, DT_INPUT: tl.constexpr, QK_BIASED: tl.constexpr,
    PSIV: tl.constexpr, SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr, ROTARY: tl.constexpr,
    K_SCALED: tl.constexpr, K_STATE: tl.constexpr, QK_DOT_INTERNAL: tl.constexpr,
    QK_GEMM: tl.constexpr, DOT_QK_LP: tl.constexpr, RECORD: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """Per-row quantities of one chunk that do not depend on the state.

    Grid: 1-D, up to n_virtual = B·H·nc·n_rb programs (looping over virtual programs when PERSISTENT); virtual
    program → (b, h, chunk c, block of RB fused rows i = t_local·R + r).

    Inputs: q, k [B, S, R, G, N] and v [B, S, H, P], trap [B, H, S] (int16 bits); q_bias, k_bias [H, R, N],
    mimo_v [H, R, P], cs, sn [B, S, H, AW] (``_mimo_angles_kernel``), dt, da_cs_rev [B, H, S] (FP32).
    Outputs: kst (k_state) and khat (k̂) [B·H·nc, LP, N], psiv [B·H·nc, LP, P], as lp bits when the policy rounds
    them (K_STATE, K_SCALED, PSIV) else FP32, rows of tokens t ≥ S and rows i ≥ C·R written as 0; qk_dot
    [B, H, S, R, R] (lp bits, the output); qkf (same shape, FP32 q̃·k̃ᵀ) when QK_DOT_INTERNAL is off.

    Compile-time constants:
        N, P, R, C: sizes. LP: padded fused rows. RB: rows per program (LP on the interpreter, 16 on devices).
        AW: rotated columns per half (N / rotary_dim_divisor). W: record row width. LPK: 0 bf16, 1 fp16 (2, 3:
        the same through the device's cvt.rn, ``native_lp``).
        PSI_WEIGHT, QK_BIAS, DT_INPUT, QK_BIASED, PSIV, SHIFTED_GAMMA, TRAP_SCALE, ROTARY, K_SCALED, K_STATE,
        QK_DOT_INTERNAL: policy switches. QK_GEMM: same-step q̃·k̃ᵀ as one [LP, LP] GEMM (RB == LP) else as row
        products with the k̃ rows reloaded (no [LP, LP] tile; on the H200 also faster than an [RB, RB] GEMM over
        16-row programs: 0.17 against 0.20 ms at shape (a)). DOT_QK_LP: lp operands for that GEMM.
        RECORD: write the record slots (k_biased, k_rot, k_scaled, k_state, psiv, qk_dot).
        PERSISTENT: loop over the n_virtual virtual programs (the launch has fewer programs than chunks).

    Rounding sites: S3 (Ψ), S4 (biases), S5/S8 (dt), S6 (shifted γ), S10 (trap_scale), S11 (ΨV), S12/S13 (q̃, k̃),
    S14 (qk_dot_internal; the QK_DOT store is always rnd), S17 (k rotation), S18 (k̂), S42 (k_state). FP32: S9.
    """
    if PERSISTENT:
        # loop over virtual programs: Ascend caps a launch at 65535 programs
        for pid in tl.range(tl.program_id(0), n_virtual, tl.num_programs(0)):
            _prep_program(
                pid, q_ptr, k_ptr, v_ptr, q_bias_ptr, k_bias_ptr, mimo_v_ptr, cs_ptr, sn_ptr, dt_ptr, trap_ptr,
                da_cs_rev_ptr, kst_ptr, khat_ptr, psiv_ptr, qk_ptr, qkf_ptr, rec_ptr, B, S, H, HPG, nc, n_rb, N, P,
                R, C, LP, RB, AW, W, LPK, PSI_WEIGHT, QK_BIAS, DT_INPUT, QK_BIASED, PSIV, SHIFTED_GAMMA, TRAP_SCALE,
                ROTARY, K_SCALED, K_STATE, QK_DOT_INTERNAL, QK_GEMM, DOT_QK_LP, RECORD)
    else:
        pid = tl.program_id(0)
        _prep_program(
            pid, q_ptr, k_ptr, v_ptr, q_bias_ptr, k_bias_ptr, mimo_v_ptr, cs_ptr, sn_ptr, dt_ptr, trap_ptr,
            da_cs_rev_ptr, kst_ptr, khat_ptr, psiv_ptr, qk_ptr, qkf_ptr, rec_ptr, B, S, H, HPG, nc, n_rb, N, P, R, C,
            LP, RB, AW, W, LPK, PSI_WEIGHT, QK_BIAS, DT_INPUT, QK_BIASED, PSIV, SHIFTED_GAMMA, TRAP_SCALE, ROTARY,
            K_SCALED, K_STATE, QK_DOT_INTERNAL, QK_GEMM, DOT_QK_LP, RECORD)


@triton.jit
def _state_rows(kst_ptr, psiv_ptr, chunk, i, nn, pp, v_ptr, v_tok0, c, psi, S, H, N: tl.constexpr, P: tl.constexpr,
                LP: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LPK: tl.constexpr, PSIV: tl.constexpr,
                KT_LOAD: tl.constexpr, PSIV_FROM_V: tl.constexpr):
    """k_stateᵀ [BN, K] and ΨV [K, BP] of chunk ``chunk`` (the c-th of its (b, h)) for its fused rows ``i`` (K of
    them), as stored (lp bits or FP32). KT_LOAD: k_stateᵀ loaded transposed (strided), no layout transpose in
    registers. PSIV_FROM_V: ΨV recomputed from v instead of read from the workspace: R(v[t_i]·R(Ψ[r_i])) with
    ``psi`` = R(Ψ) of the rows (hoisted by the caller), the prep kernel's expression, so the same bits; a v row
    serves the R fused rows of its token, so the walk reads 1/R of the ΨV bytes from L2 (where it is bound)."""
    if KT_LOAD:
        kt = tl.load(kst_ptr + chunk * (LP * N) + nn[:, None] + i[None, :] * N)
    else:
        kt = tl.trans(tl.load(kst_ptr + chunk * (LP * N) + i[:, None] * N + nn[None, :]))
    if PSIV_FROM_V:
        t = c * C + i // R
        ok = (i < C * R) & (t < S)
        vv = dec(tl.load(v_ptr + v_tok0 + tl.where(ok, t, 0)[:, None] * (H * P) + pp[None, :], mask=ok[:, None],
                         other=0), LPK)
        pv = tl.where(ok[:, None], rnd_if(vv * psi, PSIV, LPK), 0.0)
        if PSIV:
            pv = enc(pv, LPK)
    else:
        pv = tl.load(psiv_ptr + chunk * (LP * P) + i[:, None] * P + pp[None, :])
    return kt, pv


@triton.jit
def _state_product(kt, pv, acc, WITH_ACC: tl.constexpr, LPK: tl.constexpr, K_STATE: tl.constexpr,
                   PSIV: tl.constexpr, DOT_STATE_LP: tl.constexpr):
    """k_stateᵀ·ΨV from ``_state_rows`` tiles: accumulated into ``acc`` (WITH_ACC) or alone; lp bits go to the GEMM
    directly with DOT_STATE_LP, else decoded to FP32 (IEEE FP32 GEMM)."""
    if DOT_STATE_LP:
        if WITH_ACC:
            return tl.dot(bits_operand(kt, LPK), bits_operand(pv, LPK), acc)
        else:
            return tl.dot(bits_operand(kt, LPK), bits_operand(pv, LPK))
    else:
        if K_STATE:
            kt = dec(kt, LPK)
        if PSIV:
            pv = dec(pv, LPK)
        if WITH_ACC:
            return mma_acc(kt, pv, acc, False, LPK)
        else:
            return mma(kt, pv, False, LPK)


@triton.jit
def _state_chunk_step(state, decay, kst_ptr, psiv_ptr, chunk, nn, pp, v_ptr, v_tok0, c, psi, S, H, N: tl.constexpr,
                      P: tl.constexpr, LP: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LPK: tl.constexpr,
                      K_STATE: tl.constexpr, PSIV: tl.constexpr, DOT_STATE_LP: tl.constexpr,
                      ACCUMULATE: tl.constexpr, KT_LOAD: tl.constexpr, ONE_DOT: tl.constexpr,
                      PSIV_FROM_V: tl.constexpr):
    """h ← h·decay (+) k_stateᵀ·ΨV of chunk ``chunk`` on the tile (rows ``nn``, columns ``pp``): ``accumulate_into``
    adds one K=16 slice of fused rows at a time into the live state, ``separate`` forms the chunk's sum first.
    ONE_DOT (CUDA, lp operands): ``accumulate_into`` as one slice of K = LP, a GEMM with the scaled state as its
    accumulator, which the tensor cores run as the same K=16 steps in the same order. PSIV_FROM_V: see
    ``_state_rows`` (``psi`` holds all LP rows: only with one slice, ONE_DOT or ``separate``)."""
    if ACCUMULATE:
        SL: tl.constexpr = LP if ONE_DOT else 16
        tl.static_assert(SL == LP or not PSIV_FROM_V)
        state = state * decay
        for s in tl.static_range(LP // SL):
            kt, pv = _state_rows(kst_ptr, psiv_ptr, chunk, s * SL + tl.arange(0, SL), nn, pp, v_ptr, v_tok0, c, psi,
                                 S, H, N, P, LP, R, C, LPK, PSIV, KT_LOAD, PSIV_FROM_V)
            state = _state_product(kt, pv, state, True, LPK, K_STATE, PSIV, DOT_STATE_LP)
    else:
        kt, pv = _state_rows(kst_ptr, psiv_ptr, chunk, tl.arange(0, LP), nn, pp, v_ptr, v_tok0, c, psi, S, H, N, P,
                             LP, R, C, LPK, PSIV, KT_LOAD, PSIV_FROM_V)
        state = state * decay + _state_product(kt, pv, state, False, LPK, K_STATE, PSIV, DOT_STATE_LP)
    return state


@triton.jit
def _mimo_state_kernel(
    kst_ptr, psiv_ptr, v_ptr, mimo_v_ptr, da_cs_ptr, states_ptr, hf32_ptr, final_ptr,
    S, H, nc, n_nt, n_pt,
    N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr, LP: tl.constexpr,
    BN: tl.constexpr, BP: tl.constexpr, CB: tl.constexpr, LPK: tl.constexpr,
    K_STATE: tl.constexpr, PSIV: tl.constexpr, PSI_WEIGHT: tl.constexpr, DOT_STATE_LP: tl.constexpr,
    ACCUMULATE: tl.constexpr, STORE_F32: tl.constexpr, KT_LOAD: tl.constexpr, ONE_DOT: tl.constexpr,
    PSIV_FROM_V: tl.constexpr, FINAL: tl.constexpr,
):
    """The sequential walk over the chunks: states[c] = rnd(h_c), h_{c+1} = h_c·decay_c (+) k_stateᵀ·ΨV.

    Grid: 1-D, B·H·n_nt·n_pt programs; program → (b, h, N tile of BN rows, P tile of BP columns), each walking all
    nc chunks in order. The decays exp(da_cs[last valid t of the chunk]) are loaded CB chunks at a time (one
    pipelined loop over all chunks with a per-chunk decay load measured slower on an H200: 0.41 against 0.19 ms at
    shape (a), reports/bench/history/20261129_214758_43fe441_kernels.md: Triton pipelines only the loads that feed a
    dot, and a loaded value carried across its iterations stops it pipelining the operand loads too).

    Inputs: kst [B·H·nc, LP, N] and psiv [B·H·nc, LP, P] from ``_mimo_prep_kernel`` (lp bits when K_STATE / PSIV,
    else FP32; padded rows are 0), or with PSIV_FROM_V v [B, S, H, P] (int16 bits) and mimo_v [H, R, P] (FP32)
    instead of psiv; da_cs [B, H, S]. Outputs: states [B, H, nc, N, P] (lp bits); hf32 (same shape,
    FP32 h_c) when STORE_F32; final [B, H, N, P] (FP32 h_nc, the state after the last chunk: the forward's
    ``FINAL_STATE``) when FINAL.

    Compile-time constants:
        N, P, R, C, LP: sizes (LP = padded fused rows). BN, BP: tile. CB: chunks per decay load. LPK: lp format.
        K_STATE, PSIV: the workspaces hold lp bits. DOT_STATE_LP: feed the GEMM lp operands (devices only, both
        operands on the grid). ACCUMULATE: ``state_update="accumulate_into"`` (one K=16 slice of rows at a time
        into the live state) else ``"separate"`` (the chunk's sum first, then added). STORE_F32: store FP32 h_c.
        KT_LOAD: load k_stateᵀ transposed from memory (strided) instead of transposing in registers (same values;
        measured 0.44 → 0.19 ms for this kernel at shape (a) on an H200). ONE_DOT (CUDA): ``accumulate_into`` as
        one GEMM over K = LP with the scaled state as accumulator (the tensor cores' K=16 steps in order: the same
        sums as one K=16 GEMM at a time). The next block of decays is loaded before the current one is walked, and
        each chunk's decay (a cross-lane sum) is picked one chunk early, off the sequential path. PSI_WEIGHT: policy
        switch (S3), used with PSIV_FROM_V (CUDA, one GEMM slice per chunk): ΨV recomputed from v and Ψ in the walk
        (``_state_rows``), the workspace not read. FINAL: also store the state after the last chunk.

    Rounding sites: S41 (states = rnd(h_c)); with PSIV_FROM_V also S3 (Ψ) and S11 (ΨV), as in the prep kernel;
    S43–S45 are FP32.
    """
    pid = tl.program_id(0)
    pt = pid % n_pt
    rest = pid // n_pt
    nt = rest % n_nt
    bh = rest // n_nt
    nn = nt * BN + tl.arange(0, BN)
    pp = pt * BP + tl.arange(0, BP)
    hs_base = bh.to(tl.int64) * S
    st_base = bh.to(tl.int64) * nc * (N * P)
    st_offs = nn[:, None] * P + pp[None, :]

    v_tok0 = (bh // H).to(tl.int64) * S * (H * P) + (bh % H) * P
    if PSIV_FROM_V:
        # R(Ψ) of the LP fused rows (rank i mod R), loop-invariant
        ii = tl.arange(0, LP)
        psi = rnd_if(tl.load(mimo_v_ptr + (bh % H) * (R * P) + (ii % R)[:, None] * P + pp[None, :]), PSI_WEIGHT, LPK)
    else:
        psi = 0.0
    state = fzeros(BN, BP)
    cbv = tl.arange(0, CB)
    blk = _decay_block(da_cs_ptr, hs_base, 0, cbv, nc, S, C)
    for c0 in range(0, nc, CB):
        decays = tl.exp(blk)
        # the next block's decays, loaded now (the outer loop is not pipelined; a loaded value carried over the
        # pipelined inner loop would stop Triton pipelining its operand loads)
        blk = _decay_block(da_cs_ptr, hs_base, c0 + CB, cbv, nc, S, C)
        decay = tsum(tl.where(cbv == 0, decays, 0.0), axis=0)
        for jj in tl.range(0, tl.minimum(CB, nc - c0)):
            c = c0 + jj
            # the pick for chunk c + 1 (a cross-lane sum) does not depend on the state: issued one chunk early, it
            # overlaps this chunk's GEMM chain instead of preceding it
            cur = decay
            decay = tsum(tl.where(cbv == jj + 1, decays, 0.0), axis=0)
            so = st_base + c.to(tl.int64) * (N * P) + st_offs
            tl.store(states_ptr + so, enc(state, LPK))
            if STORE_F32:
                tl.store(hf32_ptr + so, state)
            chunk = bh.to(tl.int64) * nc + c
            state = _state_chunk_step(state, cur, kst_ptr, psiv_ptr, chunk, nn, pp, v_ptr, v_tok0, c, psi, S, H, N, P,
                                      LP, R, C, LPK, K_STATE, PSIV, DOT_STATE_LP, ACCUMULATE, KT_LOAD, ONE_DOT,
                                      PSIV_FROM_V)
    if FINAL:
        tl.store(final_ptr + bh.to(tl.int64) * (N * P) + st_offs, state)


@triton.jit
def _decay_block(da_cs_ptr, hs_base, c0, cbv, nc, S, C: tl.constexpr):
    """da_cs[last valid token of chunk c] for the chunks c = c0 + cbv (0 past the last chunk); the caller takes exp
    where it uses them, so a block loaded ahead is not waited for."""
    cc = c0 + cbv
    cm = cc < nc
    last = tl.minimum((cc + 1) * C, S) - 1
    return tl.load(da_cs_ptr + hs_base + tl.where(cm, last, 0), mask=cm, other=0.0)


@triton.jit
def _load_operand(ptr, offs, AS_LP: tl.constexpr, LP_OPS: tl.constexpr, LPK: tl.constexpr):
    """Load a tile written by ``_store_tile`` as a ``tl.dot`` operand: lp bits feeding an lp GEMM are reinterpreted
    as bf16/fp16 directly (no FP32 round trip), everything else goes through ``_load_tile`` and ``operand``."""
    if AS_LP:
        if LP_OPS:
            return bits_operand(tl.load(ptr + offs), LPK)
    return operand(_load_tile(ptr, offs, AS_LP, LPK), LP_OPS, LPK)


@triton.jit
def _record_tile(rec_ptr, slot, slot_stride, rec_base, rows, ok, cols, ncols, val, W: tl.constexpr):
    """Store ``val`` [rows, cols] into record slot ``slot`` at fused rows ``rows`` (clamped), columns ``cols``."""
    m = ok[:, None] & (cols[None, :] < ncols)
    tl.store(rec_ptr + slot * slot_stride + rec_base + rows[:, None] * W + tl.where(m, cols[None, :], 0), val,
             mask=m)


@triton.jit
def rank_rows(ptr, row, cols, ONE_ROW: tl.constexpr):
    """Rows of a per-rank parameter (biases, Ψ, Φ, ζ) as a tile [rows, cols]: ``row`` holds each row's element
    offset; with ``ONE_ROW`` it is one scalar offset, the row is loaded once and broadcast ([1, cols]): a row-offset
    vector that is constant along the rows is a zero-stride view, which triton-ascend rejects."""
    if ONE_ROW:
        return tl.load(ptr + row + cols)[None, :]
    else:
        return tl.load(ptr + row[:, None] + cols[None, :])


@triton.jit
def _diag_step(acc, r_in, qkin_ptr, qk_row, psiv_ptr, psiv_tok, ok, LPK: tl.constexpr,
               P: tl.constexpr, QK_DOT_INTERNAL: tl.constexpr, PSIV: tl.constexpr, DIAG_ACCUM: tl.constexpr,
               DIAG_FMA: tl.constexpr, NATIVE_DIAG: tl.constexpr):
    """One rank step of the diagonal (S26): acc ← acc (+) qk[t, r, r_in]·ΨV[t·R + r_in] on rows (t, r).

    ``acc`` starts at −0.0, the exact identity of every step form, so the first step is rnd(a·b) (or a·b). With
    NATIVE_DIAG ``acc`` is a bf16/fp16 tile (the caller widens it after the last step).
    """
    if NATIVE_DIAG:
        # devices, operands on the lp grid (qk_dot and ΨV are lp bits): fma.rn (one rounding of acc + a·b) or mul.rn
        # then add.rn (FMA contraction off) round exactly as the integer emulation below
        a_lp = bits_operand(tl.load(qkin_ptr + qk_row + r_in, mask=ok, other=0), LPK)[:, None]
        bv = tl.load(psiv_ptr + psiv_tok + r_in * P)
        b_lp = bits_operand(bv, LPK)
        if DIAG_FMA:
            acc = tl.fma(a_lp, b_lp, acc)
        else:
            acc = acc + a_lp * b_lp
    else:
        if QK_DOT_INTERNAL:
            a = dec(tl.load(qkin_ptr + qk_row + r_in, mask=ok, other=0), LPK)
        else:
            a = tl.load(qkin_ptr + qk_row + r_in, mask=ok, other=0.0)
        bv = _load_tile(psiv_ptr, psiv_tok + r_in * P, PSIV, LPK)
        if DIAG_ACCUM:
            prod = a[:, None] * bv
            if DIAG_FMA:
                acc = rnd_sum(acc, prod, LPK)
            else:
                acc = rnd(acc + rnd(prod, LPK), LPK)
        else:
            acc = acc + a[:, None] * bv
    return acc


@triton.jit
def _dz_step(dz_acc, term, DZ_ACCUM: tl.constexpr, LPK: tl.constexpr):
    """One rank step of dz (S38): rnd(dz_acc + term) or dz_acc + term (dz_acc starts at −0.0)."""
    if DZ_ACCUM:
        return rnd(dz_acc + term, LPK)
    else:
        return dz_acc + term


@triton.jit
def _rank_sums_into(acc, x, rr, rb, rk, RBK: tl.constexpr):
    """acc[r, :] = Σ over the token rows of rank r of ``x`` [RBK·TB, BP], for the RBK ranks r = rb·RBK + k of this
    block (acc [RPAD, BP] is carried over the rank blocks and stored once after them: a reduction stored at a
    loop-dependent offset inside the rank loop crashes BiShengIR, and on CUDA a loop without stores lets Triton
    hoist the rank-invariant k̂/ΨV loads, ~5 % faster). Rows of other ranks, and invalid rows, must hold 0."""
    if RBK == 1:
        acc = tl.where((rk == rb)[:, None], tsum(x, axis=0)[None, :], acc)
    else:
        for k in tl.static_range(RBK):
            s = tsum(tl.where((rr == k)[:, None], x, 0.0), axis=0)
            acc = tl.where((rk == rb * RBK + k)[:, None], s[None, :], acc)
    return acc


@triton.jit
def _store_rank_sums(part_ptr, acc, rk, pp, R: tl.constexpr, P: tl.constexpr):
    """part[r, p] = acc[r, p] for the ranks r < R (acc [RPAD, BP] from ``_rank_sums_into``)."""
    m = (rk < R)[:, None] & (pp < P)[None, :]
    tl.store(part_ptr + tl.where(m, rk[:, None] * P + pp[None, :], 0), acc, mask=m)


@triton.jit
def _intra_block(intra, j0, FIRST: tl.constexpr, qr1, qr2, khat_ptr, psiv_ptr, segsum_ptr, rec_cs_ptr, chunk_rows,
                 bhc, n, pp, tt, r_m, ok_rank, lim0, N: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
                 C: tl.constexpr, JB: tl.constexpr, LPK: tl.constexpr, K_SCALED: tl.constexpr, PSIV: tl.constexpr,
                 CAUSAL_SCORES: tl.constexpr, DOT_SCORES_LP: tl.constexpr, DOT_INTRA_LP: tl.constexpr,
                 RECORD: tl.constexpr, HALVES: tl.constexpr):
    """Scores (S20-S22) of the program's rows against the JB fused rows j0.. of the chunk, and their intra
    contribution (S24): returns masked·ΨV[j0:j0+JB] (FIRST) or intra + masked·ΨV[j0:j0+JB]. The rows' rotated q̃
    comes as its two column halves ``qr1``, ``qr2`` (HALVES: the scores GEMM runs its K = N steps as two chained
    GEMMs of K = N/2, in the same order) or whole in ``qr1``."""
    L: tl.constexpr = C * R
    jj = j0 + tl.arange(0, JB)
    t_j = jj // R
    if HALVES:
        HALF: tl.constexpr = N // 2
        jh = tl.arange(0, HALF)
        kh_offs = chunk_rows * N + jj[:, None] * N + jh[None, :]
        kh1 = _load_operand(khat_ptr, kh_offs, K_SCALED, DOT_SCORES_LP, LPK)
        kh2 = _load_operand(khat_ptr, kh_offs + HALF, K_SCALED, DOT_SCORES_LP, LPK)
        scores = mma_acc(qr2, tl.trans(kh2), mma(qr1, tl.trans(kh1), DOT_SCORES_LP, LPK), DOT_SCORES_LP, LPK)
    else:
        kh = _load_operand(khat_ptr, chunk_rows * N + jj[:, None] * N + n[None, :], K_SCALED, DOT_SCORES_LP, LPK)
        scores = mma(qr1, tl.trans(kh), DOT_SCORES_LP, LPK)
    # causal mask t_i > t_j (strict) and exp(segsum) on the causal entries (S21)
    # rows of tokens past S in the last chunk keep their scores (q̃ = bias there), as the reference
    causal = (tt[:, None] > t_j[None, :]) & (jj[None, :] < L) & (ok_rank & (tt < C))[:, None]
    # unmasked gather at clamped (in-bounds) token indices: a masked gather in the JB loop fails BiShengIR's loop
    # tiling; the non-causal entries are dropped below
    seg_offs = tl.minimum(tt, C - 1)[:, None] * C + tl.minimum(t_j, C - 1)[None, :]
    seg = tl.load(segsum_ptr + bhc.to(tl.int64) * (C * C) + seg_offs)
    masked = rnd_if(tl.where(causal, scores * tl.exp(seg), 0.0), CAUSAL_SCORES, LPK)
    pv = _load_operand(psiv_ptr, chunk_rows * P + jj[:, None] * P + pp[None, :], PSIV, DOT_INTRA_LP, LPK)
    if FIRST:
        intra = mma(masked, pv, DOT_INTRA_LP, LPK)
    else:
        intra = mma_acc(masked, pv, intra, DOT_INTRA_LP, LPK)
    if RECORD:
        # every row of the chunk's C tokens, also those past S in the last chunk (zeros there)
        cs_m = ok_rank[:, None] & (tt[:, None] < lim0) & (jj[None, :] < L)
        cs_offs = tl.where(cs_m, (tt * R + r_m)[:, None] * L + jj[None, :], 0)
        tl.store(rec_cs_ptr + bhc.to(tl.int64) * (L * L) + cs_offs, masked, mask=cs_m)
    return intra


@triton.jit
def _carried_in_ranks(acc, term, rr, TB: tl.constexpr, BP: tl.constexpr, RBK: tl.constexpr, ROUND: tl.constexpr,
                      LPK: tl.constexpr):
    """acc (+) the rows of ``term`` [RBK·TB, BP] rank by rank in ascending order (``_dz_step`` each): the carried
    rank sum of the forward's reduced output (out_accum) and of stage 1's dz (dz_accum). Rows of ranks ≥ R and
    invalid rows must hold −0.0 (no change)."""
    if RBK == 1:
        acc = _dz_step(acc, term, ROUND, LPK)
    else:
        term3 = tl.reshape(term, [RBK, TB, BP])
        k3 = tl.arange(0, RBK)[:, None, None]
        for k in tl.static_range(RBK):
            acc = _dz_step(acc, tsum(tl.where(k3 == k, term3, -0.0), axis=0), ROUND, LPK)
    return acc


@triton.jit
def _forward_output(o_acc, out, gate, mimo_o_row_ptr, prow_p, pp, o_ptr, dfull_base, frow, ok, rr, rec_ptr,
                    slot_stride, rec_base, TB: tl.constexpr, BP: tl.constexpr, RBK: tl.constexpr, W: tl.constexpr,
                    LPK: tl.constexpr, PHI_WEIGHT: tl.constexpr, GATE: tl.constexpr, PHI_GATE: tl.constexpr,
                    OUT_PROJ: tl.constexpr, OUT_ACCUM: tl.constexpr, HAS_Z: tl.constexpr, REDUCE_O: tl.constexpr,
                    RECORD: tl.constexpr, H, P: tl.constexpr):
    """The forward's gate and output for one rank block (rows of ``out`` [RBK·TB, BP]; ``gate`` = SiLU(z·ζ) in
    FP32 when HAS_Z).

    Reduced: o_rank = rnd(out·rnd(rnd(Φ)·rnd(gate))) (out_proj, phi_weight, phi_gate, gate) added to the carried
    rank sum ``o_acc`` [TB, BP] (out_accum), returned; the caller stores it after the last rank. Not reduced: the
    row's rnd(out·rnd(gate)) (or out) stored into o [B, S, R, H, P] here; ``o_acc`` returned unchanged.
    """
    if HAS_Z:
        gate = rnd_if(gate, GATE, LPK)
    if REDUCE_O:
        phi = rnd_if(rank_rows(mimo_o_row_ptr, prow_p, pp, RBK == 1), PHI_WEIGHT, LPK)
        if HAS_Z:
            phi = rnd_if(phi * gate, PHI_GATE, LPK)
        o_rank = rnd_if(out * phi, OUT_PROJ, LPK)
        o_acc = _carried_in_ranks(o_acc, tl.where(ok[:, None], o_rank, -0.0), rr, TB, BP, RBK, OUT_ACCUM, LPK)
        if RECORD:
            _record_tile(rec_ptr, SLOT_O_RANK, slot_stride, rec_base, frow, ok, pp, P, o_rank, W)
            if HAS_Z:
                _record_tile(rec_ptr, SLOT_PHI_GATE, slot_stride, rec_base, frow, ok, pp, P, phi, W)
    else:
        if HAS_Z:
            gated = out * gate
        else:
            gated = out
        tl.store(o_ptr + dfull_base + frow[:, None] * (H * P) + pp[None, :], enc(gated, LPK), mask=ok[:, None])
    if RECORD and HAS_Z:
        _record_tile(rec_ptr, SLOT_GATE, slot_stride, rec_base, frow, ok, pp, P, gate, W)
    return o_acc


@triton.jit
def _out_program(
    pid, dout_ptr, q_ptr, q_bias_ptr, mimo_o_ptr, z_ptr, mimo_z_ptr, cs_ptr, sn_ptr, da_cs_ptr, dt_ptr, trap_ptr,
    d_ptr, segsum_ptr, khat_ptr, psiv_ptr, hop_ptr, qkin_ptr, dz_ptr, o_ptr, part_o_ptr, part_z_ptr, rec_ptr,
    rec_cs_ptr, B, S, H, HPG, nc, n_tb, n_pt, N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
    TB: tl.constexpr, RBK: tl.constexpr, RPAD: tl.constexpr, JB: tl.constexpr, LP: tl.constexpr, BP: tl.constexpr,
    AW: tl.constexpr, W: tl.constexpr, LPK: tl.constexpr,
    QK_BIAS: tl.constexpr, QK_BIASED: tl.constexpr, QK_DOT_INTERNAL: tl.constexpr, ROTARY: tl.constexpr,
    DT_INPUT: tl.constexpr, SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr, K_SCALED: tl.constexpr,
    PSIV: tl.constexpr, STATE_OPERAND: tl.constexpr, CAUSAL_SCORES: tl.constexpr, DIAG_ACCUM: tl.constexpr,
    DIAG_FMA: tl.constexpr, DIAG_GAMMA: tl.constexpr, OUT: tl.constexpr, PHI_WEIGHT: tl.constexpr,
    DPHIO: tl.constexpr, DZ_ACCUM: tl.constexpr, SILU_TANH: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
    REDUCE_O: tl.constexpr, DOT_INTER_LP: tl.constexpr, DOT_SCORES_LP: tl.constexpr, DOT_INTRA_LP: tl.constexpr,
    NATIVE_DIAG: tl.constexpr, RECORD: tl.constexpr, DIAG_LOOP: tl.constexpr, RCP_APPROX: tl.constexpr,
    FORWARD: tl.constexpr, D_TERM: tl.constexpr, GATE: tl.constexpr, PHI_GATE: tl.constexpr,
    OUT_PROJ: tl.constexpr, OUT_ACCUM: tl.constexpr,
):
    """Body of ``_mimo_out_kernel`` for one (virtual) program ``pid``."""
    pt = pid % n_pt
    rest = pid // n_pt
    tb = rest % n_tb
    bhc = rest // n_tb
    c = bhc % nc
    bh = bhc // nc
    b = bh // H
    h = bh % H
    g = h // HPG
    G = H // HPG
    M: tl.constexpr = RBK * TB
    NRB: tl.constexpr = (R + RBK - 1) // RBK
    cC = c * C
    row0 = b.to(tl.int64) * S + cC
    qk_base = (row0 * R * G + g) * N
    a_base = (row0 * H + h) * AW
    v_base = (row0 * H + h) * P
    hs_base = bh.to(tl.int64) * S
    chunk_rows = bhc.to(tl.int64) * LP
    n = tl.arange(0, N)
    pp = pt * BP + tl.arange(0, BP)
    mrow = tl.arange(0, M)
    # rows m = k·TB + token of rank rb·RBK + k: RBK ranks of a block of TB tokens, one GEMM for all of them
    if RBK == 1:
        tt = tb * TB + mrow
        rr = mrow * 0
    else:
        tt = tb * TB + mrow % TB
        rr = mrow // TB
    t = cC + tt
    ok_t = (tt < C) & (t < S)
    tt_s = tl.where(ok_t, tt, 0)
    # P tile 0 also writes the records that do not depend on p; a limit, not a bool scalar, because the
    # interpreter mishandles bool-vector & bool-scalar
    lim0 = tl.where(pt == 0, C, 0)

    # ---- per-token quantities (rows of every rank of the block repeat them)
    gamma_t, sg_t, ts_t = gamma_trap_scale(dt_ptr + hs_base, trap_ptr + hs_base, t, ok_t, S, LPK, DT_INPUT,
                                            SHIFTED_GAMMA, TRAP_SCALE)
    # N >= 32: q̃ by column halves (each element loaded and rounded once; GEMMs over K = N as two K = N/2 steps)
    HALVES: tl.constexpr = N >= 32
    HALF: tl.constexpr = N // 2
    jh = tl.arange(0, HALF)
    if HALVES:
        cs_t, sn_t = _rotation_half(cs_ptr + a_base, sn_ptr + a_base, tt_s * (H * AW), ok_t, HALF, AW)
    else:
        cs_t, sn_t = rotation(cs_ptr + a_base, sn_ptr + a_base, tt_s * (H * AW), ok_t, N, AW)
    tok_offs = tt_s[:, None] * (H * P) + pp[None, :]
    e_da = tl.exp(tl.load(da_cs_ptr + hs_base + tl.where(ok_t, t, 0), mask=ok_t, other=0.0))
    if HALVES:
        h_offs = bhc.to(tl.int64) * (N * P) + jh[:, None] * P + pp[None, :]
        hop1 = _load_operand(hop_ptr, h_offs, STATE_OPERAND, DOT_INTER_LP, LPK)
        hop2 = _load_operand(hop_ptr, h_offs + HALF * P, STATE_OPERAND, DOT_INTER_LP, LPK)
    else:
        h_offs = bhc.to(tl.int64) * (N * P) + n[:, None] * P + pp[None, :]
        hop1 = _load_operand(hop_ptr, h_offs, STATE_OPERAND, DOT_INTER_LP, LPK)
    if HAS_D:
        d_h = tl.load(d_ptr + h)
    if HAS_Z:
        z_t = dec(tl.load(z_ptr + v_base + tok_offs, mask=ok_t[:, None], other=0), LPK)
    if REDUCE_O and not FORWARD:
        do_t = dec(tl.load(dout_ptr + v_base + tok_offs, mask=ok_t[:, None], other=0), LPK)

    # B may arrive as the constexpr 1 (the JIT specializes integer arguments equal to 1): no .to() on it
    slot_stride = tl.cast(B, tl.int64) * H * S * R * W
    rec_base = (bh.to(tl.int64) * S + cC) * R * W
    if RECORD:
        tok_rec = rec_base + tt_s * (R * W)
        m0 = ok_t & (tt < lim0) & (rr == 0)
        tl.store(rec_ptr + SLOT_GAMMA * slot_stride + tok_rec, gamma_t, mask=m0)
        tl.store(rec_ptr + SLOT_TRAP_SCALE * slot_stride + tok_rec, ts_t, mask=m0)
        tl.store(rec_ptr + SLOT_SHIFTED_GAMMA * slot_stride + tok_rec, sg_t, mask=m0)

    qk_tok = (bh.to(tl.int64) * S + cC + tt_s) * (R * R)
    psiv_tok = chunk_rows * P + (tt_s * R)[:, None] * P + pp[None, :]
    dfull_base = (row0 * R * H + h) * P
    part_base = (bhc.to(tl.int64) * n_tb + tb) * (R * P)
    # -0.0: the exact identity of every rank step, so the first step is rnd(term) (or term)
    dz_acc = tl.full([TB, BP], -0.0, tl.float32)
    o_acc = tl.full([TB, BP], -0.0, tl.float32)  # the forward's reduced output, carried over the ranks
    # per-rank dmimo partial sums of this program, stored after the rank loop
    rk = tl.arange(0, RPAD)
    po_acc = fzeros(RPAD, BP)
    pz_acc = fzeros(RPAD, BP)
    for rb in tl.range(0, NRB):
        if RBK == 1:
            r_m = rr + rb
            ok_rank = tt >= 0
            ok = ok_t
            r_s = r_m
            prow_n = rb * N
            prow_p = rb * P
        else:
            r_m = rb * RBK + rr
            ok_rank = r_m < R
            ok = ok_t & ok_rank
            r_s = tl.where(ok_rank, r_m, 0)
            prow_n = r_s * N
            prow_p = r_s * P
        frow = tt_s * R + r_s  # fused row of (t, r)
        if HALVES:
            qb1, qb2, qr1, qr2 = _biased_rotated_halves(q_ptr + qk_base, q_bias_ptr + h * (R * N), frow * (G * N),
                                                        prow_n, ok, cs_t, sn_t, N, AW, LPK, QK_BIAS, QK_BIASED,
                                                        ROTARY, RBK == 1)
            inter = mma_acc(qr2, hop2, mma(qr1, hop1, DOT_INTER_LP, LPK), DOT_INTER_LP, LPK) * e_da[:, None]
        else:
            qb1, qr1 = biased_rotated(q_ptr + qk_base, q_bias_ptr + h * (R * N), frow * (G * N), prow_n, ok,
                                       cs_t, sn_t, N, AW, LPK, QK_BIAS, QK_BIASED, ROTARY, RBK == 1)
            qb2 = qb1
            qr2 = qr1
            inter = mma(qr1, hop1, DOT_INTER_LP, LPK) * e_da[:, None]
        # scores and intra over blocks of JB fused rows j: one block on GPUs and the interpreter (JB = LP); a runtime
        # loop on Ascend (JB < LP): unrolled, BiShengIR's compile time grew steeply with the number of blocks
        if JB == LP:
            intra = _intra_block(fzeros(M, BP), 0, True, qr1, qr2, khat_ptr, psiv_ptr, segsum_ptr, rec_cs_ptr,
                                 chunk_rows, bhc, n, pp, tt, r_m, ok_rank, lim0, N, P, R, C, JB, LPK, K_SCALED, PSIV,
                                 CAUSAL_SCORES, DOT_SCORES_LP, DOT_INTRA_LP, RECORD, HALVES)
        else:
            intra = fzeros(M, BP)
            for j0 in tl.range(0, LP, JB):
                intra = _intra_block(intra, j0, False, qr1, qr2, khat_ptr, psiv_ptr, segsum_ptr, rec_cs_ptr,
                                     chunk_rows, bhc, n, pp, tt, r_m, ok_rank, lim0, N, P, R, C, JB, LPK, K_SCALED,
                                     PSIV, CAUSAL_SCORES, DOT_SCORES_LP, DOT_INTRA_LP, RECORD, HALVES)
        o = intra + inter
        # diagonal (S26): acc over r_in ascending, qk from the prep kernel, ΨV rows of the same token
        acc = tl.full([M, BP], -0.0, tl.float32)
        if NATIVE_DIAG:
            acc = operand(acc, True, LPK)
        qk_row = qk_tok + r_s * R
        if not DIAG_LOOP:
            for r_in in tl.static_range(R):
                acc = _diag_step(acc, r_in, qkin_ptr, qk_row, psiv_ptr, psiv_tok, ok, LPK, P,
                                 QK_DOT_INTERNAL, PSIV, DIAG_ACCUM, DIAG_FMA, NATIVE_DIAG)
        else:
            for r_in in tl.range(0, R):
                acc = _diag_step(acc, r_in, qkin_ptr, qk_row, psiv_ptr, psiv_tok, ok, LPK, P,
                                 QK_DOT_INTERNAL, PSIV, DIAG_ACCUM, DIAG_FMA, NATIVE_DIAG)
        if NATIVE_DIAG:
            acc = acc.to(tl.float32)
        diag = rnd_if(acc * gamma_t[:, None], DIAG_GAMMA, LPK)
        if FORWARD:
            # the forward: rnd(diag + D·ΨV) (d_term), then o = inter + intra + that, never rounded before the gate
            if HAS_D:
                d_term = rnd_if(diag + d_h * _load_tile(psiv_ptr, psiv_tok + (r_s * P)[:, None], PSIV, LPK),
                                D_TERM, LPK)
            else:
                d_term = diag
            out = o + d_term
        else:
            o = o + diag
            if HAS_D:
                # D·ΨV of the row's own (t, r)
                o = o + d_h * _load_tile(psiv_ptr, psiv_tok + (r_s * P)[:, None], PSIV, LPK)
            out = rnd_if(o, OUT, LPK)
        if RECORD:
            okr = ok & (tt < lim0)
            if HALVES:
                _record_tile(rec_ptr, SLOT_Q_ROT, slot_stride, rec_base, frow, okr, jh, N, qr1, W)
                _record_tile(rec_ptr, SLOT_Q_ROT, slot_stride, rec_base, frow, okr, HALF + jh, N, qr2, W)
                _record_tile(rec_ptr, SLOT_Q_BIASED, slot_stride, rec_base, frow, okr, jh, N, qb1, W)
                _record_tile(rec_ptr, SLOT_Q_BIASED, slot_stride, rec_base, frow, okr, HALF + jh, N, qb2, W)
            else:
                _record_tile(rec_ptr, SLOT_Q_ROT, slot_stride, rec_base, frow, okr, n, N, qr1, W)
                _record_tile(rec_ptr, SLOT_Q_BIASED, slot_stride, rec_base, frow, okr, n, N, qb1, W)
            _record_tile(rec_ptr, SLOT_INTER, slot_stride, rec_base, frow, ok, pp, P, inter, W)
            _record_tile(rec_ptr, SLOT_INTRA, slot_stride, rec_base, frow, ok, pp, P, intra, W)
            _record_tile(rec_ptr, SLOT_DIAG_ACCUM, slot_stride, rec_base, frow, ok, pp, P, acc, W)
            _record_tile(rec_ptr, SLOT_DIAG, slot_stride, rec_base, frow, ok, pp, P, diag, W)
            _record_tile(rec_ptr, SLOT_OUT, slot_stride, rec_base, frow, ok, pp, P, out, W)
            if FORWARD and HAS_D:
                _record_tile(rec_ptr, SLOT_D_TERM, slot_stride, rec_base, frow, ok, pp, P, d_term, W)
        if HAS_Z:
            zeta = rank_rows(mimo_z_ptr + h * (R * P), prow_p, pp, RBK == 1)
            x = z_t * zeta
            gate, sig_x, sig_negx = silu_parts(x, SILU_TANH, RCP_APPROX)
        else:
            gate = out  # never read without Z
        if FORWARD:
            o_acc = _forward_output(o_acc, out, gate, mimo_o_ptr + h * (R * P), prow_p, pp, o_ptr, dfull_base, frow,
                                    ok, rr, rec_ptr, slot_stride, rec_base, TB, BP, RBK, W, LPK, PHI_WEIGHT, GATE,
                                    PHI_GATE, OUT_PROJ, OUT_ACCUM, HAS_Z, REDUCE_O, RECORD, H, P)
        elif REDUCE_O:
            if HAS_Z:
                gated = gate * out
            else:
                gated = out
            po_acc = _rank_sums_into(po_acc, tl.where(ok[:, None], gated * do_t, 0.0), rr, rb, rk, RBK)
            if HAS_Z:
                phi = rnd_if(rank_rows(mimo_o_ptr + h * (R * P), prow_p, pp, RBK == 1), PHI_WEIGHT, LPK)
                dphio = rnd_if(rnd_if(do_t * phi, DPHIO, LPK) * out, DPHIO, LPK)
        else:
            if HAS_Z:
                d_r = dec(tl.load(dout_ptr + dfull_base + frow[:, None] * (H * P) + pp[None, :],
                                  mask=ok[:, None], other=0), LPK)
                dphio = rnd_if(d_r * out, DPHIO, LPK)
        if HAS_Z and not FORWARD:
            dzz = dphio * sig_x * (1.0 + x * sig_negx)
            # invalid rows (and ranks ≥ R) add −0.0: no change
            term = tl.where(ok[:, None], dzz * zeta, -0.0)
            dz_acc = _carried_in_ranks(dz_acc, term, rr, TB, BP, RBK, DZ_ACCUM, LPK)
            pz_acc = _rank_sums_into(pz_acc, tl.where(ok[:, None], dzz * z_t, 0.0), rr, rb, rk, RBK)
            if RECORD:
                _record_tile(rec_ptr, SLOT_GATE, slot_stride, rec_base, frow, ok, pp, P, gate, W)
                _record_tile(rec_ptr, SLOT_DPHIO, slot_stride, rec_base, frow, ok, pp, P, dphio, W)
                _record_tile(rec_ptr, SLOT_DZZ, slot_stride, rec_base, frow, ok, pp, P, dzz, W)
    if FORWARD:
        if REDUCE_O:
            # the rank sum o_sum of the block's tokens: the reduced output [B, S, H, P]
            ttb = tb * TB + tl.arange(0, TB)
            okb = (ttb < C) & (cC + ttb < S)
            ttb_s = tl.where(okb, ttb, 0)
            tl.store(o_ptr + v_base + ttb_s[:, None] * (H * P) + pp[None, :], enc(o_acc, LPK), mask=okb[:, None])
            if RECORD:
                _record_tile(rec_ptr, SLOT_O_SUM, slot_stride, rec_base, ttb_s * R, okb, pp, P, o_acc, W)
    else:
        if REDUCE_O:
            _store_rank_sums(part_o_ptr + part_base, po_acc, rk, pp, R, P)
        if HAS_Z:
            _store_rank_sums(part_z_ptr + part_base, pz_acc, rk, pp, R, P)
    if HAS_Z and not FORWARD:
        ttb = tb * TB + tl.arange(0, TB)
        okb = (ttb < C) & (cC + ttb < S)
        ttb_s = tl.where(okb, ttb, 0)
        tl.store(dz_ptr + v_base + ttb_s[:, None] * (H * P) + pp[None, :], enc(dz_acc, LPK), mask=okb[:, None])
        if RECORD:
            _record_tile(rec_ptr, SLOT_DZ_ACCUM, slot_stride, rec_base, ttb_s * R, okb, pp, P, dz_acc, W)


@triton.jit
def _mimo_out_kernel(
    dout_ptr, q_ptr, q_bias_ptr, mimo_o_ptr, z_ptr, mimo_z_ptr, cs_ptr, sn_ptr, da_cs_ptr, dt_ptr, trap_ptr, d_ptr,
    segsum_ptr, khat_ptr, psiv_ptr, hop_ptr, qkin_ptr, dz_ptr, o_ptr, part_o_ptr, part_z_ptr, rec_ptr, rec_cs_ptr,
    B, S, H, HPG, nc, n_tb, n_pt, n_virtual, N: tl.constexpr, P: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
    TB: tl.constexpr, RBK: tl.constexpr, RPAD: tl.constexpr, JB: tl.constexpr, LP: tl.constexpr, BP: tl.constexpr,
    AW: tl.constexpr, W: tl.constexpr, LPK: tl.constexpr,
    QK_BIAS: tl.constexpr, QK_BIASED: tl.constexpr, QK_DOT_INTERNAL: tl.constexpr, ROTARY: tl.constexpr,
    DT_INPUT: tl.constexpr, SHIFTED_GAMMA: tl.constexpr, TRAP_SCALE: tl.constexpr, K_SCALED: tl.constexpr,
    PSIV: tl.constexpr, STATE_OPERAND: tl.constexpr, CAUSAL_SCORES: tl.constexpr, DIAG_ACCUM: tl.constexpr,
    DIAG_FMA: tl.constexpr, DIAG_GAMMA: tl.constexpr, OUT: tl.constexpr, PHI_WEIGHT: tl.constexpr,
    DPHIO: tl.constexpr, DZ_ACCUM: tl.constexpr, SILU_TANH: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr,
    REDUCE_O: tl.constexpr, DOT_INTER_LP: tl.constexpr, DOT_SCORES_LP: tl.constexpr, DOT_INTRA_LP: tl.constexpr,
    NATIVE_DIAG: tl.constexpr, RECORD: tl.constexpr, DIAG_LOOP: tl.constexpr, PERSISTENT: tl.constexpr,
    RCP_APPROX: tl.constexpr, FORWARD: tl.constexpr, D_TERM: tl.constexpr, GATE: tl.constexpr,
    PHI_GATE: tl.constexpr, OUT_PROJ: tl.constexpr, OUT_ACCUM: tl.constexpr,
):
    """Everything that depends on rnd(h_c): o, out, the gradient branches and the dmimo partials of one chunk
    (stage 1), or the forward's output o (FORWARD).

    Grid: 1-D, up to n_virtual = B·H·nc·n_tb·n_pt programs looping over virtual programs; virtual program → (b, h,
    chunk c, block of TB tokens, P tile of BP columns). The program's rows are RBK ranks × TB tokens (row
    k·TB + τ is token τ of rank rb·RBK + k), looping over the cdiv(R, RBK) rank blocks in ascending order, so one
    GEMM serves RBK ranks and the rank sums of the diagonal (per row) and of dz (across blocks) run in ascending
    rank order in one program. k̂ and ΨV come from ``_mimo_prep_kernel`` as dense fused rows (the K dimension of
    the intra GEMMs), JB rows at a time.

    Inputs: dout, q, z, trap (int16 bits), q_bias, mimo_o, mimo_z, da_cs, dt, d, segsum (FP32) as in the API;
    cs, sn [B, S, H, AW] (``_mimo_angles_kernel``); khat [B·H·nc, LP, N], psiv [B·H·nc, LP, P] (lp bits when
    K_SCALED / PSIV); hop [B, H, nc, N, P]: rnd(h_c) as lp bits (the ``states`` output) when STATE_OPERAND, else
    FP32 h_c; qkin [B, H, S, R, R]: the qk_dot output (lp bits) when QK_DOT_INTERNAL, else FP32 q̃·k̃ᵀ.
    Outputs: dz [B, S, H, P] (lp bits), part_o / part_z [B·H·nc·n_tb, R, P] FP32 per-block dmimo partials;
    records when RECORD.

    Compile-time constants:
        N, P, R, C: sizes. TB: tokens per program (pow2 ≥ 16). RBK: ranks per row block (pow2; TB·RBK rows).
        RPAD: pow2 ≥ R (rows of the per-rank partial sums).
        JB: fused rows per scores/intra step (divides LP; JB < LP runs them as a runtime loop). LP: fused rows
        (pow2 ≥ max(16, C·R)). BP: P tile.
        AW: rotated columns per half. W: record row width. LPK: 0 bf16, 1 fp16 (2, 3: the same through the
        device's cvt.rn).
        QK_BIAS, QK_BIASED, QK_DOT_INTERNAL, ROTARY, DT_INPUT, SHIFTED_GAMMA, TRAP_SCALE, K_SCALED, PSIV,
        STATE_OPERAND, CAUSAL_SCORES, DIAG_ACCUM, DIAG_GAMMA, OUT, PHI_WEIGHT, DPHIO, DZ_ACCUM: policy switches.
        DIAG_FMA: ``diag_mode="fma"`` (one rounding of acc + a·b) else ``"mul_then_add"``. SILU_TANH: tanh form.
        HAS_Z, HAS_D, REDUCE_O: branches. DOT_*_LP: feed that GEMM bf16/fp16 operands (devices only, both operands
        on the grid). NATIVE_DIAG: run the diagonal's rank steps with the device's lp instructions (fma.rn.bf16,
        or mul.rn + add.rn with FMA contraction off): bit-identical to the emulation, only with LPK >= 2, DIAG_ACCUM,
        QK_DOT_INTERNAL and PSIV. RECORD: write the per-stage records. PERSISTENT: loop over the n_virtual virtual
        programs (the launch has fewer programs). DIAG_LOOP: the diagonal's rank steps as a
        runtime loop (R > 8, and Ascend: unrolled, the fp16 steps without D crash triton-ascend's
        triton-to-unstructure pass at N = P = 64, R = 4) instead of unrolled. RCP_APPROX (CUDA): the Z gate's
        reciprocal as div.approx (the bits of the div.full.f32 of ``/`` for its denominators in [1, 2]).

        FORWARD: the forward operator ``mamba_mimo_fwd`` instead of stage 1: no dout, no gradient branches, no
        partials; writes ``o`` (``o_ptr``: [B, S, H, P] reduced, [B, S, R, H, P] not) from the same inter, intra
        and diagonal. D_TERM, GATE, PHI_GATE, OUT_PROJ, OUT_ACCUM: the forward's own switches (off in stage 1;
        OUT, DPHIO, DZ_ACCUM are off in the forward).

    Rounding sites, stage 1: S4, S12 (q̃), S16 (q rotation), S19 (operand), S22, S26 (diag_accum, diag_mode), S27,
    S30, S34, S35, S36, S38 (dz_accum; DZ store); FP32: S9, S20, S21, S23, S24, S25, S28, S29, S31–S33, S37, S39.
    Forward (``mimo_numerics/ops/mamba_mimo_fwd/sites.py`` names): qk_bias, qk_biased, rotary (q), state_operand,
    causal_scores, diag_accum (diag_mode), diag_gamma, d_term, gate (silu_form), phi_weight, phi_gate, out_proj,
    out_accum, the o store; FP32: γ, exp(da_cs), the inter and intra GEMMs, o = inter + intra + d_term.
    """
    if PERSISTENT:
        # loop over virtual programs: Ascend caps a launch at 65535 programs
        for pid in tl.range(tl.program_id(0), n_virtual, tl.num_programs(0)):
            _out_program(
                pid, dout_ptr, q_ptr, q_bias_ptr, mimo_o_ptr, z_ptr, mimo_z_ptr, cs_ptr, sn_ptr, da_cs_ptr, dt_ptr,
                trap_ptr, d_ptr, segsum_ptr, khat_ptr, psiv_ptr, hop_ptr, qkin_ptr, dz_ptr, o_ptr, part_o_ptr,
                part_z_ptr, rec_ptr, rec_cs_ptr, B, S, H, HPG, nc, n_tb, n_pt, N, P, R, C, TB, RBK, RPAD, JB, LP, BP, AW, W,
                LPK,
                QK_BIAS, QK_BIASED, QK_DOT_INTERNAL, ROTARY, DT_INPUT, SHIFTED_GAMMA, TRAP_SCALE, K_SCALED, PSIV,
                STATE_OPERAND, CAUSAL_SCORES, DIAG_ACCUM, DIAG_FMA, DIAG_GAMMA, OUT, PHI_WEIGHT, DPHIO, DZ_ACCUM,
                SILU_TANH, HAS_Z, HAS_D, REDUCE_O, DOT_INTER_LP, DOT_SCORES_LP, DOT_INTRA_LP, NATIVE_DIAG, RECORD,
                DIAG_LOOP, RCP_APPROX, FORWARD, D_TERM, GATE, PHI_GATE, OUT_PROJ, OUT_ACCUM)
    else:
        pid = tl.program_id(0)
        _out_program(
            pid, dout_ptr, q_ptr, q_bias_ptr, mimo_o_ptr, z_ptr, mimo_z_ptr, cs_ptr, sn_ptr, da_cs_ptr, dt_ptr,
            trap_ptr, d_ptr, segsum_ptr, khat_ptr, psiv_ptr, hop_ptr, qkin_ptr, dz_ptr, o_ptr, part_o_ptr,
            part_z_ptr, rec_ptr, rec_cs_ptr, B, S, H, HPG, nc, n_tb, n_pt, N, P, R, C, TB, RBK, RPAD, JB, LP, BP, AW, W, LPK,
            QK_BIAS, QK_BIASED, QK_DOT_INTERNAL, ROTARY, DT_INPUT, SHIFTED_GAMMA, TRAP_SCALE, K_SCALED, PSIV,
            STATE_OPERAND, CAUSAL_SCORES, DIAG_ACCUM, DIAG_FMA, DIAG_GAMMA, OUT, PHI_WEIGHT, DPHIO, DZ_ACCUM,
            SILU_TANH, HAS_Z, HAS_D, REDUCE_O, DOT_INTER_LP, DOT_SCORES_LP, DOT_INTRA_LP, NATIVE_DIAG, RECORD,
            DIAG_LOOP, RCP_APPROX, FORWARD, D_TERM, GATE, PHI_GATE, OUT_PROJ, OUT_ACCUM)


@triton.jit
def _mimo_reduce_kernel(part_ptr, out_ptr, nc, n_blk, RP: tl.constexpr, BLK: tl.constexpr, CB: tl.constexpr):
    """dmimo[b, h, r, p] = Σ_c part[b, h, c, r, p], in a fixed order (deterministic, no atomics).

    Grid: 1-D, NS·B·H·n_blk programs; program → (sum s, b, h, block of BLK of the RP = R·P columns): the launcher
    stacks dmimo_o and dmimo_z (NS = 2) so one launch makes both. Chunks are read CB at a time, each block
    tree-summed, the blocks added in chunk order. Inputs: part [NS, B·H·nc, R·P] FP32 (nc = rows per (b, h)).
    Output: out [NS, B·H, R·P] FP32. Compile-time constants: RP (a constexpr, so that with BLK dividing it the column
    mask folds away), BLK (columns), CB (chunks per step). Row indices past nc are clamped (masked loads at in-bounds
    addresses whose columns stay contiguous: 16-byte loads; measured on an H200, 20261130: see docs/kernels.md). No
    rounding site (S33, S39 are FP32 sums).
    """
    pid = tl.program_id(0)
    blk = pid % n_blk
    bh = pid // n_blk
    cols = blk * BLK + tl.arange(0, BLK)
    cm = cols < RP
    if RP % BLK == 0:
        cols_s = cols  # in bounds already (a clamp would hide the columns' contiguity from the load vectorizer)
    else:
        cols_s = tl.minimum(cols, RP - 1)
    ccv = tl.arange(0, CB)
    base = bh.to(tl.int64) * nc * RP
    total = tl.full([BLK], 0.0, tl.float32)
    for c0 in range(0, nc, CB):
        cc = c0 + ccv
        m = (cc < nc)[:, None] & cm[None, :]
        x = tl.load(part_ptr + base + tl.minimum(cc, nc - 1)[:, None] * RP + cols_s[None, :], mask=m, other=0.0)
        total += tsum(x, axis=0)
    tl.store(out_ptr + bh.to(tl.int64) * RP + cols_s, total, mask=cm)


@triton.jit
def _rounding_probe_kernel(x_ptr, y_ptr, bits_ptr, val_ptr, dec_ptr, sum_ptr, n, LPK: tl.constexpr,
                           BLOCK: tl.constexpr):
    """Test hook for the rounding helpers: bits = enc(x), val = rnd(x), dec = dec(bits), sum = rnd_sum(x, y).

    Grid: 1-D, cdiv(n, BLOCK) programs. Inputs x, y [n] FP32. Outputs bits [n] int16, val, dec, sum [n] FP32.
    Compile-time constants: LPK (0 bf16, 1 fp16), BLOCK. Rounding sites: none (helper check only).
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    offs = tl.where(m, offs, 0)
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    y = tl.load(y_ptr + offs, mask=m, other=0.0)
    bits = enc(x, LPK)
    tl.store(bits_ptr + offs, bits, mask=m)
    tl.store(val_ptr + offs, rnd(x, LPK), mask=m)
    tl.store(dec_ptr + offs, dec(bits, LPK), mask=m)
    tl.store(sum_ptr + offs, rnd_sum(x, y, LPK), mask=m)


@triton.jit
def _silu_probe_kernel(x_ptr, gate_ptr, sig_ptr, sig_neg_ptr, n, SILU_TANH: tl.constexpr, RCP_APPROX: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Test hook for ``silu_parts``: gate, σ(x), σ(−x) of x [n] FP32 (outputs [n] FP32).

    Grid: 1-D, cdiv(n, BLOCK) programs. Compile-time constants: SILU_TANH, RCP_APPROX (CUDA only), BLOCK. Rounding
    sites: none (FP32 special functions of S31/S37).
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    offs = tl.where(m, offs, 0)
    gate, sig, sig_neg = silu_parts(tl.load(x_ptr + offs, mask=m, other=0.0), SILU_TANH, RCP_APPROX)
    tl.store(gate_ptr + offs, gate, mask=m)
    tl.store(sig_ptr + offs, sig, mask=m)
    tl.store(sig_neg_ptr + offs, sig_neg, mask=m)
