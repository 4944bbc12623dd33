#!/usr/bin/env python
"""Fit :mod:`mimo_numerics.mufu`'s table models to the GPU's fast-math special functions and prove them on all
2^32 float32 inputs.

For every function (``ex2``, ``rcp``, ``sin``, ``cos``, ``tanh``; the PTX that ``nvcc --use_fast_math`` emits):

1. the PTX instruction runs on every float32 bit pattern (Triton inline assembly); the outputs stay on the GPU
   (16 GiB per function);
2. for each candidate model parameter set (fixed-point fraction bits and rounding, dropped mantissa bits) the table
   is filled from the hardware's outputs (every input writes its output into its key's entry), then the model
   (:class:`mimo_numerics.mufu.MufuModel`, the same code the CPU reference runs) is evaluated on all 2^32 inputs and
   compared bit for bit with the hardware (NaN equal to NaN). A candidate with zero mismatches is a proven model:
   the search keeps the one with the smallest table.
3. mismatch counts per input exponent and examples are recorded for every candidate, so a failed search says where
   a model breaks.

Writes ``summary.json`` (per function: the candidates tried, their mismatches, the chosen model) and
``mufu_models.npz`` (:func:`mimo_numerics.mufu.save_models`) into ``--out``. Needs CUDA and an H200-class GPU
memory (the outputs of one function are 16 GiB)::

    python scripts/fit_mufu_models.py --out $OUT/mufu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from mimo_numerics import mufu

PTX = {
    "ex2": "ex2.approx.ftz.f32 $0, $1;",
    "rcp": "rcp.approx.ftz.f32 $0, $1;",
    "sin": "sin.approx.ftz.f32 $0, $1;",
    "cos": "cos.approx.ftz.f32 $0, $1;",
    "tanh": "tanh.approx.f32 $0, $1;",
}
#: Other forms of the same instructions, checked against a model by ``--verify`` (``tl.exp`` in Triton's helpers is
#: ``ex2.approx.f32`` without ``.ftz``).
VARIANTS = {"ex2_noftz": ("ex2", "ex2.approx.f32 $0, $1;")}
CHUNK = 1 << 28
ALL = 1 << 32
DEVICE = "cuda"
#: A proven model with a larger table is reported but not written (it would not be a compact model).
MAX_SAVED_ENTRIES = 1 << 26


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def run(x_ptr, y_ptr, start, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        bits = (start + offs.to(tl.int64)).to(tl.uint32)
        x = bits.to(tl.float32, bitcast=True)
        y = tl.inline_asm_elementwise(ASM, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
        tl.store(y_ptr + offs, y.to(tl.int32, bitcast=True), mask=mask)

    return run


def inputs(start: int, stop: int) -> torch.Tensor:
    return mufu.float_of(torch.arange(start, stop, dtype=torch.int64, device=DEVICE))


def hardware_outputs(kernel, asm: str) -> torch.Tensor:
    out = torch.empty(ALL, dtype=torch.int32, device=DEVICE)
    for start in range(0, ALL, CHUNK):
        n = min(CHUNK, ALL - start)
        kernel[((n + 1023) // 1024,)](out, out[start:start + n], start, n, ASM=asm, BLOCK=1024)
    torch.cuda.synchronize()
    return out


def same(a_bits: torch.Tensor, b_bits: torch.Tensor) -> torch.Tensor:
    a, b = a_bits.view(torch.float32), b_bits.view(torch.float32)
    return (a_bits == b_bits) | (torch.isnan(a) & torch.isnan(b))


def fit(model: mufu.MufuModel, y_all: torch.Tensor, domain) -> None:
    """Fill the table: every input in ``domain`` writes its normalised hardware output into its key's entry."""
    for start in range(0, ALL, CHUNK):
        x = inputs(start, start + CHUNK)
        keep = domain(x)
        if not bool(keep.any()):
            continue
        x, y = x[keep], y_all[start:start + CHUNK][keep]
        values = normalise(model, x, y.view(torch.float32))
        ok = torch.isfinite(values)
        keys = model.keys(x[ok]).clamp(0, model.table.numel() - 1)
        model.table.scatter_(0, keys, values[ok].view(torch.int32))
        SEEN[keys] = True


def normalise(model: mufu.MufuModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The table value the hardware output implies (inf where the input says nothing about the table)."""
    function = model.function
    if function in ("sin", "cos"):
        return torch.where(mufu.trig_sign(model, x), -y, y)
    if function == "ex2":  # fitted on [0, 1), where n = 0
        return y
    if function == "rcp":
        b = mufu.bits_of(x)
        exponent = ((b >> 23) & 0xFF) - 127
        v = (y.abs().double() * mufu.pow2(exponent.to(torch.int32))).float()
        return torch.where((y.abs() >= 2.0 ** -126) & torch.isfinite(y), v, torch.full_like(v, float("inf")))
    if function == "tanh":
        return torch.where(torch.isfinite(y), y.abs(), torch.full_like(y, float("inf")))
    return y


def check(model: mufu.MufuModel, y_all: torch.Tensor, examples: int = 6) -> dict:
    """Mismatches of the model against the hardware on all 2^32 inputs, by input exponent byte, with examples."""
    total = 0
    by_exponent = torch.zeros(256, dtype=torch.int64, device=DEVICE)
    shown = []
    for start in range(0, ALL, CHUNK):
        x = inputs(start, start + CHUNK)
        got = model(x).view(torch.int32)
        bad = ~same(got, y_all[start:start + CHUNK])
        n = int(bad.sum())
        if n:
            total += n
            exponent_byte = (mufu.bits_of(x[bad]) >> 23) & 0xFF
            by_exponent += torch.bincount(exponent_byte, minlength=256)
            if len(shown) < examples:
                idx = torch.nonzero(bad).flatten()[: examples - len(shown)]
                for i in idx.tolist():
                    shown.append({"x": float(x[i]), "x_bits": hex(start + i),
                                  "hw": float(y_all[start + i].view(torch.float32)),
                                  "hw_bits": hex(int(y_all[start + i]) & 0xFFFFFFFF),
                                  "model": float(got[i].view(torch.float32)),
                                  "model_bits": hex(int(got[i]) & 0xFFFFFFFF)})
    nz = {int(e) - 127: int(c) for e, c in enumerate(by_exponent.tolist()) if c}
    return {"mismatches": total, "by_input_exponent": nz, "examples": shown}


SEEN = torch.zeros(0, dtype=torch.bool)


def fill_unseen(model: mufu.MufuModel, seen: torch.Tensor) -> int:
    """Give the entries no input reaches the value of the nearest reached entry below (so the stored differences
    stay small); returns how many there were. They are never looked up: the check runs on every input."""
    index = torch.arange(seen.numel(), device=seen.device)
    last = torch.where(seen, index, torch.zeros_like(index)).cummax(0).values
    model.table.copy_(model.table[last])
    return int((~seen).sum())


def try_candidate(name, params, size, y_all, domain, log):
    global SEEN
    t0 = time.time()
    model = mufu.empty_model(name, params, size, device=DEVICE)
    SEEN = torch.zeros(size, dtype=torch.bool, device=DEVICE)
    fit(model, y_all, domain)
    unseen = fill_unseen(model, SEEN)
    result = check(model, y_all)
    entry = {"params": params, "table_entries": size, "unreached_entries": unseen, **result,
             "seconds": round(time.time() - t0, 1)}
    log(f"  {name} {params}: {result['mismatches']} mismatches ({entry['seconds']} s)"
        + (f" by exponent {dict(list(result['by_input_exponent'].items())[:12])}" if result["mismatches"] else ""))
    return model, entry


def search(name, y_all, log, max_f):
    """Try the candidates of one function; return (chosen model or None, candidate records, facts)."""
    tried, chosen = [], None
    finite = lambda x: torch.isfinite(x)  # noqa: E731
    if name == "ex2":
        for rounding in mufu.EX2_ROUNDINGS:
            for F in range(20, max_f + 1):
                # fitted on |x| < 1 - 2^-(F+1), where n = 0 (nearest maps x near 1 to n = 1, j = 0: left out);
                # floor/trunc/nearest fit from x >= 0 only, magnitude from both signs
                lo = -1.0 if rounding == "magnitude" else 0.0
                domain = lambda x, F=F, lo=lo: (x > lo) & (x < 1 - 2.0 ** -(F + 1))  # noqa: E731
                size = (2 if rounding == "magnitude" else 1) << F
                model, entry = try_candidate(name, {"fraction_bits": F, "rounding": rounding}, size, y_all,
                                             domain, log)
                tried.append(entry)
                if entry["mismatches"] == 0:
                    chosen = chosen if chosen and chosen.table.numel() <= model.table.numel() else model
                    break
    elif name == "rcp":
        for k in range(0, 24):
            model, entry = try_candidate(name, {"dropped_bits": k}, 1 << (23 - k), y_all,
                                         lambda x: (x.abs() >= 2.0 ** -126) & torch.isfinite(x), log)
            tried.append(entry)
            if entry["mismatches"]:
                break
            chosen = model
    elif name in ("sin", "cos"):
        for F in (24, 25, 26):
            model, entry = try_candidate(name, {"reduction": "quadrant", "fraction_bits": F}, (1 << (F - 2)) + 1,
                                         y_all, finite, log)
            tried.append(entry)
            if entry["mismatches"] == 0:
                chosen = model
                break
        if chosen is None:
            for F in (25, 26):
                model, entry = try_candidate(name, {"reduction": "magnitude_fixed", "fraction_bits": F}, 1 << F,
                                             y_all, finite, log)
                tried.append(entry)
                if entry["mismatches"] == 0:
                    chosen = model
                    break
    elif name == "tanh":
        facts = tanh_facts(y_all)
        log(f"  tanh facts: {facts}")
        if facts["odd"]:
            for k in range(0, 24):
                lo = facts["lo"] >> k << k
                hi = -(-facts["hi"] >> k) << k
                size = (hi - lo) >> k
                if size > (1 << 28):
                    tried.append({"params": {"dropped_bits": k}, "skipped": f"table of {size} entries"})
                    log(f"  tanh k={k}: table of {size} entries, skipped")
                    continue
                lo_f = float(mufu.float_of(torch.tensor(lo)))
                hi_f = float(mufu.float_of(torch.tensor(hi)))
                model, entry = try_candidate(name, {"dropped_bits": k, "lo": lo, "hi": hi}, size, y_all,
                                             lambda x: (x.abs() >= lo_f) & (x.abs() < hi_f), log)
                tried.append(entry)
                if entry["mismatches"]:
                    break
                chosen = model
        return chosen, tried, facts
    return chosen, tried, {}


def tanh_facts(y_all) -> dict:
    """tanh.approx: is it odd; the smallest |x| bits where it differs from x; the bits from which it is 1."""
    half = 1 << 31
    pos = y_all[:half]
    neg = y_all[half:]
    odd = bool(same((pos.view(torch.float32).neg()).view(torch.int32), neg).all())
    idx = torch.arange(half, dtype=torch.int64, device=DEVICE)
    x = mufu.float_of(idx)
    finite = torch.isfinite(x)
    differs = finite & (pos != x.view(torch.int32))
    lo = int(idx[differs].min()) if bool(differs.any()) else half
    not_one = finite & (pos.view(torch.float32) != 1.0)
    hi = int(idx[not_one].max()) + 1
    return {"odd": odd, "lo": lo, "lo_value": float(mufu.float_of(torch.tensor(lo))), "hi": hi,
            "hi_value": float(mufu.float_of(torch.tensor(hi)))}


def sample_inputs(generator: torch.Generator) -> torch.Tensor:
    """2^16 float32 inputs: random bit patterns, the op's ranges ([-20, 20], [0, 2π), tiny and huge values), and
    the special values."""
    n = 1 << 14
    patterns = torch.randint(0, 1 << 32, (n,), generator=generator, dtype=torch.int64)
    wide = (torch.rand(n, generator=generator, dtype=torch.float64) * 40 - 20).float()
    angles = (torch.rand(n, generator=generator, dtype=torch.float64) * 2 * 3.141592653589793).float()
    small = (torch.randn(n - 16, generator=generator, dtype=torch.float64)
             * torch.exp2(torch.randint(-130, 0, (n - 16,), generator=generator).double())).float()
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.0, 0.5, 2.0 ** -126,
                            2.0 ** -149, -2.0 ** -149, 127.99, 128.0, -126.5, -150.0, 8.0], dtype=torch.float32)
    return torch.cat([mufu.float_of(patterns), wide, angles, small, special])


def verify_and_sample(args, kernel, summary, log) -> int:
    models = {}
    for path in args.verify or []:
        models.update(mufu.load_models(path, device=DEVICE))
    samples = {"inputs": sample_inputs(torch.Generator().manual_seed(2024))}
    bad = 0
    for name in args.functions:
        y_all = hardware_outputs(kernel, PTX[name])
        if name in models:
            result = check(models[name], y_all)
            summary["functions"][name] = {"params": models[name].params, "verified": result}
            log(f"{name}: {result['mismatches']} mismatches on all 2^32 inputs with the stored model")
            bad += result["mismatches"]
        x = samples["inputs"]
        samples[name] = y_all[mufu.bits_of(x).to(DEVICE)].cpu().view(torch.float32)
        del y_all
        torch.cuda.empty_cache()
    for variant, (base, asm) in VARIANTS.items():
        if base in models and base in args.functions:
            y_all = hardware_outputs(kernel, asm)
            result = check(models[base], y_all, examples=12)
            summary["functions"][variant] = {"model": base, "ptx": asm, "verified": result}
            log(f"{variant}: {result['mismatches']} mismatches against the {base} model, by input exponent "
                f"{result['by_input_exponent']}")
            del y_all
            torch.cuda.empty_cache()
    (args.out / "verify.json").write_text(json.dumps(summary, indent=1))
    if args.samples:
        samples["device"] = summary["device"]
        torch.save(samples, args.samples)
    return 1 if bad else 0


def render_report(paths, out: Path) -> None:
    """``reports/mufu_models_h200.md`` from the JSON summaries of a search run, a trig search and the verify runs."""
    from mimo_numerics import provenance

    runs = [json.loads(Path(p).read_text()) for p in paths]
    lines = ["# The H200's fast-math special functions as table models (MUFU)", "",
             provenance.markdown_header(provenance.collect()), "",
             f"Rendered from the GPU runs' JSON summaries (device: {runs[0].get('device')}, torch "
             f"{runs[0].get('torch')}). Every candidate model was fitted from the hardware's outputs on all 2^32 "
             "float32 inputs and checked on all of them; a model with 0 mismatches is proven. The shipped models "
             "(`mimo_numerics/data/mufu_sm90*.npz`) were checked again from the files as shipped (`--verify`).", "",
             "## Candidates", "", "| function | model parameters | table entries | mismatches on 2^32 inputs |",
             "|---|---|---|---|"]
    for run in runs:
        for name, entry in run["functions"].items():
            for c in entry.get("candidates", []):
                if "mismatches" in c:
                    lines.append(f"| {name} | `{json.dumps(c['params'])}` | {c['table_entries']} | {c['mismatches']} |")
    lines += ["", "## Shipped models, checked from the files", "", "| function | PTX | model | mismatches |",
              "|---|---|---|---|"]
    for run in runs:
        for name, entry in run["functions"].items():
            if "verified" in entry:
                ptx = entry.get("ptx", PTX.get(name, ""))
                model = entry.get("model", name)
                lines.append(f"| {name} | `{ptx}` | {model} `{json.dumps(entry.get('params', ''))}` | "
                             f"{entry['verified']['mismatches']} (by input exponent "
                             f"{entry['verified']['by_input_exponent'] or '-'}) |")
    out.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (--render: the report file)")
    parser.add_argument("--render", nargs="+", type=Path, metavar="JSON",
                        help="no GPU: write the report from these summaries to --out")
    parser.add_argument("--functions", nargs="+", default=list(PTX), choices=list(PTX))
    parser.add_argument("--max-fraction-bits", type=int, default=26)
    parser.add_argument("--verify", nargs="+", type=Path, metavar="NPZ",
                        help="no search: check the models in these files on all 2^32 inputs")
    parser.add_argument("--samples", type=Path, metavar="PT",
                        help="also write hardware outputs on 2^16 sampled inputs per function (for CPU tests)")
    args = parser.parse_args(argv)
    if args.render:
        render_report(args.render, args.out)
        return 0
    if not torch.cuda.is_available():
        print("fit_mufu_models.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    kernel = _kernel()
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "functions": {}}
    chosen_models = {}

    def log(text):
        print(text, flush=True)

    if args.verify or args.samples:
        return verify_and_sample(args, kernel, summary, log)
    for name in args.functions:
        t0 = time.time()
        y_all = hardware_outputs(kernel, PTX[name])
        log(f"{name}: hardware outputs in {time.time() - t0:.1f} s")
        try:
            chosen, tried, facts = search(name, y_all, log, args.max_fraction_bits)
        except Exception as error:  # keep the other functions' results
            log(f"{name}: search failed: {error!r}")
            chosen, tried, facts = None, [], {"error": repr(error)}
        summary["functions"][name] = {"facts": facts, "candidates": tried, "seconds": round(time.time() - t0, 1),
                                      "chosen": None if chosen is None else
                                      {"params": chosen.params, "table_entries": chosen.table.numel()}}
        if chosen is not None and chosen.table.numel() <= MAX_SAVED_ENTRIES:
            chosen_models[name] = chosen
            mufu.save_models({name: chosen}, args.out / f"mufu_{name}.npz")
            log(f"{name}: saved {(args.out / f'mufu_{name}.npz').stat().st_size} bytes")
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        del y_all
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
