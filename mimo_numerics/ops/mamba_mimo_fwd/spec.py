"""Names of ``mamba_mimo_fwd``: inputs in upstream's argument order, the outputs, and the stages ``record=`` fills.

Stage shapes are tuples of dimension letters: B, S, H, N, P, R as in the API, ``nc`` = ceil(S / C), ``L`` = C·R
(the fused rows of a chunk), and ``(R)``, present only without ``mimo_o`` (the unreduced output ``[B, S, R, H, P]``).
"""

from __future__ import annotations

from typing import NamedTuple, Tuple, Union

import torch

from ...operator import Operator, Stage, output_item
from .._common.inputs import inputs_of

#: The 16 tensor arguments of ``mamba_mimo_forward`` (``mamba3_mimo_fwd.py`` L417-427), in call order.
INPUT_NAMES = (
    "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "d", "mimo_z",
    "angles", "da_cs", "da_cs_rev", "dt", "trap", "segsum",
)
#: Arguments that may be None (``z`` and ``mimo_z`` only together).
OPTIONAL_INPUTS = ("mimo_o", "z", "d", "mimo_z")
#: The outputs, in tuple order.
OUTPUT_NAMES = ("o",)


class MimoFwdOutputs(NamedTuple):
    """Outputs of the forward kernel.

    Indexing by position (``out[0]``) and by name (``out["o"]``) both work.

    Attributes:
        o (Tensor): ``[B, S, H, P]`` when ``mimo_o`` is given (reduced), else ``[B, S, R, H, P]``.
    """

    o: torch.Tensor

    def __getitem__(self, key: Union[int, slice, str]):
        return output_item(self, key)

    def as_dict(self) -> dict:
        """The outputs by name."""
        return dict(zip(OUTPUT_NAMES, self))


class MimoFwdStateOutputs(NamedTuple):
    """Outputs of the forward kernel with ``return_state=True`` (upstream's ``(o, h, k_final)``).

    Attributes:
        o (Tensor): as :class:`MimoFwdOutputs`.
        final_state (Tensor): ``[B, H, N, P]`` the state after the last chunk (upstream's ``FINAL_STATE``, fp32).
        final_k (Tensor): ``[B, R, H, N]`` the last token's biased, rotated k (upstream's ``FINAL_K``, lp).
    """

    o: torch.Tensor
    final_state: torch.Tensor
    final_k: torch.Tensor

    def __getitem__(self, key: Union[int, slice, str]):
        if isinstance(key, str):
            return self._asdict()[key]
        return tuple.__getitem__(self, key)

    def as_dict(self) -> dict:
        """The outputs by name."""
        return self._asdict()


#: The old name of :class:`MimoFwdOutputs` (kept for users; the three kernels' outputs are Mimo<kernel>Outputs).
MambaMimoFwdOutputs = MimoFwdOutputs

_TOKEN_RANK = ("B", "H", "S", "R")
#: The stages in the order the reference computes them: kernel order, except that the state recurrence comes before
#: the chunk outputs (the reference runs it over all chunks first). Every tensor is in the math dtype, S tokens.
STAGES: Tuple[Stage, ...] = (
    Stage("gamma", ("B", "H", "S"), "γ = dt'·σ(trap), never rounded (dt_input)"),
    Stage("shifted_gamma", ("B", "H", "S"), "dt'_{t+1}·σ(−trap_{t+1}), 0 at t = S−1 (shifted_gamma)",
          site="shifted_gamma"),
    Stage("trap_scale", ("B", "H", "S"), "γ + shifted γ (trap_scale)", site="trap_scale"),
    Stage("psiv", _TOKEN_RANK + ("P",), "ΨV = v·Ψ' (psi_weight, psiv)", site="psiv"),
    Stage("q_biased", _TOKEN_RANK + ("N",), "q̃ = q + b_q (qk_bias, qk_biased)", site="qk_biased"),
    Stage("k_biased", _TOKEN_RANK + ("N",), "k̃ = k + b_k (qk_bias, qk_biased)", site="qk_biased"),
    Stage("qk_dot", _TOKEN_RANK + ("R",), "q̃·k̃ᵀ per token as fed to the diagonal (qk_dot)", site="qk_dot"),
    Stage("q_rot", _TOKEN_RANK + ("N",), "rotated q̃ (rotary)", site="rotary"),
    Stage("k_rot", _TOKEN_RANK + ("N",), "rotated k̃ (rotary)", site="rotary"),
    Stage("k_scaled", _TOKEN_RANK + ("N",), "k̂ = k_rot·trap_scale (k_scaled)", site="k_scaled"),
    Stage("k_state", _TOKEN_RANK + ("N",), "k̂·exp(da_cs_rev) (k_state)", site="k_state"),
    Stage("state", ("B", "H", "nc", "N", "P"), "h at the start of each chunk, fp32-level, unrounded"),
    Stage("state_operand", ("B", "H", "nc", "N", "P"), "h as fed to the inter GEMM (state_operand)",
          site="state_operand"),
    Stage("inter", _TOKEN_RANK + ("P",), "(q_rot·h')·exp(da_cs)"),
    Stage("causal_scores", ("B", "H", "nc", "L", "L"), "masked decayed scores fed to the intra GEMM (causal_scores)",
          site="causal_scores"),
    Stage("intra", _TOKEN_RANK + ("P",), "scores·ΨV"),
    Stage("diag_accum", _TOKEN_RANK + ("P",), "rank sum Σ qk_dot·ΨV (diag_accum, diag_mode)", site="diag_accum"),
    Stage("diag", _TOKEN_RANK + ("P",), "rank sum · γ (diag_gamma)", site="diag_gamma"),
    Stage("d_term", _TOKEN_RANK + ("P",), "diag + D·ΨV (d_term)", site="d_term", needs=("has_d",)),
    Stage("out", _TOKEN_RANK + ("P",), "o = inter + intra + diagonal term, before the gate and projection"),
    Stage("gate", _TOKEN_RANK + ("P",), "z_exp = SiLU(z·ζ) (gate, silu_form)", site="gate", needs=("has_z",)),
    Stage("phi_gate", _TOKEN_RANK + ("P",), "Φ'·z_exp (phi_weight, phi_gate)", site="phi_gate",
          needs=("reduce_o", "has_z")),
    Stage("o_rank", _TOKEN_RANK + ("P",), "o·Φ'(·z_exp) per rank (out_proj)", site="out_proj", needs=("reduce_o",)),
    Stage("o_sum", ("B", "H", "S", "P"), "rank sum of o_rank before the output store (out_accum)", site="out_accum",
          needs=("reduce_o",)),
    Stage("o", ("B", "S", "(R)", "H", "P"), "the output as stored (rounded when round_outputs)"),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)


def stages_for(dims) -> Tuple[Stage, ...]:
    """The stages a call with these ``Dims`` records (those whose ``needs`` flags are all true)."""
    return tuple(s for s in STAGES if all(getattr(dims, flag) for flag in s.needs))


def stage_shape(stage: Union[Stage, str], dims) -> Tuple[int, ...]:
    """The shape of a recorded stage for the sizes in ``dims`` (a ``Dims``)."""
    if isinstance(stage, str):
        stage = _BY_NAME[stage]
    sizes = {"B": dims.batch, "S": dims.seqlen, "H": dims.heads, "N": dims.state_dim, "P": dims.value_dim,
             "R": dims.rank, "nc": dims.nchunks, "L": dims.chunk_size * dims.rank}
    size_of = lambda letter: None if letter == "(R)" and dims.reduce_o else sizes[letter.strip("()")]  # noqa: E731
    shape = tuple(size_of(letter) for letter in stage.shape)
    return tuple(size for size in shape if size is not None)


_BY_NAME = {stage.name: stage for stage in STAGES}


#: The output, with its shape (``(R)``: present without ``mimo_o``).
OUTPUTS = (Stage("o", ("B", "S", "(R)", "H", "P"), "the forward output (lp store)", "out_accum"),)

#: Each input's dimension letters and dtype class (``ops/_common/inputs.py``).
INPUT_SHAPES, LP_INPUTS = inputs_of(INPUT_NAMES)

OPERATOR = Operator(
    name="mamba_mimo_fwd",
    title="forward kernel of the Mamba-3 MIMO op (TileLang mamba_mimo_fwd)",
    input_names=INPUT_NAMES,
    optional_inputs=OPTIONAL_INPUTS,
    input_shapes=INPUT_SHAPES,
    lp_inputs=LP_INPUTS,
    outputs=OUTPUTS,
    lp_outputs=("o",),
    stages=STAGES,
    knob_sites={"diag_mode": ("diag_accum",)},
    outputs_type="mimo_numerics.ops.mamba_mimo_fwd.spec:MimoFwdOutputs",
    upstream="mimo_numerics.ops.mamba3_mimo.upstream:run_forward",
    kernels="mimo_numerics.kernels:mamba_mimo_fwd",
    docs="docs/forward.md",
)
