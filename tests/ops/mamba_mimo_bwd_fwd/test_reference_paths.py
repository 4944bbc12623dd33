"""The stage-1 reference's two implementations: the cache-blocked CPU path (``reference_cpu``) and the whole-tensor
path (``reference_generic``, every other device) give one result.

On one machine they give the same bits (``python scripts/check_reference_bits.py vs-generic``: the CPU path issues
the generic path's GEMMs with the same operand layouts). Bits of FP32 GEMMs are a property of the machine's BLAS,
not of this code, so the suite checks the paths against each other within ``same_policy_rel_rms``
(``docs/reproducibility.md``) and checks exactly only what is BLAS-free: shapes, dtypes, strides, the record's stage
names and where the non-finite values are.
"""

import pytest
import torch

from mimo_numerics import presets, tolerances
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, grid, make_inputs
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference_cpu

#: The presets that define stage 1 (seed_bf16 included: it is defined for stage 1).
POLICIES = ("fp64", "fp32", "seed_bf16", "upstream_sm80", "upstream_sm90", "upstream_sm90_fp16")
SMOKE = grid("smoke")


def _run(inputs, policy, fast: bool, record=None):
    saved = reference.CPU_FAST_PATH
    reference.CPU_FAST_PATH = fast
    try:
        return reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy, record=record)
    finally:
        reference.CPU_FAST_PATH = saved


def _strides(x):
    """The strides of the dims that address data (size-1 dims may have any stride)."""
    return tuple(st for size, st in zip(x.shape, x.stride()) if size > 1)


def _inputs_for(spec, policy):
    lp = presets.get(policy).lp_dtype
    return make_inputs(spec.replace(dtype=lp) if spec.dtype != lp else spec)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("spec", SMOKE, ids=[s.case_id for s in SMOKE])
def test_cpu_path_matches_the_whole_tensor_path(spec, policy, monkeypatch):
    monkeypatch.setattr(reference_cpu, "BLOCK_CHUNKS", 1)  # one chunk per block: the blocking is exercised
    inputs = _inputs_for(spec, policy)
    fast_record, generic_record = {}, {}
    fast = _run(inputs, policy, True, fast_record)
    generic = _run(inputs, policy, False, generic_record)
    limit = tolerances.get("same_policy_rel_rms")
    for name in fast._fields:
        a, b = getattr(fast, name), getattr(generic, name)
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert (a.shape, a.dtype) == (b.shape, b.dtype), name
        assert _strides(a) == _strides(b), name
        assert rel_rms(a, b) <= limit, (name, rel_rms(a, b))
    assert list(fast_record) == list(generic_record)
    for stage in fast_record:
        a, b = fast_record[stage], generic_record[stage]
        assert a.shape == b.shape and a.dtype == b.dtype, stage
        assert rel_rms(a, b) <= limit, (stage, rel_rms(a, b))


def test_cpu_path_propagates_nonfinite_values_like_the_whole_tensor_path():
    inputs = make_inputs(SMOKE[0])
    inputs["q"] = inputs["q"].clone()
    inputs["q"][0, 3, 0, 0, 1] = float("nan")
    inputs["v"] = inputs["v"].clone()
    inputs["v"][0, 9, 0, 2] = float("inf")
    fast, generic = _run(inputs, "upstream_sm90", True), _run(inputs, "upstream_sm90", False)
    for name in fast._fields:
        a, b = getattr(fast, name), getattr(generic, name)
        if a is not None:
            assert torch.equal(torch.isnan(a), torch.isnan(b)), name
            assert torch.equal(torch.isinf(a), torch.isinf(b)), name


def test_cpu_path_handles_sliced_gemm_operands():
    """P = 1, N = 2: the generic path's GEMM operands are slices with padded rows (a CI failure before the CPU
    path mirrored them)."""
    spec = SMOKE[0].replace(state_dim=4, value_dim=1, rank=1, heads=2, seqlen=3, chunk_size=2,
                            rotary_dim_divisor=2)
    inputs = make_inputs(spec)
    fast, generic = _run(inputs, "upstream_sm90", True), _run(inputs, "upstream_sm90", False)
    for name in fast._fields:
        a, b = getattr(fast, name), getattr(generic, name)
        if a is not None:
            assert rel_rms(a, b) <= tolerances.get("same_policy_rel_rms"), name
