"""Which rounding makes each gradient of the whole op wrong: one site (or knob value) off at a time.

:func:`rank_op_sites` runs ``mamba3_mimo`` (forward and ``backward(dout)``, :func:`runs.policy_run`) once per policy
variant on every case and measures ``Out`` and the 14 gradients against the op's ``fp64`` run (relative RMS; a
non-finite error counts as inf). The variants are the policy with one switch of one operator's section turned off
(every switch of ``mamba_mimo_fwd``, ``mamba_mimo_bwd_fwd`` and ``mamba_mimo_bwd_bwd`` that the policy has on, named
``"<operator>.<site>"``), and the policy with one knob set to each of its other values
(``sensitivity.SENSITIVITY_KNOBS``; values the chain cannot run, ``math_dtype="float64"`` with sites on or
``round_outputs=False``, are listed as skipped with the chain's reason).

Per output the row math is :mod:`mimo_numerics.sensitivity`'s: ``removed = sqrt(policy² − one_off²)`` (0 when the
variant is worse), independent errors adding in quadrature; a row's ``score`` is the mean over the gradients of
``removed / policy error``, the share of each gradient's error the rounding causes (1: that rounding alone makes
the whole error). Errors are means over the cases that have the output (``dD`` needs D, ...).

A forward site moves ``Out`` only: the backward recomputes what it needs (stage 1) and reads no forward output. That
is measured here, not assumed (its rows show the gradients unchanged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tqdm.auto import tqdm

from ... import presets as _presets
from ...inference import single_threaded
from ...metrics import rel_rms
from ...policy import KNOBS, RoundingPolicy
from ...sensitivity import SENSITIVITY_KNOBS
from ...sensitivity import quadrature_excess as _quadrature_part
from . import chain, runs
from .cases import OP_GRAD_NAMES
from .golden_figures import OUTPUT_KEYS

#: The gradients the score averages over (golden ``autograd`` names).
GRADIENTS = OP_GRAD_NAMES


@dataclass(frozen=True)
class SiteOff:
    """One variant of the policy: a switch off, or a knob at another value.

    Attributes:
        site (str): ``"<operator>.<site>"`` for a switch, the knob name for a knob.
        kind (str): ``"switch"`` or ``"knob"``.
        value: the knob's value in the variant (None for a switch).
        errors (dict): output -> rel RMS vs fp64 of the variant (mean over cases).
        removed (dict): output -> ``sqrt(policy² − errors²)``, the error that goes away without this rounding.
        score (float): mean over the gradients of ``removed / policy error``.
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
        """The operator of a switch (None for a knob, which acts on the whole chain)."""
        return self.site.partition(".")[0] if self.kind == "switch" else None

    def to_dict(self) -> Dict[str, Any]:
        return {"site": self.site, "kind": self.kind, "value": self.value, "label": self.label,
                "operator": self.operator, "errors": dict(self.errors), "removed": dict(self.removed),
                "score": self.score}


@dataclass
class OpSiteRanking:
    """Result of :func:`rank_op_sites`.

    Attributes:
        policy (RoundingPolicy): the policy studied. baseline (str): ``"fp64"`` (the op's fp64 run).
        outputs (tuple of str): ``Out`` and the gradients present in the cases.
        policy_error (dict): output -> rel RMS of the policy itself.
        rows (list of SiteOff): ranked by score (ties by label).
        skipped (dict): label -> why that knob value was not run.
        n_cases (int): cases averaged over. cases (list of str): their names.
    """

    policy: RoundingPolicy
    baseline: str
    outputs: Tuple[str, ...]
    policy_error: Dict[str, float]
    rows: List[SiteOff]
    skipped: Dict[str, str] = field(default_factory=dict)
    n_cases: int = 1
    cases: List[str] = field(default_factory=list)

    @property
    def gradients(self) -> Tuple[str, ...]:
        """The gradients among the outputs."""
        return tuple(o for o in self.outputs if o in GRADIENTS)

    def fraction(self, row: SiteOff, output: str) -> float:
        """``removed / policy error`` of one row and output (0 where the policy's error is 0)."""
        full = self.policy_error[output]
        return row.removed[output] / full if full > 0 else 0.0

    def change(self, row: SiteOff, output: str) -> float:
        """Relative change of the output's error, ``errors / policy error − 1`` (negative: the variant is closer)."""
        full = self.policy_error[output]
        return row.errors[output] / full - 1.0 if full > 0 else 0.0

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
        """The ranking as a table: per row its score and, per output, the share of the policy's error it removes
        (``removed / policy error``); the policy's own errors first. ``top``: only the first rows."""
        outputs = self.outputs
        head = ["rank", "off (from " + f"`{self.policy.name}`)", "score"] + [f"`{o}`" for o in outputs]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                 "| | **error of the policy (rel RMS vs fp64)** | | "
                 + " | ".join(f"{self.policy_error[o]:.3g}" for o in outputs) + " |"]
        ranked = self.ranked()
        for i, r in enumerate(ranked[:top] if top else ranked, 1):
            cells = [str(i), f"`{r.label}`", f"{r.score:.3f}"] + [_share(self.fraction(r, o)) for o in outputs]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def top_markdown(self, n: int = 3) -> str:
        """Per output, the ``n`` roundings removing most of its error, with the share each removes."""
        lines = ["| output | error of the policy | " + " | ".join(f"#{i}" for i in range(1, n + 1)) + " |",
                 "|" + "---|" * (n + 2)]
        for o in self.outputs:
            tops = self.top(o, n)
            cells = [f"`{r.label}` ({_share(self.fraction(r, o))})" for r in tops] + ["–"] * (n - len(tops))
            lines.append(f"| `{o}` | {self.policy_error[o]:.3g} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _share(value: float) -> str:
    return "0" if value == 0 else f"{value:.2f}"


def _error(actual, expected) -> float:
    value = rel_rms(actual, expected)
    return math.inf if math.isnan(value) else value


def output_errors(run: runs.Run, baseline: runs.Run) -> Dict[str, float]:
    """Rel RMS of ``Out`` and each gradient of ``run`` against ``baseline`` (outputs both have)."""
    got, want = runs.op_outputs(run), runs.op_outputs(baseline)
    return {o: _error(got[o], want[o]) for o in OUTPUT_KEYS if got[o] is not None and want[o] is not None}


def variants(policy: RoundingPolicy) -> Tuple[List[Tuple[str, str, Any, RoundingPolicy]], Dict[str, str]]:
    """The one-off variants of ``policy``: ``(site, kind, value, variant)`` for every switch it has on (three
    operators' sections, chain order) and every other value of each knob; and the knob values the chain cannot
    run, ``{label: reason}``."""
    out: List[Tuple[str, str, Any, RoundingPolicy]] = []
    for op in chain.POLICY_OPERATORS:
        for site in policy.section(op).on():
            out.append((f"{op}.{site}", "switch", None, policy.replace(**{f"{op}.{site}": False})))
    skipped: Dict[str, str] = {}
    for knob in SENSITIVITY_KNOBS:
        for value in KNOBS[knob]:
            if value == getattr(policy, knob):
                continue
            variant = policy.replace(**{knob: value})
            try:
                chain.chain_kind(variant)
            except NotImplementedError as exc:
                skipped[f"{knob}={value}"] = str(exc)
                continue
            out.append((knob, "knob", value, variant))
    return out, skipped


def _mean(per_case: Sequence[Dict[str, float]]) -> Dict[str, float]:
    names = [o for o in OUTPUT_KEYS if any(o in e for e in per_case)]
    return {o: sum(e[o] for e in per_case if o in e) / sum(1 for e in per_case if o in e) for o in names}


def _at_lp(policy: RoundingPolicy, inputs: dict) -> RoundingPolicy:
    lp = str(inputs["Q"].dtype).replace("torch.", "")
    return policy if policy.lp_dtype == lp else policy.replace(lp_dtype=lp)


@single_threaded
def rank_op_sites(cases: Sequence[dict], policy="upstream_sm90", names: Optional[Sequence[str]] = None,
                  progress: bool = True, baselines: Optional[Sequence[runs.Run]] = None) -> OpSiteRanking:
    """One site (or knob value) of ``policy`` off at a time, on the whole op (module docstring).

    Args:
        cases (sequence of dict): inputs of ``mamba3_mimo`` (the 14 raw inputs by golden names, ``dout``,
            ``chunk_size``, ``rotary_dim_divisor``), e.g. golden ``inputs`` or ``cases.make_op_inputs(spec)``.
        policy (str | RoundingPolicy): the policy studied (moved to each case's lp dtype); it must define the three
            operators' sections.
        names (sequence of str, optional): the cases' names (default ``case0``, ...).
        progress (bool): a tqdm progress bar over the runs (on stderr).
        baselines (sequence of runs, optional): each case's ``fp64`` run when already computed (only
            :func:`runs.op_outputs` of it is read).

    Returns:
        OpSiteRanking
    """
    cases = list(cases)
    if not cases:
        raise ValueError("cases is empty: give at least one inputs dict of mamba3_mimo")
    names = list(names) if names is not None else [f"case{i}" for i in range(len(cases))]
    if len(names) != len(cases):
        raise ValueError(f"names has {len(names)} entries for {len(cases)} cases")
    policy = _presets.resolve(policy)
    chain.chain_kind(policy)  # PolicyUndefined / NotImplementedError before any work
    items, skipped = variants(policy)
    bar = tqdm(total=len(cases) * (len(items) + 2), desc="rank sites of mamba3_mimo", disable=not progress,
               leave=False)
    base_runs = []
    for i, x in enumerate(cases):
        base_runs.append(baselines[i] if baselines is not None else runs.policy_run(x, "fp64"))
        bar.update(1)
    full = []
    for x, base in zip(cases, base_runs):
        full.append(output_errors(runs.policy_run(x, _at_lp(policy, x)), base))
        bar.update(1)
    policy_error = _mean(full)
    outputs = tuple(policy_error)
    gradients = [o for o in outputs if o in GRADIENTS]
    rows: List[SiteOff] = []
    for site, kind, value, variant in items:
        per_case = []
        for x, base in zip(cases, base_runs):
            per_case.append(output_errors(runs.policy_run(x, _at_lp(variant, x)), base))
            bar.update(1)
        errors = _mean(per_case)
        removed = {o: _quadrature_part(policy_error[o], errors[o]) for o in outputs}
        shares = [removed[g] / policy_error[g] if policy_error[g] > 0 else 0.0 for g in gradients]
        rows.append(SiteOff(site, kind, value, errors, removed, sum(shares) / len(shares) if shares else 0.0))
    bar.close()
    rows.sort(key=lambda r: (-r.score, r.label))
    return OpSiteRanking(policy, "fp64", outputs, policy_error, rows, skipped, len(cases), names)
