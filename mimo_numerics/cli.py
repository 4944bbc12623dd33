"""``mimo-numerics``: run an operator of the Mamba-3 MIMO op into result bundles, compare and verify bundles, inspect
policies.

Commands (``mimo-numerics <command> --help`` for every option)::

    run       [--op NAME] --backend {reference,triton,upstream} [--policy NAME|FILE.json]
              (--grid NAME | --case SPEC ... | --inputs-from BUNDLE) [--only GLOB ...] [--device DEV] --out DIR
    compare   A B [--op NAME] [--threshold X] [--metric rel_rms|max_abs|max_rel] [--allow-different-inputs]
              [--allow-missing] [--json FILE]
    verify    BUNDLE
    upgrade   OLD_BUNDLE --out DIR [--overwrite]
    import-golden [GOLDEN.pt] [--op NAME] --out DIR
    presets
    policy    show NAME|FILE.json  |  policy diff A B
    report    [--op NAME] ...  (delegates to mimo_numerics.report)

``--op NAME``: the operator, a name of ``mimo_numerics.ops.registry`` (default: the registry's default operator;
``run --inputs-from`` and ``compare`` default to the operator the bundles hold, and refuse another one). Backends
come from the operator: ``reference`` (its policy reference) for every operator, ``upstream`` (the real TileLang
kernel through its upstream runner) and ``triton`` where the operator has them (``mimo-numerics run --help`` lists
which).

``--case SPEC``: a comma-separated ``key=value`` list of ``CaseSpec`` fields, with the dimension letters as aliases
(``B S H G N P R C`` for batch, seqlen, heads, groups, state_dim, value_dim, rank, chunk_size; ``rd`` for
rotary_dim_divisor). Booleans are ``true/false/1/0/yes/no``. Unlisted fields keep their ``CaseSpec`` defaults.
Example: ``--case B=1,S=64,H=2,N=64,P=64,R=4,C=16,has_z=true,formula=realistic,dtype=bfloat16,seed=7``. A JSON
object (``--case '{"seqlen": 64}'``) or ``@file.json`` is accepted too. ``--case`` may be repeated; every operator
draws its inputs from a ``CaseSpec`` (``op.draw``).

Exit status: 0 success; 1 ``compare`` found a metric above ``--threshold`` (NaN counts as above), a case with
mismatched outputs, or a case present in only one bundle; 2 any error (one line on stderr with a hint; ``--debug``
shows the traceback).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

PROG = "mimo-numerics"
BACKENDS = ("reference", "triton", "upstream")
#: The operator loader behind each backend (``Operator.load``).
BACKEND_LOADERS = {"reference": "reference", "triton": "kernels", "upstream": "upstream"}
METRICS = ("rel_rms", "max_abs", "max_rel")
_ALIASES = {"B": "batch", "S": "seqlen", "H": "heads", "G": "groups", "N": "state_dim", "P": "value_dim",
            "R": "rank", "C": "chunk_size", "rd": "rotary_dim_divisor"}
_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")


class CliError(Exception):
    """An error reported as one line, with a hint."""

    def __init__(self, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.hint = hint


# ---------------------------------------------------------------------------------------------------------- helpers
def parse_case_spec(text: str):
    """A ``CaseSpec`` from the ``--case`` syntax (module docstring)."""
    from .cases import CaseSpec
    import dataclasses

    text = text.strip()
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--case {text}: cannot read the file ({exc.strerror})") from None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(f"--case: not valid JSON ({exc})", "use key=value pairs or a JSON object") from None
        return CaseSpec.from_dict(data)
    defaults = {f.name: f.default for f in dataclasses.fields(CaseSpec)}
    values: Dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise CliError(f"--case: {item!r} is not key=value", "example: --case B=1,S=32,N=64,P=64,R=4,C=16")
        key, raw = (s.strip() for s in item.split("=", 1))
        name = _ALIASES.get(key, key)
        if name not in defaults:
            raise CliError(f"--case: unknown field {key!r}",
                           f"fields: {', '.join(defaults)}; aliases: {', '.join(f'{a}={n}' for a, n in _ALIASES.items())}")
        if name in values:
            raise CliError(f"--case: field {name!r} given twice")
        kind = type(defaults[name])
        if kind is bool:
            if raw.lower() not in _TRUE + _FALSE:
                raise CliError(f"--case: {key}={raw!r} is not a boolean", "use true/false")
            values[name] = raw.lower() in _TRUE
        elif kind is int:
            try:
                values[name] = int(raw)
            except ValueError:
                raise CliError(f"--case: {key}={raw!r} is not an integer") from None
        else:
            values[name] = raw
    return CaseSpec(**values)


def _looks_like_file(text: str) -> bool:
    return text.endswith(".json") or os.sep in text or os.path.exists(text)


def _resolve_policy(text: str):
    """The policy of a preset name or a JSON file; one line naming the file (or the name) otherwise."""
    from . import presets

    if text.endswith(".json") and not os.path.exists(text):
        raise CliError(f"policy file {text} not found", "give a preset name (mimo-numerics presets) or a JSON file")
    try:
        return presets.resolve(text)
    except (ValueError, TypeError, NotImplementedError) as exc:
        if _looks_like_file(text):
            message = str(exc) if text in str(exc) else f"policy file {text}: {exc}"
            raise CliError(message, f"fix the file; `{PROG} policy show upstream_sm90 > FILE.json` writes a "
                                    "complete policy file") from None
        raise CliError(str(exc), "mimo-numerics presets lists the preset names; a file must end in .json") from None


def _operator_of(name: Optional[str]):
    """The :class:`~mimo_numerics.operator.Operator` of ``--op`` (None: the registry's default operator)."""
    from . import operator as _operator

    return _operator.get(name)


def _operators_with(loader: str) -> List[str]:
    """The registered operators that have ``loader`` (``"kernels"``, ``"upstream"``, ...)."""
    from .ops import registry

    return [name for name in registry.OPERATORS if getattr(registry.get(name), loader) is not None]


def _check_device(device: str) -> None:
    """One line naming ``--device`` when torch cannot run on it here (checked once, before any case runs)."""
    from .testing import DeviceUnavailableError, check_device

    try:
        check_device(device)
    except DeviceUnavailableError as exc:
        hint = exc.hint.replace("run on cpu", "run with --device cpu", 1)
        raise CliError(f"--device {device}: {exc.reason}", hint) from None


def _note(text: str) -> None:
    """A message on stderr that leaves the progress bar intact (``tqdm.write``)."""
    from tqdm.auto import tqdm

    tqdm.write(text, file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------- run
def _case_sources(args) -> None:
    """One source of cases: --grid/--case, or --inputs-from."""
    sources = sum(bool(x) for x in (args.grid, args.case, args.inputs_from))
    if sources == 0:
        op = _operator_of(args.op)
        raise CliError("run needs cases: --grid NAME, --case SPEC or --inputs-from BUNDLE",
                       f"grids of {op.name}: {', '.join(op.load('grids')())}")
    if args.inputs_from and (args.grid or args.case):
        raise CliError("--inputs-from cannot be combined with --grid/--case")


def _run_operator(args, source_bundle):
    """``--op``, or the operator of the ``--inputs-from`` bundle (which ``--op`` must then name, when given)."""
    if source_bundle is None:
        return _operator_of(args.op)
    if args.op is not None and args.op != source_bundle.operator:
        raise CliError(f"--op {args.op}: --inputs-from {args.inputs_from} holds cases of {source_bundle.operator}",
                       f"drop --op, or pass --op {source_bundle.operator}")
    return source_bundle.op


def _collect_cases(args, op, source_bundle=None) -> List[tuple]:
    """``[(name, spec, cpu_inputs)]`` of operator ``op`` from --grid / --case / --inputs-from, filtered by --only."""
    found: List[tuple] = []
    if source_bundle is not None:
        for bc in source_bundle:
            found.append((bc.name, bc.spec, dict(bc.inputs)))
    else:
        specs = []
        if args.grid:
            try:
                specs.extend(op.cases(args.grid))
            except ValueError as exc:
                raise CliError(str(exc)) from None
        for text in args.case or ():
            specs.append(parse_case_spec(text))
        for spec in specs:
            found.append((spec.case_id, spec, None))
    if args.only:
        found = [c for c in found if any(fnmatch.fnmatchcase(c[0], pattern) for pattern in args.only)]
        if not found:
            raise CliError(f"--only {' '.join(args.only)} matches no case")
    names = [c[0] for c in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CliError(f"duplicate cases: {dupes}", "each case may appear once")
    return found


def _backend_function(op, backend: str):
    """The function behind ``--backend`` for operator ``op``; one line with a hint where the operator lacks it."""
    loader = BACKEND_LOADERS[backend]
    try:
        return op.load(loader)
    except ValueError as exc:
        others = [b for b, what in BACKEND_LOADERS.items() if getattr(op, what) is not None]
        having = _operators_with(loader)
        raise CliError(f"--backend {backend}: {exc}",
                       f"--backend {backend} exists for {', '.join(having) or 'no operator'}; use --backend "
                       f"{' or '.join(others)} for {op.name}") from None


def _backend_fn(op, backend: str, args):
    """``fn(*tensors, policy=, **scalars)`` running ``backend`` on operator ``op``."""
    fn = _backend_function(op, backend)
    if backend == "reference":
        return fn
    if backend == "triton":
        from .bundles import operator_module

        kernels = operator_module(op, "kernels")
        if not kernels.triton_available():
            raise CliError("the triton backend needs Triton",
                           "pip install 'mimo_numerics[triton]' (NVIDIA/CPU) or 'mimo_numerics[npu]' (Ascend)")

        def run_triton(*tensors, **kw):
            return fn(*tensors, allow_slow_interpreter=args.allow_slow_interpreter, **kw)

        return run_triton

    def run_upstream(*tensors, policy=None, **kw):
        return fn(*tensors, source_dir=args.upstream_src, **kw)

    return run_upstream


#: The fields from which a case spec's ``Dims`` follow without drawing its inputs (CaseSpec, OpCaseSpec, StoredCase).
_SPEC_SIZE_FIELDS = ("batch", "seqlen", "heads", "groups", "state_dim", "value_dim", "rank", "chunk_size", "reduce_o",
                     "has_z", "has_d", "lp_dtype", "rotary_dim_divisor")


def _case_dims(spec, inputs, op=None):
    """The ``Dims`` of a case of operator ``op``, from its stored inputs or, for a spec, without drawing them."""
    import torch

    from .bundles import validate_case_inputs
    from .validation import Dims

    op = _operator_of(op)
    if inputs is None and not all(hasattr(spec, f) for f in _SPEC_SIZE_FIELDS):
        inputs = op.draw(spec, "cpu")
    if inputs is not None:
        return validate_case_inputs(inputs, op)
    return Dims(batch=spec.batch, seqlen=spec.seqlen, heads=spec.heads, groups=spec.groups, state_dim=spec.state_dim,
                value_dim=spec.value_dim, rank=spec.rank, chunk_size=spec.chunk_size,
                nchunks=-(-spec.seqlen // spec.chunk_size), rotary_dim_divisor=spec.rotary_dim_divisor,
                reduce_o=spec.reduce_o, has_z=spec.has_z, has_d=spec.has_d, lp_dtype=spec.lp_dtype,
                device=torch.device("cpu"))


def interpreter_estimate(found: Sequence[tuple], op=None) -> tuple:
    """``(total seconds, [(name, seconds)])``: the Triton interpreter's up-front estimate for every case of a run
    of operator ``op`` (``estimate_interpreter_seconds`` of its kernels). Cases the kernels cannot plan (unsupported
    sizes; they fail with their own message when run) count 0."""
    from .bundles import operator_module

    op = _operator_of(op)
    kernels = operator_module(op, "kernels")
    per_case = []
    for name, spec, inputs in found:
        try:
            seconds = kernels.estimate_interpreter_seconds(_case_dims(spec, inputs, op))
        except (ValueError, TypeError, NotImplementedError):
            seconds = 0.0
        per_case.append((name, seconds))
    return sum(s for _, s in per_case), per_case


def _check_interpreter_time(found: Sequence[tuple], args, op) -> None:
    """Print the run's interpreter estimate (sum over its cases); refuse the run above the kernels'
    ``INTERPRETER_LIMIT_S`` unless ``--allow-slow-interpreter`` (the limit each case already had, now per run)."""
    from .bundles import operator_module

    limit = operator_module(op, "kernels").INTERPRETER_LIMIT_S
    total, per_case = interpreter_estimate(found, op)
    slowest_name, slowest = max(per_case, key=lambda item: item[1])
    refused = total > limit and not args.allow_slow_interpreter
    if not args.quiet and not refused:
        _note(f"note: --backend triton on cpu runs in Triton's interpreter: about {total:.0f} s estimated "
              f"for {len(found)} case(s) (slowest {slowest_name}: about {slowest:.0f} s)")
    if refused:
        raise CliError(f"--backend triton --device cpu: the {len(found)} case(s) would take about {total:.0f} s in "
                       f"Triton's interpreter (estimate; the limit is {limit:.0f} s per run; slowest {slowest_name}: "
                       f"about {slowest:.0f} s)",
                       "pass --allow-slow-interpreter to run anyway, pick fewer cases with --only, or use --device "
                       "cuda/npu")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("npu") and hasattr(torch, "npu"):
        torch.npu.synchronize()


def _run_policy(args, op):
    """The base policy of a reference/triton run; it must define operator ``op``."""
    from .policy import PolicyUndefined

    policy = _resolve_policy(args.policy or "upstream_sm90")
    try:
        policy.section(op.name)
    except PolicyUndefined as exc:
        raise CliError(f"--policy {args.policy or 'upstream_sm90'}: {exc}",
                       f"{PROG} presets shows which operators each preset defines") from None
    return policy


def cmd_run(args) -> int:
    import torch

    from . import envinfo, presets
    from .bundles import BundleCase, load_bundle, operator_module, outputs_type, save_bundle, validate_case_inputs
    from .sweep import progress_bar

    _case_sources(args)
    source_bundle = load_bundle(args.inputs_from) if args.inputs_from else None
    op = _run_operator(args, source_bundle)
    backend = args.backend
    device = args.device or ("cuda" if backend == "upstream" else "cpu")
    runner = None
    if backend == "upstream":
        if args.policy is not None:
            raise CliError("--policy does not apply to --backend upstream (the real kernel has no policy)",
                           "drop --policy")
        _backend_function(op, backend)
        runner = operator_module(op, "upstream")
        runner.check_cuda(device)
        _check_device(device)
        base_policy = None
    else:
        _check_device(device)
        base_policy = _run_policy(args, op)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CliError(f"{out} already exists", "pass --overwrite or choose another --out")
    fn = _backend_fn(op, backend, args)
    found = _collect_cases(args, op, source_bundle)
    versions = envinfo.versions()
    extra_meta: Dict[str, Any] = {}
    if runner is not None:
        info = runner.source_info(args.upstream_src)
        versions["mamba_ssm"] = info.get("mamba_ssm", versions.get("mamba_ssm", "?"))
        extra_meta["upstream_source"] = info
    name_of_device = envinfo.device_name(device)
    if backend == "triton":
        # a policy the kernels cannot express: refused
        operator_module(op, "kernels").operator_constexprs(base_policy, op.name)
        if torch.device(device).type == "cpu":
            _check_interpreter_time(found, args, op)
    kind_of_outputs = outputs_type(op)
    results = []
    adapted = set()
    with progress_bar(len(found), f"run {op.name}", enabled=not args.quiet) as bar:
        for name, spec, inputs in found:
            cpu_inputs = inputs if inputs is not None else op.draw(spec, "cpu")
            policy = base_policy
            lp = str(validate_case_inputs(cpu_inputs, op).lp_dtype).replace("torch.", "")
            if policy is not None and policy.lp_dtype != lp:
                if args.strict_dtype:
                    raise CliError(f"case {name} has {lp} inputs but the policy's lp_dtype is {policy.lp_dtype}",
                                   "drop --strict-dtype to adapt the policy per case, or pick cases of one dtype")
                policy = policy.replace(lp_dtype=lp)
                if lp not in adapted:
                    adapted.add(lp)
                    _note(f"note: {lp} cases run with the policy's lp_dtype set to {lp} "
                          f"(recorded per case as policy {presets.label(policy, operator=op.name)!r})")
            dev_inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in cpu_inputs.items()}
            meta: Dict[str, Any] = dict(extra_meta)
            skipped = None
            outputs = None
            t0 = time.perf_counter()
            try:
                raw = fn(*op.args(dev_inputs), policy=policy, **op.kwargs(dev_inputs))
                _sync(device)
                outputs = kind_of_outputs(*(None if t is None else t.detach().to("cpu") for t in raw))
                status = "ok"
            except Exception as exc:
                if runner is None or not isinstance(exc, runner.UpstreamUnsupported):
                    raise
                skipped = str(exc)
                status = "skipped (upstream limitation)"
                _note(f"skip: {name}: {exc}")
            meta["wall_s"] = round(time.perf_counter() - t0, 6)
            if runner is not None and getattr(runner, "last_launch", None):
                meta["upstream_launch"] = dict(runner.last_launch)
            if policy is not None:
                meta["policy_name"] = presets.label(policy, operator=op.name)
            results.append(BundleCase(name=name, inputs=cpu_inputs, outputs=outputs, spec=spec, policy=policy,
                                      backend=backend, device=str(device), device_name=name_of_device,
                                      versions=versions, skipped=skipped, meta=meta, operator=op.name))
            bar.set_postfix_str(f"{name} {status}", refresh=False)
            bar.update()
    bundle_meta = {"command": " ".join([PROG] + list(args.argv)), "operator": op.name, "backend": backend,
                   "policy": None if base_policy is None else presets.label(base_policy, operator=op.name),
                   "grid": args.grid,
                   "device": str(device), "device_name": name_of_device}
    save_bundle(out, results, meta=bundle_meta, overwrite=args.overwrite, op=op)
    ok = sum(r.outputs is not None for r in results)
    print(f"wrote {out}: {len(results)} case(s) of {op.name}, {ok} with outputs, {len(results) - ok} skipped "
          f"(backend {backend}, device {name_of_device})")
    return 0


# ---------------------------------------------------------------------------------------------------------- compare
def _describe(bundle) -> str:
    def uniq(values):
        values = sorted({str(v) for v in values})
        return values[0] if len(values) == 1 else "{" + ", ".join(values) + "}"

    backends = uniq(c.backend for c in bundle)
    from . import presets

    policies = uniq("-" if c.policy is None else presets.label(c.policy, operator=bundle.operator) for c in bundle)
    devices = uniq(c.device_name or c.device for c in bundle)
    return (f"{bundle.path} [{bundle.operator}; {len(bundle)} cases; backend {backends}; policy {policies}; "
            f"device {devices}]")


def _json_safe(obj):
    """NaN -> null and ±inf -> "inf"/"-inf", recursively (JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _fmt(x: float) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.3e}"


def _bits(t):
    import torch

    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(view)


def _input_difference(x, y) -> Optional[str]:
    """Why two stored inputs differ (None when bit-identical): ``"values"``, ``"shape ..."``, ``"dtype ..."``."""
    import torch

    if x is None or y is None:
        return None if x is None and y is None else ("absent in A" if x is None else "absent in B")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return None if x == y else f"{x!r} vs {y!r}"
    if tuple(x.shape) != tuple(y.shape):
        return f"shape {list(x.shape)} vs {list(y.shape)}"
    if x.dtype != y.dtype:
        return f"dtype {x.dtype} vs {y.dtype}".replace("torch.", "")
    return None if torch.equal(_bits(x), _bits(y)) else "values"


def _differing_inputs(ca, cb) -> List[str]:
    """The inputs of one case that differ between two bundles (of one operator), as ``name`` or ``name (why)``."""
    input_names = ca.op.input_names
    names = list(input_names) + sorted((set(ca.inputs) | set(cb.inputs)) - set(input_names))
    found = []
    for name in names:
        why = _input_difference(ca.inputs.get(name), cb.inputs.get(name))
        if why is not None:
            found.append(name if why == "values" else f"{name} ({why})")
    return found


def _zero_sign_fraction(a, b) -> float:
    """Fraction of elements where ``a`` and ``b`` are both zero with opposite signs (-0 vs +0); nan if not
    comparable (other shape or dtype)."""
    import torch

    if a is None or b is None or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) or a.numel() == 0:
        return math.nan
    opposite = (a == 0) & (b == 0) & (torch.signbit(a) != torch.signbit(b))
    return float(opposite.double().mean())


def _zero_sign_note(output: str, m: dict) -> Optional[str]:
    """``note: 0.39 % of dz differ only in the sign of zero ...`` when some elements do, else None."""
    zero = m.get("zero_sign_fraction", math.nan)
    if math.isnan(zero) or zero == 0:
        return None
    text = f"note: {100 * zero:.2f} % of {output} differ only in the sign of zero (-0 vs +0)"
    if m["max_abs"] == 0:
        return text + "; every value is equal (hence rel RMS and max abs 0)"
    return text + "; the other differing elements differ in value"


def _compared_operator(args, a, b):
    """The one operator of bundles ``a`` and ``b`` (and ``--op``, when given); one line naming the mix otherwise."""
    if a.operator != b.operator:
        raise CliError(f"the bundles hold different operators: A ({args.a}) {a.operator}, B ({args.b}) {b.operator}",
                       f"compare bundles of one operator (`{PROG} verify BUNDLE` names a bundle's operator)")
    if args.op is not None and args.op != a.operator:
        raise CliError(f"--op {args.op}: both bundles hold {a.operator}", f"drop --op, or pass --op {a.operator}")
    return a.op


def cmd_compare(args) -> int:
    from .bundles import load_bundle
    from .metrics import compare_outputs

    a, b = load_bundle(args.a), load_bundle(args.b)
    op = _compared_operator(args, a, b)
    print(f"A (expected): {_describe(a)}")
    print(f"B (actual):   {_describe(b)}")
    names_a, names_b = a.names(), b.names()
    common = [n for n in names_a if n in names_b]
    only_a = [n for n in names_a if n not in names_b]
    only_b = [n for n in names_b if n not in names_a]
    if not common:
        raise CliError("the bundles have no case in common", "compare bundles made from the same grid or inputs")
    differing = [n for n in common if a.case(n).inputs_digest != b.case(n).inputs_digest]
    differing_tensors = {n: _differing_inputs(a.case(n), b.case(n)) for n in differing}
    named = "; ".join(f"{n} ({', '.join(differing_tensors[n]) or 'same tensors, other digest'})"
                      for n in differing[:3]) + ("; ..." if len(differing) > 3 else "")
    if differing and not args.allow_different_inputs:
        raise CliError(f"inputs differ between the bundles for {len(differing)} case(s): {named}",
                       "the outputs are not comparable; pass --allow-different-inputs to compare anyway")
    report: Dict[str, Any] = {"a": str(a.path), "b": str(b.path), "operator": op.name, "metric": args.metric,
                              "threshold": args.threshold, "cases": {}, "only_in_a": only_a, "only_in_b": only_b,
                              "inputs_differ": differing, "inputs_differ_tensors": differing_tensors}
    failures: List[str] = []
    width = max([8] + [len(n) for n in op.output_names])
    header = f"{'case':<52} {'output':<{width}} {'rel_rms':>10} {'max_abs':>10} {'max_rel':>10} {'bit_equal':>9}"
    print(header)
    print("-" * len(header))
    for name in common:
        ca, cb = a.case(name), b.case(name)
        if ca.outputs is None or cb.outputs is None:
            why = ca.skipped if ca.outputs is None else cb.skipped
            side = "A" if ca.outputs is None else "B"
            print(f"{name:<52} skipped in {side}: {why or 'no outputs'}")
            report["cases"][name] = {"skipped": f"{side}: {why or 'no outputs'}"}
            continue
        try:
            metrics = compare_outputs(cb.outputs, ca.outputs, op=op)
        except (TypeError, ValueError) as exc:
            print(f"{name:<52} ERROR: {exc}")
            report["cases"][name] = {"error": str(exc)}
            failures.append(f"{name}: {exc}")
            continue
        report["cases"][name] = metrics
        for output, m in metrics.items():
            if m is None:
                continue
            a_out, b_out = getattr(ca.outputs, output), getattr(cb.outputs, output)
            m["zero_sign_fraction"] = _zero_sign_fraction(b_out, a_out)
            bit = "n/a" if math.isnan(m["bit_equal_fraction"]) else f"{100 * m['bit_equal_fraction']:.2f}%"
            flag = ""
            if args.threshold is not None and not m[args.metric] <= args.threshold:
                flag = "  > threshold"
                failures.append(f"{name}/{output}: {args.metric} {_fmt(m[args.metric])}")
            print(f"{name:<52} {output:<{width}} {_fmt(m['rel_rms']):>10} {_fmt(m['max_abs']):>10} "
                  f"{_fmt(m['max_rel']):>10} {bit:>9}{flag}")
            note = _zero_sign_note(output, m)
            if note:
                print(f"  {note}")
    for side, names in (("A", only_a), ("B", only_b)):
        for n in names:
            print(f"{n:<52} only in {side}")
    if differing:
        print(f"warning: inputs differ for {len(differing)} case(s) (--allow-different-inputs): {named}")
    missing = (only_a or only_b) and not args.allow_missing
    if missing:
        failures.append(f"{len(only_a) + len(only_b)} case(s) present in only one bundle")
    report["failures"] = failures
    if args.json:
        text = json.dumps(_json_safe(report), indent=1, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
    if failures:
        print(f"FAIL: {len(failures)} problem(s): " + "; ".join(failures[:5]) + (" ..." if len(failures) > 5 else ""))
        return 1
    verdict = "within threshold" if args.threshold is not None else "no threshold given"
    print(f"OK: {len(common)} case(s) compared ({verdict})")
    return 0


# ---------------------------------------------------------------------------------------------------------- others
def cmd_verify(args) -> int:
    from .bundles import verify_bundle

    bundle = verify_bundle(args.bundle)
    with_out = sum(c.outputs is not None for c in bundle)
    files = len(bundle) + with_out
    print(f"OK {bundle.path}: schema_version {bundle.schema_version}, operator {bundle.operator}, {len(bundle)} "
          f"case(s) ({with_out} with outputs, {len(bundle) - with_out} skipped), {files} tensor file(s) verified "
          "(sha256, shapes, dtypes)")
    return 0


def cmd_upgrade(args) -> int:
    from .bundles import SCHEMA_VERSION, load_bundle, upgrade_bundle

    out = upgrade_bundle(args.bundle, args.out, overwrite=args.overwrite)
    print(f"OK {out}: {args.bundle} verified and written as schema_version {SCHEMA_VERSION} (operator "
          f"{load_bundle(out).operator})")
    return 0


def cmd_import_golden(args) -> int:
    from .bundles import golden_to_bundle, load_bundle

    op = _operator_of(args.op)
    source = args.golden
    if source is not None and not Path(source).is_file():
        raise CliError(f"golden file {source} not found", "pass the path of a golden file of the seed-case layout "
                                                          "(upstream_h200_seed_cases.pt), or none for the "
                                                          "operator's own golden data")
    try:
        op.load("golden")
    except ValueError as exc:
        raise CliError(f"import-golden: {exc}", f"golden data exists for {', '.join(_operators_with('golden'))}") \
            from None
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CliError(f"{out} already exists", "pass --overwrite or choose another --out")
    golden_to_bundle(source, out, overwrite=args.overwrite, op=op)
    origin = source if source is not None else f"the golden data of {op.name}"
    print(f"wrote {out}: {len(load_bundle(out))} golden case(s) of {op.name} from {origin}")
    return 0


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".") + "."


def cmd_presets(args) -> int:
    from . import presets

    rows = []
    for name in presets.names():
        what, *per_operator = presets.describe(name).splitlines()
        rows.append((name, presets.get(name).lp_dtype, _first_sentence(what),
                     [line.partition(": ") for line in per_operator]))
    width = max(len(r[0]) for r in rows)
    print(f"{'preset':<{width}}  {'lp':<8}  models / evidence per operator")
    for name, lp, what, per_operator in rows:
        print(f"{name:<{width}}  {lp:<8}  {what}")
        for operator, _, evidence in per_operator:
            label = "not defined" if evidence == "not defined by this preset" else \
                f"evidence: {_first_sentence(evidence)}"
            print(f"{'':<{width}}  {'':<8}  {operator} {label}")
    return 0


def cmd_policy_show(args) -> int:
    """The policy's JSON on stdout (a file ``presets.resolve`` loads: ``policy show NAME > p.json``); which policy
    it is goes to stderr, so a redirect keeps only the JSON."""
    policy = _resolve_policy(args.policy)
    print(f"# {args.policy}: preset {policy.name!r}" if policy.name != "custom" else f"# {args.policy}: custom policy",
          file=sys.stderr)
    print(policy.to_json())
    return 0


def cmd_policy_diff(args) -> int:
    a, b = _resolve_policy(args.a), _resolve_policy(args.b)
    diff = a.diff(b)
    if not diff:
        print(f"{args.a} and {args.b} are identical")
        return 0
    width = max(len(f) for f in diff)
    print(f"{'field':<{width}}  {args.a}  ->  {args.b}")
    for field, (va, vb) in diff.items():
        print(f"{field:<{width}}  {va!r}  ->  {vb!r}")
    return 0


# ---------------------------------------------------------------------------------------------------------- parser
def _op_argument(parser, what: str) -> None:
    """``--op NAME``: the registered operators, the default one named (CLI defaults may name operators)."""
    from .ops import registry

    parser.add_argument("--op", choices=registry.OPERATORS, default=None, metavar="NAME",
                        help=f"the operator, one of {', '.join(registry.OPERATORS)}; {what}")


def _backends_help() -> str:
    """Which operators have each backend (from the operator specs)."""
    return "; ".join(f"{backend}: {', '.join(_operators_with(loader)) or 'none'}"
                     for backend, loader in BACKEND_LOADERS.items())


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .ops import registry

    default_op = registry.DEFAULT_OPERATOR
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks instead of one-line errors")
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common],
        description="Rounding semantics of the kernels of the Mamba-3 MIMO op "
                    f"({', '.join(registry.OPERATORS)}): run backends into result bundles, compare and verify "
                    "bundles, inspect policies.",
        epilog="Workflow (run on machine A, compare on machine B): docs/workflow.md")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", parents=[common], help="run a backend over cases and write a bundle",
                       description="Run a backend of one operator over cases and write a result bundle (inputs and "
                                   f"outputs). Backends by operator: {_backends_help()}.")
    _op_argument(p, f"default {default_op}, or the operator of --inputs-from")
    p.add_argument("--backend", required=True, choices=BACKENDS)
    p.add_argument("--policy", help="preset name or policy JSON file (reference/triton; default upstream_sm90). "
                                    "Cases whose dtype differs from the policy's lp_dtype run with lp_dtype adapted")
    src = p.add_argument_group("cases (one source)")
    src.add_argument("--grid", help="a named grid of the operator's cases (smoke, gate, sweep; the forward also "
                                    "whole_op)")
    src.add_argument("--case", action="append", metavar="SPEC",
                     help="a case: key=value list (B=1,S=32,N=64,P=64,R=4,C=16,has_z=true,...), JSON or @file.json; "
                          "repeatable")
    src.add_argument("--inputs-from", metavar="BUNDLE", help="run on the inputs stored in another bundle")
    p.add_argument("--only", action="append", metavar="GLOB", help="keep only cases whose name matches (repeatable)")
    p.add_argument("--device", help="torch device: cpu (default for reference/triton; triton runs its interpreter), "
                                    "cuda (default for upstream), npu")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--upstream-src", metavar="DIR", help="mamba-ssm 2.3.2.post1 source (sdist dir or .tar.gz) for "
                                                         "--backend upstream; default: $MIMO_NUMERICS_UPSTREAM_SRC, "
                                                         "then an installed mamba_ssm")
    p.add_argument("--strict-dtype", action="store_true",
                   help="refuse cases whose dtype differs from the policy's lp_dtype instead of adapting the policy")
    p.add_argument("--allow-slow-interpreter", action="store_true",
                   help="triton on cpu: run even when the interpreter's estimate for the run (sum over its cases) "
                        "is above the limit (INTERPRETER_LIMIT_S of the operator's kernels)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", parents=[common], help="compare two bundles case by case",
                       description="Per case and output: rel RMS, max abs, max rel and bit-equal fraction of B "
                                   "against A. Exit 1 when a metric exceeds --threshold (NaN counts as exceeding), "
                                   "outputs mismatch, or a case is in one bundle only.")
    p.add_argument("a", help="expected bundle (e.g. the upstream or golden run)")
    p.add_argument("b", help="actual bundle, of the same operator")
    _op_argument(p, "default: the bundles' operator (both must hold the same one; --op checks it)")
    p.add_argument("--threshold", type=float, help="fail when --metric exceeds this for any case/output")
    p.add_argument("--metric", choices=METRICS, default="rel_rms", help="metric the threshold applies to")
    p.add_argument("--allow-different-inputs", action="store_true",
                   help="compare even when the inputs of a case differ between the bundles")
    p.add_argument("--allow-missing", action="store_true", help="do not fail on cases present in only one bundle")
    p.add_argument("--json", metavar="FILE", help="also write the metrics as JSON ('-' for stdout)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("verify", parents=[common], help="check a bundle's hashes, files, shapes and dtypes")
    p.add_argument("bundle")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("upgrade", parents=[common], help="rewrite an older bundle (schema_version 1 or 2) as the "
                                                         "current schema, after verifying its files",
                       description="Verify an older bundle (file sha256 and sizes, inputs digests) and write it again "
                                   "with the current schema (operator, manifest digest, outputs digests; bundles "
                                   f"before schema_version 3 hold {default_op}). --out may be the bundle itself with "
                                   "--overwrite.")
    p.add_argument("bundle")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --out")
    p.set_defaults(func=cmd_upgrade)

    p = sub.add_parser("import-golden", parents=[common], help="convert golden upstream data into a bundle")
    p.add_argument("golden", nargs="?", help="a golden file of the seed-case layout (upstream_h200_seed_cases.pt); "
                                             "default: the operator's own golden data (the repository's seed cases "
                                             f"for {default_op}, the whole-op H200 cases for the others)")
    _op_argument(p, f"default {default_op}")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_import_golden)

    p = sub.add_parser("presets", parents=[common], help="list the preset policies and their evidence")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("policy", parents=[common], help="show or diff policies")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION")
    q = psub.add_parser("show", parents=[common], help="print a policy as JSON on stdout (a policy file: "
                                                      "'policy show NAME > p.json'); its name goes to stderr")
    q.add_argument("policy", help="preset name or policy JSON file")
    q.set_defaults(func=cmd_policy_show)
    q = psub.add_parser("diff", parents=[common], help="fields that differ between two policies")
    q.add_argument("a")
    q.add_argument("b")
    q.set_defaults(func=cmd_policy_diff)
    p.set_defaults(func=lambda args: _usage_error(p))

    sub.add_parser("report", help="write a report of one operator (--op; mimo_numerics.report; 'report --help' for "
                                  "its options)", add_help=False)
    sub.add_parser("sweep", help="cases x policies of one operator in parallel, on a process pool or Ray "
                                 "(--executor ray --address ...; mimo_numerics.sweep; 'sweep --help')", add_help=False)
    sub.add_parser("train-demo", help="train one Mamba-3 MIMO layer under several policies with the FP64 gradient "
                                      "at every step (mimo_numerics/studies/training.py; 'train-demo --help')",
                   add_help=False)
    return parser


def _usage_error(parser) -> int:
    parser.print_usage(sys.stderr)
    raise CliError("missing action", f"see {parser.prog} --help")


def _run_report(argv: Sequence[str]) -> int:
    """``report``: the options of ``mimo_numerics.report.add_report_arguments`` (``--op`` among them)."""
    try:
        from . import report
    except ImportError as exc:
        raise CliError(f"the report subcommand is unavailable: mimo_numerics.report cannot be imported ({exc})",
                       "update mimo_numerics (report.py is part of the package)") from None
    parser = argparse.ArgumentParser(prog=f"{PROG} report", description="Write a report (mimo_numerics.report).")
    report.add_report_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        return int(report.run_report(args) or 0)
    except report.ReportError as exc:
        raise CliError(str(exc), exc.hint) from exc


def _hint_for(exc: BaseException) -> str:
    from .bundles import BundleError, OldSchemaError

    if isinstance(exc, BundleError) and str(exc).endswith("no such directory"):
        return "check the path"
    if isinstance(exc, OldSchemaError):
        return f"run: {PROG} upgrade {Path(exc.path).parent} --out NEW_DIR"
    if isinstance(exc, BundleError):
        return "the bundle is incomplete, corrupt or from a newer version; copy it again or re-create it"
    if isinstance(exc, ConnectionError) and "executor='ray'" in str(exc):
        return "check --address (host:port of the Ray head, ray://host:port for Ray Client) or --connect-timeout"
    if isinstance(exc, FileExistsError):
        return "pass --overwrite or choose another --out"
    if isinstance(exc, FileNotFoundError):
        return "check the path"
    if isinstance(exc, (NotADirectoryError, IsADirectoryError, PermissionError)):
        return "check the path and its permissions"
    name = type(exc).__name__
    if name == "PolicyUndefined":
        return f"{PROG} presets shows which operators each preset defines"
    if name in ("UpstreamUnavailable",):
        return "see docs/workflow.md (upstream on a GPU machine, offline wheel folder)"
    if name == "UpstreamUnsupported":
        return "an upstream limitation: run this shape with the reference or triton backend"
    if name == "UnsupportedPolicyError":
        return "the Triton kernels cannot express this policy: use --backend reference"
    if name == "SlowInterpreterError":
        return "pass --allow-slow-interpreter, use a smaller case, or run on cuda/npu"
    if isinstance(exc, ImportError):
        return "install the missing package (see pyproject extras: triton, npu, upstream)"
    return "rerun with --debug for the traceback"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``mimo-numerics`` console script and ``python -m mimo_numerics``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        rest = [a for a in argv if a != "--debug"]
        if rest and rest[0] == "report":
            return _run_report(rest[1:])
        if rest and rest[0] == "sweep":
            from . import sweep

            return int(sweep.main(rest[1:]) or 0)
        if rest and rest[0] == "train-demo":
            from .studies import training

            return int(training.main(rest[1:]) or 0)
        parser = build_parser()
        args = parser.parse_args(argv)
        args.argv = argv
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `mimo-numerics presets | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except SystemExit:
        raise
    except BaseException as exc:  # one line unless --debug
        if debug:
            traceback.print_exc()
        message = " ".join(str(exc).split()) or type(exc).__name__
        hint = exc.hint if isinstance(exc, CliError) else _hint_for(exc)
        if not isinstance(exc, (CliError, OSError, ValueError, TypeError, RuntimeError, ImportError,
                                NotImplementedError, KeyError)):
            message = f"{type(exc).__name__}: {message}"
        print(f"{PROG}: error: {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
