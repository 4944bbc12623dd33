"""The results of the accuracy gates (:mod:`mimo_numerics.testing`) and their report table.

:class:`OutputCheck` (one output of one case), :class:`CaseResult` (one case) and :class:`GateReport` (one run:
``passed``, ``table()``, ``failure_message()``, ``to_dict()``); ``docs/gating.md`` explains the columns.
"""

from __future__ import annotations

import functools
import json
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import operator as _operator
from .gate_cases import policy_label
from .gate_nearest import NEAREST_PRESET_MAX_CASES, NEAREST_PRESET_MAX_SIZE, PresetMatch, case_size, nearest_preset
from .gate_settings import GateSettings
from .policy import RoundingPolicy

__all__ = ["OutputCheck", "CaseResult", "GateReport", "FAILURE_WIDTH", "safe_ratio"]


@dataclass(frozen=True)
class OutputCheck:
    """The checks of one output of one case.

    Attributes:
        output (str): the output name.
        status (str): ``"pass"``, ``"FAIL"`` or ``"absent"`` (None in both ``fn`` and the reference).
        problems (tuple of str): why it failed (structure or gate), empty when it passed.
        notes (tuple of str): remarks that do not fail the check (e.g. non-finite reference elements).
        err_same (float): ``rel_rms(fn, reference[P])`` (nan when not computable).
        noise (float): this case's FP32-order noise floor of the output (:func:`self_noise`); measured only when
            ``err_same`` exceeds ``settings.tol_same`` (nan otherwise: it could not change the verdict).
        noise_source (str): the perturbation that produced ``noise``.
        tol_same (float): ``max(settings.tol_same, settings.noise_factor · noise)``.
        tol_base (float): ``settings.tol_same`` of this output (the tolerance before the noise floor).
        tol_entry (str): the ``mimo_numerics.tolerances`` entry of ``tol_base`` (the most specific entry for the
            operator, output and format; ``""`` when the caller gave ``tol_same``).
        err_oracle (float): ``rel_rms(fn, oracle)``.
        ref_err_oracle (float): ``rel_rms(reference[P], oracle)``.
        bound_oracle (float): ``alpha · ref_err_oracle + floor``.
        max_abs (float): ``max |fn - reference[P]|``.
        bit_equal (float): fraction of elements bit-equal to ``reference[P]`` (nan when the dtypes differ).
        nonfinite (int): NaN/Inf elements of ``fn`` where the reference is finite.
    """

    output: str
    status: str
    problems: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    err_same: float = math.nan
    noise: float = math.nan
    noise_source: str = ""
    tol_same: float = math.nan
    tol_base: float = math.nan
    tol_entry: str = ""
    err_oracle: float = math.nan
    ref_err_oracle: float = math.nan
    bound_oracle: float = math.nan
    max_abs: float = math.nan
    bit_equal: float = math.nan
    nonfinite: int = 0

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"

    @property
    def same_use(self) -> float:
        """``err_same / tol_same`` (> 1 fails the same-policy gate)."""
        return safe_ratio(self.err_same, self.tol_same)

    @property
    def oracle_use(self) -> float:
        """``err_oracle / bound_oracle`` (> 1 fails the noise-floor gate)."""
        return safe_ratio(self.err_oracle, self.bound_oracle)

    @property
    def oracle_ratio(self) -> float:
        """``err_oracle / ref_err_oracle``: fn's error relative to the policy's own (1.0 for the reference)."""
        return safe_ratio(self.err_oracle, self.ref_err_oracle)

    @property
    def oracle_limit(self) -> float:
        """``bound_oracle / ref_err_oracle``: the largest ``oracle_ratio`` the noise-floor gate accepts."""
        return safe_ratio(self.bound_oracle, self.ref_err_oracle)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["problems"], out["notes"] = list(self.problems), list(self.notes)
        for key in ("same_use", "oracle_use", "oracle_ratio", "oracle_limit"):
            out[key] = getattr(self, key)
        return out


def safe_ratio(num: float, den: float) -> float:
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


@dataclass
class CaseResult:
    """The checks of one case.

    Attributes:
        case: the case spec (a ``CaseSpec`` or another spec class of the operator's grids).
        policy (RoundingPolicy | None): the policy the case was gated under (None when skipped).
        outputs (list of OutputCheck): one per output name, in ``op.output_names`` order (empty when ``fn``
            raised).
        problems (list of str): case-level failures: ``fn`` raised, returned something unusable, modified inputs.
        skipped (str | None): why the case was not run.
        traceback (str | None): the traceback when ``fn`` raised.
        seconds (float): wall time of ``fn`` plus moving its results to the CPU.
        fn_outputs (dict | None): CPU copies of ``fn``'s output tensors, kept for failing cases only (for
            :meth:`GateReport.nearest_presets`); not part of ``to_dict``.
    """

    case: Any
    policy: Optional[RoundingPolicy]
    outputs: List[OutputCheck] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    skipped: Optional[str] = None
    traceback: Optional[str] = None
    seconds: float = 0.0
    fn_outputs: Optional[Dict[str, torch.Tensor]] = field(default=None, repr=False, compare=False)

    @property
    def case_id(self) -> str:
        return self.case.case_id

    @property
    def passed(self) -> bool:
        """True when not skipped and every check passed."""
        return self.skipped is None and not self.problems and all(o.passed for o in self.outputs)

    @property
    def failed(self) -> bool:
        return self.skipped is None and not self.passed

    def to_dict(self) -> dict:
        return {"case_id": self.case_id, "case": self.case.to_dict(),
                "policy": None if self.policy is None else self.policy.to_dict(),
                "passed": self.passed, "skipped": self.skipped, "problems": list(self.problems),
                "traceback": self.traceback, "seconds": self.seconds,
                "outputs": [o.to_dict() for o in self.outputs]}


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.2e}"


def _ratio_cell(x: float, percent: bool = False) -> str:
    """A ratio as a table cell: ``-`` for nan, ``inf``, else four decimals or (``percent``) a whole percentage."""
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{100 * x:.0f}%" if percent else f"{x:.4f}"


_COLUMNS = ("case", "output", "status", "vs ref[P]", "noise", "tol", "use", "vs fp64", "ref vs fp64", "ratio",
            "limit", "bit-eq", "note")
_GATE_NAMES = ("same-policy gate", "noise-floor gate")


#: Width of :meth:`GateReport.failure_message` (columns).
FAILURE_WIDTH = 120


def _aligned(rows: List[List[str]], rule_after_header: bool, split_last: bool = False):
    """Rows padded to common column widths, the last column unpadded. ``split_last``: ``(cells, last)`` pairs."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        cells = "  ".join(row[i].ljust(widths[i]) for i in range(len(widths)))
        out.append((cells, row[-1]) if split_last else ("  ".join([cells, row[-1]])).rstrip())
    if rule_after_header and not split_last:
        out.insert(1, "-" * len(out[0]))
    return out


def _short_problem(problem: str) -> str:
    """A gate failure as the gate's name (its numbers are in the table's columns); other problems in full."""
    for gate_name in _GATE_NAMES:
        if problem.startswith(gate_name + ":"):
            return gate_name
    return problem


@dataclass
class GateReport:
    """Result of :func:`check`.

    Attributes:
        policy (RoundingPolicy): the policy gated against.
        device (str): where ``fn`` ran.
        settings (GateSettings): the operator's thresholds (an output or format with entries of its own in
            ``mimo_numerics.tolerances`` is gated with those: the table's ``tol`` and ``limit`` columns show them).
        cases (list of CaseResult): one per case, in order.
        operator (str): the gated operator's name (None given: the default operator).
    """

    policy: RoundingPolicy
    device: str
    settings: GateSettings
    cases: List[CaseResult]
    operator: Optional[str] = None
    _nearest_cache: Dict[tuple, List["PresetMatch"]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)

    def __post_init__(self):
        self.operator = _operator.get(self.operator).name

    @property
    def checked(self) -> List[CaseResult]:
        """Cases that ran (not skipped)."""
        return [c for c in self.cases if c.skipped is None]

    @property
    def failed_cases(self) -> List[CaseResult]:
        return [c for c in self.cases if c.failed]

    @property
    def passed(self) -> bool:
        """True when at least one case ran and no check failed."""
        return bool(self.checked) and not self.failed_cases

    def failures(self) -> List[Tuple[str, str, str]]:
        """Every failure as ``(case_id, output or "*", reason)``."""
        out = []
        for case in self.cases:
            out.extend((case.case_id, "*", p) for p in case.problems)
            for check in case.outputs:
                out.extend((case.case_id, check.output, p) for p in check.problems)
        return out

    def worst(self) -> dict:
        """Largest ``same_use``, ``oracle_use`` and ``oracle_ratio`` over the checked outputs, as
        ``{key: (value, case_id, output)}``."""
        result = {"same_use": (0.0, "", ""), "oracle_use": (0.0, "", ""), "oracle_ratio": (0.0, "", "")}
        for case in self.checked:
            for check in case.outputs:
                for key in result:
                    value = getattr(check, key)
                    if not math.isnan(value) and value > result[key][0]:
                        result[key] = (value, case.case_id, check.output)
        return result

    def _label(self, policy: RoundingPolicy) -> str:
        return policy_label(policy, self.operator)

    def summary(self) -> str:
        """One line: verdict, policy, device, counts."""
        n_checks = sum(1 for c in self.checked for o in c.outputs if o.status != "absent")
        n_bad = len(self.failures())
        skipped = len(self.cases) - len(self.checked)
        verdict = "PASSED" if self.passed else "FAILED"
        text = (f"{self.operator} gate {verdict}: policy {self._label(self.policy)}, device {self.device}, "
                f"{len(self.checked)} case(s) run, {len(self.failed_cases)} failed ({n_bad} failing check(s) of "
                f"{n_checks} outputs)")
        if skipped:
            text += f", {skipped} skipped"
        if not self.checked:
            text += "; no case was run, so nothing was gated"
        return text

    def _output_rows(self, case: CaseResult, show_absent: bool) -> List[List[str]]:
        """Table cells of one case's outputs (``_COLUMNS`` without ``case``)."""
        rows = []
        blank = ["-"] * (len(_COLUMNS) - 4)
        for o in case.outputs:
            if o.status == "absent":
                if show_absent:
                    rows.append([o.output, "absent"] + blank + ["None in fn and reference (branch off)"])
                continue
            notes = [_short_problem(p) for p in o.problems] + list(o.notes)
            if not o.problems and o.noise_source and o.tol_same > o.tol_base:
                notes.append(f"tol from noise ({o.noise_source})")
            rows.append([o.output, o.status, _fmt(o.err_same), _fmt(o.noise), _fmt(o.tol_same),
                         _ratio_cell(o.same_use, percent=True), _fmt(o.err_oracle), _fmt(o.ref_err_oracle),
                         _ratio_cell(o.oracle_ratio), _ratio_cell(o.oracle_limit),
                         "-" if math.isnan(o.bit_equal) else f"{o.bit_equal:.4f}", "; ".join(notes)])
        return rows

    def table(self, cases: Optional[Sequence[CaseResult]] = None, show_absent: bool = True,
              width: Optional[int] = None) -> str:
        """The per-case, per-output table (all cases by default); ``docs/gating.md`` explains the columns.

        Args:
            cases: the cases to list (default: all).
            show_absent (bool): list outputs that are None in both ``fn`` and the reference.
            width (int, optional): fit lines into this many columns: the case id goes on a line of its own above
                its rows (no ``case`` column) and notes that do not fit move to an indented line below their row.
                Default: one row per case and output, as wide as it takes.
        """
        cases = self.cases if cases is None else list(cases)
        if width is not None:
            return self._narrow_table(cases, show_absent, width)
        rows = []
        blank = ["-"] * (len(_COLUMNS) - 4)
        for case in cases:
            cid = case.case_id
            if case.skipped is not None:
                rows.append([cid, "*", "skip"] + blank + [case.skipped])
                continue
            for problem in case.problems:
                rows.append([cid, "*", "FAIL"] + blank + [problem])
            rows.extend([cid] + row for row in self._output_rows(case, show_absent))
        return "\n".join(_aligned([list(_COLUMNS)] + rows, rule_after_header=True))

    def _narrow_table(self, cases: Sequence[CaseResult], show_absent: bool, width: int) -> str:
        header = list(_COLUMNS[1:])
        groups = [(case, self._output_rows(case, show_absent)) for case in cases]
        aligned = iter(_aligned([header] + [row for _, rows in groups for row in rows], rule_after_header=False,
                                split_last=True))
        head_cells, head_note = next(aligned)
        lines = [(head_cells + "  " + head_note)[:width].rstrip()]
        lines.append("-" * len(lines[0]))
        wrap = functools.partial(textwrap.wrap, width=width, break_long_words=False, break_on_hyphens=False)
        for case, rows in groups:
            title = f"case {case.case_id}"
            if case.policy is not None and case.policy != self.policy:
                title += f" (gated under {self._label(case.policy)})"
            lines.extend(wrap(title + ":", subsequent_indent="    "))
            if case.skipped is not None:
                lines.extend(wrap(f"skip: {case.skipped}", initial_indent="  ", subsequent_indent="    "))
            for problem in case.problems:
                lines.extend(wrap(f"FAIL: {problem}", initial_indent="  ", subsequent_indent="    "))
            for _ in rows:
                cells, note = next(aligned)
                if not note or len(cells) + 2 + len(note) <= width:
                    lines.append((cells + "  " + note).rstrip())
                else:
                    lines.append(cells.rstrip())
                    lines.extend(wrap(f"note: {note}", initial_indent="    ", subsequent_indent="      "))
        return "\n".join(lines)

    def nearest_presets(self, max_cases: int = NEAREST_PRESET_MAX_CASES,
                        max_size: int = NEAREST_PRESET_MAX_SIZE) -> List[PresetMatch]:
        """For the smallest failing cases, the preset whose reference ``fn``'s outputs are nearest to.

        Runs the reference of every preset (at the case's lp dtype) on up to ``max_cases`` failing cases of at most
        ``max_size`` elements (B·S·H·max(N, P)) whose outputs ``fn`` returned; cached on the report.

        Returns:
            list of PresetMatch: one per compared case (``match.better``: nearer to that preset than to the claim).
        """
        key = (max_cases, max_size)
        cached = self._nearest_cache
        if key not in cached:
            size = functools.partial(case_size, op=self.operator)
            candidates = [c for c in self.failed_cases if c.fn_outputs and size(c.case) <= max_size]
            candidates.sort(key=lambda c: size(c.case))
            matches = [nearest_preset(c.case, c.policy, c.fn_outputs, op=self.operator)
                       for c in candidates[:max_cases]]
            cached[key] = [m for m in matches if m is not None]
        return cached[key]

    def _nearest_preset_lines(self, width: int) -> List[str]:
        by_preset: Dict[str, List[PresetMatch]] = {}
        for match in self.nearest_presets():
            if match.better:
                by_preset.setdefault(match.nearest, []).append(match)
        lines = []
        for label, matches in by_preset.items():
            first = matches[0]
            cases = (f"on {first.case_id}" if len(matches) == 1
                     else f"on {len(matches)} failing cases, e.g. {first.case_id}")
            near = "0 (bit-exact)" if first.nearest_distance == 0 else _fmt(first.nearest_distance)
            text = (f"hint: outputs look like preset `{label}` {cases}: mean rel RMS {near} to it vs "
                    f"{_fmt(first.claimed_distance)} to the claimed {self._label(first.claimed)} (diff from claimed: "
                    f"{first.differences()})")
            lines.extend(textwrap.wrap(text, width=width, subsequent_indent="  ", break_long_words=False,
                                       break_on_hyphens=False))
        return lines

    def output_settings(self) -> Dict[Tuple[str, str], GateSettings]:
        """``{(output, lp format): settings}`` where an output was gated with tolerance entries of its own (keyed by
        the operator and output or format in ``mimo_numerics.tolerances``) rather than :attr:`settings`."""
        given = {k: getattr(self.settings, k) for k in ("tol_same", "noise_factor", "alpha", "floor")
                 if k not in dict(self.settings.entries)}
        formats = sorted({c.policy.lp_dtype for c in self.checked})
        found = {}
        for output in _operator.get(self.operator).output_names:
            for fmt in formats:
                own = GateSettings.from_table(**given, op=self.operator, output=output, fmt=fmt)
                if own != self.settings:
                    found[(output, fmt)] = own
        return found

    def _own_settings_lines(self) -> List[str]:
        """One line naming the outputs gated with tolerances of their own, or none."""
        base_entries = dict(self.settings.entries)
        texts: Dict[str, str] = {}
        for (output, fmt), own in self.output_settings().items():
            own_entries = dict(own.entries)
            changed = [f"{k} {getattr(own, k):g} ({own_entries.get(k, 'given')})"
                       for k in ("tol_same", "noise_factor", "alpha", "floor")
                       if getattr(own, k) != getattr(self.settings, k) or own_entries.get(k) != base_entries.get(k)]
            texts.setdefault(f"{output}: {', '.join(changed)}", fmt)
        if not texts:
            return []
        return ["outputs with tolerances of their own: " + "; ".join(texts)]

    def failure_message(self, width: int = FAILURE_WIDTH) -> str:
        """The text of the ``AssertionError`` of :func:`assert_gate` (and of the pytest fixture's
        failure): summary, gate formulas, the failing cases' table and, when ``fn``'s outputs match another preset
        better than the claimed policy, that preset and how it differs; lines fit ``width`` columns."""
        wrap = functools.partial(textwrap.wrap, width=width, subsequent_indent="  ", break_long_words=False,
                                 break_on_hyphens=False)
        parts = wrap(self.summary())
        for formula in list(self.settings.formulas()) + self._own_settings_lines():
            parts.extend(wrap(formula))
        failed = self.failed_cases
        if failed:
            parts.append(self.table(failed, show_absent=False, width=width))
            n_ok = len(self.checked) - len(failed)
            if n_ok:
                parts.append(f"({n_ok} other case(s) passed; report.table() lists every case)")
            parts.extend(self._nearest_preset_lines(width))
        else:
            parts.append(self.table(width=width))
        for case in failed:
            if case.traceback:
                parts.append(f"traceback of fn on {case.case_id}:\n{case.traceback}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return "\n".join([self.summary(), self.settings.describe()] + self._own_settings_lines() + [self.table()])

    def to_dict(self) -> dict:
        """JSON-serialisable form (``json.dumps(report.to_dict())``) for CI artifacts."""
        return {"passed": self.passed, "operator": self.operator, "policy": self.policy.to_dict(),
                "policy_label": self._label(self.policy), "device": self.device, "settings": self.settings.to_dict(),
                "cases": [c.to_dict() for c in self.cases]}

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def raise_if_failed(self) -> "GateReport":
        """Raise ``AssertionError`` with :meth:`failure_message` unless :attr:`passed`; return self."""
        if not self.passed:
            raise AssertionError(self.failure_message())
        return self
