#!/usr/bin/env python
"""How the upstream kernel propagates NaN/±Inf, against the reference and the rules of docs/nonfinite.md.

For every golden case (``tests/data/upstream_h200_seed_cases.pt``), every input present in it, every value in
{NaN, +Inf, −Inf} and a few positions per input, one element is replaced; the implementation under test runs on the
GPU and the policy reference (``upstream_sm90``) on the CPU. Per injection and output the script counts

* ``extra``: elements non-finite in the implementation but finite in the reference,
* ``missing``: finite in the implementation but non-finite in the reference,
* ``class``: non-finite in both but of another class (NaN vs +Inf vs −Inf),
* ``rule``: elements where the reference itself departs from ``nonfinite.predict_nonfinite_outputs`` (should be 0),

and writes a markdown summary plus the raw JSON. Before the injections every case runs clean once: the outputs must
be finite (upstream buffers are NaN-poisoned, so an element it never writes would show up).

Run on the H200 (repository root, CUDA torch, tilelang and the mamba-ssm source as in docs/workflow.md)::

    python scripts/gpu_nonfinite_upstream.py --out reports/gpu_nonfinite_upstream.md
    python scripts/gpu_nonfinite_upstream.py --impl kernels --out reports/gpu_nonfinite_kernels.md   # Triton, CUDA

Plumbing check without a GPU (the CPU reference against itself, or the kernels under the interpreter)::

    python scripts/gpu_nonfinite_upstream.py --impl reference --device cpu --cases seed_tail_chunk --positions 1
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

import mimo_numerics as mn
from mimo_numerics import nonfinite, provenance
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

VALUES = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}


def _implementation(name: str, device: str, source_dir):
    if name == "upstream":
        from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream

        def run(x):
            return upstream.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), source_dir=source_dir)
        return run
    if name == "kernels":
        from mimo_numerics import kernels

        def run(x):
            return kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90", poison=True,
                                              allow_slow_interpreter=True)
        return run
    if name == "reference":
        def run(x):
            return stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90")
        return run
    raise ValueError(f"unknown implementation {name!r}")


def positions(name: str, inputs: dict, count: int, gen: torch.Generator):
    """Deterministic injection sites: the middle element, then the first, the last and seeded random ones.

    For ``segsum`` the middle site is moved strictly below the diagonal of a full chunk, so that it is used.
    """
    shape = tuple(inputs[name].shape)
    numel = inputs[name].numel()
    flats = [numel // 2, 0, numel - 1]
    while len(flats) < count:
        flats.append(int(torch.randint(numel, (1,), generator=gen)))
    out = []
    for flat in flats[:count]:
        index = [int(i) for i in torch.unravel_index(torch.tensor(flat), shape)]
        if name == "segsum" and flat == numel // 2:
            chunk = inputs["chunk_size"]
            index[-2], index[-1] = min(chunk - 1, 2), min(chunk - 1, 2) - 1 if chunk > 1 else 0
        if tuple(index) not in out:
            out.append(tuple(index))
    return out


def _to(x: dict, device: str) -> dict:
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}


def _classes(outputs) -> dict:
    mapping = outputs._asdict() if hasattr(outputs, "_asdict") else dict(outputs)
    return {n: (None if mapping.get(n) is None else nonfinite.value_class(mapping[n].detach().cpu()))
            for n in OUTPUT_NAMES}


def compare(got: dict, ref: dict, predicted: dict) -> dict:
    """Per output: extra, missing, class (implementation vs reference) and rule (reference vs prediction)."""
    result = {}
    for name in OUTPUT_NAMES:
        g, r, p = got[name], ref[name], predicted[name]
        if g is None and r is None:
            continue
        if (g is None) != (r is None):
            result[name] = {"error": "present in only one of implementation/reference"}
            continue
        g_bad, r_bad = g != 0, r != 0
        result[name] = {
            "extra": int((g_bad & ~r_bad).sum()), "missing": int((~g_bad & r_bad).sum()),
            "class": int((g_bad & r_bad & (g != r)).sum()), "nonfinite_impl": int(g_bad.sum()),
            "nonfinite_ref": int(r_bad.sum()), "rule": int((r_bad != p).sum()) if p is not None else 0,
            "numel": int(g.numel()),
        }
    return result


def run(args) -> dict:
    impl = _implementation(args.impl, args.device, args.source_dir)
    cases = golden.load_golden(args.golden)
    chosen = [n for n in cases if any(fnmatch.fnmatch(n, pattern) for pattern in args.cases)]
    if not chosen:
        raise SystemExit(f"no golden case matches {args.cases}; cases: {list(cases)}")
    values = {k: VALUES[k] for k in args.values}
    gen = torch.Generator().manual_seed(args.seed)
    report = {"impl": args.impl, "device": args.device, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
              "torch": torch.__version__, "cases": {}, "device_name": None, "provenance": provenance.collect()}
    if args.device.startswith("cuda") and torch.cuda.is_available():
        report["device_name"] = torch.cuda.get_device_name(torch.device(args.device))
    start = time.perf_counter()
    for case_name in chosen:
        inputs, _ = cases[case_name]
        entry = {"clean": None, "injections": []}
        try:
            clean = _classes(impl(_to(inputs, args.device)))
        except Exception as exc:  # noqa: BLE001 - an upstream refusal or compile error is a result
            entry["clean"] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"}
            report["cases"][case_name] = entry
            print(f"{case_name}: {entry['clean']['error']}", flush=True)
            continue
        entry["clean"] = {n: int((c != 0).sum()) for n, c in clean.items() if c is not None}
        for name in INPUT_NAMES:
            if inputs[name] is None:
                continue
            for index in positions(name, inputs, args.positions, gen):
                for label, value in values.items():
                    y = nonfinite.with_value(inputs, name, index, value)
                    ref = _classes(stage1_reference.mamba_mimo_bwd_fwd(*as_args(y), **as_kwargs(y),
                                                                   policy="upstream_sm90"))
                    predicted = nonfinite.predict_nonfinite_outputs(y, name, index, value)
                    item = {"input": name, "index": list(index), "value": label}
                    try:
                        got = _classes(impl(_to(y, args.device)))
                        item["outputs"] = compare(got, ref, predicted)
                    except Exception as exc:  # noqa: BLE001
                        item["error"] = f"{type(exc).__name__}: {exc}"[:300]
                        if args.debug:
                            traceback.print_exc()
                    entry["injections"].append(item)
        report["cases"][case_name] = entry
        bad = sum(1 for i in entry["injections"] if "error" in i or any(
            o.get("extra") or o.get("missing") or o.get("class") or o.get("error") for o in i["outputs"].values()))
        print(f"{case_name}: {len(entry['injections'])} injections, {bad} with differences", flush=True)
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


def render(report: dict) -> str:
    lines = [f"# Non-finite propagation: `{report['impl']}` vs the reference", ""]
    if report.get("provenance"):  # runs before the provenance module recorded none
        lines += [provenance.markdown_header(report["provenance"]), ""]
    lines += [
             f"Device: {report['device']} ({report['device_name'] or 'n/a'}), torch {report['torch']}, "
             f"{report['date']}, {report['seconds']} s. Made by `scripts/gpu_nonfinite_upstream.py`; rules in "
             "`docs/nonfinite.md`. Counts are output elements; `extra` = non-finite only in the implementation, "
             "`missing` = non-finite only in the reference, `class` = NaN vs ±Inf differences, `rule` = the "
             "reference against the documented prediction (expected 0).", ""]
    totals = {"injections": 0, "differing": 0, "rule": 0, "errors": 0}
    per_input = {}
    for case, entry in report["cases"].items():
        clean = entry["clean"] or {}
        if "error" in clean:
            lines.append(f"* `{case}`: not run: {clean['error']}")
            continue
        if any(clean.values()):
            lines.append(f"* `{case}`: **non-finite outputs without any injection**: {clean}")
        for item in entry["injections"]:
            totals["injections"] += 1
            key = (item["input"], item["value"])
            stats = per_input.setdefault(key, {"n": 0, "extra": 0, "missing": 0, "class": 0, "rule": 0, "err": 0,
                                               "examples": []})
            stats["n"] += 1
            if "error" in item:
                totals["errors"] += 1
                stats["err"] += 1
                continue
            diff = {o: v for o, v in item["outputs"].items() if v.get("extra") or v.get("missing") or v.get("class")}
            rule = sum(v.get("rule", 0) for v in item["outputs"].values())
            totals["rule"] += rule > 0
            stats["rule"] += rule
            for v in item["outputs"].values():
                for k in ("extra", "missing", "class"):
                    stats[k] += v.get(k, 0)
            if diff:
                totals["differing"] += 1
                if len(stats["examples"]) < 2:
                    stats["examples"].append(f"{case} {item['input']}{item['index']}={item['value']}: {diff}")
    lines += ["", f"**{totals['injections']} injections; {totals['differing']} with a pattern different from the "
              f"reference; {totals['errors']} errors; {totals['rule']} where the reference departs from the rules.**",
              "", "| input | value | injections | extra | missing | class | rule | errors |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (name, value), s in sorted(per_input.items(), key=lambda kv: (INPUT_NAMES.index(kv[0][0]), kv[0][1])):
        lines.append(f"| `{name}` | {value} | {s['n']} | {s['extra']} | {s['missing']} | {s['class']} | "
                     f"{s['rule']} | {s['err']} |")
    examples = [e for s in per_input.values() for e in s["examples"]]
    if examples:
        lines += ["", "Examples of differences:", ""] + [f"* {e}" for e in examples[:40]]
    return "\n".join(lines) + "\n"


def _differs(item: dict) -> bool:
    return "error" in item or any(o.get("extra") or o.get("missing") or o.get("class") or o.get("rule")
                                  or o.get("error") for o in item.get("outputs", {}).values())


def compact(report: dict) -> dict:
    """The report with, per case, the clean-run counts, the number of injections and only the differing ones."""
    out = {k: v for k, v in report.items() if k != "cases"}
    out["cases"] = {name: {"clean": entry["clean"], "injections": len(entry["injections"]),
                           "differing": [i for i in entry["injections"] if _differs(i)]}
                    for name, entry in report["cases"].items()}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("upstream", "kernels", "reference"), default="upstream")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="*", default=["*"], help="golden case names or globs (default: all)")
    parser.add_argument("--values", nargs="*", default=list(VALUES), choices=list(VALUES))
    parser.add_argument("--positions", type=int, default=2, help="injection sites per input (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random sites beyond the first three")
    parser.add_argument("--golden", default=None, help="golden .pt file (default: the repository's)")
    parser.add_argument("--source-dir", default=None, help="mamba-ssm source (see mimo_numerics.upstream)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "gpu_nonfinite_upstream.md"))
    parser.add_argument("--full-json", action="store_true", help="keep every injection in the JSON (large)")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    if args.impl == "upstream" and args.device.startswith("cuda"):
        from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream

        ok, why = upstream.availability(args.source_dir)
        if not ok:
            print(f"upstream kernel unavailable: {why}", file=sys.stderr)
            return 2
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(report), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(report if args.full_json else compact(report), indent=1,
                                                   allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    differing = sum(1 for e in report["cases"].values() for i in e["injections"] if _differs(i))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
