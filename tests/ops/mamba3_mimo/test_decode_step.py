"""The decode step under a policy (``ops/mamba3_mimo/decode.py``): upstream's rotary step and CuTe step in FP32 with
their lp output stores as the policy's ``round_outputs``.

Checked: under ``fp64`` it is the FP64 step (``step.mamba3_mimo_step_fp64``); under the lp presets, a prefill then a
decode agrees with one longer FP64 prefill at the lp level; the output stores are the only roundings (each
rounded output is the unrounded one rounded once, bit for bit); the knobs it honours change what they should
(``silu_form``, ``round_outputs``); bad inputs name the argument.
"""

import math

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import decode, step
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, make_op_inputs, small_case
from mimo_numerics.ops.mamba3_mimo.fp64_model import mamba3_mimo_fp64
from mamba3_mimo_support import one_token, token_range

CASES = [small_case(seqlen=40, seed=7), small_case(seqlen=40, seed=9, dtype="float16"),
         small_case(seqlen=40, seed=3, reduce_o=False, has_z=False, has_d=False), small_case(seqlen=40, groups=2, seed=4)]
SPLIT = 24


def _policy(name, spec):
    policy = mn.presets.get(name)
    return policy.replace(lp_dtype="float16") if spec.dtype == "float16" else policy


def _prefill_state(raw, policy):
    out = mn.mamba3_mimo(*token_range(raw, 0, SPLIT), chunk_size=raw["chunk_size"],
                         rotary_dim_divisor=raw["rotary_dim_divisor"], policy=policy, return_state=True)
    return step.DecodeState(*out[1:])


def _decode(raw, state, policy):
    outs = []
    for t in range(SPLIT, raw["V"].shape[1]):
        out, state = decode.mamba3_mimo_step(*one_token(raw, t), state, policy=policy)
        outs.append(out)
    return torch.stack(outs, dim=1), state


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.case_id)
def test_fp64_policy_step_is_the_fp64_step(spec):
    raw = make_op_inputs(spec)
    policy = _policy("fp64", spec)
    ours = theirs = _prefill_state(raw, policy)
    bound = tolerances.get("decode_policy_fp64_vs_fp64_step_rel_rms")
    for t in range(SPLIT, raw["V"].shape[1]):
        want, theirs = step.mamba3_mimo_step_fp64(*one_token(raw, t), theirs)
        got, ours = decode.mamba3_mimo_step(*one_token(raw, t), ours, policy=policy)
        assert got.dtype == torch.float64 and rel_rms(got, want) <= bound
        assert rel_rms(torch.remainder(ours.angle, 2 * math.pi), theirs.angle) <= bound
        for name in ("ssm", "k", "v"):
            assert rel_rms(getattr(ours, name), getattr(theirs, name)) <= bound, name


@pytest.mark.parametrize("preset", ["upstream_sm90", "fp32"])
@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.case_id)
def test_lp_decode_agrees_with_a_longer_fp64_prefill(spec, preset):
    raw = make_op_inputs(spec)
    policy = _policy(preset, spec)
    full = mamba3_mimo_fp64(*[raw[n] for n in OP_INPUT_NAMES], raw["chunk_size"], raw["rotary_dim_divisor"])
    got, state = _decode(raw, _prefill_state(raw, policy), policy)
    assert got.dtype == policy.lp_torch_dtype and state.k.dtype == policy.lp_torch_dtype
    assert state.angle.dtype == torch.float32 and state.ssm.dtype == torch.float32
    bound = tolerances.get("decode_lp_vs_fp64_prefill_rel_rms") / (8 if spec.dtype == "float16" else 1)
    assert rel_rms(got, full[:, SPLIT:]) <= bound


@pytest.mark.parametrize("spec", CASES[:2], ids=lambda s: s.case_id)
def test_the_output_stores_are_the_only_roundings(spec):
    """The rotary step's rounded q, k are its unrounded ones rounded once, bit for bit, and the new angle state is
    not rounded; the stored k of the next state is that rounded k; the rounded step's Out differs from the
    unrounded step's by lp roundings only."""
    raw = make_op_inputs(spec)
    policy = _policy("upstream_sm90", spec)
    state = _prefill_state(raw, policy)
    token = one_token(raw, SPLIT)
    Q, K, Angles, DT = token[0], token[1], token[11], token[4]
    heads = torch.arange(raw["V"].shape[2]) // (raw["V"].shape[2] // Q.shape[2])
    args = (Q[:, :, heads], K[:, :, heads], state.angle, Angles, DT, raw["Q_bias"].transpose(0, 1),
            raw["K_bias"].transpose(0, 1))
    q_lp, k_lp, theta = decode.rotary_step(*args, policy=policy)
    q32, k32, theta32 = decode.rotary_step(*args, policy=policy.replace(round_outputs=False))
    assert q32.dtype == torch.float32 and torch.equal(q_lp, q32.to(q_lp.dtype)) and torch.equal(k_lp, k32.to(k_lp.dtype))
    assert torch.equal(theta, theta32)
    out_lp, next_lp = decode.mamba3_mimo_step(*token, state, policy=policy)
    out32, next32 = decode.mamba3_mimo_step(*token, state, policy=policy.replace(round_outputs=False))
    assert out32.dtype == torch.float32 and out_lp.dtype == policy.lp_torch_dtype
    assert torch.equal(next_lp.k, k_lp) and torch.equal(next32.k, k32)
    # the unrounded step with the rounded k stored: its Out differs from the rounded Out by that last rounding only
    assert rel_rms(out_lp.float(), out32) <= 2.0 ** -7


def test_silu_form_changes_only_the_gate():
    spec = CASES[0]
    raw = make_op_inputs(spec)
    policy = _policy("fp32", spec).replace(round_outputs=False)
    state = _prefill_state(raw, _policy("fp32", spec))
    token = one_token(raw, SPLIT)
    tanh_form, _ = decode.mamba3_mimo_step(*token, state, policy=policy.replace(silu_form="tanh"))
    sigmoid_form, _ = decode.mamba3_mimo_step(*token, state, policy=policy.replace(silu_form="sigmoid"))
    assert not torch.equal(tanh_form, sigmoid_form)  # two FP32 forms of one function
    assert rel_rms(tanh_form, sigmoid_form) <= 1e-5


def test_angle_state_is_kept_unreduced_as_upstreams():
    raw = make_op_inputs(CASES[0])
    policy = _policy("upstream_sm90", CASES[0])
    state = _prefill_state(raw, policy)
    big = state._replace(angle=state.angle + 200 * math.pi)
    _, after = decode.mamba3_mimo_step(*one_token(raw, SPLIT), big, policy=policy)
    assert after.angle.min() > 100 * math.pi  # not reduced mod 2π


def test_rotary_step_pairwise_and_conjugate():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, 8, generator=gen)
    state, proj, dt = torch.zeros(1, 3, 4), torch.randn(1, 3, 4, generator=gen), torch.rand(1, 3, generator=gen)
    policy = mn.presets.get("fp32").replace(round_outputs=False)
    pairwise, _, theta = decode.rotary_step(q, q, state, proj, dt, rotate_pairwise=True, policy=policy)
    cos, sin = torch.cos(theta)[:, None], torch.sin(theta)[:, None]
    want = torch.stack((q[..., 0::2] * cos - q[..., 1::2] * sin, q[..., 0::2] * sin + q[..., 1::2] * cos), -1)
    assert torch.equal(pairwise, want.flatten(-2))
    back, _, _ = decode.rotary_step(pairwise, pairwise, state, proj, dt, rotate_pairwise=True, conjugate=True,
                                    policy=policy)
    assert rel_rms(back, q) <= 1e-6


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "dt": a["dt"][:, :1]}, "dt must be"),
    (lambda a: {**a, "angle_proj": a["angle_proj"][..., :2]}, "angle_proj must have"),
    (lambda a: {**a, "k": a["k"][:, :1]}, "q and k must both"),
    (lambda a: {**a, "bias_q": torch.zeros(1, 1, 1)}, "bias_q must be"),
    (lambda a: {**a, "angle_state": torch.zeros(1, 3, 5)}, "angle_state must be"),
])
def test_rotary_step_bad_inputs_name_the_argument(change, match):
    args = dict(q=torch.zeros(1, 2, 3, 8), k=torch.zeros(1, 2, 3, 8), angle_state=torch.zeros(1, 3, 4),
                angle_proj=torch.zeros(1, 3, 4), dt=torch.zeros(1, 3), bias_q=None, bias_k=None)
    with pytest.raises(ValueError, match=match):
        decode.rotary_step(**change(args))


def test_step_state_shapes_are_checked():
    raw = make_op_inputs(CASES[0])
    state = _prefill_state(raw, "upstream_sm90")
    with pytest.raises(ValueError, match="state.ssm must have shape"):
        decode.mamba3_mimo_step(*one_token(raw, SPLIT), state._replace(ssm=state.ssm[..., :3]))


def test_lp_dtype_mismatch_names_the_argument():
    raw = make_op_inputs(CASES[0])  # bf16
    state = _prefill_state(raw, "upstream_sm90")
    with pytest.raises(TypeError, match="Q has dtype torch.bfloat16 but the policy's lp_dtype is torch.float16"):
        decode.mamba3_mimo_step(*one_token(raw, SPLIT), state, policy="upstream_sm90_fp16")
