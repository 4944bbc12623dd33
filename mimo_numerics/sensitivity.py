"""Which rounding site matters: one-on/one-off sensitivity of a policy, and attribution of the gap between two.

:func:`rank_sites` measures, for every switch and every knob value, the error against a baseline (default the
``fp64`` preset) of the policy with only that site rounded ("one-on") and with everything but that site rounded
("one-off"). :func:`attribute_gap` explains the distance between two policies' outputs field by field.
:func:`output_errors` is the plain "error of each policy against the baseline" table the notebooks plot.

Errors are relative RMS per output (``metrics.rel_rms``), averaged over the cases when several are given (an output
counts only over the cases that have it). Everything is deterministic. Every function takes ``op`` (an operator name
or ``Operator``; None: the registry's default): the sites ranked are that operator's, the knobs its ``op.knobs``.

``op`` may also name a composite operator (``registry.WHOLE_OP``, the whole op ``mamba3_mimo``; its spec is
``mimo_numerics.ops.mamba3_mimo.spec``): :func:`rank_sites` then ranks one site off at a time over every component's
section (:func:`rank_sites_one_off`, a :class:`OneOffRanking`), the whole op run from its raw inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from tqdm.auto import tqdm

from . import operator as _operator
from . import presets as _presets
from .inference import (CasesLike, PolicyEvaluator, PolicyLike, as_case_list, as_output_list, lp_dtype_of,
                        run_reference, single_threaded)
from .metrics import rel_rms
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
               progress: Optional[bool] = None, names: Optional[Sequence[str]] = None, backend: str = "reference"):
    """One-on/one-off sensitivity of every switch and knob value of ``policy`` against ``baseline``.

    For a composite ``op`` (the whole op, ``registry.WHOLE_OP``) this is :func:`rank_sites_one_off` (``names``:
    the cases' names; ``baseline``: ``"fp64"`` or each case's fp64 run) and returns a :class:`OneOffRanking`.

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
        backend (str): the whole op's backend (:func:`rank_sites_one_off`); other operators run their references
            (``"reference"`` only).

    Returns:
        SensitivityTable
    """
    if registry.composite(op) is not None:
        return rank_sites_one_off(inputs, policy, baseline, op=op, progress=progress, names=names, backend=backend)
    if backend != "reference":
        raise ValueError(f"backend={backend!r} is for the whole op ({registry.WHOLE_OP}); operator {op!r} ranks "
                         "its reference (backend='reference')")
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


# ---------------------------------------------------------------------------------------------- one site off (composite)
@dataclass(frozen=True)
class SiteOff:
    """One row of :class:`OneOffRanking`: a switch of one component off, or a knob at another value.

    Attributes:
        site (str): ``"<operator>.<site>"`` for a switch, the knob name for a knob.
        kind (str): ``"switch"`` or ``"knob"``.
        value: the knob's value in the variant (None for a switch).
        errors (dict): output -> rel RMS vs the baseline of the variant (mean over cases).
        removed (dict): output -> ``sqrt(policy² − errors²)``, the error that goes away without this rounding
            (0 when the variant is not closer; independent errors add in quadrature).
        score (float): mean over the score outputs of ``removed / policy error``: a quadrature share, not the drop
            of the error (:meth:`OneOffRanking.drop` is that).
    """

    site: str
    kind: str
    value: Any
    errors: Dict[str, float]
    removed: Dict[str, float]
    score: float

    @property
    def label(self) -> str:
        """``site`` for a switch, ``knob=value`` for a knob."""
        return self.site if self.kind == "switch" else f"{self.site}={self.value}"

    @property
    def operator(self) -> Optional[str]:
        """The component of a switch (None for a knob, which acts on the whole chain)."""
        return self.site.partition(".")[0] if self.kind == "switch" else None

    def to_dict(self) -> Dict[str, Any]:
        return {"site": self.site, "kind": self.kind, "value": self.value, "label": self.label,
                "operator": self.operator, "errors": dict(self.errors), "removed": dict(self.removed),
                "score": self.score}


@dataclass
class OneOffRanking:
    """Result of :func:`rank_sites_one_off` (``rank_sites`` of a composite operator).

    Attributes:
        policy (RoundingPolicy): the policy studied. baseline (str): ``"fp64"`` (the op's fp64 run).
        outputs (tuple of str): the outputs present in the cases (``Out`` and the gradients).
        policy_error (dict): output -> rel RMS of the policy itself.
        rows (list of SiteOff): ranked by score (ties by label).
        skipped (dict): label -> why that knob value was not run.
        n_cases (int): cases averaged over. cases (list of str): their names.
        score_outputs (tuple of str): the outputs the score averages over (the gradients).
        operator (str): the composite operator.
    """

    policy: RoundingPolicy
    baseline: str
    outputs: Tuple[str, ...]
    policy_error: Dict[str, float]
    rows: List[SiteOff]
    skipped: Dict[str, str] = field(default_factory=dict)
    n_cases: int = 1
    cases: List[str] = field(default_factory=list)
    score_outputs: Tuple[str, ...] = ()
    operator: str = registry.WHOLE_OP

    @property
    def gradients(self) -> Tuple[str, ...]:
        """The score outputs among the outputs (the gradients)."""
        return tuple(o for o in self.outputs if o in self.score_outputs)

    def fraction(self, row: SiteOff, output: str) -> float:
        """``removed / policy error`` of one row and output (0 where the policy's error is 0)."""
        full = self.policy_error[output]
        return row.removed[output] / full if full > 0 else 0.0

    def change(self, row: SiteOff, output: str) -> float:
        """Relative change of the output's error, ``errors / policy error − 1`` (negative: the variant is closer)."""
        full = self.policy_error[output]
        return row.errors[output] / full - 1.0 if full > 0 else 0.0

    def drop(self, row: SiteOff, outputs: Optional[Sequence[str]] = None) -> float:
        """Mean over ``outputs`` (default the gradients) of ``1 − errors / policy error``: how much lower the
        error is with the rounding off, as a fraction of the policy's (negative: higher)."""
        outputs = self.gradients if outputs is None else tuple(outputs)
        values = [-self.change(row, o) for o in outputs]
        return sum(values) / len(values) if values else 0.0

    def row(self, label: str) -> SiteOff:
        """The row with this label (``"mamba_mimo_bwd_bwd.z_zeta"``, ``"diag_mode=fma"``)."""
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no row {label!r}; rows: {[r.label for r in self.rows]}")

    def ranked(self, output: Optional[str] = None) -> List[SiteOff]:
        """Rows by ``score`` (``output`` None) or by the error removed from ``output``, largest first."""
        if output is None:
            return sorted(self.rows, key=lambda r: (-r.score, r.label))
        if output not in self.outputs:
            raise ValueError(f"output {output!r} is not in this ranking; outputs: {list(self.outputs)}")
        return sorted(self.rows, key=lambda r: (-r.removed[output], r.label))

    def top(self, output: str, n: int = 3) -> List[SiteOff]:
        """The ``n`` rows removing most of ``output``'s error (only rows that remove some)."""
        return [r for r in self.ranked(output)[:n] if r.removed[output] > 0]

    def without_effect(self) -> List[str]:
        """Labels of the rows that change no gradient's error."""
        return [r.label for r in self.rows
                if all(r.errors[g] == self.policy_error[g] for g in self.gradients)]

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON types (``top``: the three leading labels per output)."""
        return {"policy": self.policy.to_dict(), "policy_name": self.policy.name, "baseline": self.baseline,
                "outputs": list(self.outputs), "gradients": list(self.gradients),
                "policy_error": dict(self.policy_error), "n_cases": self.n_cases, "cases": list(self.cases),
                "rows": [r.to_dict() for r in self.ranked()], "skipped": dict(self.skipped),
                "top": {o: [r.label for r in self.top(o)] for o in self.outputs},
                "without_effect": self.without_effect()}

    def to_markdown(self, top: Optional[int] = None) -> str:
        """The ranking as a table: per row its score, the mean drop of the gradients' error, and per output the
        quadrature share of the policy's error it removes (``removed / policy error``); the policy's own errors
        first. ``top``: only the first rows."""
        outputs = self.outputs
        head = ["rank", "off (from " + f"`{self.policy.name}`)", "score", "mean drop"] + [f"`{o}`" for o in outputs]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                 "| | **error of the policy (rel RMS vs fp64)** | | | "
                 + " | ".join(f"{self.policy_error[o]:.3g}" for o in outputs) + " |"]
        ranked = self.ranked()
        for i, r in enumerate(ranked[:top] if top else ranked, 1):
            cells = [str(i), f"`{r.label}`", f"{r.score:.3f}", f"{self.drop(r):.1%}"]
            cells += [_share(self.fraction(r, o)) for o in outputs]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def top_markdown(self, n: int = 3) -> str:
        """Per output, the ``n`` roundings removing most of its error, with the share each removes and (in
        brackets) the drop of that output's error."""
        lines = ["| output | error of the policy | " + " | ".join(f"#{i}" for i in range(1, n + 1)) + " |",
                 "|" + "---|" * (n + 2)]
        for o in self.outputs:
            tops = self.top(o, n)
            cells = [f"`{r.label}` ({_share(self.fraction(r, o))}; {-self.change(r, o):.1%})" for r in tops]
            cells += ["–"] * (n - len(tops))
            lines.append(f"| `{o}` | {self.policy_error[o]:.3g} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _share(value: float) -> str:
    return "0" if value == 0 else f"{value:.2f}"


def _finite_error(actual, expected) -> float:
    value = rel_rms(actual, expected)
    return math.inf if math.isnan(value) else value


def run_errors(run: Mapping[str, Any], baseline_run: Mapping[str, Any], op=registry.WHOLE_OP) -> Dict[str, float]:
    """Rel RMS (NaN counted as inf) of each output of composite ``op`` in ``run`` against ``baseline_run`` (the
    outputs both have), in the op's output order."""
    spec = registry.composite(op)
    got, want = spec.outputs(dict(run)), spec.outputs(dict(baseline_run))
    return {o: _finite_error(got[o], want[o]) for o in spec.output_names if o in got and o in want}


def one_off_variants(policy: RoundingPolicy, op=registry.WHOLE_OP
                     ) -> Tuple[List[Tuple[str, str, Any, RoundingPolicy]], Dict[str, str]]:
    """The one-off variants of ``policy`` on composite ``op``: ``(site, kind, value, variant)`` for every switch it
    has on (``"<operator>.<site>"``, components in chain order) and every other value of each knob of
    :data:`SENSITIVITY_KNOBS`; and the knob values the op cannot run, ``{label: reason}``."""
    spec = registry.composite(op)
    out: List[Tuple[str, str, Any, RoundingPolicy]] = []
    for site in spec.sites(policy):
        out.append((site, "switch", None, policy.replace(**{site: False})))
    check = spec.load("check_policy")
    skipped: Dict[str, str] = {}
    for knob in SENSITIVITY_KNOBS:
        for value in KNOBS[knob]:
            if value == getattr(policy, knob):
                continue
            variant = policy.replace(**{knob: value})
            try:
                check(variant)
            except NotImplementedError as exc:
                skipped[f"{knob}={value}"] = str(exc)
                continue
            out.append((knob, "knob", value, variant))
    return out, skipped


def _mean_errors(per_case: Sequence[Dict[str, float]], order: Sequence[str]) -> Dict[str, float]:
    names = [o for o in order if any(o in e for e in per_case)]
    return {o: sum(e[o] for e in per_case if o in e) / sum(1 for e in per_case if o in e) for o in names}


@single_threaded
def rank_sites_one_off(inputs, policy: PolicyLike = "upstream_sm90", baseline: Any = "fp64", op=registry.WHOLE_OP,
                       progress: Optional[bool] = None, names: Optional[Sequence[str]] = None,
                       backend: str = "reference") -> OneOffRanking:
    """One site (or knob value) of ``policy`` off at a time on a composite operator (the whole op).

    Each variant (:func:`one_off_variants`) runs the op on every case (for the whole op: forward and
    ``backward(dout)`` from the raw inputs); its outputs are measured against the baseline run (rel RMS, NaN as inf),
    averaged over the cases that have the output. Per output ``removed = sqrt(policy² − off²)`` (0 when the variant
    is worse); a row's ``score`` is the mean over the score outputs (the gradients) of ``removed / policy error``,
    the quadrature share of each gradient's error that rounding accounts for (1: it alone makes the whole error).
    The plain drop of the error is :meth:`OneOffRanking.drop`.

    Args:
        inputs (dict or sequence of dict): the op's cases (for the whole op: the 14 raw inputs by golden names,
            ``dout``, ``chunk_size``, ``rotary_dim_divisor``).
        policy (str | RoundingPolicy): the policy studied (moved to each case's lp dtype); it must define every
            component.
        baseline: ``"fp64"`` (the op's run under the ``fp64`` preset) or each case's baseline run, already
            computed (a sequence, one per case; only its outputs are read).
        op: the composite operator (default the whole op).
        progress (bool, optional): a tqdm bar over the runs (default: when there are more than 4 cases).
        names (sequence of str, optional): the cases' names (default ``case0``, ...).
        backend (str): ``"reference"``, or ``"triton"``: the policy and each variant on the Triton kernels where
            they can express it (the composite's ``backend_for``; the fp64 baseline always on the FP64
            model). The cases' device decides where it runs (CUDA; CPU tensors run in Triton's interpreter, slow).
            On a GPU the kernels of every such run are compiled first, in parallel
            (:func:`compile_variants_ahead`).

    Returns:
        OneOffRanking
    """
    spec = registry.composite(op)
    if spec is None:
        raise ValueError(f"op must name a composite operator ({registry.WHOLE_OP}), got {op!r}")
    cases = [inputs] if isinstance(inputs, Mapping) else list(inputs)
    if not cases:
        raise ValueError(f"inputs is empty: give at least one inputs dict of {spec.name}")
    names = list(names) if names is not None else [f"case{i}" for i in range(len(cases))]
    if len(names) != len(cases):
        raise ValueError(f"names has {len(names)} entries for {len(cases)} cases")
    if not (isinstance(baseline, str) and baseline == "fp64"):
        if isinstance(baseline, (str, RoundingPolicy)) or len(baseline) != len(cases):
            raise ValueError(f"baseline must be 'fp64' or one baseline run per case ({len(cases)}), got "
                             f"{baseline!r:.80}")
    policy = _presets.resolve(policy)
    check = spec.load("check_policy")
    check(policy)  # PolicyUndefined / NotImplementedError before any work
    policy_run = spec.load("run")
    if backend == "reference":
        run = policy_run
    else:
        backend_for = spec.load("backend_for")
        backend_for(policy, backend)  # ValueError on an unknown backend before any work

        def run(x, p):
            return policy_run(x, p, backend=backend_for(p, backend))
    items, skipped = one_off_variants(policy, spec)

    def at_lp(p: RoundingPolicy, x) -> RoundingPolicy:
        lp = spec.lp_dtype_of(x)
        return p if p.lp_dtype == lp else p.replace(lp_dtype=lp)

    show = len(cases) > 4 if progress is None else progress
    if backend != "reference" and _on_compiled_device(cases):  # the variants the kernels run, compiled at once
        compile_variants_ahead(run, [(x, at_lp(p, x)) for x in cases for p in [policy] + [v for *_, v in items]
                                     if backend_for(at_lp(p, x), backend) != "reference"])
    bar = tqdm(total=len(cases) * (len(items) + 2), desc=f"rank sites of {spec.name}", disable=not show, leave=False)
    base_runs = []
    for i, x in enumerate(cases):
        base_runs.append(policy_run(x, "fp64") if isinstance(baseline, str) else baseline[i])
        bar.update(1)
    full = []
    for x, base in zip(cases, base_runs):
        full.append(run_errors(run(x, at_lp(policy, x)), base, spec))
        bar.update(1)
    policy_error = _mean_errors(full, spec.output_names)
    outputs = tuple(policy_error)
    gradients = [o for o in outputs if o in spec.score_outputs]
    rows: List[SiteOff] = []
    for site, kind, value, variant in items:
        per_case = []
        for x, base in zip(cases, base_runs):
            per_case.append(run_errors(run(x, at_lp(variant, x)), base, spec))
            bar.update(1)
        errors = _mean_errors(per_case, spec.output_names)
        removed = {o: quadrature_excess(policy_error[o], errors[o]) for o in outputs}
        shares = [removed[g] / policy_error[g] if policy_error[g] > 0 else 0.0 for g in gradients]
        rows.append(SiteOff(site, kind, value, errors, removed, sum(shares) / len(shares) if shares else 0.0))
    bar.close()
    rows.sort(key=lambda r: (-r.score, r.label))
    return OneOffRanking(policy, "fp64", outputs, policy_error, rows, skipped, len(cases), names,
                         tuple(spec.score_outputs), spec.name)


def _on_compiled_device(cases) -> bool:
    """Whether the cases' tensors live on a device whose kernels are compiled (not Triton's CPU interpreter)."""
    tensors = [t for x in cases for t in x.values() if isinstance(t, torch.Tensor)]
    return bool(tensors) and tensors[0].device.type in ("cuda", "npu")


def compile_variants_ahead(run, calls) -> Any:
    """Compile, in parallel, the kernels of ``run(x, p)`` for every ``(x, p)`` of ``calls``
    (``kernels.compile_ahead``: launches become compile requests, nothing runs), so a sweep over one-off variants
    on a GPU does not compile each variant's kernels one after another on first use.

    Returns:
        kernels.CompileAheadReport.
    """
    from . import kernels

    def every_call():
        for x, p in calls:
            run(x, p)

    return kernels.compile_ahead(every_call)


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
