"""``mamba3_mimo(..., return_state=True)``: the final angle, SSM state, K and V a decode step continues from.

Checked three independent ways: the fp64 chain (the forward oracle's pair sums, ``ChunkPairs.to_end``) against the
FP64 model's state recurrence (``fp64_model.mamba3_mimo_fp64``); a prefill of S1 tokens then a decode of the rest,
token by token (``step.mamba3_mimo_step_fp64``), against one prefill of every token; and the fp32 chain (the
reference's recurrence one step further) against fp64 to FP32 accuracy. Tolerances: ``mimo_numerics.tolerances``.
"""

import math

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import step
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, make_op_inputs, small_case
from mimo_numerics.ops.mamba3_mimo.fp64_model import mamba3_mimo_fp64
from mimo_numerics.ops.mamba_mimo_fwd.oracle import mamba_mimo_fwd_oracle
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd
from mamba3_mimo_support import one_token, token_range

STATE_NAMES = ("Out", "Final_Angle", "Final_SSM_State", "Final_K", "Final_V")
#: Drawn cases: bf16 and fp16, a tail chunk, G = H = 2, not reduced without Z and D, N = 64 with R = 4.
CASES = [small_case(), small_case(seqlen=29), small_case(dtype="float16", seed=3), small_case(groups=2, seed=1),
         small_case(reduce_o=False, has_z=False, has_d=False, seed=2),
         small_case(seqlen=64, rank=4, state_dim=64, value_dim=32, seed=4)]


def _policy(name: str, spec):
    policy = mn.presets.get(name)
    return policy.replace(lp_dtype="float16") if spec.dtype == "float16" else policy


def _run(raw: dict, policy, **kwargs):
    return mn.mamba3_mimo(*[raw[n] for n in OP_INPUT_NAMES], chunk_size=raw["chunk_size"],
                          rotary_dim_divisor=raw["rotary_dim_divisor"], policy=policy, **kwargs)


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.case_id if hasattr(s, "case_id") else str(s))
def test_final_state_of_the_fp64_chain_is_the_fp64_models(spec):
    raw = make_op_inputs(spec)
    chain = _run(raw, _policy("fp64", spec), return_state=True)
    model = mamba3_mimo_fp64(*[raw[n] for n in OP_INPUT_NAMES], raw["chunk_size"], raw["rotary_dim_divisor"],
                             return_state=True)
    bound = tolerances.get("decode_fp64_vs_prefill_rel_rms")
    B, S, R, G, N = raw["Q"].shape
    H, P = raw["V"].shape[2:]
    shapes = [None, (B, H, N // raw["rotary_dim_divisor"]), (B, H, P, N), (B, R, H, N), (B, H, P)]
    for name, got, want, shape in zip(STATE_NAMES, chain, model, shapes):
        # Final_V is V's last token itself, in V's dtype; the rest float64
        assert got.dtype == (raw["V"].dtype if name == "Final_V" else torch.float64), name
        if shape is not None:
            assert tuple(got.shape) == shape, name
        assert rel_rms(got.double(), want) <= bound, (name, rel_rms(got.double(), want))
    assert bool((chain[1] >= 0).all()) and bool((chain[1] < 2 * math.pi).all())


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.case_id if hasattr(s, "case_id") else str(s))
def test_final_state_of_the_fp32_chain_is_the_fp64_one_to_fp32(spec):
    raw = make_op_inputs(spec)
    exact = _run(raw, _policy("fp64", spec), return_state=True)
    got = _run(raw, _policy("fp32", spec), return_state=True)
    lp = raw["Q"].dtype
    dtypes = [lp, torch.float32, torch.float32, lp, lp]
    for name, a, b, dtype in zip(STATE_NAMES, got, exact, dtypes):
        assert a.dtype == dtype, name
    fp32_bound = tolerances.get("return_state_fp32_vs_fp64_fp32_rel_rms")
    lp_bound = tolerances.get("return_state_fp32_vs_fp64_lp_rel_rms")
    assert rel_rms(got[1].double(), exact[1]) <= fp32_bound
    assert rel_rms(got[2].double(), exact[2]) <= fp32_bound
    assert rel_rms(got[3].double(), exact[3]) <= lp_bound
    assert torch.equal(got[4], raw["V"][:, -1])
    # and the policy's lp roundings move it further: upstream_sm90's state is not the fp32 one
    sm90 = _run(raw, _policy("upstream_sm90", spec), return_state=True)
    assert rel_rms(sm90[2].double(), exact[2]) > 10 * fp32_bound
    # the forward operator's final state is the whole op's (same forward, same policy)
    assert torch.equal(_run(raw, _policy("fp32", spec))[...], got[0])


@pytest.mark.parametrize("split", [27, 32, 1])
def test_prefill_then_decode_is_one_longer_prefill(split):
    """fp64: prefill ``split`` tokens (a tail chunk for 27, whole chunks for 32, a single token for 1), then decode
    the rest one token at a time from the returned state: Out and the final state equal one prefill of all."""
    raw = make_op_inputs(small_case(seqlen=40, seed=7))
    S, C, d = raw["V"].shape[1], raw["chunk_size"], raw["rotary_dim_divisor"]
    full = mamba3_mimo_fp64(*token_range(raw, 0, S), C, d, return_state=True)
    prefill = _run({**dict(zip(OP_INPUT_NAMES, token_range(raw, 0, split))), "chunk_size": C, "rotary_dim_divisor": d},
                   "fp64", return_state=True)
    state, outs = step.DecodeState(*prefill[1:]), []
    for t in range(split, S):
        out, state = step.mamba3_mimo_step_fp64(*one_token(raw, t), state)
        outs.append(out)
    bound = tolerances.get("decode_fp64_vs_prefill_rel_rms")
    assert rel_rms(torch.stack(outs, dim=1), full[0][:, split:]) <= bound
    for name, got, want in zip(STATE_NAMES[1:], state, full[1:]):
        assert rel_rms(got, want) <= bound, name


def test_decode_from_the_initial_state_is_the_prefill():
    raw = make_op_inputs(small_case(seqlen=12, seed=8))
    B, S, R, G, N = raw["Q"].shape
    H, P = raw["V"].shape[2:]
    state = step.initial_state(B, H, raw["Angles"].shape[-1], P, N, R)
    outs = []
    for t in range(S):
        out, state = step.mamba3_mimo_step_fp64(*one_token(raw, t), state)
        outs.append(out)
    full = mamba3_mimo_fp64(*token_range(raw, 0, S), raw["chunk_size"], raw["rotary_dim_divisor"])
    assert rel_rms(torch.stack(outs, dim=1), full) <= tolerances.get("decode_fp64_vs_prefill_rel_rms")


def test_forward_operator_final_state_under_fp64_is_the_oracles():
    """The forward reference's recurrence one step further (fp64 preset) against the oracle's pair sums."""
    from mimo_numerics.ops.mamba3_mimo import chain

    raw = make_op_inputs(small_case(seqlen=29, seed=5))
    pre = chain.preprocess(raw, torch.float32)  # upstream's dtypes, which the reference takes
    args = chain.forward_args(raw, pre)
    kwargs = chain.stage2_kwargs(raw)
    ref = mamba_mimo_fwd(*args, **kwargs, policy="fp64", return_state=True)
    o, final_state, final_k = mamba_mimo_fwd_oracle(*args, **kwargs, return_state=True)
    bound = tolerances.get("fp64_reference_vs_oracle_rel_rms")
    assert rel_rms(ref.final_state, final_state) <= bound
    assert rel_rms(ref.final_k, final_k) <= bound and rel_rms(ref.o, o) <= bound
    assert ref["final_state"] is ref.final_state and ref[0] is ref.o


def _fwd_args(raw: dict) -> tuple:
    """The forward operator's 16 tensors of a whole-op case (fp32 preprocessing)."""
    from mimo_numerics.ops.mamba3_mimo import chain

    return chain.forward_args(raw, chain.preprocess(raw, torch.float32))


def test_final_state_is_a_non_differentiable_side_output():
    raw = make_op_inputs(small_case(seed=9))
    leaves = [None if raw[n] is None else raw[n].clone().requires_grad_() for n in OP_INPUT_NAMES]
    out, *final = mn.mamba3_mimo(*leaves, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"],
                                 return_state=True)
    assert out.requires_grad and not any(f.requires_grad for f in final)
    out.backward(raw["dout"].to(out.dtype))
    plain = [None if raw[n] is None else raw[n].clone().requires_grad_() for n in OP_INPUT_NAMES]
    mn.mamba3_mimo(*plain, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"]).backward(
        raw["dout"].to(out.dtype))
    for name, a, b in zip(OP_INPUT_NAMES, leaves, plain):
        if a is not None:
            assert torch.equal(a.grad, b.grad), name  # return_state changes no gradient


def test_return_state_refusals_name_the_argument():
    raw = make_op_inputs(small_case())
    with pytest.raises(TypeError, match="return_state must be a bool"):
        _run(raw, "upstream_sm90", return_state="yes")
    with pytest.raises(ValueError, match="state.ssm must have shape"):
        bad = step.DecodeState(torch.zeros(1, 2, 8), torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 2, 32),
                               torch.zeros(1, 2, 16))
        step.mamba3_mimo_step_fp64(*one_token(raw, 0), bad)


@pytest.mark.skipif(not kernels.triton_available(), reason="needs triton")
@pytest.mark.parametrize("seqlen", [32, 29])
def test_final_state_on_the_kernels_is_the_references(seqlen):
    """``backend="triton"``: the walk kernel's FINAL store against the reference's recurrence one step further,
    within the kernels' own tolerances (FP32 state; FINAL_K is the reference's on the last token)."""
    raw = make_op_inputs(small_case(seqlen=seqlen, seed=12))
    want = _run(raw, "upstream_sm90", return_state=True)
    got = _run(raw, "upstream_sm90", return_state=True, backend="triton")
    assert rel_rms(got[0].float(), want[0].float()) <= tolerances.get("whole_op_kernels_vs_reference_rel_rms")
    # the angle walk's final state by the preprocessing kernels (FP32 orders); V itself
    assert rel_rms(got[1], want[1]) <= tolerances.get("chain_kernels_vs_reference_rel_rms")
    assert torch.equal(got[4], want[4])
    # FINAL_K: the reference on the last token alone against it within the whole sequence: torch's cos/sin take
    # other (vector or scalar) code paths by tensor size on some CPUs, so equal here but not bound to be
    assert rel_rms(got[3].float(), want[3].float()) <= tolerances.get("reference_cross_cpu_rel_rms")
    assert rel_rms(got[2], want[2]) <= tolerances.get("kernels_interpreter_vs_reference_fp32_rel_rms")
    fwd = kernels.mamba_mimo_fwd(*_fwd_args(raw), chunk_size=raw["chunk_size"],
                                 rotary_dim_divisor=raw["rotary_dim_divisor"], policy="upstream_sm90", poison=True,
                                 return_state=True)
    assert torch.isfinite(fwd.final_state).all()  # poisoned buffers: every element of the final state written
