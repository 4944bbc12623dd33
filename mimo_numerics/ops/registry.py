"""The operators of the package: one entry per operator folder.

Adding an operator means its own folder ``mimo_numerics/ops/<name>/`` (``sites.py``, ``spec.py``, reference,
oracle, cases, kernels), its tests, its docs section and one entry in :data:`OPERATORS`; no generic module changes.
This module is the one place (with the package's public re-exports and the CLI defaults) that names operators.

Lookups import only an operator's ``sites.py`` (:func:`site_table`, :func:`preset_sites`), so the policy can be
built without importing any reference; :func:`get` imports its ``spec.py``.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

#: Operators with rounding sites, in chain order (the policy's sections follow this order).
OPERATORS: Tuple[str, ...] = ("mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd")
#: The operator tools use when none is named (stage 1, the package's first operator).
DEFAULT_OPERATOR = "mamba_mimo_bwd_fwd"
#: The operator whose switches a version-1 policy file holds (version 1 knew only backward stage 1).
V1_OPERATOR = "mamba_mimo_bwd_fwd"
#: The whole op (``mn.mamba3_mimo``: preprocessing, the three operators, the FP32 epilogue). A composite, not an
#: operator: it has no policy section of its own (its policy is the three operators' sections and the knobs), so it
#: is not in :data:`OPERATORS`; ``mimo-numerics report --op`` takes it too (:data:`REPORT_OPERATORS`).
WHOLE_OP = "mamba3_mimo"
#: What ``report --op`` accepts: every operator, then the whole op.
REPORT_OPERATORS: Tuple[str, ...] = OPERATORS + (WHOLE_OP,)


def check(name: str) -> str:
    """``name`` if it is a registered operator, else ``ValueError`` listing them."""
    if name not in OPERATORS:
        raise ValueError(f"unknown operator {name!r}; operators: {list(OPERATORS)}")
    return name


def _module(name: str, part: str):
    return importlib.import_module(f"mimo_numerics.ops.{check(name)}.{part}")


def site_table(name: str) -> Dict[str, str]:
    """Site -> description of operator ``name``, in kernel order."""
    return dict(_module(name, "sites").SITES)


def preset_sites(name: str) -> Dict[str, Any]:
    """Preset -> ``"all"``, ``"none"`` or ``{site: bool}`` for operator ``name`` (absent presets: undefined)."""
    return dict(_module(name, "sites").PRESET_SITES)


def preset_evidence(name: str) -> Dict[str, str]:
    """Preset -> the evidence behind it on operator ``name``."""
    return dict(getattr(_module(name, "sites"), "PRESET_EVIDENCE", {}))


def get(name: str):
    """The :class:`mimo_numerics.operator.Operator` of ``name`` (imports its ``spec.py``)."""
    return _module(name, "spec").OPERATOR


def whole_op():
    """The whole op's composite spec (``mimo_numerics.ops.mamba3_mimo.spec.OPERATOR``, a ``CompositeOperator``)."""
    return importlib.import_module(f"mimo_numerics.ops.{WHOLE_OP}.spec").OPERATOR


def composite(op: Any):
    """The composite spec ``op`` names (:data:`WHOLE_OP` or a spec with ``components``), else None (an operator of
    :data:`OPERATORS`, an ``Operator``, or None)."""
    if isinstance(op, str):
        return whole_op() if op == WHOLE_OP else None
    return op if getattr(op, "components", None) is not None else None
