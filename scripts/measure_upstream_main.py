#!/usr/bin/env python
"""Upstream main's bf16 chunk states and FP32 bias sums, modelled on the package's reference chain, against FP64
(``mimo_numerics.studies.upstream_main``; the changes: ``docs/upstream_main.md``). Writes
``upstream_main_model.json`` and ``README.md`` into ``--out`` (default ``reports/upstream_main_model``). The default
(S = 2048 and 8192, fp16 and bf16) takes some minutes on the CPU; ``--smoke`` runs two small cases.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mimo_numerics import provenance
from mimo_numerics.ops.mamba3_mimo.cases import small_case
from mimo_numerics.studies import upstream_main

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"], choices=["float16", "bfloat16"])
    parser.add_argument("--seed", type=int, default=3301)
    parser.add_argument("--smoke", action="store_true", help="two small cases (S = 32), for a quick check")
    parser.add_argument("--out", default=str(ROOT / "reports" / "upstream_main_model"))
    args = parser.parse_args(argv)
    if args.smoke:
        specs = [small_case(dtype=dtype, seed=args.seed) for dtype in args.dtypes]
    else:
        specs = upstream_main.default_specs(args.seqlens, args.dtypes, args.seed)
    study = upstream_main.run(specs, command=provenance.command_line())
    readme = upstream_main.write_report(study, args.out, smoke=args.smoke)
    print(readme.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
