#!/usr/bin/env python
"""Regenerate the golden upstream data on a CUDA GPU and write it as a result bundle.

Two case sets:

* ``seed``: the test cases of the seed PR (the 15 of ``tests/data/upstream_h200_seed_cases.pt`` under their golden
  names, plus the two ``C·R = 18`` cases upstream refuses, which are recorded as skipped), with the inputs stored in
  the golden file (drawn by the seed PR test's ``torch.randn`` under torch 2.11, whose bits depend on the CPU, so they
  are not regenerated); cases the file lacks take the seed formula (``cases.spec_from_seed_kwargs``);
* ``realistic``: ``cases.grid("sweep")``, the upstream-test input formula (``formula="realistic"``) at S up to 2048.

Every case runs ``--repeat`` times (default 2) and must give identical bits (recorded per case as
``meta.repeat_identical``). With ``--golden`` (default: the repository's golden file when present) the seed cases'
inputs and outputs are checked bit for bit against it. Exit status: 0 when everything reproduced, 1 when a case failed
(recorded as skipped with ``meta.error``), was not reproducible or differs from the golden file (the bundle is still
written), 2 when nothing could run (no CUDA, no TileLang, no source).

Cases are grouped by the kernel's compile-time configuration and the groups run in parallel processes (``--jobs``),
so the TileLang compilations (tens of seconds each) overlap; ``--jobs 1`` runs everything in this process.

Usage (on the GPU machine, after ``. scripts/use_upstream_wheels.sh`` when it has no package registry)::

    python golden/make_golden.py --out out/upstream_h200 [--sets seed,realistic] [--only GLOB] [--repeat 2]
        [--golden tests/data/upstream_h200_seed_cases.pt | --no-golden] [--upstream-src DIR] [--jobs 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import fnmatch
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import torch

from mimo_numerics import cases, envinfo
from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream
from mimo_numerics.bundles import (BundleCase, bit_identical, decode_safetensors, encode_safetensors,
                                   save_bundle)
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES, MimoBwdFwdOutputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

#: The seed PR's test cases: golden name -> keyword arguments of its ``_make_inputs``.
SEED_CASES = {
    "seed_branch_ro1_z0_d0": {"reduce_o": True, "has_z": False, "has_d": False},
    "seed_branch_ro1_z1_d1": {"reduce_o": True, "has_z": True, "has_d": True},
    "seed_branch_ro0_z0_d1": {"reduce_o": False, "has_z": False, "has_d": True},
    "seed_branch_ro0_z1_d0": {"reduce_o": False, "has_z": True, "has_d": False},
    "seed_gqa": {"heads": 2, "groups": 1, "has_z": True, "has_d": True},
    "seed_tail_seed0": {"seed": 0, "seqlen": 35, "heads": 2, "has_z": True, "has_d": True},
    "seed_tail_seed1": {"seed": 1, "seqlen": 35, "heads": 2, "has_z": True, "has_d": True},
    "seed_tail_seed42": {"seed": 42, "seqlen": 35, "heads": 2, "has_z": True, "has_d": True},
    "seed_batch_groups": {"batch": 2, "heads": 4, "groups": 2, "seqlen": 20, "has_z": True, "has_d": True},
    "seed_non_pow2_fused_tail": {"seqlen": 13, "rank": 3, "chunk_size": 6, "has_z": True, "has_d": True},
    "seed_tail_chunk": {"seqlen": 20, "has_z": True, "has_d": True},
    "seed_shape_N32_P64_R4_C16": {"seqlen": 32, "state_dim": 32, "value_dim": 64, "rank": 4, "chunk_size": 16},
    "seed_shape_N128_P32_R4_C16": {"seqlen": 32, "state_dim": 128, "value_dim": 32, "rank": 4, "chunk_size": 16},
    "seed_shape_N64_P128_R4_C16": {"seqlen": 32, "state_dim": 64, "value_dim": 128, "rank": 4, "chunk_size": 16},
    "seed_shape_N128_P64_R8_C8": {"seqlen": 16, "state_dim": 128, "value_dim": 64, "rank": 8, "chunk_size": 8},
    "seed_shape_N64_P64_R3_C6": {"seqlen": 12, "state_dim": 64, "value_dim": 64, "rank": 3, "chunk_size": 6},
    "seed_shape_N64_P64_R1_C64": {"seqlen": 128, "state_dim": 64, "value_dim": 64, "rank": 1, "chunk_size": 64},
}
SETS = ("seed", "realistic")


def case_list(sets, only):
    """``[(name, spec, set)]`` of the requested sets, filtered by ``only`` globs."""
    out = []
    if "seed" in sets:
        out += [(name, cases.spec_from_seed_kwargs(kw), "seed") for name, kw in SEED_CASES.items()]
    if "realistic" in sets:
        out += [(spec.case_id, spec, "realistic") for spec in stage1_cases.grid("sweep")]
    if only:
        out = [c for c in out if any(fnmatch.fnmatchcase(c[0], g) for g in only)]
    return out


def _config_key(spec):
    """The compile-time configuration of the upstream kernel for ``spec`` (one TileLang compilation each)."""
    return (spec.state_dim, spec.value_dim, spec.rank, spec.has_z, spec.has_d, spec.reduce_o, spec.chunk_size,
            spec.rotary_dim_divisor, spec.dtype)


def case_inputs(name, spec, golden):
    """The stored inputs of golden case ``name`` when ``golden`` (a loaded golden dict or None) has it, else the
    inputs ``cases.make_inputs`` draws for ``spec``."""
    if golden is not None and name in golden:
        return dict(golden[name]["inputs"])
    return stage1_cases.make_inputs(spec, "cpu")


def _load_golden(path):
    return torch.load(path, weights_only=True) if path else None


def run_case(spec, inputs, device, repeat, source_dir):
    """Run one case ``repeat`` times: ``(outputs | None, skipped | None, meta)``."""
    dev = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    runs, meta, skipped = [], {}, None
    t0 = time.perf_counter()
    for _ in range(repeat):
        try:
            out = upstream.mamba_mimo_bwd_fwd(*stage1_cases.as_args(dev), **stage1_cases.as_kwargs(dev), source_dir=source_dir)
        except upstream.UpstreamUnsupported as exc:
            skipped = str(exc)
            break
        except Exception as exc:  # keep the other cases; reported and counted as a failure
            skipped = f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:2000]}"
            meta["error"] = True
            break
        torch.cuda.synchronize()
        runs.append(MimoBwdFwdOutputs(*(None if t is None else t.detach().cpu() for t in out)))
        meta["upstream_launch"] = dict(upstream.last_launch)
    meta["wall_s"] = round(time.perf_counter() - t0, 4)
    outputs = runs[0] if runs else None
    if runs:
        meta["repeats"] = len(runs)
        meta["repeat_identical"] = all(bit_identical(x, y) for r in runs[1:] for x, y in zip(runs[0], r))
        nan_outputs = [n for n, t in zip(OUTPUT_NAMES, outputs) if t is not None and torch.isnan(t).any()]
        if nan_outputs:
            meta["outputs_with_nan"] = nan_outputs
    return outputs, skipped, meta


def _run_group(items, device, repeat, source_dir, golden_path):
    """Worker: run ``[(name, spec_dict)]`` sharing one kernel configuration; outputs travel as safetensors bytes."""
    results = []
    t0 = time.perf_counter()
    golden = _load_golden(golden_path)
    for name, spec_dict in items:
        spec = cases.CaseSpec.from_dict(spec_dict)
        outputs, skipped, meta = run_case(spec, case_inputs(name, spec, golden), device, repeat, source_dir)
        data = None
        if outputs is not None:
            data = encode_safetensors({n: t for n, t in outputs._asdict().items() if t is not None})
        results.append((name, data, skipped, meta))
    return results, time.perf_counter() - t0


def run_all(todo, device, repeat, source_dir, jobs, golden_path=None):
    """``{name: (outputs, skipped, meta)}`` for ``todo``; with ``jobs > 1`` one process per kernel configuration
    (each compiles its kernel once; the compilations run in parallel)."""
    groups = {}
    for name, spec, _ in todo:
        groups.setdefault(_config_key(spec), []).append((name, spec.to_dict()))
    results = {}

    def collect(batch):
        for name, data, skipped, meta in batch:
            outputs = None
            if data is not None:
                tensors = decode_safetensors(data)[0]
                outputs = MimoBwdFwdOutputs(**{n: tensors.get(n) for n in OUTPUT_NAMES})
            results[name] = (outputs, skipped, meta)
            status = ("ERROR " + skipped if meta.get("error") else "skipped" if skipped else
                      "ok" if meta.get("repeat_identical") else "NOT REPRODUCIBLE")
            print(f"  {name}: {status} ({meta['wall_s']:.2f}s)", file=sys.stderr)

    print(f"running {len(todo)} case(s) in {len(groups)} kernel configuration(s), {jobs} process(es)", file=sys.stderr)
    if jobs <= 1:
        for items in groups.values():
            collect(_run_group(items, device, repeat, source_dir, golden_path)[0])
        return results
    with cf.ProcessPoolExecutor(max_workers=min(jobs, len(groups)), mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_run_group, items, device, repeat, source_dir, golden_path)
                   for items in groups.values()]
        for future in cf.as_completed(futures):
            batch, seconds = future.result()
            print(f"configuration done in {seconds:.1f}s", file=sys.stderr)
            collect(batch)
    return results


def check_against_golden(results, golden_path):
    """Print and return ``({name: problem}, number checked)`` for seed cases that differ from the golden file."""
    golden = torch.load(golden_path, weights_only=True)
    problems, checked = {}, 0
    for name, inputs, outputs, skipped in results:
        if name not in golden:
            continue
        checked += 1
        item = golden[name]
        bad_in = [n for n in INPUT_NAMES if not bit_identical(inputs[n], item["inputs"].get(n))]
        if bad_in:
            problems[name] = f"inputs differ from the golden file: {bad_in}"
            continue
        if outputs is None:
            problems[name] = f"no outputs ({skipped})"
            continue
        bad_out = [n for n in OUTPUT_NAMES if not bit_identical(getattr(outputs, n), item["upstream"].get(n))]
        if bad_out:
            problems[name] = f"outputs not bit-identical to the golden file: {bad_out}"
    for name, problem in problems.items():
        print(f"GOLDEN MISMATCH {name}: {problem}")
    print(f"golden check: {checked - len(problems)}/{checked} seed case(s) bit-identical to {golden_path}")
    return problems, checked


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="bundle directory to write")
    parser.add_argument("--sets", default="seed,realistic", help=f"comma-separated subset of {SETS}")
    parser.add_argument("--only", action="append", metavar="GLOB", help="keep only matching case names")
    parser.add_argument("--repeat", type=int, default=2, help="runs per case; all must agree bit for bit")
    default_golden = REPO / "tests" / "data" / "upstream_h200_seed_cases.pt"
    parser.add_argument("--golden", default=str(default_golden) if default_golden.is_file() else None,
                        help="golden .pt file to check the seed cases against (default: the repository's)")
    parser.add_argument("--no-golden", action="store_true", help="skip the golden check")
    parser.add_argument("--upstream-src", help="mamba-ssm source (default: $MIMO_NUMERICS_UPSTREAM_SRC, ...)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="processes (one kernel configuration each)")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)

    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = sorted(set(sets) - set(SETS))
    if unknown:
        parser.error(f"unknown set(s) {unknown}; choose from {SETS}")
    if Path(args.out).exists() and not args.overwrite:
        parser.error(f"{args.out} already exists (pass --overwrite)")
    upstream.check_cuda(args.device)
    info = upstream.source_info(args.upstream_src)
    upstream.load_upstream(args.upstream_src)  # fail early on missing packages
    todo = case_list(sets, args.only)
    if not todo:
        parser.error("no case selected")
    t0 = time.perf_counter()
    golden_path = args.golden if args.golden and not args.no_golden else None
    outcome = run_all(todo, args.device, args.repeat, args.upstream_src, args.jobs, golden_path)
    golden = _load_golden(golden_path)

    versions = envinfo.versions()
    versions["mamba_ssm"] = info.get("mamba_ssm", "?")
    device_name = envinfo.device_name(args.device)
    bundle_cases, results = [], []
    for name, spec, set_name in todo:
        outputs, skipped, meta = outcome[name]
        meta.update(set=set_name, upstream_source=info)
        stored = golden is not None and name in golden
        meta["inputs_from"] = "golden file" if stored else "cases.make_inputs"
        bundle_cases.append(BundleCase(name=name, inputs=case_inputs(name, spec, golden), outputs=outputs,
                                       spec={"formula": "seed", "kw": SEED_CASES[name]} if stored else spec,
                                       policy=None, backend="upstream", device=args.device, device_name=device_name,
                                       versions=versions, skipped=skipped, meta=meta))
        results.append((name, bundle_cases[-1].inputs, outputs, skipped))
    print(f"all cases done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    problems, checked = {}, 0
    if args.golden and not args.no_golden and "seed" in sets:
        problems, checked = check_against_golden(results, args.golden)
    not_repro = [c.name for c in bundle_cases if c.outputs is not None and not c.meta.get("repeat_identical")]
    errors = [c.name for c in bundle_cases if c.meta.get("error")]
    meta = {"command": " ".join(sys.argv), "sets": sets, "repeat": args.repeat, "device_name": device_name,
            "golden_checked": checked, "golden_mismatches": problems, "not_reproducible": not_repro,
            "errors": errors}
    save_bundle(args.out, bundle_cases, meta=meta, overwrite=args.overwrite)
    skipped = sum(c.outputs is None for c in bundle_cases)
    print(f"wrote {args.out}: {len(bundle_cases)} case(s), {skipped} skipped ({len(errors)} by errors); "
          f"{len(not_repro)} not reproducible; {len(problems)} golden mismatch(es)")
    return 1 if problems or not_repro or errors else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except upstream.UpstreamError as exc:
        print(f"make_golden: error: {exc}", file=sys.stderr)
        sys.exit(2)
