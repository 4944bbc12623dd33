"""Shared set-up of the tests/test_reliability_*.py files: hypothesis profiles, case counters, kernel probe,
the random-policy strategy and the call helper.

Profiles ``mimo-reliability-fast`` and ``-slow`` are derandomized (reproducible in CI) unless
``MIMO_RELIABILITY_EXPLORE`` is set (fresh random examples; changes which examples run, never a result). Each test
module keeps a ``collections.Counter`` of generated cases; ``scripts/reliability.py`` sets
``MIMO_RELIABILITY_STATS`` to collect them into ``<dir>/<module>.json`` for the report.
"""

import collections
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as SWITCHES
from mimo_numerics.policy import KNOBS, RoundingPolicy

_EXPLORE = bool(os.environ.get("MIMO_RELIABILITY_EXPLORE"))
_QUIET = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
          HealthCheck.large_base_example]
for _profile in ("fast", "slow"):
    settings.register_profile(f"mimo-reliability-{_profile}", deadline=None, database=None,
                              derandomize=not _EXPLORE, print_blob=True, suppress_health_check=_QUIET)


def profile(name: str, examples: int) -> settings:
    """The hypothesis settings of one property in profile ``name`` ("fast" or "slow")."""
    return settings(settings.get_profile(f"mimo-reliability-{name}"), max_examples=examples)


def counts_writer(counts: collections.Counter, module_file: str):
    """An autouse module fixture writing ``counts`` to ``$MIMO_RELIABILITY_STATS/<module>.json`` at module end."""

    @pytest.fixture(scope="module", autouse=True)
    def _write_counts():
        yield
        target = os.environ.get("MIMO_RELIABILITY_STATS")
        if target and counts:
            path = Path(target) / f"{Path(module_file).stem}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")

    return _write_counts


def kernels_or_none():
    """``mimo_numerics.kernels`` when Triton is usable, else None."""
    try:
        from mimo_numerics import kernels
    except ImportError:
        return None
    return kernels if kernels.triton_available() else None


STAGE1 = "mamba_mimo_bwd_fwd"


def policies(lp_dtype=None, kernel=False):
    """Random policies: every switch and honoured knob; the kernels' subset has FP32 math and rounded outputs."""
    fields = {}
    for knob, values in KNOBS.items():
        fields[knob] = st.sampled_from(values)
    if lp_dtype is not None:
        fields["lp_dtype"] = st.just(lp_dtype)
    if kernel:
        fields["math_dtype"] = st.just("float32")
        fields["round_outputs"] = st.just(True)
    switches = st.fixed_dictionaries({name: st.booleans() for name in SWITCHES})
    return st.builds(lambda sites, **knobs: RoundingPolicy(sites={STAGE1: sites}, **knobs), switches, **fields)


def run_case(fn, inputs, **kw):
    """``fn`` (reference, oracle or kernels) called on an inputs dict of ``make_inputs``."""
    return fn(*as_args(inputs), **as_kwargs(inputs), **kw)
