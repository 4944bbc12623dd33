"""Names of ``mamba_mimo_bwd_bwd``: inputs in upstream's argument order, outputs, and the stages ``record=`` fills.

Upstream's kernel ``mamba_mimo_bwd_bwd_kernel`` (``mamba3_mimo_bwd.py`` L536-566) interleaves inputs and outputs;
``INPUT_NAMES`` keeps its order with the outputs left out. ``OUTPUT_NAMES`` are the raw outputs as
``mamba_mimo_bwd_combined`` allocates them (L1270-1281), named as the golden file's ``bwd_bwd`` keys.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

import torch

from ...operator import Operator, Stage, output_item
from .._common.inputs import inputs_of

#: The 19 tensor arguments, in upstream's kernel order (DOUT, Q, K, V, Q_BIAS, K_BIAS, MIMO_V, MIMO_O, STATES, Z,
#: MIMO_Z, ANGLES, DA_CS, DA_CS_REV, DT, TRAP, D, QK_DOT, SEGSUM).
INPUT_NAMES = (
    "dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "states", "z", "mimo_z",
    "angles", "da_cs", "da_cs_rev", "dt", "trap", "d", "qk_dot", "segsum",
)
#: Arguments that may be None (``z`` and ``mimo_z`` only together).
OPTIONAL_INPUTS = ("mimo_o", "z", "mimo_z", "d")

#: The twelve raw outputs, in tuple order.
OUTPUT_NAMES = ("dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA",
                "ddA_cs_rev", "ddA_cs")
#: Outputs stored in lp by upstream (the rest are fp32).
LP_OUTPUTS = ("dq", "dk", "dv")

#: Stages written to ``record`` (name -> shape), in the order the kernel computes them. Every tensor is in the
#: math dtype; per-token stages are trimmed to the S valid tokens, per-chunk ones keep the nc chunks (L = C·R).
STAGES: Dict[str, str] = {
    "gamma": "[B, H, S]",
    "shifted_gamma": "[B, H, S]",
    "trap_scale": "[B, H, S]",
    "gate": "[B, H, S, R, P]",
    "dphio": "[B, H, S, R, P]",
    "dd_terms": "[B, H, S, R, P]",
    "q_biased": "[B, H, S, R, N]",
    "k_biased": "[B, H, S, R, N]",
    "q_rot": "[B, H, S, R, N]",
    "k_rot": "[B, H, S, R, N]",
    "k_scaled": "[B, H, S, R, N]",
    "dphio_scaled": "[B, H, S, R, P]",
    "dstates": "[B, H, nc, N, P]",
    "dstates_operand": "[B, H, nc, N, P]",
    "dpsiv_inter": "[B, H, S, R, P]",
    "lkq": "[B, H, nc, L, L]",
    "lkq_masked": "[B, H, nc, L, L]",
    "dpsiv_accum": "[B, H, S, R, P]",
    "gamma_lp": "[B, H, S]",
    "dpsiv": "[B, H, S, R, P]",
    "dv_accum": "[B, H, S, P]",
    "psiv": "[B, H, S, R, P]",
    "dqk_diag": "[B, H, S, R, R]",
    "dk_inter": "[B, H, S, R, N]",
    "dk_intra_scores": "[B, H, nc, L, L]",
    "dssda_terms": "[B, H, nc, L, L]",
    "dkq_masked": "[B, H, nc, L, L]",
    "dk_nodiag": "[B, H, S, R, N]",
    "dk_rot": "[B, H, S, R, N]",
    "dda_terms": "[B, H, nc, N, P]",
    "dq_inter": "[B, H, S, R, N]",
    "dq_rot": "[B, H, S, R, N]",
    "dangles_terms": "[B, H, S, R, 4, N/d]",
    "dk_unrotated": "[B, H, S, R, N]",
    "dq_unrotated": "[B, H, S, R, N]",
}

#: What each stage holds (site names of ``sites.SITES`` in parentheses).
STAGE_DESCRIPTIONS: Dict[str, str] = {
    "gamma": "γ = rnd(dt)·σ(trap), never rounded",
    "shifted_gamma": "rnd(dt_{t+1})·σ(−trap_{t+1}) (shifted_gamma)",
    "trap_scale": "γ + shifted γ (trap_scale)",
    "gate": "SiLU(rnd(z·ζ)) (Z only)",
    "dphio": "dΦO fed to the GEMMs: dout·Φ (dphio), times the gate with Z (dphio_gate), or DOUT_r",
    "dd_terms": "dΦO·(v·Ψ) summed into dD (dd_term; D only)",
    "q_biased": "q̃ = q + b_q (qk_biased)",
    "k_biased": "k̃ = k + b_k (qk_biased)",
    "q_rot": "rotated q̃ (rotary)",
    "k_rot": "rotated k̃, unscaled (rotary)",
    "k_scaled": "k̂ = k_rot·trap_scale (k_scaled)",
    "dphio_scaled": "dΦO·exp(da_cs), the dstates GEMM operand (dphio_scaled)",
    "dstates": "fp32 dstates while chunk c is processed: the gradient of the state entering chunk c + 1",
    "dstates_operand": "dstates as fed to chunk c's GEMMs (dstates_operand)",
    "dpsiv_inter": "(k̂·dstates)·exp(da_cs_rev)",
    "lkq": "k̂·q_rotᵀ as stored for DSSDA (lkq)",
    "lkq_masked": "reverse-causal lkq·exp(segsum) fed to the dΨV GEMM (lkq_masked)",
    "dpsiv_accum": "dΨV before its rounding: inter + intra + D·dΦO + the diagonal terms",
    "gamma_lp": "γ as used by the dΨV diagonal (gamma_diag)",
    "dpsiv": "dΨV after its rounding (dpsiv)",
    "dv_accum": "DV rank sum Σ_r dΨV·Ψ before the output store (dv_accum)",
    "psiv": "ΨV = v·Ψ (psiv)",
    "dqk_diag": "same-token Σ_p dΦO[r_out]·ΨV[r_in], before ·γ",
    "dk_inter": "(ΨV·dstatesᵀ)·exp(da_cs_rev) (dk_inter)",
    "dk_intra_scores": "ΨV·dΦOᵀ, unmasked",
    "dssda_terms": "lkq·dk_intra_scores summed into DSSDA (dssda_term)",
    "dkq_masked": "reverse-causal dk_intra_scores·exp(segsum) (dkq_masked)",
    "dk_nodiag": "dk_inter + dkq·q_rot, the gradient of k̂",
    "dk_rot": "dk_nodiag·trap_scale, the gradient of k_rot (dk_scaled)",
    "dda_terms": "states·dstates·exp(da_cs[last]) summed into DDA",
    "dq_inter": "(dΦO·statesᵀ)·exp(da_cs) (dq_inter)",
    "dq_rot": "dq_inter + dkqᵀ·k̂, the gradient of q_rot (dq_combined)",
    "dangles_terms": "the four products summed into DANGLES per rank: dk1·∂k1, dk2·∂k2, dq1·∂q1, dq2·∂q2",
    "dk_unrotated": "inverse-rotated dk_rot (dk_unrotate)",
    "dq_unrotated": "inverse-rotated dq_rot (dq_unrotate)",
}


#: The switch of ``sites.SITES`` whose rounding produces each stage (stages left out are computed in the math dtype
#: only). ``dphio`` is rounded by ``dphio`` (dout·Φ) and, with Z, again by ``dphio_gate``: it names the first.
STAGE_SITES: Dict[str, str] = {
    "shifted_gamma": "shifted_gamma", "trap_scale": "trap_scale", "dphio": "dphio", "dd_terms": "dd_term",
    "q_biased": "qk_biased", "k_biased": "qk_biased", "q_rot": "rotary", "k_rot": "rotary", "k_scaled": "k_scaled",
    "dphio_scaled": "dphio_scaled", "dstates_operand": "dstates_operand", "lkq": "lkq", "lkq_masked": "lkq_masked",
    "gamma_lp": "gamma_diag", "dpsiv": "dpsiv", "dv_accum": "dv_accum", "psiv": "psiv", "dk_inter": "dk_inter",
    "dssda_terms": "dssda_term", "dkq_masked": "dkq_masked", "dk_rot": "dk_scaled", "dq_inter": "dq_inter",
    "dq_rot": "dq_combined", "dk_unrotated": "dk_unrotate", "dq_unrotated": "dq_unrotate",
}


class MimoBwdBwdOutputs(NamedTuple):
    """Raw outputs of stage 2, as upstream's kernel writes them (before ``mamba_mimo_bwd_combined``'s sums).

    Index by position (``out[0]``), attribute (``out.dq``) or name (``out["dq"]``).

    Attributes:
        dq, dk (Tensor): ``[B, S, R, H, N]`` lp, per value head (the wrapper sums the heads of a group).
        dv (Tensor): ``[B, S, H, P]`` lp.
        dmimo_v (Tensor): ``[B, H, R, P]`` fp32, per batch.
        dD (Tensor | None): ``[B, H]`` fp32, per batch; None without ``d``.
        dangles (Tensor): ``[B, S, H, N/d]`` fp32, gradient w.r.t. the cumulative angles.
        dfactor, dgamma_diag, ddA, ddA_cs_rev, ddA_cs (Tensor): ``[B, H, S]`` fp32 partial terms.
        dSSdA (Tensor): ``[B, H, nc, C, C]`` fp32, rows indexed by the k token, columns by the q token, unmasked.
    """

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dmimo_v: torch.Tensor
    dD: Optional[torch.Tensor]
    dangles: torch.Tensor
    dfactor: torch.Tensor
    dgamma_diag: torch.Tensor
    ddA: torch.Tensor
    dSSdA: torch.Tensor
    ddA_cs_rev: torch.Tensor
    ddA_cs: torch.Tensor

    def __getitem__(self, key):
        return output_item(self, key)

    def keys(self) -> Tuple[str, ...]:
        """The output names, in tuple order."""
        return self._fields

    def as_dict(self) -> dict:
        """The outputs by name (None where a branch is off)."""
        return dict(zip(self._fields, self))


def _letters(text: str):
    return tuple(part.strip() for part in text.strip("[]").split(","))


#: The stages of ``record=`` as generic stages (shape letters, description), in computation order.
STAGE_LIST = tuple(Stage(name, _letters(shape), STAGE_DESCRIPTIONS[name], STAGE_SITES.get(name))
                   for name, shape in STAGES.items())

#: The raw outputs with their shapes.
OUTPUTS = (
    Stage("dq", ("B", "S", "R", "H", "N"), "gradient of q per value head (lp)"),
    Stage("dk", ("B", "S", "R", "H", "N"), "gradient of k per value head (lp)"),
    Stage("dv", ("B", "S", "H", "P"), "gradient of v (lp)", "dv_accum"),
    Stage("dmimo_v", ("B", "H", "R", "P"), "gradient of MIMO_V per batch"),
    Stage("dD", ("B", "H"), "gradient of D per batch (D only)", needs=("has_d",)),
    Stage("dangles", ("B", "S", "H", "N/d"), "gradient w.r.t. the cumulative angles"),
    Stage("dfactor", ("B", "H", "S"), "partial: w.r.t. the trap scale γ + shifted γ"),
    Stage("dgamma_diag", ("B", "H", "S"), "partial: w.r.t. γ through the same-token term"),
    Stage("ddA", ("B", "H", "S"), "partial: w.r.t. the chunk's total decay"),
    Stage("dSSdA", ("B", "H", "nc", "C", "C"), "partial: w.r.t. exp(segsum), source-major, unmasked"),
    Stage("ddA_cs_rev", ("B", "H", "S"), "partial: w.r.t. exp(da_cs_rev)"),
    Stage("ddA_cs", ("B", "H", "S"), "partial: w.r.t. exp(da_cs)"),
)

#: Each input's dimension letters and dtype class (``ops/_common/inputs.py``).
INPUT_SHAPES, LP_INPUTS = inputs_of(INPUT_NAMES)

OPERATOR = Operator(
    name="mamba_mimo_bwd_bwd",
    title="backward stage 2 of the Mamba-3 MIMO op (TileLang mamba_mimo_bwd_bwd)",
    input_names=INPUT_NAMES,
    optional_inputs=OPTIONAL_INPUTS,
    input_shapes=INPUT_SHAPES,
    lp_inputs=LP_INPUTS,
    outputs=OUTPUTS,
    lp_outputs=LP_OUTPUTS,
    stages=STAGE_LIST,
    knob_sites={"diag_mode": ("dv_accum",)},
    outputs_type="mimo_numerics.ops.mamba_mimo_bwd_bwd.spec:MimoBwdBwdOutputs",
    upstream="mimo_numerics.ops.mamba3_mimo.upstream:run_stage2",
    kernels="mimo_numerics.kernels:mamba_mimo_bwd_bwd",
    docs="docs/stage2.md",
)
