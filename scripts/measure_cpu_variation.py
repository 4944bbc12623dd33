"""How much the package's CPU results move between CPUs, BLAS code paths and thread counts (docs/reproducibility.md).

``run`` computes a fixed set of results on this process's configuration and saves them; ``compare`` reads several
such files and prints, per result group, the largest rel RMS and the smallest bit-equal fraction of each file
against the first. Run ``run`` once per configuration (the environment variables of
``scripts/cpu_emulation_suite.sh``), then ``compare``:

    python scripts/measure_cpu_variation.py run --out /tmp/var/native.pt
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell \\
        python scripts/measure_cpu_variation.py run --out /tmp/var/avx2.pt
    python scripts/measure_cpu_variation.py run --threads 1 --out /tmp/var/threads1.pt
    python scripts/measure_cpu_variation.py compare /tmp/var/native.pt /tmp/var/avx2.pt /tmp/var/threads1.pt

Results (each a group of tensors): the generated inputs (must be bit-equal everywhere: exact_random), the stage-1
reference under upstream_sm90 and fp32 on the 15 seed golden cases and a generated S = 300 case, the stage-1 FP64
oracle on the golden cases, the forward and stage-2 references and the FP32 epilogue on the 7 whole-op golden cases,
the FP32 preprocessing, and the Triton kernel under the CPU interpreter (NumPy's BLAS) on two small cases.
A few minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Dict

import torch

ROOT = Path(__file__).resolve().parents[1]

import mimo_numerics as mn
from mimo_numerics import provenance
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.metrics import bit_equal_fraction, rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

ENV_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Generated cases: the stage-1 thread-count case of tests/test_reliability_determinism.py and two small kernel cases.
GENERATED = CaseSpec(formula="realistic", batch=2, seqlen=300, heads=2, state_dim=64, value_dim=64, rank=4,
                     chunk_size=16, has_z=True, has_d=True)
KERNEL_CASES = (CaseSpec(seqlen=13, state_dim=16, value_dim=16, rank=3, chunk_size=6, has_z=True, has_d=True),
                CaseSpec(formula="realistic", seqlen=24, heads=2, groups=1, state_dim=32, value_dim=16, rank=2,
                         chunk_size=8, reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2))


def _put(out: Dict[str, torch.Tensor], group: str, name: str, value) -> None:
    """Store ``value`` (a tensor, a stage-1 Outputs tuple or a dict of tensors) under ``group/name[/field]``."""
    if isinstance(value, torch.Tensor):
        out[f"{group}/{name}"] = value.detach().cpu().contiguous()
        return
    items = value._asdict().items() if hasattr(value, "_asdict") else value.items()
    for field, t in items:
        if isinstance(t, torch.Tensor):
            out[f"{group}/{name}/{field}"] = t.detach().cpu().contiguous()


def _stage1(inputs: dict, policy):
    return stage1_reference.mamba_mimo_bwd_fwd(*[inputs[n] for n in mn.INPUT_NAMES], chunk_size=inputs["chunk_size"],
                                           rotary_dim_divisor=inputs["rotary_dim_divisor"], policy=policy)


def compute() -> Dict[str, torch.Tensor]:
    """Every result of the module docstring, by ``group/case[/output]``."""
    from mimo_numerics import golden_data, presets
    from mimo_numerics.ops.mamba3_mimo import chain
    from mimo_numerics.studies import measure
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.golden import golden_inputs as stage2_inputs
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES as STAGE2_INPUTS
    from mimo_numerics.ops.mamba_mimo_fwd.golden import golden_args
    from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd
    from mimo_numerics.ops.mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference

    out: Dict[str, torch.Tensor] = {}
    seed_cases = golden_data.load("seed_cases")
    for name in sorted(seed_cases):
        inputs = seed_cases[name]["inputs"]
        for preset in ("upstream_sm90", "fp32"):
            _put(out, f"stage1_golden_{preset}", name, _stage1(inputs, preset))
        oracle = stage1_oracle.mamba_mimo_bwd_fwd_oracle(*[inputs[n] for n in mn.INPUT_NAMES],
                                                     chunk_size=inputs["chunk_size"],
                                                     rotary_dim_divisor=inputs["rotary_dim_divisor"])
        _put(out, "stage1_golden_fp64_oracle", name, oracle)
    generated = make_inputs(GENERATED)
    _put(out, "inputs_generated", GENERATED.case_id, {k: v for k, v in generated.items()
                                                      if isinstance(v, torch.Tensor)})
    for preset in ("upstream_sm90", "fp32"):
        _put(out, f"stage1_generated_{preset}", GENERATED.case_id, _stage1(generated, preset))

    full_op = golden_data.load("full_op")
    for name in sorted(full_op):
        case = full_op[name]
        _put(out, "preprocess_fp32", name, measure.preprocess(case, torch.float32))
        for preset in ("upstream_sm90", "fp32"):
            _put(out, f"fwd_golden_{preset}", name,
                 mamba_mimo_fwd(**golden_args(case), policy=presets.get(preset)).o)
            s2 = stage2_inputs(case)
            _put(out, f"stage2_golden_{preset}", name, mamba_mimo_bwd_bwd(
                *[s2[n] for n in STAGE2_INPUTS], chunk_size=s2["chunk_size"],
                rotary_dim_divisor=s2["rotary_dim_divisor"], policy=presets.get(preset)))
        inputs = case["inputs"]
        _put(out, "epilogue_golden", name, mamba3_mimo_epilogue_reference(
            *chain.epilogue_args(inputs, case["pre"], case["bwd_fwd"], case["bwd_bwd"]),
            **chain.epilogue_kwargs(inputs)))

    if mn.kernels.triton_available():
        for spec in KERNEL_CASES:
            x = make_inputs(spec)
            _put(out, "triton_interpreter_upstream_sm90", spec.case_id,
                 mn.kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90"))
    return out


def _configuration(threads: int) -> dict:
    return {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "requested_threads": threads, **{k: os.environ.get(k) for k in ENV_VARS if os.environ.get(k)}}


def _compare(paths) -> None:
    loaded = [torch.load(p, weights_only=False) for p in paths]
    base = loaded[0]
    print(f"baseline: {Path(paths[0]).name} {base['configuration']}")
    for path, other in zip(paths[1:], loaded[1:]):
        print(f"\n{Path(path).name}: {other['configuration']}")
        groups: Dict[str, list] = {}
        for key, want in base["results"].items():
            got = other["results"][key]
            if want.dtype.is_floating_point:
                finite = torch.isfinite(want) & torch.isfinite(got)
                err = rel_rms(got[finite], want[finite]) if bool(finite.any()) else 0.0
            else:
                err = 0.0 if torch.equal(got, want) else float("inf")
            groups.setdefault(key.split("/")[0], []).append((key, err, bit_equal_fraction(got, want)))
        print(f"  {'group':36s} {'tensors':>7s} {'changed':>7s} {'max rel RMS':>12s} {'min bit-eq':>10s}  worst")
        for group, rows in groups.items():
            worst = max(rows, key=lambda r: r[1])
            changed = sum(1 for r in rows if r[2] < 1.0)
            print(f"  {group:36s} {len(rows):7d} {changed:7d} {worst[1]:12.3g} {min(r[2] for r in rows):10.6f}  "
                  f"{worst[0] if worst[1] > 0 else ''}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compute the results on this configuration and save them")
    run.add_argument("--out", required=True, type=Path)
    run.add_argument("--threads", type=int, default=0, help="torch.set_num_threads first (0: torch's default)")
    compare = sub.add_parser("compare", help="compare saved results with the first file's")
    compare.add_argument("paths", nargs="+", type=Path)
    compare.add_argument("--record-dir", type=Path, default=provenance.MEASUREMENTS,
                         help="write the comparison with the provenance header to DIR/measure_cpu_variation.md and "
                              ".json (default: reports/measurements)")
    compare.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.command == "compare":
        with provenance.record_measurement("measure_cpu_variation", "CPU results across CPUs, BLAS code paths and "
                                           "thread counts (docs/reproducibility.md)",
                                           None if args.no_record else args.record_dir) as data:
            data["configurations"] = {p.name: torch.load(p, weights_only=False)["configuration"] for p in args.paths}
            _compare(args.paths)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    config = _configuration(args.threads)
    print(f"configuration: {config}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"configuration": config, "results": compute()}, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
