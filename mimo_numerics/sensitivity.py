"""Which rounding site matters: one-on/one-off sensitivity of a policy, and attribution of the gap between two.

:func:`rank_sites` measures, for every switch and every knob value, the error against a baseline (default the
``fp64`` preset) of the policy with only that site rounded ("one-on") and with everything but that site rounded
("one-off"). :func:`attribute_gap` explains the distance between two policies' outputs field by field.
:func:`output_errors` is the plain "error of each policy against the baseline" table the notebooks plot.

Errors are relative RMS per output (``metrics.rel_rms``), averaged over the cases when several are given (an output
counts only over the cases that have it). Everything is deterministic. Every function takes ``op`` (an operator name
or ``Operator``; None: the registry's default): the sites ranked are that operator's, the knobs its ``op.knobs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tqdm.auto import tqdm

from . import operator as _operator
from . import presets as _presets
from .inference import (CasesLike, PolicyEvaluator, PolicyLike, as_case_list, as_output_list, lp_dtype_of,
                        run_reference, single_threaded)
from .ops import registry
from .policy import KNOBS, RoundingPolicy, write_fields

#: The default operator's switches (``registry.site_table(op)`` for another).
SWITCHES: Tuple[str, ...] = tuple(registry.site_table(registry.DEFAULT_OPERATOR))
#: Knobs :func:`rank_sites` varies (``lp_dtype`` is fixed by the inputs), where the operator has them.
SENSITIVITY_KNOBS: Tuple[str, ...] = tuple(k for k in KNOBS if k != "lp_dtype")
#: Baseline name that selects the independent FP64 oracle instead of a reference preset.
ORACLE = "oracle"


# ---------------------------------------------------------------------------------------------- baselines
def baseline_outputs(inputs: CasesLike, baseline: Any = "fp64", op=None) -> List[Dict[str, Any]]:
    """Outputs of every case under ``baseline``.

    Args:
        inputs: one inputs dict or a sequence of them.
        baseline: a preset name or policy (the reference is run under it, in each case's lp dtype), ``"oracle"``
            (the independent FP64 oracle), or already computed outputs (a dict by output name, or a sequence of them, one per case).

    Returns:
        list of dict: output name -> tensor, one dict per case.
    """
    op = _operator.get(op)
    cases = as_case_list(inputs, op)
    if isinstance(baseline, str) and baseline == ORACLE:
        return [dict(zip(out._fields, out)) for out in (op.run_oracle(c) for c in cases)]
    if isinstance(baseline, (str, RoundingPolicy)):
        policy = _presets.resolve(baseline)  # in each case's lp dtype (the fp64 preset rounds nothing anyway)
        return [run_reference(c, policy.replace(lp_dtype=lp_dtype_of([c], op)), op=op) for c in cases]
    return as_output_list(baseline, len(cases), op)


def _baseline_label(baseline: Any) -> str:
    if isinstance(baseline, str):
        return baseline
    if isinstance(baseline, RoundingPolicy):
        return baseline.name
    return "given outputs"


def _errors(evaluator: PolicyEvaluator, policy: RoundingPolicy) -> Dict[str, float]:
    return dict(evaluator.evaluate(policy).rel_rms)


def all_off(policy: PolicyLike, op=None) -> RoundingPolicy:
    """``policy`` with every switch of ``op`` off (its knobs, lp dtype and math dtype kept)."""
    return _presets.resolve(policy).replace(**{_operator.get(op).name: "none"})


@single_threaded
def output_errors(inputs: CasesLike, policies: Mapping[str, PolicyLike] | Sequence[PolicyLike],
                  baseline: Any = "fp64", op=None) -> Dict[str, Dict[str, float]]:
    """Relative RMS error of each policy's outputs against the baseline.

    Args:
        inputs: one inputs dict or a sequence of them.
        policies: ``{label: policy}``, or a sequence of policies (labelled by preset name, else by their
            difference from the first policy).
        baseline: as for :func:`baseline_outputs`.
        op: the operator.

    Returns:
        dict: label -> {output -> rel RMS (mean over cases)}, in the given order.
    """
    op = _operator.get(op)
    cases = as_case_list(inputs, op)
    evaluator = PolicyEvaluator(cases, baseline_outputs(cases, baseline, op), lp_dtype_of(cases, op), op=op)
    if not isinstance(policies, Mapping):
        resolved = [_presets.resolve(p) for p in policies]
        policies = {policy_label(p, resolved[0], op): p for p in resolved}
    return {label: _errors(evaluator, _presets.resolve(p)) for label, p in policies.items()}


def policy_label(policy: RoundingPolicy, reference: Optional[RoundingPolicy] = None, op=None) -> str:
    """:func:`presets.label` of ``policy`` on operator ``op``, relative to ``reference`` when given."""
    return _presets.label(policy, operator=_operator.get(op).name, relative_to=reference)


# ---------------------------------------------------------------------------------------------- rank_sites
def quadrature_excess(total: float, floor: float) -> float:
    """The part of ``total`` above ``floor`` when independent errors add in quadrature (0 when below)."""
    if math.isinf(total):
        return math.inf
    return math.sqrt(max(total * total - floor * floor, 0.0))


@dataclass(frozen=True)
class SiteSensitivity:
    """One row of :class:`SensitivityTable`.

    Attributes:
        site (str): switch or knob name.
        kind (str): ``"switch"`` or ``"knob"``.
        value: the knob value (None for a switch).
        one_on (dict): output -> error with only this site rounded (see :func:`rank_sites`).
        one_off (dict): output -> error with every site of the policy but this one.
        added (dict): output -> error the site adds on its own, ``sqrt(one_on² − floor²)``.
        removed (dict): output -> error removed by dropping it from the policy, ``sqrt(policy² − one_off²)``.
        score (float): mean over outputs of ``added / policy error`` (the ranking key).
    """

    site: str
    kind: str
    value: Any
    one_on: Dict[str, float]
    one_off: Dict[str, float]
    added: Dict[str, float]
    removed: Dict[str, float]
    score: float

    @property
    def label(self) -> str:
        """``site`` for a switch, ``site=value`` for a knob."""
        return self.site if self.kind == "switch" else f"{self.site}={self.value}"

    def to_dict(self) -> Dict[str, Any]:
        return {"site": self.site, "kind": self.kind, "value": self.value, "label": self.label,
                "one_on": dict(self.one_on), "one_off": dict(self.one_off), "added": dict(self.added),
                "removed": dict(self.removed), "score": self.score}


@dataclass
class SensitivityTable:
    """Result of :func:`rank_sites`; ``rows`` ranked by ``score`` (ties by label).

    Attributes:
        policy (RoundingPolicy): the policy studied. baseline (str): what errors are measured against.
        outputs (tuple of str): outputs present in the cases.
        policy_error (dict): output -> error of the policy itself (everything on).
        floor_error (dict): output -> error of the policy with every switch off (its output stores still round
            when ``round_outputs`` is true).
        rows (list of SiteSensitivity): ranked.
        n_cases (int): number of cases averaged over.
        operator (str): the operator whose sites were ranked.
    """

    policy: RoundingPolicy
    baseline: str
    outputs: Tuple[str, ...]
    policy_error: Dict[str, float]
    floor_error: Dict[str, float]
    rows: List[SiteSensitivity]
    n_cases: int
    operator: str = registry.DEFAULT_OPERATOR

    def ranked(self, output: Optional[str] = None, by: str = "added") -> List[SiteSensitivity]:
        """Rows ranked by ``score`` (``output`` None) or by one output's ``by`` column (added, removed, one_on,
        one_off), largest first; ties by label."""
        if output is None:
            return sorted(self.rows, key=lambda r: (-r.score, r.label))
        if output not in self.outputs:
            raise ValueError(f"output {output!r} is not in this table; outputs: {list(self.outputs)}")
        if by not in ("added", "removed", "one_on", "one_off"):
            raise ValueError(f"by must be added, removed, one_on or one_off, got {by!r}")
        return sorted(self.rows, key=lambda r: (-getattr(r, by)[output], r.label))

    def row(self, label: str) -> SiteSensitivity:
        """The row with this label (``"psiv"``, ``"diag_mode=fma"``)."""
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no row {label!r}; rows: {[r.label for r in self.rows]}")

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON types."""
        return {"operator": self.operator, "policy": self.policy.to_dict(),
                "policy_name": self.policy.label(self.operator), "baseline": self.baseline,
                "outputs": list(self.outputs), "policy_error": dict(self.policy_error),
                "floor_error": dict(self.floor_error), "n_cases": self.n_cases,
                "rows": [r.to_dict() for r in self.rows]}

    def to_markdown(self, columns: Sequence[str] = ("one_on", "one_off")) -> str:
        """A Markdown table: one line per site (ranked), the ``columns`` per output, then the score."""
        head = ["rank", "site"] + [f"{c} {o}" for o in self.outputs for c in columns] + ["score"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        floor = ["", "**all off**"] + [f"{self.floor_error[o]:.3g}" for o in self.outputs for _ in columns] + [""]
        full = ["", f"**all of `{self.policy.label(self.operator)}`**"] + [f"{self.policy_error[o]:.3g}" for o in self.outputs
                                                           for _ in columns] + [""]
        lines += ["| " + " | ".join(floor) + " |", "| " + " | ".join(full) + " |"]
        for i, r in enumerate(self.ranked(), 1):
            cells = [str(i), f"`{r.label}`"] + [f"{getattr(r, c)[o]:.3g}" for o in self.outputs for c in columns]
            lines.append("| " + " | ".join(cells + [f"{r.score:.3g}"]) + " |")
        return "\n".join(lines)


def _one_on_policy(floor: RoundingPolicy, site: str, op, value: Any = None) -> RoundingPolicy:
    if value is None:
        return write_fields(floor, op.name, **{site: True})
    # a knob that acts through some sites (diag_mode through the lp mul+add sums) gets them on too
    through = {s: True for s in op.knob_sites.get(site, ())}
    return write_fields(floor, op.name, **through, **{site: value})


@single_threaded
def rank_sites(inputs: CasesLike, policy: PolicyLike = "upstream_sm90", baseline: Any = "fp64", op=None,
               progress: Optional[bool] = None) -> SensitivityTable:
    """One-on/one-off sensitivity of every switch and knob value of ``policy`` against ``baseline``.

    For a switch ``s``: one-on is the all-off policy (the policy with every switch off, its knobs, lp dtype and math
    dtype kept) with ``s`` turned on; one-off is ``policy`` with ``s`` off. For a knob value ``k=v`` (every knob of
    the operator but ``lp_dtype``, every value): one-on is the all-off policy with ``k=v`` (and the sites the knob
    acts through on, ``op.knob_sites``: ``diag_mode`` acts only on the lp mul+add sums); one-off is ``policy`` with
    ``k=v``.

    Per output, ``added = sqrt(one_on² − floor²)`` is the error the site adds over the all-off floor, independent
    errors adding in quadrature; ``removed = sqrt(policy² − one_off²)`` the error that goes away without it. Rows
    are ranked by ``score`` = mean over outputs of ``added / policy error``: the fraction of the policy's error the
    site reproduces on its own (a site that alone reproduces the whole error of every output scores 1).

    Args:
        inputs: one inputs dict or a sequence of them (errors are means over cases).
        policy (str | RoundingPolicy): the policy studied.
        baseline: as for :func:`baseline_outputs` (default the ``fp64`` preset; ``"oracle"`` for the oracle).
        op: the operator (default: the registry's default).
        progress (bool, optional): a progress bar over the rows (default: when there are more than 4 cases).

    Returns:
        SensitivityTable
    """
    op = _operator.get(op)
    cases = as_case_list(inputs, op)
    lp = lp_dtype_of(cases, op)
    policy = _presets.resolve(policy)
    if policy.lp_dtype != lp:
        raise ValueError(f"policy {policy.name} has lp_dtype {policy.lp_dtype} but the inputs are {lp}")
    policy.section(op.name)  # PolicyUndefined when the policy defines nothing for this operator
    evaluator = PolicyEvaluator(cases, baseline_outputs(cases, baseline, op), lp, op=op)
    floor_policy = all_off(policy, op)
    full, floor = _errors(evaluator, policy), _errors(evaluator, floor_policy)
    outputs = tuple(o for o in op.output_names if o in full)

    def make_row(site, kind, value, on_policy, off_policy):
        on, off = _errors(evaluator, on_policy), _errors(evaluator, off_policy)
        added = {o: quadrature_excess(on[o], floor[o]) for o in outputs}
        removed = {o: quadrature_excess(full[o], off[o]) for o in outputs}
        ratios = [added[o] / full[o] if full[o] > 0 else (0.0 if added[o] == 0 else math.inf) for o in outputs]
        score = sum(ratios) / len(ratios) if ratios else 0.0
        return SiteSensitivity(site, kind, value, on, off, added, removed, score)

    items = [(s, None) for s in registry.site_table(op.name)]
    items += [(knob, value) for knob in SENSITIVITY_KNOBS if knob in op.knobs for value in KNOBS[knob]]
    show = len(cases) > 4 if progress is None else progress
    rows = []
    for site, value in tqdm(items, desc=f"rank_sites {op.name}", disable=not show, leave=False):
        if value is None:
            rows.append(make_row(site, "switch", None, _one_on_policy(floor_policy, site, op),
                                 write_fields(policy, op.name, **{site: False})))
        else:
            rows.append(make_row(site, "knob", value, _one_on_policy(floor_policy, site, op, value),
                                 policy.replace(**{site: value})))
    rows.sort(key=lambda r: (-r.score, r.label))
    return SensitivityTable(policy, _baseline_label(baseline), outputs, full, floor, rows, len(cases), op.name)


# ---------------------------------------------------------------------------------------------- attribute_gap
@dataclass(frozen=True)
class FieldContribution:
    """How much of the gap one differing field explains.

    Attributes:
        field (str): the field. value_a, value_b: its values in A and B.
        forward (dict): output -> ``d(A) − d(A with this field from B)``: gap closed by moving A's field alone.
        backward (dict): output -> ``d(B with this field from A) − d(B)``: gap opened by moving B's field alone.
    """

    field: str
    value_a: Any
    value_b: Any
    forward: Dict[str, float]
    backward: Dict[str, float]

    def to_dict(self) -> Dict[str, Any]:
        return {"field": self.field, "value_a": self.value_a, "value_b": self.value_b,
                "forward": dict(self.forward), "backward": dict(self.backward)}


@dataclass
class GapAttribution:
    """Result of :func:`attribute_gap`.

    Attributes:
        policy_a, policy_b (RoundingPolicy): the two policies. target (str): what distances are measured to.
        outputs (tuple of str): outputs compared.
        gap (dict): output -> ``d(A)``, A's distance to the target.
        residual (dict): output -> ``d(B)`` (0 when the target is B's own outputs).
        rows (list of FieldContribution): one per differing field, in field order.
        interaction (dict): output -> ``gap − residual − Σ forward``: what one-at-a-time changes do not explain.
        metric (str): ``"rel_rms"`` or ``"distance"`` (the inference distance's per-output share).
        n_cases (int): cases averaged over.
        operator (str): the operator whose fields were compared.
    """

    policy_a: RoundingPolicy
    policy_b: RoundingPolicy
    target: str
    outputs: Tuple[str, ...]
    gap: Dict[str, float]
    residual: Dict[str, float]
    rows: List[FieldContribution]
    interaction: Dict[str, float]
    metric: str
    n_cases: int
    operator: str = registry.DEFAULT_OPERATOR

    def ranked(self, output: str, direction: str = "forward") -> List[FieldContribution]:
        """Rows ranked by their ``direction`` contribution to ``output``, largest first (ties by field order)."""
        if output not in self.outputs:
            raise ValueError(f"output {output!r} is not compared here; outputs: {list(self.outputs)}")
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction must be forward or backward, got {direction!r}")
        order = {r.field: i for i, r in enumerate(self.rows)}
        return sorted(self.rows, key=lambda r: (-getattr(r, direction)[output], order[r.field]))

    def top(self, output: str) -> str:
        """The field that closes most of the gap on ``output`` (forward)."""
        return self.ranked(output)[0].field

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON types."""
        return {"policy_a": self.policy_a.to_dict(), "policy_b": self.policy_b.to_dict(),
                "name_a": self.policy_a.label(self.operator), "name_b": self.policy_b.label(self.operator),
                "operator": self.operator, "target": self.target,
                "outputs": list(self.outputs), "gap": dict(self.gap), "residual": dict(self.residual),
                "rows": [r.to_dict() for r in self.rows], "interaction": dict(self.interaction),
                "metric": self.metric, "n_cases": self.n_cases,
                "top": {o: self.top(o) for o in self.outputs if self.rows}}

    def to_markdown(self) -> str:
        """A Markdown table: per output, the gap and each field's forward (backward) contribution."""
        head = ["", *self.outputs]
        lines = [f"Gap `{self.policy_a.label(self.operator)}` → `{self.policy_b.label(self.operator)}` "
                 f"({self.metric} to {self.target}, "
                 f"{self.n_cases} case(s)); contributions: forward (backward)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines.append("| **d(A)** | " + " | ".join(f"{self.gap[o]:.3g}" for o in self.outputs) + " |")
        for r in self.rows:
            lines.append(f"| `{r.field}`: {r.value_a} → {r.value_b} | "
                         + " | ".join(f"{r.forward[o]:.3g} ({r.backward[o]:.3g})" for o in self.outputs) + " |")
        lines.append("| interactions | " + " | ".join(f"{self.interaction[o]:.3g}" for o in self.outputs) + " |")
        lines.append("| **d(B)** | " + " | ".join(f"{self.residual[o]:.3g}" for o in self.outputs) + " |")
        return "\n".join(lines)


@single_threaded
def attribute_gap(inputs: CasesLike, policy_a: PolicyLike, policy_b: PolicyLike, target: Any = None,
                  metric: str = "rel_rms", op=None) -> GapAttribution:
    """Explain the distance between two policies' outputs one differing field at a time.

    With ``d(P)`` the per-output distance of P's reference outputs to the target (B's own outputs by default), each
    field ``f`` where A and B differ gets ``forward = d(A) − d(A with f from B)`` and
    ``backward = d(B with f from A) − d(B)``; ``interaction = d(A) − d(B) − Σ forward`` is the part that only the
    fields together explain.

    Args:
        inputs: one inputs dict or a sequence of them (distances are means over cases).
        policy_a, policy_b (str | RoundingPolicy): the two policies; same ``lp_dtype``.
        target: None (B's outputs), or as ``baseline`` of :func:`baseline_outputs` (e.g. the device outputs of
            each case, to ask which field moves A towards the device).
        metric (str): ``"rel_rms"`` (default) or ``"distance"`` (the inference distance, see
            ``mimo_numerics.inference``).
        op: the operator (default: the registry's default); the fields compared are its sites and the knobs.

    Returns:
        GapAttribution
    """
    if metric not in ("rel_rms", "distance"):
        raise ValueError(f"metric must be 'rel_rms' or 'distance', got {metric!r}")
    op = _operator.get(op)
    cases = as_case_list(inputs, op)
    lp = lp_dtype_of(cases, op)
    a, b = _presets.resolve(policy_a), _presets.resolve(policy_b)
    if a.lp_dtype != b.lp_dtype or a.lp_dtype != lp:
        raise ValueError(f"policies must share the inputs' lp_dtype {lp}: got {a.lp_dtype} and {b.lp_dtype}")
    targets = baseline_outputs(cases, b if target is None else target, op)
    evaluator = PolicyEvaluator(cases, targets, lp, op=op)

    def d(p):
        ev = evaluator.evaluate(p)
        return dict(ev.rel_rms if metric == "rel_rms" else ev.per_output)

    da, db = d(a), d(b)
    outputs = tuple(o for o in op.output_names if o in da)
    rows = []
    for name, (va, vb) in a.diff(b, operator=op.name).items():
        fwd, bwd = d(write_fields(a, op.name, **{name: vb})), d(write_fields(b, op.name, **{name: va}))
        rows.append(FieldContribution(name, va, vb, {o: da[o] - fwd[o] for o in outputs},
                                      {o: bwd[o] - db[o] for o in outputs}))
    interaction = {o: da[o] - db[o] - sum(r.forward[o] for r in rows) for o in outputs}
    label = f"{b.label(op.name)} (policy B)" if target is None else _baseline_label(target)
    return GapAttribution(a, b, label, outputs, {o: da[o] for o in outputs}, {o: db[o] for o in outputs}, rows,
                          interaction, metric, len(cases), op.name)
