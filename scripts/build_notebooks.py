#!/usr/bin/env python
"""Build ``notebooks/*.ipynb`` from their jupytext "percent" sources ``notebooks/*.py`` (outputs stripped).

Usage::

    python scripts/build_notebooks.py            # (re)write every notebook
    python scripts/build_notebooks.py --check    # exit 1 when a notebook is out of date

The ``.py`` files are the sources; edit those, then rebuild. Format: cells start at lines ``# %%`` (code) or
``# %% [markdown]`` (markdown, every line starting with ``# ``, which is stripped). Text before the first marker is
ignored (a header comment). In code cells, a commented magic (``# %matplotlib inline``) is uncommented, as
jupytext does, so the ``.py`` stays valid Python. This is a small subset of jupytext's percent format, so
``jupytext --sync`` reads the same files; jupytext is not needed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Tuple

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def parse_percent(text: str) -> List[Tuple[str, str]]:
    """The cells of a percent-format script as ``(kind, source)``; kind is ``"code"`` or ``"markdown"``."""
    cells: List[Tuple[str, List[str]]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# %%"):
            kind = "markdown" if "[markdown]" in stripped else "code"
            cells.append((kind, []))
            continue
        if not cells:
            continue
        kind, lines = cells[-1]
        if kind == "code" and re.match(r"^# %[A-Za-z]", line):
            line = line[2:]
        if kind == "markdown":
            if line.startswith("# "):
                line = line[2:]
            elif line.strip() == "#":
                line = ""
        lines.append(line)
    result = []
    for kind, lines in cells:
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        result.append((kind, "\n".join(lines)))
    return result


def build(source: Path) -> nbformat.NotebookNode:
    """The notebook of one percent source, with no outputs and no execution counts."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
    for i, (kind, text) in enumerate(parse_percent(source.read_text(encoding="utf-8"))):
        cell = nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        cell["id"] = f"{source.stem[:2]}-cell-{i:02d}"  # stable ids: rebuilding gives identical files
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def sources() -> List[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that every notebook is up to date")
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        target = source.with_suffix(".ipynb")
        text = render(build(source))
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python scripts/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
