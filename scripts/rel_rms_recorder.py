"""A pytest plugin that records every ``mimo_numerics.metrics.rel_rms`` a test computes, by test.

Used by ``scripts/measure_test_tolerances.py`` (group ``fp64_entries``) to measure, with the tests' own code and
cases, the values their tolerances bound; nothing in it changes a result. Load it with
``PYTHONPATH=scripts python -m pytest -p rel_rms_recorder ...`` and name the output file in ``MIMO_REL_RMS_RECORD``;
it writes ``{nodeid: {"file:line": {"calls", "max", "nan", "source"}}}`` per calling line (NaN values counted,
left out of ``max``; ``source`` is the calling line's text).

Tests and package modules bind ``rel_rms`` by name when they are imported, so after collection the plugin rebinds
every module attribute that is the original function to the recording one.
"""

from __future__ import annotations

import json
import linecache
import math
import os
import sys

from mimo_numerics import metrics

_ORIGINAL = metrics.rel_rms
_RECORD: dict = {}
_CURRENT = {"nodeid": None}


def _recording_rel_rms(actual, expected):
    value = _ORIGINAL(actual, expected)
    caller = sys._getframe(1)
    where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
    by_caller = _RECORD.setdefault(_CURRENT["nodeid"] or "<outside a test>", {})
    entry = by_caller.setdefault(where, {"calls": 0, "max": 0.0, "nan": 0,
                                         "source": linecache.getline(caller.f_code.co_filename,
                                                                     caller.f_lineno).strip()})
    entry["calls"] += 1
    if math.isnan(value):
        entry["nan"] += 1
    else:
        entry["max"] = max(entry["max"], value)
    return value


def _rebind() -> None:
    for module in list(sys.modules.values()):
        if getattr(module, "rel_rms", None) is _ORIGINAL:
            module.rel_rms = _recording_rel_rms


def pytest_configure(config):
    _rebind()


def pytest_collection_finish(session):
    _rebind()


def pytest_runtest_setup(item):
    _CURRENT["nodeid"] = item.nodeid


def pytest_runtest_teardown(item):
    _CURRENT["nodeid"] = None


def pytest_unconfigure(config):
    target = os.environ.get("MIMO_REL_RMS_RECORD")
    if target:
        with open(target, "w", encoding="utf-8") as f:
            json.dump(_RECORD, f, indent=1)
