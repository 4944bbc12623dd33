"""The notebooks print no progress bars into their cells: every call of a package function that draws one passes
`progress=False` (a bar in a cell is ~35 lines of text under nbconvert/nbclient, or a TqdmWarning and text where
ipywidgets is missing). Read from the notebooks themselves, without executing them (tests/test_notebooks.py does
that). And the `notebooks` extra installs ipywidgets, which tqdm's notebook bar needs."""

import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
#: Modules whose public functions the notebooks call.
MODULES = ("mimo_numerics.sensitivity", "mimo_numerics.sweep", "mimo_numerics.inference", "mimo_numerics.drift",
           "mimo_numerics.report", "mimo_numerics.ops.mamba3_mimo.ranking", "mimo_numerics.ops.mamba3_mimo.report",
           "mimo_numerics.studies.ranking", "mimo_numerics.studies.report", "mimo_numerics.studies.decode_drift")
nbformat = pytest.importorskip("nbformat")


def _functions_with_a_progress_bar() -> set:
    names = set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a module that moved (mimo_numerics.studies) or is not there yet
            continue
        for name, value in vars(module).items():
            if inspect.isfunction(value) and not name.startswith("_") and \
                    "progress" in inspect.signature(value).parameters:
                names.add(name)
    return names


def test_the_progress_functions_are_found():
    assert {"rank_sites", "run_sweep", "parallel_map"} <= _functions_with_a_progress_bar()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_passes_progress_false_to_every_call_with_a_bar(name):
    progress_functions = _functions_with_a_progress_bar()
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    offending = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line  # IPython magics
                            for line in cell.source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called not in progress_functions:
                continue
            progress = [k for k in node.keywords if k.arg == "progress"]
            if not (progress and isinstance(progress[0].value, ast.Constant) and progress[0].value.value is False):
                offending.append(ast.unparse(node)[:120])
    assert offending == [], f"{name}: calls that draw a progress bar into the cell: {offending}"


def test_the_notebooks_extra_installs_ipywidgets():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(req.split(">")[0].split("=")[0].strip() == "ipywidgets" for req in extras["notebooks"])
