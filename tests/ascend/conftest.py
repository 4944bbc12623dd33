"""Tests of the Ascend compile gate. They need the triton-ascend environment (.venv-ascend, built by
scripts/setup_ascend_env.sh) and skip anywhere else, e.g. in the main venv where `triton` is NVIDIA triton."""

import importlib.metadata as _md

import pytest


def _triton_ascend_present() -> bool:
    try:
        _md.version("triton-ascend")
        return True
    except _md.PackageNotFoundError:
        return False


TRITON_ASCEND = _triton_ascend_present()


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "ascend")
    skip = pytest.mark.skip(reason="needs the triton-ascend compile environment (scripts/setup_ascend_env.sh)")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.ascend_compile)
            if not TRITON_ASCEND:
                item.add_marker(skip)
