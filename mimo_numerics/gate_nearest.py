"""Which preset a failing implementation's outputs are nearest to: the hint in a gate's failure message."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

import torch

from . import operator as _operator
from . import presets as _presets
from .gate_cases import OperatorLike, as_output_dict, case_inputs, reference_outputs
from .metrics import rel_rms
from .policy import ALL_KNOBS, RoundingPolicy

__all__ = ["NEAREST_PRESET_MAX_CASES", "NEAREST_PRESET_MAX_SIZE", "NEAREST_PRESET_FACTOR", "PresetMatch",
           "nearest_preset", "case_size"]


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


def case_size(case, op) -> int:
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
    claimed = _outputs_distance(fn_outputs, as_output_dict(reference_outputs(case, policy, op), op))
    if math.isnan(claimed):
        return None
    best = None
    for label, candidate in _candidate_presets(policy, op):
        distance = _outputs_distance(fn_outputs, as_output_dict(reference_outputs(case, candidate, op), op))
        if not math.isnan(distance) and (best is None or distance < best[2]):
            best = (label, candidate, distance)
    if best is None:
        return None
    return PresetMatch(case.case_id, policy, claimed, best[0], best[1], best[2], operator=op.name)
