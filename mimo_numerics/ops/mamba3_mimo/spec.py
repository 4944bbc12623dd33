"""The whole op ``mamba3_mimo`` as a *composite operator*: what the generic tools read of it.

The whole op (preprocessing, ``mamba_mimo_fwd``, ``mamba_mimo_bwd_fwd``, ``mamba_mimo_bwd_bwd``, the FP32 epilogue)
has no policy section of its own: its policy is its components' sections and the knobs. :data:`OPERATOR` describes
it the way ``mimo_numerics.operator.Operator`` describes one kernel, as far as the generic tools need it:

* ``sensitivity.rank_sites(cases, policy, op="mamba3_mimo")``: its sites are every switch of every component's
  section (``"<operator>.<site>"``), its outputs ``Out`` and the 14 gradients, scored over the gradients;
* ``drift.stage_drift(runs, op="mamba3_mimo")``: its stages are the chain's record keys in chain order
  (``"<operator>.<stage>"``, :func:`runs.chain_order`), grouped by the step they belong to;
* ``mimo-numerics report --op mamba3_mimo``: the generic report's entry, which hands the whole-op sections to
  ``report`` (``mimo_numerics.studies.report``).

Callables are ``"module:function"`` paths, imported on first use (:meth:`CompositeOperator.load`), as in
``Operator``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Tuple

from .cases import OP_GRAD_NAMES, OP_INPUT_NAMES


@dataclass(frozen=True)
class CompositeOperator:
    """An op chained from registered operators (module docstring).

    Attributes:
        name (str): the op's name (``registry.WHOLE_OP``). title (str): one line.
        components (tuple of str): the registered operators whose policy sections it runs, in chain order.
        input_names (tuple of str): its tensor inputs (a case dict also holds ``dout``, ``chunk_size`` and
            ``rotary_dim_divisor``).
        output_names (tuple of str): what is compared: ``Out`` then the 14 gradients (golden ``autograd`` names).
        score_outputs (tuple of str): the outputs a ranking's score averages over (the gradients).
        run (str): ``(inputs, policy) -> run``, a dict of every recorded tensor by record key.
        baseline_run (str): ``(inputs) -> run``: the ``fp64`` run with every internal stage.
        outputs_of (str): ``run -> {output: tensor or None}``.
        stage_order (str): ``() -> tuple`` of every record key in chain order.
        group_of (str): ``record key -> step`` (the plots' bands).
        check_policy (str): ``policy -> chain kind``; raises ``NotImplementedError`` for a policy the chain cannot
            run, ``PolicyUndefined`` for one that lacks a component's section.
        report (str): the whole-op report, ``(case, out, policies, log=, progress=) -> Path``.
        backend_for (str): ``(policy, backend) -> backend``: what a run asked for ``backend`` runs that policy on
            (``"triton"`` only where the kernels express it).
    """

    name: str
    title: str
    components: Tuple[str, ...]
    input_names: Tuple[str, ...]
    output_names: Tuple[str, ...]
    score_outputs: Tuple[str, ...]
    run: str
    baseline_run: str
    outputs_of: str
    stage_order: str
    group_of: str
    check_policy: str
    report: str
    backend_for: str

    def load(self, what: str) -> Callable:
        """The callable of field ``what`` (imported on first use)."""
        path = getattr(self, what)
        module, _, function = path.partition(":")
        return getattr(importlib.import_module(module), function)

    @property
    def stage_names(self) -> Tuple[str, ...]:
        """Every record key of a run, in chain order."""
        return tuple(self.load("stage_order")())

    def sites(self, policy) -> List[str]:
        """``"<operator>.<site>"`` of every switch ``policy`` has on, components in chain order."""
        return [f"{op}.{site}" for op in self.components for site in policy.section(op).on()]

    def lp_dtype_of(self, inputs: Mapping[str, Any]) -> str:
        """The lp dtype of a case (that of ``Q``)."""
        return str(inputs["Q"].dtype).replace("torch.", "")

    def outputs(self, run: Dict[str, Any]) -> Dict[str, Any]:
        """``outputs_of(run)`` without the outputs the case lacks."""
        return {o: v for o, v in self.load("outputs_of")(run).items() if v is not None}


_RUNS = "mimo_numerics.ops.mamba3_mimo.runs"

#: The whole op.
OPERATOR = CompositeOperator(
    name="mamba3_mimo",
    title="the whole Mamba-3 MIMO op: preprocessing, forward, backward stage 1, stage 2, FP32 epilogue",
    components=("mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd"),
    input_names=OP_INPUT_NAMES,
    output_names=("Out",) + OP_GRAD_NAMES,
    score_outputs=OP_GRAD_NAMES,
    run=f"{_RUNS}:policy_run",
    baseline_run=f"{_RUNS}:fp64_run",
    outputs_of=f"{_RUNS}:op_outputs",
    stage_order=f"{_RUNS}:chain_order",
    group_of=f"{_RUNS}:group_of",
    check_policy="mimo_numerics.ops.mamba3_mimo.chain:chain_kind",
    report="mimo_numerics.studies.report:build_report",
    backend_for=f"{_RUNS}:backend_for",
)
