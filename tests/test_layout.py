"""Packaging: the top-level kernels/ folder imports as mimo_numerics.kernels; the reference never imports triton."""

import subprocess
import sys
from pathlib import Path

import mimo_numerics

ROOT = Path(__file__).resolve().parents[1]


def test_layout_kernels_folder_is_installed_as_mimo_numerics_kernels():
    import mimo_numerics.kernels as kernels

    assert Path(kernels.__file__).resolve().parent == (ROOT / "kernels").resolve()
    assert Path(mimo_numerics.__file__).resolve().parent == (ROOT / "mimo_numerics").resolve()


def test_layout_no_top_level_kernels_package_is_installed():
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('kernels') is None else 1)"
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_layout_reference_oracle_and_policy_do_not_import_triton():
    code = ("import sys; import mimo_numerics as mn; import mimo_numerics.reference, mimo_numerics.oracle, "
            "mimo_numerics.cases, mimo_numerics.metrics; sys.exit(1 if 'triton' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0
