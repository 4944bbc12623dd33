"""The operator spec of backward stage 1, ``mamba_mimo_bwd_fwd`` (the tools' view of it: ``mimo_numerics.operator``).

Stages are what the reference records (``record=``), in computation order, every tensor in the math dtype and
trimmed to the S valid tokens; the site in parentheses rounds it (catalog site numbers S… in ``docs/semantics.md``).
"""

from __future__ import annotations

from ...operator import KERNEL_KNOBS, Operator, Stage
from .._common.inputs import inputs_of
from .outputs import INPUT_NAMES, OPTIONAL_INPUTS

_TOK = ("B", "H", "S", "R")

#: The stages of ``record=``, in computation order.
STAGES = (
    Stage("q_biased", _TOK + ("N",), "q̃ = q + b_q (S12)", "qk_biased"),
    Stage("k_biased", _TOK + ("N",), "k̃ = k + b_k (S13)", "qk_biased"),
    Stage("qk_dot", _TOK + ("R",), "q̃·k̃ᵀ as fed to the diagonal (S14)", "qk_dot_internal"),
    Stage("q_rot", _TOK + ("N",), "rotated q̃ (S16)", "rotary"),
    Stage("k_rot", _TOK + ("N",), "rotated k̃ (S17)", "rotary"),
    Stage("gamma", ("B", "H", "S"), "γ = dt·σ(trap) (S9)"),
    Stage("shifted_gamma", ("B", "H", "S"), "dt_{t+1}·σ(−trap_{t+1}) (S6)", "shifted_gamma"),
    Stage("trap_scale", ("B", "H", "S"), "γ + shifted γ (S10)", "trap_scale"),
    Stage("k_scaled", _TOK + ("N",), "k̂ = k_rot·trap_scale (S18)", "k_scaled"),
    Stage("psiv", _TOK + ("P",), "ΨV = v·Ψ (S11)", "psiv"),
    Stage("k_state", _TOK + ("N",), "k̂·exp(da_cs_rev) (S42)", "k_state"),
    Stage("state", ("B", "H", "nc", "N", "P"), "h at the start of each chunk, unrounded (S1, S41)"),
    Stage("state_operand", ("B", "H", "nc", "N", "P"), "h as fed to the inter GEMM (S19)", "state_operand"),
    Stage("inter", _TOK + ("P",), "(q_rot·h)·exp(da_cs) (S19, S23)"),
    Stage("causal_scores", ("B", "H", "nc", "L", "L"), "masked decayed scores fed to the intra GEMM (S22)",
          "causal_scores"),
    Stage("intra", _TOK + ("P",), "scores·ΨV (S24)"),
    Stage("diag_accum", _TOK + ("P",), "rank sum Σ qk·ΨV (S26)", "diag_accum"),
    Stage("diag", _TOK + ("P",), "rank sum · γ (S27)", "diag_gamma"),
    Stage("out", _TOK + ("P",), "o after the D term and its rounding (S30)", "out"),
    Stage("gate", _TOK + ("P",), "SiLU(z·ζ) (S31)", None, ("has_z",)),
    Stage("dphio", _TOK + ("P",), "dΦO (S34–S36)", "dphio", ("has_z",)),
    Stage("dzz", _TOK + ("P",), "dZζ (S37)", None, ("has_z",)),
    Stage("dz_accum", ("B", "H", "S", "P"), "DZ rank sum before the output store (S38)", "dz_accum", ("has_z",)),
)

#: The outputs, in tuple order (``dmimo_o``/``dmimo_z`` per batch, as the kernel writes them).
OUTPUTS = (
    Stage("dmimo_o", ("B", "H", "R", "P"), "gradient of MIMO_O per batch (reduced DOUT only)", None, ("reduce_o",)),
    Stage("states", ("B", "H", "nc", "N", "P"), "the state at the start of every chunk (lp store)",
          "state_operand"),
    Stage("dz", ("B", "S", "H", "P"), "gradient of z (Z only)", "dz_accum", ("has_z",)),
    Stage("dmimo_z", ("B", "H", "R", "P"), "gradient of MIMO_Z per batch (Z only)", None, ("has_z",)),
    Stage("qk_dot", ("B", "H", "S", "R", "R"), "same-step dot products of the biased, unrotated q and k (lp store)"),
)

#: Each input's dimension letters and dtype class (``ops/_common/inputs.py``).
INPUT_SHAPES, LP_INPUTS = inputs_of(INPUT_NAMES)

OPERATOR = Operator(
    name="mamba_mimo_bwd_fwd",
    title="backward stage 1 of the Mamba-3 MIMO op (TileLang mamba_mimo_bwd_fwd)",
    input_names=INPUT_NAMES,
    optional_inputs=OPTIONAL_INPUTS,
    input_shapes=INPUT_SHAPES,
    lp_inputs=LP_INPUTS,
    outputs=OUTPUTS,
    lp_outputs=("states", "dz", "qk_dot"),
    stages=STAGES,
    knob_sites={"diag_mode": ("diag_accum",)},
    knobs=KERNEL_KNOBS + ("reduction_order", "tilelang"),  # its sums over time (dΦ, dζ): upstream's orders on request
    outputs_type="mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs:MimoBwdFwdOutputs",
    upstream="mimo_numerics.ops.mamba_mimo_bwd_fwd.upstream:mamba_mimo_bwd_fwd",
    kernels="mimo_numerics.kernels:mamba_mimo_bwd_fwd",
    docs="docs/semantics.md",
    extra={"nonfinite_rules": "mimo_numerics.ops.mamba_mimo_bwd_fwd.nonfinite_rules"},
)
