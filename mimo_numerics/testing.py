"""Accuracy gates for any implementation of ``mamba_mimo_bwd_fwd`` against a rounding policy.

A kernel developer gates *their* kernel in *their* CI::

    import functools
    from mimo_numerics.testing import assert_mamba_mimo_bwd_fwd
    assert_mamba_mimo_bwd_fwd(functools.partial(my_kernel, policy=...), policy="upstream_sm90", cases="gate",
                              device="cuda")

``fn`` is any callable with the reference's signature: the 17 tensors in API order (``INPUT_NAMES``) plus the
keywords ``chunk_size=`` and ``rotary_dim_divisor=`` (and ``policy=`` when ``pass_policy=True``), returning the five
outputs as a ``MimoBwdFwdOutputs``, a 5-tuple in ``OUTPUT_NAMES`` order or a dict keyed by output name. Inputs are
drawn on the CPU (``mimo_numerics.cases.make_inputs``), copied to ``device`` for ``fn``, and its results are moved
back to the CPU. The policy reference and the FP64 oracle run on the CPU, cached per (case, policy) for the process.

Every case and output is checked by structure and by two gates (``docs/gating.md`` explains the report):

* **structure**: an output is present exactly when the reference has it (branch on/off), with the reference's shape
  and dtype (lp outputs in the policy's ``lp_dtype``, ``dmimo_*`` in float32), on the input device, with no NaN/Inf
  where the reference is finite; ``fn`` must not modify its inputs.
* **same-policy gate**: ``rel_rms(fn, reference[P]) <= tol_same``, with
  ``tol_same = max(same_policy_rel_rms, noise_factor · noise)`` (``noise`` measured only when the error exceeds
  ``same_policy_rel_rms``, since it can only raise the tolerance). ``noise`` is this case's own FP32-order noise floor:
  the largest ``rel_rms(reference[P'], reference[P])`` over FP32-level perturbations ``P'`` of the same policy (FP64
  intermediate math, the other ``state_update`` order, a permuted state-dim summation order). On most cases it is 0
  or ~1e-5 and the table's ``same_policy_rel_rms`` applies; where one flipped lp rounding of the state cascades into
  many outputs it reaches 7e-4 (the real H200 upstream kernel differs from ``upstream_sm90`` by just as much there).
* **noise-floor gate** (flash-attention / PyTorch style):
  ``rel_rms(fn, oracle) <= alpha · rel_rms(reference[P], oracle) + floor``: a kernel may not be less accurate than
  the policy it claims.

Defaults of ``tol_same``, ``noise_factor``, ``alpha`` and ``floor`` come from ``mimo_numerics.tolerances`` (entries
``same_policy_rel_rms``, ``gate_same_policy_noise_factor``, ``gate_oracle_alpha``, ``gate_oracle_floor``), where the
measurements behind them are recorded; :func:`measure_gate_noise` reproduces them. A gate fails, never warns.
"""

from __future__ import annotations

import functools
import json
import math
import textwrap
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import presets as _presets
from .ops import registry
from . import tolerances as _tolerances
from .cases import CaseSpec, as_kwargs, grid, make_inputs
from .metrics import max_abs, rel_rms
from .oracle import mamba_mimo_bwd_fwd_oracle
from .outputs import INPUT_NAMES, OUTPUT_NAMES, MimoBwdFwdOutputs
from .policy import RoundingPolicy
from .reference import mamba_mimo_bwd_fwd as _reference

__all__ = [
    "check_mamba_mimo_bwd_fwd", "assert_mamba_mimo_bwd_fwd", "GateReport", "CaseResult", "OutputCheck",
    "GateSettings", "resolve_cases", "case_inputs", "reference_outputs", "oracle_outputs", "self_noise",
    "noise_perturbations", "permute_state_dim", "measure_gate_noise", "clear_cache", "policy_label",
    "check_device", "DeviceUnavailableError",
]

CasesLike = Union[str, CaseSpec, Iterable[CaseSpec]]
PolicyLike = Union[str, RoundingPolicy]

#: Outputs rounded to the policy's low-precision dtype by the output store (the rest are FP32 sums).
LP_OUTPUTS = ("states", "dz", "qk_dot")
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

    Checked once, before any case runs, by the CLI, the pytest plugin and :func:`check_mamba_mimo_bwd_fwd`, so an
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
    """The thresholds one gate run applies.

    Attributes:
        tol_same (float): lower bound of the same-policy tolerance (rel RMS against ``reference[P]``).
        noise_factor (float): the same-policy tolerance is ``max(tol_same, noise_factor · noise)``; 0 turns the
            per-case noise floor off.
        alpha (float): noise-floor gate factor on ``rel_rms(reference[P], oracle)``.
        floor (float): noise-floor gate additive term (rel RMS).
    """

    tol_same: float
    noise_factor: float
    alpha: float
    floor: float

    @classmethod
    def from_table(cls, tol_same=None, noise_factor=None, alpha=None, floor=None) -> "GateSettings":
        """Settings with every ``None`` taken from ``mimo_numerics.tolerances``."""
        values = {
            "tol_same": _tolerances.get("same_policy_rel_rms") if tol_same is None else tol_same,
            "noise_factor": (_tolerances.get("gate_same_policy_noise_factor") if noise_factor is None
                             else noise_factor),
            "alpha": _tolerances.get("gate_oracle_alpha") if alpha is None else alpha,
            "floor": _tolerances.get("gate_oracle_floor") if floor is None else floor,
        }
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if values["alpha"] < 1.0:
            raise ValueError(f"alpha must be >= 1 (a kernel may be as accurate as its policy), got {values['alpha']}")
        return cls(**{k: float(v) for k, v in values.items()})

    def formulas(self) -> Tuple[str, str]:
        """The two gate formulas with these numbers: ``(same-policy, noise floor)``."""
        return (f"same-policy: rel_rms(fn, ref[P]) <= max({self.tol_same:.1e}, {self.noise_factor:g}·noise)",
                f"noise floor: rel_rms(fn, fp64) <= {self.alpha:g}·rel_rms(ref[P], fp64) + {self.floor:.1e}")

    def describe(self) -> str:
        """The two gate formulas with these numbers, on one line."""
        return "; ".join(self.formulas())


# ---------------------------------------------------------------------------------------------------- cases
def resolve_cases(cases: CasesLike) -> Tuple[CaseSpec, ...]:
    """A grid name (``"smoke"``, ``"gate"``, ``"sweep"``), one ``CaseSpec`` or an iterable of them, as a tuple.

    Raises:
        ValueError: unknown grid name or an empty list. TypeError: an element that is not a ``CaseSpec``.
    """
    if isinstance(cases, str):
        return tuple(grid(cases))
    if isinstance(cases, CaseSpec):
        return (cases,)
    try:
        items = tuple(cases)
    except TypeError:
        raise TypeError(f"cases must be a grid name, a CaseSpec or an iterable of CaseSpec, got "
                        f"{type(cases).__name__}") from None
    if not items:
        raise ValueError("cases is empty: give a grid name or at least one CaseSpec")
    for item in items:
        if not isinstance(item, CaseSpec):
            raise TypeError(f"every case must be a CaseSpec, got {type(item).__name__} ({item!r})")
    return items


# ---------------------------------------------------------------------------------------------------- caches
_INPUTS: Dict[CaseSpec, dict] = {}
_ORACLE: Dict[CaseSpec, MimoBwdFwdOutputs] = {}
_REFERENCE: Dict[Tuple[CaseSpec, RoundingPolicy], MimoBwdFwdOutputs] = {}
_NOISE: Dict[Tuple[CaseSpec, RoundingPolicy], Dict[str, Tuple[float, str]]] = {}
_PERTURBED: Dict[Tuple[CaseSpec, RoundingPolicy], Dict[str, MimoBwdFwdOutputs]] = {}


def clear_cache() -> None:
    """Forget the cached inputs, reference, oracle and noise results of this process."""
    for cache in (_INPUTS, _ORACLE, _REFERENCE, _NOISE, _PERTURBED):
        cache.clear()


def case_inputs(case: CaseSpec) -> dict:
    """The CPU inputs of ``case`` (cached; treat them as read-only, the gate hands ``fn`` copies)."""
    if case not in _INPUTS:
        _INPUTS[case] = make_inputs(case, "cpu")
    return _INPUTS[case]


def _args(inputs: dict) -> tuple:
    return tuple(inputs[name] for name in INPUT_NAMES)


def reference_outputs(case: CaseSpec, policy: PolicyLike) -> MimoBwdFwdOutputs:
    """``reference.mamba_mimo_bwd_fwd`` of ``case`` under ``policy`` on the CPU (cached per (case, policy))."""
    policy = _presets.resolve(policy)
    key = (case, policy)
    if key not in _REFERENCE:
        inputs = case_inputs(case)
        with torch.no_grad():
            _REFERENCE[key] = _reference(*_args(inputs), **as_kwargs(inputs), policy=policy)
    return _REFERENCE[key]


def oracle_outputs(case: CaseSpec) -> MimoBwdFwdOutputs:
    """The FP64 oracle of ``case`` on the CPU (cached per case)."""
    if case not in _ORACLE:
        inputs = case_inputs(case)
        with torch.no_grad():
            _ORACLE[case] = mamba_mimo_bwd_fwd_oracle(*_args(inputs), **as_kwargs(inputs))
    return _ORACLE[case]


def permute_state_dim(fn: Callable, seed: int = 0) -> Callable:
    """Wrap ``fn`` so that it computes the same function with the state dimension N permuted.

    Every sum over N (``qk_dot``, the scores, the inter-chunk GEMM) then runs in another FP32 order, while the math
    is unchanged: the permutation maps rotary pairs ``(j, N/2 + j)``, ``j < N/d``, to rotary pairs (permuting
    ``angles`` with them) and the other columns among themselves; ``states`` is permuted back. This models a
    correct kernel that sums in a different order.

    Args:
        fn: an implementation (signature as for :func:`check_mamba_mimo_bwd_fwd`).
        seed (int): seed of the permutation.

    Returns:
        callable: same signature as ``fn``; returns a ``MimoBwdFwdOutputs``.
    """

    @functools.wraps(fn)
    def permuted(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
                 segsum, *, chunk_size, rotary_dim_divisor, **kwargs):
        n = q.shape[-1]
        half, width = n // 2, n // rotary_dim_divisor
        gen = torch.Generator().manual_seed(seed)
        pair_perm = torch.randperm(width, generator=gen)
        free = torch.tensor([j for j in range(n) if not (j < width or half <= j < half + width)], dtype=torch.long)
        perm = torch.arange(n)
        perm[:width] = pair_perm
        perm[half:half + width] = half + pair_perm
        if free.numel():
            perm[free] = free[torch.randperm(free.numel(), generator=gen)]
        inverse = torch.argsort(perm)
        dev = q.device
        p, pp, inv = perm.to(dev), pair_perm.to(dev), inverse.to(dev)
        result = fn(dout, q[..., p].contiguous(), k[..., p].contiguous(), v, q_bias[..., p].contiguous(),
                    k_bias[..., p].contiguous(), mimo_v, mimo_o, z, mimo_z, angles[..., pp].contiguous(), da_cs,
                    da_cs_rev, dt, trap, d, segsum, chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor,
                    **kwargs)
        outs = _as_output_dict(result)
        if isinstance(outs["states"], torch.Tensor):
            outs["states"] = outs["states"][..., inv, :].contiguous()
        return MimoBwdFwdOutputs(**outs)

    return permuted


def noise_perturbations(policy: PolicyLike) -> Dict[str, Callable]:
    """FP32-level perturbations of the reference under ``policy``: implementations of the same rounding policy.

    Returns:
        dict: label -> callable with the reference's signature: ``"fp64_math"`` (the same roundings with FP64
        intermediate math; only when ``math_dtype="float32"``), ``"state_update"`` (the other ``state_update``
        order: the two differ only in FP32 summation order), ``"state_dim_order"`` (:func:`permute_state_dim`).
    """
    policy = _presets.resolve(policy)
    other = "separate" if policy.state_update == "accumulate_into" else "accumulate_into"
    variants = {}
    if policy.math_dtype == "float32":
        variants["fp64_math"] = functools.partial(_reference, policy=policy.replace(math_dtype="float64"))
    variants["state_update"] = functools.partial(_reference, policy=policy.replace(state_update=other))
    variants["state_dim_order"] = permute_state_dim(functools.partial(_reference, policy=policy), seed=0)
    return variants


def _perturbed_outputs(case: CaseSpec, policy: RoundingPolicy) -> Dict[str, MimoBwdFwdOutputs]:
    key = (case, policy)
    if key not in _PERTURBED:
        inputs = case_inputs(case)
        with torch.no_grad():
            _PERTURBED[key] = {label: variant(*_args(inputs), **as_kwargs(inputs))
                               for label, variant in noise_perturbations(policy).items()}
    return _PERTURBED[key]


def self_noise(case: CaseSpec, policy: PolicyLike) -> Dict[str, Tuple[float, str]]:
    """This case's FP32-order noise floor per output: ``max rel_rms(reference[P'], reference[P])`` over
    :func:`noise_perturbations`, with the label of the largest (cached per (case, policy)).

    Returns:
        dict: output name -> ``(noise, label)``; ``(0.0, "")`` where every perturbation is bit-equal, and for
        absent outputs.
    """
    policy = _presets.resolve(policy)
    key = (case, policy)
    if key not in _NOISE:
        ref = reference_outputs(case, policy)
        noise = {name: (0.0, "") for name in OUTPUT_NAMES}
        for label, out in _perturbed_outputs(case, policy).items():
            for name in OUTPUT_NAMES:
                expected, got = getattr(ref, name), getattr(out, name)
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
        case (CaseSpec): the case.
        policy (RoundingPolicy | None): the policy the case was gated under (None when skipped).
        outputs (list of OutputCheck): one per output name, in ``OUTPUT_NAMES`` order (empty when ``fn`` raised).
        problems (list of str): case-level failures: ``fn`` raised, returned something unusable, modified inputs.
        skipped (str | None): why the case was not run.
        traceback (str | None): the traceback when ``fn`` raised.
        seconds (float): wall time of ``fn`` plus moving its results to the CPU.
        fn_outputs (dict | None): CPU copies of ``fn``'s output tensors, kept for failing cases only (for
            :meth:`GateReport.nearest_presets`); not part of ``to_dict``.
    """

    case: CaseSpec
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


def policy_label(policy: RoundingPolicy) -> str:
    """:func:`mimo_numerics.presets.label` of ``policy`` on the gated operator."""
    return _presets.label(policy, operator=registry.DEFAULT_OPERATOR)


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
    """

    case_id: str
    claimed: RoundingPolicy
    claimed_distance: float
    nearest: str
    nearest_policy: RoundingPolicy
    nearest_distance: float

    @property
    def better(self) -> bool:
        """True when ``fn`` is at least ``NEAREST_PRESET_FACTOR`` times nearer to the other preset than to the
        claimed policy."""
        return self.nearest_distance * NEAREST_PRESET_FACTOR <= self.claimed_distance and self.claimed_distance > 0

    def differences(self) -> str:
        """The fields in which the nearest preset differs from the claimed policy, as ``field=value`` (nearest's)."""
        return ", ".join(f"{k}={v[0]}" for k, v in self.nearest_policy.diff(self.claimed).items())


def _outputs_distance(got: Mapping[str, torch.Tensor], ref: MimoBwdFwdOutputs) -> float:
    """Mean over the outputs both have (same shape) of ``rel_rms`` on the elements finite in both; nan if none."""
    values = []
    for name, tensor in got.items():
        expected = getattr(ref, name)
        if expected is None or tuple(expected.shape) != tuple(tensor.shape):
            continue
        mask = torch.isfinite(tensor) & torch.isfinite(expected)
        if bool(mask.any()):
            values.append(rel_rms(tensor[mask], expected[mask]))
    return sum(values) / len(values) if values else math.nan


def _candidate_presets(policy: RoundingPolicy) -> List[Tuple[str, RoundingPolicy]]:
    """Every preset other than ``policy``, at ``policy``'s lp_dtype (presets of that dtype first; no duplicates)."""
    found: List[Tuple[str, RoundingPolicy]] = []
    seen = {policy}
    names = sorted(_presets.names(), key=lambda n: _presets.get(n).lp_dtype != policy.lp_dtype)
    for name in names:
        preset = _presets.get(name)
        label = name
        if preset.lp_dtype != policy.lp_dtype:
            preset = preset.replace(lp_dtype=policy.lp_dtype)
            label = f"{name} at lp_dtype={policy.lp_dtype}"
        if preset not in seen:
            seen.add(preset)
            found.append((label, preset))
    return found


def _case_size(case: CaseSpec) -> int:
    return case.batch * case.seqlen * case.heads * max(case.state_dim, case.value_dim)


def nearest_preset(case: CaseSpec, policy: RoundingPolicy, fn_outputs: Mapping[str, torch.Tensor]
                   ) -> Optional[PresetMatch]:
    """Compare ``fn``'s outputs on ``case`` with the reference of every preset (CPU, cached per (case, preset)).

    Returns:
        PresetMatch | None: the nearest other preset by mean rel RMS, None when no output could be compared.
    """
    claimed = _outputs_distance(fn_outputs, reference_outputs(case, policy))
    if math.isnan(claimed):
        return None
    best = None
    for label, candidate in _candidate_presets(policy):
        distance = _outputs_distance(fn_outputs, reference_outputs(case, candidate))
        if not math.isnan(distance) and (best is None or distance < best[2]):
            best = (label, candidate, distance)
    if best is None:
        return None
    return PresetMatch(case.case_id, policy, claimed, best[0], best[1], best[2])


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
    """Result of :func:`check_mamba_mimo_bwd_fwd`.

    Attributes:
        policy (RoundingPolicy): the policy gated against.
        device (str): where ``fn`` ran.
        settings (GateSettings): the thresholds applied.
        cases (list of CaseResult): one per case, in order.
    """

    policy: RoundingPolicy
    device: str
    settings: GateSettings
    cases: List[CaseResult]
    _nearest_cache: Dict[tuple, List["PresetMatch"]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)

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

    def summary(self) -> str:
        """One line: verdict, policy, device, counts."""
        n_checks = sum(1 for c in self.checked for o in c.outputs if o.status != "absent")
        n_bad = len(self.failures())
        skipped = len(self.cases) - len(self.checked)
        verdict = "PASSED" if self.passed else "FAILED"
        text = (f"mamba_mimo_bwd_fwd gate {verdict}: policy {policy_label(self.policy)}, device {self.device}, "
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
            if not o.problems and o.tol_same > self.settings.tol_same:
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
                title += f" (gated under {policy_label(case.policy)})"
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
            candidates = [c for c in self.failed_cases if c.fn_outputs and _case_size(c.case) <= max_size]
            candidates.sort(key=lambda c: _case_size(c.case))
            matches = [nearest_preset(c.case, c.policy, c.fn_outputs) for c in candidates[:max_cases]]
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
                    f"{_fmt(first.claimed_distance)} to the claimed {policy_label(first.claimed)} (diff from claimed: "
                    f"{first.differences()})")
            lines.extend(textwrap.wrap(text, width=width, subsequent_indent="  ", break_long_words=False,
                                       break_on_hyphens=False))
        return lines

    def failure_message(self, width: int = FAILURE_WIDTH) -> str:
        """The text of the ``AssertionError`` of :func:`assert_mamba_mimo_bwd_fwd` (and of the pytest fixture's
        failure): summary, gate formulas, the failing cases' table and, when ``fn``'s outputs match another preset
        better than the claimed policy, that preset and how it differs; lines fit ``width`` columns."""
        wrap = functools.partial(textwrap.wrap, width=width, subsequent_indent="  ", break_long_words=False,
                                 break_on_hyphens=False)
        parts = wrap(self.summary())
        for formula in self.settings.formulas():
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
        return "\n".join([self.summary(), self.settings.describe(), self.table()])

    def to_dict(self) -> dict:
        """JSON-serialisable form (``json.dumps(report.to_dict())``) for CI artifacts."""
        return {"passed": self.passed, "policy": self.policy.to_dict(), "policy_label": policy_label(self.policy),
                "device": self.device, "settings": vars(self.settings).copy(),
                "cases": [c.to_dict() for c in self.cases]}

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def raise_if_failed(self) -> "GateReport":
        """Raise ``AssertionError`` with :meth:`failure_message` unless :attr:`passed`; return self."""
        if not self.passed:
            raise AssertionError(self.failure_message())
        return self


# ---------------------------------------------------------------------------------------------------- the gate
def _as_output_dict(result) -> Dict[str, Optional[torch.Tensor]]:
    """``fn``'s result as ``{output name: value}``; TypeError/ValueError naming what is wrong."""
    if isinstance(result, Mapping):
        unknown = sorted(str(k) for k in set(result) - set(OUTPUT_NAMES))
        missing = [n for n in OUTPUT_NAMES if n not in result]
        if unknown or missing:
            raise ValueError(f"fn returned a dict whose keys are not the five outputs {list(OUTPUT_NAMES)}: "
                             f"unknown {unknown}, missing {missing}")
        return {n: result[n] for n in OUTPUT_NAMES}
    if hasattr(result, "_asdict"):
        as_dict = result._asdict()
        if set(as_dict) == set(OUTPUT_NAMES):
            return {n: as_dict[n] for n in OUTPUT_NAMES}
        raise ValueError(f"fn returned a named tuple with fields {list(as_dict)}; expected {list(OUTPUT_NAMES)}")
    if isinstance(result, (tuple, list)):
        if len(result) != len(OUTPUT_NAMES):
            raise ValueError(f"fn returned a sequence of {len(result)} items; expected the 5 outputs "
                             f"{list(OUTPUT_NAMES)} in that order")
        return dict(zip(OUTPUT_NAMES, result))
    raise TypeError(f"fn returned a {type(result).__name__}; expected a MimoBwdFwdOutputs, a 5-tuple in the order "
                    f"{list(OUTPUT_NAMES)} or a dict keyed by those names")


def _expected_dtype_reason(name: str, policy: RoundingPolicy) -> str:
    if not policy.round_outputs:
        return "round_outputs=False: unrounded outputs in the math dtype"
    if name in LP_OUTPUTS:
        return f"the policy's lp_dtype {policy.lp_dtype}"
    return "FP32 accumulation output"


def _first_index(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def _check_output(name: str, got, ref: Optional[torch.Tensor], oracle: Optional[torch.Tensor],
                  noise_of: Callable[[], Tuple[float, str]], policy: RoundingPolicy, device: torch.device,
                  settings: GateSettings) -> OutputCheck:
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
        problems.append(f"dtype {got.dtype}, expected {ref.dtype} ({_expected_dtype_reason(name, policy)})")
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
                       noise=noise_value, noise_source=noise_source, tol_same=tol, err_oracle=err_oracle,
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


def _run_case(fn: Callable, case: CaseSpec, policy: RoundingPolicy, device: torch.device, settings: GateSettings,
              pass_policy: bool, dtype_mismatch: str) -> CaseResult:
    case_policy = policy
    if case.lp_dtype != policy.lp_torch_dtype:
        if dtype_mismatch == "skip":
            return CaseResult(case, None, skipped=f"case dtype {case.dtype} differs from the policy's lp_dtype "
                                                  f"{policy.lp_dtype} (dtype_mismatch='adapt' gates it under "
                                                  f"lp_dtype={case.dtype})")
        case_policy = policy.replace(lp_dtype=case.dtype)
    inputs = case_inputs(case)
    ref = reference_outputs(case, case_policy)
    oracle = oracle_outputs(case)
    result = CaseResult(case, case_policy)
    moved = {n: (None if inputs[n] is None else inputs[n].to(device, copy=True)) for n in INPUT_NAMES}
    kwargs = as_kwargs(inputs)
    if pass_policy:
        kwargs["policy"] = case_policy
    start = time.perf_counter()
    try:
        raw = fn(*_args(moved), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of fn is a gate failure, reported per case
        result.seconds = time.perf_counter() - start
        result.problems.append(f"fn raised {type(exc).__name__}: {_exception_summary(exc)}")
        result.traceback = _short_traceback(exc)
        return result
    try:
        outs = _as_output_dict(raw)
    except (TypeError, ValueError) as exc:
        result.seconds = time.perf_counter() - start
        result.problems.append(str(exc))
        return result
    target = moved["q"].device
    for name in OUTPUT_NAMES:
        noise_of = functools.partial(lambda n: self_noise(case, case_policy)[n], name)
        result.outputs.append(_check_output(name, outs[name], getattr(ref, name), getattr(oracle, name),
                                            noise_of, case_policy, target, settings))
    result.seconds = time.perf_counter() - start
    modified = [n for n in INPUT_NAMES if moved[n] is not None
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


def check_mamba_mimo_bwd_fwd(fn: Callable, *, policy: PolicyLike, cases: CasesLike = "gate",
                             device: Union[None, str, torch.device] = None, alpha: Optional[float] = None,
                             floor: Optional[float] = None, tol_same: Optional[float] = None,
                             noise_factor: Optional[float] = None, pass_policy: bool = False,
                             dtype_mismatch: str = "skip") -> GateReport:
    """Run ``fn`` over ``cases`` and check it against ``policy``; never raises for a failing ``fn``.

    Args:
        fn: the implementation under test: ``fn(*17 tensors, chunk_size=, rotary_dim_divisor=)`` returning the five
            outputs (``MimoBwdFwdOutputs``, a 5-tuple in ``OUTPUT_NAMES`` order, or a dict by name). Wrap kernels
            that take a policy with ``functools.partial(kernel, policy=...)``, or set ``pass_policy``.
        policy: the policy ``fn`` claims to implement: a preset name, a ``RoundingPolicy`` or a policy JSON path.
        cases: a grid name (``"smoke"``, ``"gate"``, ``"sweep"``), a ``CaseSpec`` or a list of them.
        device: where ``fn`` runs (``"cpu"``, ``"cuda"``, ``"npu"``, ...; default ``"cpu"``). Inputs are copied
            there and results moved back; the reference and oracle always run on the CPU.
        alpha, floor: noise-floor gate ``rel_rms(fn, fp64) <= alpha·rel_rms(ref[P], fp64) + floor``; default
            ``tolerances`` entries ``gate_oracle_alpha``, ``gate_oracle_floor``.
        tol_same: lower bound of the same-policy tolerance; default entry ``same_policy_rel_rms``.
        noise_factor: the same-policy tolerance is ``max(tol_same, noise_factor·noise)``; default entry
            ``gate_same_policy_noise_factor``; 0 disables the per-case noise floor.
        pass_policy: also pass ``policy=`` (the case's policy) to ``fn``.
        dtype_mismatch: cases whose dtype differs from ``policy.lp_dtype`` are ``"skip"``-ped (reported) or, with
            ``"adapt"``, gated under ``policy.replace(lp_dtype=case.dtype)`` (use with ``pass_policy=True``).

    Returns:
        GateReport: ``report.passed``, ``report.table()``, ``report.failures()``, ``report.to_dict()``.

    Raises:
        TypeError, ValueError: for bad arguments (not for a failing ``fn``); ``DeviceUnavailableError`` (a
        ``ValueError``) when ``device`` cannot be used here, before any case runs.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    policy = _presets.resolve(policy)
    case_list = resolve_cases(cases)
    if dtype_mismatch not in _DTYPE_MISMATCH:
        raise ValueError(f"dtype_mismatch must be one of {_DTYPE_MISMATCH}, got {dtype_mismatch!r}")
    settings = GateSettings.from_table(tol_same=tol_same, noise_factor=noise_factor, alpha=alpha, floor=floor)
    dev = check_device("cpu" if device is None else device)
    results = [_run_case(fn, case, policy, dev, settings, pass_policy, dtype_mismatch) for case in case_list]
    return GateReport(policy=policy, device=str(dev), settings=settings, cases=results)


def assert_mamba_mimo_bwd_fwd(fn: Callable, **kwargs) -> GateReport:
    """:func:`check_mamba_mimo_bwd_fwd`, raising ``AssertionError`` with the per-case, per-output table of the
    failing cases (and tracebacks of ``fn``) when a gate fails or no case ran. Returns the report otherwise."""
    return check_mamba_mimo_bwd_fwd(fn, **kwargs).raise_if_failed()


# ---------------------------------------------------------------------------------------------------- measurement
def measure_gate_noise(policy: PolicyLike = "upstream_sm90", cases: CasesLike = "gate",
                       dtype_mismatch: str = "adapt") -> List[dict]:
    """The measurements behind the gate defaults in ``tolerances.py``, for every case and output.

    For each :func:`noise_perturbations` variant ``P'`` (correct implementations of the policy that differ at the
    FP32 level) records ``same = rel_rms(ref[P'], ref[P])``, ``ratio = rel_rms(ref[P'], fp64) /
    rel_rms(ref[P], fp64)`` and ``excess = rel_rms(ref[P'], fp64) - rel_rms(ref[P], fp64)``.

    Returns:
        list of dict: ``{"case_id", "policy", "output", "ref_err_oracle", "variant", "same", "ratio", "excess"}``.
    """
    policy = _presets.resolve(policy)
    rows = []
    for case in resolve_cases(cases):
        case_policy = policy
        if case.lp_dtype != policy.lp_torch_dtype:
            if dtype_mismatch == "skip":
                continue
            case_policy = policy.replace(lp_dtype=case.dtype)
        ref, oracle = reference_outputs(case, case_policy), oracle_outputs(case)
        for label, out in _perturbed_outputs(case, case_policy).items():
            for name in OUTPUT_NAMES:
                r = getattr(ref, name)
                if r is None:
                    continue
                o, v = getattr(oracle, name), getattr(out, name)
                ref_err, var_err = rel_rms(r, o), rel_rms(v, o)
                rows.append({"case_id": case.case_id, "policy": policy_label(case_policy), "output": name,
                             "ref_err_oracle": ref_err, "variant": label, "same": rel_rms(v, r),
                             "ratio": _ratio(var_err, ref_err), "excess": var_err - ref_err})
    return rows
