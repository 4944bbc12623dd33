"""Where error enters and how it grows: per-stage and per-chunk error of runs of an operator.

Every function takes the operator as ``op`` (a registry name, an ``Operator`` or None for
``registry.DEFAULT_OPERATOR``, backward stage 1) and reads its stages from the operator's spec
(``mimo_numerics.operator``): the record stages ``op.stages`` in computation order, then the outputs ``op.outputs``.

A *run* is a plain dict of named tensors: the per-stage tensors of the reference's ``record=`` (the names of
``op.stages``; also the kernels' stage capture when it uses the same names) plus the outputs under
``"output.<name>"`` (:func:`make_run`). Runs that have only outputs (a device, a bundle, the golden data) are runs
too: comparisons use the stages two runs share. The FP64 baseline run is the reference under the ``fp64`` preset
with ``record=`` (:func:`oracle_run`).

* :func:`stage_drift` -> :class:`DriftTable`: per run and stage, relative RMS, max abs error and max error in lp ULPs
  against a baseline run; :meth:`DriftTable.entry_stage` names the first stage (in pipeline order) where a run
  departs from the baseline.
* :func:`sequence_drift` -> :class:`SequenceDrift`: the same along the sequence, per chunk or per token (the axis of
  each stage is ``Stage.sequence_axis`` of the spec).
* :func:`standard_runs`: the runs of notebook 1 and of the report (FP64 baseline, FP32 math, the policies asked for,
  and a device: given outputs, a bundle, or the Triton kernels under ``seed_bf16`` labelled as emulation).

Everything takes and returns tensors and dicts, so a bundle's dict of tensors can be fed in directly. The functions
that compute run torch on one thread (``inference.single_threaded``): a speed setting for these many small tensor
operations (oversubscribed threads cost 10-40x on a busy 2-core machine), which also keeps the float64 error sums
independent of the thread count.
"""

from __future__ import annotations

import importlib
import inspect
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import operator as _operator
from . import presets as _presets
from .inference import single_threaded
from .metrics import max_abs, rel_rms
from .policy import RoundingPolicy

OpLike = Union[str, "_operator.Operator", None]

#: Prefix of output tensors in a run.
OUTPUT_PREFIX = "output."
#: Policies :func:`standard_runs` records by default (those of them that define the operator).
DEFAULT_POLICIES = ("fp32", "seed_bf16", "upstream_sm90")
_LP_PRECISION = {"bfloat16": (8, -126), "float16": (11, -14)}
_LP_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}

Run = Dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------- the operator's stages
def _composite(op: OpLike):
    from .ops import registry

    return registry.composite(op)


def pipeline(op: OpLike = None) -> Tuple[str, ...]:
    """The stages of ``op``'s ``record=`` in computation order, then its outputs as ``"output.<name>"``. For a
    composite operator (the whole op): every record key of its chain in chain order (``"<operator>.<stage>"``,
    outputs as ``"<operator>.outputs.<name>"``)."""
    composite = _composite(op)
    if composite is not None:
        return composite.stage_names
    op = _operator.get(op)
    return op.stage_names + tuple(OUTPUT_PREFIX + name for name in op.output_names)


def stage_groups(stages: Iterable[str], op: OpLike) -> Dict[str, str]:
    """``{stage: step}`` of a composite operator's record keys (the ``groups`` of ``plots.plot_stage_drift``: the
    shaded bands of the chain's steps); ``{}`` for a single operator."""
    composite = _composite(op)
    if composite is None:
        return {}
    group_of = composite.load("group_of")
    return {stage: group_of(stage) for stage in stages}


def spec_of(stage: str, op: OpLike = None) -> Optional["_operator.Stage"]:
    """The spec ``Stage`` of a run key (a record stage, or ``"output.<name>"``); None for a name ``op`` lacks."""
    op = _operator.get(op)
    if stage.startswith(OUTPUT_PREFIX):
        name, candidates = stage[len(OUTPUT_PREFIX):], op.outputs
    else:
        name, candidates = stage, op.stages
    return next((s for s in candidates if s.name == name), None)


def sequence_axis(stage: str, op: OpLike = None) -> Optional[Tuple[str, int]]:
    """``("chunk" | "token", dim)`` of a stage's sequence axis (``Stage.sequence_axis``), or None for stages
    without one (sums over the tokens, weights) and names the operator does not have."""
    spec = spec_of(stage, op)
    return None if spec is None else spec.sequence_axis


def _kind(axis: Optional[Tuple[str, int]]) -> Optional[str]:
    """``"token"``, ``"chunk"`` or None of a ``Stage.sequence_axis``."""
    return None if axis is None else axis[0]


def chunk_stages(op: OpLike = None) -> Tuple[str, ...]:
    """Run keys indexed by chunk (``nc`` axis), in pipeline order."""
    return tuple(s for s in pipeline(op) if _kind(sequence_axis(s, op)) == "chunk")


def no_sequence_stages(op: OpLike = None) -> Tuple[str, ...]:
    """Run keys without a sequence axis, in pipeline order."""
    return tuple(s for s in pipeline(op) if sequence_axis(s, op) is None)


def stage_sites(op: OpLike = None) -> Dict[str, Optional[str]]:
    """Run key -> the policy switch whose rounding produces it (``Stage.site``), None for math-dtype stages."""
    return {s: spec_of(s, op).site for s in pipeline(op)}


def sequence_stages(op: OpLike = None, per: str = "token") -> Tuple[str, ...]:
    """The stages a report shows along the sequence, from the spec alone.

    ``per="token"``: the last token-indexed record stage that every branch records (the main result before the
    output stores; record stages named like an output are left out), then the token-indexed outputs.
    ``per="chunk"``: the first chunk-indexed record stage (the carried state), that last stage, the first
    chunk-indexed output and the first token-indexed output. Callers keep those a run has.
    """
    if per not in ("chunk", "token"):
        raise ValueError(f"per must be 'chunk' or 'token', got {per!r}")
    op = _operator.get(op)
    main = [s.name for s in op.stages if not s.needs and s.name not in op.output_names
            and _kind(s.sequence_axis) == "token"][-1:]
    token_outputs = [OUTPUT_PREFIX + s.name for s in op.outputs if _kind(s.sequence_axis) == "token"]
    if per == "token":
        return tuple(main + token_outputs)
    state = [s.name for s in op.stages if _kind(s.sequence_axis) == "chunk"][:1]
    chunk_outputs = [OUTPUT_PREFIX + s.name for s in op.outputs if _kind(s.sequence_axis) == "chunk"]
    return tuple(state + main + chunk_outputs[:1] + token_outputs[:1])


def describe_stages(op: OpLike = None) -> str:
    """A Markdown table of ``op``'s pipeline: stage, shape, rounding site, sequence axis, description."""
    op = _operator.get(op)
    lines = [f"Stages of `{op.name}` in pipeline order (`{OUTPUT_PREFIX}` = an output)", "",
             "| stage | shape | site | along the sequence | description |", "|---|---|---|---|---|"]
    for key in pipeline(op):
        spec = spec_of(key, op)
        axis = spec.sequence_axis
        where = "–" if axis is None else f"per {axis[0]} (dim {axis[1]})"
        needs = f" (only with {', '.join(spec.needs)})" if spec.needs else ""
        lines.append(f"| `{key}` | {spec.shape_text()} | {f'`{spec.site}`' if spec.site else '–'} | {where} | "
                     f"{spec.description}{needs} |")
    return "\n".join(lines)


def _token_axes(op: OpLike = None) -> Dict[str, int]:
    axes = {s: sequence_axis(s, op) for s in pipeline(op)}
    return {s: axis[1] for s, axis in axes.items() if _kind(axis) == "token" and axis[1] != 2}


#: The pipeline of the default operator (backward stage 1): its record stages, then its outputs.
STAGES: Tuple[str, ...] = pipeline()
#: Stages of the default operator indexed by chunk along dim 2 (``[B, H, nc, ...]``); the others with a sequence
#: axis are indexed by token.
CHUNK_STAGES: Tuple[str, ...] = chunk_stages()
#: Stages of the default operator with no sequence axis (sums over the tokens).
NO_SEQUENCE_STAGES: Tuple[str, ...] = no_sequence_stages()
#: The token axis of the default operator's token-indexed stages where it is not dim 2 (``dz`` is ``[B, S, H, P]``).
_TOKEN_AXIS: Dict[str, int] = _token_axes()


# ---------------------------------------------------------------------------------------------- building runs
def outputs_dict(outputs: Any, op: OpLike = None) -> Dict[str, Optional[torch.Tensor]]:
    """An operator's outputs by name (every output name; None where absent), from its outputs NamedTuple, a dict
    by output name, a tuple in output order, or the bare tensor of a one-output operator (the forward's oracle)."""
    op = _operator.get(op)
    names = op.output_names
    if isinstance(outputs, torch.Tensor):
        if len(names) != 1:
            raise TypeError(f"a bare tensor is the outputs of a one-output operator only; {op.name} has outputs "
                            f"{list(names)}")
        mapping = {names[0]: outputs}
    elif hasattr(outputs, "_asdict"):
        mapping = outputs._asdict()
    elif isinstance(outputs, Mapping):
        mapping = dict(outputs)
    elif isinstance(outputs, (tuple, list)):
        if len(outputs) != len(names):
            raise ValueError(f"got {len(outputs)} outputs; {op.name} has {len(names)}: {list(names)}")
        mapping = dict(zip(names, outputs))
    else:
        raise TypeError(f"outputs must be a NamedTuple, a dict by output name or a tuple, got "
                        f"{type(outputs).__name__}")
    return {name: mapping.get(name) for name in names}


def make_run(record: Optional[Mapping[str, torch.Tensor]] = None, outputs: Any = None, op: OpLike = None) -> Run:
    """A run from a stage record and/or outputs (see :func:`outputs_dict`; None outputs are skipped)."""
    run: Run = {}
    if record:
        run.update({k: v for k, v in record.items() if v is not None})
    if outputs is not None:
        for name, value in outputs_dict(outputs, op).items():
            if value is not None:
                run[OUTPUT_PREFIX + name] = value
    return run


def lp_dtype_of(inputs: Mapping[str, Any], op: OpLike = None) -> str:
    """The lp dtype name (``"bfloat16"``/``"float16"``) of a case's low-precision inputs (``ValueError`` when there
    are none, or when they mix both)."""
    op = _operator.get(op)
    found = {_LP_NAMES[t.dtype] for t in (inputs.get(n) for n in op.input_names)
             if isinstance(t, torch.Tensor) and t.dtype in _LP_NAMES}
    if len(found) != 1:
        raise ValueError(f"the inputs of {op.name} must hold bfloat16 or float16 tensors of one dtype; found "
                         f"{sorted(found) or 'none'}")
    return found.pop()


@single_threaded
def reference_run(inputs: Mapping[str, Any], policy: Union[str, RoundingPolicy], op: OpLike = None) -> Run:
    """Every recorded stage and output of the policy reference of ``op`` on one case."""
    op = _operator.get(op)
    record: Dict[str, torch.Tensor] = {}
    outputs = op.run_reference(inputs, _presets.resolve(policy), record=record)
    return make_run(record, outputs, op)


def oracle_run(inputs: Mapping[str, Any], op: OpLike = None) -> Run:
    """The FP64 baseline run: the reference under the ``fp64`` preset (nothing rounded, float64; lp dtype of the
    inputs), with its stages.

    The ``fp64`` preset is tested against each operator's independent oracle (``op.run_oracle``), which records no
    stages.
    """
    baseline = _presets.get("fp64").replace(lp_dtype=lp_dtype_of(inputs, op))
    return reference_run(inputs, baseline, op)


def kernels_available(op: OpLike = None) -> bool:
    """Whether ``op`` has Triton kernels (``op.kernels``) and they and Triton itself are importable here."""
    path = _operator.get(op).kernels
    if path is None:
        return False
    try:
        module = importlib.import_module(path.partition(":")[0])
        available = getattr(module, "triton_available", None)
        return True if available is None else bool(available())
    except Exception:  # noqa: BLE001 - any failure means "not available": package missing, import error, ...
        return False


def kernel_run(inputs: Mapping[str, Any], policy: Union[str, RoundingPolicy] = "seed_bf16",
               op: OpLike = None) -> Run:
    """A run of ``op``'s Triton kernels (interpreted on CPU tensors): outputs, plus stages when the kernel records
    them.

    Raises:
        ImportError: when the kernels are not available (see :func:`kernels_available`).
        ValueError: when ``op`` has no kernels.
    """
    op = _operator.get(op)
    kernel = op.load("kernels")
    policy = _presets.resolve(policy)
    record: Dict[str, torch.Tensor] = {}
    params = inspect.signature(kernel).parameters
    extra = {"record": record} if "record" in params else {}
    outputs = kernel(*op.args(inputs), **op.kwargs(inputs), policy=policy, **extra)
    return make_run(record, outputs, op)


def bundle_runs(path, case: Optional[str] = None, op: OpLike = None) -> List[Tuple[str, Mapping[str, Any], Run,
                                                                                     str]]:
    """The cases of a result bundle (``mimo_numerics.bundles``) as ``(name, inputs, run, label)``.

    Args:
        path: the bundle directory. case (str, optional): only this case. op: the operator the bundle holds.

    Returns:
        list: per case with outputs, its name, inputs, an outputs-only run and a label naming the backend and device.
    """
    from .bundles import load_bundle

    bundle = load_bundle(path)
    chosen = [bundle.case(case)] if case is not None else list(bundle)
    result = []
    for c in chosen:
        if c.outputs is None:
            continue
        where = c.device_name or c.device
        label = f"device: {c.backend} on {where}" + (f" ({c.policy.name})" if c.policy is not None else "")
        result.append((c.name, dict(c.inputs), make_run(outputs=c.outputs, op=op), label))
    return result


def policy_at(policy: Union[str, RoundingPolicy], lp_dtype: str) -> Tuple[str, RoundingPolicy]:
    """``(label, policy)`` of a policy moved to ``lp_dtype``: the label is its preset name (``custom`` for none),
    with ``[<lp_dtype>]`` appended when the lp dtype had to change and the result is no preset."""
    resolved = _presets.resolve(policy)
    if resolved.lp_dtype == lp_dtype:
        return resolved.name, resolved
    moved = resolved.replace(lp_dtype=lp_dtype)
    return (moved.name if moved.name != "custom" else f"{resolved.name}[{lp_dtype}]"), moved


@single_threaded
def standard_runs(inputs: Mapping[str, Any],
                  policies: Union[None, Sequence[Union[str, RoundingPolicy]], Mapping[str, Any]] = None,
                  device_outputs: Any = None, device_label: str = "device",
                  emulation_policy: Optional[Union[str, RoundingPolicy]] = "seed_bf16",
                  use_kernels: Optional[bool] = None, op: OpLike = None) -> Dict[str, Run]:
    """The runs notebook 1 and the report compare: baseline, policies and a device result.

    Args:
        inputs (dict): one case of ``op``.
        policies: reference policies to record: a sequence (labelled by preset name, or ``custom<i>``) or a dict
            ``{label: policy}``; default :data:`DEFAULT_POLICIES`, those of them that define ``op``.
        device_outputs: the device's outputs for these inputs (the golden H200 data, a bundle case), labelled
            ``device_label``; when None, the device is emulated: ``op``'s Triton kernels under ``emulation_policy``
            (the NPU port's policy, ``seed_bf16``) when they are available (``use_kernels`` None: auto), else the
            reference under it (also when the kernels refuse the case, with a warning), labelled
            ``"emulation: ..."``, in the inputs' lp dtype. ``emulation_policy`` None, or a policy that defines no
            rounding for ``op`` (with a warning): no device run.
        device_label (str): label of ``device_outputs``.
        use_kernels (bool, optional): force (True) or forbid (False) the kernels for the emulation.
        op: the operator (default: ``registry.DEFAULT_OPERATOR``).

    Returns:
        dict: label -> run, starting with ``"fp64"`` (the baseline).
    """
    op = _operator.get(op)
    runs: Dict[str, Run] = {"fp64": oracle_run(inputs, op)}
    if policies is None:
        policies = [p for p in DEFAULT_POLICIES if _presets.resolve(p).defines(op.name)]
    items = policies.items() if isinstance(policies, Mapping) else [(None, p) for p in policies]
    for label, policy in items:
        resolved = _presets.resolve(policy)
        if label is None:
            label = resolved.name if resolved.name != "custom" else f"custom{len(runs)}"
        runs[label] = reference_run(inputs, resolved, op)
    if device_outputs is not None:
        runs[device_label] = make_run(outputs=device_outputs, op=op)
    elif emulation_policy is not None:
        name, emulation = policy_at(emulation_policy, lp_dtype_of(inputs, op))
        if not emulation.defines(op.name):
            warnings.warn(f"no emulated device run: {name} defines no rounding for {op.name}", stacklevel=2)
            return runs
        kernels = kernels_available(op) if use_kernels is None else use_kernels
        emulated = None
        if kernels:
            try:
                emulated = kernel_run(inputs, emulation, op)
            except (RuntimeError, ValueError) as exc:
                # SlowInterpreterError (a large case on the CPU interpreter), UnsupportedPolicyError: say so
                if use_kernels:
                    raise
                warnings.warn(f"Triton emulation unavailable for this case ({exc}); using the reference",
                              stacklevel=2)
        if emulated is not None:
            runs[f"emulation: Triton {name}"] = emulated
        else:
            runs[f"emulation: reference {name}"] = reference_run(inputs, emulation, op)
    return runs


# ---------------------------------------------------------------------------------------------- metrics
def lp_ulp(x: torch.Tensor, lp_dtype: str = "bfloat16") -> torch.Tensor:
    """The spacing of the lp format at ``|x|`` (float64): ``2**(max(floor(log2|x|), emin) − (p − 1))``.

    Zero and subnormal magnitudes get the subnormal spacing ``2**(emin − p + 1)``.
    """
    precision, emin = _LP_PRECISION[lp_dtype]
    mag = x.detach().to(torch.float64).abs()
    exponent = torch.floor(torch.log2(torch.where(mag > 0, mag, torch.ones_like(mag))))
    exponent = torch.where(mag > 0, exponent, torch.full_like(mag, emin)).clamp(min=emin)
    return torch.pow(2.0, exponent - (precision - 1))


def ulp_error(actual: torch.Tensor, expected: torch.Tensor, lp_dtype: str = "bfloat16") -> torch.Tensor:
    """``|actual − expected|`` in units of the lp ULP at ``expected`` (float64, element-wise).

    Unlike ``metrics.ulp_distance`` this works for values that are not on the lp grid (intermediate stages in
    float32/float64); for two lp values in the same binade it equals the ULP distance.
    """
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {list(actual.shape)} vs {list(expected.shape)}")
    diff = (actual.detach().to(torch.float64) - expected.detach().to(torch.float64)).abs()
    return diff / lp_ulp(expected, lp_dtype)


def _max_ulp(actual, expected, lp_dtype) -> float:
    if actual.numel() == 0:
        return 0.0
    err = ulp_error(actual, expected, lp_dtype)
    if torch.isnan(err).any():
        return math.nan
    return err.max().item()


@dataclass(frozen=True)
class DriftRow:
    """Error of one stage of one run against the baseline (``rel_rms``, ``max_abs``, ``max_ulp`` in lp ULPs)."""

    label: str
    stage: str
    rel_rms: float
    max_abs: float
    max_ulp: float
    numel: int

    def to_dict(self) -> Dict[str, Any]:
        return {"label": self.label, "stage": self.stage, "rel_rms": self.rel_rms, "max_abs": self.max_abs,
                "max_ulp": self.max_ulp, "numel": self.numel}


@dataclass
class DriftTable:
    """Result of :func:`stage_drift`: rows in (run, pipeline stage) order.

    Attributes:
        baseline (str): label of the baseline run. lp_dtype (str): the format of the ULP column.
        rows (list of DriftRow).
        operator (str, optional): the operator whose pipeline orders the stages (None: the default operator).
        order (tuple of str, optional): an explicit stage order instead of the operator's pipeline (runs of a chain
            of operators, whose keys no single pipeline holds); names it lacks follow, sorted.
    """

    baseline: str
    lp_dtype: str
    rows: List[DriftRow] = field(default_factory=list)
    operator: Optional[str] = None
    order: Optional[Tuple[str, ...]] = None

    def labels(self) -> List[str]:
        """Run labels, in order."""
        return list(dict.fromkeys(r.label for r in self.rows))

    def stages(self, label: Optional[str] = None) -> List[str]:
        """Stages present (for one run, or for any), in pipeline order."""
        present = {r.stage for r in self.rows if label is None or r.label == label}
        return _ordered(present, self.operator, self.order)

    def value(self, label: str, stage: str, metric: str = "rel_rms") -> float:
        """One number (``KeyError`` when the run lacks the stage)."""
        for r in self.rows:
            if r.label == label and r.stage == stage:
                return getattr(r, metric)
        raise KeyError(f"no stage {stage!r} for run {label!r}")

    def pivot(self, metric: str = "rel_rms") -> Dict[str, Dict[str, float]]:
        """``{label: {stage: value}}``."""
        if metric not in ("rel_rms", "max_abs", "max_ulp"):
            raise ValueError(f"metric must be rel_rms, max_abs or max_ulp, got {metric!r}")
        table: Dict[str, Dict[str, float]] = {}
        for r in self.rows:
            table.setdefault(r.label, {})[r.stage] = getattr(r, metric)
        return table

    def entry_stage(self, label: str, threshold: float = 0.0, metric: str = "rel_rms") -> Optional[str]:
        """The first stage, in pipeline order, where run ``label`` departs from the baseline by more than
        ``threshold`` (None when it never does)."""
        values = self.pivot(metric).get(label, {})
        for stage in _ordered(values, self.operator, self.order):
            if values[stage] > threshold:
                return stage
        return None

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON types; with an explicit ``order``, ``operator`` is written as given and ``order`` too."""
        out = {"baseline": self.baseline, "lp_dtype": self.lp_dtype,
               "operator": self.operator if self.order is not None else _operator.get(self.operator).name,
               "rows": [r.to_dict() for r in self.rows]}
        if self.order is not None:
            out["order"] = list(self.order)
        return out

    def to_markdown(self, metric: str = "rel_rms") -> str:
        """Stages as rows, runs as columns (``–`` where a run lacks the stage)."""
        table = self.pivot(metric)
        labels = self.labels()
        lines = [f"{metric} against `{self.baseline}`", "", "| stage | " + " | ".join(labels) + " |",
                 "|" + "---|" * (len(labels) + 1)]
        for stage in self.stages():
            cells = [f"{table[l][stage]:.3g}" if stage in table[l] else "–" for l in labels]
            lines.append(f"| `{stage}` | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _ordered(stages: Iterable[str], op: OpLike = None, order: Optional[Sequence[str]] = None) -> List[str]:
    """``stages`` in ``order`` (default: ``op``'s pipeline order); names it does not know follow, sorted."""
    stages = set(stages)
    order = pipeline(op) if order is None else order
    return [s for s in order if s in stages] + sorted(s for s in stages if s not in order)


def _resolve_baseline(runs: Mapping[str, Run], baseline) -> Tuple[str, Run]:
    if isinstance(baseline, str):
        if baseline not in runs:
            raise KeyError(f"baseline {baseline!r} is not one of the runs {list(runs)}")
        return baseline, runs[baseline]
    return "baseline", baseline


def _operator_name(op: OpLike) -> Optional[str]:
    if op is None:
        return None
    composite = _composite(op)
    return composite.name if composite is not None else _operator.get(op).name


@single_threaded
def stage_drift(runs: Mapping[str, Run], baseline: Union[str, Run] = "fp64", lp_dtype: str = "bfloat16",
                stages: Optional[Sequence[str]] = None, op: OpLike = None,
                order: Optional[Sequence[str]] = None) -> DriftTable:
    """Per-stage error of every run against the baseline run.

    Args:
        runs (dict): label -> run (see the module docstring).
        baseline (str | dict): a label of ``runs`` (excluded from the table) or a run.
        lp_dtype (str): format of the ULP column.
        stages (sequence, optional): only these stages (default: every stage the run shares with the baseline).
        op: the operator of the runs (its pipeline orders the rows; default ``registry.DEFAULT_OPERATOR``), or a
            composite operator (the whole op: its chain order).
        order (sequence of str, optional): the stage order instead of ``op``'s pipeline, for runs of a chain of
            operators (``DriftTable.order``; ``op`` is then only the table's label: None, or any name, e.g. the
            chain's).

    Returns:
        DriftTable
    """
    base_label, base = _resolve_baseline(runs, baseline)
    composite = _composite(op)
    if composite is not None:  # the chain's order; the table keeps the composite's name and writes its order
        op, order = composite.name, pipeline(composite) if order is None else order
    order = None if order is None else tuple(order)
    name = op if order is not None and (op is None or isinstance(op, str)) else _operator_name(op)
    table = DriftTable(base_label, lp_dtype, operator=name, order=order)
    for label, run in runs.items():
        if isinstance(baseline, str) and label == baseline:
            continue
        shared = [s for s in _ordered(set(run) & set(base), op if order is None else None, order)
                  if stages is None or s in stages]
        for stage in shared:
            a, e = run[stage], base[stage]
            if tuple(a.shape) != tuple(e.shape):
                raise ValueError(f"run {label!r}, stage {stage!r}: shape {list(a.shape)} differs from the "
                                 f"baseline's {list(e.shape)}")
            table.rows.append(DriftRow(label, stage, rel_rms(a, e), max_abs(a, e), _max_ulp(a, e, lp_dtype),
                                       a.numel()))
    return table


# ---------------------------------------------------------------------------------------------- along the sequence
def _segment_rel_rms(a: torch.Tensor, e: torch.Tensor, dim: int, bounds: Sequence[Tuple[int, int]]) -> np.ndarray:
    a = a.detach().to(torch.float64).movedim(dim, 0)
    e = e.detach().to(torch.float64).movedim(dim, 0)
    values = []
    for lo, hi in bounds:
        ea, ee = a[lo:hi], e[lo:hi]
        norm = torch.linalg.vector_norm(ee).item()
        err = torch.linalg.vector_norm(ea - ee).item()
        values.append(err / norm if norm > 0 else (0.0 if err == 0 else math.nan))
    return np.asarray(values, dtype=np.float64)


@dataclass
class SequenceDrift:
    """Result of :func:`sequence_drift`.

    Attributes:
        per (str): ``"chunk"`` or ``"token"``. baseline (str): the baseline's label.
        positions (ndarray): chunk indices or token indices (the x axis).
        values (dict): label -> stage -> relative RMS error per position (NaN where the baseline is 0 and the run
            is not).
        operator (str, optional): the operator whose pipeline orders the stages (None: the default operator).
    """

    per: str
    baseline: str
    positions: np.ndarray
    values: Dict[str, Dict[str, np.ndarray]]
    operator: Optional[str] = None

    def stages(self) -> List[str]:
        """Stages present, in pipeline order."""
        return _ordered({s for v in self.values.values() for s in v}, self.operator)

    def growth(self, label: str, stage: str) -> float:
        """Last position's error over the first non-zero one (how much the error grew along the sequence)."""
        series = self.values[label][stage]
        finite = series[np.isfinite(series) & (series > 0)]
        return float(finite[-1] / finite[0]) if finite.size >= 1 else math.nan

    def to_dict(self) -> Dict[str, Any]:
        return {"per": self.per, "baseline": self.baseline, "operator": _operator.get(self.operator).name,
                "positions": self.positions.tolist(),
                "values": {l: {s: [None if not np.isfinite(x) else float(x) for x in v] for s, v in st.items()}
                           for l, st in self.values.items()}}


@single_threaded
def sequence_drift(runs: Mapping[str, Run], baseline: Union[str, Run] = "fp64", chunk_size: int = 16,
                   per: str = "chunk", stages: Optional[Sequence[str]] = None, op: OpLike = None) -> SequenceDrift:
    """Relative RMS error of every run against the baseline per chunk (or per token) along the sequence.

    The sequence axis of each stage is its spec's ``Stage.sequence_axis``. Token-indexed stages are grouped into
    chunks of ``chunk_size`` tokens (the last one may be short); chunk-indexed stages (stage 1's ``state``,
    ``causal_scores``, the ``states`` output) are taken per chunk; stages without a sequence axis (and names the
    operator does not have) are left out. With ``per="token"`` only token-indexed stages are reported.

    Args:
        runs (dict): label -> run. baseline (str | dict): a label of ``runs`` or a run.
        chunk_size (int): C of the case. per (str): ``"chunk"`` or ``"token"``.
        stages (sequence, optional): only these stages.
        op: the operator of the runs (default ``registry.DEFAULT_OPERATOR``).

    Returns:
        SequenceDrift
    """
    if per not in ("chunk", "token"):
        raise ValueError(f"per must be 'chunk' or 'token', got {per!r}")
    base_label, base = _resolve_baseline(runs, baseline)
    values: Dict[str, Dict[str, np.ndarray]] = {}
    positions = None
    for label, run in runs.items():
        if isinstance(baseline, str) and label == baseline:
            continue
        for stage in _ordered(set(run) & set(base), op):
            if stages is not None and stage not in stages:
                continue
            axis = sequence_axis(stage, op)
            if axis is None:
                continue
            kind, dim = axis
            length = base[stage].shape[dim]
            if per == "token" and kind == "chunk":
                continue
            if per == "token" or kind == "chunk":
                bounds = [(i, i + 1) for i in range(length)]
            else:
                bounds = [(lo, min(lo + chunk_size, length)) for lo in range(0, length, chunk_size)]
            series = _segment_rel_rms(run[stage], base[stage], dim, bounds)
            values.setdefault(label, {})[stage] = series
            if positions is None or len(series) > len(positions):
                positions = np.arange(len(series))
    return SequenceDrift(per, base_label, positions if positions is not None else np.arange(0), values,
                         _operator_name(op))
