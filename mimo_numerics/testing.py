"""Accuracy gates for any implementation of an operator of the op, against a rounding policy.

A kernel developer gates *their* kernel in *their* CI::

    import functools
    from mimo_numerics import testing
    testing.assert_gate(functools.partial(my_kernel, policy=...), op="<operator>", policy="upstream_sm90",
                        cases="gate", device="cuda")

``op`` is an operator of the registry (``mimo_numerics.ops.registry.OPERATORS``) by name, or its
:class:`mimo_numerics.operator.Operator`; None (the default) is ``registry.DEFAULT_OPERATOR``, backward stage 1.
For every registered operator this module also has ``check_<operator>`` and ``assert_<operator>``: :func:`check`
and :func:`assert_gate` for that operator only (the default operator's pair is the package's first public gate API).

``fn`` is any callable with the operator's reference signature: its tensors in API order (``op.input_names``) plus
the keywords of ``op.scalar_inputs`` (``chunk_size=``, ``rotary_dim_divisor=``; and ``policy=`` when
``pass_policy=True``), returning the outputs as the operator's outputs named tuple, a tuple in ``op.output_names``
order, a dict keyed by output name or, for an operator with one output, that tensor. Inputs are drawn on the CPU
(``op.draw``), copied to ``device`` for ``fn``, and its results are moved back to the CPU. The policy reference and
the FP64 oracle run on the CPU, cached per (operator, case, policy) for the process.

Every case and output is checked by structure and by two gates (``docs/gating.md`` explains the report):

* **structure**: an output is present exactly when the reference has it (branch on/off), with the reference's shape
  and dtype (``op.lp_outputs`` in the policy's ``lp_dtype``, the others in float32), on the input device, with no
  NaN/Inf where the reference is finite; ``fn`` must not modify its inputs.
* **same-policy gate**: ``rel_rms(fn, reference[P]) <= tol_same``, with
  ``tol_same = max(same_policy_rel_rms, noise_factor · noise)`` (``noise`` measured only when the error exceeds
  ``same_policy_rel_rms``, since it can only raise the tolerance). ``noise`` is this case's own FP32-order noise floor:
  the largest ``rel_rms(reference[P'], reference[P])`` over FP32-level perturbations ``P'`` of the same policy
  (:func:`noise_perturbations`: FP64 intermediate math, the other ``state_update`` order, a permuted state-dim
  summation order), where one flipped lp rounding can cascade into many outputs.
* **noise-floor gate** (flash-attention / PyTorch style):
  ``rel_rms(fn, oracle) <= alpha · rel_rms(reference[P], oracle) + floor``: a kernel may not be less accurate than
  the policy it claims.

``tol_same``, ``noise_factor``, ``alpha`` and ``floor`` default to ``mimo_numerics.tolerances.gate_settings(operator,
output, lp format)``: the most specific of the entries keyed by operator, output and format, falling back to the
generic ``same_policy_rel_rms``, ``gate_same_policy_noise_factor``, ``gate_oracle_alpha``, ``gate_oracle_floor``;
the measurements behind them are recorded there and :func:`measure_gate_noise` reproduces them. A gate fails, never
warns.

The module is the public entry point; the parts live by concern in ``gate_cases`` (cases, cached inputs, reference
and oracle), ``gate_settings`` (the thresholds), ``gate_noise`` (the FP32-order noise floor and its measurement),
``gate_checks`` (running one case, checking one output), ``gate_report`` (results and the report table),
``gate_nearest`` (the nearest-preset hint) and ``gate_devices``.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Tuple, Union

import torch

from . import operator as _operator
from . import presets as _presets
from .gate_cases import (CasesLike, OperatorLike, PolicyLike, as_output_dict, case_inputs, clear_case_cache,
                         oracle_outputs, policy_label, reference_outputs, resolve_cases)
from .gate_checks import DTYPE_MISMATCH, run_case
from .gate_devices import DeviceUnavailableError, check_device
from .gate_nearest import (NEAREST_PRESET_FACTOR, NEAREST_PRESET_MAX_CASES, NEAREST_PRESET_MAX_SIZE, PresetMatch,
                           nearest_preset)
from .gate_noise import (clear_noise_cache, measure_gate_noise, noise_perturbations, permute_state_dim, self_noise,
                         state_dim_axes)
from .gate_report import FAILURE_WIDTH, CaseResult, GateReport, OutputCheck
from .gate_settings import GateSettings, SettingsByOutput
from .ops import registry

__all__ = [
    "check", "assert_gate", "GateReport", "CaseResult", "OutputCheck", "GateSettings", "resolve_cases",
    "case_inputs", "reference_outputs", "oracle_outputs", "self_noise", "noise_perturbations", "permute_state_dim",
    "state_dim_axes", "measure_gate_noise", "clear_cache", "policy_label", "check_device", "DeviceUnavailableError",
    "as_output_dict", "PresetMatch", "nearest_preset", "FAILURE_WIDTH", "NEAREST_PRESET_MAX_CASES",
    "NEAREST_PRESET_MAX_SIZE", "NEAREST_PRESET_FACTOR",
]


def clear_cache() -> None:
    """Forget the cached inputs, reference, oracle and noise results of this process."""
    clear_case_cache()
    clear_noise_cache()


# ---------------------------------------------------------------------------------------------------- the gate
def check(fn: Callable, *, op: OperatorLike = None, policy: PolicyLike, cases: CasesLike = "gate",
          device: Union[None, str, torch.device] = None, alpha: Optional[float] = None,
          floor: Optional[float] = None, tol_same: Optional[float] = None, noise_factor: Optional[float] = None,
          pass_policy: bool = False, dtype_mismatch: str = "skip") -> GateReport:
    """Run ``fn`` over ``cases`` and check it against ``op``'s reference under ``policy``; never raises for a
    failing ``fn``.

    Args:
        fn: the implementation under test: ``fn(*op.input_names tensors, chunk_size=, rotary_dim_divisor=)``
            returning ``op``'s outputs (its named tuple, a tuple in ``op.output_names`` order, a dict by name, or the
            tensor of a one-output operator). Wrap kernels that take a policy with
            ``functools.partial(kernel, policy=...)``, or set ``pass_policy``.
        op: the operator ``fn`` implements: a registered name or an ``Operator``; default
            ``registry.DEFAULT_OPERATOR`` (backward stage 1).
        policy: the policy ``fn`` claims to implement: a preset name, a ``RoundingPolicy`` or a policy JSON path; it
            must define ``op``'s section.
        cases: a grid name of ``op`` (``op.cases``: ``"smoke"``, ``"gate"``, ``"sweep"``, ...), a case spec or a list
            of them.
        device: where ``fn`` runs (``"cpu"``, ``"cuda"``, ``"npu"``, ...; default ``"cpu"``). Inputs are copied
            there and results moved back; the reference and oracle always run on the CPU.
        alpha, floor: noise-floor gate ``rel_rms(fn, fp64) <= alpha·rel_rms(ref[P], fp64) + floor``; default
            ``tolerances.gate_settings(op, output, lp format)`` (entries ``gate_oracle_alpha``, ``gate_oracle_floor``
            or their operator-, output- and format-keyed forms).
        tol_same: lower bound of the same-policy tolerance; default entry ``same_policy_rel_rms`` (or keyed forms).
        noise_factor: the same-policy tolerance is ``max(tol_same, noise_factor·noise)``; default entry
            ``gate_same_policy_noise_factor`` (or keyed forms); 0 disables the per-case noise floor.
        pass_policy: also pass ``policy=`` (the case's policy) to ``fn``.
        dtype_mismatch: cases whose dtype differs from ``policy.lp_dtype`` are ``"skip"``-ped (reported) or, with
            ``"adapt"``, gated under ``policy.replace(lp_dtype=case.dtype)`` (use with ``pass_policy=True``).

    Returns:
        GateReport: ``report.passed``, ``report.table()``, ``report.failures()``, ``report.to_dict()``.

    Raises:
        TypeError, ValueError: for bad arguments (not for a failing ``fn``): an unknown operator, a policy that
        defines no semantics for it (``PolicyUndefined``), an unknown grid; ``DeviceUnavailableError`` (a
        ``ValueError``) when ``device`` cannot be used here. All before any case runs.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    policy.section(op.name)  # PolicyUndefined (a ValueError) naming the operator, before any case runs
    case_list = resolve_cases(cases, op)
    if dtype_mismatch not in DTYPE_MISMATCH:
        raise ValueError(f"dtype_mismatch must be one of {DTYPE_MISMATCH}, got {dtype_mismatch!r}")
    overrides = {"tol_same": tol_same, "noise_factor": noise_factor, "alpha": alpha, "floor": floor}
    settings = GateSettings.from_table(**overrides, op=op)
    settings_of = SettingsByOutput(op, overrides)
    dev = check_device("cpu" if device is None else device)
    results = [run_case(fn, case, policy, dev, settings_of, pass_policy, dtype_mismatch, op) for case in case_list]
    return GateReport(policy=policy, device=str(dev), settings=settings, cases=results, operator=op.name)


def assert_gate(fn: Callable, **kwargs) -> GateReport:
    """:func:`check`, raising ``AssertionError`` with the per-case, per-output table of the failing cases (and
    tracebacks of ``fn``) when a gate fails or no case ran. Returns the report otherwise."""
    return check(fn, **kwargs).raise_if_failed()


# ---------------------------------------------------------------------------------------------------- per operator
def _operator_gates(name: str) -> Tuple[Callable, Callable]:
    """``check_<name>`` and ``assert_<name>``: :func:`check` and :func:`assert_gate` for operator ``name`` only."""

    def check_operator(fn: Callable, **kwargs) -> GateReport:
        if "op" in kwargs:
            raise TypeError(f"check_{name} gates {name} only; use testing.check(fn, op=...) for another operator")
        return check(fn, op=name, **kwargs)

    def assert_operator(fn: Callable, **kwargs) -> GateReport:
        return check_operator(fn, **kwargs).raise_if_failed()

    signature = inspect.signature(check)
    without_op = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "op"])
    for function, base, verb in ((check_operator, "check", "Gate"), (assert_operator, "assert_gate", "Assert")):
        function.__name__ = function.__qualname__ = f"{base.split('_')[0]}_{name}"
        function.__signature__ = without_op
        function.__doc__ = (f"{verb} an implementation of operator ``{name}``: :func:`{base}` with ``op=\"{name}\"``"
                            f" (same arguments but ``op``; see :func:`{base}` and ``docs/gating.md``).")
    return check_operator, assert_operator


for _name in registry.OPERATORS:
    globals()[f"check_{_name}"], globals()[f"assert_{_name}"] = _operator_gates(_name)
    __all__ += [f"check_{_name}", f"assert_{_name}"]
del _name
