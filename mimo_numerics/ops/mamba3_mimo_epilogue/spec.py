"""Names of the FP32 chain after stage 2 (``mamba_mimo_bwd_combined`` after its second kernel, then
``_Mamba3Function.backward``): its inputs in call order and its outputs.

Inputs: the raw outputs of stage 2 (``mamba_mimo_bwd_bwd``, golden ``bwd_bwd`` names), the three stage-1 outputs
that pass through (golden ``bwd_fwd`` names), three raw inputs of the op and upstream's preprocessing (golden
``pre`` names). Outputs: the 14 input gradients of ``mamba3_mimo`` (golden ``autograd`` names, in the order
``_Mamba3Function.backward`` returns them) plus the two intermediates of the golden ``post`` entries that are not
gradients (``ddt_core``, ``dDT_angle``).
"""

from __future__ import annotations

#: Tensor arguments, in call order.
INPUT_NAMES = (
    # stage 2 (mamba_mimo_bwd_bwd), per head / per batch as the kernel writes them
    "dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA", "ddA_cs_rev", "ddA_cs",
    # stage 1 (mamba_mimo_bwd_fwd), per batch
    "dmimo_o", "dz", "dmimo_z",
    # raw inputs of mamba3_mimo
    "trap", "dt", "angles",
    # preprocessing (compute_dacs_segsum_triton)
    "da_cs", "da_cs_rev", "segsum",
)
#: Arguments that may be None (the D, reduced-output and Z branches).
OPTIONAL_INPUTS = ("dD", "dmimo_o", "dz", "dmimo_z")
#: Gradients of the op's inputs, in ``_Mamba3Function.backward``'s order (golden ``autograd`` names).
GRAD_NAMES = ("dQ", "dK", "dV", "dADT", "dDT", "dTrap", "dQ_bias", "dK_bias", "dMIMO_V", "dMIMO_Z", "dMIMO_Out",
              "dAngles", "dD", "dZ")
#: Every output key: the gradients, then the intermediates.
OUTPUT_NAMES = GRAD_NAMES + ("ddt_core", "dDT_angle")
#: Golden ``post`` entry -> output key.
POST_NAMES = {"ddt_core": "ddt_core", "dtrap": "dTrap", "dADT": "dADT", "dAngles": "dAngles",
              "dDT_angle": "dDT_angle", "dDT": "dDT"}
