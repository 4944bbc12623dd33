"""Mutation check: targeted bugs that the default test suite must catch.

Each mutant is ``(id, file, exact original text, replacement, test selection)``: a deliberate bug in a reference,
a kernel, the epilogue, the policy reader, a gate or the bundles, and the tests of the *default* suite (no ``-m
slow``) that must fail with it. The tool copies the repository (the files git tracks plus the untracked ones it does
not ignore, as they are in the working tree) into a temporary folder once, and for each mutant writes the
replacement there, runs the selection with ``python -m pytest -x -q`` in the copy, and restores the file. The user's
tree is never written. ``mimo_numerics`` and ``mimo_numerics.kernels`` are imported from the copy (checked before
the first mutant).

A mutant is ``caught`` when its selection fails, ``SURVIVED`` when it passes, ``TEXT NOT FOUND`` when its original
text does not occur exactly once in its file (a file moved or edited: update the mutant), ``ERROR`` when pytest
could not run it (exit code 2-5), ``BASELINE FAILS`` when its selection already fails on the unmutated copy (every
distinct selection is run once without a mutant first). The exit status is 1 unless every mutant is caught.

    python scripts/mutation_check.py                    # every mutant; writes reports/mutation_check.md and .json
    python scripts/mutation_check.py --list             # the mutants and whether their text is found; runs nothing
    python scripts/mutation_check.py --only gate_floor_x10 --only bundle_sha256_skipped --out /tmp/mc
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from mimo_numerics import provenance

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    """One targeted bug: in ``file`` (relative to the repository root) the exact ``original`` text, occurring once,
    becomes ``replacement``; ``tests`` (pytest arguments: files or node ids, ``-k`` expressions) must fail."""

    id: str
    area: str
    what: str
    file: str
    original: str
    replacement: str
    tests: Tuple[str, ...]


_READ = "sections[op] = sections[op].replace(**value)"


def _ignore_site_on_read(op: str) -> str:
    return f'sections[op] = sections[op] if op == "{op}" else sections[op].replace(**value)'


MUTANTS: Tuple[Mutant, ...] = (
    Mutant("ref_stage1_out_unrounded", "reference",
           "stage 1 (its CPU path, the one CPU tensors take): the `out` site (o rounded to lp) skipped",
           "mimo_numerics/ops/mamba_mimo_bwd_fwd/reference_cpu.py", 'out = pol.site_("out", o)', "out = o",
           ("tests/ops/mamba_mimo_bwd_fwd/test_reference.py", "-k", "every_switch_changes_the_outputs and out")),
    Mutant("ref_fwd_out_proj_unrounded", "reference", "forward: the `out_proj` site skipped",
           "mimo_numerics/ops/mamba_mimo_fwd/reference.py", 'o_rank = rnd("out_proj", out * phi)',
           "o_rank = out * phi", ("tests/ops/mamba_mimo_fwd/test_fwd_reference.py", "-k", "each_site_off")),
    Mutant("ref_stage2_dk_unrotate_follows_dq", "reference",
           "stage 2: dk's inverse rotation rounded under dq's switch (`dk_unrotate` ignored)",
           "mimo_numerics/ops/mamba_mimo_bwd_bwd/reference.py",
           'rotate(dk_rot, cos, sin, dims, rnd, "dk_unrotate", inverse=True, fma=policy.fp32_fma)',
           'rotate(dk_rot, cos, sin, dims, rnd, "dq_unrotate", inverse=True, fma=policy.fp32_fma)',
           ("tests/test_policy_partial_files.py",)),
    Mutant("epilogue_reverse_cumsum_sign", "epilogue", "the angle-dt reverse cumulative sum adds -x instead of +x",
           "mimo_numerics/ops/mamba3_mimo_epilogue/reference.py",
           "rev = (chunk_sum[..., None] - triton_tiles.tile_cumsum(part, layout)) + part",
           "rev = (chunk_sum[..., None] - triton_tiles.tile_cumsum(part, layout)) - part",
           ("tests/ops/mamba3_mimo_epilogue/test_epilogue.py", "-k", "oracle_matches_reference")),
    Mutant("kernel_diag_always_fused", "kernels", "stage-1 Triton kernels: diag_mode ignored (always fused)",
           "kernels/_config.py", 'cx["DIAG_FMA"] = policy.diag_mode == "fma"', 'cx["DIAG_FMA"] = True',
           ("tests/ops/mamba_mimo_bwd_fwd/test_kernels.py", "-k", "diag_mul_then_add")),
    Mutant("policy_read_ignores_stage2_sites", "policy I/O", "a partial file's stage-2 sites ignored on read",
           "mimo_numerics/policy.py", _READ, _ignore_site_on_read("mamba_mimo_bwd_bwd"),
           ("tests/test_policy_partial_files.py", "-k", "exactly")),
    Mutant("policy_read_ignores_forward_sites", "policy I/O", "a partial file's forward sites ignored on read",
           "mimo_numerics/policy.py", _READ, _ignore_site_on_read("mamba_mimo_fwd"),
           ("tests/test_policy_partial_files.py", "-k", "exactly")),
    Mutant("policy_read_ignores_stage1_sites", "policy I/O", "a partial file's stage-1 sites ignored on read",
           "mimo_numerics/policy.py", _READ, _ignore_site_on_read("mamba_mimo_bwd_fwd"),
           ("tests/test_policy.py", "-k", "partial_v2")),
    Mutant("policy_read_ignores_partial_knobs", "policy I/O", "a partial file's knobs ignored (the base's kept)",
           "mimo_numerics/policy.py", "return dataclasses.replace(base, sites=_Sections(sections), **data)",
           "return dataclasses.replace(base, sites=_Sections(sections))",
           ("tests/test_reliability_properties.py", "-k", "partial_policy_file and not slow")),
    Mutant("gate_floor_x10", "gates", "the noise-floor gate's floor term multiplied by 10",
           "mimo_numerics/gate_checks.py", "bound = settings.alpha * ref_err + settings.floor",
           "bound = settings.alpha * ref_err + 10 * settings.floor",
           ("tests/test_gate_independent.py", "-k", "noise_floor")),
    Mutant("gate_alpha_plus_0p02", "gates", "the noise-floor gate's alpha larger by 0.02",
           "mimo_numerics/gate_checks.py", "bound = settings.alpha * ref_err + settings.floor",
           "bound = (settings.alpha + 0.02) * ref_err + settings.floor",
           ("tests/test_gate_independent.py", "-k", "noise_floor")),
    Mutant("gate_same_policy_off", "gates", "the same-policy gate never fails",
           "mimo_numerics/gate_checks.py", "if not err_same <= tol:", "if False:",
           ("tests/test_gate_independent.py", "-k", "fails_under")),
    Mutant("bundle_sha256_skipped", "bundles", "a tensor file's sha256 not compared with the manifest",
           "mimo_numerics/bundles.py", 'if digest != info.get("sha256"):', "if False:",
           ("tests/test_bundles.py", "-k", "flipped_byte")),
)


# ---------------------------------------------------------------------------------------------------- copy and run
def text_status(root: Path, mutant: Mutant) -> Optional[str]:
    """None when ``mutant.original`` occurs exactly once in its file under ``root``; else why not."""
    path = root / mutant.file
    if not path.is_file():
        return f"file {mutant.file} does not exist"
    count = path.read_text().count(mutant.original)
    if count != 1:
        return f"original text {mutant.original!r} occurs {count} times in {mutant.file} (expected once)"
    return None


def copy_tree(source: Path, target: Path) -> None:
    """The files git tracks plus the untracked ones it does not ignore, as they are in ``source``'s working tree;
    ``mimo_numerics/kernels`` linked to ``kernels/`` as the editable install maps it."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source,
                            capture_output=True, check=True).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = source / rel
        if not src.is_file():
            continue
        dst = target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    link = target / "mimo_numerics" / "kernels"
    if (target / "kernels").is_dir() and not link.exists():
        link.symlink_to(Path("..") / "kernels", target_is_directory=True)


def _env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_from(copy: Path) -> None:
    """Fail unless ``mimo_numerics`` and ``mimo_numerics.kernels`` import from ``copy`` when run there."""
    code = "import mimo_numerics, mimo_numerics.kernels as k; print(mimo_numerics.__file__); print(k.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, env=_env())
    paths = out.stdout.split()
    if out.returncode != 0 or len(paths) != 2 or not all(Path(p).resolve().is_relative_to(copy.resolve())
                                                         for p in paths):
        raise SystemExit(f"mutation_check: the copy does not import its own package ({out.stdout.strip()!r} "
                         f"{out.stderr.strip()[-400:]!r}); nothing was run")


def _pytest(copy: Path, tests: Sequence[str], timeout: float) -> Tuple[Optional[int], str]:
    """``(exit code or None on timeout, pytest's last line)`` of the selection ``tests`` in ``copy``."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu",
               *tests]
    try:
        done = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=timeout, env=_env())
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    tail = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, next((line for line in reversed(tail) if line.strip()), "")


def baseline(copy: Path, mutants: Sequence[Mutant], timeout: float) -> dict:
    """``{selection: (exit code, last line)}`` of every distinct selection on the unmutated copy: a mutant counts
    as caught only where its selection passes without it."""
    results = {}
    for m in mutants:
        if m.tests not in results:
            results[m.tests] = _pytest(copy, m.tests, timeout)
    return results


def run_mutant(copy: Path, mutant: Mutant, timeout: float) -> dict:
    row = {"id": mutant.id, "area": mutant.area, "what": mutant.what, "file": mutant.file,
           "tests": " ".join(mutant.tests), "status": None, "seconds": 0.0, "detail": ""}
    missing = text_status(copy, mutant)
    if missing is not None:
        row.update(status="TEXT NOT FOUND", detail=missing)
        return row
    path = copy / mutant.file
    original = path.read_text()
    path.write_text(original.replace(mutant.original, mutant.replacement))
    start = time.perf_counter()
    try:
        code, last = _pytest(copy, mutant.tests, timeout)
    finally:
        path.write_text(original)
    row["seconds"] = round(time.perf_counter() - start, 1)
    if code == 1:
        row.update(status="caught", detail=last)
    elif code == 0:
        row.update(status="SURVIVED", detail=last)
    else:
        row.update(status="ERROR", detail=f"pytest exit {code}: {last}")
    return row


# ---------------------------------------------------------------------------------------------------- report
def write_report(rows: List[dict], prov: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    caught = sum(r["status"] == "caught" for r in rows)
    lines = ["# Mutation check: targeted bugs the default test suite must catch", "",
             provenance.markdown_header(prov), "",
             f"**{caught} of {len(rows)} mutants caught.** Every selection first passes on the unmutated copy; "
             "each mutant is then applied alone in a copy of the repository and its test selection run with `python -m pytest -x -q -m \"not slow and not gpu\"`; the mutants "
             "(file, exact original text, replacement, selection) are listed in `scripts/mutation_check.py`.", "",
             "| mutant | area | bug | selection | status | s | pytest's last line |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        detail = r["detail"].replace("|", "\\|")
        lines.append(f"| `{r['id']}` | {r['area']} | {r['what']} | `{r['tests']}` | {r['status']} | "
                     f"{r['seconds']} | {detail} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"provenance": prov, "mutants": rows}, indent=1) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python scripts/mutation_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and whether their text is found")
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="run this mutant (repeatable)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "mutation_check"),
                        help="report path without suffix (writes .md and .json; default reports/mutation_check)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's selection (default 300)")
    parser.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    known = {m.id for m in MUTANTS}
    unknown = [i for i in args.only if i not in known]
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; mutants: {sorted(known)}")
    mutants = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.list:
        bad = 0
        for m in mutants:
            why = text_status(root, m)
            bad += why is not None
            print(f"{m.id:40s} {m.area:11s} {'ok' if why is None else 'TEXT NOT FOUND: ' + why}")
            print(f"{'':40s} {m.file}: {' '.join(m.tests)}")
        return 1 if bad else 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="mutation_check_") as tmp:
        copy = Path(tmp) / "repo"
        copy_tree(root, copy)
        check_imports_from(copy)
        clean = baseline(copy, mutants, args.timeout)
        for m in mutants:
            code, last = clean[m.tests]
            if code != 0:
                row = {"id": m.id, "area": m.area, "what": m.what, "file": m.file, "tests": " ".join(m.tests),
                       "status": "BASELINE FAILS", "seconds": 0.0,
                       "detail": f"the selection fails without the mutant (exit {code}): {last}"}
            else:
                row = run_mutant(copy, m, args.timeout)
            print(f"{row['status']:15s} {row['seconds']:7.1f} s  {m.id}: {row['detail']}", flush=True)
            rows.append(row)
    write_report(rows, provenance.collect([str(Path(__file__).resolve())] + argv), Path(args.out))
    failed = [r["id"] for r in rows if r["status"] != "caught"]
    if failed:
        print(f"mutation_check: {len(failed)} mutant(s) not caught: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
