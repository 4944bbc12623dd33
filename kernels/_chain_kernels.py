"""Triton kernels of the whole op's preprocessing and FP32 epilogue (the steps around the three operator kernels).

What upstream's ``mamba3_mimo`` runs outside its TileLang kernels, as the package's references model it
(``mimo_numerics/ops/mamba3_mimo/preprocess.py``, ``mimo_numerics/ops/mamba3_mimo_epilogue/reference.py``): chunk
parallel, one launch per step, no torch operator between them. One source for NVIDIA GPUs, Triton-Ascend and
Triton's CPU interpreter, under the rules of ``_mimo_kernels.py`` (lp values as int16 bits rounded by
``_rounding``'s integer RNE, FP32 math, masked in-bounds accesses, 1-D grids, no reverse scans and no ``tl.flip``:
a reverse sum is a forward scan of a reversed load, or a masked row sum).

Kernels (``kernels/chain_steps.py`` launches them; shapes as the references'):

Preprocessing (``angle_dt_fwd``, ``compute_dacs_segsum_triton``):

* ``_dacs_segsum_kernel``   grid B·H·nc, tile [C] and [C, C]: ``da_cs`` (inclusive ``tl.cumsum``), ``da_cs_rev``
  (Σ over the later rows of the chunk, a masked row sum), ``segsum`` (``tl.cumsum`` over the rows of the strictly
  lower [C, C] tile), each clamped to ``<= 0`` (NaN kept). Constexprs: C.
* ``_angle_sum_kernel``     grid B·nc·H, tile [C, KP]: each chunk's Σ_t fl(fl(tanh(angle)·π₃₂)·dt) (``tl.sum``),
  into ``sums [nc, B, H, K]`` (the rows of ``ordered_sums._angle_walk_kernel``, which turns them into the angle
  state entering each chunk). Constexprs: C, KP (K padded to a power of 2).
* ``_angle_out_kernel``     grid B·nc·H: ``(tl.cumsum of the same terms + entering state) mod 2π₃₂``, the mod as
  the walk's (IEEE division, one rounding of ``x − 2π₃₂·k``). Constexprs: C, KP, TWO_PI, RESIDUAL_IN_F64 (the exact
  residual formed in float64 and rounded once: the interpreter only; ``tl.fma`` elsewhere).

Epilogue (``mamba_mimo_bwd_combined``'s torch sums, ``bwd_dtrap_ddt``, ``bwd_dadt_fused``, ``angle_dt_bwd``):

* ``_block_sum_kernel``     grid n_blocks·(column blocks): the bias sums' first level, a sequential FP32 sum of
  TB consecutive rows of ``x [T, cols]`` (lp bits), into ``part [n_blocks, cols]``. Constexprs: TB, BLOCK, LPK.
* ``_bias_total_kernel``    grid (column blocks): the second level, ``part`` summed over the blocks in order, rounded
  to lp when ROUND (``round_outputs``: 2.3.2.post1's lp bias sums), stored as ``[H, R, N]`` from ``[R, H, N]``
  columns. Constexprs: BLOCK, LPK, ROUND.
* ``_head_sum_kernel``      grid (rows blocks): G == 1, ``dQ[.., 0, n] = rnd(Σ_h dq[.., h, n])`` summed over the
  heads in order. Constexprs: BT, NP (N padded), LPK.
* ``_dtrap_ddt_kernel``     grid cdiv(B·H·S, BLOCK): ``ddt_core``, ``dTrap`` (lp) and ``dDT = ddt_core +
  dDT_angle``. Constexprs: BLOCK, LPK, HELPER_FMA (the two ``a·b + c`` as one ``tl.fma``).
* ``_dadt_kernel``          grid B·H·nc, tiles [C], [RB, C]: ``dADT = ddA + ((from_cs + from_cs_rev) + Σ_b segsum
  term)``, in blocks of RB tokens. Constexprs: C, RB.
* ``_angle_grad_sum_kernel`` grid B·nc·H: each chunk's ``tl.sum`` of ``dangles`` over its tokens, into
  ``[nc, B, H, A]`` (then ``ordered_sums``' exclusive reverse scan over the chunks gives the later chunks' sum).
  Constexprs: C, AP.
* ``_angle_grad_kernel``    grid B·nc·H: ``grad = ((chunk_sum − tl.cumsum) + dangles) + later chunks``, then
  ``dAngles = ((grad·dt)·π₃₂)·sech²`` and ``dDT_angle = Σ_a grad·tanh·π₃₂`` (``tl.sum``). Constexprs: C, AP,
  HELPER_FMA (``sech² = fma(−tanh, tanh, 1)``).

Rounding sites: none of a kernel's (these steps are FP32); the lp stores are upstream's output dtypes (``dQ``,
``dK`` summed over heads, ``dTrap``) and, with ROUND, the bias sums.

FP32-level orders that differ from the references (none is a site; the gates' tolerances cover them,
``docs/kernels.md``): the scans and sums of the preprocessing and of ``angle_dt_bwd`` are ``tl.cumsum``/``tl.sum``
in this backend's order (the references model upstream's tile layouts on the H200, and, with
``helper_fma="contracted"``, the contraction of the scanned products into the scans' first adds, which a
``tl.cumsum`` cannot express: these kernels contract only the ``a·b + c`` written as ``tl.fma``); ``bwd_dadt``'s
sums are masked row sums and ``tl.cumsum`` (the reference: sequential); ``tanh`` is ``_tanh`` below (≤ 2 ulp, the
reference: torch's); ``exp`` is ``tl.exp``; σ is ``_rounding.sigmoid``. The bias, head and batch sums are the
references' orders exactly (sequential within TB-row blocks, then over the blocks; sequential over heads, over
the batch), so those outputs are the references' bits on every backend.
"""

import triton
import triton.language as tl

from ._rounding import dec, enc, rnd, sigmoid, tcumsum, tsum

#: fp32(π) (Triton's ``PI`` constant used with fp32 operands in upstream's helpers).
PI_F32 = tl.constexpr(3.1415927410125732)


@triton.jit
def _tanh(x):
    """tanh(x) in FP32 from one ``tl.exp`` (no libdevice, the same formula on every backend; about 2 ulp).

    |x| >= 0.55: 1 − 2/(e^{2|x|} + 1), sign restored (no cancellation there: the result is at least 0.5); below, the
    odd Taylor series to x^15 (truncation under 2e-9 relative at 0.55), evaluated by Horner in x².
    """
    ax = tl.abs(x)
    big = 1.0 - 2.0 / (tl.exp(2.0 * tl.minimum(ax, 20.0)) + 1.0)
    z = x * x
    # 1/3 − 2/15 z + 17/315 z² − ... (tanh x = x − x·z·p), the coefficients of x^3 ... x^17
    p = -0.0005900274409 * z + 0.0014558343870
    p = p * z - 0.0035921280366
    p = p * z + 0.0088632355299
    p = p * z - 0.0218694885362
    p = p * z + 0.0539682539683
    p = p * z - 0.1333333333333
    p = p * z + 0.3333333333333
    small = x - x * z * p
    return tl.where(ax >= 0.55, tl.where(x < 0.0, -big, big), small)


@triton.jit
def _clamp_nonpositive(x):
    """min(x, 0) with NaN kept (``torch.clamp(x, max=0)``; ``tl.minimum`` would return 0 for a NaN)."""
    return tl.where(x > 0.0, 0.0, x)


@triton.jit
def _mod_two_pi(x, TWO_PI: tl.constexpr, RESIDUAL_IN_F64: tl.constexpr):
    """``x − 2π₃₂·floor(x / 2π₃₂)``: an IEEE division, then the difference rounded once."""
    turns = tl.floor(tl.math.div_rn(x, TWO_PI))
    if RESIDUAL_IN_F64:  # a 24-bit constant times an integer turn count, minus x: exact in float64
        return (x.to(tl.float64) - turns.to(tl.float64) * TWO_PI).to(tl.float32)
    else:
        return tl.fma(turns, -TWO_PI, x)


# ------------------------------------------------------------------------------------------------ preprocessing
@triton.jit
def _dacs_segsum_kernel(adt_ptr, da_cs_ptr, da_cs_rev_ptr, segsum_ptr, S, nc, C: tl.constexpr):
    """da_cs, da_cs_rev [B, H, S] and segsum [B, H, nc, C, C] of one chunk (program → (b·H + h, chunk c)).

    x = adt of the chunk, rows past S read as 0; ``da_cs[t] = min(0, Σ_{u<=t} x_u)`` (``tl.cumsum``),
    ``da_cs_rev[t] = min(0, Σ_{u>t} x_u)`` (a masked row sum over the chunk), ``segsum[i, j] = min(0, Σ_{j<u<=i}
    x_u)`` (``tl.cumsum`` over i of the strictly lower tile; rows past S repeat the last valid row, as the
    reference's zero padding gives). FP32, no rounding site.
    """
    pid = tl.program_id(0)
    c = pid % nc
    bh = pid // nc
    rows = tl.arange(0, C)
    cols = tl.arange(0, C)
    t = c * C + rows
    ok = t < S
    base = bh.to(tl.int64) * S
    x = tl.load(adt_ptr + base + tl.where(ok, t, 0), mask=ok, other=0.0)
    inclusive = tcumsum(x, 0)
    later = tsum(tl.where(cols[None, :] > rows[:, None], x[None, :], 0.0), axis=1)
    tl.store(da_cs_ptr + base + tl.where(ok, t, 0), _clamp_nonpositive(inclusive), mask=ok)
    tl.store(da_cs_rev_ptr + base + tl.where(ok, t, 0), _clamp_nonpositive(later), mask=ok)
    below = tl.where(rows[:, None] > cols[None, :], x[:, None], 0.0)
    seg = tcumsum(below, 0)
    tl.store(segsum_ptr + pid.to(tl.int64) * (C * C) + rows[:, None] * C + cols[None, :], _clamp_nonpositive(seg))


@triton.jit
def _angle_terms(angles_ptr, dt_ptr, b, c, h, S, H, K, C: tl.constexpr, KP: tl.constexpr):
    """fl(fl(tanh(angle)·π₃₂)·dt) on the chunk's [C, KP] tile (rows past S, columns past K: 0), its rows t and
    columns a, and the mask of valid elements."""
    t = c * C + tl.arange(0, C)
    a = tl.arange(0, KP)
    ok = (t < S)[:, None] & (a < K)[None, :]
    t_s = tl.where(t < S, t, 0)
    offs = ((b.to(tl.int64) * S + t_s[:, None]) * H + h) * K + tl.where(ok, a[None, :], 0)
    ang = tl.load(angles_ptr + offs, mask=ok, other=0.0)
    dtv = tl.load(dt_ptr + (b.to(tl.int64) * H + h) * S + t_s, mask=t < S, other=0.0)
    terms = tl.where(ok, (_tanh(ang) * PI_F32) * dtv[:, None], 0.0)
    return terms, offs, ok, a


@triton.jit
def _angle_sum_kernel(angles_ptr, dt_ptr, sums_ptr, B, S, H, K, nc, C: tl.constexpr, KP: tl.constexpr):
    """Each chunk's sum of the angle terms: sums [nc, B, H, K] (program → (b, chunk c, head h)). FP32."""
    pid = tl.program_id(0)
    h = pid % H
    bc = pid // H
    c = bc % nc
    b = bc // nc
    terms, _, _, a = _angle_terms(angles_ptr, dt_ptr, b, c, h, S, H, K, C, KP)
    total = tsum(terms, axis=0)
    am = a < K
    tl.store(sums_ptr + ((c.to(tl.int64) * B + b) * H + h) * K + tl.where(am, a, 0), total, mask=am)


@triton.jit
def _angle_out_kernel(angles_ptr, dt_ptr, entering_ptr, out_ptr, B, S, H, K, nc, C: tl.constexpr,
                      KP: tl.constexpr, TWO_PI: tl.constexpr, RESIDUAL_IN_F64: tl.constexpr):
    """angles_cumsum [B, S, H, K] = (tl.cumsum of the chunk's terms + the state entering it) mod 2π₃₂ (program →
    (b, chunk c, head h)); ``entering [nc, B, H, K]`` from ``ordered_sums.angle_state_walk``. FP32."""
    pid = tl.program_id(0)
    h = pid % H
    bc = pid // H
    c = bc % nc
    b = bc // nc
    terms, offs, ok, a = _angle_terms(angles_ptr, dt_ptr, b, c, h, S, H, K, C, KP)
    am = a < K
    state = tl.load(entering_ptr + ((c.to(tl.int64) * B + b) * H + h) * K + tl.where(am, a, 0), mask=am, other=0.0)
    out = _mod_two_pi(tcumsum(terms, 0) + state[None, :], TWO_PI, RESIDUAL_IN_F64)
    tl.store(out_ptr + offs, out, mask=ok)


# ------------------------------------------------------------------------------------------------ epilogue sums
@triton.jit
def _block_sum_kernel(x_ptr, part_ptr, n_rows, n_cols, n_cb, TB: tl.constexpr, BLOCK: tl.constexpr,
                      LPK: tl.constexpr):
    """part[k, j] = ((x[k·TB, j] + x[k·TB + 1, j]) + ...) over the TB rows of block k (fewer in the last), FP32, of
    ``x [n_rows, n_cols]`` (lp bits). Program → (block k, column block)."""
    pid = tl.program_id(0)
    k = pid // n_cb
    cols = (pid % n_cb) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n_cols
    cols_s = tl.where(m, cols, 0)
    first = k * TB
    ptr = x_ptr + first.to(tl.int64) * n_cols + cols_s
    acc = dec(tl.load(ptr, mask=m, other=0), LPK)
    for _ in range(1, tl.minimum(TB, n_rows - first)):
        ptr += n_cols
        acc = acc + dec(tl.load(ptr, mask=m, other=0), LPK)
    tl.store(part_ptr + k.to(tl.int64) * n_cols + cols_s, acc, mask=m)


@triton.jit
def _bias_total_kernel(part_ptr, out_ptr, n_blocks, R, H, N, BLOCK: tl.constexpr, LPK: tl.constexpr,
                       ROUND: tl.constexpr):
    """out[h, r, n] = ((part[0, j] + part[1, j]) + ...) over the blocks, j = (r·H + h)·N + n; rounded to lp with
    ROUND (the value kept in FP32). Program → column block."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_cols = R * H * N
    m = cols < n_cols
    cols_s = tl.where(m, cols, 0)
    ptr = part_ptr + cols_s
    acc = tl.load(ptr, mask=m, other=0.0)
    for _ in range(1, n_blocks):
        ptr += n_cols
        acc = acc + tl.load(ptr, mask=m, other=0.0)
    if ROUND:
        acc = rnd(acc, LPK)
    n = cols_s % N
    h = (cols_s // N) % H
    r = cols_s // (N * H)
    tl.store(out_ptr + (h * R + r) * N + n, acc, mask=m)


@triton.jit
def _head_sum_kernel(x_ptr, out_ptr, n_rows, H, N, BT: tl.constexpr, NP: tl.constexpr, LPK: tl.constexpr):
    """out[i, n] = rnd(((x[i, 0, n] + x[i, 1, n]) + ...) over the H heads) for the rows i = (b, s, r) of
    ``x [n_rows, H, N]`` (lp bits in, lp bits out). Program → block of BT rows."""
    i = tl.program_id(0) * BT + tl.arange(0, BT)
    n = tl.arange(0, NP)
    m = (i < n_rows)[:, None] & (n < N)[None, :]
    i_s = tl.where(i < n_rows, i, 0)
    n_s = tl.where(n < N, n, 0)
    ptr = x_ptr + i_s.to(tl.int64)[:, None] * (H * N) + n_s[None, :]
    acc = dec(tl.load(ptr, mask=m, other=0), LPK)
    for _ in range(1, H):
        ptr += N
        acc = acc + dec(tl.load(ptr, mask=m, other=0), LPK)
    tl.store(out_ptr + i_s.to(tl.int64)[:, None] * N + n_s[None, :], enc(acc, LPK), mask=m)


# ------------------------------------------------------------------------------------------------ bwd_dtrap_ddt
@triton.jit
def _dtrap_ddt_kernel(trap_ptr, dt_ptr, dfactor_ptr, dgamma_ptr, ddt_angle_ptr, ddt_core_ptr, ddt_ptr, dtrap_ptr,
                      S, n, BLOCK: tl.constexpr, LPK: tl.constexpr, HELPER_FMA: tl.constexpr):
    """The gradients of γ_t = dt_t·σ(trap_t) and γ'_t = dt_{t+1}·σ(−trap_{t+1}) on [B, H, S] (flattened, n
    elements): ``ddt_core[t] = dγ_t·σ(trap_t) + σ(−trap_t)·dfactor_{t−1}``, ``dTrap[t] = (dγ_t·dt_t + (−dt_t)·
    dfactor_{t−1})·(σ(trap_t)·σ(−trap_t))`` (lp), dγ = dfactor + dγ_diag, the second terms 0 at t = 0; with
    HELPER_FMA each ``a·b + c`` is one ``tl.fma``. Also ``dDT = ddt_core + dDT_angle``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    o = tl.where(m, offs, 0)
    t = o % S
    prev = m & (t > 0)
    trap = dec(tl.load(trap_ptr + o, mask=m, other=0), LPK)
    dt = tl.load(dt_ptr + o, mask=m, other=0.0)
    dfac = tl.load(dfactor_ptr + o, mask=m, other=0.0)
    dgamma = dfac + tl.load(dgamma_ptr + o, mask=m, other=0.0)
    dfac_prev = tl.load(dfactor_ptr + tl.where(prev, o - 1, 0), mask=prev, other=0.0)
    sig = sigmoid(trap)
    sig_neg = sigmoid(-trap)
    rest_dt = tl.where(prev, sig_neg * dfac_prev, 0.0)
    rest_trap = tl.where(prev, -dt * dfac_prev, 0.0)
    if HELPER_FMA:
        ddt = tl.fma(dgamma, sig, rest_dt)
        dtr = tl.fma(dgamma, dt, rest_trap)
    else:
        ddt = dgamma * sig + rest_dt
        dtr = dgamma * dt + rest_trap
    tl.store(ddt_core_ptr + o, ddt, mask=m)
    tl.store(ddt_ptr + o, ddt + tl.load(ddt_angle_ptr + o, mask=m, other=0.0), mask=m)
    tl.store(dtrap_ptr + o, enc(dtr * (sig * sig_neg), LPK), mask=m)


# ------------------------------------------------------------------------------------------------ bwd_dadt_fused
@triton.jit
def _dadt_kernel(dssda_ptr, segsum_ptr, dda_cs_ptr, dda_cs_rev_ptr, da_cs_ptr, da_cs_rev_ptr, dda_ptr, dadt_ptr,
                 S, nc, C: tl.constexpr, RB: tl.constexpr):
    """dADT [B, H, S] of one chunk (program → (b·H + h, chunk c); S % C == 0):

    ``dADT[t] = ddA[t] + ((Σ_{u>=t} e^{da_cs_u}·ddA_cs_u + Σ_{u<t} e^{da_cs_rev_u}·ddA_cs_rev_u) + Σ_{b<t}
    Σ_{a>=t} dSSdA[b, a]·e^{segsum[a, b]})``, in blocks of RB tokens t from the chunk's last block down: the first
    two as masked row sums over the chunk, the third's sum over a >= t as ``tl.cumsum`` over the block's reversed rows
    plus the carried sum of the later blocks (then a masked row sum over b < t, turned back to token order by a
    selection sum that adds −0, exact). RB (a power of 2 dividing C) bounds the tiles to [RB, C] (Ascend's unified
    buffer: ``chain_steps.DADT_ROWS``); it sets the order of the a-sum. FP32, no rounding site.
    """
    pid = tl.program_id(0)
    c = pid % nc
    bh = pid // nc
    base = bh.to(tl.int64) * S + c * C
    blk = pid.to(tl.int64) * (C * C)
    cols = tl.arange(0, C)
    i = tl.arange(0, RB)
    from_cs = tl.exp(tl.load(da_cs_ptr + base + cols)) * tl.load(dda_cs_ptr + base + cols)
    from_rev = tl.exp(tl.load(da_cs_rev_ptr + base + cols)) * tl.load(dda_cs_rev_ptr + base + cols)
    carry = tl.full([C], -0.0, tl.float32)  # Σ over the later blocks' rows a of block[a, b]
    NB: tl.constexpr = C // RB
    for k in tl.static_range(NB):
        a0 = (NB - 1 - k) * RB
        a_rev = a0 + RB - 1 - i  # the block's rows, last first
        # block[a, b] = dSSdA[b, a]·exp(segsum[a, b])
        block = (tl.load(dssda_ptr + blk + cols[None, :] * C + a_rev[:, None])
                 * tl.exp(tl.load(segsum_ptr + blk + a_rev[:, None] * C + cols[None, :])))
        tail = tcumsum(block, 0) + carry[None, :]  # row i: Σ_{a >= a_rev[i]} block[a, b]
        carry = tsum(tl.where((i == RB - 1)[:, None], tail, -0.0), axis=0)
        term_rev = tsum(tl.where(cols[None, :] < a_rev[:, None], tail, 0.0), axis=1)
        t = a0 + i
        term = tsum(tl.where(a_rev[None, :] == t[:, None], term_rev[None, :], -0.0), axis=1)
        later = tsum(tl.where(cols[None, :] >= t[:, None], from_cs[None, :], 0.0), axis=1)
        earlier = tsum(tl.where(cols[None, :] < t[:, None], from_rev[None, :], 0.0), axis=1)
        dda = tl.load(dda_ptr + base + t)
        tl.store(dadt_ptr + base + t, dda + ((later + earlier) + term))


# ------------------------------------------------------------------------------------------------ angle_dt_bwd
@triton.jit
def _angle_grad_tile(dangles_ptr, b, c, h, S, H, A, C: tl.constexpr, AP: tl.constexpr):
    """dangles on the chunk's [C, AP] tile (columns past A: 0), its element offsets, mask and columns."""
    t = c * C + tl.arange(0, C)
    a = tl.arange(0, AP)
    ok = (a < A)[None, :] & (t < S)[:, None]
    offs = ((b.to(tl.int64) * S + t[:, None]) * H + h) * A + tl.where(ok, a[None, :], 0)
    return tl.load(dangles_ptr + offs, mask=ok, other=0.0), offs, ok, a


@triton.jit
def _angle_grad_sum_kernel(dangles_ptr, sums_ptr, B, S, H, A, nc, C: tl.constexpr, AP: tl.constexpr):
    """Each chunk's Σ_t dangles: sums [nc, B, H, A] (program → (b, chunk c, head h)). FP32."""
    pid = tl.program_id(0)
    h = pid % H
    bc = pid // H
    c = bc % nc
    b = bc // nc
    part, _, _, a = _angle_grad_tile(dangles_ptr, b, c, h, S, H, A, C, AP)
    am = a < A
    tl.store(sums_ptr + ((c.to(tl.int64) * B + b) * H + h) * A + tl.where(am, a, 0), tsum(part, axis=0), mask=am)


@triton.jit
def _angle_grad_kernel(dangles_ptr, angles_ptr, dt_ptr, sums_ptr, later_ptr, dangles_out_ptr, ddt_angle_ptr, B, S, H,
                       A, nc, C: tl.constexpr, AP: tl.constexpr, HELPER_FMA: tl.constexpr):
    """dAngles [B, S, H, A] and dDT_angle [B, H, S] of one chunk (program → (b, chunk c, head h)).

    ``grad = ((chunk_sum − tl.cumsum(dangles)) + dangles) + later`` (the reverse cumulative sum over the whole
    sequence; ``later [nc, B, H, A]``: the later chunks' sums, ``ordered_sums`` exclusive reverse scan of
    ``sums``); ``dAngles = ((grad·dt)·π₃₂)·sech²(angle)``, sech² = 1 − tanh² (HELPER_FMA: ``fma(−tanh, tanh, 1)``);
    ``dDT_angle = tl.sum(grad·(tanh·π₃₂))`` over the columns. FP32.
    """
    pid = tl.program_id(0)
    h = pid % H
    bc = pid // H
    c = bc % nc
    b = bc // nc
    part, offs, ok, a = _angle_grad_tile(dangles_ptr, b, c, h, S, H, A, C, AP)
    am = a < A
    col = ((c.to(tl.int64) * B + b) * H + h) * A + tl.where(am, a, 0)
    chunk_sum = tl.load(sums_ptr + col, mask=am, other=0.0)
    later = tl.load(later_ptr + col, mask=am, other=0.0)
    grad = ((chunk_sum[None, :] - tcumsum(part, 0)) + part) + later[None, :]
    th = _tanh(tl.load(angles_ptr + offs, mask=ok, other=0.0))
    if HELPER_FMA:
        sech2 = tl.fma(-th, th, 1.0)
    else:
        sech2 = 1.0 - th * th
    t = c * C + tl.arange(0, C)
    dtv = tl.load(dt_ptr + (b.to(tl.int64) * H + h) * S + t)
    tl.store(dangles_out_ptr + offs, ((grad * dtv[:, None]) * PI_F32) * sech2, mask=ok)
    turned = th * PI_F32
    tl.store(ddt_angle_ptr + (b.to(tl.int64) * H + h) * S + t, tsum(tl.where(ok, grad * turned, 0.0), axis=1))
