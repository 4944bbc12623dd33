#!/usr/bin/env python
"""Run upstream's own test file for the op against ``mimo_numerics.compat`` and write the report.

    python scripts/run_upstream_op_tests.py --test-file PATH/tests/ops/tilelang/test_mamba3_mimo.py
    python scripts/run_upstream_op_tests.py --test-file PATH --policies upstream_sm90 --device cuda

``PATH`` is a checkout of state-spaces/mamba at the modelled version (``git clone --branch v2.3.2.post1
https://github.com/state-spaces/mamba``; the sdist does not ship this file). Nothing of it is copied into this
repository: the file is read from there, adapted in a temporary folder and run with pytest's
``--mamba-ssm-compat`` (the package's plugin), once per policy (``--mamba-ssm-compat-policy``). It needs
``einops`` (``pip install einops``), which upstream's test imports.

The adaptation, and nothing else (printed in the report):

* the test's module-level skip of a machine without CUDA, TileLang and Triton is removed (the compat layer needs
  none of them);
* ``--device cpu`` (default): tensors the test creates on ``"cuda"`` are created on the CPU, and its fixed sizes
  shrink so that the references run in seconds on a CPU: ``FIXED_B`` 4 -> 1, ``FIXED_S`` 2048 -> 128, ``FIXED_H``
  16 -> 2 (every ``N, P, R, C`` of its grids is kept; its varlen tests draw their own lengths from C).
  ``--device cuda`` keeps the device and the sizes.

The report (default ``reports/upstream_op_tests_on_compat.md``) gives per policy the pytest counts and the test's
own figure, ``stable_max_rel`` (max |ours − its reference| / max |its reference| per tensor; its gate is 0.10), worst
over every comparison it prints.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mimo_numerics import provenance

DEFAULT_OUT = provenance.ROOT / "reports" / "upstream_op_tests_on_compat.md"
#: The CPU run's sizes, by upstream's constant names: (upstream's value, the CPU run's).
CPU_SIZES = {"FIXED_B": (4, 1), "FIXED_S": (2048, 128), "FIXED_H": (16, 2)}
_SKIP = re.compile(r"    if not torch\.cuda\.is_available\(\):\n.*?\n    pytest\.importorskip\(\"tilelang\"\)\n"
                   r"    pytest\.importorskip\(\"triton\"\)\n", re.S)


def adapt(source: str, device: str) -> str:
    """Upstream's test source with the adaptation of the module docstring; ValueError if a rewrite finds nothing to
    rewrite (another version of the file)."""
    source, n = _SKIP.subn("    pass  # (mimo_numerics: the CUDA/TileLang/Triton skip removed)\n", source)
    if n != 1:
        raise ValueError("the test's CUDA/TileLang skip was not found: not the 2.3.2.post1 test file?")
    if device == "cpu":
        source = source.replace('device="cuda"', 'device="cpu"')
        for name, (theirs, ours) in CPU_SIZES.items():
            source, n = re.subn(rf"^{name} = {theirs}$", f"{name} = {ours}", source, flags=re.M)
            if n != 1:
                raise ValueError(f"{name} = {theirs} was not found: not the 2.3.2.post1 test file?")
    return source


def run(test_file: Path, policy: str, device: str) -> dict:
    """pytest on the adapted file under ``policy``: counts, the worst ``stable_max_rel``, seconds, the tail."""
    with tempfile.TemporaryDirectory() as tmp:
        adapted = Path(tmp) / "test_mamba3_mimo_upstream.py"
        adapted.write_text(adapt(test_file.read_text(encoding="utf-8"), device), encoding="utf-8")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(adapted),
                               "--mamba-ssm-compat", "--mamba-ssm-compat-policy", policy],
                              capture_output=True, text=True, cwd=tmp)
        seconds = time.monotonic() - started
    text = done.stdout + done.stderr
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text)}
    rels = [float(v) for v in re.findall(r"stable_max_rel=([0-9.eE+-]+)", text)]
    return {"policy": policy, "returncode": done.returncode, "counts": counts, "worst": max(rels, default=None),
            "comparisons": len(rels), "seconds": seconds, "tail": text.strip().splitlines()[-1:]}


def write_report(results: list, out: Path, test_file: Path, device: str, command: str) -> None:
    """The Markdown report of :func:`run`'s results (one row per policy) with the provenance header."""
    prov = provenance.collect(command=command)
    sizes = ", ".join(f"`{k}` {a} -> {b}" for k, (a, b) in CPU_SIZES.items())
    lines = [f"# Upstream's test file for the op, run against `mimo_numerics.compat` ({device})", "",
             provenance.markdown_header(prov), "",
             f"The file: `tests/ops/tilelang/test_mamba3_mimo.py` of state-spaces/mamba (`{test_file.name}`, read "
             "from a checkout of v2.3.2.post1, not part of this repository), run by pytest with "
             "`--mamba-ssm-compat --mamba-ssm-compat-policy P`. Adapted: its CUDA/TileLang/Triton skip removed"
             + (f"; tensors on the CPU; sizes {sizes} (its N, P, R, C grids kept)." if device == "cpu" else "."),
             "", "| policy | passed | failed | skipped | comparisons | worst stable_max_rel (gate 0.10) | s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["counts"]
        worst = "-" if r["worst"] is None else f"{r['worst']:.4f}"
        lines.append(f"| `{r['policy']}` | {c.get('passed', 0)} | {c.get('failed', 0) + c.get('error', 0)} | "
                     f"{c.get('skipped', 0)} | {r['comparisons']} | {worst} | {r['seconds']:.0f} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    """Run the file once per policy, print a line each, write the report; exit 1 if a run failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--test-file", type=Path, required=True,
                        help="upstream's tests/ops/tilelang/test_mamba3_mimo.py (a v2.3.2.post1 checkout)")
    parser.add_argument("--policies", default="upstream_sm90,fp32")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if not args.test_file.is_file():
        parser.error(f"--test-file {args.test_file}: no such file")
    command = provenance.command_line() if argv is None else " ".join(["python scripts/run_upstream_op_tests.py",
                                                                      *argv])
    # the checkout's own folder is this machine's: the report names it MAMBA
    inside = "tests/ops/tilelang/test_mamba3_mimo.py"
    if args.test_file.resolve().as_posix().endswith("/" + inside):
        command = command.replace(str(args.test_file), "MAMBA/" + inside)
    results = []
    for policy in args.policies.split(","):
        results.append(run(args.test_file, policy, args.device))
        r = results[-1]
        print(f"{policy}: {r['counts']}, worst stable_max_rel {r['worst']}, {r['seconds']:.0f} s", flush=True)
    write_report(results, args.out, args.test_file, args.device, command)
    print(f"wrote {args.out}")
    return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
