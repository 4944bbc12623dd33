"""Rounding sites of the forward kernel ``mamba_mimo_fwd``: one policy switch ``policy.mamba_mimo_fwd.<site>`` each.

Line numbers are those of ``mamba_ssm/ops/tilelang/mamba3/mamba3_mimo_fwd.py`` in the mamba-ssm 2.3.2.post1 sdist,
read with TileLang 0.1.8's code generation rules (sm_90a): an op between two lp values is a native lp op with one
round-to-nearest-even; an lp value meeting an fp32 one is promoted, the op is fp32; a store into an lp buffer
(fragment or shared) is ``cvt.rn``. Every site below is such an lp store or native lp op; fp32-only work (the GEMM
accumulators, ``exp``, ``sigmoid``, ``tanh``, γ, the inter term) is not a site.

Not sites: the output store ``O`` (L363, L384; rounded when ``policy.round_outputs`` is true, as every operator's
output stores are), ``TRAP`` (lp input, loaded into fp32 fragments: exact), ``MIMO_Z`` and ``D`` (read as fp32,
never rounded in the forward), the copies of lp fragments into lp shared memory (exact).

Grouping follows stage 1's sites (``mimo_numerics/ops/mamba_mimo_bwd_fwd/sites.py``): one switch for both biases, one for both
reads of ``DT``, one for the q and k rotations, one for q + b_q and k + b_k.
"""

from __future__ import annotations

from typing import Dict

#: Site name -> where upstream rounds and what, in kernel (line) order.
SITES: Dict[str, str] = {
    "phi_weight": "L161-163: round Φ (MIMO_O, fp32) into the lp fragment phi_frag_intrachunk (reduced output only)",
    "psi_weight": "L164-165: round Ψ (MIMO_V, fp32) into the lp fragment Psi_frag",
    "qk_bias": "L125-126, L167-168: round Q_BIAS and K_BIAS (fp32) into lp fragments",
    "dt_input": "L177-178, L189-190: round DT (fp32) into lp fragments, dt_{t+1} and dt_t",
    "shifted_gamma": "L179-183: round dt'_{t+1}·σ(−trap_{t+1}) (fp32, 0 at t ≥ S−1) into an lp fragment",
    "trap_scale": "L194-196: round γ + shifted γ (fp32) into an lp fragment",
    "psiv": "L201-205: ΨV = v·Ψ', an lp multiply (lp v_shared times lp Psi_frag)",
    "qk_biased": "L211-212, L217-218: q + b_q and k + b_k, lp adds (lp fragments)",
    "qk_dot": "L223-225: round the fp32 GEMM q̃·k̃ᵀ into lp shared qk_dot_full_shared (feeds the diagonal only)",
    "rotary": "L255-257, L271-273: round cos·x₁ − sin·x₂ and sin·x₁ + cos·x₂ (fp32) into lp q_shared and "
              "k_shared",
    "state_operand": "L260: round the fp32 state h into lp shared states_accum_cast_shared before GEMM(q_rot, h)",
    "k_scaled": "L281-285: k_rot·trap_scale, an lp multiply (lp k fragment times lp trap_scale_shared)",
    "causal_scores": "L293-300: round the masked scores·exp(segsum) (fp32) into an lp fragment",
    "diag_accum": "L319-323: Σ_{r_in} qk_dot·ΨV carried in an lp fragment from 0, one lp mul+add per rank step "
                  "(fused into one HFMA2 rounding on sm_90 bf16 and for fp16: policy.diag_mode)",
    "diag_gamma": "L324: round diag·γ (lp times fp32: fp32 multiply) back into the lp fragment",
    "d_term": "L326-333: round diag + D·ΨV (fp32: D and ΨV promoted) back into the lp fragment (D only)",
    "gate": "L343-347, L368-372: round z_exp = g·tanh(g) + g, g = z·MIMO_Z·0.5 (fp32), into an lp fragment (Z)",
    "phi_gate": "L352: Φ'·z_exp, an lp multiply, before o (fp32) is multiplied by it (reduced output with Z)",
    "out_proj": "L349-357: round o·Φ' or o·(Φ'·z_exp) (fp32) into lp shared, per rank (reduced output)",
    "out_accum": "L358-362: Σ_r carried in an lp fragment from 0, one lp add per rank step (reduced output)",
    "k_state": "L391-394: round k̂·exp(da_cs_rev) (lp times fp32: fp32 multiply) into an lp fragment",
}

#: The sites of each preset on the forward. ``seed_bf16`` is the seed PR's stage-1 reference and defines nothing here.
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

#: Evidence for each preset on the forward.
PRESET_EVIDENCE = {
    "fp64": "definition; tests/ops/mamba_mimo_fwd/test_fwd_reference.py checks it against the independent FP64 oracle",
    "fp32": "definition: FP32 math, only the output store rounded",
    "upstream_sm80": "the sites of the source with unfused bf16 mul+add pairs (two roundings in the diagonal); "
                     "unverified on a GPU (no sm_80 run, no sm_80 SASS read)",
    "upstream_sm90": "the sites read from mamba3_mimo_fwd.py (docs/forward.md); tests/ops/mamba_mimo_fwd/test_fwd_reference.py against "
                     "the H200 golden fwd.o: <= 4.0e-4 rel RMS, >= 15x closer than fp32",
    "upstream_sm90_fp16": "the same sites in fp16; tests/ops/mamba_mimo_fwd/test_fwd_reference.py against the H200 fp16 golden case",
    "upstream_sm90_exact": "upstream_sm90's sites with every FP32-level model on: every o of the 11 golden whole-op cases bit-identical to the H200 from upstream's recorded inputs (tests/ops/mamba3_mimo/test_fp32_level_golden.py, reports/fp32_level_golden.md)",
    "upstream_sm90_exact_fp16": "upstream_sm90_fp16's sites with every FP32-level model on: the whole op's fp16 golden cases (S = 64, 2048, 8192) within 6.6e-6, 2.4e-5 and 8.5e-5 of the H200 in their worst output (reports/fp32_level_whole_op.md)",
    "upstream_sm80_fp16": "fp16 mul+add pairs are fused on sm_80 too; no sm_80 run",
}
