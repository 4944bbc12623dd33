"""Launcher of the Triton ``mamba_mimo_bwd_fwd`` kernels: checks, launch configuration, buffers, launches.

``mamba_mimo_bwd_fwd(*tensors, chunk_size, rotary_dim_divisor, policy)`` takes the 17 tensors of the reference in
the same order and returns the same ``MimoBwdFwdOutputs`` (dtypes, shapes, None for absent branches) after the
same validation (``mimo_numerics.validation.validate_inputs``). CPU tensors run in Triton's interpreter, CUDA
tensors compiled, NPU tensors through triton-ascend (``_backend.py``). Every constexpr, grid and launch option comes
from one frozen ``LaunchConfig`` built from ``(policy, backend, tuning)`` and the call's sizes (``_config.py``);
this module allocates the buffers and binds the arguments. Kernel design: ``_mimo_kernels.py``.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import MimoBwdFwdOutputs
from mimo_numerics.validation import Dims
from mimo_numerics.ops.mamba_mimo_bwd_fwd.validation import validate_inputs

from ._launch import (  # noqa: F401  (re-exported: the launcher's public names)
    INTERPRETER_LIMIT_S,
    MAX_FUSED_ROWS,
    SUPPORTED_DIMS,
    ChunkBuffers,
    Launch,
    Prepared,
    SlowInterpreterError,
    build_chunk_launches,
    estimate_interpreter_seconds,
    fill_common_record,
    record_slot,
    require_triton,
    triton_available,
)
from ._config import (  # noqa: F401  (re-exported: the launcher's public names)
    KERNEL_FUNCTIONS,
    OPERATOR_NAME,
    TUNING_KEYS,
    BackendSwitches,
    KernelConfig,
    LaunchConfig,
    Plan,
    UnsupportedPolicyError,
    check_tuning,
    launch_config,
    plan,
    policy_constexprs,
)

def mamba_mimo_bwd_fwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90", *,
    record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False, allow_slow_interpreter: bool = False,
    tuning: Optional[Mapping[str, int]] = None,
) -> MimoBwdFwdOutputs:
    """Stage 1 of the Mamba-3 MIMO backward pass in Triton, rounded as ``policy`` says.

    Args:
        dout … segsum (Tensor | None): the 17 tensors of ``mimo_numerics.reference.mamba_mimo_bwd_fwd``, same
            order, shapes and dtypes (see ``docs/semantics.md``). All on one device: ``cpu`` (Triton interpreter),
            ``cuda`` or ``npu``.
        chunk_size (int): C. rotary_dim_divisor (int): 2 or 4.
        policy (RoundingPolicy | str): a policy or preset name; lp inputs must have its ``lp_dtype``.
        record (dict, optional): filled with per-stage tensors under the reference's stage names (FP32, trimmed
            to the S valid tokens): every stage of the reference's docstring table (q_biased, k_biased,
            qk_dot, q_rot, k_rot, gamma, shifted_gamma, trap_scale, k_scaled, psiv, k_state, state,
            state_operand, inter, causal_scores, intra, diag_accum, diag, out; with Z also gate, dphio, dzz,
            dz_accum). Costs extra memory and bandwidth; for drift studies.
        poison (bool): fill outputs and every intermediate buffer with NaN before launching (a test hook: an
            element the kernels fail to write shows up as NaN).
        allow_slow_interpreter (bool): run on CPU even when the estimated interpreter time exceeds
            ``INTERPRETER_LIMIT_S``.
        tuning (Mapping[str, int], optional): overrides of tiles, warps, stages, register caps and the
            bit-identical code forms of this call, for benchmarks and tests (keys: ``TUNING_KEYS``; see
            ``_config.py``). None of them changes a rounding site; tiles change FP32 summation orders inside
            GEMMs and of the dmimo sums at most.

    Returns:
        MimoBwdFwdOutputs: ``dmimo_o``, ``dmimo_z`` ``[B, H, R, P]`` float32; ``states`` ``[B, H, nc, N, P]``,
        ``dz`` ``[B, S, H, P]``, ``qk_dot`` ``[B, H, S, R, R]`` in lp; None where a branch is off.

    Raises:
        ImportError: when ``triton`` is not installed. UnsupportedPolicyError: see ``policy_constexprs``.
        TypeError, ValueError: bad inputs (the reference's validation), unsupported sizes (N, P not in
            {16, 32, 64, 128}, C·R > 128) or devices, bad ``tuning`` (``check_tuning``: unknown keys are named).
        SlowInterpreterError: see ``allow_slow_interpreter``. RuntimeError: device tensors while
            ``TRITON_INTERPRET=1`` made every kernel interpreted (the kernels pick the interpreter themselves, for
            CPU tensors only).
    """
    prep = build_launches(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                          trap, d, segsum, chunk_size, rotary_dim_divisor, policy, record=record, poison=poison,
                          allow_slow_interpreter=allow_slow_interpreter, tuning=tuning)
    return prep.run()


def build_launches(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90", *,
    record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False, allow_slow_interpreter: bool = False,
    tuning: Optional[Mapping[str, int]] = None, backend: Optional[str] = None, sm_count: Optional[int] = None,
) -> Prepared:
    """Validate, allocate and describe the launches of ``mamba_mimo_bwd_fwd`` without running them.

    ``backend`` (default: from the tensors' device) and ``sm_count`` let tools plan a device launch from CPU
    tensors, e.g. to compile the kernels for sm_90 without a GPU (``tests/ops/mamba_mimo_bwd_fwd/test_kernels.py``) or for Ascend (the
    Ascend compile gate). The returned ``Prepared.config`` is the call's ``LaunchConfig``.
    """
    require_triton()
    policy = _presets.resolve(policy)
    policy_constexprs(policy)  # an unexpressible policy is refused before the inputs are looked at
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev,
                           dt, trap, d, segsum, chunk_size, rotary_dim_divisor, lp_dtype=policy.lp_torch_dtype)
    tensors = dict(dout=dout, q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v, mimo_o=mimo_o, z=z,
                   mimo_z=mimo_z, angles=angles, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt, trap=trap, d=d,
                   segsum=segsum)
    keep = record is not None
    cfg, mod, launches, buf = build_chunk_launches(
        OPERATOR_NAME, tensors, dims, policy, record=keep, poison=poison,
        allow_slow_interpreter=allow_slow_interpreter, tuning=tuning, backend=backend, sm_count=sm_count)

    def finish():
        if keep:
            _fill_record(record, buf, cfg.constexprs, dims, mod)

    outputs = MimoBwdFwdOutputs(dmimo_o=buf.dmimo_o, states=buf.states, dz=buf.dz, dmimo_z=buf.dmimo_z,
                                qk_dot=buf.qk_dot)
    return Prepared(launches, outputs, cfg, finish)


def _fill_record(record, buf: ChunkBuffers, cx, dims: Dims, mod) -> None:
    """Stage 1's stages (the reference's docstring table) from the record slots."""
    fill_common_record(record, buf, cx, dims, mod)
    if dims.has_z:
        P = dims.value_dim
        record["dphio"] = record_slot(buf, mod.SLOT_DPHIO, P)
        record["dzz"] = record_slot(buf, mod.SLOT_DZZ, P)
        record["dz_accum"] = record_slot(buf, mod.SLOT_DZ_ACCUM, P)[..., 0, :]
