"""A partial policy file (``"base": <preset>`` with per-operator site overrides) is honoured on read for every
operator: stage 2's ``dk_unrotate: false`` and one site of each other operator, read from a file, round-tripped, and
seen in each operator's reference (the property over random partial files is
``tests/test_reliability_properties.py::test_partial_policy_file_is_read_field_by_field``)."""

from __future__ import annotations

import json

import pytest
import torch

from mimo_numerics import operator as _operator
from mimo_numerics import presets, testing
from mimo_numerics.policy import RoundingPolicy

#: operator -> (site switched off by the file, an output that site changes on the first smoke case)
OVERRIDES = {
    "mamba_mimo_bwd_bwd": ("dk_unrotate", "dk"),
    "mamba_mimo_fwd": ("out_proj", "o"),
    "mamba_mimo_bwd_fwd": ("out", "dz"),
}
BASE = "upstream_sm90"


@pytest.fixture(scope="module")
def partial_file(tmp_path_factory):
    data = {"schema_version": 2, "base": BASE, "sites": {op: {site: False} for op, (site, _) in OVERRIDES.items()}}
    path = tmp_path_factory.mktemp("policy") / "partial.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_partial_file_sets_exactly_its_sites(partial_file):
    policy = presets.resolve(str(partial_file))
    expected = presets.get(BASE)
    for op, (site, _) in OVERRIDES.items():
        expected = expected.with_sites(op, **{site: False})
    assert policy == expected, policy.diff(expected)
    assert policy.diff(presets.get(BASE)) == {f"{op}.{site}": (False, True) for op, (site, _) in OVERRIDES.items()}
    assert RoundingPolicy.from_json(policy.to_json()) == policy
    assert RoundingPolicy.from_json(partial_file.read_text()) == policy


@pytest.mark.parametrize("op", list(OVERRIDES))
def test_partial_file_changes_each_operators_reference(op, partial_file):
    site, output = OVERRIDES[op]
    spec = _operator.get(op)
    case = spec.cases("smoke")[0]
    inputs = testing.case_inputs(case, spec)
    read = presets.resolve(str(partial_file))
    with torch.no_grad():
        got = testing.as_output_dict(spec.run_reference(inputs, read), spec)
        want = testing.as_output_dict(spec.run_reference(inputs, presets.get(BASE).with_sites(op, **{site: False})),
                                      spec)
        base = testing.as_output_dict(spec.run_reference(inputs, presets.get(BASE)), spec)
    for name in spec.output_names:
        assert (got[name] is None) == (want[name] is None), name
        if got[name] is not None:
            assert torch.equal(got[name], want[name]), f"{op}.{name}: the file's {site}=false is not what ran"
    assert not torch.equal(got[output], base[output]), f"{op}.{site} off does not change {output} on {case.case_id}"
