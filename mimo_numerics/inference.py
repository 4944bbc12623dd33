"""Recover the rounding policy that produced a set of outputs of an operator (default: the registry's default).

Every function takes ``op`` (an operator name or :class:`mimo_numerics.operator.Operator`; None: the default
operator); the searched switches are that operator's sites and its lp outputs weigh in the distance.

Given the inputs of one or more cases and the outputs some implementation returned for them (a device run, a bundle,
the golden H200 data), :func:`infer_policy` searches the ``RoundingPolicy`` space for the policy whose reference
outputs are closest to them.

Distance
--------
For one case, with ``u`` the unit roundoff of the inputs' lp dtype (``2**-8`` for bfloat16, ``2**-11`` for
float16), the distance of a candidate's outputs ``a`` to the target outputs ``e`` is::

    D = Σ_o  w · m_o · (1 − eq_o)  +  rel_rms(a_o, e_o) / u

summed over the outputs ``o`` the target provides (missing or None outputs are skipped). ``eq_o`` is the fraction of
equal elements (compared as values: ``+0`` equals ``−0``, whose sign the FP32-level details of a device decide, and
NaN equals NaN); ``w = MISMATCH_WEIGHT = 10`` and ``m_o`` is 1 for the outputs the operator stores in lp
(``op.lp_outputs``, e.g. stage 1's ``states``, ``dz``, ``qk_dot``) and 0 for its float32 outputs (e.g. the
projections ``dmimo_o`` and ``dmimo_z``). Why:

* the lp outputs are where a policy's roundings show up bit for bit. A target output that agrees exactly with a
  candidate contributes 0, while a 1-ulp flip in 1 % of its elements costs 0.1 plus its RMS term (about 0.02):
  exact agreement weighs strongly. The weight 10 was chosen on synthetic data: with 1 the descent stalled in a local
  minimum for about 1 in 15 random policies (mismatched roundings early in the pipeline make later roundings look
  wrong in RMS terms while the mismatch fraction still points the right way), with 10 none in 90;
* the low bits of float32 outputs also depend on the FP32-level knobs that no policy models yet (tensor-core
  accumulation, fast-math special functions, FMA contraction, summation order, ``docs/semantics.md``). Their
  bit-equal fraction is about 0.1 for the correct policy on the H200 data, so counting it would only add noise;
  they enter through their relative RMS;
* dividing the relative RMS by ``u`` puts every output on the scale of one lp rounding: a policy error of the
  order of the lp rounding costs about 1 per output, an FP32-level residual about 1e-3.

``D = 0`` exactly when every provided output is equal to the candidate's. With several cases, the distance is the
mean of the per-case distances. If a target lacks the leading batch axis of a per-batch output (e.g. stage 1's
``dmimo_o`` as ``[H, R, P]``, the wrapper's sum over the batch), the candidate's ``[B, ...]`` values are summed over
the batch in float32 before comparing.

Search
------
Only the fields the reference honours are searched: the operator's switches and the knobs ``diag_mode``,
``state_update`` and ``silu_form`` (and ``gemm_model``, ``special_functions``, ``fp32_fma``, ``reduction_order``
where the operator has them, when ``fields`` names them).
``lp_dtype`` is fixed by the inputs, ``math_dtype`` is float32 and ``round_outputs`` is True
(the kernel contract). From ``start`` (normalised to those fixed values), each round does

1. an exhaustive sweep over every combination of the searched knobs, the switches held;
2. best-improvement descent: evaluate every single-field change (a switch flip or another knob value), move to the
   best one while it strictly lowers the distance;
3. if the distance is still above 0, an escape step over every pair of single-field changes (``pair_limit=k``:
   only pairs among the k single changes that cost least on their own).

Rounds repeat until one changes nothing. With several cases, a candidate is dropped as soon as its partial sum
over the cases shows it cannot beat the current best (exact: per-case distances are non-negative).

Restarts: a descent can stop in a local minimum above distance 0 (on some tiny cases, mismatched early roundings
make every single and pair change look worse; ``reports/reliability.md``, finding F4). When the search from
``start`` ends above 0, it is run again from each policy of ``restarts`` (default :data:`RESTARTS`: ``fp32``, every
switch off; ``seed_bf16``, every switch on; ``upstream_sm90``, the fused device knobs), in order, and the lowest
distance wins (the earlier search on a tie); the restarts stop as soon as one reaches 0. All searches share one
evaluation cache, so a restart that joins an earlier path costs little.

Escapes: when every restart still ends above 0, the search tries every triple of single-field changes among the 14
that cost least on their own (up to 364) from the best result, then, if no triple helps, every quadruple among
the 10 cheapest (up to 210; :data:`ESCAPES`); on an improvement it searches on from there (rounds as above) and starts
the escapes over, until none helps or the distance is 0 (findings F9 and F10 of ``reports/reliability.md``: tiny
cases where no pair helps but one triple, or one quadruple, leads to distance 0).

Ties never move: a single move happens only when it lowers the distance, so a field whose value does not change the
outputs keeps its ``start`` value (a knob sweep takes the first lowest combination, so it can move a knob that does
not matter along with one that does). When a restart or an escape wins, each field where its result differs from
``start`` is set back to its ``start`` value when that does not raise the distance (in field order, until nothing
changes), so the restart's own values of unidentifiable fields do not leak into the result.
:attr:`InferenceResult.ties` lists the fields whose change leaves the best distance unchanged (those are not
identifiable from these data). Every reference evaluation is cached by policy, and everything is deterministic.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import operator as _operator
from . import presets as _presets
from .metrics import rel_rms
from .ops import registry
from .policy import KNOBS, RoundingPolicy, read_field, write_fields

#: Knobs the search varies (the others are fixed: lp_dtype by the inputs, math_dtype float32, round_outputs True).
SEARCHED_KNOBS: Tuple[str, ...] = ("diag_mode", "state_update", "silu_form")
#: Knobs searched only when ``fields`` names them (where the operator has them): an evaluation under a tensor-core
#: ``gemm_model`` costs several FP32 ones, and the FP32-level knobs move the distance far less than the switches.
ON_REQUEST_KNOBS: Tuple[str, ...] = ("gemm_model", "reduction_order", "special_functions", "fp32_fma", "tilelang")



def searched_fields(op=None) -> Tuple[str, ...]:
    """Every field the search varies for operator ``op``: its switches (bare site names), then the knobs."""
    op = _operator.get(op)
    return tuple(registry.site_table(op.name)) + tuple(k for k in SEARCHED_KNOBS if k in op.knobs)


#: The default operator's switches and searched fields (use :func:`searched_fields` for another operator).
SWITCHES: Tuple[str, ...] = tuple(registry.site_table(registry.DEFAULT_OPERATOR))
SEARCHED_FIELDS: Tuple[str, ...] = searched_fields()
#: Weight ``w`` of the bit-mismatch fraction of an lp output in the distance.
MISMATCH_WEIGHT = 10.0
#: Starts tried in order when the search from ``start`` stops above distance 0: all switches off, all on, the
#: fused sm_90 knobs (module docstring, "Restarts").
RESTARTS: Tuple[str, ...] = ("fp32", "seed_bf16", "upstream_sm90")
#: Last-resort escapes, in order (module docstring, "Escapes"): (k, n) tries every k-tuple of distinct-field changes
#: among the n single-field changes that cost least on their own (up to 364 triples, then up to 210 quadruples).
ESCAPES: Tuple[Tuple[int, int], ...] = ((3, 14), (4, 10))
#: Unit roundoff of each lp dtype.
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
_LP_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}

PolicyLike = Union[str, RoundingPolicy]
CasesLike = Union[Mapping[str, Any], Sequence[Mapping[str, Any]]]


# ---------------------------------------------------------------------------------------------- threads
@contextlib.contextmanager
def torch_threads(n: int = 1):
    """Run the block with ``n`` torch intra-op threads, then restore the previous count.

    The searches here evaluate the reference hundreds of times on small tensors, where extra threads only add
    overhead (10x slower on a busy 2-core machine). This is a speed setting; it does not select numerics.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def single_threaded(fn):
    """Decorator: run ``fn`` under :func:`torch_threads` (1)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch_threads(1):
            return fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------------------------------------- case helpers
def as_case_list(inputs: CasesLike, op=None) -> List[Mapping[str, Any]]:
    """One inputs dict, or a sequence of them, as a list (``ValueError`` when empty or not ``op``'s input dicts)."""
    op = _operator.get(op)
    if isinstance(inputs, Mapping):
        cases = [inputs]
    else:
        cases = list(inputs)
    if not cases:
        raise ValueError("need at least one case of inputs")
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping):
            raise TypeError(f"case {i}: inputs must be a dict of the {len(op.input_names)} tensors of {op.name} "
                            f"plus {', '.join(op.scalar_inputs)}, got {type(case).__name__}")
        missing = [n for n in op.input_names + op.scalar_inputs if n not in case]
        if missing:
            raise ValueError(f"case {i}: inputs lack {missing}")
    return cases


def as_output_list(outputs, n_cases: int, op=None) -> List[Dict[str, Optional[torch.Tensor]]]:
    """One outputs mapping (or an outputs NamedTuple), or a sequence of ``n_cases`` of them, as a list of dicts.

    Outputs not given, or None, are left out of the comparison.
    """
    names = _operator.get(op).output_names
    if isinstance(outputs, Mapping) or hasattr(outputs, "_asdict"):
        items = [outputs]
    else:
        items = list(outputs)
    if len(items) != n_cases:
        raise ValueError(f"got {len(items)} sets of outputs for {n_cases} case(s)")
    result = []
    for i, item in enumerate(items):
        mapping = item._asdict() if hasattr(item, "_asdict") else dict(item)
        unknown = sorted(set(mapping) - set(names))
        if unknown:
            raise ValueError(f"case {i}: unknown output name(s) {unknown}; outputs are {list(names)}")
        result.append({n: mapping.get(n) for n in names})
    return result


def lp_dtype_of(inputs: CasesLike, op=None) -> str:
    """The lp dtype name (``"bfloat16"``/``"float16"``) of the cases' ``q``; ``ValueError`` if they disagree."""
    names = set()
    for case in as_case_list(inputs, op):
        dtype = case["q"].dtype
        if dtype not in _LP_NAMES:
            raise ValueError(f"q must be bfloat16 or float16, got {dtype}")
        names.add(_LP_NAMES[dtype])
    if len(names) != 1:
        raise ValueError(f"cases mix lp dtypes {sorted(names)}; infer each dtype separately")
    return names.pop()


def run_reference(inputs: Mapping[str, Any], policy: PolicyLike, record: Optional[dict] = None,
                  op=None) -> Dict[str, Any]:
    """Operator ``op``'s policy reference outputs on one case, as a dict by output name."""
    out = _operator.get(op).run_reference(inputs, _presets.resolve(policy), record=record)
    return dict(zip(out._fields, out))


def normalise_policy(policy: PolicyLike, lp_dtype: str) -> RoundingPolicy:
    """``policy`` with the fields the search fixes: ``lp_dtype`` of the inputs, float32 math, rounded outputs."""
    return _presets.resolve(policy).replace(lp_dtype=lp_dtype, math_dtype="float32", round_outputs=True)


def describe_policy(policy: PolicyLike, op=None) -> str:
    """:func:`presets.label` of ``policy`` on operator ``op`` (``"upstream_sm90 with silu_form=sigmoid"``)."""
    return _presets.label(_presets.resolve(policy), operator=_operator.get(op).name)


# ---------------------------------------------------------------------------------------------- distance
@dataclass(frozen=True)
class Evaluation:
    """Distance of one policy's outputs to a target, with its parts (means over the cases).

    Attributes:
        distance (float): the combined distance ``D`` (module docstring).
        per_output (dict): output -> its share of ``D``.
        rel_rms (dict): output -> relative RMS error against the target.
        mismatch (dict): output -> fraction of elements whose value differs from the target's.
    """

    distance: float
    per_output: Dict[str, float]
    rel_rms: Dict[str, float]
    mismatch: Dict[str, float]

    def to_dict(self) -> Dict[str, Any]:
        return {"distance": self.distance, "per_output": dict(self.per_output), "rel_rms": dict(self.rel_rms),
                "mismatch": dict(self.mismatch)}


def _matched(candidate: torch.Tensor, target: torch.Tensor, name: str, op) -> torch.Tensor:
    if tuple(candidate.shape) == tuple(target.shape):
        return candidate
    per_batch = op.stage(name).shape[:2] == ("B", "H") and "S" not in op.stage(name).shape
    if per_batch and tuple(candidate.shape[1:]) == tuple(target.shape):  # the target is the sum over the batch
        return candidate.to(torch.float32).sum(dim=0)
    raise ValueError(f"output {name}: candidate shape {list(candidate.shape)} does not match the target's "
                     f"{list(target.shape)}")


def _mismatch(a: torch.Tensor, e: torch.Tensor) -> float:
    """Fraction of elements whose values differ (+0 equals −0, NaN equals NaN)."""
    if a.numel() == 0:
        return 0.0
    a64, e64 = a.detach().to(torch.float64), e.detach().to(torch.float64)
    same = (a64 == e64) | (torch.isnan(a64) & torch.isnan(e64))
    return 1.0 - same.to(torch.float64).mean().item()


def output_distance(candidate: Mapping[str, Optional[torch.Tensor]], target: Mapping[str, Optional[torch.Tensor]],
                    lp_dtype: str = "bfloat16", op=None) -> Evaluation:
    """The distance ``D`` of one case's candidate outputs to the target outputs (module docstring).

    Args:
        candidate (dict): output name -> tensor (a policy's reference outputs).
        target (dict): output name -> tensor or None; absent and None outputs are skipped.
        lp_dtype (str): ``"bfloat16"`` or ``"float16"``: sets the unit roundoff ``u``.
        op: the operator (its output names and lp outputs).

    Returns:
        Evaluation: the distance and its parts (``nan`` relative RMS counts as ``inf``).

    Raises:
        ValueError: when the candidate lacks an output the target has, or shapes disagree.
    """
    op = _operator.get(op)
    u = UNIT_ROUNDOFF[lp_dtype]
    per_output, rms, mism = {}, {}, {}
    for name in op.output_names:
        e = target.get(name)
        if e is None:
            continue
        a = candidate.get(name)
        if a is None:
            raise ValueError(f"output {name}: the target has it but the candidate does not (different branches)")
        a = _matched(a, e, name, op)
        r = rel_rms(a, e)
        if math.isnan(r):
            r = math.inf
        m = _mismatch(a, e)
        rms[name], mism[name] = r, m
        per_output[name] = (MISMATCH_WEIGHT * m if name in op.lp_outputs else 0.0) + r / u
    return Evaluation(sum(per_output.values()), per_output, rms, mism)


def _mean_evaluations(evals: Sequence[Evaluation]) -> Evaluation:
    def mean_of(attr):
        keys = list(dict.fromkeys(k for e in evals for k in getattr(e, attr)))
        return {k: sum(getattr(e, attr)[k] for e in evals if k in getattr(e, attr))
                / sum(1 for e in evals if k in getattr(e, attr)) for k in keys}

    return Evaluation(sum(e.distance for e in evals) / len(evals), mean_of("per_output"), mean_of("rel_rms"),
                      mean_of("mismatch"))


class PolicyEvaluator:
    """Reference outputs and their distance to fixed targets, cached by policy.

    Args:
        inputs: one inputs dict or a sequence of them (the cases).
        targets: the target outputs of each case (see :func:`as_output_list`).
        lp_dtype (str, optional): the lp dtype; default that of the inputs.
        keep_outputs (bool): also cache the reference outputs (memory grows with the policies evaluated).
        op: the operator (default: the registry's default).
    """

    def __init__(self, inputs: CasesLike, targets, lp_dtype: Optional[str] = None, keep_outputs: bool = False,
                 op=None):
        self.op = _operator.get(op)
        self.cases = as_case_list(inputs, self.op)
        self.targets = as_output_list(targets, len(self.cases), self.op)
        self.lp_dtype = lp_dtype or lp_dtype_of(self.cases, self.op)
        self.keep_outputs = keep_outputs
        self._evaluations: Dict[RoundingPolicy, Evaluation] = {}
        self._partial: Dict[RoundingPolicy, List[Evaluation]] = {}
        self._outputs: Dict[RoundingPolicy, List[Dict[str, Any]]] = {}
        self.reference_calls = 0

    def outputs(self, policy: PolicyLike) -> List[Dict[str, Any]]:
        """The reference outputs of every case under ``policy``."""
        policy = _presets.resolve(policy)
        if policy in self._outputs:
            return self._outputs[policy]
        outs = [run_reference(case, policy, op=self.op) for case in self.cases]
        self.reference_calls += len(self.cases)
        if self.keep_outputs:
            self._outputs[policy] = outs
        return outs

    def _case_evaluations(self, policy: RoundingPolicy, upto: int) -> List[Evaluation]:
        done = self._partial.setdefault(policy, [])
        while len(done) < upto:
            i = len(done)
            if policy in self._outputs:
                out = self._outputs[policy][i]
            else:
                out = run_reference(self.cases[i], policy, op=self.op)
                self.reference_calls += 1
            done.append(output_distance(out, self.targets[i], self.lp_dtype, self.op))
        if len(done) == len(self.cases) and policy not in self._evaluations:  # complete: promote
            self._evaluations[policy] = _mean_evaluations(done)
        return done

    def evaluate(self, policy: PolicyLike) -> Evaluation:
        """The :class:`Evaluation` of ``policy`` (mean over the cases), cached."""
        policy = _presets.resolve(policy)
        if policy not in self._evaluations:
            if self.keep_outputs:
                self.outputs(policy)
            self._case_evaluations(policy, len(self.cases))
            self._partial.pop(policy, None)
        return self._evaluations[policy]

    def distance_below(self, policy: PolicyLike, bound: float) -> Optional[float]:
        """The distance of ``policy`` if it is below ``bound``, else None, evaluating only as many cases as needed.

        The distance is a mean of non-negative per-case distances, so once the partial sum reaches ``bound`` times
        the case count the policy cannot be below ``bound`` (exact pruning; the cases evaluated are kept).
        """
        policy = _presets.resolve(policy)
        if policy in self._evaluations:
            dist = self._evaluations[policy].distance
            return dist if dist < bound else None
        limit = bound * len(self.cases)
        for i in range(len(self.cases)):
            done = self._case_evaluations(policy, i + 1)
            if policy in self._evaluations:
                break
            if sum(e.distance for e in done) > limit * (1 + 1e-12):
                return None
        dist = self.evaluate(policy).distance
        return dist if dist < bound else None

    def distance(self, policy: PolicyLike) -> float:
        """The combined distance of ``policy``."""
        return self.evaluate(policy).distance

    @property
    def evaluated(self) -> Dict[RoundingPolicy, Evaluation]:
        """Every policy evaluated on every case so far."""
        return dict(self._evaluations)

    @property
    def touched(self) -> int:
        """Distinct policies evaluated on at least one case (fully or pruned by :meth:`distance_below`)."""
        return len(set(self._evaluations) | {p for p, done in self._partial.items() if done})


# ---------------------------------------------------------------------------------------------- moves
def field_alternatives(policy: RoundingPolicy, name: str, op=None) -> Tuple[Any, ...]:
    """The values of a searched field of operator ``op`` other than ``policy``'s."""
    op_name = _operator.get(op).name
    if name in registry.site_table(op_name):
        return (not read_field(policy, op_name, name),)
    if name in SEARCHED_KNOBS + ON_REQUEST_KNOBS:
        return tuple(v for v in KNOBS[name] if v != read_field(policy, op_name, name))
    raise ValueError(f"{name!r} is not a searched field of {op_name}; searched fields: {list(searched_fields(op))}")


def single_moves(policy: RoundingPolicy, fields: Optional[Sequence[str]] = None, op=None) -> List[Tuple[str, Any]]:
    """Every single-field change of ``policy`` as ``(field, new value)``, in field order (default: every searched
    field of ``op``)."""
    fields = searched_fields(op) if fields is None else fields
    return [(name, value) for name in fields for value in field_alternatives(policy, name, op)]


def neighbours(policy: RoundingPolicy, fields: Optional[Sequence[str]] = None, op=None) -> List[RoundingPolicy]:
    """Policies one searched field away from ``policy``."""
    op_name = _operator.get(op).name
    return [write_fields(policy, op_name, **{name: value}) for name, value in single_moves(policy, fields, op)]


@single_threaded
def identifiable_fields(inputs: CasesLike, policy: PolicyLike, fields: Optional[Sequence[str]] = None,
                        op=None) -> Dict[str, bool]:
    """Which fields of ``policy`` can be told apart from the reference outputs on these inputs.

    A field is identifiable when some other value of it, all other fields held, changes at least one output bit on
    at least one case. A field that is not identifiable (e.g. ``diag_mode`` with ``diag_accum`` off, ``phi_weight``
    without reduced DOUT and Z) cannot be recovered by any inference from outputs.

    Returns:
        dict: field -> bool, in ``fields`` order.
    """
    op = _operator.get(op)
    fields = searched_fields(op) if fields is None else fields
    cases = as_case_list(inputs, op)
    policy = _presets.resolve(policy)
    base = PolicyEvaluator(cases, [run_reference(c, policy, op=op) for c in cases], op=op)
    return {name: any(base.distance(write_fields(policy, op.name, **{name: v})) > 0
                      for v in field_alternatives(policy, name, op))
            for name in fields}


# ---------------------------------------------------------------------------------------------- result
@dataclass(frozen=True)
class Candidate:
    """One evaluated policy.

    Attributes:
        policy (RoundingPolicy): the policy.
        distance (float): its distance to the target.
        per_output (dict): output -> share of the distance.
        change (dict): fields that differ from the best policy, ``{field: value here}``.
    """

    policy: RoundingPolicy
    distance: float
    per_output: Dict[str, float]
    change: Dict[str, Any]

    def label(self) -> str:
        """``"best"`` or the changed fields as ``field=value`` (presets by name)."""
        if not self.change:
            return "best"
        return ", ".join(f"{k}={v}" for k, v in self.change.items())

    def to_dict(self) -> Dict[str, Any]:
        return {"policy": self.policy.to_dict(), "name": self.policy.name, "distance": self.distance,
                "per_output": dict(self.per_output), "change": dict(self.change)}


@dataclass(frozen=True)
class TraceStep:
    """One accepted move of the search.

    ``kind`` is ``start``, ``knobs``, ``single``, ``pair``, ``candidate``, ``restart`` (a new search begins; ``change``
    is relative to the best policy so far), ``escape3``/``escape4`` (a last-resort escape by three or four
    single-field changes) or
    ``tie`` (a field of a winning restart's or escape's result set back to its ``start`` value, the distance
    unchanged).
    """

    step: int
    kind: str
    change: Dict[str, Any]
    distance: float
    evaluations: int

    def to_dict(self) -> Dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "change": dict(self.change), "distance": self.distance,
                "evaluations": self.evaluations}


@dataclass
class InferenceResult:
    """Outcome of :func:`infer_policy`.

    Attributes:
        best (RoundingPolicy): the recovered policy.
        distance (float): its distance to the target (0: every provided output reproduced bit for bit).
        evaluation (Evaluation): the distance's parts for ``best``.
        start (RoundingPolicy): the normalised start policy; ``start_distance`` its distance.
        alternatives (list of Candidate): the best evaluated policies, ranked (``best`` first).
        neighbours (list of Candidate): every single-field change of ``best``, ranked by distance.
        ties (tuple of str): fields whose change leaves the distance at ``distance``: not identifiable here.
        trace (list of TraceStep): accepted moves, in order.
        evaluations (int): distinct policies evaluated (on at least one case).
        distances (dict): policy -> distance, for the policies evaluated on every case.
        lp_dtype (str), n_cases (int): the data's lp dtype and number of cases.
        operator (str): the operator whose policy was inferred.
    """

    best: RoundingPolicy
    distance: float
    evaluation: Evaluation
    start: RoundingPolicy
    start_distance: float
    alternatives: List[Candidate]
    neighbours: List[Candidate]
    ties: Tuple[str, ...]
    trace: List[TraceStep]
    evaluations: int
    lp_dtype: str
    n_cases: int
    distances: Dict[RoundingPolicy, float] = field(default_factory=dict, repr=False)
    operator: str = registry.DEFAULT_OPERATOR

    def weakly_determined(self, rtol: float = 0.01) -> Tuple[str, ...]:
        """Fields whose change raises the distance by less than ``rtol`` relative (ties included): the data barely
        tell their values apart (e.g. ``silu_form`` on the H200 data, where neither form is the device's fast-math
        tanh)."""
        limit = self.distance * (1.0 + rtol)
        return tuple(dict.fromkeys(name for c in self.neighbours if c.distance <= limit for name in c.change))

    def undetermined(self, rtol: float = 0.01) -> Tuple[str, ...]:
        """Fields these data do not pin down: the ties, then the other weakly determined fields
        (:meth:`weakly_determined`). Where any, ``best`` is the best fit, not a recovered policy."""
        return tuple(dict.fromkeys(tuple(self.ties) + self.weakly_determined(rtol)))

    def headline(self, rtol: float = 0.01) -> str:
        """One line: ``"Recovered policy: <best>"`` where every field is determined, else ``"Best fit: <best>
        (not determined by these data: <fields>)"``: a tie or a change within ``rtol`` is no recovery."""
        name = describe_policy(self.best, self.operator)
        loose = self.undetermined(rtol)
        if not loose:
            return f"Recovered policy: {name}"
        return f"Best fit: {name} (not determined by these data: {', '.join(loose)})"

    def distance_of(self, policy: PolicyLike) -> Optional[float]:
        """The distance of an evaluated policy (None when the search never evaluated it)."""
        return self.distances.get(_presets.resolve(policy))

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON types."""
        return {
            "operator": self.operator, "best": self.best.to_dict(),
            "best_name": describe_policy(self.best, self.operator), "distance": self.distance,
            "evaluation": self.evaluation.to_dict(), "start": self.start.to_dict(),
            "start_name": describe_policy(self.start, self.operator),
            "start_distance": self.start_distance, "ties": list(self.ties),
            "weakly_determined": list(self.weakly_determined()),
            "alternatives": [c.to_dict() for c in self.alternatives],
            "neighbours": [c.to_dict() for c in self.neighbours],
            "trace": [s.to_dict() for s in self.trace], "evaluations": self.evaluations,
            "lp_dtype": self.lp_dtype, "n_cases": self.n_cases,
        }

    def to_markdown(self, neighbours: int = 10) -> str:
        """A short Markdown summary: best policy, distance, start, the changes from start and nearest neighbours."""
        changes = self.start.diff(self.best, operator=self.operator).items()
        loose = self.undetermined()
        what = ("**Best-fitting policy, not a unique recovery**" if loose else "**Recovered policy**")
        lines = [f"{what} ({self.operator}): `{describe_policy(self.best, self.operator)}`, distance "
                 f"{self.distance:.4g} over {self.n_cases} case(s) ({self.evaluations} policies evaluated)"
                 + (f"; these data do not determine " + ", ".join(f"`{f}`" for f in loose)
                    + " (tied or within 1 %, below)" if loose else ""), "",
                 f"Start `{describe_policy(self.start, self.operator)}`: distance {self.start_distance:.4g}; changes "
                 "from start: " + (", ".join(f"`{k}`: {a} → {b}" for k, (a, b) in changes) or "none"),
                 ""]
        if self.ties:
            lines += [f"Not identifiable from these data (changing them leaves the distance unchanged): "
                      + ", ".join(f"`{t}`" for t in self.ties), ""]
        weak = [f for f in self.weakly_determined() if f not in self.ties]
        if weak:
            lines += [f"Weakly determined (changing them raises the distance by less than 1 %): "
                      + ", ".join(f"`{t}`" for t in weak), ""]
        lines += ["| neighbour of best | distance | ratio to best |", "|---|---|---|"]
        for cand in self.neighbours[:neighbours]:
            ratio = cand.distance / self.distance if self.distance > 0 else math.inf
            lines.append(f"| {cand.label()} | {cand.distance:.4g} | {ratio:.3g} |")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- search
class _Search:
    def __init__(self, evaluator: PolicyEvaluator, fields: Sequence[str], knobs: Sequence[str]):
        self.ev = evaluator
        self.op = evaluator.op.name
        self.fields = tuple(fields)
        self.knobs = tuple(knobs)
        self.trace: List[TraceStep] = []

    def d(self, policy):
        return self.ev.distance(policy)

    def accept(self, kind, current, new):
        change = {k: b for k, (a, b) in current.diff(new, operator=self.op).items()}
        self.trace.append(TraceStep(len(self.trace), kind, change, self.d(new), self.ev.touched))
        return new

    def best_of(self, current, options):
        """The first option with the lowest distance, if it is strictly below the current one."""
        best, best_d = current, self.d(current)
        for option in options:
            dist = self.ev.distance_below(option, best_d)
            if dist is not None and dist < best_d:
                best, best_d = option, dist
        return best

    def knob_sweep(self, current):
        combos = itertools.product(*(KNOBS[k] for k in self.knobs))
        options = [write_fields(current, self.op, **dict(zip(self.knobs, combo))) for combo in combos]
        return self.best_of(current, options)

    def descend(self, current):
        while True:
            new = self.best_of(current, neighbours(current, self.fields, self.op))
            if new == current:
                return current
            current = self.accept("single", current, new)
            if self.d(current) == 0:
                return current

    def pair_step(self, current, limit):
        moves = single_moves(current, self.fields, self.op)
        if limit is not None:  # the single moves that cost least on their own make the most promising pairs
            order = sorted(range(len(moves)),
                           key=lambda i: (self.d(write_fields(current, self.op, **dict([moves[i]]))), i))
            moves = [moves[i] for i in sorted(order[:limit])]
        options = [write_fields(current, self.op, **{f1: v1, f2: v2})
                   for (f1, v1), (f2, v2) in itertools.combinations(moves, 2) if f1 != f2]
        return self.best_of(current, options)

    def run(self, current, pair_moves: bool, max_rounds: int, pair_limit: Optional[int] = None):
        """One search from ``current`` (knob sweep, descent, pair escape, in rounds); returns where it stops."""
        for _ in range(max_rounds):
            start_of_round = current
            if self.knobs:
                new = self.knob_sweep(current)
                if new != current:
                    current = self.accept("knobs", current, new)
            if self.d(current) > 0:
                current = self.descend(current)
            if self.d(current) > 0 and pair_moves:
                new = self.pair_step(current, pair_limit)
                if new != current:
                    current = self.accept("pair", current, new)
            if current == start_of_round or self.d(current) == 0:
                break
        return current

    def escape_step(self, current, size, limit):
        """The best of the ``size``-tuples of single moves (distinct fields) among the ``limit`` that cost least on
        their own, if it is strictly below the current distance (else ``current``)."""
        moves = single_moves(current, self.fields, self.op)
        order = sorted(range(len(moves)), key=lambda i: (self.d(write_fields(current, self.op, **dict([moves[i]]))),
                                                         i))
        moves = [moves[i] for i in sorted(order[:limit])]
        options = [write_fields(current, self.op, **dict(combo)) for combo in itertools.combinations(moves, size)
                   if len({name for name, _ in combo}) == size]
        return self.best_of(current, options)

    def run_with_restarts(self, start, restarts: Sequence[RoundingPolicy], pair_moves: bool, max_rounds: int,
                          pair_limit: Optional[int] = None, escapes: Sequence[Tuple[int, int]] = ()):
        """Search from ``start``; while the best is above distance 0, search again from each of ``restarts`` (in
        order, skipping starts already used) and keep the lowest distance (the earlier result on a tie); then, while
        still above 0, escape by the first of ``escapes`` that helps and search on from there. When a
        restart or an escape wins, its fields are set back to their ``start`` values where that does not raise the
        distance (:meth:`prefer`); otherwise the result is exactly that of the search from ``start``."""
        self.accept("start", start, start)
        best = self.run(start, pair_moves, max_rounds, pair_limit)
        moved = False
        used = [start]
        for policy in restarts:
            if self.d(best) == 0:
                break
            if policy in used:
                continue
            used.append(policy)
            self.accept("restart", best, policy)
            found = self.run(policy, pair_moves, max_rounds, pair_limit)
            if self.d(found) < self.d(best):
                best, moved = found, True
        while self.d(best) > 0:
            for size, limit in escapes:
                escape = self.escape_step(best, size, limit)
                if escape != best:
                    best = self.run(self.accept(f"escape{size}", best, escape), pair_moves, max_rounds, pair_limit)
                    moved = True
                    break
            else:
                break
        return self.prefer(best, start) if moved else best

    def prefer(self, best, start):
        """``best`` with each field that differs from ``start`` set to its ``start`` value when the distance does not
        grow (in field order, repeated until nothing changes): ties keep their start values."""
        changed = True
        while changed:
            changed = False
            for name in self.fields:
                if read_field(best, self.op, name) == read_field(start, self.op, name):
                    continue
                option = write_fields(best, self.op, **{name: read_field(start, self.op, name)})
                if self.d(option) <= self.d(best):
                    best = self.accept("tie", best, option)
                    changed = True
        return best


def _candidate(evaluator: PolicyEvaluator, policy: RoundingPolicy, best: RoundingPolicy) -> Candidate:
    ev = evaluator.evaluate(policy)
    return Candidate(policy, ev.distance, dict(ev.per_output),
                     {k: a for k, (a, b) in policy.diff(best, operator=evaluator.op.name).items()})


@single_threaded
def infer_policy(inputs: CasesLike, outputs, start: PolicyLike = "seed_bf16",
                 candidates: Optional[Iterable[PolicyLike]] = None, *, fields: Optional[Sequence[str]] = None,
                 pair_moves: bool = True, pair_limit: Optional[int] = None, max_rounds: int = 20,
                 restarts: Optional[Iterable[PolicyLike]] = RESTARTS,
                 escapes: Optional[Sequence[Tuple[int, int]]] = ESCAPES, top: int = 10, op=None) -> InferenceResult:
    """The policy whose reference outputs are closest to ``outputs`` (module docstring: distance and search).

    Args:
        inputs (dict | sequence of dict): one case (the operator's tensors by name plus its scalars) or several.
        outputs (dict | sequence of dict): the target outputs of each case, by output name; missing or None
            outputs are skipped. The operator's outputs NamedTuple works too.
        start (str | RoundingPolicy): where the search starts; normalised to the inputs' lp dtype, float32 math and
            rounded outputs. It must define the operator (``seed_bf16`` defines stage 1 only).
        candidates (iterable, optional): when given, no search: these policies (names or objects) are ranked and
            the best one returned (its single-field neighbours are evaluated too, for :attr:`neighbours`).
        fields (sequence of str): the searched fields (default: every switch of the operator and
            ``SEARCHED_KNOBS``, :func:`searched_fields`); the knobs of ``ON_REQUEST_KNOBS`` the operator has
            (``gemm_model``, ``special_functions``, ``fp32_fma``; ``reduction_order``: stage 1) are searched when
            named here.
        pair_moves (bool): try pairs of single-field changes when descent stalls above distance 0.
        pair_limit (int, optional): pair only the ``pair_limit`` single-field changes with the lowest distance on
            their own (45 pairs for 10; None, the default: all of them, about 230 pairs).
        max_rounds (int): upper bound on search rounds (per search).
        restarts (iterable, optional): starts (names or policies, normalised like ``start``) searched in order when
            the search from ``start`` stops above distance 0; the lowest distance wins (module docstring,
            "Restarts"). Default :data:`RESTARTS`; ``None`` or ``()``: a single search from ``start``.
        escapes (sequence of (k, n), optional): after the restarts, while the best is above distance 0, try every
            k-tuple of single-field changes among the n cheapest on their own, for each (k, n) in order until one
            improves, and search on from there (module docstring, "Escapes"). Default :data:`ESCAPES`; ``None`` or
            ``()``: off.
        top (int): how many ranked alternatives to keep.
        op: the operator (default: the registry's default).

    Returns:
        InferenceResult
    """
    op = _operator.get(op)
    cases = as_case_list(inputs, op)
    lp = lp_dtype_of(cases, op)
    evaluator = PolicyEvaluator(cases, outputs, lp, op=op)
    searchable = searched_fields(op) + tuple(k for k in ON_REQUEST_KNOBS if k in op.knobs)
    fields = searched_fields(op) if fields is None else tuple(fields)
    for name in fields:
        if name not in searchable:
            raise ValueError(f"{name!r} is not a searchable field of {op.name}; searchable: {list(searchable)}")
    escapes = tuple(escapes or ())
    for entry in escapes:
        ok = (isinstance(entry, (tuple, list)) and len(entry) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in entry) and 2 <= entry[0] <= entry[1])
        if not ok:
            raise ValueError(f"escapes must hold (k, n) pairs of ints with 2 <= k <= n (k-tuples of changes among the "
                             f"n cheapest), got {entry!r}")
    start_policy = _defining(normalise_policy(start, lp), op, "start")
    knobs = tuple(k for k in SEARCHED_KNOBS + ON_REQUEST_KNOBS if k in fields)
    search = _Search(evaluator, fields, knobs)
    if candidates is None:
        restart_policies = [normalise_policy(p, lp) for p in (restarts or ())
                            if _presets.resolve(p).defines(op.name)]
        best = search.run_with_restarts(start_policy, restart_policies, pair_moves, max_rounds, pair_limit,
                                        escapes)
    else:
        pool = [_presets.resolve(c) for c in candidates]
        if not pool:
            raise ValueError("candidates is empty")
        search.accept("start", start_policy, start_policy)
        best = min(pool, key=lambda p: (search.d(p), pool.index(p)))
        search.accept("candidate", start_policy, best)
    best_eval = evaluator.evaluate(best)
    neigh = sorted((_candidate(evaluator, p, best) for p in neighbours(best, fields, op)),
                   key=lambda c: (c.distance, c.label()))
    ties = tuple(dict.fromkeys(name for c in neigh if c.distance == best_eval.distance for name in c.change))
    ranked = sorted(evaluator.evaluated, key=lambda p: (evaluator.distance(p), p != best))
    alternatives = [_candidate(evaluator, p, best) for p in ranked[:top]]
    return InferenceResult(
        best=best, distance=best_eval.distance, evaluation=best_eval, start=start_policy,
        start_distance=evaluator.distance(start_policy), alternatives=alternatives, neighbours=neigh, ties=ties,
        trace=search.trace, evaluations=evaluator.touched, lp_dtype=lp, n_cases=len(cases),
        distances={p: e.distance for p, e in evaluator.evaluated.items()}, operator=op.name)


def _defining(policy: RoundingPolicy, op, what: str) -> RoundingPolicy:
    if not policy.defines(op.name):
        defined = [n for n in _presets.names() if _presets.get(n).defines(op.name)]
        raise ValueError(f"{what} policy {policy.label()!r} defines no rounding for {op.name}; start from a "
                         f"preset that does: {defined}")
    return policy


def compare_to_truth(inputs: CasesLike, truth: PolicyLike, result: InferenceResult, op=None) -> Dict[str, Any]:
    """How an inference result relates to the policy that really made the outputs (synthetic checks).

    Returns:
        dict: ``distance`` (the result's), ``wrong`` (identifiable fields where the result differs from ``truth``;
        empty for an exact attribution), ``unidentifiable`` (fields no inference can recover from these outputs,
        see :func:`identifiable_fields`) and ``exact`` (distance 0 and nothing wrong).
    """
    op_name = _operator.get(op if op is not None else result.operator).name
    truth = _presets.resolve(truth)
    identifiable = identifiable_fields(inputs, truth, op=op_name)
    wrong = [f for f, ok in identifiable.items()
             if ok and read_field(result.best, op_name, f) != read_field(truth, op_name, f)]
    return {"distance": result.distance, "wrong": wrong,
            "unidentifiable": [f for f, ok in identifiable.items() if not ok],
            "exact": result.distance == 0.0 and not wrong}


def random_policy(generator: torch.Generator, lp_dtype: str = "bfloat16", op=None) -> RoundingPolicy:
    """A random policy over the searched fields of ``op`` (each switch on with probability 1/2, knobs uniform).

    Used by the synthetic inference tests; float32 math and rounded outputs as the search assumes.
    """
    op_name = _operator.get(op).name
    switches = tuple(registry.site_table(op_name))
    bits = torch.randint(0, 2, (len(switches),), generator=generator).tolist()
    values: Dict[str, Any] = {name: bool(b) for name, b in zip(switches, bits)}
    for knob in SEARCHED_KNOBS:
        choices = KNOBS[knob]
        values[knob] = choices[int(torch.randint(0, len(choices), (1,), generator=generator))]
    return write_fields(RoundingPolicy(lp_dtype=lp_dtype, math_dtype="float32", round_outputs=True), op_name,
                        **values)
