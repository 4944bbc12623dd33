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
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import textwrap
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import operator as _operator
from . import presets as _presets
from . import tolerances as _tolerances
from .metrics import max_abs, rel_rms
from .ops import registry
from .policy import ALL_KNOBS, RoundingPolicy

__all__ = [
    "check", "assert_gate", "GateReport", "CaseResult", "OutputCheck", "GateSettings", "resolve_cases",
    "case_inputs", "reference_outputs", "oracle_outputs", "self_noise", "noise_perturbations", "permute_state_dim",
    "state_dim_axes", "measure_gate_noise", "clear_cache", "policy_label", "check_device", "DeviceUnavailableError",
]

OperatorLike = Union[None, str, "_operator.Operator"]
CasesLike = Union[str, Any, Iterable[Any]]
PolicyLike = Union[str, RoundingPolicy]

_DTYPE_MISMATCH = ("skip", "adapt")


# ---------------------------------------------------------------------------------------------------- devices
class DeviceUnavailableError(ValueError):
    """``device`` cannot run anything here (unknown type, no such device, backend package missing).

    Attributes:
        device (str): the device as given. reason (str): what is wrong. hint (str): what to do about it.
    """

    def __init__(self, device: str, reason: str, hint: str):
        super().__init__(f"device {device!r}: {reason} (hint: {hint})")
        self.device, self.reason, self.hint = device, reason, hint


def _device_index_error(text: str, dev: torch.device, count: int) -> Optional[DeviceUnavailableError]:
    if dev.index is None or dev.index < count:
        return None
    return DeviceUnavailableError(text, f"torch sees {count} {dev.type} device(s) here, so index {dev.index} does "
                                        f"not exist", f"use {dev.type}:0 .. {dev.type}:{count - 1}")


def check_device(device: Union[str, torch.device]) -> torch.device:
    """``device`` as a ``torch.device`` when torch can run on it here; :class:`DeviceUnavailableError` otherwise.

    Checked once, before any case runs, by the CLI, the pytest plugin and :func:`check`, so an
    absent CUDA device or a missing ``torch_npu`` is one clear message instead of a torch traceback per case.
    """
    text = str(device)
    if text.split(":")[0] == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device type with torch)
        except ImportError:
            raise DeviceUnavailableError(text, "torch_npu is not installed (torch knows npu devices only through "
                                               "it)", "on an Ascend machine: pip install 'mimo_numerics[npu]'") \
                from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceUnavailableError(text, "not a torch device", "use cpu, cuda, cuda:N or npu") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = ("this torch build has no CUDA support" if torch.version.cuda is None and
                     getattr(torch.version, "hip", None) is None else "torch.cuda.is_available() is False")
            raise DeviceUnavailableError(text, f"torch has no CUDA device here ({built}; torch {torch.__version__})",
                                         "run on cpu, or on a machine with an NVIDIA GPU and a CUDA build of torch")
        error = _device_index_error(text, dev, torch.cuda.device_count())
        if error is not None:
            raise error
        return dev
    if dev.type == "npu":
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            raise DeviceUnavailableError(text, "torch_npu is installed but sees no NPU here",
                                         "run on cpu, or on an Ascend machine with its driver loaded")
        error = _device_index_error(text, dev, npu.device_count())
        if error is not None:
            raise error
        return dev
    if dev.type == "meta":
        raise DeviceUnavailableError(text, "meta tensors hold no values, so nothing can be compared",
                                     "use cpu, cuda or npu")
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DeviceUnavailableError(text, f"torch cannot allocate on {dev.type} here ({first})",
                                     "use cpu, cuda or npu") from None
    return dev


# ---------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class GateSettings:
    """The thresholds one gate applies.

    Attributes:
        tol_same (float): lower bound of the same-policy tolerance (rel RMS against ``reference[P]``).
        noise_factor (float): the same-policy tolerance is ``max(tol_same, noise_factor · noise)``; 0 turns the
            per-case noise floor off.
        alpha (float): noise-floor gate factor on ``rel_rms(reference[P], oracle)``.
        floor (float): noise-floor gate additive term (rel RMS).
        entries (tuple): ``(setting, tolerances entry)`` pairs for the values read from ``mimo_numerics.tolerances``
            (a value given by the caller has none); not compared.
    """

    tol_same: float
    noise_factor: float
    alpha: float
    floor: float
    entries: Tuple[Tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def from_table(cls, tol_same=None, noise_factor=None, alpha=None, floor=None, op: OperatorLike = None,
                   output: Optional[str] = None, fmt: Optional[str] = None) -> "GateSettings":
        """Settings with every ``None`` taken from ``tolerances.gate_settings(op, output, fmt)`` (the most specific
        entry for the operator, output and lp format; ``op=None``: the default operator)."""
        table = _tolerances.gate_settings(_operator.get(op).name, output, fmt)
        given = {"tol_same": tol_same, "noise_factor": noise_factor, "alpha": alpha, "floor": floor}
        values = {k: (table[k][0] if v is None else v) for k, v in given.items()}
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if values["alpha"] < 1.0:
            raise ValueError(f"alpha must be >= 1 (a kernel may be as accurate as its policy), got {values['alpha']}")
        entries = tuple((k, table[k][1]) for k, v in given.items() if v is None)
        return cls(**{k: float(v) for k, v in values.items()}, entries=entries)

    def formulas(self) -> Tuple[str, str]:
        """The two gate formulas with these numbers: ``(same-policy, noise floor)``."""
        return (f"same-policy: rel_rms(fn, ref[P]) <= max({self.tol_same:.1e}, {self.noise_factor:g}·noise)",
                f"noise floor: rel_rms(fn, fp64) <= {self.alpha:g}·rel_rms(ref[P], fp64) + {self.floor:.1e}")

    def describe(self) -> str:
        """The two gate formulas with these numbers, on one line."""
        return "; ".join(self.formulas())

    def to_dict(self) -> dict:
        """The four values and the tolerance entries they came from."""
        return {"tol_same": self.tol_same, "noise_factor": self.noise_factor, "alpha": self.alpha,
                "floor": self.floor, "entries": dict(self.entries)}


class _SettingsByOutput:
    """The settings of each (output, lp format) of one gate run: the caller's values, the rest from the table."""

    def __init__(self, op, overrides: Mapping[str, Optional[float]]):
        self._op, self._overrides, self._cache = op, dict(overrides), {}

    def __call__(self, output: Optional[str] = None, fmt: Optional[str] = None) -> GateSettings:
        key = (output, fmt)
        if key not in self._cache:
            self._cache[key] = GateSettings.from_table(**self._overrides, op=self._op, output=output, fmt=fmt)
        return self._cache[key]


# ---------------------------------------------------------------------------------------------------- cases
def _case_types(op) -> tuple:
    """The case-spec classes of ``op``'s grids (a subclass, e.g. a stored golden case, is accepted too)."""
    types: List[type] = []
    for specs in op.load("grids")().values():
        for spec in specs:
            if type(spec) not in types:
                types.append(type(spec))
    return tuple(types)


def resolve_cases(cases: CasesLike, op: OperatorLike = None) -> tuple:
    """A grid name of ``op`` (``op.cases(name)``: ``"smoke"``, ``"gate"``, ``"sweep"``, ...), one case spec or an
    iterable of them, as a tuple.

    Raises:
        ValueError: unknown grid name (listing ``op``'s grids) or an empty list. TypeError: an element that is not a
            case spec of ``op`` (the classes of its grids' specs, e.g. ``CaseSpec``).
    """
    op = _operator.get(op)
    if isinstance(cases, str):
        return op.cases(cases)
    types = _case_types(op)
    if isinstance(cases, types):
        return (cases,)
    try:
        items = tuple(cases)
    except TypeError:
        raise TypeError(f"cases must be a grid name, a case spec ({_type_names(types)}) or an iterable of them, got "
                        f"{type(cases).__name__}") from None
    if not items:
        raise ValueError("cases is empty: give a grid name or at least one case spec")
    for item in items:
        if not isinstance(item, types):
            raise TypeError(f"every case must be a {_type_names(types)} (a case spec of {op.name}), got "
                            f"{type(item).__name__} ({item!r})")
    return items


def _type_names(types: tuple) -> str:
    return " or ".join(t.__name__ for t in types)


# ---------------------------------------------------------------------------------------------------- caches
# Keys start with the operator's name: one case spec gives different inputs to different operators.
_INPUTS: Dict[tuple, dict] = {}
_ORACLE: Dict[tuple, Any] = {}
_REFERENCE: Dict[tuple, Any] = {}
_NOISE: Dict[tuple, Dict[str, Tuple[float, str]]] = {}
_PERTURBED: Dict[tuple, Dict[str, Any]] = {}


def clear_cache() -> None:
    """Forget the cached inputs, reference, oracle and noise results of this process."""
    for cache in (_INPUTS, _ORACLE, _REFERENCE, _NOISE, _PERTURBED):
        cache.clear()


def case_inputs(case, op: OperatorLike = None) -> dict:
    """The CPU inputs of ``case`` for ``op`` (cached; treat them as read-only, the gate hands ``fn`` copies)."""
    op = _operator.get(op)
    key = (op.name, case)
    if key not in _INPUTS:
        _INPUTS[key] = op.draw(case, "cpu")
    return _INPUTS[key]


def reference_outputs(case, policy: PolicyLike, op: OperatorLike = None):
    """``op``'s policy reference on ``case`` under ``policy``, on the CPU, as the reference returns it (cached per
    (operator, case, policy))."""
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    key = (op.name, case, policy)
    if key not in _REFERENCE:
        inputs = case_inputs(case, op)
        with torch.no_grad():
            _REFERENCE[key] = op.run_reference(inputs, policy)
    return _REFERENCE[key]


def oracle_outputs(case, op: OperatorLike = None):
    """``op``'s FP64 oracle on ``case``, on the CPU, as the oracle returns it (a named tuple, a dict by output name
    or, for a one-output operator, the tensor; cached per (operator, case))."""
    op = _operator.get(op)
    key = (op.name, case)
    if key not in _ORACLE:
        inputs = case_inputs(case, op)
        with torch.no_grad():
            _ORACLE[key] = op.run_oracle(inputs)
    return _ORACLE[key]


# ---------------------------------------------------------------------------------------------------- noise
#: Shape letters of a state-dimension axis: ``N`` itself and ``N/d``, the rotary angles (one per pair of columns).
_STATE_LETTERS = ("N", "N/d")


def _state_axis(letters: Sequence[str], where: str) -> Optional[Tuple[int, bool]]:
    """``(axis counted from the end, paired)`` of the state-dimension letter of one tensor, None without one."""
    found = [(i, letter) for i, letter in enumerate(letters) if letter in _STATE_LETTERS]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"{where} has {len(found)} state-dimension axes {list(letters)}; the permutation handles one")
    index, letter = found[0]
    if any(letter_.startswith("(") for letter_ in letters[index + 1:]):
        raise ValueError(f"{where}: an optional axis after the state dimension ({list(letters)}) leaves its position "
                         "from the end undetermined")
    return index - len(letters), letter == "N/d"


def state_dim_axes(op: OperatorLike = None) -> Tuple[Dict[str, Tuple[int, bool]], Dict[str, Tuple[int, bool]]]:
    """The tensors of ``op`` indexed by the state dimension N, from their shape letters.

    Inputs' letters are the spec's ``extra["input_shapes"]``, outputs' are ``op.outputs[i].shape``. A letter ``N``
    is the state dimension; ``N/d`` is the rotary angles', one per rotated pair of columns ``(j, N/2 + j)``,
    ``j < N/d``.

    Returns:
        tuple: ``(inputs, outputs)``, each ``{name: (axis, paired)}`` with ``axis`` counted from the end (negative)
        and ``paired`` true for an ``N/d`` axis.

    Raises:
        ValueError: the operator declares no input shapes (naming it).
    """
    op = _operator.get(op)
    shapes = op.extra.get("input_shapes")
    if shapes is None:
        raise ValueError(f"operator {op.name} declares no input shapes (its spec's extra['input_shapes']), so its "
                         "state dimension cannot be permuted")
    inputs = {name: _state_axis(tuple(shapes[name]), f"input {name} of {op.name}") for name in op.input_names}
    outputs = {o.name: _state_axis(o.shape, f"output {o.name} of {op.name}") for o in op.outputs}
    return ({k: v for k, v in inputs.items() if v is not None}, {k: v for k, v in outputs.items() if v is not None})


def _state_permutation(n: int, width: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(perm, pair_perm)``: a permutation of the N columns that maps rotary pairs ``(j, N/2 + j)``, ``j < width``,
    to rotary pairs (``pair_perm`` permutes ``j``) and the other columns among themselves."""
    half = n // 2
    gen = torch.Generator().manual_seed(seed)
    pair_perm = torch.randperm(width, generator=gen)
    free = torch.tensor([j for j in range(n) if not (j < width or half <= j < half + width)], dtype=torch.long)
    perm = torch.arange(n)
    perm[:width] = pair_perm
    perm[half:half + width] = half + pair_perm
    if free.numel():
        perm[free] = free[torch.randperm(free.numel(), generator=gen)]
    return perm, pair_perm


def _state_sizes(tensors: Mapping[str, Optional[torch.Tensor]], axes: Mapping[str, Tuple[int, bool]],
                 op_name: str) -> Tuple[int, int]:
    """``(N, N/d)`` read off the inputs (``N/d`` = 0 without an angles input); ValueError when they disagree."""
    sizes: Dict[bool, Tuple[int, str]] = {}
    for name, (axis, paired) in axes.items():
        tensor = tensors[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        size = tensor.shape[axis]
        if paired in sizes and sizes[paired][0] != size:
            raise ValueError(f"{op_name}: input {name} has {'N/d' if paired else 'N'} = {size} but "
                             f"{sizes[paired][1]} has {sizes[paired][0]}")
        sizes.setdefault(paired, (size, name))
    if False not in sizes:
        raise ValueError(f"{op_name}: no input with a state-dimension axis was given")
    n, width = sizes[False][0], sizes.get(True, (0, ""))[0]
    if 2 * width > n:
        raise ValueError(f"{op_name}: N/d = {width} rotary pairs do not fit N = {n} columns")
    return n, width


def permute_state_dim(fn: Callable, seed: int = 0, op: OperatorLike = None) -> Callable:
    """Wrap ``fn`` so that it computes the same function with the state dimension N permuted.

    Every sum over N (dot products of q and k, the scores, the state GEMMs) then runs in another FP32 order, while
    the math is unchanged: the permutation maps rotary pairs ``(j, N/2 + j)``, ``j < N/d``, to rotary pairs
    (permuting the ``N/d`` axis of the angles with them) and the other columns among themselves. Which inputs and
    outputs have an N axis comes from the operator's shape letters (:func:`state_dim_axes`); the outputs' N axes are
    permuted back. This models a correct kernel that sums in a different order.

    Args:
        fn: an implementation of ``op`` (signature as for :func:`check`).
        seed (int): seed of the permutation.
        op: the operator (default ``registry.DEFAULT_OPERATOR``).

    Returns:
        callable: same signature as ``fn``; returns ``fn``'s result in the form ``fn`` returned it (named tuple,
        dict or tuple) with the outputs' N axes restored.
    """
    op = _operator.get(op)
    in_axes, out_axes = state_dim_axes(op)
    names = op.input_names

    @functools.wraps(fn)
    def permuted(*tensors, **kwargs):
        if len(tensors) != len(names):
            raise TypeError(f"{op.name} takes {len(names)} tensors {list(names)}, got {len(tensors)}")
        given = dict(zip(names, tensors))
        n, width = _state_sizes(given, in_axes, op.name)
        perm, pair_perm = _state_permutation(n, width, seed)
        orders = {False: perm, True: pair_perm}
        args = []
        for name, tensor in given.items():
            if name in in_axes and isinstance(tensor, torch.Tensor):
                axis, paired = in_axes[name]
                tensor = tensor.index_select(axis, orders[paired].to(tensor.device)).contiguous()
            args.append(tensor)
        result = fn(*args, **kwargs)
        outs = _as_output_dict(result, op)
        restored = {}
        for name, (axis, paired) in out_axes.items():
            value = outs[name]
            if isinstance(value, torch.Tensor):
                inverse = torch.argsort(orders[paired]).to(value.device)
                restored[name] = value.index_select(axis, inverse).contiguous()
        return _with_outputs(result, outs, restored, op)

    return permuted


def _with_outputs(result, outs: Dict[str, Any], changes: Dict[str, Any], op):
    """``result`` (as ``fn`` returned it) with some outputs replaced."""
    if not changes:
        return result
    if hasattr(result, "_replace"):
        return result._replace(**changes)
    merged = dict(outs, **changes)
    if isinstance(result, Mapping):
        return merged
    if isinstance(result, torch.Tensor):
        return merged[op.output_names[0]]
    return tuple(merged[n] for n in op.output_names)


def noise_perturbations(policy: PolicyLike, op: OperatorLike = None) -> Dict[str, Callable]:
    """FP32-level perturbations of ``op``'s reference under ``policy``: implementations of the same rounding policy.

    Returns:
        dict: label -> callable with the reference's signature: ``"fp64_math"`` (the same roundings with FP64
        intermediate math; when ``math_dtype`` acts on ``op`` and is ``"float32"``), ``"state_update"`` (the other
        ``state_update`` order, when that knob acts on ``op``: the two differ only in FP32 summation order),
        ``"state_dim_order"`` (:func:`permute_state_dim`, when ``op`` has inputs with an N axis).
    """
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    reference = op.load("reference")
    variants = {}
    if "math_dtype" in op.knobs and policy.math_dtype == "float32":
        variants["fp64_math"] = functools.partial(reference, policy=policy.replace(math_dtype="float64"))
    if "state_update" in op.knobs:
        other = "separate" if policy.state_update == "accumulate_into" else "accumulate_into"
        variants["state_update"] = functools.partial(reference, policy=policy.replace(state_update=other))
    if op.extra.get("input_shapes") is not None and state_dim_axes(op)[0]:
        variants["state_dim_order"] = permute_state_dim(functools.partial(reference, policy=policy), seed=0, op=op)
    return variants


def _perturbed_outputs(case, policy: RoundingPolicy, op) -> Dict[str, Any]:
    key = (op.name, case, policy)
    if key not in _PERTURBED:
        inputs = case_inputs(case, op)
        with torch.no_grad():
            _PERTURBED[key] = {label: variant(*op.args(inputs), **op.kwargs(inputs))
                               for label, variant in noise_perturbations(policy, op).items()}
    return _PERTURBED[key]


def self_noise(case, policy: PolicyLike, op: OperatorLike = None) -> Dict[str, Tuple[float, str]]:
    """This case's FP32-order noise floor per output: ``max rel_rms(reference[P'], reference[P])`` over
    :func:`noise_perturbations`, with the label of the largest (cached per (operator, case, policy)).

    Returns:
        dict: output name -> ``(noise, label)``; ``(0.0, "")`` where every perturbation is bit-equal, and for
        absent outputs.
    """
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    key = (op.name, case, policy)
    if key not in _NOISE:
        ref = _as_output_dict(reference_outputs(case, policy, op), op)
        noise = {name: (0.0, "") for name in op.output_names}
        for label, out in _perturbed_outputs(case, policy, op).items():
            out = _as_output_dict(out, op)
            for name in op.output_names:
                expected, got = ref[name], out[name]
                if expected is None or got is None:
                    continue
                value = rel_rms(got, expected)
                if value > noise[name][0]:
                    noise[name] = (value, label)
        _NOISE[key] = noise
    return _NOISE[key]


# ---------------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class OutputCheck:
    """The checks of one output of one case.

    Attributes:
        output (str): the output name.
        status (str): ``"pass"``, ``"FAIL"`` or ``"absent"`` (None in both ``fn`` and the reference).
        problems (tuple of str): why it failed (structure or gate), empty when it passed.
        notes (tuple of str): remarks that do not fail the check (e.g. non-finite reference elements).
        err_same (float): ``rel_rms(fn, reference[P])`` (nan when not computable).
        noise (float): this case's FP32-order noise floor of the output (:func:`self_noise`); measured only when
            ``err_same`` exceeds ``settings.tol_same`` (nan otherwise: it could not change the verdict).
        noise_source (str): the perturbation that produced ``noise``.
        tol_same (float): ``max(settings.tol_same, settings.noise_factor · noise)``.
        tol_base (float): ``settings.tol_same`` of this output (the tolerance before the noise floor).
        tol_entry (str): the ``mimo_numerics.tolerances`` entry of ``tol_base`` (the most specific entry for the
            operator, output and format; ``""`` when the caller gave ``tol_same``).
        err_oracle (float): ``rel_rms(fn, oracle)``.
        ref_err_oracle (float): ``rel_rms(reference[P], oracle)``.
        bound_oracle (float): ``alpha · ref_err_oracle + floor``.
        max_abs (float): ``max |fn - reference[P]|``.
        bit_equal (float): fraction of elements bit-equal to ``reference[P]`` (nan when the dtypes differ).
        nonfinite (int): NaN/Inf elements of ``fn`` where the reference is finite.
    """

    output: str
    status: str
    problems: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    err_same: float = math.nan
    noise: float = math.nan
    noise_source: str = ""
    tol_same: float = math.nan
    tol_base: float = math.nan
    tol_entry: str = ""
    err_oracle: float = math.nan
    ref_err_oracle: float = math.nan
    bound_oracle: float = math.nan
    max_abs: float = math.nan
    bit_equal: float = math.nan
    nonfinite: int = 0

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"

    @property
    def same_use(self) -> float:
        """``err_same / tol_same`` (> 1 fails the same-policy gate)."""
        return _ratio(self.err_same, self.tol_same)

    @property
    def oracle_use(self) -> float:
        """``err_oracle / bound_oracle`` (> 1 fails the noise-floor gate)."""
        return _ratio(self.err_oracle, self.bound_oracle)

    @property
    def oracle_ratio(self) -> float:
        """``err_oracle / ref_err_oracle``: fn's error relative to the policy's own (1.0 for the reference)."""
        return _ratio(self.err_oracle, self.ref_err_oracle)

    @property
    def oracle_limit(self) -> float:
        """``bound_oracle / ref_err_oracle``: the largest ``oracle_ratio`` the noise-floor gate accepts."""
        return _ratio(self.bound_oracle, self.ref_err_oracle)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["problems"], out["notes"] = list(self.problems), list(self.notes)
        for key in ("same_use", "oracle_use", "oracle_ratio", "oracle_limit"):
            out[key] = getattr(self, key)
        return out


def _ratio(num: float, den: float) -> float:
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


@dataclass
class CaseResult:
    """The checks of one case.

    Attributes:
        case: the case spec (a ``CaseSpec`` or another spec class of the operator's grids).
        policy (RoundingPolicy | None): the policy the case was gated under (None when skipped).
        outputs (list of OutputCheck): one per output name, in ``op.output_names`` order (empty when ``fn``
            raised).
        problems (list of str): case-level failures: ``fn`` raised, returned something unusable, modified inputs.
        skipped (str | None): why the case was not run.
        traceback (str | None): the traceback when ``fn`` raised.
        seconds (float): wall time of ``fn`` plus moving its results to the CPU.
        fn_outputs (dict | None): CPU copies of ``fn``'s output tensors, kept for failing cases only (for
            :meth:`GateReport.nearest_presets`); not part of ``to_dict``.
    """

    case: Any
    policy: Optional[RoundingPolicy]
    outputs: List[OutputCheck] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    skipped: Optional[str] = None
    traceback: Optional[str] = None
    seconds: float = 0.0
    fn_outputs: Optional[Dict[str, torch.Tensor]] = field(default=None, repr=False, compare=False)

    @property
    def case_id(self) -> str:
        return self.case.case_id

    @property
    def passed(self) -> bool:
        """True when not skipped and every check passed."""
        return self.skipped is None and not self.problems and all(o.passed for o in self.outputs)

    @property
    def failed(self) -> bool:
        return self.skipped is None and not self.passed

    def to_dict(self) -> dict:
        return {"case_id": self.case_id, "case": self.case.to_dict(),
                "policy": None if self.policy is None else self.policy.to_dict(),
                "passed": self.passed, "skipped": self.skipped, "problems": list(self.problems),
                "traceback": self.traceback, "seconds": self.seconds,
                "outputs": [o.to_dict() for o in self.outputs]}


def policy_label(policy: RoundingPolicy, op: OperatorLike = None) -> str:
    """:func:`mimo_numerics.presets.label` of ``policy`` on operator ``op`` (its section and the knobs)."""
    return _presets.label(policy, operator=_operator.get(op).name)


# ---------------------------------------------------------------------------------------------------- nearest preset
#: At most this many failing cases (the smallest) are compared with every preset's reference.
NEAREST_PRESET_MAX_CASES = 3
#: Failing cases larger than this (B·S·H·max(N, P) elements) are not compared with the presets (CPU cost).
NEAREST_PRESET_MAX_SIZE = 1 << 20
#: A preset is named in the failure message only when ``fn`` is at least this many times nearer to it than to the
#: claimed policy (a hint, not a gate: a kernel broken in another way is about as far from every preset).
NEAREST_PRESET_FACTOR = 2.0


@dataclass(frozen=True)
class PresetMatch:
    """How close ``fn``'s outputs on one failing case are to the claimed policy and to the nearest other preset.

    Attributes:
        case_id (str): the case.
        claimed (RoundingPolicy): the policy the case was gated under.
        claimed_distance (float): mean over outputs of ``rel_rms(fn, reference[claimed])``.
        nearest (str): label of the nearest other preset (``"seed_bf16"``, or ``"seed_bf16 at lp_dtype=float16"``
            when the preset was adapted to the case's dtype).
        nearest_policy (RoundingPolicy): that preset (adapted).
        nearest_distance (float): mean over outputs of ``rel_rms(fn, reference[nearest])``.
        operator (str | None): the gated operator (None: the default operator); :meth:`differences` names its
            sites and the knobs.
    """

    case_id: str
    claimed: RoundingPolicy
    claimed_distance: float
    nearest: str
    nearest_policy: RoundingPolicy
    nearest_distance: float
    operator: Optional[str] = None

    @property
    def better(self) -> bool:
        """True when ``fn`` is at least ``NEAREST_PRESET_FACTOR`` times nearer to the other preset than to the
        claimed policy."""
        return self.nearest_distance * NEAREST_PRESET_FACTOR <= self.claimed_distance and self.claimed_distance > 0

    def differences(self) -> str:
        """The knobs and sites of the operator in which the nearest preset differs from the claimed policy, as
        ``field=value`` (nearest's)."""
        diff = self.nearest_policy.diff(self.claimed, operator=_operator.get(self.operator).name)
        return ", ".join(f"{k}={v[0]}" for k, v in diff.items())


def _outputs_distance(got: Mapping[str, torch.Tensor], ref: Mapping[str, Optional[torch.Tensor]]) -> float:
    """Mean over the outputs both have (same shape) of ``rel_rms`` on the elements finite in both; nan if none."""
    values = []
    for name, tensor in got.items():
        expected = ref[name]
        if expected is None or tuple(expected.shape) != tuple(tensor.shape):
            continue
        mask = torch.isfinite(tensor) & torch.isfinite(expected)
        if bool(mask.any()):
            values.append(rel_rms(tensor[mask], expected[mask]))
    return sum(values) / len(values) if values else math.nan


def _candidate_presets(policy: RoundingPolicy, op) -> List[Tuple[str, RoundingPolicy]]:
    """Every preset that defines ``op`` and computes something other than ``policy`` there, at ``policy``'s lp_dtype
    (presets of that dtype first; presets equal on ``op``'s section and the knobs counted once)."""
    def numerics(p: RoundingPolicy) -> tuple:
        return p.section(op.name), tuple(getattr(p, knob) for knob in ALL_KNOBS)

    found: List[Tuple[str, RoundingPolicy]] = []
    seen = {numerics(policy)}
    names = sorted(_presets.names(), key=lambda n: _presets.get(n).lp_dtype != policy.lp_dtype)
    for name in names:
        preset = _presets.get(name)
        if not preset.defines(op.name):
            continue
        label = name
        if preset.lp_dtype != policy.lp_dtype:
            preset = preset.replace(lp_dtype=policy.lp_dtype)
            label = f"{name} at lp_dtype={policy.lp_dtype}"
        key = numerics(preset)
        if key not in seen:
            seen.add(key)
            found.append((label, preset))
    return found


def _case_size(case, op) -> int:
    """B·S·H·max(N, P) of a case spec; the largest input's element count for specs without those sizes."""
    try:
        return case.batch * case.seqlen * case.heads * max(case.state_dim, case.value_dim)
    except AttributeError:
        tensors = [t for t in case_inputs(case, op).values() if isinstance(t, torch.Tensor)]
        return max((t.numel() for t in tensors), default=0)


def nearest_preset(case, policy: RoundingPolicy, fn_outputs: Mapping[str, torch.Tensor], op: OperatorLike = None
                   ) -> Optional[PresetMatch]:
    """Compare ``fn``'s outputs on ``case`` with ``op``'s reference under every preset that defines ``op`` (CPU,
    cached per (case, preset)).

    Returns:
        PresetMatch | None: the nearest other preset by mean rel RMS, None when no output could be compared.
    """
    op = _operator.get(op)
    claimed = _outputs_distance(fn_outputs, _as_output_dict(reference_outputs(case, policy, op), op))
    if math.isnan(claimed):
        return None
    best = None
    for label, candidate in _candidate_presets(policy, op):
        distance = _outputs_distance(fn_outputs, _as_output_dict(reference_outputs(case, candidate, op), op))
        if not math.isnan(distance) and (best is None or distance < best[2]):
            best = (label, candidate, distance)
    if best is None:
        return None
    return PresetMatch(case.case_id, policy, claimed, best[0], best[1], best[2], operator=op.name)


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.2e}"


def _num(x: float) -> str:
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.4f}"


def _pct(x: float) -> str:
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{100 * x:.0f}%"


_COLUMNS = ("case", "output", "status", "vs ref[P]", "noise", "tol", "use", "vs fp64", "ref vs fp64", "ratio",
            "limit", "bit-eq", "note")
_GATE_NAMES = ("same-policy gate", "noise-floor gate")


#: Width of :meth:`GateReport.failure_message` (columns).
FAILURE_WIDTH = 120


def _aligned(rows: List[List[str]], rule_after_header: bool, split_last: bool = False):
    """Rows padded to common column widths, the last column unpadded. ``split_last``: ``(cells, last)`` pairs."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        cells = "  ".join(row[i].ljust(widths[i]) for i in range(len(widths)))
        out.append((cells, row[-1]) if split_last else ("  ".join([cells, row[-1]])).rstrip())
    if rule_after_header and not split_last:
        out.insert(1, "-" * len(out[0]))
    return out


def _short_problem(problem: str) -> str:
    """A gate failure as the gate's name (its numbers are in the table's columns); other problems in full."""
    for gate_name in _GATE_NAMES:
        if problem.startswith(gate_name + ":"):
            return gate_name
    return problem


@dataclass
class GateReport:
    """Result of :func:`check`.

    Attributes:
        policy (RoundingPolicy): the policy gated against.
        device (str): where ``fn`` ran.
        settings (GateSettings): the operator's thresholds (an output or format with entries of its own in
            ``mimo_numerics.tolerances`` is gated with those: the table's ``tol`` and ``limit`` columns show them).
        cases (list of CaseResult): one per case, in order.
        operator (str): the gated operator's name (None given: the default operator).
    """

    policy: RoundingPolicy
    device: str
    settings: GateSettings
    cases: List[CaseResult]
    operator: Optional[str] = None
    _nearest_cache: Dict[tuple, List["PresetMatch"]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)

    def __post_init__(self):
        self.operator = _operator.get(self.operator).name

    @property
    def checked(self) -> List[CaseResult]:
        """Cases that ran (not skipped)."""
        return [c for c in self.cases if c.skipped is None]

    @property
    def failed_cases(self) -> List[CaseResult]:
        return [c for c in self.cases if c.failed]

    @property
    def passed(self) -> bool:
        """True when at least one case ran and no check failed."""
        return bool(self.checked) and not self.failed_cases

    def failures(self) -> List[Tuple[str, str, str]]:
        """Every failure as ``(case_id, output or "*", reason)``."""
        out = []
        for case in self.cases:
            out.extend((case.case_id, "*", p) for p in case.problems)
            for check in case.outputs:
                out.extend((case.case_id, check.output, p) for p in check.problems)
        return out

    def worst(self) -> dict:
        """Largest ``same_use``, ``oracle_use`` and ``oracle_ratio`` over the checked outputs, as
        ``{key: (value, case_id, output)}``."""
        result = {"same_use": (0.0, "", ""), "oracle_use": (0.0, "", ""), "oracle_ratio": (0.0, "", "")}
        for case in self.checked:
            for check in case.outputs:
                for key in result:
                    value = getattr(check, key)
                    if not math.isnan(value) and value > result[key][0]:
                        result[key] = (value, case.case_id, check.output)
        return result

    def _label(self, policy: RoundingPolicy) -> str:
        return policy_label(policy, self.operator)

    def summary(self) -> str:
        """One line: verdict, policy, device, counts."""
        n_checks = sum(1 for c in self.checked for o in c.outputs if o.status != "absent")
        n_bad = len(self.failures())
        skipped = len(self.cases) - len(self.checked)
        verdict = "PASSED" if self.passed else "FAILED"
        text = (f"{self.operator} gate {verdict}: policy {self._label(self.policy)}, device {self.device}, "
                f"{len(self.checked)} case(s) run, {len(self.failed_cases)} failed ({n_bad} failing check(s) of "
                f"{n_checks} outputs)")
        if skipped:
            text += f", {skipped} skipped"
        if not self.checked:
            text += "; no case was run, so nothing was gated"
        return text

    def _output_rows(self, case: CaseResult, show_absent: bool) -> List[List[str]]:
        """Table cells of one case's outputs (``_COLUMNS`` without ``case``)."""
        rows = []
        blank = ["-"] * (len(_COLUMNS) - 4)
        for o in case.outputs:
            if o.status == "absent":
                if show_absent:
                    rows.append([o.output, "absent"] + blank + ["None in fn and reference (branch off)"])
                continue
            notes = [_short_problem(p) for p in o.problems] + list(o.notes)
            if not o.problems and o.noise_source and o.tol_same > o.tol_base:
                notes.append(f"tol from noise ({o.noise_source})")
            rows.append([o.output, o.status, _fmt(o.err_same), _fmt(o.noise), _fmt(o.tol_same), _pct(o.same_use),
                         _fmt(o.err_oracle), _fmt(o.ref_err_oracle), _num(o.oracle_ratio), _num(o.oracle_limit),
                         "-" if math.isnan(o.bit_equal) else f"{o.bit_equal:.4f}", "; ".join(notes)])
        return rows

    def table(self, cases: Optional[Sequence[CaseResult]] = None, show_absent: bool = True,
              width: Optional[int] = None) -> str:
        """The per-case, per-output table (all cases by default); ``docs/gating.md`` explains the columns.

        Args:
            cases: the cases to list (default: all).
            show_absent (bool): list outputs that are None in both ``fn`` and the reference.
            width (int, optional): fit lines into this many columns: the case id goes on a line of its own above
                its rows (no ``case`` column) and notes that do not fit move to an indented line below their row.
                Default: one row per case and output, as wide as it takes.
        """
        cases = self.cases if cases is None else list(cases)
        if width is not None:
            return self._narrow_table(cases, show_absent, width)
        rows = []
        blank = ["-"] * (len(_COLUMNS) - 4)
        for case in cases:
            cid = case.case_id
            if case.skipped is not None:
                rows.append([cid, "*", "skip"] + blank + [case.skipped])
                continue
            for problem in case.problems:
                rows.append([cid, "*", "FAIL"] + blank + [problem])
            rows.extend([cid] + row for row in self._output_rows(case, show_absent))
        return "\n".join(_aligned([list(_COLUMNS)] + rows, rule_after_header=True))

    def _narrow_table(self, cases: Sequence[CaseResult], show_absent: bool, width: int) -> str:
        header = list(_COLUMNS[1:])
        groups = [(case, self._output_rows(case, show_absent)) for case in cases]
        aligned = iter(_aligned([header] + [row for _, rows in groups for row in rows], rule_after_header=False,
                                split_last=True))
        head_cells, head_note = next(aligned)
        lines = [(head_cells + "  " + head_note)[:width].rstrip()]
        lines.append("-" * len(lines[0]))
        wrap = functools.partial(textwrap.wrap, width=width, break_long_words=False, break_on_hyphens=False)
        for case, rows in groups:
            title = f"case {case.case_id}"
            if case.policy is not None and case.policy != self.policy:
                title += f" (gated under {self._label(case.policy)})"
            lines.extend(wrap(title + ":", subsequent_indent="    "))
            if case.skipped is not None:
                lines.extend(wrap(f"skip: {case.skipped}", initial_indent="  ", subsequent_indent="    "))
            for problem in case.problems:
                lines.extend(wrap(f"FAIL: {problem}", initial_indent="  ", subsequent_indent="    "))
            for _ in rows:
                cells, note = next(aligned)
                if not note or len(cells) + 2 + len(note) <= width:
                    lines.append((cells + "  " + note).rstrip())
                else:
                    lines.append(cells.rstrip())
                    lines.extend(wrap(f"note: {note}", initial_indent="    ", subsequent_indent="      "))
        return "\n".join(lines)

    def nearest_presets(self, max_cases: int = NEAREST_PRESET_MAX_CASES,
                        max_size: int = NEAREST_PRESET_MAX_SIZE) -> List[PresetMatch]:
        """For the smallest failing cases, the preset whose reference ``fn``'s outputs are nearest to.

        Runs the reference of every preset (at the case's lp dtype) on up to ``max_cases`` failing cases of at most
        ``max_size`` elements (B·S·H·max(N, P)) whose outputs ``fn`` returned; cached on the report.

        Returns:
            list of PresetMatch: one per compared case (``match.better``: nearer to that preset than to the claim).
        """
        key = (max_cases, max_size)
        cached = self._nearest_cache
        if key not in cached:
            size = functools.partial(_case_size, op=self.operator)
            candidates = [c for c in self.failed_cases if c.fn_outputs and size(c.case) <= max_size]
            candidates.sort(key=lambda c: size(c.case))
            matches = [nearest_preset(c.case, c.policy, c.fn_outputs, op=self.operator)
                       for c in candidates[:max_cases]]
            cached[key] = [m for m in matches if m is not None]
        return cached[key]

    def _nearest_preset_lines(self, width: int) -> List[str]:
        by_preset: Dict[str, List[PresetMatch]] = {}
        for match in self.nearest_presets():
            if match.better:
                by_preset.setdefault(match.nearest, []).append(match)
        lines = []
        for label, matches in by_preset.items():
            first = matches[0]
            cases = (f"on {first.case_id}" if len(matches) == 1
                     else f"on {len(matches)} failing cases, e.g. {first.case_id}")
            near = "0 (bit-exact)" if first.nearest_distance == 0 else _fmt(first.nearest_distance)
            text = (f"hint: outputs look like preset `{label}` {cases}: mean rel RMS {near} to it vs "
                    f"{_fmt(first.claimed_distance)} to the claimed {self._label(first.claimed)} (diff from claimed: "
                    f"{first.differences()})")
            lines.extend(textwrap.wrap(text, width=width, subsequent_indent="  ", break_long_words=False,
                                       break_on_hyphens=False))
        return lines

    def output_settings(self) -> Dict[Tuple[str, str], GateSettings]:
        """``{(output, lp format): settings}`` where an output was gated with tolerance entries of its own (keyed by
        the operator and output or format in ``mimo_numerics.tolerances``) rather than :attr:`settings`."""
        given = {k: getattr(self.settings, k) for k in ("tol_same", "noise_factor", "alpha", "floor")
                 if k not in dict(self.settings.entries)}
        formats = sorted({c.policy.lp_dtype for c in self.checked})
        found = {}
        for output in _operator.get(self.operator).output_names:
            for fmt in formats:
                own = GateSettings.from_table(**given, op=self.operator, output=output, fmt=fmt)
                if own != self.settings:
                    found[(output, fmt)] = own
        return found

    def _own_settings_lines(self) -> List[str]:
        """One line naming the outputs gated with tolerances of their own, or none."""
        base_entries = dict(self.settings.entries)
        texts: Dict[str, str] = {}
        for (output, fmt), own in self.output_settings().items():
            own_entries = dict(own.entries)
            changed = [f"{k} {getattr(own, k):g} ({own_entries.get(k, 'given')})"
                       for k in ("tol_same", "noise_factor", "alpha", "floor")
                       if getattr(own, k) != getattr(self.settings, k) or own_entries.get(k) != base_entries.get(k)]
            texts.setdefault(f"{output}: {', '.join(changed)}", fmt)
        if not texts:
            return []
        return ["outputs with tolerances of their own: " + "; ".join(texts)]

    def failure_message(self, width: int = FAILURE_WIDTH) -> str:
        """The text of the ``AssertionError`` of :func:`assert_gate` (and of the pytest fixture's
        failure): summary, gate formulas, the failing cases' table and, when ``fn``'s outputs match another preset
        better than the claimed policy, that preset and how it differs; lines fit ``width`` columns."""
        wrap = functools.partial(textwrap.wrap, width=width, subsequent_indent="  ", break_long_words=False,
                                 break_on_hyphens=False)
        parts = wrap(self.summary())
        for formula in list(self.settings.formulas()) + self._own_settings_lines():
            parts.extend(wrap(formula))
        failed = self.failed_cases
        if failed:
            parts.append(self.table(failed, show_absent=False, width=width))
            n_ok = len(self.checked) - len(failed)
            if n_ok:
                parts.append(f"({n_ok} other case(s) passed; report.table() lists every case)")
            parts.extend(self._nearest_preset_lines(width))
        else:
            parts.append(self.table(width=width))
        for case in failed:
            if case.traceback:
                parts.append(f"traceback of fn on {case.case_id}:\n{case.traceback}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return "\n".join([self.summary(), self.settings.describe()] + self._own_settings_lines() + [self.table()])

    def to_dict(self) -> dict:
        """JSON-serialisable form (``json.dumps(report.to_dict())``) for CI artifacts."""
        return {"passed": self.passed, "operator": self.operator, "policy": self.policy.to_dict(),
                "policy_label": self._label(self.policy), "device": self.device, "settings": self.settings.to_dict(),
                "cases": [c.to_dict() for c in self.cases]}

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def raise_if_failed(self) -> "GateReport":
        """Raise ``AssertionError`` with :meth:`failure_message` unless :attr:`passed`; return self."""
        if not self.passed:
            raise AssertionError(self.failure_message())
        return self


# ---------------------------------------------------------------------------------------------------- the gate
def _as_output_dict(result, op) -> Dict[str, Optional[torch.Tensor]]:
    """``fn``'s result as ``{output name: value}`` for ``op``'s outputs; TypeError/ValueError naming what is
    wrong."""
    names = op.output_names
    if isinstance(result, Mapping):
        unknown = sorted(str(k) for k in set(result) - set(names))
        missing = [n for n in names if n not in result]
        if unknown or missing:
            raise ValueError(f"fn returned a dict whose keys are not the outputs {list(names)} of {op.name}: "
                             f"unknown {unknown}, missing {missing}")
        return {n: result[n] for n in names}
    if hasattr(result, "_asdict"):
        as_dict = result._asdict()
        if set(as_dict) == set(names):
            return {n: as_dict[n] for n in names}
        raise ValueError(f"fn returned a named tuple with fields {list(as_dict)}; expected {list(names)}")
    if isinstance(result, (tuple, list)):
        if len(result) != len(names):
            raise ValueError(f"fn returned a sequence of {len(result)} items; expected the {len(names)} outputs "
                             f"{list(names)} in that order")
        return dict(zip(names, result))
    if isinstance(result, torch.Tensor) and len(names) == 1:
        return {names[0]: result}
    single = f", the tensor {names[0]}" if len(names) == 1 else ""
    raise TypeError(f"fn returned a {type(result).__name__}; expected {op.name}'s outputs: a named tuple or a "
                    f"{len(names)}-tuple in the order {list(names)}, a dict keyed by those names{single}")


def _expected_dtype_reason(name: str, policy: RoundingPolicy, op) -> str:
    if not policy.round_outputs:
        return "round_outputs=False: unrounded outputs in the math dtype"
    if name in op.lp_outputs:
        return f"the policy's lp_dtype {policy.lp_dtype}"
    return "FP32 accumulation output"


def _first_index(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def _check_output(name: str, got, ref: Optional[torch.Tensor], oracle: Optional[torch.Tensor],
                  noise_of: Callable[[], Tuple[float, str]], policy: RoundingPolicy, device: torch.device,
                  settings: GateSettings, op) -> OutputCheck:
    if ref is None:
        if got is None:
            return OutputCheck(name, "absent")
        kind = type(got).__name__ if not isinstance(got, torch.Tensor) else f"tensor {list(got.shape)}"
        return OutputCheck(name, "FAIL", (f"returned a {kind} but the reference has no {name} for this case "
                                          "(branch off): expected None",))
    if got is None:
        return OutputCheck(name, "FAIL", (f"missing (None) but the reference has {name} {list(ref.shape)}",))
    if not isinstance(got, torch.Tensor):
        return OutputCheck(name, "FAIL", (f"not a tensor: {type(got).__name__}",))
    problems: List[str] = []
    if tuple(got.shape) != tuple(ref.shape):
        return OutputCheck(name, "FAIL", (f"shape {list(got.shape)}, expected {list(ref.shape)}",))
    if got.dtype != ref.dtype:
        problems.append(f"dtype {got.dtype}, expected {ref.dtype} ({_expected_dtype_reason(name, policy, op)})")
    if got.device != device:
        problems.append(f"on device {got.device}, expected the input device {device}")
    if got.is_complex() or not (got.is_floating_point()):
        problems.append(f"dtype {got.dtype} is not a real floating dtype")
        return OutputCheck(name, "FAIL", tuple(problems))
    try:
        got = got.detach().to("cpu")
    except (RuntimeError, NotImplementedError) as exc:
        problems.append(f"cannot be copied to the CPU ({type(exc).__name__}: {str(exc).splitlines()[0]})")
        return OutputCheck(name, "FAIL", tuple(problems))
    ref_ok = torch.isfinite(ref) & torch.isfinite(oracle)
    bad = ~torch.isfinite(got) & ref_ok
    nonfinite = int(bad.sum())
    if nonfinite:
        problems.append(f"{nonfinite} NaN/Inf element(s) where the reference is finite (first at "
                        f"{_first_index(bad)})")
    mask = ref_ok & torch.isfinite(got)
    notes = ()
    if not bool(ref_ok.all()):
        notes = (f"reference has {int((~ref_ok).sum())} non-finite element(s); compared on the others",)
    g, r, o = got[mask], ref[mask], oracle[mask]
    err_same = rel_rms(g, r)
    err_oracle = rel_rms(g, o)
    ref_err = rel_rms(r, o)
    # The case's noise floor can only raise the tolerance: measure it (3 reference runs) only when it can matter.
    noise_value, noise_source = math.nan, ""
    tol = settings.tol_same
    if not err_same <= settings.tol_same and settings.noise_factor > 0:
        noise_value, noise_source = noise_of()
        tol = max(tol, settings.noise_factor * noise_value)
    bound = settings.alpha * ref_err + settings.floor
    if not err_same <= tol:
        problems.append(f"same-policy gate: rel RMS vs ref[P] {err_same:.2e} > tol {tol:.2e} (does not "
                        "reproduce the policy's roundings)")
    if not err_oracle <= bound:
        problems.append(f"noise-floor gate: rel RMS vs fp64 {err_oracle:.2e} > {settings.alpha:g}·{ref_err:.2e} + "
                        f"{settings.floor:.1e} = {bound:.2e} (less accurate than the policy)")
    bit_equal = math.nan
    if got.dtype == ref.dtype:
        bit_equal = 1.0 if got.numel() == 0 else float(
            (got.contiguous().view(_int_view(got)) == ref.contiguous().view(_int_view(ref))).double().mean())
    return OutputCheck(name, "FAIL" if problems else "pass", tuple(problems), notes=notes, err_same=err_same,
                       noise=noise_value, noise_source=noise_source, tol_same=tol,
                       tol_base=settings.tol_same, tol_entry=dict(settings.entries).get("tol_same", ""),
                       err_oracle=err_oracle,
                       ref_err_oracle=ref_err, bound_oracle=bound, max_abs=max_abs(g, r) if g.numel() else 0.0,
                       bit_equal=bit_equal, nonfinite=nonfinite)


def _int_view(t: torch.Tensor) -> torch.dtype:
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def _exception_summary(exc: BaseException, width: int = 160) -> str:
    """First line of the message, plus its last line when it has several (compilers put the cause last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= width else text[:width - 3] + "..."


def _short_traceback(exc: BaseException, limit: int = 8) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-limit)).rstrip()


def _run_case(fn: Callable, case, policy: RoundingPolicy, device: torch.device, settings_of: _SettingsByOutput,
              pass_policy: bool, dtype_mismatch: str, op) -> CaseResult:
    case_policy = policy
    if case.lp_dtype != policy.lp_torch_dtype:
        if dtype_mismatch == "skip":
            return CaseResult(case, None, skipped=f"case dtype {case.dtype} differs from the policy's lp_dtype "
                                                  f"{policy.lp_dtype} (dtype_mismatch='adapt' gates it under "
                                                  f"lp_dtype={case.dtype})")
        case_policy = policy.replace(lp_dtype=case.dtype)
    inputs = case_inputs(case, op)
    ref = _as_output_dict(reference_outputs(case, case_policy, op), op)
    oracle = _as_output_dict(oracle_outputs(case, op), op)
    result = CaseResult(case, case_policy)
    moved = {n: (None if inputs[n] is None else inputs[n].to(device, copy=True)) for n in op.input_names}
    kwargs = op.kwargs(inputs)
    if pass_policy:
        kwargs["policy"] = case_policy
    start = time.perf_counter()
    try:
        raw = fn(*op.args(moved), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of fn is a gate failure, reported per case
        result.seconds = time.perf_counter() - start
        result.problems.append(f"fn raised {type(exc).__name__}: {_exception_summary(exc)}")
        result.traceback = _short_traceback(exc)
        return result
    try:
        outs = _as_output_dict(raw, op)
    except (TypeError, ValueError) as exc:
        result.seconds = time.perf_counter() - start
        result.problems.append(str(exc))
        return result
    target = next(t.device for t in moved.values() if isinstance(t, torch.Tensor))
    for name in op.output_names:
        noise_of = functools.partial(lambda n: self_noise(case, case_policy, op)[n], name)
        result.outputs.append(_check_output(name, outs[name], ref[name], oracle[name], noise_of,
                                            case_policy, target, settings_of(name, case_policy.lp_dtype), op))
    result.seconds = time.perf_counter() - start
    modified = [n for n in op.input_names if moved[n] is not None
                and not torch.equal(moved[n].detach().to("cpu"), inputs[n])]
    if modified:
        result.problems.append(f"fn modified its input(s) {modified} in place")
    if result.failed:
        result.fn_outputs = _cpu_copies(outs)
    return result


def _cpu_copies(outs: Mapping[str, object]) -> Dict[str, torch.Tensor]:
    """The real floating tensors of ``outs`` on the CPU (others, and those that cannot be copied, left out)."""
    copies = {}
    for name, value in outs.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            try:
                copies[name] = value.detach().to("cpu")
            except (RuntimeError, NotImplementedError):
                continue
    return copies


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
    if dtype_mismatch not in _DTYPE_MISMATCH:
        raise ValueError(f"dtype_mismatch must be one of {_DTYPE_MISMATCH}, got {dtype_mismatch!r}")
    overrides = {"tol_same": tol_same, "noise_factor": noise_factor, "alpha": alpha, "floor": floor}
    settings = GateSettings.from_table(**overrides, op=op)
    settings_of = _SettingsByOutput(op, overrides)
    dev = check_device("cpu" if device is None else device)
    results = [_run_case(fn, case, policy, dev, settings_of, pass_policy, dtype_mismatch, op) for case in case_list]
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


# ---------------------------------------------------------------------------------------------------- measurement
def measure_gate_noise(policy: PolicyLike = "upstream_sm90", cases: CasesLike = "gate",
                       dtype_mismatch: str = "adapt", op: OperatorLike = None) -> List[dict]:
    """The measurements behind the gate defaults in ``tolerances.py``, for every case and output of ``op``.

    For each :func:`noise_perturbations` variant ``P'`` (correct implementations of the policy that differ at the
    FP32 level) records ``same = rel_rms(ref[P'], ref[P])``, ``ratio = rel_rms(ref[P'], fp64) /
    rel_rms(ref[P], fp64)`` and ``excess = rel_rms(ref[P'], fp64) - rel_rms(ref[P], fp64)``.

    Returns:
        list of dict: ``{"operator", "case_id", "policy", "output", "ref_err_oracle", "variant", "same", "ratio",
        "excess"}``.
    """
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    rows = []
    for case in resolve_cases(cases, op):
        case_policy = policy
        if case.lp_dtype != policy.lp_torch_dtype:
            if dtype_mismatch == "skip":
                continue
            case_policy = policy.replace(lp_dtype=case.dtype)
        ref = _as_output_dict(reference_outputs(case, case_policy, op), op)
        oracle = _as_output_dict(oracle_outputs(case, op), op)
        for label, out in _perturbed_outputs(case, case_policy, op).items():
            out = _as_output_dict(out, op)
            for name in op.output_names:
                r = ref[name]
                if r is None:
                    continue
                o, v = oracle[name], out[name]
                ref_err, var_err = rel_rms(r, o), rel_rms(v, o)
                rows.append({"operator": op.name, "case_id": case.case_id, "policy": policy_label(case_policy, op),
                             "output": name, "ref_err_oracle": ref_err, "variant": label, "same": rel_rms(v, r),
                             "ratio": _ratio(var_err, ref_err), "excess": var_err - ref_err})
    return rows
