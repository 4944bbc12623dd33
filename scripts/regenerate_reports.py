#!/usr/bin/env python
"""Regenerate the CPU reports of ``reports/README.md`` (the index) at the current commit, and time each one.

    python scripts/regenerate_reports.py            # every CPU report with a command, one after the other
    python scripts/regenerate_reports.py --only golden_fwd --only whole_op_golden
    python scripts/regenerate_reports.py --smoke    # every smoke command, into a temporary folder (the test suite)
    python scripts/regenerate_reports.py --list     # the index: CPU reports, then GPU reports and records

Each command runs from the repository root with ``bash -c``. After a full (not ``--smoke``) run the index's commit
column is set to the commit of the run (``git rev-parse --short HEAD``), and the wall time of every command is
printed and written to ``reports/measurements/regenerate_reports.json``. The GPU reports are listed, not run: they
are made on an H200. Run it from a clean commit: every report's header says whether the source tree was clean.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List

from mimo_numerics import provenance

ROOT = provenance.ROOT
INDEX = ROOT / "reports" / "README.md"
TIMES = ROOT / "reports" / "measurements" / "regenerate_reports.json"
KINDS = ("cpu", "gpu", "record")


@dataclass
class Entry:
    """One row of the index."""

    name: str
    path: str
    kind: str
    command: str
    smoke: str
    commit: str


def _cell(text: str) -> str:
    text = text.strip()
    if text.startswith("`") and text.count("`") == 2 and text.endswith("`"):
        return text[1:-1]
    return text


def read_index(index: Path = INDEX) -> List[Entry]:
    """The rows of the index table (the table whose header starts with ``| name | path |``)."""
    entries, in_table = [], False
    for line in index.read_text(encoding="utf-8").splitlines():
        if line.startswith("| name | path |"):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            if entries:
                break
            continue
        if set(line.replace("|", "").strip()) <= set("-: "):
            continue
        cells = [c for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 6:
            raise ValueError(f"{index}: a row must have 6 cells, got {len(cells)}: {line}")
        entry = Entry(*[_cell(c) for c in cells])
        if entry.kind not in KINDS:
            raise ValueError(f"{index}: kind of {entry.name!r} must be one of {KINDS}, got {entry.kind!r}")
        entries.append(entry)
    if not entries:
        raise ValueError(f"{index} has no index table")
    return entries


def is_command(text: str) -> bool:
    return text.startswith(("python ", "bash ", "mimo-numerics "))


def command_parts(command: str) -> List[str]:
    """The commands of a row's ``a && b && ...`` (one for a plain command), stripped."""
    return [part.strip() for part in command.split(" && ")]


def run(command: str, timeout: float = None) -> float:
    """Run ``command`` in the repository root; its wall time in seconds (``CalledProcessError`` when it fails)."""
    start = time.perf_counter()
    subprocess.run(["bash", "-c", command], cwd=ROOT, check=True, timeout=timeout)
    return time.perf_counter() - start


def set_commits(names: List[str], commit: str, index: Path = INDEX) -> None:
    """Set the commit column of the rows ``names`` to ``commit``."""
    lines = index.read_text(encoding="utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 6 and _cell(cells[0]) in names:
            cells[5] = commit
            lines[i] = "| " + " | ".join(cells) + " |\n"
    index.write_text("".join(lines), encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=None, metavar="NAME", help="this report only (repeat)")
    parser.add_argument("--smoke", action="store_true", help="run the smoke commands into a temporary folder")
    parser.add_argument("--list", action="store_true", help="print the index and exit")
    args = parser.parse_args(argv)
    entries = read_index()
    names = {e.name for e in entries}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"--only: unknown report(s) {unknown}; known: {sorted(names)}")
    if args.list:
        for kind in KINDS:
            print(f"{kind}:")
            for e in entries:
                if e.kind == kind:
                    print(f"  {e.name:28s} {e.path:45s} {e.command if is_command(e.command) else '(' + e.command + ')'}")
        return 0
    chosen = [e for e in entries if (args.only is None or e.name in args.only)]
    times = {}
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="mimo-report-smoke-") as tmp:
            for e in chosen:
                if is_command(e.smoke):
                    times[e.name] = run(e.smoke.replace("{tmp}", tmp))
                    print(f"smoke {e.name}: {times[e.name]:.1f} s", flush=True)
        return 0
    done = set()  # the commands run, each ``a && b`` also as its parts ``a`` and ``b``
    failed = []  # a failing command stops neither the others nor the bookkeeping of those that ran
    for e in chosen:
        if e.kind != "cpu" or not is_command(e.command):
            continue
        if set(command_parts(e.command)) <= done:  # one command writes several files of the index
            continue
        try:
            times[e.name] = run(e.command)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            failed.append(e.name)
            print(f"{e.name}: FAILED ({err})", flush=True)
            continue
        done.update(command_parts(e.command))
        print(f"{e.name}: {times[e.name]:.0f} s", flush=True)
    commit = provenance.git("rev-parse", "--short", "HEAD") or "unknown"
    # every row a command wrote, also the companions (.json, .png) of a row chosen with --only, and a row whose
    # command is a part of one that ran (``reliability_slow`` of ``reliability``'s ``fast && slow``)
    regenerated = [e.name for e in entries
                   if e.kind == "cpu" and is_command(e.command) and set(command_parts(e.command)) <= done]
    set_commits(regenerated, commit)
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    # the file is {"provenance": ..., "reports": {name: {...}}}; keep the other rows' entries, not the old header
    previous = json.loads(TIMES.read_text()).get("reports", {}) if TIMES.is_file() else {}
    while "provenance" in previous and isinstance(previous.get("reports"), dict):  # files written before this fix
        nested = previous["reports"]
        previous = {k: v for k, v in previous.items() if k not in ("provenance", "reports")}
        previous = {**nested, **previous}
    previous.update({name: {"wall_s": round(t, 1), "commit": commit} for name, t in times.items()})
    TIMES.write_text(json.dumps({"provenance": provenance.collect(), "reports": previous}, indent=1) + "\n")
    gpu = [e.name for e in entries if e.kind == "gpu"]
    print(f"GPU reports (not run here, make them on an H200): {', '.join(gpu)}")
    if failed:
        print(f"FAILED (their rows keep their old commit): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
