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
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union


@dataclass(frozen=True)
class Stage:
    """One named tensor of an operator: an intermediate its reference records (``record=``) or an output.

    Attributes:
        name (str): the record key (or output name).
        shape (tuple of str): dimension letters, e.g. ``("B", "H", "S", "R", "N")``: B, S, H, G, N, P, R as in
            the API, ``nc`` = ceil(S / C), ``L`` = C·R; a letter in parentheses, ``"(R)"``, is present only in some
            branches (the operator's docs say which).
        description (str): what it holds, with the site(s) that round it.
        site (str | None): the switch whose rounding produces it, where one does (where a non-finite value first
            appears is explained by it).
        needs (tuple of str): branch flags of ``Dims`` (``has_z``, ``has_d``, ``reduce_o``) that must be true for
            the stage to exist.
    """

    name: str
    shape: Tuple[str, ...]
    description: str
    site: Optional[str] = None
    needs: Tuple[str, ...] = ()

    @property
    def sequence_axis(self) -> Optional[Tuple[str, int]]:
        """``("token", dim)`` or ``("chunk", dim)`` for the axis that runs along the sequence, or None (sums over
        the tokens, weights)."""
        letters = [letter.strip("()") for letter in self.shape]
        if "S" in letters:
            return "token", letters.index("S")
        if "nc" in letters:
            return "chunk", letters.index("nc")
        return None

    def shape_text(self) -> str:
        """``"[B, H, S, R, N]"``."""
        return "[" + ", ".join(self.shape) + "]"


#: The keyword integers every kernel takes after its tensors.
KERNEL_SCALARS: Tuple[str, ...] = ("chunk_size", "rotary_dim_divisor")
#: The policy knobs that act on every kernel.
KERNEL_KNOBS: Tuple[str, ...] = ("lp_dtype", "diag_mode", "math_dtype", "state_update", "silu_form", "round_outputs",
                                 "gemm_model", "special_functions", "fp32_fma")


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
        outputs (tuple of Stage): the outputs in tuple order, with their shapes.
        lp_outputs (tuple): outputs stored in the low-precision dtype (the others are float32).
        stages (tuple of Stage): what ``record=`` fills, in computation order.
        knobs (tuple): the policy knobs that act on this operator.
        reference, oracle (str): ``"module:function"`` of the policy reference ``fn(*tensors, **scalars, policy=,
            record=)`` and of the FP64 oracle ``fn(*tensors, **scalars)``.
        make_inputs (str): ``"module:function"`` drawing the inputs of a case spec (``fn(spec, device)``).
        grids (str): ``"module:function"`` returning ``{grid name: tuple of specs}``.
        golden (str | None), upstream (str | None), kernels (str | None): loaders, where they exist (``golden``
            returns the H200 cases as ``StoredCase`` objects).
        golden_outputs (str | None): ``fn(case_name)`` -> upstream's outputs of that golden case by name.
        outputs_type (str): ``"module:Class"`` of the outputs NamedTuple (fields ``output_names``).
        validate (str): ``"module:function"`` checking the inputs as the API does (``fn(*tensors, **scalars)``,
            returning the ``Dims``; errors name the argument).
        input_shapes (mapping): input name -> dimension letters (``ops/_common/inputs.py`` has the letters);
            ``mimo_numerics.validation.check_inputs`` checks every input against them.
        lp_inputs (tuple): the inputs in the low-precision dtype; every other tensor input is float32.

    Paths left empty take the operator folder's conventional parts: ``reference`` ->
    ``mimo_numerics.ops.<name>.reference:<name>``, ``oracle`` -> ``...oracle:<name>_oracle``, ``validate`` ->
    ``...validation:validate_inputs``, ``make_inputs``/``grids`` -> ``...cases:make_inputs``/``grids``,
    ``golden``/``golden_outputs`` -> ``...golden:stored_cases``/``upstream_outputs``. ``scalar_inputs`` and
    ``knobs`` default to the kernels' (:data:`KERNEL_SCALARS`, :data:`KERNEL_KNOBS`).
        docs (str): where the operator's math is written out.
        knob_sites (mapping): knob -> the sites it acts through (e.g. ``diag_mode`` acts only where an lp mul+add
            pair is carried in lp: stage 1's ``diag_accum``); a one-on sensitivity row of that knob turns them on.
    """

    name: str
    title: str
    input_names: Tuple[str, ...]
    optional_inputs: Tuple[str, ...]
    outputs: Tuple[Stage, ...]
    lp_outputs: Tuple[str, ...]
    stages: Tuple[Stage, ...]
    outputs_type: str
    scalar_inputs: Tuple[str, ...] = KERNEL_SCALARS
    knobs: Tuple[str, ...] = KERNEL_KNOBS
    input_shapes: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    lp_inputs: Tuple[str, ...] = ()
    reference: str = ""
    oracle: str = ""
    make_inputs: str = ""
    grids: str = ""
    validate: str = ""
    golden: Optional[str] = ""
    golden_outputs: Optional[str] = ""
    upstream: Optional[str] = None
    kernels: Optional[str] = None
    docs: str = ""
    knob_sites: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        folder = f"mimo_numerics.ops.{self.name}"
        conventional = {"reference": f"{folder}.reference:{self.name}", "oracle": f"{folder}.oracle:{self.name}_oracle",
                        "validate": f"{folder}.validation:validate_inputs",
                        "make_inputs": f"{folder}.cases:make_inputs",
                        "grids": f"{folder}.cases:grids", "golden": f"{folder}.golden:stored_cases",
                        "golden_outputs": f"{folder}.golden:upstream_outputs"}
        for what, path in conventional.items():
            if getattr(self, what) == "":
                object.__setattr__(self, what, path)
        missing = sorted(set(self.input_shapes) ^ set(self.input_names)) if self.input_shapes else []
        if missing:
            raise ValueError(f"operator {self.name}: input_shapes must name every input exactly, not {missing}")
        if self.input_shapes and "input_shapes" not in self.extra:  # the tools' older view of the same table
            object.__setattr__(self, "extra", {**self.extra, "input_shapes": dict(self.input_shapes)})

    # ------------------------------------------------------------------ lazy loaders
    def load(self, what: str) -> Callable:
        """The function behind ``reference``, ``oracle``, ``make_inputs``, ``grids``, ``golden``,
        ``golden_outputs``, ``outputs_type``, ``validate``, ``upstream`` or ``kernels`` (``ValueError`` naming the
        operator when it has none)."""
        path = getattr(self, what)
        if not path:
            raise ValueError(f"operator {self.name} has no {what}")
        return _load(path)

    @property
    def stage_names(self) -> Tuple[str, ...]:
        """The record keys, in computation order."""
        return tuple(s.name for s in self.stages)

    @property
    def output_names(self) -> Tuple[str, ...]:
        """The outputs, in tuple order."""
        return tuple(s.name for s in self.outputs)

    def stage(self, name: str) -> Stage:
        """The stage or output called ``name`` (``KeyError`` listing them otherwise)."""
        for stage in self.stages + self.outputs:
            if stage.name == name:
                return stage
        raise KeyError(f"{self.name} has no stage or output {name!r}; stages: {list(self.stage_names)}, outputs: "
                       f"{list(self.output_names)}")

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
        """The FP64 oracle's outputs on ``inputs``, as the outputs NamedTuple."""
        return self.as_outputs(self.load("oracle")(*self.args(inputs), **self.kwargs(inputs)))

    def check_inputs(self, inputs: Mapping[str, Any]):
        """Validate an inputs dict as the API does; returns the ``Dims``."""
        return self.load("validate")(*self.args(inputs), **self.kwargs(inputs))

    def as_outputs(self, value):
        """``value`` as the outputs NamedTuple: the NamedTuple itself, a dict by output name, a tuple in output
        order, or the one tensor of a one-output operator (``ValueError``/``TypeError`` otherwise)."""
        import torch

        kind, names = self.load("outputs_type"), self.output_names
        if isinstance(value, kind):
            return value
        if isinstance(value, Mapping):
            if set(value) != set(names):
                raise ValueError(f"outputs of {self.name} must have exactly the keys {list(names)}, got "
                                 f"{sorted(value)}")
            return kind(**{n: value[n] for n in names})
        if isinstance(value, torch.Tensor) and len(names) == 1:
            return kind(value)
        if isinstance(value, tuple) and len(value) == len(names):
            return kind(*value)
        raise TypeError(f"outputs of {self.name} must be its outputs NamedTuple, a dict or a tuple of {list(names)}, "
                        f"got {type(value).__name__}")

    def cases(self, grid: str) -> tuple:
        """The case specs of ``grid`` (``ValueError`` listing the grids)."""
        grids = self.load("grids")()
        if grid not in grids:
            raise ValueError(f"unknown grid {grid!r} of {self.name}; grids: {list(grids)}")
        return tuple(grids[grid])

    def draw(self, spec, device="cpu") -> dict:
        """The inputs of case ``spec``."""
        return self.load("make_inputs")(spec, device)


def output_item(outputs, key: Union[int, slice, str]):
    """``outputs[key]`` for an operator's outputs NamedTuple: by position, or by output name (``out["dz"]``).

    NamedTuples of the operators call this from ``__getitem__`` so that every output object supports both
    attribute and key access.
    """
    if isinstance(key, str):
        if key not in outputs._fields:
            raise KeyError(f"unknown output {key!r}; outputs: {list(outputs._fields)}")
        return getattr(outputs, key)
    return tuple.__getitem__(outputs, key)


def get(operator: Union[str, Operator, None] = None) -> Operator:
    """The :class:`Operator` named ``operator`` (default: the registry's default operator); an ``Operator`` is
    returned as is."""
    from .ops import registry

    if isinstance(operator, Operator):
        return operator
    return registry.get(registry.DEFAULT_OPERATOR if operator is None else operator)
