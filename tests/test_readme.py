"""The README tells a new user how to install and open what the package ships (extras, notebooks)."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_says_how_to_install_and_open_the_notebooks():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert "notebooks" in extras
    text = _readme()
    assert 'pip install -e ".[notebooks]"' in text
    assert "jupyter lab notebooks/" in text
    named = set(re.findall(r"\b(0\d_[a-z_]+)\b", text))
    shipped = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert shipped and shipped <= named, f"notebooks the README does not name: {sorted(shipped - named)}"
