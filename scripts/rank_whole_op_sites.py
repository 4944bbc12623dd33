#!/usr/bin/env python
"""Rank the whole op's rounding sites on the whole-op golden cases (issue 18): which roundings make each gradient
wrong. Writes ``reports/mamba3_mimo_site_ranking.md`` (+ ``.json`` and ``.png``).

Usage::

    python scripts/rank_whole_op_sites.py                     # every golden case the chain supports, bfloat16
    python scripts/rank_whole_op_sites.py --dtype float16 --out /tmp/rank_fp16.md
    python scripts/rank_whole_op_sites.py --cases g_B1_S64_H2_N64_P64_R4_C16_zdo,g_B1_S64_H2_N64_P64_R4_C16_plain

Each case's inputs are the golden raw inputs (drawn on the H200 machine by the whole-op formula); the op runs from
them on the CPU, forward and ``backward(dout)``, once under ``fp64`` and once per one-off variant of the policy
(``mimo_numerics.ops.mamba3_mimo.ranking.rank_op_sites``, errors averaged over the cases). No upstream tensor is
read: the cases are golden only in that upstream's outputs on them are known (``report --op mamba3_mimo``). Cases
the package's backward does not run (upstream's limits: S a multiple of C, G = 1 or G = H) are listed as skipped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

from mimo_numerics import plots
from mimo_numerics.ops.mamba3_mimo import golden, ranking, runs

DEFAULT_OUT = ROOT / "reports" / "mamba3_mimo_site_ranking.md"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _select(names, dtype):
    data = golden.load()
    chosen, skipped = {}, {}
    for name in names or list(data):
        if name not in data:
            raise SystemExit(f"rank_whole_op_sites: --cases: unknown golden case {name!r}; known: {', '.join(data)}")
        x = data[name]["inputs"]
        if str(x["Q"].dtype).replace("torch.", "") != dtype:
            continue
        try:
            baseline = runs.policy_run(x, "fp64")  # raises ValueError at upstream's backward limits
        except ValueError as exc:
            skipped[name] = str(exc)
            continue
        chosen[name] = (x, baseline)
    return chosen, skipped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=None, help="comma-separated golden case names (default: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown path (.json and .png next to it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the runs are small; one thread gives the same bits on every run of this machine
    chosen, skipped = _select(args.cases.split(",") if args.cases else None, args.dtype)
    if not chosen:
        raise SystemExit(f"rank_whole_op_sites: no {args.dtype} golden case to rank (skipped: {skipped})")
    started = time.monotonic()
    result = ranking.rank_op_sites([x for x, _ in chosen.values()], args.policy, names=list(chosen), progress=True,
                                   baselines=[base for _, base in chosen.values()])
    seconds = time.monotonic() - started

    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure = args.out.with_suffix(".png")
    heat = {r.label: {o: result.fraction(r, o) for o in result.outputs} for r in result.ranked()[:24]}
    plots.save_figure(plots.plot_score_matrix(
        heat, result.outputs, vmax=1.0, ylabel="rounding turned off", colorbar="share of the error removed",
        title=f"mamba3_mimo: share of each output's error removed by one rounding of {result.policy.name} off "
              f"(top {len(heat)}; mean over {len(chosen)} golden cases)"), figure)
    payload = result.to_dict()
    payload.update({"skipped_cases": skipped, "seconds": seconds, "commit": _commit(), "torch": torch.__version__})
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")

    lines = [
        f"# mamba3_mimo: which roundings make each gradient wrong ({args.dtype} golden cases)", "",
        f"Generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by "
        f"`python scripts/rank_whole_op_sites.py{' --dtype ' + args.dtype if args.dtype != 'bfloat16' else ''}` at "
        f"commit `{_commit()}` (torch {torch.__version__}, CPU, 1 thread) in {seconds:.0f} s: "
        f"{len(result.rows)} one-off variants of `{result.policy.name}` x {len(chosen)} cases, the whole op "
        "(`mn.mamba3_mimo`, forward and `backward(dout)`) run from each case's raw inputs, errors against the op's "
        "`fp64` run (relative RMS), averaged over the cases that have the output "
        "(`mimo_numerics.ops.mamba3_mimo.ranking`).", "",
        "Cases: " + ", ".join(f"`{n}`" for n in chosen) + "."
        + (" Not run (the package's backward follows upstream's limits): "
           + "; ".join(f"`{n}` ({why})" for n, why in skipped.items()) + "." if skipped else ""), "",
        "A cell is the share of that output's error that goes away with the rounding off, `sqrt(policy² − off²) / "
        "policy` (independent errors add in quadrature; 0 when the variant is not closer). The score is its mean "
        "over the 14 gradients. Shares of different roundings do not add up to 1: the roundings interact.", "",
        f"![ranking]({figure.name})", "",
        "## Per output, the three roundings removing most of its error", "", result.top_markdown(), "",
        "## Every rounding, ranked by score", "", result.to_markdown(), "",
    ]
    quiet = result.without_effect()
    if quiet:
        lines += [f"Roundings that change no gradient ({len(quiet)}): " + ", ".join(f"`{q}`" for q in quiet) + ".",
                  ""]
    if result.skipped:
        lines += ["Knob values not run (the chain cannot run them): "
                  + "; ".join(f"`{k}`: {why}" for k, why in result.skipped.items()), ""]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
