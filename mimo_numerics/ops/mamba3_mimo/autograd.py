"""``mamba3_mimo``: the whole Mamba-3 MIMO op as a ``torch.autograd.Function`` under a rounding policy.

Same positional order, shapes and dtypes as upstream's ``mamba3_mimo`` (mamba-ssm 2.3.2.post1,
``ops/tilelang/mamba3/mamba3_mimo.py``)::

    out = mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                      chunk_size=16, rotary_dim_divisor=4, dtype=None, policy="upstream_sm90")
    out.backward(dout)          # every input's .grad, as upstream's _Mamba3Function.backward computes them

The forward runs the preprocessing (cumulative angles, ``da_cs``, ``da_cs_rev``, ``segsum``) and the forward
operator ``mamba_mimo_fwd``; the backward runs stage 1 (``mamba_mimo_bwd_fwd``) -> stage 2 (``mamba_mimo_bwd_bwd``)
-> the FP32 epilogue (torch sums, ``bwd_dtrap_ddt``, ``bwd_dadt_fused``, ``angle_dt_bwd``), each step under the
same policy. Which implementation runs each step is :mod:`.chain`'s business (``docs/whole_op.md``):

* ``math_dtype="float32"`` policies (``upstream_sm90``, ``fp32``, any variant with ``round_outputs=True``): upstream's
  FP32 preprocessing, the three policy references, the FP32 epilogue. Gradients have upstream's dtypes: ``dQ``,
  ``dK``, ``dV``, ``dTrap``, ``dZ`` in lp, the others float32 (``dQ_bias``/``dK_bias`` hold lp values, as in
  2.3.2.post1).
* ``fp64``: float64 preprocessing and the FP64 oracle of every step, nothing rounded. ``Out`` is float64; torch
  autograd casts each gradient to its input's dtype when it stores ``.grad`` (``dQ`` of a bf16 ``Q`` becomes
  bf16), so with upstream's input dtypes the unrounded float64 gradients are read from ``record``
  (``"mamba3_mimo_epilogue.dQ"``, ...). Or give float64 inputs (:data:`FLOAT64_INPUTS_RULE`): then every
  ``.grad`` is the float64 gradient itself.

``record={}`` collects, under ``"<operator>.<stage>"`` keys (:data:`RECORD_PREFIXES`): the preprocessing outputs
(``mamba3_mimo_preprocess.angles_cumsum``, ...), the recorded stages and the outputs of each operator
(``mamba_mimo_fwd.out``, ``mamba_mimo_fwd.outputs.o``, ``mamba_mimo_bwd_fwd.state``,
``mamba_mimo_bwd_fwd.outputs.states``, ``mamba_mimo_bwd_bwd.dstates``, ``mamba_mimo_bwd_bwd.outputs.dq``, ...;
the FP64 oracles record no internal stages, only outputs) and the epilogue's outputs
(``mamba3_mimo_epilogue.dQ``, ..., ``mamba3_mimo_epilogue.ddt_core``). The forward fills it when called, the backward
when it runs. :func:`golden_sections` turns a record into the golden file's sections.

``backend="triton"`` runs every step of the chain on the package's Triton kernels (``mimo_numerics.kernels``:
compiled on CUDA, Triton's interpreter on CPU, triton-ascend on NPU): the preprocessing and the FP32 epilogue
(``kernels/chain_steps.py``), the forward, stage 1 and stage 2 (:data:`TRITON_STAGES`). On Ascend stage 2 runs
the reference beyond its kernels' tile bounds (:func:`triton_stages`), and such a call says so with a
:class:`BackendFallbackWarning` naming it, once per message and code location (Python's default warning filter). ``backend="auto"`` runs the kernels where they can (CUDA or NPU tensors, Triton
importable, a policy and sizes the kernels express: :func:`auto_backend`) and the reference elsewhere; the default
stays ``"reference"``, the definition the kernels are gated against, which runs anywhere without a compile.

``return_state=True`` returns ``(Out, Final_Angle, Final_SSM_State, Final_K, Final_V)`` as upstream does: the angle
walk's state after the last chunk (``remainder(·, 2π)``) ``[B, H, K]``, the SSM state after the last chunk
``[B, H, P, N]`` (fp32), the last token's biased, rotated K ``[B, R, H, N]`` (lp) and ``V[:, -1]`` ``[B, H, P]``,
all non-differentiable side outputs (as upstream's: a loss of them gets no gradient). Under ``backend="triton"``
the state walk kernel stores the final state; ``Final_K`` comes from the reference on the last token.

``cu_seqlens`` (upstream's varlen mode, ``B = 1``): the sequences run as zero-padded batch rows and ``Out`` is
gathered back (:mod:`.varlen` says why the padding changes no real token); gradients flow back through the packing.
Upstream's own limits are checked up front when a gradient is needed: the backward needs ``S % chunk_size == 0``
and ``G`` in ``{1, H}`` (upstream asserts in its Triton helpers and raises in ``mamba_mimo_bwd_combined``).
Upstream's forward clamps the chunk log-decays to ``<= 0`` and its backward differentiates as if it did not
(``docs/fp64_model.md``); so does this backward, in every chain.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from ... import presets as _presets
from . import chain, varlen
from .cases import OP_GRAD_NAMES, OP_INPUT_NAMES
from .validation import check_op_inputs as _validate_shapes
from .validation import start_dt_adt_sign_check

#: Backends of :func:`mamba3_mimo` (``"reference"`` is the default: the definition the kernels are gated against,
#: no compile cost, any device and size; ``"auto"`` picks per call, :func:`auto_backend`).
BACKENDS = ("reference", "triton", "auto")
#: Device types on which ``backend="auto"`` runs the kernels (compiled; on the CPU they would be interpreted).
AUTO_KERNEL_DEVICES = ("cuda", "npu")
#: What each step of the chain runs under ``backend="triton"``: "triton" or "reference" (no kernel yet).
TRITON_STAGES: Dict[str, str] = {
    "mamba3_mimo_preprocess": "triton",
    "mamba_mimo_fwd": "triton",
    "mamba_mimo_bwd_fwd": "triton",
    "mamba_mimo_bwd_bwd": "triton",
    "mamba3_mimo_epilogue": "triton",
}
#: The key prefixes of ``record``, in chain order.
RECORD_PREFIXES = ("mamba3_mimo_preprocess", "mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd",
                   "mamba3_mimo_epilogue")
#: Inputs upstream takes in the low-precision ``dtype``; every other tensor is float32.
LP_INPUTS = ("Q", "K", "V", "Trap", "Z")
_LP_DTYPES = (torch.bfloat16, torch.float16)
#: When the 14 tensors may be float64 instead of upstream's dtypes (:func:`validate_op_inputs`, ``wide=True``).
FLOAT64_INPUTS_RULE = (
    "float64 inputs are taken only under a policy whose chain is float64 and unrounded (the fp64 preset: "
    "math_dtype='float64', round_outputs=False, no rounding site on), and then for every tensor argument at once "
    "(Q, K, V, Trap, Z in place of the lp dtype, the others in place of float32), so that autograd stores "
    "float64 gradients")


class BackendFallbackWarning(UserWarning):
    """``backend="triton"``: some steps of the chain have no kernel and run the reference."""


@dataclass(frozen=True)
class _Config:
    policy: Any
    backend: str
    chunk_size: int
    rotary_dim_divisor: int
    record: Optional[MutableMapping]
    return_state: bool = False
    final_tokens: Optional[tuple] = None  # varlen rows: each row's last real token (FINAL_K, Final_V)


def _check_float64_inputs(tensors: Dict[str, Optional[torch.Tensor]], dtype, lp_dtype: torch.dtype) -> None:
    """``wide=True`` with a float64 ``Q``: every tensor float64 (:data:`FLOAT64_INPUTS_RULE`); ``dtype`` None or
    the policy's lp dtype (it names no tensor's dtype then)."""
    for name, value in tensors.items():
        if value is not None and value.dtype != torch.float64:
            raise TypeError(f"{name} has dtype {value.dtype} but Q is float64: {FLOAT64_INPUTS_RULE}; give every "
                            "tensor in float64, or every one in upstream's dtype")
    if dtype is not None and dtype != lp_dtype:
        raise TypeError(f"dtype={dtype} with float64 inputs: dtype must be None or the policy's lp_dtype {lp_dtype}")


def validate_op_inputs(tensors: Dict[str, Optional[torch.Tensor]], chunk_size, rotary_dim_divisor, dtype,
                       lp_dtype: torch.dtype, *, needs_backward: bool, wide: bool = False) -> None:
    """Check the 14 raw inputs of the op (golden names) before anything runs; errors name the argument.

    Shapes, pairings (``Z`` with ``MIMO_Z``), sizes and devices by the FP64 model's validation; then upstream's
    dtypes: ``Q``, ``K``, ``V``, ``Trap``, ``Z`` in one lp dtype (``dtype`` when given, the policy's ``lp_dtype``),
    every other tensor float32. ``wide=True`` (the policy runs the fp64 chain, ``chain.chain_kind``) also takes
    every tensor in float64 (:data:`FLOAT64_INPUTS_RULE`). With ``needs_backward``: upstream's backward limits,
    ``S % chunk_size == 0`` and ``G`` in ``{1, H}``. The DT/ADT sign check is not here: :func:`mamba3_mimo` runs it
    around the forward (``validation.start_dt_adt_sign_check``).

    Raises:
        TypeError: a missing or non-tensor argument, a wrong dtype. ValueError: shapes, devices, pairings, sizes.
    """
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor) and (value.layout != torch.strided or value.is_nested):
            kind = "a nested tensor" if value.is_nested else f"a tensor of layout {value.layout}"
            raise TypeError(f"{name} must be a dense (strided) torch.Tensor, got {kind}")
    B, S, R, G, N, H, P, C, _ = _validate_shapes(tensors, chunk_size, rotary_dim_divisor, "upstream",
                                                 check_signs=False)  # mamba3_mimo: start_dt_adt_sign_check
    lp = tensors["Q"].dtype
    float64_hint = (" (float64 inputs under this policy: every tensor at once, Q included)" if wide
                    else f" ({FLOAT64_INPUTS_RULE})")
    if wide and lp == torch.float64:
        _check_float64_inputs(tensors, dtype, lp_dtype)
    elif lp not in _LP_DTYPES:
        raise TypeError(f"Q must have dtype torch.bfloat16 or torch.float16 (upstream's low-precision dtype), got "
                        f"{lp}{float64_hint if lp == torch.float64 else ''}")
    else:
        _check_upstream_dtypes(tensors, lp, dtype, lp_dtype, float64_hint)
    if needs_backward:
        if S % C:
            raise ValueError(f"the backward needs the sequence length to be a multiple of chunk_size, as upstream's "
                             f"(its Triton helpers assert it): S={S}, chunk_size={C}; pad the sequence or run "
                             "without gradients")
        if G not in (1, H):
            raise ValueError(f"the backward supports G == 1 or G == H only, as upstream's mamba_mimo_bwd_combined: "
                             f"Q has G={G} groups for H={H} heads")


def _check_upstream_dtypes(tensors: Dict[str, Optional[torch.Tensor]], lp: torch.dtype, dtype,
                           lp_dtype: torch.dtype, float64_hint: str) -> None:
    """Upstream's dtypes: ``Q`` ... in ``lp`` (= ``dtype`` when given, = the policy's ``lp_dtype``), the rest
    float32."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype (torch.bfloat16 or torch.float16) or None, got "
                            f"{type(dtype).__name__} ({dtype!r})")
        if dtype != lp:
            raise TypeError(f"dtype={dtype} does not match the dtype {lp} of Q (upstream computes in dtype; the "
                            "low-precision inputs Q, K, V, Trap, Z must have it)")
    if lp != lp_dtype:
        raise TypeError(f"Q has dtype {lp} but the policy's lp_dtype is {lp_dtype}: the low-precision inputs must "
                        "match the policy (policy.replace(lp_dtype=...) or a preset of that dtype)")
    for name, value in tensors.items():
        if value is None:
            continue
        want = lp if name in LP_INPUTS else torch.float32
        if value.dtype != want:
            role = "the low-precision dtype of Q" if name in LP_INPUTS else "float32, as upstream takes it"
            raise TypeError(f"{name} must have dtype {want} ({role}), got {value.dtype}"
                            f"{float64_hint if value.dtype == torch.float64 else ''}")


class _Mamba3MimoFunction(torch.autograd.Function):
    """Forward: preprocessing + ``mamba_mimo_fwd``. Backward: stage 1 -> stage 2 -> epilogue (:mod:`.chain`)."""

    @staticmethod
    def forward(ctx, config: _Config, *tensors):
        inputs = dict(zip(OP_INPUT_NAMES, tensors))
        inputs["chunk_size"], inputs["rotary_dim_divisor"] = config.chunk_size, config.rotary_dim_divisor
        pre = chain.run_preprocess(inputs, config.policy, backend=config.backend, record=config.record,
                                   return_state=config.return_state)
        out = chain.run_forward(inputs, pre, config.policy, backend=config.backend, record=config.record,
                                return_state=config.return_state, final_tokens=config.final_tokens)
        ctx.config, ctx.pre = config, pre
        ctx.save_for_backward(*tensors)
        if not config.return_state:
            return out
        V = inputs["V"]
        last = (V.shape[1] - 1,) * V.shape[0] if config.final_tokens is None else config.final_tokens
        final = (torch.remainder(pre.pop("final_angle"), 2 * math.pi),  # upstream's remainder, 2π as its dtype
                 out["final_state"].permute(0, 1, 3, 2).contiguous(),  # [B, H, N, P] -> [B, H, P, N]
                 out["final_k"].contiguous(), V[torch.arange(V.shape[0], device=V.device), list(last)].clone())
        ctx.mark_non_differentiable(*final)
        return (out["o"],) + final

    @staticmethod
    def backward(ctx, dout, *final_state_grads):  # the final state is a non-differentiable side output
        config = ctx.config
        inputs = dict(zip(OP_INPUT_NAMES, ctx.saved_tensors))
        inputs["chunk_size"], inputs["rotary_dim_divisor"] = config.chunk_size, config.rotary_dim_divisor
        inputs["dout"] = dout.contiguous()
        grads = chain.run_backward(inputs, ctx.pre, config.policy, backend=config.backend, record=config.record)
        wanted = ctx.needs_input_grad[1:]
        return (None,) + tuple(grads[name] if need else None for name, need in zip(OP_GRAD_NAMES, wanted))


def auto_backend(policy, tensors: Dict[str, Optional[torch.Tensor]], chunk_size: int) -> Tuple[str, str]:
    """What ``backend="auto"`` runs for these inputs: ``("triton", why)`` when the tensors are on a device of
    :data:`AUTO_KERNEL_DEVICES`, Triton imports and the kernels express the policy and the sizes, else
    ``("reference", why)``, ``why`` naming the first condition that failed (the error ``backend="triton"`` would
    raise).

    Args:
        policy (RoundingPolicy): the call's policy. tensors (dict): the op's 14 inputs by name.
        chunk_size (int): C.
    """
    device = tensors["V"].device.type
    if device not in AUTO_KERNEL_DEVICES:
        return "reference", (f"the tensors are on {device}; the kernels run compiled on "
                             f"{' and '.join(AUTO_KERNEL_DEVICES)} only")
    try:
        _check_triton(policy, tensors, chunk_size)
    except (ImportError, ValueError) as exc:  # UnsupportedPolicyError is a ValueError
        return "reference", str(exc)
    return "triton", f"the kernels express this policy and these sizes on {device}"


def _check_backend(backend: str, policy, tensors: Dict[str, Optional[torch.Tensor]], chunk_size: int) -> str:
    """The backend's own limits, before the forward runs (a kernel refusal would otherwise come in backward); the
    backend that runs (``"auto"`` resolved)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend, _ = auto_backend(policy, tensors, chunk_size)
    if backend == "reference":
        return backend
    stages = _check_triton(policy, tensors, chunk_size)
    fallback = [step for step, runs in stages.items() if runs == "reference"]
    if fallback:
        warnings.warn(f"backend='triton': only {', '.join(s for s, r in stages.items() if r == 'triton')} "
                      f"run kernels; {', '.join(fallback)} run the reference (beyond the kernels' Ascend tile "
                      "bounds)", BackendFallbackWarning, stacklevel=3)
    return backend


def _check_triton(policy, tensors: Dict[str, Optional[torch.Tensor]], chunk_size: int) -> Dict[str, str]:
    """Raise what ``backend="triton"`` cannot run (no Triton, a policy or a size the kernels do not express);
    :func:`triton_stages` for the tensors' device otherwise."""
    from ... import kernels
    from ...kernels import mimo_bwd_fwd as _stage1_kernel

    if not kernels.triton_available():
        raise ImportError("backend='triton' needs Triton: install the 'triton' extra (pip install "
                          "'mimo_numerics[triton]'), or the 'npu' extra on Ascend; backend='reference' needs none")
    for operator in ("mamba_mimo_fwd", "mamba_mimo_bwd_fwd"):
        # UnsupportedPolicyError naming the field (fp64, round_outputs=False, ...)
        kernels.policy_constexprs(policy, operator)
    kernels.stage2_constexprs(policy)
    kernels.chain_constexprs(policy)
    N, P, R = tensors["Q"].shape[-1], tensors["V"].shape[-1], tensors["Q"].shape[2]
    for letter, size, source in (("N", N, "Q"), ("P", P, "V")):
        if size not in kernels.SUPPORTED_DIMS:
            raise ValueError(f"backend='triton': {source} has {letter}={size}; the Triton kernels support "
                             f"{letter} in {kernels.SUPPORTED_DIMS} (backend='reference' takes any size)")
    if chunk_size * R > _stage1_kernel.MAX_FUSED_ROWS:
        raise ValueError(f"backend='triton': chunk_size={chunk_size} with R={R} gives C*R={chunk_size * R} fused "
                         f"rows; the Triton kernels support C*R <= {_stage1_kernel.MAX_FUSED_ROWS}")
    return triton_stages(tensors["V"].device.type, N, P, chunk_size * R)


def triton_stages(device_type: str, state_dim: int = 64, value_dim: int = 64,
                  fused_rows: int = 64) -> Dict[str, str]:
    """:data:`TRITON_STAGES` on a device of ``device_type`` for N = ``state_dim``, P = ``value_dim`` and C·R =
    ``fused_rows``: on Ascend (``npu``) stage 2 runs the reference beyond its kernels' tile bounds (their programs
    would overflow the unified buffer: ``kernels.mimo_bwd_bwd.backend_refusal``)."""
    from ...kernels.mimo_bwd_bwd import backend_refusal

    stages = dict(TRITON_STAGES)
    if backend_refusal(device_type, state_dim, value_dim, fused_rows):
        stages["mamba_mimo_bwd_bwd"] = "reference"
    return stages


def mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype: Optional[torch.dtype] = None, *,
                policy="upstream_sm90", backend: str = "reference", record: Optional[MutableMapping] = None,
                return_state: bool = False, cu_seqlens=None) -> torch.Tensor:
    """The Mamba-3 MIMO op forward, differentiable, every step rounded as ``policy`` says (module docstring).

    Args:
        Q, K (Tensor): ``[B, S, R, G, N]`` lp. V (Tensor): ``[B, S, H, P]`` lp.
        ADT, DT (Tensor): ``[B, H, S]`` float32 (A·dt, dt). Trap (Tensor): ``[B, H, S]`` lp, before the sigmoid.
        Q_bias, K_bias (Tensor): ``[H, R, N]`` float32. MIMO_V (Tensor): ``[H, R, P]`` float32.
        MIMO_Z (Tensor | None): ``[H, R, P]`` float32, with Z. MIMO_Out (Tensor | None): ``[H, R, P]`` float32;
            None: the non-reduced output ``[B, S, R, H, P]``.
        Angles (Tensor): ``[B, S, H, N / rotary_dim_divisor]`` float32, raw (before tanh and the cumulative sum).
        D (Tensor | None): ``[H]`` float32. Z (Tensor | None): ``[B, S, H, P]`` lp.
        chunk_size (int): C (a power of 2 in the float32 chain, as upstream's Triton preprocessing).
        rotary_dim_divisor (int): 2 or 4.
        dtype (torch.dtype | None): upstream's argument; when given it must be the dtype of ``Q``.
        policy (RoundingPolicy | str): a policy, a preset name or a policy JSON path; it must define the sections
            of ``mamba_mimo_fwd``, ``mamba_mimo_bwd_fwd`` and ``mamba_mimo_bwd_bwd``.
        backend (str): ``"reference"`` (default), ``"triton"`` (the three operators by kernel;
            :data:`TRITON_STAGES`) or ``"auto"`` (the kernels where :func:`auto_backend` finds them usable, the
            reference elsewhere, without a warning for the choice).
        record (dict, optional): filled with the named stages of the chain (module docstring).
        return_state (bool): also return upstream's final state for decoding (module docstring).
        cu_seqlens (Tensor | None): ``[NS + 1]`` int32 offsets of packed sequences (B = 1), upstream's varlen
            mode: every sequence restarts (chunks, states, angles); tails allowed (:mod:`.varlen`). With
            ``return_state`` the final state is per sequence, ``[NS, ...]``.

    Returns:
        Tensor: ``Out``, ``[B, S, H, P]`` with ``MIMO_Out``, else ``[B, S, R, H, P]``; lp in the float32 chain,
        float64 under ``fp64``. Under ``fp64`` the 14 tensors may all be float64 (:data:`FLOAT64_INPUTS_RULE`):
        then every ``.grad`` is float64, the gradient itself rather than autograd's cast of it to a bf16 input.
        With ``return_state``: ``(Out, Final_Angle [B, H, K], Final_SSM_State [B, H, P, N], Final_K [B, R, H, N],
        Final_V [B, H, P])``, the last four non-differentiable.

    Raises:
        NotImplementedError: a policy the chain cannot run (``chain.chain_kind``).
        PolicyUndefined: a policy without a section of the chain (``seed_bf16``).
        TypeError, ValueError: bad inputs, naming the argument (:func:`validate_op_inputs`, then each operator's
            own validation).
        ImportError, UnsupportedPolicyError: ``backend="triton"`` without Triton or with a policy the kernels
            cannot express.
    """
    if not isinstance(return_state, bool):
        raise TypeError(f"return_state must be a bool, got {type(return_state).__name__}")
    if record is not None and not isinstance(record, MutableMapping):
        raise TypeError(f"record must be a dict (or another mutable mapping) or None, got {type(record).__name__}")
    policy = _presets.resolve(policy)
    chain.chain_kind(policy)  # PolicyUndefined / NotImplementedError before any work
    tensors = dict(zip(OP_INPUT_NAMES, (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles,
                                        D, Z)))
    needs_backward = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors.values())
    wide = chain.chain_kind(policy) == "fp64"
    validate_op_inputs(tensors, chunk_size, rotary_dim_divisor, dtype, policy.lp_torch_dtype,
                       needs_backward=needs_backward and cu_seqlens is None, wide=wide)
    final_tokens = None
    if cu_seqlens is not None:  # the sequences as zero-padded batch rows (varlen.py)
        if record is not None:
            raise ValueError("record is not supported with cu_seqlens (the stages run on the sequences as padded "
                             "batch rows); record a run without cu_seqlens")
        bounds = varlen.sequence_bounds(cu_seqlens, Q.shape[0], Q.shape[1])
        tensors = varlen.pack(tensors, bounds, varlen.padded_length(bounds, chunk_size))
        validate_op_inputs(tensors, chunk_size, rotary_dim_divisor, dtype, policy.lp_torch_dtype,
                           needs_backward=needs_backward, wide=wide)
        final_tokens = varlen.last_tokens(bounds)
    backend = _check_backend(backend, policy, tensors, chunk_size)
    config = _Config(policy=policy, backend=backend, chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor,
                     record=record, return_state=return_state, final_tokens=final_tokens)
    # the DT/ADT sign check: on CUDA its verdict is read after the forward's launches (no host stall before them)
    finish_sign_check = start_dt_adt_sign_check(DT, ADT)
    result = _Mamba3MimoFunction.apply(config, *tensors.values())
    if finish_sign_check is not None:
        finish_sign_check()
    if cu_seqlens is None:
        return result
    if return_state:
        return (varlen.unpack(result[0], bounds),) + tuple(result[1:])
    return varlen.unpack(result, bounds)


def precompile_mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                           chunk_size: int = 16, rotary_dim_divisor: int = 4, *, policy="upstream_sm90",
                           backward: bool = True, workers: Optional[int] = None, return_state: bool = False,
                           cu_seqlens=None):
    """Compile, in parallel and without running them, the Triton kernels that :func:`mamba3_mimo` with
    ``backend="triton"`` launches for these inputs' shapes and dtypes under ``policy`` (forward, and with
    ``backward`` the backward as ``Out.backward`` runs it): ``kernels.compile_ahead`` of one call. The first real
    call afterwards starts without Triton's one-after-another compiles (``docs/kernels.md`` has the figures).

    The inputs are used for their shapes, dtypes and devices only (detached copies; nothing is written to them
    and no gradient is kept). Arguments as :func:`mamba3_mimo`.

    Returns:
        kernels.CompileAheadReport: launches seen, kernel specializations compiled, threads, seconds.

    Raises:
        ImportError: Triton is not installed. Otherwise what :func:`mamba3_mimo` raises for these arguments.
    """
    from ...kernels import _compile_ahead, _launch

    _launch.require_triton()
    if not isinstance(backward, bool):
        raise TypeError(f"backward must be a bool, got {type(backward).__name__}")
    tensors = (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z)

    def one_call():
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(backward) if isinstance(t, torch.Tensor) and t.is_floating_point()
                      else t for t in tensors]
            result = mamba3_mimo(*leaves, chunk_size, rotary_dim_divisor, policy=policy, backend="triton",
                                 return_state=return_state, cu_seqlens=cu_seqlens)
            out = result[0] if return_state else result
            if backward:
                out.backward(torch.ones_like(out))

    return _compile_ahead.compile_ahead(one_call, workers=workers)


# ---------------------------------------------------------------------------------------------------- records
#: Golden-file section -> (record prefix, {golden name: record name}) for :func:`golden_sections`.
GOLDEN_SECTIONS = {
    "pre": ("mamba3_mimo_preprocess", {n: n for n in chain.PRE_NAMES}),
    "fwd": ("mamba_mimo_fwd.outputs", {"o": "o"}),
    "bwd_fwd": ("mamba_mimo_bwd_fwd.outputs", {n: n for n in ("dmimo_o", "states", "dz", "dmimo_z", "qk_dot")}),
    "bwd_bwd": ("mamba_mimo_bwd_bwd.outputs", {n: n for n in ("dq", "dk", "dv", "dmimo_v", "dD", "dangles",
                                                              "dfactor", "dgamma_diag", "ddA", "dSSdA",
                                                              "ddA_cs_rev", "ddA_cs")}),
    "post": ("mamba3_mimo_epilogue", {"ddt_core": "ddt_core", "dtrap": "dTrap", "dADT": "dADT",
                                      "dAngles": "dAngles", "dDT_angle": "dDT_angle", "dDT": "dDT"}),
    "grads": ("mamba3_mimo_epilogue", {n: n for n in OP_GRAD_NAMES}),
}


def golden_sections(record: MutableMapping) -> Dict[str, Dict[str, Optional[torch.Tensor]]]:
    """A filled ``record`` as the golden file's sections: ``pre``, ``fwd``, ``bwd_fwd``, ``bwd_bwd``, ``post`` and
    ``grads`` (the 14 gradients before autograd's cast to the inputs' dtypes); None for a tensor that was not
    recorded (an absent branch, or a backward that has not run)."""
    return {section: {golden: record.get(f"{prefix}.{name}") for golden, name in names.items()}
            for section, (prefix, names) in GOLDEN_SECTIONS.items()}
