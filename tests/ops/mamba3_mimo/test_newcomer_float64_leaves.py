"""Under `policy="fp64"` a bf16 leaf's `.grad` is bf16 (autograd casts each gradient to its leaf's dtype), so the
"truth" a user read from `.grad` was rounded. Float64 leaves are taken under the fp64 chain (every tensor at once;
`autograd.FLOAT64_INPUTS_RULE`): their `.grad` is the float64 gradient itself. Any other policy refuses them."""

import pytest
import torch

from mimo_numerics import presets, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.ops.mamba3_mimo.autograd import mamba3_mimo
from mimo_numerics.ops.mamba3_mimo.cases import OP_GRAD_NAMES, OP_INPUT_NAMES, make_op_inputs, small_case

CASES = (
    small_case(seqlen=16, rank=2, value_dim=8, chunk_size=8, seed=21),
    small_case(seqlen=8, heads=2, groups=2, value_dim=8, rank=1, chunk_size=4, reduce_o=False, has_z=False,
               has_d=False, rotary_dim_divisor=2, dtype="float16", seed=22),
)


def _run(inputs, policy, *, dtype=torch.float64, record=None):
    """``Out`` and the leaves (``dtype`` copies of the inputs that require grad) after ``Out.backward(dout)``."""
    leaves = {n: None if inputs[n] is None else inputs[n].detach().to(dtype).requires_grad_(True)
              for n in OP_INPUT_NAMES}
    out = mamba3_mimo(*leaves.values(), inputs["chunk_size"], inputs["rotary_dim_divisor"], policy=policy,
                      record=record)
    out.backward(inputs["dout"].to(out.dtype))
    return out, leaves


def _fp64(spec):
    return presets.get("fp64").replace(lp_dtype=spec.dtype)


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.case_id)
def test_float64_leaves_get_the_float64_gradients_of_the_lp_leaf_run(spec):
    inputs = make_op_inputs(spec)
    record = {}
    out_lp, lp_leaves = _run(inputs, _fp64(spec), dtype=None, record=record)
    out, leaves = _run(inputs, _fp64(spec))
    assert torch.equal(out, out_lp)  # same values, same float64 arithmetic
    for grad in OP_GRAD_NAMES:
        leaf = leaves[grad[1:]]
        if leaf is None:
            continue
        before_cast = record[f"mamba3_mimo_epilogue.{grad}"]
        assert leaf.grad.dtype == torch.float64, grad
        assert torch.equal(leaf.grad, before_cast), grad  # the float64 values the lp leaf's .grad rounds
        if lp_leaves[grad[1:]].dtype != torch.float32:
            assert lp_leaves[grad[1:]].grad.dtype == lp_leaves[grad[1:]].dtype, grad


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.case_id)
def test_float64_leaves_off_the_lp_grid_match_the_fp64_model(spec):
    """Values no bf16/fp16/fp32 tensor holds: the gradient is of the float64 inputs themselves."""
    inputs = make_op_inputs(spec)
    gen = torch.Generator().manual_seed(5)
    wide = dict(inputs)
    for name in OP_INPUT_NAMES + ("dout",):
        if inputs[name] is not None:
            x = inputs[name].to(torch.float64)
            wide[name] = x * (1 + 1e-3 * torch.rand(x.shape, generator=gen, dtype=torch.float64))
    assert bool((wide["ADT"] <= 0).all())  # upstream's clamp does not fire: its backward is exact
    _, leaves = _run(wide, _fp64(spec))
    want = chain.autograd_fp64(wide)
    for grad in OP_GRAD_NAMES:
        if want[grad] is None:
            assert leaves[grad[1:]] is None
            continue
        got = leaves[grad[1:]].grad
        assert got.dtype == torch.float64, grad
        assert rel_rms(got, want[grad]) <= tolerances.get("whole_op_fp64_vs_autograd_rel_rms"), grad


def test_float64_leaves_are_refused_outside_the_fp64_chain():
    spec = CASES[0]
    inputs = make_op_inputs(spec)
    for policy in ("upstream_sm90", "fp32"):
        with pytest.raises(TypeError, match=r"Q must have dtype torch.bfloat16 or torch.float16.*float64 inputs "
                                            r"are taken only under .*fp64 preset"):
            _run(inputs, policy)
    leaves = [None if inputs[n] is None else inputs[n] for n in OP_INPUT_NAMES]
    leaves[OP_INPUT_NAMES.index("ADT")] = inputs["ADT"].to(torch.float64)
    with pytest.raises(TypeError, match=r"ADT must have dtype torch.float32 .*got torch.float64.*fp64 preset"):
        mamba3_mimo(*leaves, spec.chunk_size, spec.rotary_dim_divisor, policy="upstream_sm90")


def test_float64_inputs_come_all_at_once():
    spec = CASES[0]
    inputs = make_op_inputs(spec)
    mixed = [None if inputs[n] is None else inputs[n].to(torch.float64) for n in OP_INPUT_NAMES]
    mixed[OP_INPUT_NAMES.index("V")] = inputs["V"]
    with pytest.raises(TypeError, match=r"V has dtype torch.bfloat16 but Q is float64.*every tensor"):
        mamba3_mimo(*mixed, spec.chunk_size, spec.rotary_dim_divisor, policy="fp64")
    mixed = [None if inputs[n] is None else inputs[n] for n in OP_INPUT_NAMES]
    mixed[OP_INPUT_NAMES.index("D")] = inputs["D"].to(torch.float64)
    with pytest.raises(TypeError, match=r"D must have dtype torch.float32 .*every tensor at once, Q included"):
        mamba3_mimo(*mixed, spec.chunk_size, spec.rotary_dim_divisor, policy="fp64")
    wide = [None if inputs[n] is None else inputs[n].to(torch.float64) for n in OP_INPUT_NAMES]
    out = mamba3_mimo(*wide, spec.chunk_size, spec.rotary_dim_divisor, torch.bfloat16, policy="fp64")
    assert out.dtype == torch.float64
    with pytest.raises(TypeError, match=r"dtype=torch.float16 with float64 inputs"):
        mamba3_mimo(*wide, spec.chunk_size, spec.rotary_dim_divisor, torch.float16, policy="fp64")


def test_readme_says_float64_leaves_under_fp64():
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8").split())
    assert "float64 leaves" in text and 'policy="fp64"' in text
