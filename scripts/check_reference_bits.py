#!/usr/bin/env python
"""Prove a change to the policy references bit-identical: save sha256 digests of their outputs, then compare
(not a test).

One run covers every *target*:

* every registered operator (``mimo_numerics.ops.registry.OPERATORS``: the forward ``mamba_mimo_fwd``, stage 1
  ``mamba_mimo_bwd_fwd``, stage 2 ``mamba_mimo_bwd_bwd``) through its policy reference
  (``mn.operator.get(name).run_reference(inputs, policy, record=)``), on every case of its ``smoke`` and ``gate``
  grids (and of any other grid it has but ``sweep``, e.g. the forward's ``whole_op``), six stress cases (gate
  cases scaled to lp overflow and subnormals, or with a NaN and infinities), a few ``sweep`` cases and, for stage 1,
  the benchmark's headline shape; outputs and (small cases) every ``record=`` stage tensor;
* the FP32 epilogue ``mamba3_mimo_epilogue`` (the chain after stage 2; not a registered operator: it has no policy
  section, its reference takes ``fma`` and ``bias_sums_in_lp`` flags, which the whole op derives from the policy's
  ``helper_fma`` and ``round_outputs``), under the four flag combinations, in bf16 and fp16, on the inputs the whole
  op hands it under ``upstream_sm90`` / ``upstream_sm90_fp16`` (read from the whole op's ``record=``);
* the whole op ``mn.mamba3_mimo``, forward and backward: ``Out``, the 14 leaves' ``.grad`` and (small cases) the
  chain's ``record=`` (preprocessing, every operator's stages and outputs, the epilogue's outputs), on a few
  ``OpCaseSpec`` cases (bf16 and fp16 through the policies, reduced and not, with and without Z and D, one S = 256).

Policies: every preset, then custom policies for knob and site combinations no preset has (float64 math with the
switches on, ``round_outputs=False`` in float32, fp16 with float64 math, a forward site off, a stage-2 site off, a
stage-1 site off, ``diag_mode="mul_then_add"`` and ``helper_fma="separate"`` on ``upstream_sm90``). A policy a target
does not define (``seed_bf16`` outside stage 1 raises ``PolicyUndefined``; the whole op raises
``NotImplementedError`` for float64 math with sites on and for float32 with ``round_outputs=False``) is skipped:
the run stores the exception's type and message instead of tensors, prints a summary of the skips, and ``compare``
checks that the same exception type is raised again. Each case is drawn in the lp dtype of the policy it runs under.

Files: one JSON file of sha256 digests keyed by target, case and policy (outputs, ``record.<stage>``,
``grad.<name>``, and the digests of the inputs each case drew, ``input.<name>``), and the tensors themselves next to
it (``<baseline>.values/<target>/``) so that ``compare`` can count the differing elements.

``compare`` runs the current code on the same cases and policies and reports every mismatch as
``target  case  policy  entry: N of M elements differ`` (a missing or extra stage name, a changed input, an
exception raised or no longer raised are reported too), then the tensors compared per target. ``--rest`` runs the
cases ``--quick`` leaves out, so a full compare can be split into two processes. ``diff`` compares two baseline
files without running anything (two saves of one commit must agree). ``vs-generic`` needs
no baseline: it runs each case with stage 1's CPU fast path (``CPU_FAST_PATH`` of stage 1's reference module) and
with the generic whole-tensor path and compares them the same way (and the outputs' strides); by default only stage
1, ``--op`` picks others (stage 2's inputs and the whole op's chain run stage 1 too). Exit status 0 when everything
matches, 1 otherwise.

Digests are of the raw bytes (dtype, shape and values; NaN payloads included), so this is a same-machine check:
FP32 GEMMs go through BLAS, whose bits may depend on the CPU and thread count. Run both modes on the same machine
with the same thread settings. The baseline belongs outside the repository or under the git-ignored ``out/``.
The script uses only public and package APIs that exist since commit 00caf5e, so it can be copied into a worktree of
an old commit to save the baseline there.

    python scripts/check_reference_bits.py save --baseline out/reference_bits.json       # with the old code
    python scripts/check_reference_bits.py compare --baseline out/reference_bits.json    # with the new code
    python scripts/check_reference_bits.py compare --quick --baseline out/reference_bits_quick.json  # minutes
    python scripts/check_reference_bits.py compare --op mamba_mimo_bwd_bwd --op mamba3_mimo   # some targets only
    python scripts/check_reference_bits.py vs-generic --quick
    python scripts/check_reference_bits.py compare --rest --baseline out/reference_bits.json  # the non-quick cases
    python scripts/check_reference_bits.py diff --baseline out/reference_bits.json --other out/reference_bits_quick.json

Across a change of an input generator (issue 15 made it machine-independent), give both runs the same inputs:
``save --inputs-dir DIR`` with the new code writes them, the old commit's reference (this script copied into a
worktree of it) reads them, and ``compare --inputs-dir DIR`` checks the new code on them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

import mimo_numerics as mn
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = ROOT / "out" / "reference_bits.json"
FORMAT = 2
#: ``--inputs-dir``: where each case's inputs are read from (when stored there) or written to (when not).
INPUTS_DIR: Optional[Path] = None
#: Indices into the ``sweep`` grid run by default, per operator (the cheaper ones; each branch kind and fp16 are
#: covered). Stage 1 has the CPU fast path; the forward's and stage 2's references are slower on long sequences.
DEFAULT_SWEEP = {"mamba_mimo_fwd": (0, 3), "mamba_mimo_bwd_fwd": (0, 3, 4), "mamba_mimo_bwd_bwd": (0, 3)}
try:  # the benchmarks' headline shape of stage 1, where the package defines it
    from mimo_numerics.benchmark_cases import HEADLINE_FIELDS
except ImportError:  # older commits (00caf5e): the same fields (B=1, S=8192, H=16, N=P=64, R=4, C=16, roZD, realistic)
    HEADLINE_FIELDS = dict(batch=1, seqlen=8192, heads=16, groups=1, state_dim=64, value_dim=64, rank=4,
                           chunk_size=16, reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=0)
#: The operators the headline case runs on: stage 1 only (its CPU path makes it affordable).
HEADLINE_OPERATORS = ("mamba_mimo_bwd_fwd",)
#: The policies the large cases run under (sweep cases, the whole op's S = 256 case): every preset less
#: ``upstream_sm80_fp16`` (equal to ``upstream_sm90_fp16`` at the policy level); the small cases run every policy.
LARGE_POLICIES = ("fp64", "fp32", "seed_bf16", "upstream_sm80", "upstream_sm90", "upstream_sm90_fp16")
#: The policies of the headline case (one run is about half a minute of CPU time).
HEADLINE_POLICIES = ("fp32", "upstream_sm90")
EPILOGUE = "mamba3_mimo_epilogue"
WHOLE_OP = "mamba3_mimo"
#: Whole-op cases: (label, spec, keep a stage record, in --quick). The lp dtype comes from the policy.
WHOLE_OP_CASES = (
    ("roZD", OpCaseSpec(seqlen=32, state_dim=32, value_dim=16, rank=2, chunk_size=8), True, True),
    ("fo--_G2", OpCaseSpec(seqlen=32, heads=2, groups=2, state_dim=16, value_dim=16, rank=2, chunk_size=8,
                           reduce_o=False, has_z=False, has_d=False, seed=1), True, True),
    ("roZ-_seed_rd2_adtpos", OpCaseSpec(seqlen=16, heads=2, state_dim=16, value_dim=16, rank=1, chunk_size=4,
                                        has_d=False, formula="whole_op_seed", rotary_dim_divisor=2,
                                        positive_adt=True, seed=2), True, True),
    ("foZD", OpCaseSpec(seqlen=64, reduce_o=False, seed=3), True, False),
    ("ro-D", OpCaseSpec(seqlen=48, has_z=False, seed=4), True, False),
    ("roZD_S256", OpCaseSpec(seqlen=256, seed=5), False, False),
)
#: Epilogue flag combinations (``fma``, ``bias_sums_in_lp``) and the policy whose whole-op chain gives its inputs.
EPILOGUE_FLAGS = ((True, True), (False, True), (True, False), (False, False))
EPILOGUE_INPUT_POLICY = {"bfloat16": "upstream_sm90", "float16": "upstream_sm90_fp16"}
#: Stage-2 outputs, stage-1 outputs and preprocessing the epilogue reads from the whole op's record.
_EPILOGUE_FROM_RECORD = (
    [("mamba_mimo_bwd_bwd.outputs", n) for n in ("dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor",
                                                  "dgamma_diag", "ddA", "dSSdA", "ddA_cs_rev", "ddA_cs")]
    + [("mamba_mimo_bwd_fwd.outputs", n) for n in ("dmimo_o", "dz", "dmimo_z")]
    + [("mamba3_mimo_preprocess", n) for n in ("da_cs", "da_cs_rev", "segsum")])
#: Exceptions that mean "this target does not define this policy": skipped, not an error.
SKIP_ERRORS = ("PolicyUndefined", "NotImplementedError")


# ---------------------------------------------------------------------------------------------------- policies
def _policies() -> Dict[str, Any]:
    """Every preset, then custom policies for knob and site combinations that no preset has."""
    out = {name: mn.presets.get(name) for name in mn.presets.names()}
    sm90, sm80 = mn.presets.get("upstream_sm90"), mn.presets.get("upstream_sm80")
    out["custom:sm90_f64"] = sm90.replace(math_dtype="float64")
    out["custom:sm80_f64"] = sm80.replace(math_dtype="float64")
    out["custom:sm90_fp16_f64"] = mn.presets.get("upstream_sm90_fp16").replace(math_dtype="float64")
    out["custom:sm90_unrounded_outputs"] = sm90.replace(round_outputs=False)
    out["custom:seed_bf16_f64_unrounded"] = mn.presets.get("seed_bf16").replace(math_dtype="float64",
                                                                                 round_outputs=False)
    out["custom:sm90_fwd_psiv_off"] = sm90.replace(**{"mamba_mimo_fwd.psiv": False})
    out["custom:sm90_bwd_fwd_diag_accum_off"] = sm90.replace(**{"mamba_mimo_bwd_fwd.diag_accum": False})
    out["custom:sm90_bwd_bwd_dphio_gate_off"] = sm90.replace(**{"mamba_mimo_bwd_bwd.dphio_gate": False})
    out["custom:sm90_mul_then_add"] = sm90.replace(diag_mode="mul_then_add")
    out["custom:sm90_helper_fma_separate"] = sm90.replace(helper_fma="separate")
    out["custom:sm90_sigmoid_separate_update"] = sm90.replace(silu_form="sigmoid", state_update="separate")
    return out


def _epilogue_policies() -> Dict[str, Tuple[str, bool, bool]]:
    """Epilogue "policies": name -> (lp dtype of its inputs, fma, bias_sums_in_lp)."""
    out = {}
    for lp in EPILOGUE_INPUT_POLICY:
        for fma, bias_lp in EPILOGUE_FLAGS:
            out[f"{lp}:fma={int(fma)}:bias_sums_in_lp={int(bias_lp)}"] = (lp, fma, bias_lp)
    return out


# ---------------------------------------------------------------------------------------------------- tensors
def digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _layout(t: torch.Tensor) -> tuple:
    """Strides of the dims of size > 1 (the strides of size-1 dims carry no layout)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n > 1)


def count_differences(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape {a.dtype}{tuple(a.shape)} -> {b.dtype}{tuple(b.shape)}"
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differ = int((a.contiguous().view(ints) != b.contiguous().view(ints)).sum())
    return f"{differ} of {a.numel()} elements differ"


def _input_digests(inputs: dict) -> Dict[str, Optional[str]]:
    return {k: (digest(v) if isinstance(v, torch.Tensor) else (None if v is None else repr(v)))
            for k, v in inputs.items()}


def _stress(inputs: dict, kind: str) -> dict:
    """A kernel's inputs (stage-1 names: ``q, k, v, q_bias, k_bias, mimo_v, dt``) pushed to the top
    (``"overflow"``) or bottom (``"subnormal"``) of the lp range, or with a NaN and two infinities (``"nan_inf"``)."""
    inputs = dict(inputs)
    lp = inputs["v"].dtype
    f16 = lp == torch.float16
    if kind == "overflow":  # v·Ψ and what follows it reach the top of the lp range and overflow in places
        inputs["v"] = (inputs["v"].float() * (2.0 ** 13 if f16 else 2.0 ** 125)).to(lp)
        inputs["mimo_v"] = inputs["mimo_v"] * 3.0
    elif kind == "subnormal":  # k + b_k, k̂, the scores and the states in the lp subnormal range
        tiny = 2.0 ** -20 if f16 else 2.0 ** -128
        inputs["k"] = (inputs["k"].float() * tiny).to(lp)
        inputs["k_bias"] = inputs["k_bias"] * tiny
        inputs["q"] = (inputs["q"].float() * 2.0 ** 4).to(lp)
        inputs["q_bias"] = inputs["q_bias"] * 2.0 ** 4
    elif kind == "nan_inf":
        inputs["v"] = inputs["v"].clone()
        inputs["v"].view(-1)[5] = float("nan")
        inputs["q"] = inputs["q"].clone()
        inputs["q"].view(-1)[-3] = float("inf")
        inputs["dt"] = inputs["dt"].clone()
        inputs["dt"].view(-1)[2] = float("-inf")
    else:
        raise ValueError(f"unknown stress kind {kind!r}")
    return inputs


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# ---------------------------------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Case:
    """One case of a target: ``spec`` (a case spec of the target), a stress kind, whether to keep ``record=``."""

    label: str
    spec: Any
    stress: Optional[str] = None
    record: bool = True
    policies: Optional[Tuple[str, ...]] = None  #: run only these of the target's policies (None: all)


class Target:
    """What one target runs: its cases, its policies, how a case is drawn and how it is run."""

    name: str

    def cases(self, quick: bool, sweep: Optional[Tuple[int, ...]], headline: bool) -> List[Case]:
        raise NotImplementedError

    def policies(self, all_policies: Dict[str, Any]) -> Dict[str, Any]:
        return all_policies

    def lp_of(self, policy) -> str:
        return policy.lp_dtype

    def draw(self, case: Case, lp: str) -> dict:
        raise NotImplementedError

    def run(self, inputs: dict, policy, record: Optional[dict]) -> Dict[str, Optional[torch.Tensor]]:
        raise NotImplementedError

    def inputs(self, case: Case, lp: str) -> dict:
        """The case's inputs in ``lp``, from ``--inputs-dir`` when stored there."""
        stored = INPUTS_DIR / f"{_safe(self.name + '__' + case.label)}__{lp}.pt" if INPUTS_DIR is not None else None
        if stored is not None and stored.exists():
            return torch.load(stored)
        inputs = self.draw(case, lp)
        if stored is not None:
            torch.save(inputs, stored)
        return inputs


class OperatorTarget(Target):
    """A registered operator through ``Operator.run_reference``."""

    def __init__(self, name: str):
        self.name = name
        self.op = mn.operator.get(name)

    def cases(self, quick, sweep, headline):
        grids = self.op.load("grids")()
        out = []
        for grid_name, specs in grids.items():
            if grid_name != "sweep":
                out += [Case(f"{grid_name}:{s.case_id}", s) for s in specs]
        gate = self.op.cases("gate")
        for kind in ("overflow", "subnormal", "nan_inf"):
            for base in (gate[1], gate[7]):  # roZD seed and foZD realistic
                out.append(Case(f"stress-{kind}:{base.case_id}", base, kind))
        if not quick:
            sweep_grid = grids.get("sweep", ())
            chosen = DEFAULT_SWEEP.get(self.name, ()) if sweep is None else sweep
            out += [Case(f"sweep{i}:{sweep_grid[i].case_id}", sweep_grid[i], None, False, LARGE_POLICIES)
                    for i in chosen if i < len(sweep_grid)]
            if headline and self.name in HEADLINE_OPERATORS:
                # the stage-1 case spec class, taken from its grid (no import of the stage-1 cases module)
                spec = type(self.op.cases("smoke")[0])(**HEADLINE_FIELDS)
                out.append(Case(f"headline:{spec.case_id}", spec, None, False, HEADLINE_POLICIES))
        return out

    def draw(self, case, lp):
        inputs = self.op.draw(case.spec.replace(dtype=lp))
        return _stress(inputs, case.stress) if case.stress else inputs

    def run(self, inputs, policy, record):
        outputs = self.op.as_outputs(self.op.run_reference(inputs, policy, record=record))
        return dict(zip(self.op.output_names, outputs))


class WholeOpTarget(Target):
    """``mn.mamba3_mimo`` forward and backward from leaves that require grad."""

    name = WHOLE_OP

    def cases(self, quick, sweep, headline):
        return [Case(f"{label}:{spec.case_id}", spec, None, keep, None if keep else LARGE_POLICIES)
                for label, spec, keep, in_quick in WHOLE_OP_CASES if in_quick or not quick]

    def draw(self, case, lp):
        return make_op_inputs(case.spec.replace(dtype=lp))

    def run(self, inputs, policy, record):
        leaves = {n: (None if inputs[n] is None else inputs[n].detach().clone().requires_grad_(True))
                  for n in OP_INPUT_NAMES}
        out = mn.mamba3_mimo(*leaves.values(), chunk_size=inputs["chunk_size"],
                             rotary_dim_divisor=inputs["rotary_dim_divisor"], policy=policy, record=record)
        out.backward(inputs["dout"].to(out.dtype))
        entries: Dict[str, Optional[torch.Tensor]] = {"Out": out.detach()}
        for n, leaf in leaves.items():
            entries[f"grad.d{n}"] = None if leaf is None else leaf.grad
        return entries


class EpilogueTarget(Target):
    """The FP32 epilogue on the inputs the whole op hands it (module docstring)."""

    name = EPILOGUE

    def cases(self, quick, sweep, headline):
        return [Case(f"{label}:{spec.case_id}", spec, None, True) for label, spec, keep, in_quick in WHOLE_OP_CASES
                if in_quick or not quick]

    def policies(self, all_policies):
        return _epilogue_policies()

    def lp_of(self, policy):
        return policy[0]

    def draw(self, case, lp):
        raw = make_op_inputs(case.spec.replace(dtype=lp))
        leaves = [raw[n] for n in OP_INPUT_NAMES]
        record: dict = {}
        leaves[0] = leaves[0].clone().requires_grad_(True)  # Q: the backward runs the whole chain
        out = mn.mamba3_mimo(*leaves, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"],
                             policy=EPILOGUE_INPUT_POLICY[lp], record=record)
        out.backward(raw["dout"])
        inputs = {name: (None if record.get(f"{prefix}.{name}") is None else record[f"{prefix}.{name}"].clone())
                  for prefix, name in _EPILOGUE_FROM_RECORD}
        inputs.update(trap=raw["Trap"], dt=raw["DT"], angles=raw["Angles"], groups=raw["Q"].shape[3],
                      chunk_size=raw["chunk_size"])
        return inputs

    def run(self, inputs, policy, record):
        from mimo_numerics.ops.mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference

        _, fma, bias_lp = policy
        return dict(mamba3_mimo_epilogue_reference(**inputs, fma=fma, bias_sums_in_lp=bias_lp))


def all_targets() -> Dict[str, Callable[[], Target]]:
    out: Dict[str, Callable[[], Target]] = {name: (lambda n=name: OperatorTarget(n)) for name in registry.OPERATORS}
    # the epilogue keeps its own target even if it is registered one day: its baseline entries stay comparable
    out[EPILOGUE] = EpilogueTarget
    out[WHOLE_OP] = WholeOpTarget
    return out


# ---------------------------------------------------------------------------------------------------- running
@dataclass
class Result:
    """One (case, policy) run: entries (outputs, ``record.*``, ``grad.*``) or the exception it raised."""

    policy: str
    lp: str
    entries: Dict[str, Optional[torch.Tensor]]
    record_names: List[str]
    error: Optional[str] = None

    @property
    def error_type(self) -> Optional[str]:
        return None if self.error is None else self.error.split(":", 1)[0]


def _run(target: Target, case: Case, policies: Dict[str, Any],
         drawn: Dict[str, dict]) -> Iterator[Result]:
    """Yield a :class:`Result` per policy; ``drawn`` is filled with the inputs per lp dtype."""
    for pname, policy in policies.items():
        if case.policies is not None and pname not in case.policies:
            continue
        lp = target.lp_of(policy)
        if lp not in drawn:
            drawn[lp] = target.inputs(case, lp)
        inputs = drawn[lp]
        before = _input_digests(inputs)
        record = {} if case.record else None
        threads = torch.get_num_threads()
        try:
            entries = target.run(inputs, policy, record)
        except Exception as exc:  # noqa: BLE001 - stored and compared by type
            yield Result(pname, lp, {}, [], f"{type(exc).__name__}: {exc}")
            continue
        if torch.get_num_threads() != threads:
            raise RuntimeError(f"{target.name} {case.label} {pname}: the reference changed torch's thread count "
                               f"({threads} -> {torch.get_num_threads()})")
        if _input_digests(inputs) != before:
            changed = [k for k, v in _input_digests(inputs).items() if before.get(k) != v]
            raise RuntimeError(f"{target.name} {case.label} {pname}: the run modified its inputs {changed}")
        for name, value in (record or {}).items():
            entries[f"record.{name}"] = value
        yield Result(pname, lp, entries, list(record) if record is not None else [])


def values_dir(baseline: Path) -> Path:
    return baseline.with_name(baseline.name + ".values")


def _value_file(baseline: Path, target: str, label: str, pname: str) -> Path:
    return values_dir(baseline) / target / f"{_safe(label + '__' + pname)}.pt"


def _report_skips(skips: Dict[Tuple[str, str], Tuple[str, int]], errors: List[str]) -> None:
    for (target, pname), (message, count) in sorted(skips.items()):
        print(f"skipped {target} {pname} ({count} cases): {message[:160]}")
    for line in errors:
        print("ERROR", line)


def _note(result: Result, target: str, label: str, skips: dict, errors: List[str]) -> None:
    if result.error is None:
        return
    if result.error_type in SKIP_ERRORS:
        message, count = skips.get((target, result.policy), (result.error, 0))
        skips[(target, result.policy)] = (message, count + 1)
    else:
        errors.append(f"{target}  {label}  {result.policy}  {result.error[:300]}")


def save(args, plan) -> int:
    baseline = Path(args.baseline)
    baseline.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick, "operators": {}}
    skips: dict = {}
    errors: List[str] = []
    total_start = time.perf_counter()
    for target, cases, policies in plan:
        target_start, stored = time.perf_counter(), 0
        per_target = data["operators"][target.name] = {"cases": {}}
        for case in cases:
            start = time.perf_counter()
            drawn: Dict[str, dict] = {}
            per_case = per_target["cases"][case.label] = {"policies": {}}
            for result in _run(target, case, policies, drawn):
                _note(result, target.name, case.label, skips, errors)
                per_case["policies"][result.policy] = {
                    "lp": result.lp, "error": result.error, "record_names": result.record_names,
                    "digests": {k: (None if v is None else digest(v)) for k, v in result.entries.items()}}
                stored += len(result.entries)
                if not args.no_values and result.entries:
                    path = _value_file(baseline, target.name, case.label, result.policy)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    torch.save({k: v.contiguous().clone() for k, v in result.entries.items() if v is not None}, path)
            per_case["inputs"] = {lp: _input_digests(inputs) for lp, inputs in drawn.items()}
            print(f"saved {target.name} {case.label} ({time.perf_counter() - start:.1f} s)", flush=True)
        per_target["tensors"] = stored
        per_target["seconds"] = round(time.perf_counter() - target_start, 1)
        print(f"== {target.name}: {len(cases)} cases x {len(policies)} policies, {stored} tensors "
              f"({per_target['seconds']} s)", flush=True)
    data["seconds"] = round(time.perf_counter() - total_start, 1)
    baseline.write_text(json.dumps(data, indent=1))
    _report_skips(skips, errors)
    print(f"wrote {baseline} ({data['seconds']} s)")
    return 1 if errors else 0


def compare(args, plan) -> int:
    baseline = Path(args.baseline)
    data = json.loads(baseline.read_text())
    if data.get("format") != FORMAT:
        raise SystemExit(f"{baseline}: format {data.get('format')!r}, this script reads format {FORMAT} (save the "
                         "baseline again with this script)")
    if data.get("threads") != torch.get_num_threads():
        print(f"warning: baseline saved with {data.get('threads')} threads, now {torch.get_num_threads()}")
    mismatches: List[str] = []
    counts: Dict[str, List[int]] = {}
    skips: dict = {}
    errors: List[str] = []
    not_in_baseline = 0
    total_start = time.perf_counter()
    for target, cases, policies in plan:
        saved_target = data["operators"].get(target.name)
        count = counts[target.name] = [0, 0, 0]  # tensors, inputs compared, mismatches
        if saved_target is None:
            print(f"skip {target.name}: not in the baseline")
            not_in_baseline += len(cases)
            continue
        target_start = time.perf_counter()
        for case in cases:
            start = time.perf_counter()
            saved_case = saved_target["cases"].get(case.label)
            if saved_case is None:
                print(f"skip {target.name} {case.label}: not in the baseline")
                not_in_baseline += 1
                continue
            drawn: Dict[str, dict] = {}
            here: List[str] = []
            for result in _run(target, case, policies, drawn):
                _note(result, target.name, case.label, skips, errors)
                saved = saved_case["policies"].get(result.policy)
                where = f"{target.name}  {case.label}  {result.policy}"
                if saved is None:
                    print(f"skip {where}: not in the baseline")
                    continue
                if result.error_type != (None if saved["error"] is None else saved["error"].split(":", 1)[0]):
                    here.append(f"{where}  exception: {saved['error']!r:.120} -> {result.error!r:.120}")
                    continue
                if result.record_names != saved["record_names"]:
                    here.append(f"{where}  record names: {saved['record_names']} -> {result.record_names}")
                stored = None
                for key in sorted(set(saved["digests"]) | set(result.entries)):
                    count[0] += 1
                    old = saved["digests"].get(key, "absent")
                    value = result.entries.get(key, "absent")
                    new = value if isinstance(value, str) else (None if value is None else digest(value))
                    if old == new:
                        continue
                    detail = f"{old!r:.12} -> {new!r:.12}"
                    if isinstance(value, torch.Tensor) and old not in (None, "absent"):
                        path = _value_file(baseline, target.name, case.label, result.policy)
                        if stored is None and path.exists():
                            stored = torch.load(path)
                        detail = (count_differences(stored[key], value) if stored is not None and key in stored
                                  else "digest differs (no stored values to count)")
                    here.append(f"{where}  {key}: {detail}")
            for lp, inputs in drawn.items():
                old_inputs = saved_case.get("inputs", {}).get(lp, {})
                for key, new in _input_digests(inputs).items():
                    count[1] += 1
                    if old_inputs.get(key, "absent") != new:
                        here.append(f"{target.name}  {case.label}  inputs[{lp}]  input.{key}: digest differs")
            count[2] += len(here)
            mismatches += here
            print(f"checked {target.name} {case.label} ({time.perf_counter() - start:.1f} s)"
                  + (f": {len(here)} MISMATCHES" if here else ""), flush=True)
        print(f"== {target.name}: {count[0]} tensors and {count[1]} inputs compared, {count[2]} mismatches "
              f"({time.perf_counter() - target_start:.1f} s)", flush=True)
    _report_skips(skips, errors)
    for line in mismatches:
        print("MISMATCH", line)
    for name, (tensors, inputs, bad) in counts.items():
        print(f"{name}: {tensors} tensors, {inputs} inputs, {bad} mismatches")
    if not_in_baseline:
        print(f"{not_in_baseline} cases not in the baseline (skipped)")
    tensors = sum(c[0] for c in counts.values())
    print(f"{tensors} tensors compared, {len(mismatches)} mismatches ({time.perf_counter() - total_start:.1f} s)")
    return 1 if mismatches else 0


def diff(args, plan) -> int:
    """Compare two baseline files entry by entry, running nothing: every (target, case, policy) both hold must have
    the same digests, exception type and record names (e.g. a quick and a full baseline of the same commit)."""
    a, b = (json.loads(Path(p).read_text()) for p in (args.baseline, args.other))
    mismatches, checked, only = [], 0, 0
    for target in sorted(set(a["operators"]) | set(b["operators"])):
        ca, cb = a["operators"].get(target, {}).get("cases", {}), b["operators"].get(target, {}).get("cases", {})
        only += len(set(ca) ^ set(cb))
        for label in sorted(set(ca) & set(cb)):
            pa, pb = ca[label]["policies"], cb[label]["policies"]
            only += len(set(pa) ^ set(pb))
            for lp in sorted(set(ca[label].get("inputs", {})) & set(cb[label].get("inputs", {}))):
                if ca[label]["inputs"][lp] != cb[label]["inputs"][lp]:
                    mismatches.append(f"{target}  {label}  inputs[{lp}] differ")
            for pname in sorted(set(pa) & set(pb)):
                ra, rb = pa[pname], pb[pname]
                where = f"{target}  {label}  {pname}"
                if (ra["error"] or "").split(":", 1)[0] != (rb["error"] or "").split(":", 1)[0]:
                    mismatches.append(f"{where}  exception: {ra['error']!r:.80} vs {rb['error']!r:.80}")
                if ra["record_names"] != rb["record_names"]:
                    mismatches.append(f"{where}  record names differ")
                for key in sorted(set(ra["digests"]) | set(rb["digests"])):
                    checked += 1
                    if ra["digests"].get(key, "absent") != rb["digests"].get(key, "absent"):
                        mismatches.append(f"{where}  {key}: digests differ")
    for line in mismatches:
        print("MISMATCH", line)
    print(f"{checked} tensors compared, {len(mismatches)} mismatches ({only} cases or policies in one file only)")
    return 1 if mismatches else 0


def _stage1_reference_module():
    """The module whose ``CPU_FAST_PATH`` switches stage 1's CPU fast path (its operator folder's reference)."""
    for name in ("mimo_numerics.ops.mamba_mimo_bwd_fwd.reference", "mimo_numerics.ops.mamba_mimo_bwd_fwd.cpu"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "CPU_FAST_PATH"):
            return module
    raise SystemExit("vs-generic: no CPU_FAST_PATH flag found in stage 1's reference module")


def vs_generic(args, plan) -> int:
    """Run every case twice, on the CPU fast path and on the generic whole-tensor path, and compare the bits."""
    reference = _stage1_reference_module()
    mismatches, checked = [], 0
    for target, cases, policies in plan:
        for case in cases:
            start = time.perf_counter()
            saved = reference.CPU_FAST_PATH
            try:
                reference.CPU_FAST_PATH = False
                generic = list(_run(target, case, policies, {}))
            finally:
                reference.CPU_FAST_PATH = saved
            fast = list(_run(target, case, policies, {}))
            for want, got in zip(generic, fast):
                where = f"{target.name}  {case.label}  {want.policy}"
                if want.error_type != got.error_type:
                    mismatches.append(f"{where}  exception: {want.error!r:.120} -> {got.error!r:.120}")
                if want.record_names != got.record_names:
                    mismatches.append(f"{where}  record names: {want.record_names} -> {got.record_names}")
                for key in sorted(set(want.entries) | set(got.entries)):
                    checked += 1
                    a, b = want.entries.get(key, "absent"), got.entries.get(key, "absent")
                    if a is None and b is None:
                        continue
                    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
                        mismatches.append(f"{where}  {key}: {type(a).__name__} -> {type(b).__name__}")
                    elif digest(a) != digest(b):
                        mismatches.append(f"{where}  {key}: {count_differences(a, b)}")
                    elif not key.startswith("record.") and _layout(a) != _layout(b):
                        mismatches.append(f"{where}  {key}: strides {a.stride()} -> {b.stride()}")
            print(f"checked {target.name} {case.label} ({time.perf_counter() - start:.1f} s)", flush=True)
    for line in mismatches:
        print("MISMATCH", line)
    print(f"{checked} tensors compared, {len(mismatches)} mismatches")
    return 1 if mismatches else 0


def build_plan(targets: List[str], quick: bool, sweep: Optional[Tuple[int, ...]], headline: bool,
               policy_names: Optional[List[str]] = None, case_filter: Optional[str] = None, rest: bool = False):
    """[(target, cases, policies)] for the named targets; ``policy_names`` restricts the policies of every target
    (names a target does not have are left out for it), ``case_filter`` keeps the cases whose label contains it,
    ``rest`` keeps only the cases that ``quick`` leaves out (a full run split in two: ``--quick``, then ``--rest``)."""
    makers = all_targets()
    all_policies = _policies()
    plan = []
    for name in targets:
        target = makers[name]()
        policies = target.policies(all_policies)
        if policy_names is not None:
            policies = {p: policies[p] for p in policy_names if p in policies}
        cases = target.cases(quick, sweep, headline)
        if rest:
            in_quick = {c.label for c in target.cases(True, sweep, headline)}
            cases = [c for c in cases if c.label not in in_quick]
        if case_filter:
            cases = [c for c in cases if case_filter in c.label]
        plan.append((target, cases, policies))
    return plan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("save", "compare", "vs-generic", "diff"),
                        help="save a baseline, compare against one, compare stage 1's CPU fast path with the "
                             "generic whole-tensor path of the current code (no baseline needed), or diff two "
                             "baseline files (--baseline and --other; runs nothing)")
    parser.add_argument("--baseline", default=str(DEFAULT_BASELINE),
                        help=f"digest JSON file (default {DEFAULT_BASELINE.relative_to(ROOT)}, git-ignored)")
    known = list(all_targets())
    parser.add_argument("--other", default=None, help="diff: the second baseline file")
    parser.add_argument("--op", action="append", choices=known, default=None,
                        help="run only this target (repeatable; default all: the registered operators, "
                             f"{EPILOGUE} and {WHOLE_OP}; vs-generic: mamba_mimo_bwd_fwd)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke, gate and stress cases and the small whole-op cases only (minutes)")
    parser.add_argument("--rest", action="store_true",
                        help="only the cases --quick leaves out (sweep, headline, the larger whole-op cases): a full "
                             "compare split into a --quick run and a --rest run, e.g. in two processes")
    parser.add_argument("--no-headline", action="store_true", help="leave out the headline shape (the slow case)")
    parser.add_argument("--sweep", default=None,
                        help="comma-separated indices into the sweep grid for every operator ('' for none; default "
                             f"per operator: {DEFAULT_SWEEP})")
    parser.add_argument("--policies", default=None,
                        help="comma-separated subset of the policy names (presets and custom:*, or the epilogue's "
                             "flag names; default all)")
    parser.add_argument("--cases", default=None, help="keep only the cases whose label contains this text")
    parser.add_argument("--no-values", action="store_true",
                        help="save: store digests only (compare then cannot count differing elements)")
    parser.add_argument("--block-elements", type=int, default=None,
                        help="set BLOCK_ELEMENTS of stage 1's CPU path (the target block size); every value must "
                             "give the same bits")
    parser.add_argument("--block-chunks", type=int, default=None,
                        help="set BLOCK_CHUNKS of stage 1's CPU path (chunks per block; 1 gives the most blocks, "
                             "which exercises the blocking on the small cases)")
    parser.add_argument("--inputs-dir", type=Path, default=None,
                        help="read each case's inputs from this directory, writing those it lacks (torch.save "
                             "files). With it, a baseline can be saved by a commit whose input generator differs: "
                             "save the inputs with the current code, then run the old commit's reference on them")
    parser.add_argument("--list", action="store_true", help="print the targets, cases and policies and exit")
    args = parser.parse_args(argv)
    if args.mode == "diff":
        if args.other is None:
            parser.error("diff needs --other (the second baseline file)")
        return diff(args, None)
    if args.inputs_dir is not None:
        global INPUTS_DIR
        INPUTS_DIR = args.inputs_dir
        INPUTS_DIR.mkdir(parents=True, exist_ok=True)
    if args.block_elements is not None or args.block_chunks is not None:
        cpu = importlib.import_module("mimo_numerics.ops.mamba_mimo_bwd_fwd.reference_cpu")
        if args.block_elements is not None:
            cpu.BLOCK_ELEMENTS = args.block_elements
        if args.block_chunks is not None:
            cpu.BLOCK_CHUNKS = args.block_chunks
    targets = args.op or (["mamba_mimo_bwd_fwd"] if args.mode == "vs-generic" else known)
    policy_names = args.policies.split(",") if args.policies else None
    if policy_names:
        everything = set(_policies()) | set(_epilogue_policies())
        unknown = [p for p in policy_names if p not in everything]
        if unknown:
            parser.error(f"--policies: unknown name(s) {unknown}; known: {sorted(everything)}")
    sweep = None if args.sweep is None else tuple(int(i) for i in args.sweep.split(",") if i.strip())
    if args.quick and args.rest:
        parser.error("--quick and --rest exclude each other (--rest runs the cases --quick leaves out)")
    plan = build_plan(targets, args.quick, sweep, not args.no_headline, policy_names, args.cases, args.rest)
    if args.list:
        for target, cases, policies in plan:
            print(f"{target.name}: {len(cases)} cases x {len(policies)} policies")
            print("  " + "\n  ".join(c.label + ("" if c.policies is None else f"  (policies: {', '.join(c.policies)})")
                                     for c in cases))
            print("  policies:", ", ".join(policies))
        return 0
    return {"save": save, "compare": compare, "vs-generic": vs_generic}[args.mode](args, plan)


if __name__ == "__main__":
    raise SystemExit(main())
