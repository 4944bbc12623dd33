"""PyTorch reference of ``mamba_mimo_bwd_fwd`` parameterised by a ``RoundingPolicy``.

Chunked and vectorised over batch, heads and chunks; only the inter-chunk state recurrence loops in Python. Runs on
any torch device (CPU, CUDA, NPU). Every rounding goes through ``mimo_numerics.rounding``. The math is written out in
``docs/semantics.md``; site numbers below (S…) are those of the upstream catalog.

Two implementations: ``reference_generic.reference_generic`` (every stage a whole tensor; used on every device but
the CPU) and, on CPU tensors, ``reference_cpu.reference_cpu`` (cache-blocked, in place; same bits on the same
machine, see that module and ``CPU_FAST_PATH``); both are built from the pieces the references share
(``ops/_common``). The CUDA-graph replay of the state recurrence is switched in ``ops/_common/recurrence.py``
(``USE_CUDA_GRAPHS``, ``CUDA_GRAPH_MIN_CHUNKS``).

Stage names written to ``record`` (every tensor in the math dtype, trimmed to the S valid tokens):

=================  ====================  ============================================================
name               shape                 quantity
=================  ====================  ============================================================
q_biased           [B, H, S, R, N]       q̃ = q + b_q (S12)
k_biased           [B, H, S, R, N]       k̃ = k + b_k (S13)
qk_dot             [B, H, S, R, R]       q̃·k̃ᵀ as fed to the diagonal (S14)
q_rot, k_rot       [B, H, S, R, N]       rotated q̃, k̃ (S16, S17)
gamma              [B, H, S]             γ = dt·σ(trap) (S9)
shifted_gamma      [B, H, S]             dt_{t+1}·σ(−trap_{t+1}) (S6)
trap_scale         [B, H, S]             γ + shifted γ (S10)
k_scaled           [B, H, S, R, N]       k̂ = k_rot·trap_scale (S18)
psiv               [B, H, S, R, P]       ΨV = v·Ψ (S11)
k_state            [B, H, S, R, N]       k̂·exp(da_cs_rev) (S42)
state              [B, H, nc, N, P]      h at the start of each chunk, unrounded (S1, S41)
state_operand      [B, H, nc, N, P]      h as fed to the inter GEMM (S19)
inter              [B, H, S, R, P]       (q_rot·h)·exp(da_cs) (S19, S23)
causal_scores      [B, H, nc, L, L]      masked decayed scores fed to the intra GEMM, L = C·R (S22)
intra              [B, H, S, R, P]       scores·ΨV (S24)
diag_accum         [B, H, S, R, P]       rank sum Σ qk·ΨV (S26)
diag               [B, H, S, R, P]       rank sum · γ (S27)
out                [B, H, S, R, P]       o after the D term and its rounding (S30)
gate               [B, H, S, R, P]       SiLU(z·ζ) (S31, Z only)
dphio              [B, H, S, R, P]       dΦO (S34–S36, Z only)
dzz                [B, H, S, R, P]       dZζ (S37, Z only)
dz_accum           [B, H, S, P]          DZ rank sum before the output store (S38, Z only)
=================  ====================  ============================================================
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ... import presets as _presets
from .._common.chunked import ieee_fp32_matmul
from .._common.recurrence import STATE_ACCUMULATE_ROWS  # noqa: F401  (the public constant of this reference)
from .outputs import MimoBwdFwdOutputs
from ...policy import RoundingPolicy
from .reference_cpu import reference_cpu
from .reference_generic import OPERATOR_NAME, reference_generic  # noqa: F401  (OPERATOR_NAME: public)
from .validation import validate_inputs


#: On CPU tensors, run ``reference_cpu`` (cache-blocked, in place, same bits as the generic path; see that module).
#: Set to False to run the generic whole-tensor path everywhere (``scripts/check_reference_bits.py --against-generic``
#: compares the two).
CPU_FAST_PATH = True

@torch.no_grad()
def mamba_mimo_bwd_fwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90",
    record: Optional[Dict[str, torch.Tensor]] = None,
) -> MimoBwdFwdOutputs:
    """Stage 1 of the Mamba-3 MIMO backward pass, rounded as ``policy`` says.

    Args:
        dout (Tensor): ``[B, S, H, P]`` when ``mimo_o`` is given, else ``[B, S, R, H, P]``; lp.
        q, k (Tensor): ``[B, S, R, G, N]`` lp. v (Tensor): ``[B, S, H, P]`` lp.
        q_bias, k_bias (Tensor): ``[H, R, N]`` fp32. mimo_v (Tensor): Ψ ``[H, R, P]`` fp32.
        mimo_o (Tensor | None): Φ ``[H, R, P]`` fp32; selects reduced DOUT.
        z (Tensor | None): ``[B, S, H, P]`` lp, with mimo_z (ζ ``[H, R, P]`` fp32).
        angles (Tensor): ``[B, S, H, N/d]`` fp32. da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]`` fp32.
        trap (Tensor): ``[B, H, S]`` lp. d (Tensor | None): ``[H]`` fp32.
        segsum (Tensor): ``[B, H, ceil(S/C), C, C]`` fp32.
        chunk_size (int): C. rotary_dim_divisor (int): d, 2 or 4.
        policy (RoundingPolicy | str): a policy or a preset name; lp inputs must have its ``lp_dtype``.
        record (dict, optional): filled with the per-stage tensors listed in the module docstring.

    Returns:
        MimoBwdFwdOutputs: ``dmimo_o``, ``dmimo_z`` ``[B, H, R, P]`` float32 per batch; ``states``
        ``[B, H, nc, N, P]``, ``dz`` ``[B, S, H, P]``, ``qk_dot`` ``[B, H, S, R, R]`` in lp (in the math dtype,
        unrounded, when ``policy.round_outputs`` is false); None where a branch is off.
    """
    with ieee_fp32_matmul():
        return _reference(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
                          d, segsum, chunk_size, rotary_dim_divisor, _presets.resolve(policy), record)


def _reference(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
               segsum, chunk_size, rotary_dim_divisor, policy: RoundingPolicy, record) -> MimoBwdFwdOutputs:
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev,
                           dt, trap, d, segsum, chunk_size, rotary_dim_divisor, lp_dtype=policy.lp_torch_dtype)
    # contiguous inputs: torch reduces in the order of the operands' strides, so a strided view (e.g. a transposed
    # dout) would change the FP32 sums over t (dmimo_*) by an ulp; with this the bits depend on the values only
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum = (
        None if t is None else t.contiguous() for t in (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z,
                                                         angles, da_cs, da_cs_rev, dt, trap, d, segsum))
    # the CPU path models FP32 GEMMs, torch's time sums, torch's special functions and uncontracted FP32 only: a
    # tensor-core gemm_model, upstream's time order, the MUFU approximations or fp32_fma take the generic path
    if (dims.device.type == "cpu" and CPU_FAST_PATH and policy.gemm_model == "fp32"
            and policy.reduction_order == "pairwise" and policy.special_functions == "accurate"
            and not policy.fp32_fma):
        return reference_cpu(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                             trap, d, segsum, dims, policy, record)
    return reference_generic(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                             trap, d, segsum, dims, policy, record)
