#!/usr/bin/env python
"""Decode drift at a realistic size: a prefill, then a long decode under several policies, against FP64
(``mimo_numerics.studies.decode_drift``). Writes ``decode_drift.json``, ``decode_drift.png`` and ``README.md`` into
``--out`` (default ``reports/decode_drift``). On the CPU, the default (a prefill of 2048 tokens, 2048 decoded:
S = 4096, N = 128, P = 64, R = 4, H = 4) takes some minutes; ``--smoke`` runs a small case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mimo_numerics import provenance
from mimo_numerics.ops.mamba3_mimo.cases import small_case
from mimo_numerics.studies import decode_drift

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=2048, help="decode steps after the prefill")
    parser.add_argument("--seed", type=int, default=2101)
    parser.add_argument("--no-chunked", action="store_true",
                        help="skip the chunked op's baseline (a whole-op run over every token: long decodes)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated labels of decode_drift.DEFAULT_POLICIES (default: all)")
    parser.add_argument("--smoke", action="store_true", help="a small case (S = 48), for a quick check")
    parser.add_argument("--out", default=str(ROOT / "reports" / "decode_drift"))
    args = parser.parse_args(argv)
    if args.smoke:
        spec, prefill = small_case(seqlen=48, seed=args.seed), 16
    else:
        spec, prefill = decode_drift.default_spec(args.prefill, args.tokens, args.seed), args.prefill
    policies = decode_drift.DEFAULT_POLICIES
    if args.policies:
        unknown = set(args.policies.split(",")) - set(policies)
        if unknown:
            parser.error(f"--policies: unknown {sorted(unknown)}; known: {sorted(policies)}")
        policies = {label: policies[label] for label in args.policies.split(",")}
    study = decode_drift.run(spec, prefill, policies, chunked=not args.no_chunked, command=provenance.command_line())
    readme = decode_drift.write_report(study, args.out, smoke=args.smoke)
    print(readme.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
