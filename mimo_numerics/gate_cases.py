"""The cases the accuracy gates (:mod:`mimo_numerics.testing`) run, and their cached inputs, reference and oracle.

A case spec of an operator's grids (``op.cases(name)``) gives the CPU inputs (``op.draw``); the policy reference and
the FP64 oracle run on them once per (operator, case, policy) for the process. :func:`as_output_dict` reads any
implementation's result (named tuple, tuple, dict, one tensor) as ``{output name: tensor}``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import torch

from . import operator as _operator
from . import presets as _presets
from .policy import RoundingPolicy

__all__ = ["OperatorLike", "CasesLike", "PolicyLike", "resolve_cases", "clear_case_cache", "case_inputs",
           "reference_outputs", "oracle_outputs", "as_output_dict", "policy_label"]

OperatorLike = Union[None, str, "_operator.Operator"]
CasesLike = Union[str, Any, Iterable[Any]]
PolicyLike = Union[str, RoundingPolicy]


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


def clear_case_cache() -> None:
    """Forget the cached inputs, reference and oracle results of this process."""
    for cache in (_INPUTS, _ORACLE, _REFERENCE):
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



def as_output_dict(result, op) -> Dict[str, Optional[torch.Tensor]]:
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



def policy_label(policy: RoundingPolicy, op: OperatorLike = None) -> str:
    """:func:`mimo_numerics.presets.label` of ``policy`` on operator ``op`` (its section and the knobs)."""
    return _presets.label(policy, operator=_operator.get(op).name)
