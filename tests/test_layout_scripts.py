"""Layout of scripts/, benchmarks/, golden/ and reports/ (issue 21, items 6 and 7; issue 26, acceptance 1).

* no script imports ``tests/`` (what scripts need lives in the package) and none edits ``sys.path``;
* no file under ``reports/`` names an absolute machine path;
* ``reports/README.md`` (the index) lists every file under ``reports/``, each row with a known kind and, for a
  generated report, a command;
* every Markdown report named in the index with a generator names a commit in its first lines.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_DIRS = ("scripts", "benchmarks", "golden")
REPORTS = ROOT / "reports"
SUPPORT_MODULES = {p.stem for p in (ROOT / "tests").glob("*_support.py")} | {"conftest"}
#: An absolute path of some machine (a home, a temp folder, a work tree).
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|tmp|home)/")


def _scripts():
    return sorted(p for d in SCRIPT_DIRS for p in (ROOT / d).glob("*.py"))


def _index():
    sys.path.insert(0, str(ROOT / "scripts"))  # the test imports the driver; scripts themselves never do this
    try:
        import regenerate_reports
    finally:
        sys.path.pop(0)
    return regenerate_reports


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_script_imports_tests_or_edits_sys_path(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        bad = [n for n in names if n in SUPPORT_MODULES or n == "tests"]
        assert not bad, f"{path.relative_to(ROOT)}:{node.lineno} imports {bad} from tests/"
        if isinstance(node, ast.Attribute) and node.attr in ("insert", "append") and \
                ast.unparse(node.value) == "sys.path":
            pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} edits sys.path (install the package instead)")


def _report_files():
    return sorted(p for p in REPORTS.rglob("*") if p.is_file())


def test_no_machine_path_in_reports():
    found = []
    for path in _report_files():
        if path.suffix.lower() in (".png", ".pt", ".safetensors"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "absolute machine paths in reports/:\n" + "\n".join(found[:30])


def test_index_lists_every_file_under_reports():
    entries = _index().read_index()
    covered = [REPORTS / e.path for e in entries]
    missing = [str(p.relative_to(REPORTS)) for p in _report_files() if p.name != ".gitkeep"
               and not any(p == c or c in p.parents for c in covered)]
    assert not missing, f"files under reports/ that reports/README.md does not list: {missing}"
    absent = [e.path for e in entries if not (REPORTS / e.path).exists()]
    assert not absent, f"reports/README.md lists paths that do not exist: {absent}"
    names = [e.name for e in entries]
    assert len(names) == len(set(names)), "report names in the index must be unique"


#: Reports whose header predates mimo_numerics.provenance and names no commit: they lose their place here when
#: ``scripts/regenerate_reports.py`` (or the Ascend gate) regenerates them; the test fails if one is fixed and still
#: listed, or a new one joins. Empty since every such report was regenerated or marked "not rerun since <commit>".
PENDING_NO_COMMIT: set = set()


def test_every_generated_report_names_a_commit():
    commit = re.compile(r"commit[^\n]{0,40}?`?\b[0-9a-f]{7,40}\b|not rerun since")
    missing = []
    for e in _index().read_index():
        path = REPORTS / e.path
        if e.kind == "record" or not path.is_file() or path.suffix != ".md":
            continue
        head = "\n".join(path.read_text(encoding="utf-8").splitlines()[:12])
        if not commit.search(head):
            missing.append(e.path)
    assert set(missing) == PENDING_NO_COMMIT, (f"reports whose first lines name no commit: {sorted(missing)}; "
                                               f"known and pending regeneration: {sorted(PENDING_NO_COMMIT)}")


def test_index_commands_name_existing_scripts():
    for e in _index().read_index():
        for text in (e.command, e.smoke):
            for script in re.findall(r"(?:python|bash) ((?:scripts|benchmarks|golden)/[\w./-]+)", text):
                assert (ROOT / script).is_file(), f"{e.name}: {script} does not exist"


def test_regenerate_reports_command_parts_cover_the_rows_of_a_combined_command():
    """``reliability``'s ``fast && slow`` writes the files of ``reliability_fast`` and ``reliability_slow``: the
    driver marks those rows (and does not run their commands again) from the parts of the command that ran."""
    regenerate_reports = _index()
    assert regenerate_reports.command_parts("python a.py --x && python b.py") == ["python a.py --x", "python b.py"]
    rows = {e.name: e for e in regenerate_reports.read_index()}
    combined = set(regenerate_reports.command_parts(rows["reliability"].command))
    assert set(regenerate_reports.command_parts(rows["reliability_slow"].command)) <= combined
    assert set(regenerate_reports.command_parts(rows["reliability_fast"].command)) <= combined


def test_regenerate_reports_keeps_going_past_a_failing_command(monkeypatch, tmp_path):
    """A failing command (``measure_fwd_golden`` once was one) neither stops the reports after it nor loses the
    commits and times of those that ran; the driver exits 1 naming it."""
    import subprocess

    regenerate_reports = _index()
    entries = [regenerate_reports.Entry("bad", "bad.md", "cpu", "python bad.py", "-", "old"),
               regenerate_reports.Entry("good", "good.md", "cpu", "python good.py", "-", "old")]

    def fake_run(command, timeout=None):
        if "bad" in command:
            raise subprocess.CalledProcessError(1, command)
        return 1.0

    marked = {}
    monkeypatch.setattr(regenerate_reports, "read_index", lambda: entries)
    monkeypatch.setattr(regenerate_reports, "run", fake_run)
    monkeypatch.setattr(regenerate_reports, "set_commits",
                        lambda names, commit: marked.update(dict.fromkeys(names, commit)))
    monkeypatch.setattr(regenerate_reports, "TIMES", tmp_path / "times.json")
    assert regenerate_reports.main([]) == 1
    assert set(marked) == {"good"}
    assert "good" in (tmp_path / "times.json").read_text() and "bad" not in (tmp_path / "times.json").read_text()
