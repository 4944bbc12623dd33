"""Where error enters and how it grows: per-stage and per-chunk error of runs of ``mamba_mimo_bwd_fwd``.

A *run* is a plain dict of named tensors: the per-stage tensors of the reference's ``record=`` (stage names in
``mimo_numerics.reference``; also the kernels' stage capture when it uses the same names) plus the outputs under
``"output.<name>"`` (:func:`make_run`). Runs that have only outputs (a device, a bundle, the golden data) are runs
too: comparisons use the stages two runs share. The FP64 baseline run is the reference under the ``fp64`` preset
with ``record=`` (:func:`oracle_run`).

* :func:`stage_drift` -> :class:`DriftTable`: per run and stage, relative RMS, max abs error and max error in lp ULPs
  against a baseline run; :meth:`DriftTable.entry_stage` names the first stage (in pipeline order) where a run
  departs from the baseline.
* :func:`sequence_drift` -> :class:`SequenceDrift`: the same along the sequence, per chunk or per token.
* :func:`standard_runs`: the runs of notebook 1 and of the report (FP64 baseline, FP32 math, the policies asked for,
  and a device: given outputs, a bundle, or the Triton kernels under ``seed_bf16`` labelled as emulation).

Everything takes and returns tensors and dicts, so a bundle's dict of tensors can be fed in directly.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import presets as _presets
from .inference import run_reference, single_threaded
from .metrics import max_abs, rel_rms
from .outputs import OUTPUT_NAMES
from .policy import RoundingPolicy

#: Prefix of output tensors in a run.
OUTPUT_PREFIX = "output."
#: The stages of ``reference.mamba_mimo_bwd_fwd(record=...)`` in pipeline order, then the outputs.
STAGES: Tuple[str, ...] = (
    "q_biased", "k_biased", "qk_dot", "q_rot", "k_rot", "gamma", "shifted_gamma", "trap_scale", "k_scaled", "psiv",
    "k_state", "state", "state_operand", "inter", "causal_scores", "intra", "diag_accum", "diag", "out", "gate",
    "dphio", "dzz", "dz_accum",
) + tuple(OUTPUT_PREFIX + o for o in OUTPUT_NAMES)
#: Stages indexed by chunk along dim 2 (``[B, H, nc, ...]``); the others with a sequence axis are indexed by token.
CHUNK_STAGES = ("state", "state_operand", "causal_scores", OUTPUT_PREFIX + "states")
#: Stages with no sequence axis (sums over the tokens).
NO_SEQUENCE_STAGES = (OUTPUT_PREFIX + "dmimo_o", OUTPUT_PREFIX + "dmimo_z")
#: The token axis of each token-indexed stage (2 for ``[B, H, S, ...]``; the ``dz`` output is ``[B, S, H, P]``).
_TOKEN_AXIS = {OUTPUT_PREFIX + "dz": 1}
_LP_PRECISION = {"bfloat16": (8, -126), "float16": (11, -14)}

Run = Dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------- building runs
def make_run(record: Optional[Mapping[str, torch.Tensor]] = None, outputs: Any = None) -> Run:
    """A run from a stage record and/or outputs (a dict by output name or ``MimoBwdFwdOutputs``; None skipped)."""
    run: Run = {}
    if record:
        run.update({k: v for k, v in record.items() if v is not None})
    if outputs is not None:
        mapping = outputs._asdict() if hasattr(outputs, "_asdict") else dict(outputs)
        for name in OUTPUT_NAMES:
            if mapping.get(name) is not None:
                run[OUTPUT_PREFIX + name] = mapping[name]
    return run


def reference_run(inputs: Mapping[str, Any], policy: Union[str, RoundingPolicy]) -> Run:
    """Every recorded stage and output of the policy reference on one case."""
    record: Dict[str, torch.Tensor] = {}
    outputs = run_reference(inputs, policy, record=record)
    return make_run(record, outputs)


def oracle_run(inputs: Mapping[str, Any]) -> Run:
    """The FP64 baseline run: the reference under the ``fp64`` preset (nothing rounded, float64), with its stages.

    The ``fp64`` preset is tested against the independent oracle (``mimo_numerics.oracle``), which records no stages.
    """
    return reference_run(inputs, "fp64")


def kernels_available() -> bool:
    """Whether the Triton kernels (``mimo_numerics.kernels``) and Triton itself are importable here."""
    try:
        from .kernels import triton_available
    except Exception:  # noqa: BLE001 - any failure means "not available": package missing, import error, ...
        return False
    return bool(triton_available())


def kernel_run(inputs: Mapping[str, Any], policy: Union[str, RoundingPolicy] = "seed_bf16") -> Run:
    """A run of the Triton kernels (interpreted on CPU tensors): outputs, plus stages when the kernel records them.

    Raises:
        ImportError: when the kernels are not available (see :func:`kernels_available`).
    """
    from .cases import as_args, as_kwargs
    from .kernels import mamba_mimo_bwd_fwd as kernel

    policy = _presets.resolve(policy)
    record: Dict[str, torch.Tensor] = {}
    params = inspect.signature(kernel).parameters
    extra = {"record": record} if "record" in params else {}
    outputs = kernel(*as_args(inputs), **as_kwargs(inputs), policy=policy, **extra)
    return make_run(record, outputs)


def bundle_runs(path, case: Optional[str] = None) -> List[Tuple[str, Mapping[str, Any], Run, str]]:
    """The cases of a result bundle (``mimo_numerics.bundles``) as ``(name, inputs, run, label)``.

    Args:
        path: the bundle directory. case (str, optional): only this case.

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
        result.append((c.name, dict(c.inputs), make_run(outputs=c.outputs), label))
    return result


@single_threaded
def standard_runs(inputs: Mapping[str, Any], policies: Sequence[Union[str, RoundingPolicy]] = ("fp32", "seed_bf16",
                                                                                                "upstream_sm90"),
                  device_outputs: Any = None, device_label: str = "device",
                  emulation_policy: Optional[Union[str, RoundingPolicy]] = "seed_bf16",
                  use_kernels: Optional[bool] = None) -> Dict[str, Run]:
    """The runs notebook 1 and the report compare: baseline, policies and a device result.

    Args:
        inputs (dict): one case.
        policies: reference policies to record (labelled by preset name, or ``custom``).
        device_outputs: the device's outputs for these inputs (the golden H200 data, a bundle case), labelled
            ``device_label``; when None, the device is emulated: the Triton kernels under ``emulation_policy``
            (the NPU port's policy, ``seed_bf16``) when they are available (``use_kernels`` None: auto), else the
            reference under it (also when the kernels refuse the case, with a warning), labelled
            ``"emulation: ..."``. ``emulation_policy`` None: no device run.
        device_label (str): label of ``device_outputs``.
        use_kernels (bool, optional): force (True) or forbid (False) the kernels for the emulation.

    Returns:
        dict: label -> run, starting with ``"fp64"`` (the baseline).
    """
    runs: Dict[str, Run] = {"fp64": oracle_run(inputs)}
    for policy in policies:
        resolved = _presets.resolve(policy)
        runs[resolved.name if resolved.name != "custom" else f"custom{len(runs)}"] = reference_run(inputs, resolved)
    if device_outputs is not None:
        runs[device_label] = make_run(outputs=device_outputs)
    elif emulation_policy is not None:
        name = _presets.resolve(emulation_policy).name
        kernels = kernels_available() if use_kernels is None else use_kernels
        emulated = None
        if kernels:
            try:
                emulated = kernel_run(inputs, emulation_policy)
            except (RuntimeError, ValueError) as exc:
                # SlowInterpreterError (a large case on the CPU interpreter), UnsupportedPolicyError: say so
                if use_kernels:
                    raise
                warnings.warn(f"Triton emulation unavailable for this case ({exc}); using the reference",
                              stacklevel=2)
        if emulated is not None:
            runs[f"emulation: Triton {name}"] = emulated
        else:
            runs[f"emulation: reference {name}"] = reference_run(inputs, emulation_policy)
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
    """

    baseline: str
    lp_dtype: str
    rows: List[DriftRow] = field(default_factory=list)

    def labels(self) -> List[str]:
        """Run labels, in order."""
        return list(dict.fromkeys(r.label for r in self.rows))

    def stages(self, label: Optional[str] = None) -> List[str]:
        """Stages present (for one run, or for any), in pipeline order."""
        present = {r.stage for r in self.rows if label is None or r.label == label}
        return [s for s in _ordered(present)]

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
        for stage in _ordered(values):
            if values[stage] > threshold:
                return stage
        return None

    def to_dict(self) -> Dict[str, Any]:
        return {"baseline": self.baseline, "lp_dtype": self.lp_dtype, "rows": [r.to_dict() for r in self.rows]}

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


def _ordered(stages: Iterable[str]) -> List[str]:
    stages = list(stages)
    known = [s for s in STAGES if s in stages]
    return known + sorted(s for s in stages if s not in STAGES)


def _resolve_baseline(runs: Mapping[str, Run], baseline) -> Tuple[str, Run]:
    if isinstance(baseline, str):
        if baseline not in runs:
            raise KeyError(f"baseline {baseline!r} is not one of the runs {list(runs)}")
        return baseline, runs[baseline]
    return "baseline", baseline


def stage_drift(runs: Mapping[str, Run], baseline: Union[str, Run] = "fp64", lp_dtype: str = "bfloat16",
                stages: Optional[Sequence[str]] = None) -> DriftTable:
    """Per-stage error of every run against the baseline run.

    Args:
        runs (dict): label -> run (see the module docstring).
        baseline (str | dict): a label of ``runs`` (excluded from the table) or a run.
        lp_dtype (str): format of the ULP column.
        stages (sequence, optional): only these stages (default: every stage the run shares with the baseline).

    Returns:
        DriftTable
    """
    base_label, base = _resolve_baseline(runs, baseline)
    table = DriftTable(base_label, lp_dtype)
    for label, run in runs.items():
        if isinstance(baseline, str) and label == baseline:
            continue
        shared = [s for s in _ordered(set(run) & set(base)) if stages is None or s in stages]
        for stage in shared:
            a, e = run[stage], base[stage]
            if tuple(a.shape) != tuple(e.shape):
                raise ValueError(f"run {label!r}, stage {stage!r}: shape {list(a.shape)} differs from the "
                                 f"baseline's {list(e.shape)}")
            table.rows.append(DriftRow(label, stage, rel_rms(a, e), max_abs(a, e), _max_ulp(a, e, lp_dtype),
                                       a.numel()))
    return table


# ---------------------------------------------------------------------------------------------- along the sequence
def sequence_axis(stage: str) -> Optional[Tuple[str, int]]:
    """``("chunk" | "token", dim)`` of a stage's sequence axis, or None for stages without one."""
    if stage in NO_SEQUENCE_STAGES:
        return None
    if stage in CHUNK_STAGES:
        return "chunk", 2
    return "token", _TOKEN_AXIS.get(stage, 2)


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
    """

    per: str
    baseline: str
    positions: np.ndarray
    values: Dict[str, Dict[str, np.ndarray]]

    def stages(self) -> List[str]:
        return _ordered({s for v in self.values.values() for s in v})

    def growth(self, label: str, stage: str) -> float:
        """Last position's error over the first non-zero one (how much the error grew along the sequence)."""
        series = self.values[label][stage]
        finite = series[np.isfinite(series) & (series > 0)]
        return float(finite[-1] / finite[0]) if finite.size >= 1 else math.nan

    def to_dict(self) -> Dict[str, Any]:
        return {"per": self.per, "baseline": self.baseline, "positions": self.positions.tolist(),
                "values": {l: {s: [None if not np.isfinite(x) else float(x) for x in v] for s, v in st.items()}
                           for l, st in self.values.items()}}


def sequence_drift(runs: Mapping[str, Run], baseline: Union[str, Run] = "fp64", chunk_size: int = 16,
                   per: str = "chunk", stages: Optional[Sequence[str]] = None) -> SequenceDrift:
    """Relative RMS error of every run against the baseline per chunk (or per token) along the sequence.

    Token-indexed stages are grouped into chunks of ``chunk_size`` tokens (the last one may be short);
    chunk-indexed stages (``state``, ``causal_scores``, the ``states`` output) are taken per chunk. With
    ``per="token"`` only token-indexed stages are reported.

    Args:
        runs (dict): label -> run. baseline (str | dict): a label of ``runs`` or a run.
        chunk_size (int): C of the case. per (str): ``"chunk"`` or ``"token"``.
        stages (sequence, optional): only these stages.

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
        for stage in _ordered(set(run) & set(base)):
            if stages is not None and stage not in stages:
                continue
            axis = sequence_axis(stage)
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
    return SequenceDrift(per, base_label, positions if positions is not None else np.arange(0), values)
