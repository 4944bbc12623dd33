"""What the generic tools know of an operator: its :class:`Operator` spec.

Each operator folder ``mimo_numerics/ops/<name>/`` has a ``spec.py`` with ``OPERATOR = Operator(...)``: the input
and output names, the stage list its reference records, the knobs that act on it, and where its reference, oracle,
cases, golden data, upstream runner and kernels live (``"module:attribute"`` paths, imported on first use, so a
spec can be read without importing torch-heavy modules or Triton). Gates, bundles, sweeps, drift, sensitivity,
inference, plots, reports and the CLI take an operator and use only this interface.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


@dataclass(frozen=True)
class Stage:
    """One named intermediate the reference records (``record=``).

    Attributes:
        name (str): the record key. shape (str): its shape in dimension letters, e.g. ``"[B, H, S, R, N]"``.
        description (str): what it is, with the site(s) that round it.
        site (str | None): the switch whose rounding produces it, when there is one (used to explain where a
            non-finite value first appears and to annotate drift plots).
    """

    name: str
    shape: str
    description: str
    site: Optional[str] = None


def _load(path: Optional[str]):
    if path is None:
        return None
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Operator:
    """One operator of the op.

    Attributes:
        name (str): the registry name (also the policy section).
        title (str): a one-line description.
        input_names (tuple): tensor arguments in the API's positional order.
        optional_inputs (tuple): those that may be None.
        scalar_inputs (tuple): keyword integers after the tensors (``chunk_size``, ``rotary_dim_divisor``).
        output_names (tuple): outputs in tuple order.
        lp_outputs (tuple): outputs stored in the low-precision dtype (the others are float32).
        stages (tuple of Stage): what ``record=`` fills, in computation order.
        knobs (tuple): the policy knobs that act on this operator.
        reference, oracle (str): ``"module:function"`` of the policy reference ``fn(*tensors, **scalars, policy=,
            record=)`` and of the FP64 oracle ``fn(*tensors, **scalars)``.
        make_inputs (str): ``"module:function"`` drawing the inputs of a case spec (``fn(spec, device)``).
        grids (str): ``"module:function"`` returning ``{grid name: tuple of specs}``.
        golden (str | None), upstream (str | None), kernels (str | None): loaders, where they exist.
        docs (str): where the operator's math is written out.
    """

    name: str
    title: str
    input_names: Tuple[str, ...]
    optional_inputs: Tuple[str, ...]
    scalar_inputs: Tuple[str, ...]
    output_names: Tuple[str, ...]
    lp_outputs: Tuple[str, ...]
    stages: Tuple[Stage, ...]
    knobs: Tuple[str, ...]
    reference: str
    oracle: str
    make_inputs: str
    grids: str
    golden: Optional[str] = None
    upstream: Optional[str] = None
    kernels: Optional[str] = None
    docs: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ lazy loaders
    def load(self, what: str) -> Callable:
        """The function behind ``reference``, ``oracle``, ``make_inputs``, ``grids``, ``golden``, ``upstream`` or
        ``kernels`` (``ValueError`` naming the operator when it has none)."""
        path = getattr(self, what)
        if path is None:
            raise ValueError(f"operator {self.name} has no {what}")
        return _load(path)

    @property
    def stage_names(self) -> Tuple[str, ...]:
        """The record keys, in computation order."""
        return tuple(s.name for s in self.stages)

    # ------------------------------------------------------------------ calling conventions
    def args(self, inputs: Mapping[str, Any]) -> tuple:
        """The tensors of an inputs dict in API order."""
        return tuple(inputs[n] for n in self.input_names)

    def kwargs(self, inputs: Mapping[str, Any]) -> Dict[str, Any]:
        """The scalar arguments of an inputs dict."""
        return {n: inputs[n] for n in self.scalar_inputs}

    def run_reference(self, inputs: Mapping[str, Any], policy, record: Optional[dict] = None):
        """The policy reference's outputs on ``inputs``."""
        return self.load("reference")(*self.args(inputs), **self.kwargs(inputs), policy=policy, record=record)

    def run_oracle(self, inputs: Mapping[str, Any]):
        """The FP64 oracle's outputs on ``inputs``."""
        return self.load("oracle")(*self.args(inputs), **self.kwargs(inputs))

    def cases(self, grid: str) -> tuple:
        """The case specs of ``grid`` (``ValueError`` listing the grids)."""
        grids = self.load("grids")()
        if grid not in grids:
            raise ValueError(f"unknown grid {grid!r} of {self.name}; grids: {list(grids)}")
        return tuple(grids[grid])

    def draw(self, spec, device="cpu") -> dict:
        """The inputs of case ``spec``."""
        return self.load("make_inputs")(spec, device)
