"""Rounding sites of ``mamba_mimo_bwd_fwd`` (stage 1), each one switch ``policy.mamba_mimo_bwd_fwd.<site>``.

Names and site numbers (S…) are those of the project's catalogue of upstream's rounding sites (§3.1; a
background note not in this repository, written out in ``docs/semantics.md``); each site,
when on, rounds one quantity to the low-precision dtype (round to nearest even) where the upstream kernel does. The
math is in ``docs/semantics.md``.
"""

#: Site -> what it rounds, in kernel order.
SITES = {
    "psi_weight": "S3: round Ψ (MIMO_V) before forming ΨV",
    "qk_bias": "S4: round q_bias and k_bias before the add",
    "phi_weight": "S34 operand: round Φ (MIMO_O) in dΦO (reduced DOUT with Z)",
    "dt_input": "S5, S8: round DT (dt_t and dt_{t+1})",
    "qk_biased": "S12, S13: round q + b_q and k + b_k",
    "psiv": "S11: round v·Ψ",
    "shifted_gamma": "S6: round dt_{t+1}·σ(−trap_{t+1})",
    "trap_scale": "S10: round γ + shifted γ",
    "qk_dot_internal": "S14: round q̃·k̃ᵀ before it feeds the diagonal term",
    "rotary": "S16, S17: round the rotated q and k halves",
    "k_scaled": "S18: round k_rot·trap_scale",
    "state_operand": "S19: round h before the inter-chunk GEMM",
    "causal_scores": "S22: round the masked, decayed scores before the intra GEMM",
    "diag_accum": "S26: carry the diagonal rank sum in lp, rounding at each rank step (see diag_mode)",
    "diag_gamma": "S27: round diag·γ",
    "out": "S30: round o before the gate and projections",
    "dphio": "S34, S35, S36: round dout·Φ and (·)·out, or DOUT_r·out",
    "dz_accum": "S38: carry the DZ rank sum in lp, rounding at each step",
    "k_state": "S42: round k̂·exp(da_cs_rev) before the state GEMM",
}

#: The sites of each preset ("all" on, "none" on, or a dict); a preset not listed defines no semantics here.
PRESET_SITES = {
    "fp64": "none",
    "fp32": "none",
    "seed_bf16": "all",
    "upstream_sm80": "all",
    "upstream_sm90": "all",
    "upstream_sm90_fp16": "all",
    "upstream_sm90_exact": "all",
    "upstream_sm90_exact_fp16": "all",
    "upstream_sm80_fp16": "all",
}

#: Evidence for each preset on this operator (the catalog's sections, the golden tests).
PRESET_EVIDENCE = {
    "fp64": "definition; tests/ops/mamba_mimo_bwd_fwd/test_reference.py checks it against the independent oracle",
    "fp32": "catalog §2.1 column 'Seed FP32 ref'",
    "seed_bf16": "the seed PR's BF16 reference: catalog §2.1 (site by site), D1 and D4",
    "upstream_sm80": "catalog §1.5 (SASS for sm_86); not run on such a GPU",
    "upstream_sm90": "catalog §1.5 (SASS for sm_90a), §2.2 D1; tests/ops/mamba_mimo_bwd_fwd/test_golden.py against the H200 outputs",
    "upstream_sm90_fp16": "catalog §1.5 (SASS for sm_86 and sm_90a); tests/ops/mamba_mimo_bwd_fwd/test_golden_realistic.py (H200 fp16 case)",
    "upstream_sm90_exact": "upstream_sm90's sites with every FP32-level model on: the realistic H200 cases 1000x closer than fp32 (geo-mean ratio 0.001), qk_dot bit-identical (tests/ops/mamba3_mimo/test_fp32_level_golden.py, reports/fp32_level_golden.md)",
    "upstream_sm90_exact_fp16": "upstream_sm90_fp16's sites with every FP32-level model on: the whole op's fp16 golden cases (S = 64, 2048, 8192) within 6.6e-6, 2.4e-5 and 8.5e-5 of the H200 in their worst output (reports/fp32_level_whole_op.md)",
    "upstream_sm80_fp16": "catalog §1.5; no GPU run",
}
