"""The rounding sites of ``mamba_mimo_bwd_bwd`` (backward stage 2), in kernel order.

Every entry is a place where the upstream TileLang kernel rounds a value to the low-precision dtype ``lp`` (bf16 or
fp16). Each becomes one boolean policy switch ``policy.mamba_mimo_bwd_bwd.<site>``; the policy reference rounds
there when the switch is on and keeps the math dtype otherwise. Line numbers (Lnnn) are those of
``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_bwd.py`` in the ``mamba-ssm==2.3.2.post1`` sdist.

How the table was read (every row checked against the source, with TileLang 0.1.8's typing rules): an lp ⊗ lp
operation is a native lp operation rounded once (RN); lp ⊗ fp32 promotes to fp32; Python constants are fp32; a store
into an lp buffer or fragment is ``cvt.rn``; GEMM operands are lp with fp32 accumulators (nine ``wgmma`` GEMMs and
the ``mma.sync`` dstates update). Every row of the starting table of ``upstream_full_op.md`` ("Backward stage 2")
agrees with the source; it is coarser than this table (several roundings per row) and leaves two facts implicit:
DDA_CS_REV reads the trap-scaled k̂ (L934), and the two lp multiplies of the diagonal term (L870) round separately.

Not sites (no lp rounding): γ in the dq/dk diagonal (fp32, L922-925), the D term of dΨV (L854, fp32), every
reduction to DDA, DDA_CS, DDA_CS_REV, DFACTOR, DGAMMA_DIAG, DANGLES, DSSDA (fp32 sums of lp or fp32 values), dΨ
(L888, fp32), dD's reduce (fp32, a 256-thread all-reduce per chunk). The output stores of DQ (L1131) and DK (L1090)
are lp by contract and follow ``policy.round_outputs``; DV (L880) is the lp rank-sum fragment itself (``dv_accum``
off: the fp32 rank sum is rounded once by that store, under ``round_outputs``).

One lp mul+add pair exists in stage 2: the DV rank sum (``dv_accum``, L879: ``dv += dΨV·Ψ``, both lp). ptxas may
contract it into one ``HFMA2.BF16`` on sm_90 as it does stage 1's diagonal (stage 1's SASS: one rounding per rank
step); for stage 2 no SASS was read here (``upstream_rounding_sites.md`` §5 states the fusion for DV without showing
the instructions), so that assumption is unverified by SASS and the golden tests measure both ``diag_mode`` values:
one rounding per step matches the H200 (``docs/stage2.md``). Every other lp operation of stage 2 is a lone multiply or add (L730, L742, L766, L788, L806, the
two multiplies of L870), or an lp value promoted into an fp32 expression, so nothing else can fuse.
"""

from __future__ import annotations

from typing import Dict

#: Operator name: the policy section ``policy.mamba_mimo_bwd_bwd`` holds one bool per site.
OPERATOR_NAME = "mamba_mimo_bwd_bwd"
#: The old name of :data:`OPERATOR_NAME` (kept for users).
OP_NAME = OPERATOR_NAME

SITES: Dict[str, str] = {
    "phi_weight": "L666-667: round Φ (MIMO_O) to lp (fp32 global -> lp fragment; reduced DOUT only)",
    "psi_weight": "L668-669: round Ψ (MIMO_V) to lp, used by the DV rank sum (L879) and ΨV (L896); dD reads Ψ "
                  "unrounded (L752)",
    "qk_bias": "L678-681: round q_bias and k_bias to lp",
    "dt_input": "L698-702, L711-712: round DT to lp (dt_{t+1} and dt_t)",
    "shifted_gamma": "L703-707: round rnd(dt_{t+1})·σ(−trap_{t+1}) (fp32 product, lp store); 0 for t >= S − 1",
    "trap_scale": "L718-720: round γ + shifted γ (fp32 sum, lp store); γ itself stays fp32 (L713-715)",
    "dphio": "L729-730: round dout·rnd(Φ) (lp × lp, one rounding; reduced DOUT only: DOUT_r is read exactly, L733)",
    "zeta_weight": "L737-738: round ζ (MIMO_Z) to lp (Z only; stage 1 keeps ζ fp32)",
    "z_zeta": "L742: round z·rnd(ζ) (lp × lp); the ·0.5 that follows is an fp32 constant, exact",
    "dphio_gate": "L743: round dΦO·g, g = u·tanh(u) + u, u = rnd(z·ζ)·0.5 in fp32 (lp × fp32 promotes; lp store)",
    "dd_term": "L753-755: round dΦO·(v·Ψ) (Ψ fp32 unrounded, fp32 products, stored into the lp dΦO fragment) "
               "before the fp32 dD reduce (D only)",
    "qk_biased": "L765-766, L787-788: round q + rnd(b_q) and k + rnd(b_k) (lp adds)",
    "rotary": "L778-780, L799-801: round the rotated q and k halves (fp32 cos/sin rotation, lp store)",
    "k_scaled": "L805-806: round k_rot·trap_scale (lp × lp)",
    "lkq": "L822-823: round the GEMM k̂·q_rotᵀ (fp32 accumulator -> lp shared), kept for DSSDA (L956) and, when "
           "R == 1, the operand of the mask (L826)",
    "lkq_masked": "L829-834 (R == 1), L838-845 (R > 1): round (t_i < t_j)·lkq·exp(segsum[t_j, t_i]) before the dΨV "
                  "GEMM (L846); R == 1 multiplies the lp lkq (two roundings with `lkq`), R > 1 the fp32 one (one)",
    "gamma_diag": "L863-864: round γ to lp for the dΨV diagonal term (the dq/dk diagonal keeps fp32 γ, L922-925)",
    "dpsiv_diag_qk": "L870: round dΦO[r_out]·qk_dot[r_out, r_in] (lp × lp)",
    "dpsiv_diag_gamma": "L870: round (dΦO·qk_dot)·rnd(γ) (lp × lp); each term then adds into the fp32 dΨV, "
                        "ascending r_out",
    "dpsiv": "L871: round dΨV (fp32 -> lp shared) before DV and dΨ",
    "dv_accum": "L875-880: carry the DV rank sum Σ_r dΨV·rnd(Ψ) in lp (lp mul+add pair: one rounding per rank step "
                "under diag_mode='fma', assumed fused by ptxas on sm_90 but not verified by SASS; two under "
                "'mul_then_add')",
    "psiv": "L894-896: round v·rnd(Ψ) (fp32 product added to a cleared lp fragment: one rounding)",
    "dssda_term": "L955-958: round rnd(lkq)·dk_intra (lp × fp32 promotes, lp store) before the two fp32 reduces to "
                  "DSSDA",
    "dkq_masked": "L967-976: round (t_i < t_j)·dk_intra·exp(segsum[t_j, t_i]) (fp32 -> lp shared) before the dk "
                  "(L980) and dq (L1050) GEMMs",
    "dk_inter": "L944-949, L977: round dk_inter·exp(da_cs_rev) (fp32 -> lp shared) before it initialises the "
                "accumulating dk GEMM (L979-980)",
    "dk_scaled": "L991-995: round dk·trap_scale (fp32 × lp promotes, lp store)",
    "dq_inter": "L1042-1047: round dq_inter·exp(da_cs) (fp32 -> lp shared) before it initialises the accumulating "
                "dq GEMM (L1049-1050)",
    "dq_combined": "L1051: round dq_inter + dkqᵀ·k̂ (fp32 accumulator -> lp shared)",
    "dk_unrotate": "L1073-1075: round the inverse-rotated dk halves (fp32, lp store)",
    "dq_unrotate": "L1119-1121: round the inverse-rotated dq halves (fp32, lp store)",
    "dphio_scaled": "L1141-1147: round dΦO·exp(da_cs) (lp × fp32 promotes, lp store) before the dstates GEMM",
    "dstates_operand": "L1149: round the fp32 dstates to lp shared memory, the operand of the next chunk's GEMMs "
                       "(L811, L930)",
}

#: The sites of each preset on stage 2. ``seed_bf16`` is the seed PR's stage-1 reference and defines nothing here.
PRESET_SITES = {
    "fp64": "none",
    "fp32": "none",
    "upstream_sm80": "all",
    "upstream_sm90": "all",
    "upstream_sm90_fp16": "all",
    "upstream_sm90_exact": "all",
    "upstream_sm90_exact_fp16": "all",
    "upstream_sm80_fp16": "all",
}

#: Evidence for each preset on stage 2.
PRESET_EVIDENCE = {
    "fp64": "definition; tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py checks it against the independent FP64 oracle",
    "fp32": "definition: FP32 math, only the output stores rounded",
    "upstream_sm80": "the sites of the source with the DV rank sum unfused (two roundings); unverified on a GPU",
    "upstream_sm90": "the sites read from mamba3_mimo_bwd.py (docs/stage2.md); tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py "
                     "against the H200 golden bwd_bwd: dq, dk, dv, dmimo_v <= 8.8e-4 rel RMS, every raw output "
                     ">= 6.9x closer than fp32; the fused DV sum is supported by the data (mul_then_add >= 8.4x "
                     "further)",
    "upstream_sm90_fp16": "the same sites in fp16; tests against the H200 fp16 golden case",
    "upstream_sm90_exact": "upstream_sm90's sites with every FP32-level model on: dv and dangles bit-identical to the H200 from upstream's recorded inputs on every golden whole-op case, the other outputs 500x closer than fp32 (geo-mean ratio 0.002; tests/ops/mamba3_mimo/test_fp32_level_golden.py, reports/fp32_level_golden.md)",
    "upstream_sm90_exact_fp16": "upstream_sm90_fp16's sites with every FP32-level model on: the whole op's fp16 golden cases (S = 64, 2048, 8192) within 6.6e-6, 2.4e-5 and 8.5e-5 of the H200 in their worst output (reports/fp32_level_whole_op.md)",
    "upstream_sm80_fp16": "fp16 mul+add pairs are fused on sm_80 too; no sm_80 run",
}
