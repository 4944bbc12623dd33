"""The chain of the whole op ``mamba3_mimo``: preprocessing -> forward, and stage 1 -> stage 2 -> epilogue.

Every function here takes the op's raw inputs as a dict in the golden file's names (``Q, K, V, ADT, DT, Trap,
Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z``, ``chunk_size``, ``rotary_dim_divisor`` and, for the
backward, ``dout``), and returns or takes the outputs of each step in the golden file's names too (``pre``,
``bwd_fwd``, ``bwd_bwd``; ``tests/data/README.md``), so a step can be fed upstream's recorded outputs instead of
the package's own.

Two chains, chosen by the policy (:func:`chain_kind`):

* ``"reference"`` (``math_dtype="float32"``, ``round_outputs=True``): upstream's FP32 preprocessing
  (``preprocess.py``), the forward reference ``mamba_mimo_fwd``, the stage-1 reference ``mamba_mimo_bwd_fwd`` (or
  its Triton kernel), the stage-2 reference ``mamba_mimo_bwd_bwd``, each under the policy's section, and the FP32
  epilogue (``mamba3_mimo_epilogue.reference``: no lp sites of its own; the policy's ``helper_fma`` knob says whether
  its FP32 ``a·b + c`` are contracted as Triton compiles them, and ``round_outputs`` rounds the bias sums to lp as
  2.3.2.post1 stores them).
* ``"fp64"`` (the ``fp64`` preset's semantics: ``math_dtype="float64"``, ``round_outputs=False``, no site on in any
  section): the float64 preprocessing and the FP64 oracles of every step (forward, stage 1, stage 2, epilogue),
  nothing rounded. The stage references check upstream's dtypes (float32 preprocessing, lp ``states``), so they
  cannot take float64 preprocessing; the oracles can (stage 1's after a float32-copy validation,
  :func:`stage1_oracle_fp64`).

Any other policy raises ``NotImplementedError`` naming the field (a float64 policy with rounding sites on, or a
float32 one with ``round_outputs=False``: stage 2 takes stage 1's ``states`` in lp).
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import torch

from ..mamba_mimo_bwd_fwd import oracle as _stage1_oracle_module
from ... import presets as _presets
from ..mamba_mimo_bwd_fwd import reference as _stage1_reference
from ..mamba_mimo_bwd_fwd.outputs import INPUT_NAMES as _STAGE1_INPUT_NAMES
from ...policy import RoundingPolicy, require_default
from ..mamba_mimo_bwd_fwd.validation import LP_INPUTS as _STAGE1_LP_INPUTS
from ..mamba3_mimo_epilogue.oracle import mamba3_mimo_epilogue_oracle
from ..mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference
from ..mamba_mimo_bwd_bwd.oracle import mamba_mimo_bwd_bwd_oracle
from ..mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
from ..mamba_mimo_fwd.oracle import mamba_mimo_fwd_oracle
from ..mamba_mimo_fwd.reference import mamba_mimo_fwd
from .fp64_model import INPUT_NAMES as OP_INPUTS
from .fp64_model import mamba3_mimo_fp64
from .preprocess import angle_cumsum, dacs_segsum

_F64 = torch.float64
#: The operators of the chain with a policy section, in chain order.
POLICY_OPERATORS = ("mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd")
#: Names of the preprocessing outputs (golden ``pre``).
PRE_NAMES = ("angles_cumsum", "da_cs", "da_cs_rev", "segsum")
#: Stage-1 outputs stage 2 reads (golden ``bwd_fwd``).
_STAGE1_FOR_STAGE2 = ("states", "qk_dot")
#: Stage-2 outputs the epilogue reads, in its call order (golden ``bwd_bwd``).
_EPILOGUE_STAGE2 = ("dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA",
                    "ddA_cs_rev", "ddA_cs")
CHAIN_KINDS = ("reference", "fp64")
#: Raw inputs whose dim 0 is the batch (the others are per head: biases, projections, ``D``).
BATCH_INPUTS = ("Q", "K", "V", "ADT", "DT", "Trap", "Angles", "Z", "dout")
#: On CUDA the float32 chain runs the forward and both backward stages on slices of whole batch rows with at most
#: this many ``batch x sequence x head`` rows each (at least one batch row): their intermediates grow with ``B·S·H``,
#: so a slice bounds the peak memory at any batch size (shape (d): ``reports/bench/whole_op_cuda_d.md``). Every step
#: is independent across the batch (each output has the batch first); the epilogue, which sums over the batch, sees
#: whole tensors. Up to this many rows (every test case, the golden cases, shape (a) B=1, S=8192, H=16) nothing is
#: sliced and the bits are those of the whole tensors. Above it some FP32 sums may end in other last bits: torch
#: chooses its CUDA reduction layout, and cuBLAS its GEMM kernel, by the batch count, an order the policy does not
#: model (``gemm_model``, ``reduction_order``); the same report gives the differences at (d), and
#: ``tests/ops/mamba3_mimo/test_batch_slices.py`` bounds them.
SLICE_ROWS = 1 << 17
#: Device types on which the steps are sliced. Not the CPU, whose runs keep whole tensors and so the bits of every
#: earlier CPU report at any size (torch's CPU elementwise kernels split a tensor into vector bodies and scalar
#: tails by its size, and the two can round differently: a slice moved last bits under ``fp32`` even at S = 32).
SLICE_DEVICES = ("cuda",)


# ---------------------------------------------------------------------------------------------------- argument lists
def forward_args(inputs: dict, pre: dict) -> tuple:
    """The 16 tensors of ``mamba_mimo_fwd`` in upstream's order, from the raw inputs and the preprocessing."""
    return (inputs["Q"], inputs["K"], inputs["V"], inputs["Q_bias"], inputs["K_bias"], inputs["MIMO_V"],
            inputs["MIMO_Out"], inputs["Z"], inputs["D"], inputs["MIMO_Z"], pre["angles_cumsum"], pre["da_cs"],
            pre["da_cs_rev"], inputs["DT"], inputs["Trap"], pre["segsum"])


def stage1_args(inputs: dict, pre: dict) -> tuple:
    """The 17 tensors of ``mamba_mimo_bwd_fwd`` in the API order (``mimo_numerics.INPUT_NAMES``); ``inputs`` holds
    ``dout``."""
    return (inputs["dout"], inputs["Q"], inputs["K"], inputs["V"], inputs["Q_bias"], inputs["K_bias"],
            inputs["MIMO_V"], inputs["MIMO_Out"], inputs["Z"], inputs["MIMO_Z"], pre["angles_cumsum"],
            pre["da_cs"], pre["da_cs_rev"], inputs["DT"], inputs["Trap"], inputs["D"], pre["segsum"])


def stage2_args(inputs: dict, pre: dict, bwd_fwd: dict) -> tuple:
    """The 19 tensors of ``mamba_mimo_bwd_bwd`` in the kernel's order, from the raw inputs (with ``dout``), the
    preprocessing and stage 1's ``states``, ``qk_dot``."""
    return (inputs["dout"], inputs["Q"], inputs["K"], inputs["V"], inputs["Q_bias"], inputs["K_bias"],
            inputs["MIMO_V"], inputs["MIMO_Out"], bwd_fwd["states"], inputs["Z"], inputs["MIMO_Z"],
            pre["angles_cumsum"], pre["da_cs"], pre["da_cs_rev"], inputs["DT"], inputs["Trap"], inputs["D"],
            bwd_fwd["qk_dot"], pre["segsum"])


def stage2_kwargs(inputs: dict) -> dict:
    """``chunk_size`` and ``rotary_dim_divisor`` of stage 2 (and stage 1, the forward)."""
    return {"chunk_size": inputs["chunk_size"], "rotary_dim_divisor": inputs["rotary_dim_divisor"]}


def epilogue_args(inputs: dict, pre: dict, bwd_fwd: dict, bwd_bwd: dict) -> tuple:
    """The 21 tensors of the epilogue in call order (``mamba3_mimo_epilogue.spec.INPUT_NAMES``)."""
    return (tuple(bwd_bwd[n] for n in _EPILOGUE_STAGE2)
            + (bwd_fwd["dmimo_o"], bwd_fwd["dz"], bwd_fwd["dmimo_z"], inputs["Trap"], inputs["DT"],
               inputs["Angles"], pre["da_cs"], pre["da_cs_rev"], pre["segsum"]))


def epilogue_kwargs(inputs: dict) -> dict:
    """``groups`` and ``chunk_size`` of the epilogue."""
    return {"groups": inputs["Q"].shape[3], "chunk_size": inputs["chunk_size"]}


# ---------------------------------------------------------------------------------------------------- policies
def chain_kind(policy) -> str:
    """Which chain runs ``policy`` (module docstring): ``"reference"`` or ``"fp64"``.

    Raises:
        PolicyUndefined: the policy has no section for an operator of the chain (``seed_bf16``).
        NotImplementedError: a policy neither chain can run, naming the field.
    """
    policy = _presets.resolve(policy)
    if not isinstance(policy, RoundingPolicy):
        raise TypeError(f"policy must resolve to a RoundingPolicy, got {type(policy).__name__}")
    sections = {op: policy.section(op) for op in POLICY_OPERATORS}  # PolicyUndefined names the operator
    require_default(policy, "reduction_order", "the whole op (its stage-2 reference)")
    if policy.math_dtype == "float32":
        if not policy.round_outputs:
            raise NotImplementedError(
                "RoundingPolicy.round_outputs=False with math_dtype='float32' is not supported by the whole op: "
                "stage 2 reads stage 1's states and qk_dot in the lp dtype (use round_outputs=True, or the fp64 "
                "preset)")
        return "reference"
    on = [f"{op}.{site}" for op, sites in sections.items() for site in sites.on()]
    if on or policy.round_outputs:
        what = f"sites {on[:4]}{' ...' if len(on) > 4 else ''} on" if on else "round_outputs=True"
        raise NotImplementedError(
            f"math_dtype='float64' with {what} is not supported by the whole op: in float64 it runs the FP64 "
            "oracles, which round nothing (the stage references take upstream's float32 preprocessing and lp "
            "states, not float64 ones); use the fp64 preset, or math_dtype='float32' for rounding sites")
    return "fp64"


# ---------------------------------------------------------------------------------------------------- batch slices
def batch_slices(batch: int, seqlen: int, heads: int, device: torch.device, rows: Optional[int] = None) -> list:
    """The batch ranges the float32 chain's steps run on: on a device of :data:`SLICE_DEVICES`, slices of
    ``max(1, rows // (seqlen·heads))`` batch rows (``rows`` defaults to :data:`SLICE_ROWS`), the last one shorter
    when it does not divide ``batch``; elsewhere the whole batch.

    Raises:
        ValueError: a size below 1 (``batch``, ``seqlen``, ``heads``, ``rows``), naming it.
    """
    for name, value in (("batch", batch), ("seqlen", seqlen), ("heads", heads), ("rows", rows)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if torch.device(device).type not in SLICE_DEVICES:
        return [slice(0, batch)]
    rows = SLICE_ROWS if rows is None else rows
    step = max(1, rows // (seqlen * heads))
    return [slice(b, min(b + step, batch)) for b in range(0, batch, step)]


def _take(tensors: dict, rows: slice, names=None) -> dict:
    """``tensors`` with the batch rows ``rows`` of the entries in ``names`` (every tensor entry when None)."""
    return {n: (t[rows] if isinstance(t, torch.Tensor) and (names is None or n in names) else t)
            for n, t in tensors.items()}


def _join(parts: list):
    """One result from the results of the batch slices: tensors concatenated along dim 0, dicts key by key (the
    first slice's key order), None kept."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0)
    if first is None:
        return None
    return {k: _join([p[k] for p in parts]) for k in first}


def _per_batch_slice(step, inputs: dict, pre: dict, *rest: dict, record: Optional[dict] = None):
    """``step(inputs, pre, *rest, record)`` run on each batch slice (:func:`batch_slices`) and joined; ``record``
    gets the joined stages. One slice: a direct call."""
    V = inputs["V"]
    slices = batch_slices(V.shape[0], V.shape[1], V.shape[2], V.device)
    if len(slices) == 1:
        return step(inputs, pre, *rest, record)
    parts, records = [], []
    for rows in slices:
        part_record = None if record is None else {}
        parts.append(step(_take(inputs, rows, BATCH_INPUTS), _take(pre, rows), *(_take(r, rows) for r in rest),
                          part_record))
        records.append(part_record)
    if record is not None:
        record.update(_join(records))
    return _join(parts)


# ---------------------------------------------------------------------------------------------------- steps
def preprocess(inputs: dict, math_dtype, return_state: bool = False,
               special_functions: str = "accurate", helper_fma: str = "contracted",
               segsum_num_warps: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """Upstream's preprocessing (``angle_dt_fwd``, ``compute_dacs_segsum_triton``) in ``math_dtype``: golden
    ``pre`` names; ``return_state`` adds ``final_angle`` ``[B, H, K]``, the angle walk's state after the last chunk
    (``angle_dt_fwd``'s ``output_state``). ``special_functions="fast_sm90"``: the angles' ``tanh_approx`` is
    ``tanh.approx.f32`` bit for bit; ``helper_fma="contracted"``: the angle increments' products are contracted
    into the scan's and the chunk sum's first add, as Triton compiles them. ``segsum_num_warps``: the autotuner's
    pick of ``dacs_segsum_kernel`` in the run being modelled (``preprocess.dacs_segsum``; None: its default)."""
    C = inputs["chunk_size"]
    da_cs, da_cs_rev, segsum = dacs_segsum(inputs["ADT"], C, math_dtype=math_dtype, segsum_num_warps=segsum_num_warps)
    tanh = "upstream" if special_functions == "fast_sm90" else "accurate"
    angles = angle_cumsum(inputs["Angles"], inputs["DT"], C, math_dtype=math_dtype, tanh=tanh,
                          fma=helper_fma == "contracted", return_final_state=return_state)
    pre = {"angles_cumsum": angles[0] if return_state else angles, "da_cs": da_cs, "da_cs_rev": da_cs_rev,
           "segsum": segsum}
    if return_state:
        pre["final_angle"] = angles[1]
    return pre


@contextlib.contextmanager
def _stage1_checks_float32_copies():
    """While active, the stage-1 oracle validates float32 (and lp) copies of float64 tensors: its checks keep
    upstream's dtypes, its arithmetic is float64 anyway (``stage1_oracle_fp64``)."""
    checker = _stage1_oracle_module.validate_inputs
    names = _STAGE1_INPUT_NAMES

    def check_copies(*args, **kwargs):
        lp = args[1].dtype  # q; float64 inputs of the whole op (its FLOAT64_INPUTS_RULE): a bf16 copy checks them
        lp = torch.bfloat16 if lp == _F64 else lp
        copied = []
        for name, a in zip(names, args[:len(names)]):
            if isinstance(a, torch.Tensor) and a.dtype == _F64:
                a = a.to(lp if name in _STAGE1_LP_INPUTS else torch.float32)
            copied.append(a)
        return checker(*copied, *args[len(names):], **kwargs)

    _stage1_oracle_module.validate_inputs = check_copies
    try:
        yield
    finally:
        _stage1_oracle_module.validate_inputs = checker


def stage1_oracle_fp64(*tensors, chunk_size: int, rotary_dim_divisor: int):
    """``mimo_numerics.oracle.mamba_mimo_bwd_fwd_oracle`` on float64 preprocessing outputs (and a float64 ``dout``).

    The stage-1 oracle checks upstream's dtypes (``angles``, ``da_cs``, ``da_cs_rev``, ``segsum`` float32, ``dout``
    lp) but converts every tensor to float64 before computing. This checks float32 (lp) copies of the float64
    tensors (shapes, pairings, everything else as usual; the lp copies in ``q``'s dtype, bfloat16 when ``q`` is
    float64 too) and runs the oracle's arithmetic on the float64 tensors themselves. (The oracle module's ``validate_inputs`` is swapped for the call's duration: not thread-safe. A
    ``wide=True`` option of ``mimo_numerics.validation.validate_inputs`` would remove this.)
    """
    with _stage1_checks_float32_copies():
        return _stage1_oracle_module.mamba_mimo_bwd_fwd_oracle(*tensors, chunk_size=chunk_size,
                                                               rotary_dim_divisor=rotary_dim_divisor)


def _store(record: Optional[dict], prefix: str, values: Optional[dict]) -> None:
    if record is not None and values:
        for name, value in values.items():
            if value is not None:
                record[f"{prefix}.{name}"] = value


def run_preprocess(inputs: dict, policy, *, backend: str = "reference", record: Optional[dict] = None,
                   return_state: bool = False, segsum_num_warps: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """The preprocessing in the chain's math dtype; ``record`` gets ``mamba3_mimo_preprocess.<name>``;
    ``return_state``: with ``final_angle``; ``segsum_num_warps``: an autotuner pick to model (:func:`preprocess`;
    the reference only). ``backend="triton"`` runs ``mimo_numerics.kernels.chain_steps.preprocess`` (reference
    chain only)."""
    policy = _presets.resolve(policy)
    kind = chain_kind(policy)
    if backend == "triton" and kind == "reference":
        from ...kernels import chain_steps  # imports triton only when called

        pre = chain_steps.preprocess(inputs["ADT"], inputs["Angles"], inputs["DT"], inputs["chunk_size"],
                                     policy=policy, return_state=return_state)
    else:
        pre = preprocess(inputs, torch.float32 if kind == "reference" else _F64, return_state=return_state,
                         special_functions=policy.special_functions if kind == "reference" else "accurate",
                         helper_fma=policy.helper_fma,
                         segsum_num_warps=segsum_num_warps if kind == "reference" else None)
    _store(record, "mamba3_mimo_preprocess", pre)
    return pre


def run_forward(inputs: dict, pre: dict, policy, *, backend: str = "reference",
                record: Optional[dict] = None, return_state: bool = False, final_tokens=None):
    """``Out`` of the forward operator under ``policy`` (the FP64 oracle under the fp64 chain).

    ``backend="triton"`` runs ``mimo_numerics.kernels.mamba_mimo_fwd`` (reference chain only). ``record`` gets
    ``mamba_mimo_fwd.<stage>`` (the reference's ``spec.STAGES``, the kernel's as well; none under fp64) and
    ``mamba_mimo_fwd.outputs.o``. ``return_state``: a dict ``{"o", "final_state" [B, H, N, P], "final_k" [B, R, H, N]}`` (upstream's ``FINAL_STATE``,
    ``FINAL_K``; ``final_tokens``: each row's token for ``FINAL_K``, default the last), also recorded under
    ``mamba_mimo_fwd.outputs``.
    """
    policy = _presets.resolve(policy)
    if return_state:
        if chain_kind(policy) == "fp64":
            o, final_state, final_k = mamba_mimo_fwd_oracle(*forward_args(inputs, pre), **stage2_kwargs(inputs),
                                                            return_state=True, final_tokens=final_tokens)
            result = {"o": o, "final_state": final_state, "final_k": final_k}
        elif backend == "triton":
            from ... import kernels  # imports triton only when called

            stages = None if record is None else {}
            result = kernels.mamba_mimo_fwd(*forward_args(inputs, pre), **stage2_kwargs(inputs), policy=policy,
                                            record=stages, return_state=True, final_tokens=final_tokens).as_dict()
            _store(record, "mamba_mimo_fwd", stages)
        elif final_tokens is not None:  # rows of their own (varlen): one call, every row's token known
            result = _forward_reference(inputs, pre, policy, record, True, final_tokens)
        else:
            result = _per_batch_slice(lambda x, p, rec: _forward_reference(x, p, policy, rec, True), inputs, pre,
                                      record=record)
        _store(record, "mamba_mimo_fwd.outputs", result)
        return result
    if chain_kind(policy) == "fp64":
        out = mamba_mimo_fwd_oracle(*forward_args(inputs, pre), **stage2_kwargs(inputs))
    elif backend == "triton":
        from ... import kernels  # imports triton only when called

        stages = None if record is None else {}
        out = kernels.mamba_mimo_fwd(*forward_args(inputs, pre), **stage2_kwargs(inputs), policy=policy,
                                     record=stages).o
        _store(record, "mamba_mimo_fwd", stages)
    else:
        out = _per_batch_slice(lambda x, p, rec: _forward_reference(x, p, policy, rec), inputs, pre, record=record)
    _store(record, "mamba_mimo_fwd.outputs", {"o": out})
    return out


def _forward_reference(inputs: dict, pre: dict, policy, record: Optional[dict], return_state: bool = False,
                       final_tokens=None):
    stages = None if record is None else {}
    out = mamba_mimo_fwd(*forward_args(inputs, pre), **stage2_kwargs(inputs), policy=policy, record=stages,
                         return_state=return_state, final_tokens=final_tokens)
    _store(record, "mamba_mimo_fwd", stages)
    return out.as_dict() if return_state else out.o


def run_stage1(inputs: dict, pre: dict, policy, *, backend: str = "reference",
               record: Optional[dict] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Stage 1 (``mamba_mimo_bwd_fwd``) under ``policy``: golden ``bwd_fwd`` names.

    ``backend="triton"`` runs ``mimo_numerics.kernels.mamba_mimo_bwd_fwd`` (reference chain only). ``record``
    gets ``mamba_mimo_bwd_fwd.<stage>`` (reference and kernel; none under fp64) and
    ``mamba_mimo_bwd_fwd.outputs.<name>``.
    """
    policy = _presets.resolve(policy)
    args, kw = stage1_args(inputs, pre), stage2_kwargs(inputs)
    if chain_kind(policy) == "fp64":
        result = stage1_oracle_fp64(*args, **kw).as_dict()
    elif backend == "triton":
        from ... import kernels  # imports triton only when called

        stages = None if record is None else {}
        result = kernels.mamba_mimo_bwd_fwd(*args, **kw, policy=policy, record=stages).as_dict()
        _store(record, "mamba_mimo_bwd_fwd", stages)
    else:
        result = _per_batch_slice(lambda x, p, rec: _stage1_reference_step(x, p, policy, rec), inputs, pre,
                                  record=record)
    _store(record, "mamba_mimo_bwd_fwd.outputs", result)
    return result


def _stage1_reference_step(inputs: dict, pre: dict, policy, record: Optional[dict]) -> dict:
    stages = None if record is None else {}
    out = _stage1_reference.mamba_mimo_bwd_fwd(*stage1_args(inputs, pre), **stage2_kwargs(inputs), policy=policy,
                                               record=stages)
    _store(record, "mamba_mimo_bwd_fwd", stages)
    return out.as_dict()


def run_stage2(inputs: dict, pre: dict, bwd_fwd: dict, policy, *, backend: str = "reference",
               record: Optional[dict] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Stage 2 (``mamba_mimo_bwd_bwd``) under ``policy`` on stage 1's ``states`` and ``qk_dot`` (the package's or
    upstream's recorded ones): golden ``bwd_bwd`` names. ``backend="triton"`` runs
    ``mimo_numerics.kernels.mamba_mimo_bwd_bwd`` (reference chain only; it records outputs, no stages). ``record``
    gets ``mamba_mimo_bwd_bwd.<stage>`` (reference; none under fp64) and ``mamba_mimo_bwd_bwd.outputs.<name>``."""
    policy = _presets.resolve(policy)
    if chain_kind(policy) == "fp64":
        result = dict(mamba_mimo_bwd_bwd_oracle(*stage2_args(inputs, pre, bwd_fwd), **stage2_kwargs(inputs)))
    elif backend == "triton" and not stage2_kernel_refusal(inputs):
        from ... import kernels  # imports triton only when called

        result = kernels.mamba_mimo_bwd_bwd(*stage2_args(inputs, pre, bwd_fwd), **stage2_kwargs(inputs),
                                            policy=policy).as_dict()
    else:
        result = _per_batch_slice(lambda x, p, s1, rec: _stage2_reference_step(x, p, s1, policy, rec), inputs, pre,
                                  bwd_fwd, record=record)
    _store(record, "mamba_mimo_bwd_bwd.outputs", result)
    return result


def stage2_kernel_refusal(inputs: dict):
    """Why stage 2's kernels refuse these inputs' device and sizes (``kernels.mimo_bwd_bwd.backend_refusal``: on
    Ascend beyond its tile bounds), or None; there ``backend="triton"`` runs the stage-2 reference and
    ``autograd.triton_stages`` says so."""
    from ...kernels.mimo_bwd_bwd import backend_refusal

    Q, V = inputs["Q"], inputs["V"]
    return backend_refusal(V.device.type, Q.shape[-1], V.shape[-1], inputs["chunk_size"] * Q.shape[2])


def _stage2_reference_step(inputs: dict, pre: dict, bwd_fwd: dict, policy, record: Optional[dict]) -> dict:
    stages = None if record is None else {}
    result = mamba_mimo_bwd_bwd(*stage2_args(inputs, pre, bwd_fwd), **stage2_kwargs(inputs), policy=policy,
                                record=stages).as_dict()
    _store(record, "mamba_mimo_bwd_bwd", stages)
    return result


def epilogue_reference_kwargs(policy) -> dict:
    """The FP32 epilogue reference's knobs under ``policy`` (a RoundingPolicy or a preset name): ``fma`` from
    ``helper_fma``, ``bias_sums_in_lp`` from ``round_outputs``, ``special_functions``."""
    policy = _presets.resolve(policy)
    return {"fma": policy.helper_fma == "contracted", "bias_sums_in_lp": policy.round_outputs,
            "special_functions": policy.special_functions}


def run_epilogue(inputs: dict, pre: dict, bwd_fwd: dict, bwd_bwd: dict, policy, *, backend: str = "reference",
                 record: Optional[dict] = None) -> Dict[str, Optional[torch.Tensor]]:
    """The chain after stage 2: FP32 reference or, under fp64, the FP64 oracle. The policy's ``helper_fma``
    says whether the helpers' FP32 ``a·b + c`` are contracted (upstream: Triton fuses them), and ``round_outputs``
    whether the bias sums are stored in lp (upstream 2.3.2.post1 sums dq/dk over (B, S) in bf16: an lp output
    store, so the ``fp32`` preset keeps it too).
    Returns the 14 gradients plus ``ddt_core``, ``dDT_angle`` (``mamba3_mimo_epilogue.spec.OUTPUT_NAMES``);
    ``record`` gets ``mamba3_mimo_epilogue.<name>``. ``policy``: a RoundingPolicy or a preset name.
    ``backend="triton"`` runs ``mimo_numerics.kernels.chain_steps.epilogue`` (reference chain only)."""
    policy = _presets.resolve(policy)
    args, kw = epilogue_args(inputs, pre, bwd_fwd, bwd_bwd), epilogue_kwargs(inputs)
    if chain_kind(policy) == "fp64":
        result = mamba3_mimo_epilogue_oracle(*args, **kw)
    elif backend == "triton":
        from ...kernels import chain_steps  # imports triton only when called

        result = chain_steps.epilogue(*args, **kw, policy=policy)
    else:
        result = mamba3_mimo_epilogue_reference(*args, **kw, **epilogue_reference_kwargs(policy))
    _store(record, "mamba3_mimo_epilogue", result)
    return result


def run_backward(inputs: dict, pre: dict, policy, *, backend: str = "reference",
                 record: Optional[dict] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Stage 1 -> stage 2 -> epilogue under ``policy`` from the raw inputs (with ``dout``) and the preprocessing:
    the epilogue's outputs (14 gradients, ``ddt_core``, ``dDT_angle``)."""
    bwd_fwd = run_stage1(inputs, pre, policy, backend=backend, record=record)
    bwd_bwd = run_stage2(inputs, pre, bwd_fwd, policy, backend=backend, record=record)
    return run_epilogue(inputs, pre, bwd_fwd, bwd_bwd, policy, backend=backend, record=record)


# ---------------------------------------------------------------------------------------------------- FP64 checks
def fp64_chain(inputs: dict) -> Dict[str, Optional[torch.Tensor]]:
    """The 14 gradients (and ``ddt_core``, ``dDT_angle``) by the FP64 chain: float64 preprocessing -> stage-1
    oracle -> stage-2 oracle -> epilogue oracle (upstream's backward with every step in float64)."""
    pre = preprocess(inputs, _F64)
    return run_backward(inputs, pre, "fp64")


def autograd_fp64(inputs: dict, clamp_backward: str = "upstream") -> Dict[str, Optional[torch.Tensor]]:
    """``d(Σ dout · Out)/d(input)`` of the FP64 forward model (``fp64_model.mamba3_mimo_fp64``) by torch autograd,
    by golden ``autograd`` names (None for absent inputs)."""
    leaves = {name: (None if inputs[name] is None else inputs[name].detach().to(_F64).requires_grad_(True))
              for name in OP_INPUTS}
    out = mamba3_mimo_fp64(*leaves.values(), chunk_size=inputs["chunk_size"],
                           rotary_dim_divisor=inputs["rotary_dim_divisor"], clamp_backward=clamp_backward)
    (out * inputs["dout"].to(_F64)).sum().backward()
    return {f"d{name}": (None if leaf is None else leaf.grad) for name, leaf in leaves.items()}
