"""The whole op's preprocessing and epilogue on Triton kernels (``kernels/chain_steps.py``) against their references,
in Triton's interpreter: the sums over tokens, heads and the batch are the references' bits; the scans, the special
functions and ``bwd_dadt``'s sums within ``chain_kernels_vs_reference_rel_rms`` (FP32 orders and a portable tanh);
``helper_fma`` honoured; every output written; refusals named."""

from __future__ import annotations

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics.kernels import UnsupportedPolicyError, chain_steps
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.ops.mamba3_mimo.cases import make_op_inputs, small_case
from mimo_numerics.ops.mamba3_mimo_epilogue import reference as epilogue_reference
from mamba3_mimo_support import preprocessing_distance

pytestmark = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")

#: Chunk sizes 8 to 64, K = N/d from 4 to 64, G = 1 and G = H, reduced and full DOUT, fp16, a sequence tail (S not a
#: multiple of C: the preprocessing only) and B·S above the bias sums' block (BIAS_SUM_BLOCK).
CASES = {
    "C16": dict(seqlen=64, chunk_size=16, heads=2, groups=1, seed=3),
    "C16_gh_full": dict(seqlen=48, chunk_size=16, heads=4, groups=4, reduce_o=False, seed=4),
    "C16_long": dict(seqlen=608, chunk_size=16, heads=2, groups=1, state_dim=16, value_dim=16, rank=2, seed=5),
    "C8": dict(seqlen=64, chunk_size=8, heads=2, groups=2, state_dim=32, rank=2, seed=6),
    "C32_d2": dict(seqlen=128, chunk_size=32, heads=2, groups=1, state_dim=128, rank=2, seed=7, rotary_dim_divisor=2),
    "C64_R1": dict(seqlen=128, chunk_size=64, heads=2, groups=1, state_dim=16, value_dim=16, rank=1, seed=8),
    "fp16": dict(seqlen=48, chunk_size=16, heads=2, groups=1, seed=9, dtype="float16"),
    "tail": dict(seqlen=45, chunk_size=16, heads=2, groups=1, seed=10),
}
#: Epilogue outputs whose every operation is the reference's in the reference's order (sums over tokens in
#: BIAS_SUM_BLOCK blocks, over heads, over the batch; pass-through tensors).
EXACT = ("dQ", "dK", "dV", "dZ", "dQ_bias", "dK_bias", "dMIMO_V", "dMIMO_Z", "dMIMO_Out", "dD")


def _policy(x, helper_fma="contracted"):
    name = "upstream_sm90" if x["Q"].dtype == torch.bfloat16 else "upstream_sm90_fp16"
    return mn.presets.get(name).replace(helper_fma=helper_fma)


def _stage_outputs(x, pre, policy):
    s1 = chain.run_stage1(x, pre, policy)
    return s1, chain.run_stage2(x, pre, s1, policy)


@pytest.mark.parametrize("helper_fma", ["contracted", "separate"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_preprocessing_kernels_match_the_reference(name, helper_fma):
    x = make_op_inputs(small_case(**CASES[name]))
    want = chain.preprocess(x, torch.float32, return_state=True, helper_fma=helper_fma)
    got = chain_steps.preprocess(x["ADT"], x["Angles"], x["DT"], x["chunk_size"], policy=_policy(x, helper_fma),
                                 return_state=True)
    assert set(got) == set(want)
    limit = tolerances.get("chain_kernels_vs_reference_rel_rms")
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert torch.isfinite(got[key]).all(), key
        error = preprocessing_distance(key, got[key], value)
        assert error <= limit, (key, error)
    # the angle walk's state stays in [0, 2π); the clamp keeps every log-decay <= 0
    assert (got["angles_cumsum"] >= 0).all() and (got["angles_cumsum"] < 2 * torch.pi).all()
    assert (got["da_cs"] <= 0).all() and (got["da_cs_rev"] <= 0).all() and (got["segsum"] <= 0).all()


@pytest.mark.parametrize("helper_fma", ["contracted", "separate"])
@pytest.mark.parametrize("name", sorted(n for n in CASES if n != "tail"))
def test_epilogue_kernels_match_the_reference(name, helper_fma):
    x = make_op_inputs(small_case(**CASES[name]))
    policy = _policy(x, helper_fma)
    pre = chain.preprocess(x, torch.float32, helper_fma=helper_fma)
    s1, s2 = _stage_outputs(x, pre, policy)
    args, kw = chain.epilogue_args(x, pre, s1, s2), chain.epilogue_kwargs(x)
    want = epilogue_reference.mamba3_mimo_epilogue_reference(*args, **kw, **chain.epilogue_reference_kwargs(policy))
    got = chain_steps.build_epilogue_launches(*args, **kw, policy=policy, poison=True).run()
    assert list(got) == list(want)
    limit = tolerances.get("chain_kernels_vs_reference_rel_rms")
    for key, value in want.items():
        if value is None:
            assert got[key] is None, key
            continue
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert torch.isfinite(got[key].float()).all(), key  # poisoned first: every element was written
        if key in EXACT:
            assert torch.equal(got[key], value), key
        else:
            assert rel_rms(got[key].float(), value.float()) <= limit, (key, rel_rms(got[key].float(), value.float()))


def test_helper_fma_reaches_the_epilogue_kernels():
    """The contracted and the separate ``a·b + c`` of bwd_dtrap_ddt give other bits, each within the tolerance of its
    own reference (the test above), so the knob is honoured, not ignored."""
    x = make_op_inputs(small_case(**CASES["C16"]))
    pre = chain.preprocess(x, torch.float32)
    s1, s2 = _stage_outputs(x, pre, _policy(x))
    args, kw = chain.epilogue_args(x, pre, s1, s2), chain.epilogue_kwargs(x)
    fused, plain = (chain_steps.epilogue(*args, **kw, policy=_policy(x, f)) for f in ("contracted", "separate"))
    assert not torch.equal(fused["ddt_core"], plain["ddt_core"])
    assert not torch.equal(fused["dAngles"], plain["dAngles"])


def test_bias_sums_in_blocks_are_sequential_up_to_a_block():
    """The reference's blocked sum is the one chain of adds up to BIAS_SUM_BLOCK rows, and two levels beyond."""
    g = torch.Generator().manual_seed(0)
    block = epilogue_reference.BIAS_SUM_BLOCK
    x = torch.randn(block, 5, generator=g) * torch.logspace(-8, 8, block)[:, None]
    assert torch.equal(epilogue_reference._sum_blocked(x, block), epilogue_reference._sum_loop(x))
    x = torch.randn(3 * block + 7, 5, generator=g) * torch.logspace(-8, 8, 3 * block + 7)[:, None]
    runs = [epilogue_reference._sum_loop(x[i:i + block]) for i in range(0, x.shape[0], block)]
    assert torch.equal(epilogue_reference._sum_blocked(x, block), epilogue_reference._sum_loop(torch.stack(runs)))


def test_nan_in_adt_propagates_as_in_the_reference():
    x = make_op_inputs(small_case(**CASES["C16"]))
    x["ADT"] = x["ADT"].clone()
    x["ADT"][0, 1, 20] = float("nan")
    want = chain.preprocess(x, torch.float32)
    got = chain_steps.preprocess(x["ADT"], x["Angles"], x["DT"], x["chunk_size"], policy=_policy(x))
    for key in ("da_cs", "da_cs_rev", "segsum"):
        assert torch.equal(got[key].isnan(), want[key].isnan()), key


@pytest.mark.parametrize("field, value", [("special_functions", "fast_sm90"), ("round_outputs", False),
                                          ("math_dtype", "float64")])
def test_chain_kernels_refuse_what_they_cannot_honour(field, value):
    base = mn.presets.get("upstream_sm90")
    policy = base.replace(**{field: value}, **({"round_outputs": False} if field == "math_dtype" else {}))
    with pytest.raises(UnsupportedPolicyError, match=field):
        chain_steps.chain_constexprs(policy)


def test_chain_kernels_name_bad_inputs():
    x = make_op_inputs(small_case(**CASES["C16"]))
    with pytest.raises(TypeError, match="adt"):
        chain_steps.preprocess(x["ADT"].double(), x["Angles"], x["DT"], 16, policy="upstream_sm90")
    with pytest.raises(ValueError, match="dt must have shape"):
        chain_steps.preprocess(x["ADT"], x["Angles"], x["DT"][:, :1], 16, policy="upstream_sm90")
    with pytest.raises(ValueError, match="power of 2"):
        chain_steps.preprocess(x["ADT"], x["Angles"], x["DT"], 12, policy="upstream_sm90")
    pre = chain.preprocess(x, torch.float32)
    s1, s2 = _stage_outputs(x, pre, "upstream_sm90")
    args = list(chain.epilogue_args(x, pre, s1, s2))
    args[0] = args[0].float()
    with pytest.raises(TypeError, match="dq must have dtype"):
        chain_steps.epilogue(*args, **chain.epilogue_kwargs(x), policy="upstream_sm90")
