"""scripts/mutation_check.py's plumbing: every mutant's text is found, and on a tiny repository a caught mutant, a
surviving one and one whose text is gone are reported as such without touching the source tree."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_check"] = module
    spec.loader.exec_module(module)
    return module


def test_mutation_check_lists_every_mutant_with_its_text_found(tool, capsys):
    assert len(tool.MUTANTS) >= 12 and len({m.id for m in tool.MUTANTS}) == len(tool.MUTANTS)
    areas = {m.area for m in tool.MUTANTS}
    assert {"reference", "kernels", "epilogue", "policy I/O", "gates", "bundles"} <= areas
    assert tool.main(["--list"]) == 0, capsys.readouterr().out


def test_mutation_check_on_a_tiny_repository(tool, tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef unused(a):\n    return a\n")
    (repo / "tests" / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    copy = tmp_path / "copy"
    tool.copy_tree(repo, copy)
    assert (copy / "calc.py").read_text() == (repo / "calc.py").read_text()
    mutant = tool.Mutant
    caught = tool.run_mutant(copy, mutant("sub", "x", "x", "calc.py", "a + b", "a - b", ("tests",)), 300)
    survived = tool.run_mutant(copy, mutant("dead", "x", "x", "calc.py", "return a\n", "return -a\n", ("tests",)), 300)
    gone = tool.run_mutant(copy, mutant("gone", "x", "x", "calc.py", "a * b", "a / b", ("tests",)), 300)
    assert (caught["status"], survived["status"], gone["status"]) == ("caught", "SURVIVED", "TEXT NOT FOUND")
    assert "occurs 0 times" in gone["detail"]
    assert (copy / "calc.py").read_text() == (repo / "calc.py").read_text()  # restored after each mutant
    report = tmp_path / "out" / "mc"
    tool.write_report([caught, survived, gone], tool.provenance.collect(["--only", "sub"]), report)
    text = report.with_suffix(".md").read_text()
    assert "1 of 3 mutants caught" in text and "git describe --always --dirty" in text
