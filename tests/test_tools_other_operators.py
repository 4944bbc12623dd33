"""The research tools (sensitivity, inference) on the forward and on stage 2: the same functions, ``op=``."""

import pytest

from mimo_numerics import inference, operator, presets, sensitivity
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops import registry
from mimo_numerics.policy import PolicyUndefined

TINY = CaseSpec(formula="realistic", seqlen=12, heads=2, state_dim=16, value_dim=8, rank=2, chunk_size=4,
                has_z=True, has_d=True)


@pytest.fixture(scope="module", params=["mamba_mimo_fwd", "mamba_mimo_bwd_bwd"])
def op_and_inputs(request):
    op = operator.get(request.param)
    return op, op.draw(TINY)


def test_rank_sites_ranks_the_operators_own_sites(op_and_inputs):
    op, x = op_and_inputs
    table = sensitivity.rank_sites(x, "upstream_sm90", op=op.name)
    switches = {r.site for r in table.rows if r.kind == "switch"}
    assert switches == set(registry.site_table(op.name))
    assert table.outputs == tuple(n for n in op.output_names if n in table.policy_error)
    assert table.operator == op.name and table.policy_error  # the policy's own error is measured
    # some site of the operator carries error on its own (the table is not all zeros)
    assert max(r.score for r in table.rows) > 0


def test_infer_policy_recovers_upstream_from_fp32(op_and_inputs):
    op, x = op_and_inputs
    target = inference.run_reference(x, "upstream_sm90", op=op.name)
    result = inference.infer_policy(x, target, start="fp32", op=op.name)
    assert result.distance == 0.0 and result.operator == op.name
    check = inference.compare_to_truth(x, "upstream_sm90", result)
    assert check["exact"], check


def test_start_must_define_the_operator(op_and_inputs):
    op, x = op_and_inputs
    target = inference.run_reference(x, "upstream_sm90", op=op.name)
    with pytest.raises(ValueError, match="defines no rounding"):
        inference.infer_policy(x, target, start="seed_bf16", op=op.name)
    with pytest.raises(PolicyUndefined):
        sensitivity.rank_sites(x, "seed_bf16", op=op.name)


def test_attribute_gap_names_the_operators_fields(op_and_inputs):
    op, x = op_and_inputs
    base = presets.get("upstream_sm90")
    site = next(iter(registry.site_table(op.name)))
    gap = sensitivity.attribute_gap(x, base.with_sites(op.name, **{site: False}), base, op=op.name)
    assert [r.field for r in gap.rows] == [site]
