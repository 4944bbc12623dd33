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

from mimo_numerics import presets
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs
from mimo_numerics.policy import KNOB_CONSUMERS, KNOBS, RoundingPolicy

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
    """Random policies: every honoured knob and every site of every registered operator (stage 1's sites drawn
    first); the kernels' subset has FP32 math and rounded outputs. The FP32-level models (``KNOB_CONSUMERS``:
    ``gemm_model``, ``reduction_order``) keep their defaults: not every consumer honours them, they need FP32 math,
    and tests/test_tensor_core.py and tests/ops/mamba_mimo_bwd_fwd/test_fp32_level_models.py test them."""
    fields = {}
    for knob, values in KNOBS.items():
        fields[knob] = st.just(values[0]) if knob in KNOB_CONSUMERS else st.sampled_from(values)
    if lp_dtype is not None:
        fields["lp_dtype"] = st.just(lp_dtype)
    if kernel:
        fields["math_dtype"] = st.just("float32")
        fields["round_outputs"] = st.just(True)
    order = (STAGE1,) + tuple(op for op in registry.OPERATORS if op != STAGE1)
    sections = st.tuples(*(st.fixed_dictionaries({name: st.booleans() for name in registry.site_table(op)})
                           for op in order))
    return st.builds(lambda drawn, **knobs: RoundingPolicy(sites=dict(zip(order, drawn)), **knobs), sections,
                     **fields)


@st.composite
def partial_policy_files(draw):
    """``(data, expected)``: a schema-2 policy dict with ``"base": <preset>`` that gives some knobs and, per
    operator, some sites (or none), and the policy it means, built without the file reader: the preset with those
    knobs and sites replaced (``RoundingPolicy.replace`` / ``with_sites``)."""
    base_name = draw(st.sampled_from([n for n in presets.names()
                                      if all(presets.get(n).defines(op) for op in registry.OPERATORS)]))
    expected = presets.get(base_name)
    data = {"schema_version": 2, "base": base_name}
    knobs = draw(st.dictionaries(st.sampled_from(sorted(set(KNOBS) - set(KNOB_CONSUMERS))), st.none()))
    for knob in knobs:
        data[knob] = draw(st.sampled_from(KNOBS[knob]), label=knob)
    expected = expected.replace(**{k: data[k] for k in knobs})
    sites = {}
    for op in registry.OPERATORS:
        names = draw(st.lists(st.sampled_from(tuple(registry.site_table(op))), unique=True, max_size=6), label=op)
        if names or draw(st.booleans(), label=f"{op} listed empty"):
            sites[op] = {name: draw(st.booleans(), label=f"{op}.{name}") for name in names}
            expected = expected.with_sites(op, **sites[op])
    if sites or draw(st.booleans(), label="empty sites"):
        data["sites"] = sites
    return data, expected


def run_case(fn, inputs, **kw):
    """``fn`` (reference, oracle or kernels) called on an inputs dict of ``make_inputs``."""
    return fn(*as_args(inputs), **as_kwargs(inputs), **kw)
