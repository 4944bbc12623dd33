#!/usr/bin/env python
"""Run upstream's whole ``mamba3_mimo`` op (forward and backward) on a CUDA GPU and write golden-format data.

Two case sets:

* ``stored``: the 7 cases of ``tests/data/upstream_h200_full_op_cases.pt`` (``--golden``), from their stored
  inputs; every captured tensor is compared bit for bit with the stored one (this checks the capture of
  :mod:`mimo_numerics.ops.mamba3_mimo.upstream` against the data it must reproduce). Nothing is written for them.
* ``extra``: :data:`EXTRA_CASES` (R = 1, R = 8, fp16, a forward tail S % C != 0, G = H with N = 32 and no reduction),
  inputs from :func:`mimo_numerics.ops.mamba3_mimo.cases.make_op_inputs`; written to ``--out`` as one ``.pt`` in
  the golden format (plus ``kw``, ``spec``, ``versions``, ``device_name``, ``refused`` where upstream refuses).
* ``long``: :data:`LONG_CASES` (S = 2048 and 8192), every output as a sampled record (:func:`sampled_result`),
  written to ``--long-out`` without the inputs (regenerated from ``spec``).
* ``parity``: :data:`PARITY_CASES`, ``return_state`` and varlen (``cu_seqlens``) runs, written to ``--parity-out``
  in the same format plus ``return_state``, ``cu_seqlens`` and ``state`` (the four final-state tensors); a varlen
  case has no ``bwd_fwd``/``bwd_bwd`` (upstream's varlen kernels are not captured).

Every case runs ``--repeat`` times and must give identical bits. Cases are grouped by the kernels' compile-time
configuration and the groups run in parallel processes (``--jobs``), so TileLang's compilations (about 100 s per
configuration for the three kernels) overlap. With ``--sass DIR`` the SASS of every compiled TileLang kernel found
in TileLang's cache is written there (``cuobjdump --dump-sass``), with the generated CUDA sources.

Usage (on the GPU machine, after ``. scripts/use_upstream_wheels.sh``)::

    python golden/make_golden_full_op.py --out out/full_op_extra.pt [--sets stored,extra,parity] [--repeat 2]
        [--jobs 8] [--parity-out out/full_op_parity.pt]
        [--golden tests/data/upstream_h200_full_op_cases.pt] [--sass out/sass] [--upstream-src DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import io
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import torch

from mimo_numerics import envinfo, golden_samples
from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream
from mimo_numerics.ops.mamba3_mimo import upstream as op_upstream
from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs

#: New cases for the forward and stage-2 gates (name -> spec).
EXTRA_CASES = {
    # R = 1 with C = 16 does not compile in the forward (TileLang 0.1.8: "m_warp * n_warp must equal num_warps");
    # upstream recommends C = 64 / R
    "x_B1_S128_H2_N64_P64_R1_C64_zdo": OpCaseSpec(seqlen=128, rank=1, chunk_size=64, seed=201),
    "x_B1_S64_H2_N64_P64_R8_C8_zdo": OpCaseSpec(seqlen=64, rank=8, chunk_size=8, seed=202),
    "x_B1_S64_H2_N64_P64_R4_C16_zdo_fp16": OpCaseSpec(seqlen=64, dtype="float16", seed=203),
    "x_B1_S56_H2_N64_P64_R4_C16_zdo_tail": OpCaseSpec(seqlen=56, seed=204),
    "x_B2_S64_H2_G2_N32_P64_R2_C32_nored_z": OpCaseSpec(batch=2, seqlen=64, groups=2, state_dim=32, rank=2,
                                                         chunk_size=32, reduce_o=False, has_d=False, seed=205),
}
#: Upstream-parity cases (issue 25): name -> (spec, return_state, sequence lengths for ``cu_seqlens`` or None).
#: The varlen lengths are not multiples of C (tail chunks inside the packed row) and include length-1 sequences;
#: a varlen case packs them in one row (B = 1, S = their sum). Written to ``--parity-out``.
PARITY_CASES = {
    "p_rs_B2_S64_H2_N64_P64_R4_C16_zdo": (OpCaseSpec(batch=2, seqlen=64, seed=301), True, None),
    "p_rs_B1_S64_H2_G2_N32_P64_R2_C32_nored_z_fp16": (
        OpCaseSpec(seqlen=64, groups=2, state_dim=32, rank=2, chunk_size=32, reduce_o=False, has_d=False,
                   dtype="float16", seed=302), True, None),
    "p_vl_S219_N64_P64_R4_C16_zdo": (OpCaseSpec(seqlen=219, seed=303), True, (31, 77, 48, 63)),
    "p_vl_S109_G2_N32_P64_R2_C32_nored_z": (
        OpCaseSpec(seqlen=109, groups=2, state_dim=32, rank=2, chunk_size=32, reduce_o=False, has_d=False,
                   seed=304), True, (1, 45, 32, 1, 30)),
    "p_vl_S219_N64_P64_R4_C16_zdo_nostate": (OpCaseSpec(seqlen=219, seed=305), False, (31, 77, 48, 63)),
}
#: Long cases (issue 24: the FP32-level drift that grows with S), written to ``--long-out`` as sampled records
#: (``mimo_numerics.golden_samples``: 4096 values per output tensor, every kernel's outputs; inputs regenerated
#: from the spec): a reduced bf16 case and a non-reduced fp16 case at S = 2048 and at S = 8192.
LONG_CASES = {
    "l_B1_S2048_H2_N64_P64_R4_C16_zdo": OpCaseSpec(seqlen=2048, seed=501),
    "l_B1_S2048_H2_N64_P64_R4_C16_nored_z_fp16": OpCaseSpec(seqlen=2048, reduce_o=False, has_d=False,
                                                            dtype="float16", seed=502),
    "l_B1_S8192_H2_N64_P64_R4_C16_zdo": OpCaseSpec(seqlen=8192, seed=503),
    "l_B1_S8192_H2_N64_P64_R4_C16_nored_z_fp16": OpCaseSpec(seqlen=8192, reduce_o=False, has_d=False,
                                                            dtype="float16", seed=504),
}
SETS = ("stored", "extra", "parity", "long")
#: The sections of a golden result that hold tensors by name.
_SECTIONS = ("autograd", "pre", "fwd", "bwd_fwd", "bwd_bwd", "post")


def sampled_result(result: dict, seed: int) -> dict:
    """A golden-format result with every tensor replaced by its sampled record (``golden_samples.summarize``, one
    seed per tensor: ``seed * 1000 +`` its index in section and name order); other entries kept."""
    out, index = {}, 0
    for key, value in result.items():
        if key not in _SECTIONS or value is None:
            out[key] = value
            continue
        out[key] = {}
        for name in sorted(value):
            tensor = value[name]
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                out[key][name] = golden_samples.summarize(tensor, seed * 1000 + index)
                index += 1
            else:
                out[key][name] = tensor
    return out


def _config_key(inputs):
    q, v = inputs["Q"], inputs["V"]
    return (q.shape[-1], v.shape[-1], q.shape[2], inputs["chunk_size"], inputs["rotary_dim_divisor"],
            inputs["Z"] is not None, inputs["D"] is not None, inputs["MIMO_Out"] is not None, str(q.dtype))


def _to_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _cu_seqlens(lengths):
    """``[0, l0, l0 + l1, ...]`` as int32 (upstream's varlen offsets), or None."""
    if lengths is None:
        return None
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=torch.int32)


def _run_group(items, repeat, source_dir):
    """Worker: ``[(name, inputs_bytes, backward, options)]`` sharing one configuration -> ``[(name, result_bytes,
    meta)]``; ``options``: ``run_whole_op``'s ``return_state`` and the varlen lengths (``seqlens``)."""
    out = []
    for name, data, backward, options in items:
        inputs = torch.load(io.BytesIO(data), weights_only=True)
        runs, t0 = [], time.perf_counter()
        for _ in range(repeat):
            runs.append(op_upstream.run_whole_op(inputs, backward=backward, source_dir=source_dir,
                                                 return_state=options.get("return_state", False),
                                                 cu_seqlens=_cu_seqlens(options.get("seqlens"))))
        meta = {"wall_s": round(time.perf_counter() - t0, 2), "repeats": repeat,
                "repeat_differs": sorted({p for r in runs[1:] for p in op_upstream.identical(runs[0], r)})}
        out.append((name, _to_bytes(runs[0]), meta))
    return out


def _dump_sass(target: Path) -> int:
    """SASS and CUDA sources of the TileLang kernels in its cache; returns the number of binaries dumped."""
    target.mkdir(parents=True, exist_ok=True)
    roots = [Path(os.environ.get("TILELANG_CACHE_DIR", "")), Path.home() / ".tilelang"]
    count, listing = 0, []
    for root in roots:
        if not str(root) or not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if not path.is_file():
                continue
            listing.append(f"{path.stat().st_size:>10} {path}")
            if path.suffix == ".cu":
                shutil.copy(path, target / f"{path.parent.name}_{path.name}")
            elif path.suffix not in (".py", ".json", ".txt", ".lock", ".cuh", ".h"):
                text = subprocess.run(["cuobjdump", "--dump-sass", str(path)], capture_output=True, text=True)
                if text.stdout.strip():
                    count += 1
                    (target / f"{count:02d}_{path.parent.name}_{path.name}.sass").write_text(text.stdout)
                else:
                    listing.append(f"    cuobjdump: {text.stderr.strip()[:200]}")
    (target / "cache_listing.txt").write_text("\n".join(listing) + "\n")
    return count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the .pt file for the extra cases")
    parser.add_argument("--parity-out", help="the .pt file for the parity cases (return_state, varlen)")
    parser.add_argument("--long-out", help="the .pt file for the long cases (sampled records)")
    parser.add_argument("--sets", default="stored,extra")
    parser.add_argument("--golden", default=str(REPO / "tests" / "data" / "upstream_h200_full_op_cases.pt"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--sass", help="folder for the SASS of the compiled kernels")
    parser.add_argument("--upstream-src")
    parser.add_argument("--report", help="a JSON summary file")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only these extra cases")
    parser.add_argument("--save-stored", help="also save the reruns of the stored cases (golden format) here")
    args = parser.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    if "extra" in sets and not args.out:
        parser.error("--out is needed for the extra set")
    if "parity" in sets and not args.parity_out:
        parser.error("--parity-out is needed for the parity set")
    if "long" in sets and not args.long_out:
        parser.error("--long-out is needed for the long set")
    unknown = sorted(set(sets) - set(SETS))
    if unknown:
        parser.error(f"unknown set(s) {unknown}; sets: {', '.join(SETS)}")
    upstream.check_cuda("cuda")
    op_upstream.load(args.upstream_src)  # fail early on missing packages

    todo = []  # (name, inputs, backward, set, options)
    golden = torch.load(args.golden, weights_only=True) if "stored" in sets else {}
    for name, case in golden.items():
        todo.append((name, case["inputs"], True, "stored", {}))
    if "extra" in sets:
        for name, spec in EXTRA_CASES.items():  # the backward of a tail case is tried too: its refusal is recorded
            if args.only and name not in args.only:
                continue
            todo.append((name, make_op_inputs(spec), True, "extra", {}))
    if "parity" in sets:
        for name, (spec, return_state, seqlens) in PARITY_CASES.items():
            if args.only and name not in args.only:
                continue
            todo.append((name, make_op_inputs(spec), True, "parity",
                         {"return_state": return_state, "seqlens": seqlens}))
    if "long" in sets:
        for name, spec in LONG_CASES.items():
            if args.only and name not in args.only:
                continue
            todo.append((name, make_op_inputs(spec), True, "long", {}))
    groups = {}
    for name, inputs, backward, _, options in todo:  # return_state and varlen compile other kernels
        key = _config_key(inputs) + (options.get("return_state", False), options.get("seqlens") is not None)
        groups.setdefault(key, []).append((name, _to_bytes(inputs), backward, options))
    print(f"{len(todo)} case(s) in {len(groups)} configuration(s), {args.jobs} process(es)", file=sys.stderr)
    t0 = time.perf_counter()
    results = {}
    with cf.ProcessPoolExecutor(max_workers=max(1, min(args.jobs, len(groups))),
                                mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_run_group, items, args.repeat, args.upstream_src) for items in groups.values()]
        for future in cf.as_completed(futures):
            for name, data, meta in future.result():
                results[name] = (torch.load(io.BytesIO(data), weights_only=True), meta)
                print(f"  {name}: {meta['wall_s']}s, repeat differs: {meta['repeat_differs'] or 'none'}",
                      file=sys.stderr)
    print(f"all done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    # plain strings: torch's TorchVersion would make the files unloadable with weights_only=True
    summary = {"versions": {k: str(v) for k, v in envinfo.versions().items()},
               "device_name": envinfo.device_name("cuda"), "cases": {}}
    for name, inputs, _, set_name, _ in todo:
        result, meta = results[name]
        entry = {"set": set_name, **meta, "refused": result.get("refused"),
                 "recompute_mismatch": result.get("recompute_mismatch")}
        if set_name == "stored":
            stored = {k: golden[name][k] for k in ("autograd", "pre", "fwd", "bwd_fwd", "bwd_bwd", "post")}
            entry["differs_from_golden"] = op_upstream.identical(stored, {k: result.get(k) for k in stored})
        summary["cases"][name] = entry
    if args.save_stored:
        torch.save({name: results[name][0] for name, _, _, set_name, _ in todo if set_name == "stored"},
                   args.save_stored)
    def entry(spec, result, meta, **more):
        kw = {"seed": spec.seed, "B": spec.batch, "S": spec.seqlen, "H": spec.heads, "G": spec.groups,
              "N": spec.state_dim, "P": spec.value_dim, "R": spec.rank, "C": spec.chunk_size,
              "reduce_o": spec.reduce_o, "has_z": spec.has_z, "has_d": spec.has_d, "formula": spec.formula,
              "dtype": spec.dtype}
        return {"kw": kw, "spec": spec.to_dict(), "inputs": make_op_inputs(spec), **more, **result,
                "repeat_differs": meta["repeat_differs"], "versions": summary["versions"],
                "device_name": summary["device_name"]}

    if "extra" in sets:
        extra = {name: entry(spec, *results[name]) for name, spec in EXTRA_CASES.items() if name in results}
        torch.save(extra, args.out)
        print(f"wrote {args.out}: {len(extra)} case(s)", file=sys.stderr)
    if "parity" in sets:
        parity = {name: entry(spec, *results[name], return_state=return_state, cu_seqlens=_cu_seqlens(seqlens))
                  for name, (spec, return_state, seqlens) in PARITY_CASES.items() if name in results}
        torch.save(parity, args.parity_out)
        print(f"wrote {args.parity_out}: {len(parity)} case(s)", file=sys.stderr)
    if "long" in sets:
        long_cases = {}
        for name, spec in LONG_CASES.items():
            if name not in results:
                continue
            result, meta = results[name]
            record = entry(spec, sampled_result(result, spec.seed), meta)
            del record["inputs"]  # regenerated from the spec (make_op_inputs is machine-independent)
            long_cases[name] = record
        torch.save(long_cases, args.long_out)
        print(f"wrote {args.long_out}: {len(long_cases)} case(s)", file=sys.stderr)
    if args.sass:
        summary["sass_binaries"] = _dump_sass(Path(args.sass))
    text = json.dumps(summary, indent=1, default=str)
    if args.report:
        Path(args.report).write_text(text)
    print(text)
    bad = [n for n, e in summary["cases"].items() if e.get("repeat_differs") or e.get("differs_from_golden")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
