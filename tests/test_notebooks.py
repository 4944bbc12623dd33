"""The notebooks: in sync with their percent sources, outputs stripped, no library logic, and they execute."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("01_rounding_boundaries", "02_policy_swapping", "03_policy_inference", "04_forward_and_stage_two",
             "05_whole_op", "06_decode")

nbformat = pytest.importorskip("nbformat")


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_built_from_its_source_and_stripped(name):
    builder = _builder()
    path = ROOT / "notebooks" / f"{name}.ipynb"
    assert path.read_text(encoding="utf-8") == builder.render(builder.build(path.with_suffix(".py"))), \
        "stale notebook: run python scripts/build_notebooks.py"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_states_its_question_and_defines_no_logic(name):
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown"
    for part in ("**Question.**", "**Case.**", "**Presets.**"):
        assert part in first.source
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not re.search(r"^\s*(def|class|lambda)\b", cell.source, re.MULTILINE), cell.source
            assert "import matplotlib.pyplot" not in cell.source  # plotting goes through mimo_numerics.plots


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for var in ("MIMO_CASE", "MIMO_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 if "image/png" in o.get("data", {}))
    assert images >= 1, "no figure was displayed"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert errors == []
