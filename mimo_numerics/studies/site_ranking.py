"""The one-site-off ranking of the whole op's roundings on its golden cases: which roundings make each gradient
wrong. Writes ``reports/mamba3_mimo_site_ranking.md`` (+ ``.json`` and ``.png``).

Usage::

    python scripts/rank_whole_op_sites.py                  # every golden case the chain supports, bfloat16
    python scripts/rank_whole_op_sites.py --dtype float16 --out /tmp/rank_fp16.md
    python scripts/rank_whole_op_sites.py --cases g_B1_S64_H2_N64_P64_R4_C16_zdo,g_B1_S64_H2_N64_P64_R4_C16_plain
    python scripts/rank_whole_op_sites.py --smoke --out /tmp/rank.md   # one small drawn case (seconds)

Each case's inputs are the golden raw inputs (drawn on the H200 machine by the whole-op formula); the op runs from
them on the CPU, forward and ``backward(dout)``, once under ``fp64`` and once per one-off variant of the policy
(``sensitivity.rank_sites(cases, policy, op="mamba3_mimo")``, errors averaged over the cases). No upstream tensor
is read: the cases are golden only in that upstream's outputs on them are known (``report --op mamba3_mimo``).
Cases the package's backward does not run (upstream's limits: S a multiple of C, G = 1 or G = H) are listed as
skipped. The reading under the tables (:func:`reading`) is computed from the result, so a rerun rewrites it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from .. import plots
from ..ops import registry
from ..ops.mamba3_mimo import cases as op_cases
from ..ops.mamba3_mimo import golden, runs
from ..sensitivity import OneOffRanking, rank_sites
from .. import provenance

DEFAULT_OUT = provenance.ROOT / "reports" / "mamba3_mimo_site_ranking.md"
#: Rows of the heat map.
HEATMAP_ROWS = 24
#: Rows the reading names (the leading sites by score).
READING_ROWS = 5


def select_cases(names: Optional[Sequence[str]], dtype: str):
    """``({name: (inputs, fp64 run)}, {name: why skipped})`` of the golden cases in ``dtype`` (all, or ``names``)."""
    data = golden.load()
    chosen, skipped = {}, {}
    for name in names or list(data):
        if name not in data:
            raise SystemExit(f"site_ranking: --cases: unknown golden case {name!r}; known: {', '.join(data)}")
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


def smoke_cases() -> Dict[str, tuple]:
    """One small drawn case (``cases.small_case()``) with its fp64 run: the generator's smoke mode."""
    x = op_cases.make_op_inputs(op_cases.small_case())
    return {"small": (x, runs.policy_run(x, "fp64"))}


def _on_device(tensors: dict, device: torch.device) -> dict:
    """``tensors`` (a case's inputs or a run) with every tensor moved to ``device`` (other values as they are)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in tensors.items()}


def _pct(value: float) -> str:
    return f"{value:.1%}"


def reading(result: OneOffRanking, n: int = READING_ROWS) -> List[str]:
    """What the ranking says, in sentences whose figures are computed here from ``result``."""
    grads = result.gradients
    ranked = [r for r in result.ranked() if r.score > 0][:n]
    if not ranked or not grads:
        return ["No rounding of the policy, turned off alone, brings a gradient closer to fp64."]
    lines = []
    for r in ranked:
        drops = {g: -result.change(r, g) for g in grads}
        largest = max(drops, key=drops.get)
        rest = [g for g in grads if g != largest]
        lines.append(f"* `{r.label}` off: score {r.score:.3f} (mean quadrature share); the gradients' error drops by "
                     f"{_pct(result.drop(r))} on average ({_pct(result.drop(r, rest))} without `{largest}`, whose "
                     f"error drops most: {_pct(drops[largest])}).")
    for o in grads:
        top = result.top(o, 1)
        if top and result.fraction(top[0], o) >= 0.5:
            lines.append(f"* `{o}`: `{top[0].label}` off takes a quadrature share {result.fraction(top[0], o):.2f} "
                         f"of its error, a drop of {_pct(-result.change(top[0], o))}.")
    quiet = result.without_effect()
    forward = [q for q in quiet if q.startswith("mamba_mimo_fwd.")]
    if forward:
        moved = [q for q in forward if result.row(q).errors.get("Out") != result.policy_error.get("Out")]
        lines.append(f"* {len(forward)} forward sites change no gradient ({len(moved)} of them move `Out`): the "
                     "backward recomputes what it needs (stage 1) and reads no forward output.")
    return ["Reading (computed from the table): a score is the mean over the gradients of the quadrature share "
            "`sqrt(policy² − off²) / policy`, not the drop of the error; the drop is given beside it.", ""] + lines


def write_report(result: OneOffRanking, out: Path, *, dtype: str, skipped: Dict[str, str], seconds: float,
                 command: str, smoke: bool = False, device: str = "cpu", backend: str = "reference") -> Path:
    """The Markdown report (+ ``.json`` and ``.png`` next to it) of ``result``; ``smoke``: say that it is the
    generator's smoke run (one small drawn case), whose figures are not the report's; ``device``, ``backend``: where
    and on what the policy runs ran."""
    out.parent.mkdir(parents=True, exist_ok=True)
    figure = out.with_suffix(".png")
    heat = {r.label: {o: result.fraction(r, o) for o in result.outputs} for r in result.ranked()[:HEATMAP_ROWS]}
    plots.save_figure(plots.plot_score_matrix(
        heat, result.outputs, vmax=1.0, ylabel="rounding turned off", colorbar="quadrature share of the error",
        title=f"mamba3_mimo: quadrature share of each output's error, one rounding of {result.policy.name} off "
              f"(top {len(heat)}; mean over {result.n_cases} case(s))"), figure)
    payload = result.to_dict()
    payload["drop"] = {r.label: result.drop(r) for r in result.ranked()}
    prov = provenance.collect(command=command)
    payload.update({"skipped_cases": skipped, "seconds": seconds, "provenance": prov, "device": device,
                    "backend": backend})
    where = ("CPU, 1 thread" if device == "cpu" else device) + (
        "" if backend == "reference" else ", the policy runs on the Triton kernels (`backend='triton'` where the "
        "kernels express the variant, the reference elsewhere)")
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    lines = [
        f"# mamba3_mimo: which roundings make each gradient wrong ({dtype} cases)", "",
        *(["**Smoke run** (one small drawn case: a check of the generator; its figures are not the report's.)", ""]
          if smoke else []),
        provenance.markdown_header(prov) + f" {where}, {seconds:.0f} s: {len(result.rows)} one-off variants of "
        f"`{result.policy.name}` x {result.n_cases} case(s), the whole op (`mn.mamba3_mimo`, forward and "
        "`backward(dout)`) run from each case's raw inputs, errors against the op's `fp64` run (relative RMS), "
        "averaged over the cases that have the output (`sensitivity.rank_sites(..., op=\"mamba3_mimo\")`).", "",
        "Cases: " + ", ".join(f"`{n}`" for n in result.cases) + "."
        + (" Not run (the package's backward follows upstream's limits): "
           + "; ".join(f"`{n}` ({why})" for n, why in skipped.items()) + "." if skipped else ""), "",
        "A cell is the *quadrature share* of that output's error the rounding accounts for, `sqrt(policy² − off²) / "
        "policy` (independent errors add in quadrature; 0 when the variant is not closer): a share of 0.2 is a drop "
        "of the error by only 2 %. The score is its mean over the 14 gradients; *mean drop* is the mean over the "
        "gradients of `1 − off / policy`, what the error itself does. Shares of different roundings do not add up "
        "to 1: the roundings interact.", "",
        *reading(result), "",
        f"![ranking]({figure.name})", "",
        "## Per output, the three roundings removing most of its error (quadrature share; drop)", "",
        result.top_markdown(), "",
        "## Every rounding, ranked by score", "", result.to_markdown(), "",
    ]
    quiet = result.without_effect()
    if quiet:
        lines += [f"Roundings that change no gradient ({len(quiet)}): " + ", ".join(f"`{q}`" for q in quiet) + ".",
                  ""]
    if result.skipped:
        lines += ["Knob values not run (the chain cannot run them): "
                  + "; ".join(f"`{k}`: {why}" for k, why in result.skipped.items()), ""]
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/rank_whole_op_sites.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=None, help="comma-separated golden case names (default: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="markdown path (.json and .png next to it; default: the repository's report)")
    parser.add_argument("--smoke", action="store_true", help="one small drawn case instead of the golden ones")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--device", default="cpu", help="torch device of the runs (default cpu)")
    parser.add_argument("--backend", default="reference", choices=("reference", "triton"),
                        help="the whole op's backend for the policy runs (triton: the kernels, where they express "
                             "the variant; on CPU Triton's interpreter, slow)")
    command = (provenance.command_line() if argv is None
               else " ".join(["python scripts/rank_whole_op_sites.py", *argv]))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the runs are small; one thread gives the same bits on every run of this machine
    if args.smoke:
        chosen, skipped = smoke_cases(), {}
    else:
        chosen, skipped = select_cases(args.cases.split(",") if args.cases else None, args.dtype)
    if not chosen:
        raise SystemExit(f"site_ranking: no {args.dtype} golden case to rank (skipped: {skipped})")
    device = torch.device(args.device)
    chosen = {name: (_on_device(x, device), _on_device(base, device)) for name, (x, base) in chosen.items()}
    started = time.monotonic()
    result = rank_sites([x for x, _ in chosen.values()], args.policy, [base for _, base in chosen.values()],
                        op=registry.WHOLE_OP, progress=not args.quiet, names=list(chosen), backend=args.backend)
    seconds = time.monotonic() - started
    dtype = str(next(iter(chosen.values()))[0]["Q"].dtype).replace("torch.", "")
    write_report(result, args.out, dtype=dtype, skipped=skipped, seconds=seconds, command=command,
                 smoke=args.smoke, device=str(device), backend=args.backend)
    print(f"wrote {args.out} ({seconds:.0f} s)")
    return 0
