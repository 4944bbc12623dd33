#!/usr/bin/env python
"""Prove a change to the policy reference bit-identical: save sha256 digests of its outputs, then compare (not a test).

``save`` runs ``mimo_numerics.reference.mamba_mimo_bwd_fwd`` on every case of the ``smoke`` and ``gate`` grids, a
few ``sweep`` cases, the benchmark's headline shape and a few stress cases (inputs scaled to lp overflow and
subnormals, or with a NaN and infinities), under every preset plus a few custom policies that reach knob combinations no
preset has (float64 math with the switches on, ``round_outputs=False`` in float32, fp16 with float64 math). Each
case is drawn with the lp dtype of the policy it runs under. It writes one sha256 per output (and, for the small
cases, per ``record=`` stage tensor, with the list of stage names) to a JSON file, and the tensors themselves next
to it (``<baseline>.values/``) so that ``compare`` can count the differing elements.

``compare`` runs the current code on the same cases and policies and reports every mismatch as
``case  policy  output: N of M elements differ`` (stage records: ``record.<name>``; a missing or extra stage name
is reported too). ``vs-generic`` needs no baseline: it runs each case on the CPU fast path
(``reference.CPU_FAST_PATH``) and on the generic whole-tensor path and compares them the same way (and the outputs'
strides). Exit status 0 when everything matches, 1 otherwise.

Digests are of the raw bytes (dtype, shape and values; NaN payloads included), so this is a same-machine check:
FP32 GEMMs go through BLAS, whose bits may depend on the CPU and thread count. Run both modes on the same machine
with the same thread settings. The baseline belongs outside the repository or under the git-ignored ``out/``.

    python scripts/check_reference_bits.py save --baseline out/reference_bits.json       # with the old code
    python scripts/check_reference_bits.py compare --baseline out/reference_bits.json    # with the new code
    python scripts/check_reference_bits.py compare --quick   # smoke, gate and stress cases only (seconds)

Across a change of the input generator (issue 15 made it machine-independent), give both runs the same inputs:
``save --inputs-dir DIR`` with the new code writes them, the old commit's reference (this script copied into a
worktree of it) reads them, and ``compare --inputs-dir DIR`` checks the new code on them.
    python scripts/check_reference_bits.py vs-generic --quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch

import mimo_numerics as mn
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, grid, make_inputs
from mimo_numerics.policy import RoundingPolicy

from mimo_numerics.benchmark_cases import HEADLINE
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = ROOT / "out" / "reference_bits.json"
#: ``--inputs-dir``: where each case's inputs are read from (when stored there) or written to (when not).
INPUTS_DIR: Optional[Path] = None
#: Indices into the ``sweep`` grid that are run by default (the cheaper ones; each branch kind and fp16 covered).
DEFAULT_SWEEP = (0, 3, 4)


def _policies() -> Dict[str, RoundingPolicy]:
    """Every preset, then custom policies for knob combinations that no preset has."""
    out = {name: mn.presets.get(name) for name in mn.presets.names()}
    sm90, sm80 = mn.presets.get("upstream_sm90"), mn.presets.get("upstream_sm80")
    out["custom:sm90_f64"] = sm90.replace(math_dtype="float64")
    out["custom:sm80_f64"] = sm80.replace(math_dtype="float64")
    out["custom:sm90_fp16_f64"] = mn.presets.get("upstream_sm90_fp16").replace(math_dtype="float64")
    out["custom:sm90_unrounded_outputs"] = sm90.replace(round_outputs=False)
    out["custom:seed_bf16_f64_unrounded"] = mn.presets.get("seed_bf16").replace(math_dtype="float64",
                                                                                 round_outputs=False)
    return out


def _stress_inputs(spec: CaseSpec, kind: str) -> dict:
    """Inputs of ``spec`` pushed to the top (``"overflow"``) or bottom (``"subnormal"``) of the lp range, or with a
    NaN and two infinities (``"nan_inf"``)."""
    inputs = make_inputs(spec)
    lp = spec.lp_dtype
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


def _cases(quick: bool, sweep: Tuple[int, ...], headline: bool) -> List[Tuple[str, CaseSpec, Optional[str], bool]]:
    """(label, spec, stress kind or None, keep a stage record) for every case of the check."""
    out = [(f"smoke:{s.case_id}", s, None, True) for s in grid("smoke")]
    out += [(f"gate:{s.case_id}", s, None, True) for s in grid("gate")]
    gate = grid("gate")
    for kind in ("overflow", "subnormal", "nan_inf"):
        for base in (gate[1], gate[7]):  # roZD seed and foZD realistic
            out.append((f"stress-{kind}:{base.case_id}", base, kind, True))
    if not quick:
        sweep_grid = grid("sweep")
        out += [(f"sweep{i}:{sweep_grid[i].case_id}", sweep_grid[i], None, False) for i in sweep]
        if headline:
            out.append((f"headline:{HEADLINE.case_id}", HEADLINE, None, False))
    return out


def _digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _layout(t: torch.Tensor) -> tuple:
    """Strides of the dims of size > 1 (the strides of size-1 dims carry no layout)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n > 1)


def _count_differences(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape {a.dtype}{tuple(a.shape)} -> {b.dtype}{tuple(b.shape)}"
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differ = int((a.contiguous().view(ints) != b.contiguous().view(ints)).sum())
    return f"{differ} of {a.numel()} elements differ"


def _run(label: str, spec: CaseSpec, stress: Optional[str], keep_record: bool,
         policies: Dict[str, RoundingPolicy]) -> Iterator[Tuple[str, Dict[str, Optional[torch.Tensor]], list]]:
    """Yield (policy name, {entry: tensor or None}, record names) per policy; entries are outputs and record.*."""
    for pname, policy in policies.items():
        case = spec.replace(dtype=policy.lp_dtype)
        stored = INPUTS_DIR / f"{_safe(label)}__{policy.lp_dtype}.pt" if INPUTS_DIR is not None else None
        if stored is not None and stored.exists():
            inputs = torch.load(stored)
        else:
            inputs = _stress_inputs(case, stress) if stress else make_inputs(case)
            if stored is not None:
                torch.save(inputs, stored)
        record = {} if keep_record else None
        threads = torch.get_num_threads()
        outputs = stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy,
                                                  record=record)
        if torch.get_num_threads() != threads:
            raise RuntimeError(f"{label} {pname}: the reference changed torch's thread count "
                               f"({threads} -> {torch.get_num_threads()})")
        entries = dict(outputs.as_dict())
        for name, value in (record or {}).items():
            entries[f"record.{name}"] = value
        yield pname, entries, list(record) if keep_record else []


def _values_dir(baseline: Path) -> Path:
    return baseline.with_name(baseline.name + ".values")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _value_file(baseline: Path, label: str, pname: str) -> Path:
    return _values_dir(baseline) / f"{_safe(label + '__' + pname)}.pt"


def save(args, cases, policies) -> int:
    baseline = Path(args.baseline)
    baseline.parent.mkdir(parents=True, exist_ok=True)
    if not args.no_values:
        _values_dir(baseline).mkdir(parents=True, exist_ok=True)
    data = {"torch": torch.__version__, "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "cases": {}}
    for label, spec, stress, keep in cases:
        start = time.perf_counter()
        per_case = data["cases"][label] = {}
        for pname, entries, record_names in _run(label, spec, stress, keep, policies):
            per_case[pname] = {"digests": {k: (None if v is None else _digest(v)) for k, v in entries.items()},
                               "record_names": record_names}
            if not args.no_values:
                torch.save({k: v.contiguous().clone() for k, v in entries.items() if v is not None},
                           _value_file(baseline, label, pname))
        print(f"saved {label} ({time.perf_counter() - start:.1f} s)", flush=True)
    baseline.write_text(json.dumps(data, indent=1))
    print(f"wrote {baseline}")
    return 0


def compare(args, cases, policies) -> int:
    baseline = Path(args.baseline)
    data = json.loads(baseline.read_text())
    if data.get("threads") != torch.get_num_threads():
        print(f"warning: baseline saved with {data.get('threads')} threads, now {torch.get_num_threads()}")
    mismatches, checked = [], 0
    for label, spec, stress, keep in cases:
        start = time.perf_counter()
        if label not in data["cases"]:
            print(f"skip {label}: not in the baseline")
            continue
        for pname, entries, record_names in _run(label, spec, stress, keep, policies):
            saved = data["cases"][label].get(pname)
            if saved is None:
                print(f"skip {label} {pname}: not in the baseline")
                continue
            if record_names != saved["record_names"]:
                mismatches.append(f"{label}  {pname}  record names: {saved['record_names']} -> {record_names}")
            stored = None
            for key in sorted(set(saved["digests"]) | set(entries)):
                checked += 1
                old = saved["digests"].get(key, "absent")
                value = entries.get(key, "absent")
                new = value if isinstance(value, str) else (None if value is None else _digest(value))
                if old == new:
                    continue
                detail = f"{old!r:.12} -> {new!r:.12}"
                if isinstance(value, torch.Tensor) and old not in (None, "absent"):
                    path = _value_file(baseline, label, pname)
                    if stored is None and path.exists():
                        stored = torch.load(path)
                    detail = (_count_differences(stored[key], value) if stored is not None and key in stored
                              else "digest differs (no stored values to count)")
                mismatches.append(f"{label}  {pname}  {key}: {detail}")
        print(f"checked {label} ({time.perf_counter() - start:.1f} s)", flush=True)
    for line in mismatches:
        print("MISMATCH", line)
    print(f"{checked} tensors compared, {len(mismatches)} mismatches")
    return 1 if mismatches else 0


def vs_generic(args, cases, policies) -> int:
    """Run every case twice, on the CPU fast path and on the generic whole-tensor path, and compare the bits."""
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference

    mismatches, checked = [], 0
    for label, spec, stress, keep in cases:
        start = time.perf_counter()
        saved = reference.CPU_FAST_PATH
        try:
            reference.CPU_FAST_PATH = False
            generic = list(_run(label, spec, stress, keep, policies))
        finally:
            reference.CPU_FAST_PATH = saved
        fast = list(_run(label, spec, stress, keep, policies))
        for (pname, want, want_names), (_, got, got_names) in zip(generic, fast):
            if want_names != got_names:
                mismatches.append(f"{label}  {pname}  record names: {want_names} -> {got_names}")
            for key in sorted(set(want) | set(got)):
                checked += 1
                a, b = want.get(key, "absent"), got.get(key, "absent")
                if a is None and b is None:
                    continue
                if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
                    mismatches.append(f"{label}  {pname}  {key}: {type(a).__name__} -> {type(b).__name__}")
                elif _digest(a) != _digest(b):
                    mismatches.append(f"{label}  {pname}  {key}: {_count_differences(a, b)}")
                elif not key.startswith("record.") and _layout(a) != _layout(b):
                    mismatches.append(f"{label}  {pname}  {key}: strides {a.stride()} -> {b.stride()}")
        print(f"checked {label} ({time.perf_counter() - start:.1f} s)", flush=True)
    for line in mismatches:
        print("MISMATCH", line)
    print(f"{checked} tensors compared, {len(mismatches)} mismatches")
    return 1 if mismatches else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("save", "compare", "vs-generic"),
                        help="save a baseline, compare against one, or compare the CPU fast path with the generic "
                             "whole-tensor path of the current code (no baseline needed)")
    parser.add_argument("--baseline", default=str(DEFAULT_BASELINE),
                        help=f"digest JSON file (default {DEFAULT_BASELINE.relative_to(ROOT)}, git-ignored)")
    parser.add_argument("--quick", action="store_true", help="smoke, gate and stress cases only")
    parser.add_argument("--no-headline", action="store_true", help="leave out the headline shape (the slow case)")
    parser.add_argument("--sweep", default=",".join(map(str, DEFAULT_SWEEP)),
                        help="comma-separated indices into the sweep grid ('' for none; default %(default)s)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated subset of the policy names (presets and custom:*; default all)")
    parser.add_argument("--no-values", action="store_true",
                        help="save: store digests only (compare then cannot count differing elements)")
    parser.add_argument("--block-elements", type=int, default=None,
                        help="set mimo_numerics.reference_cpu.BLOCK_ELEMENTS (the target block size of the CPU fast "
                             "path); every value must give the same bits")
    parser.add_argument("--block-chunks", type=int, default=None,
                        help="set mimo_numerics.reference_cpu.BLOCK_CHUNKS (chunks per block; 1 gives the most "
                             "blocks, which exercises the blocking on the small cases)")
    parser.add_argument("--inputs-dir", type=Path, default=None,
                        help="read each case's inputs from this directory, writing those it lacks (torch.save "
                             "files). With it, a baseline can be saved by a commit whose input generator differs: "
                             "save the inputs with the current code, then run the old commit's reference on them")
    parser.add_argument("--list", action="store_true", help="print the cases and policies and exit")
    args = parser.parse_args(argv)
    if args.inputs_dir is not None:
        global INPUTS_DIR
        INPUTS_DIR = args.inputs_dir
        INPUTS_DIR.mkdir(parents=True, exist_ok=True)

    if args.block_elements is not None or args.block_chunks is not None:
        from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference_cpu

        if args.block_elements is not None:
            reference_cpu.BLOCK_ELEMENTS = args.block_elements
        if args.block_chunks is not None:
            reference_cpu.BLOCK_CHUNKS = args.block_chunks
    policies = _policies()
    if args.policies:
        wanted = args.policies.split(",")
        unknown = [p for p in wanted if p not in policies]
        if unknown:
            parser.error(f"--policies: unknown name(s) {unknown}; known: {list(policies)}")
        policies = {p: policies[p] for p in wanted}
    sweep = tuple(int(i) for i in args.sweep.split(",") if i.strip())
    cases = _cases(args.quick, sweep, not args.no_headline)
    if args.list:
        print("\n".join(label for label, *_ in cases))
        print("policies:", ", ".join(policies))
        return 0
    return {"save": save, "compare": compare, "vs-generic": vs_generic}[args.mode](args, cases, policies)


if __name__ == "__main__":
    raise SystemExit(main())
