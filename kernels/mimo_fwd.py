"""Launcher of the Triton forward kernel ``mamba_mimo_fwd``: validation, launch configuration, launches.

``mamba_mimo_fwd(*tensors, chunk_size, rotary_dim_divisor, dtype, policy)`` takes the 16 tensors of the forward
reference (``mimo_numerics/ops/mamba_mimo_fwd/reference.py``) in the same order and returns the same
``MimoFwdOutputs`` after the same validation. The forward runs stage 1's kernel families
(``_mimo_kernels.py``): the angles, the prep (k̂, k_state, ΨV, q̃·k̃ᵀ), the sequential state walk and the output
kernel with ``FORWARD`` on, which forms o from the same inter, intra and diagonal terms and applies the forward's own
sites (``d_term``, ``gate``, ``phi_gate``, ``out_proj``, ``out_accum``) instead of stage 1's gradient branches.
The policy reaches the kernels through ``policy_constexprs(policy, "mamba_mimo_fwd")`` (``_config.py``): every site
of ``policy.mamba_mimo_fwd`` is a constexpr.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.ops.mamba_mimo_fwd.spec import MimoFwdOutputs, MimoFwdStateOutputs
from mimo_numerics.ops.mamba_mimo_fwd.validation import check_final_tokens, validate_inputs
from mimo_numerics.validation import Dims

from ._config import policy_constexprs
from ._launch import ChunkBuffers, Prepared, build_chunk_launches, fill_common_record, record_slot, require_triton

#: The policy section that configures the forward kernel.
OPERATOR_NAME = "mamba_mimo_fwd"


def mamba_mimo_fwd(
    q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype: Optional[torch.dtype] = None, *,
    policy="upstream_sm90", record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False,
    allow_slow_interpreter: bool = False, tuning: Optional[Mapping[str, int]] = None, return_state: bool = False,
    final_tokens: Optional[Sequence[int]] = None,
) -> MimoFwdOutputs:
    """The Mamba-3 MIMO forward kernel in Triton, rounded as ``policy.mamba_mimo_fwd`` says.

    Args:
        q … segsum (Tensor | None): the 16 tensors of ``mimo_numerics.ops.mamba_mimo_fwd.reference.mamba_mimo_fwd``,
            same order, shapes and dtypes: q, k ``[B, S, R, G, N]`` lp, v ``[B, S, H, P]`` lp, q_bias, k_bias
            ``[H, R, N]``, mimo_v, mimo_o, mimo_z ``[H, R, P]``, z ``[B, S, H, P]`` lp, d ``[H]``, angles
            ``[B, S, H, N/d]``, da_cs, da_cs_rev, dt ``[B, H, S]`` FP32, trap ``[B, H, S]`` lp, segsum
            ``[B, H, nc, C, C]`` FP32. All on one device: ``cpu`` (Triton interpreter), ``cuda`` or ``npu``.
        chunk_size (int): C. rotary_dim_divisor (int): 2 or 4.
        dtype (torch.dtype | None): upstream's argument; when given, the dtype of the lp inputs.
        policy (RoundingPolicy | str): a policy or preset name with a ``mamba_mimo_fwd`` section.
        record (dict, optional): filled with the forward's stages under the reference's names and shapes (FP32,
            S tokens): the stages of ``spec.stages_for(dims)``, as the reference records them.
        poison (bool): NaN-fill the output and every workspace first (a test hook).
        allow_slow_interpreter (bool): run on CPU even when the estimated interpreter time is long.
        tuning (Mapping[str, int], optional): per-call overrides of tiles, warps and code forms
            (``kernels.TUNING_KEYS``); none changes a rounding site.
        return_state (bool): also upstream's ``FINAL_STATE`` (the state walk's state after the last chunk, FP32,
            stored by the walk kernel with ``FINAL``) and ``FINAL_K`` (the last token's biased, rotated k: a
            ``[B, R, H, N]`` side output computed by the policy reference on that token alone, not by a kernel).
        final_tokens (sequence of int, optional): with ``return_state``, each batch row's token for ``FINAL_K``
            (default the last; zero-padded varlen rows give their last real token).

    Returns:
        MimoFwdOutputs: ``o`` ``[B, S, H, P]`` (reduced) or ``[B, S, R, H, P]``, in lp; with ``return_state``
        ``MimoFwdStateOutputs`` (``o``, ``final_state [B, H, N, P]``, ``final_k [B, R, H, N]``), as the reference.

    Raises:
        ImportError: without ``triton``. UnsupportedPolicyError: a policy the kernels cannot express (names the
        field). PolicyUndefined: a policy without a forward section (``seed_bf16``). TypeError, ValueError: bad
        inputs (the reference's validation) or unsupported sizes. SlowInterpreterError: see
        ``allow_slow_interpreter``.
    """
    prep = build_launches(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt,
                          trap, segsum, chunk_size, rotary_dim_divisor, dtype, policy=policy, record=record,
                          poison=poison, allow_slow_interpreter=allow_slow_interpreter, tuning=tuning,
                          return_state=return_state, final_tokens=final_tokens)
    return prep.run()


def build_launches(
    q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype: Optional[torch.dtype] = None, *,
    policy="upstream_sm90", record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False,
    allow_slow_interpreter: bool = False, tuning: Optional[Mapping[str, int]] = None, backend: Optional[str] = None,
    sm_count: Optional[int] = None, return_state: bool = False, final_tokens: Optional[Sequence[int]] = None,
) -> Prepared:
    """Validate, allocate and describe the forward's launches without running them (``backend``, ``sm_count``:
    plan a device launch from CPU tensors, e.g. for the Ascend compile gate)."""
    require_triton()
    policy = _presets.resolve(policy)
    policy_constexprs(policy, OPERATOR_NAME)  # an unexpressible policy is refused before the inputs are looked at
    dims = validate_inputs(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt,
                           trap, segsum, chunk_size, rotary_dim_divisor, dtype, lp_dtype=policy.lp_torch_dtype)
    tensors = dict(q=q, k=k, v=v, q_bias=q_bias, k_bias=k_bias, mimo_v=mimo_v, mimo_o=mimo_o, z=z, mimo_z=mimo_z,
                   angles=angles, da_cs=da_cs, da_cs_rev=da_cs_rev, dt=dt, trap=trap, d=d, segsum=segsum)
    keep = record is not None
    cfg, mod, launches, buf = build_chunk_launches(
        OPERATOR_NAME, tensors, dims, policy, record=keep, poison=poison,
        allow_slow_interpreter=allow_slow_interpreter, tuning=tuning, backend=backend, sm_count=sm_count,
        final=bool(return_state))

    def finish():
        if keep:
            _fill_record(record, buf, cfg.constexprs, dims, mod)

    if not return_state:
        return Prepared(launches, MimoFwdOutputs(o=buf.o), cfg, finish)
    final_k = _final_k(tensors, dims, policy, final_tokens)
    return Prepared(launches, MimoFwdStateOutputs(o=buf.o, final_state=buf.final, final_k=final_k), cfg, finish)


def _final_k(tensors: Dict[str, Optional[torch.Tensor]], dims: Dims, policy,
             final_tokens: Optional[Sequence[int]]) -> torch.Tensor:
    """``FINAL_K [B, R, H, N]``: the policy reference's biased, rotated k of each row's final token, computed on
    that token alone (its rotation uses torch's cos/sin, not the angles kernel's: an lp bit may differ from what
    the kernels hold, within their lp tolerance)."""
    from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd as reference

    last = check_final_tokens(final_tokens, dims.batch, dims.seqlen)
    rows = torch.arange(dims.batch, device=dims.device)
    index = torch.tensor(last, device=dims.device)

    def token(x, axis):  # the final token of each row, kept as a length-1 time axis
        if x is None:
            return None
        return (x[rows, index] if axis == 1 else x[rows, :, index]).unsqueeze(axis)

    t = tensors
    one = reference(token(t["q"], 1), token(t["k"], 1), token(t["v"], 1), t["q_bias"], t["k_bias"], t["mimo_v"],
                    t["mimo_o"], token(t["z"], 1), t["d"], t["mimo_z"], token(t["angles"], 1),
                    token(t["da_cs"], 2), token(t["da_cs_rev"], 2), token(t["dt"], 2), token(t["trap"], 2),
                    t["segsum"][:, :, :1], chunk_size=dims.chunk_size, rotary_dim_divisor=dims.rotary_dim_divisor,
                    policy=policy, return_state=True)
    return one.final_k


def _fill_record(record, buf: ChunkBuffers, cx, dims: Dims, mod) -> None:
    """The forward's stages (``spec.STAGES``) from the record slots."""
    fill_common_record(record, buf, cx, dims, mod)
    P = dims.value_dim
    if dims.has_d:
        record["d_term"] = record_slot(buf, mod.SLOT_D_TERM, P)
    if dims.reduce_o:
        if dims.has_z:
            record["phi_gate"] = record_slot(buf, mod.SLOT_PHI_GATE, P)
        record["o_rank"] = record_slot(buf, mod.SLOT_O_RANK, P)
        record["o_sum"] = record_slot(buf, mod.SLOT_O_SUM, P)[..., 0, :]
    record["o"] = buf.o.to(torch.float32)
