"""Load the mimo_numerics pytest plugin for the examples when the installed package does not register it.

Installed with its ``pytest11`` entry point, the package's plugin loads by itself and this file does nothing;
loading the same module twice would make pytest refuse the second registration.
"""

import importlib.metadata
import os

_PLUGIN = "mimo_numerics.pytest_plugin"


def _registered_by_entry_point() -> bool:
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    eps = importlib.metadata.entry_points()
    group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    return any(ep.value == _PLUGIN for ep in group)


if not _registered_by_entry_point():
    pytest_plugins = [_PLUGIN]
