"""Non-finite values (NaN, ±Inf) in an operator's reference: where they first appear, and where they must show up.

Every function takes the operator as ``op`` (a registry name, an ``Operator`` or None for
``registry.DEFAULT_OPERATOR``, backward stage 1); the stage order and the sites come from its spec
(``mimo_numerics.operator``: ``op.stages`` and ``Stage.site``). Two tools, both described in ``docs/nonfinite.md``:

* **Locating**: :func:`first_nonfinite` / :func:`first_nonfinite_stage` take a stage record of the reference (or of
  the kernels, which record under the same names) or a drift *run* (``mimo_numerics.drift``: stages plus
  ``"output.<name>"`` tensors) and return the first stage, in pipeline order (:func:`pipeline`, the order of
  ``drift.pipeline``), that holds a non-finite value, with the rounding switch of that stage (the *site*, e.g.
  ``psiv`` for an FP16 overflow of v·Ψ; :func:`stage_switches`). :func:`locate_nonfinite` runs the reference with a
  record and does it in one call; :func:`nonfinite_switches` says which rounding switches of a policy a non-finite
  result depends on (turning one off makes it go away or moves it).
* **Predicting**: :func:`predict_nan_outputs` gives, for one NaN placed at one element of one input (every other
  input finite and moderate), the output elements that must be NaN when the operator's math is evaluated in IEEE
  arithmetic; :func:`predict_nonfinite_outputs` does the same for ±Inf. The rules live with the operator
  (``OPERATOR.extra["nonfinite_rules"]``, a module path); today backward stage 1 has them (the tables of
  ``docs/nonfinite.md``, checked by ``tests/test_reliability_nonfinite.py`` on the reference and the kernels).

Classes of values (:func:`value_class`): 0 finite, 1 NaN, 2 +Inf, 3 −Inf.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import operator as _operator

OpLike = Union[str, "_operator.Operator", None]

#: Prefix of output tensors in a drift run (same as ``drift.OUTPUT_PREFIX``).
OUTPUT_PREFIX = "output."


def pipeline(op: OpLike = None) -> Tuple[str, ...]:
    """``op``'s record stages in computation order, then its outputs as ``"output.<name>"`` (the order of
    ``drift.pipeline``, derived here from the spec too so that this module imports nothing heavy)."""
    op = _operator.get(op)
    return op.stage_names + tuple(OUTPUT_PREFIX + name for name in op.output_names)


def stage_switches(op: OpLike = None) -> Dict[str, Optional[str]]:
    """Stage -> the policy switch that rounds it (the site an FP16/BF16 overflow to ±Inf happens at), None for
    stages computed in the math dtype only: ``Stage.site`` of the record stages; ``round_outputs`` for the outputs
    stored in lp (``op.lp_outputs``), the output's own site (None for FP32 sums) for the others."""
    op = _operator.get(op)
    switches: Dict[str, Optional[str]] = {s.name: s.site for s in op.stages}
    for s in op.outputs:
        switches[OUTPUT_PREFIX + s.name] = "round_outputs" if s.name in op.lp_outputs else s.site
    return switches


#: The default operator's pipeline (backward stage 1): its record stages, then its outputs.
PIPELINE: Tuple[str, ...] = pipeline()
#: The default operator's :func:`stage_switches`: the lp output stores (``states``, ``qk_dot``, ``dz``) round under
#: ``round_outputs``; ``dmimo_o``/``dmimo_z`` are FP32 sums.
STAGE_SWITCH: Dict[str, Optional[str]] = stage_switches()

_CLASS_NAMES = {1: "nan", 2: "+inf", 3: "-inf"}


# ---------------------------------------------------------------------------------------------- classes of values
def value_class(t: torch.Tensor) -> torch.Tensor:
    """Per element: 0 finite, 1 NaN, 2 +Inf, 3 −Inf (int8, same shape; any floating dtype)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    x = t.detach()
    out = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    if not x.is_floating_point():
        return out
    out = torch.where(torch.isnan(x), torch.ones_like(out), out)
    out = torch.where(torch.isposinf(x), torch.full_like(out, 2), out)
    return torch.where(torch.isneginf(x), torch.full_like(out, 3), out)


def nonfinite_mask(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``~isfinite(t)`` (None for None)."""
    return None if t is None else ~torch.isfinite(t.detach())


def _outputs_by_name(outputs: Any, op) -> Dict[str, Any]:
    """An outputs NamedTuple, a dict by output name or the bare tensor of a one-output operator, as a dict."""
    if isinstance(outputs, torch.Tensor) and len(op.output_names) == 1:
        return {op.output_names[0]: outputs}
    return outputs._asdict() if hasattr(outputs, "_asdict") else dict(outputs)


def pattern_mismatches(actual, expected, exact: bool = True, op: OpLike = None) -> Dict[str, Optional[int]]:
    """Per output, the number of elements whose class differs (``exact``) or whose finiteness differs.

    Args:
        actual, expected: ``op``'s outputs NamedTuples or dicts by output name.
        exact (bool): compare the full class (NaN, +Inf, −Inf, finite); False compares only finite vs non-finite.
        op: the operator (default ``registry.DEFAULT_OPERATOR``).

    Returns:
        dict: output name -> mismatch count, None where both are None.

    Raises:
        ValueError: when one side has an output the other lacks, or the shapes differ.
    """
    op = _operator.get(op)
    a_all, e_all = _outputs_by_name(actual, op), _outputs_by_name(expected, op)
    result: Dict[str, Optional[int]] = {}
    for name in op.output_names:
        a, e = a_all.get(name), e_all.get(name)
        if a is None and e is None:
            result[name] = None
            continue
        if a is None or e is None:
            raise ValueError(f"output {name}: present on one side only")
        if tuple(a.shape) != tuple(e.shape):
            raise ValueError(f"output {name}: shapes {list(a.shape)} and {list(e.shape)} differ")
        if exact:
            diff = value_class(a).cpu() != value_class(e).cpu()
        else:
            diff = nonfinite_mask(a).cpu() != nonfinite_mask(e).cpu()
        result[name] = int(diff.sum())
    return result


# ---------------------------------------------------------------------------------------------- locating
@dataclass(frozen=True)
class NonFinite:
    """Non-finite values of one stage.

    Attributes:
        stage (str): the stage (a record name, or ``"output.<name>"``).
        count (int): number of non-finite elements. total (int): number of elements.
        nan, posinf, neginf (int): counts per class.
        index (tuple): the first non-finite element (row-major order).
        kind (str): ``"nan"``, ``"+inf"`` or ``"-inf"``: the class of that element.
        switch (str | None): the policy switch rounding this stage (:func:`stage_switches`), None for math-dtype
            stages.
    """

    stage: str
    count: int
    total: int
    nan: int
    posinf: int
    neginf: int
    index: Tuple[int, ...]
    kind: str
    switch: Optional[str]

    def describe(self) -> str:
        site = f" (rounded by switch {self.switch!r})" if self.switch else " (math dtype, not a rounding site)"
        return (f"{self.stage}{site}: {self.count}/{self.total} non-finite (NaN {self.nan}, +Inf {self.posinf}, "
                f"-Inf {self.neginf}); first at index {list(self.index)} ({self.kind})")


def _as_run(record: Optional[Mapping[str, Any]], outputs: Any, op) -> Dict[str, torch.Tensor]:
    run: Dict[str, torch.Tensor] = {}
    if record is not None:
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a dict of named tensors, got {type(record).__name__}")
        for name, value in record.items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"record[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
            run[name] = value
    if outputs is not None:
        mapping = _outputs_by_name(outputs, op)
        unknown = sorted(set(mapping) - set(op.output_names))
        if unknown:
            raise ValueError(f"unknown output name(s) {unknown}; outputs of {op.name} are {list(op.output_names)}")
        for name in op.output_names:
            if mapping.get(name) is not None:
                run[OUTPUT_PREFIX + name] = mapping[name]
    return run


def pipeline_order(stages, op: OpLike = None) -> List[str]:
    """``stages`` sorted in ``op``'s pipeline order (:func:`pipeline`); unknown names follow, in their given order."""
    stages = list(stages)
    order = pipeline(op)
    return [s for s in order if s in stages] + [s for s in stages if s not in order]


def _describe_stage(stage: str, tensor: torch.Tensor, switches: Mapping[str, Optional[str]]) -> Optional[NonFinite]:
    cls = value_class(tensor).reshape(-1).cpu()
    bad = cls != 0
    count = int(bad.sum())
    if count == 0:
        return None
    flat = int(torch.nonzero(bad)[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(tensor.shape))) if tensor.dim() else ()
    return NonFinite(stage=stage, count=count, total=int(cls.numel()), nan=int((cls == 1).sum()),
                     posinf=int((cls == 2).sum()), neginf=int((cls == 3).sum()), index=index,
                     kind=_CLASS_NAMES[int(cls[flat])], switch=switches.get(stage))


def _scan(record, outputs, op, first_only: bool) -> List[NonFinite]:
    op = _operator.get(op)
    run = _as_run(record, outputs, op)
    switches = stage_switches(op)
    found = []
    for stage in pipeline_order(run, op):
        item = _describe_stage(stage, run[stage], switches)
        if item is not None:
            found.append(item)
            if first_only:
                break
    return found


def nonfinite_stages(record: Optional[Mapping[str, Any]] = None, outputs: Any = None,
                     op: OpLike = None) -> List[NonFinite]:
    """Every stage (and output) holding a non-finite value, in pipeline order.

    Args:
        record (dict, optional): a stage record (``record=`` of the reference or the kernels) or a drift run.
        outputs (optional): ``op``'s outputs NamedTuple or a dict by output name, checked after the stages.
        op: the operator (default ``registry.DEFAULT_OPERATOR``).
    """
    return _scan(record, outputs, op, first_only=False)


def first_nonfinite(record: Optional[Mapping[str, Any]] = None, outputs: Any = None,
                    op: OpLike = None) -> Optional[NonFinite]:
    """The first stage, in pipeline order, holding a non-finite value (None when everything is finite)."""
    found = _scan(record, outputs, op, first_only=True)
    return found[0] if found else None


def first_nonfinite_stage(record: Optional[Mapping[str, Any]] = None, outputs: Any = None,
                          op: OpLike = None) -> Optional[str]:
    """The name of :func:`first_nonfinite`'s stage, or None."""
    item = first_nonfinite(record, outputs, op)
    return None if item is None else item.stage


def nonfinite_inputs(inputs: Mapping[str, Any], op: OpLike = None) -> Dict[str, int]:
    """Inputs of ``op`` holding non-finite values, with their counts (absent or all-finite inputs are left out)."""
    result = {}
    for name in _operator.get(op).input_names:
        value = inputs.get(name)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            count = int((~torch.isfinite(value.detach())).sum())
            if count:
                result[name] = count
    return result


def locate_nonfinite(inputs: Mapping[str, Any], policy: Any = "upstream_sm90",
                     op: OpLike = None) -> Optional[NonFinite]:
    """Run ``op``'s reference on ``inputs`` (an ``op.draw`` dict) with a record; :func:`first_nonfinite`."""
    op = _operator.get(op)
    record: Dict[str, torch.Tensor] = {}
    with torch.no_grad():
        outputs = op.run_reference(inputs, policy, record=record)
    return first_nonfinite(record, outputs, op)


def nonfinite_switches(inputs: Mapping[str, Any], policy: Any = "upstream_sm90",
                       op: OpLike = None) -> Dict[str, Optional[NonFinite]]:
    """Which rounding switches a non-finite result depends on.

    For every switch that is on in ``policy`` (and ``round_outputs`` when on), the first non-finite stage of the
    reference with that one switch turned off. A switch whose entry is None, or names a later stage than
    :func:`locate_nonfinite` under ``policy`` itself, is where the overflow happens; switches whose entry is
    unchanged do not matter.

    Returns:
        dict: switch -> ``NonFinite`` or None (everything finite with that switch off), in the site order of
        ``registry.site_table(op)``, then ``round_outputs``.
    """
    from . import presets
    from .ops import registry
    from .policy import read_field, write_fields

    op = _operator.get(op)
    policy = presets.resolve(policy)
    result: Dict[str, Optional[NonFinite]] = {}
    for name in tuple(registry.site_table(op.name)) + ("round_outputs",):
        if read_field(policy, op.name, name):
            result[name] = locate_nonfinite(inputs, write_fields(policy, op.name, **{name: False}), op)
    return result


# ---------------------------------------------------------------------------------------------- predicting
def rotary_partners(n: int, state_dim: int, rotary_dim_divisor: int) -> List[int]:
    """The state columns that column ``n`` of q̃ or k̃ reaches through the rotation: its rotary pair, or itself."""
    width, half = state_dim // rotary_dim_divisor, state_dim // 2
    if n < width:
        return [n, half + n]
    if half <= n < half + width:
        return [n - half, n]
    return [n]


def _rules(op: OpLike):
    """The module of ``op``'s propagation rules (``ValueError`` naming the operator when it has none)."""
    op = _operator.get(op)
    path = op.extra.get("nonfinite_rules")
    if path is None:
        raise ValueError(f"operator {op.name} has no non-finite propagation rules (docs/nonfinite.md states them "
                         "for the operators that have them); locate non-finite values with locate_nonfinite")
    return importlib.import_module(path)


def predict_nan_outputs(inputs_or_dims, name: str, index: Sequence[int],
                        op: OpLike = None) -> Dict[str, Optional[torch.Tensor]]:
    """The output elements a single NaN at ``inputs[name][index]`` makes NaN (``docs/nonfinite.md``, table 1).

    The prediction evaluates the operator's math in IEEE arithmetic: NaN enters every sum and product it takes
    part in, including products with the exact zeros of the causal mask inside the chunk GEMMs (``0·NaN = NaN``),
    and is stopped only where a value is *selected* away: the causal mask of the scores and of ``exp(segsum)``,
    padding rows, the shifted γ of the last token. Every other input must be finite and small enough not to
    overflow; then the prediction is exact for the reference (any policy) and the Triton kernels. It does not depend
    on the policy or on the values of the other inputs.

    Args:
        inputs_or_dims: an inputs dict of ``op`` (validated) or its ``Dims``.
        name (str): one of ``op.input_names`` (not None in these inputs).
        index (sequence of int): a full index into that input.
        op: the operator (default: backward stage 1, the one with rules today).

    Returns:
        dict: output name -> bool tensor of the output's shape (True = NaN expected), None for absent outputs.
    """
    return _rules(op).predict_nan_outputs(inputs_or_dims, name, index)


def predict_nonfinite_outputs(inputs_or_dims, name: str, index: Sequence[int], value: float = float("nan"),
                              op: OpLike = None) -> Dict[str, Optional[torch.Tensor]]:
    """The output elements a single NaN, +Inf or −Inf at ``inputs[name][index]`` makes non-finite.

    A NaN gives :func:`predict_nan_outputs`. An infinity reaches the same elements (it turns into NaN at the first
    ``Inf·0`` or ``Inf − Inf`` and stays non-finite through every sum, product and rounding), except where the
    function it enters is bounded there (``docs/nonfinite.md``, table 2): ``trap = ±Inf`` gives σ = 1 or 0 and
    finite outputs; ``da_cs``, ``da_cs_rev`` or ``segsum`` = −Inf gives ``exp = 0``, a complete decay, and finite
    outputs. The class of each element (NaN or which infinity) is not predicted, only that it is not finite.

    Returns:
        dict: output name -> bool tensor (True = non-finite expected), None for absent outputs.
    """
    return _rules(op).predict_nonfinite_outputs(inputs_or_dims, name, index, value)


def with_value(inputs: Mapping[str, Any], name: str, index: Sequence[int], value: float,
               op: OpLike = None) -> Dict[str, Any]:
    """A copy of ``inputs`` with ``inputs[name][index] = value`` (the other tensors shared, not copied)."""
    if name not in _operator.get(op).input_names or inputs.get(name) is None:
        raise ValueError(f"input {name!r} is absent or unknown")
    result = dict(inputs)
    tensor = inputs[name].clone()
    tensor[tuple(int(i) for i in index)] = value
    result[name] = tensor
    return result


def __getattr__(name: str):
    # EXP_ONLY_INPUTS and SIGMOID_ONLY_INPUTS of the default operator's rules, where this module defined them before
    # the rules moved to the operator's folder
    if name in ("EXP_ONLY_INPUTS", "SIGMOID_ONLY_INPUTS"):
        return getattr(_rules(None), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PIPELINE", "STAGE_SWITCH", "NonFinite", "pipeline", "stage_switches", "value_class", "nonfinite_mask",
    "pattern_mismatches", "pipeline_order", "nonfinite_stages", "first_nonfinite", "first_nonfinite_stage",
    "nonfinite_inputs", "locate_nonfinite", "nonfinite_switches", "rotary_partners", "predict_nan_outputs",
    "predict_nonfinite_outputs", "with_value",
]
