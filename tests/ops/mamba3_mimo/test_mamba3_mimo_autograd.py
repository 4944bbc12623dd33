"""``mamba3_mimo`` as a torch autograd function under a policy (``mimo_numerics/ops/mamba3_mimo/autograd.py``).

* fp64: the chained backward (stage-1 -> stage-2 -> epilogue FP64 oracles, read from ``record`` before autograd casts
  the gradients to the inputs' dtypes) equals torch autograd of the independent FP64 model, on inputs where
  upstream's clamp does not fire (ADT <= 0).
* golden (issue 18, acceptance 1): under ``upstream_sm90`` the op run from the 7 golden cases' raw inputs (no
  recorded intermediates) against upstream's ``autograd`` entry: every output at least 3x closer than under
  ``fp32``, and the ten gated outputs within rel RMS 2e-3. The reference's FP32 GEMMs go through BLAS, so these are
  tolerances, never bits (``reports/mamba3_mimo_golden.md`` has every figure and the cascade behind them).
* API: dtypes of the gradients, ``record``, ``backend="triton"``, bad inputs.
"""

import warnings

import pytest
import torch

from mimo_numerics import kernels, presets, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import autograd, chain
from mimo_numerics.studies import golden_figures as gf
from mimo_numerics.ops.mamba3_mimo.autograd import (RECORD_PREFIXES, BackendFallbackWarning, golden_sections,
                                                    mamba3_mimo, triton_stages)
from mimo_numerics.ops.mamba3_mimo.fp64_model import mamba3_mimo_fp64
from mimo_numerics.ops.mamba3_mimo.cases import OP_GRAD_NAMES, OP_INPUT_NAMES, make_op_inputs, small_case
from mimo_numerics.policy import PolicyUndefined
from mamba3_mimo_support import GOLDEN_NAMES, kernels_against_reference, load_golden_full_op

# ---------------------------------------------------------------------------------------------------- fp64 chain

#: Every branch (reduced or not, Z, D), G = 1 < H and G = H, R in {1, 2, 4, 8}, N in {32, 64}, both rotary
#: divisors, B = 2, bf16 and fp16; S a multiple of C (the backward needs it) and ADT <= 0.
FP64_CASES = (
    small_case(seqlen=24, rank=1, chunk_size=8, seed=11),
    small_case(batch=2, seqlen=12, heads=2, groups=2, state_dim=64, value_dim=8, rank=2, chunk_size=4,
               reduce_o=False, has_d=False, rotary_dim_divisor=2, dtype="float16", seed=12),
    small_case(seqlen=12, heads=3, value_dim=8, rank=4, chunk_size=4, has_z=False, has_d=False, seed=13),
    small_case(seqlen=8, heads=2, groups=2, value_dim=8, rank=8, chunk_size=4, reduce_o=False, has_z=False,
               seed=14),
    small_case(seqlen=16, heads=4, value_dim=8, rank=2, chunk_size=8, reduce_o=True, has_z=True, has_d=False,
               rotary_dim_divisor=2, seed=15),
)
SLOW_FP64_CASES = tuple(
    small_case(batch=1 + i % 2, seqlen=16, heads=2, groups=1 + i % 2, state_dim=n, value_dim=8, rank=r,
               chunk_size=4 if r == 8 else 8, reduce_o=ro, has_z=z, has_d=d, seed=100 + i)
    for i, (r, n, (ro, z, d)) in enumerate(
        (r, n, b) for r in (1, 2, 4, 8) for n in (32, 64)
        for b in ((True, True, True), (False, False, False), (True, False, True), (False, True, False))))


def _fp64_policy(spec):
    return presets.get("fp64").replace(lp_dtype=spec.dtype)


def _leaves(inputs):
    return {n: (None if inputs[n] is None else inputs[n].detach().clone().requires_grad_(True))
            for n in OP_INPUT_NAMES}


def _assert_fp64_backward_matches(spec):
    inputs = make_op_inputs(spec)
    assert bool((inputs["ADT"] <= 0).all())  # upstream's clamp does not fire: its backward is exact
    leaves, record = _leaves(inputs), {}
    out = mamba3_mimo(*leaves.values(), spec.chunk_size, spec.rotary_dim_divisor, policy=_fp64_policy(spec),
                      record=record)
    assert out.dtype == torch.float64
    out.backward(inputs["dout"].to(torch.float64))
    want = chain.autograd_fp64(inputs)
    for grad in OP_GRAD_NAMES:
        got = record.get(f"mamba3_mimo_epilogue.{grad}")
        leaf = leaves[grad[1:]]
        if want[grad] is None:
            assert got is None and leaf is None, grad
            continue
        assert got.dtype == torch.float64 and got.shape == want[grad].shape, grad
        assert rel_rms(got, want[grad]) <= tolerances.get("whole_op_fp64_vs_autograd_rel_rms"), grad
        # autograd stores the float64 gradient cast to the input's dtype
        assert leaf.grad.dtype == leaf.dtype and torch.equal(leaf.grad, got.to(leaf.dtype)), grad


@pytest.mark.parametrize("spec", FP64_CASES, ids=lambda s: s.case_id)
def test_fp64_backward_equals_autograd_of_the_fp64_model(spec):
    _assert_fp64_backward_matches(spec)


# in the default suite: it reproduces the figure of whole_op_fp64_vs_autograd_rel_rms (32 cases, ~29 s loaded)
@pytest.mark.parametrize("spec", SLOW_FP64_CASES, ids=lambda s: s.case_id)
def test_fp64_backward_equals_autograd_of_the_fp64_model_slow(spec):
    _assert_fp64_backward_matches(spec)


def test_fp64_forward_equals_the_fp64_model():
    spec = FP64_CASES[0]
    inputs = make_op_inputs(spec)
    out = mamba3_mimo(*[inputs[n] for n in OP_INPUT_NAMES], spec.chunk_size, spec.rotary_dim_divisor,
                      policy="fp64")
    with torch.no_grad():
        want = mamba3_mimo_fp64(*[inputs[n] for n in OP_INPUT_NAMES], spec.chunk_size,
                                spec.rotary_dim_divisor)
    assert rel_rms(out, want) <= tolerances.get("whole_op_fp64_vs_autograd_rel_rms")


# ---------------------------------------------------------------------------------------------------- golden

@pytest.fixture(scope="module")
def golden_runs():
    """``name -> {policy: Out and .grad of mamba3_mimo from the raw inputs}`` for upstream_sm90 and fp32."""
    data = load_golden_full_op()
    return {name: {policy: gf.run_op(data[name]["inputs"], policy) for policy in ("upstream_sm90", "fp32")}
            for name in GOLDEN_NAMES}


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_gradients_have_upstreams_dtypes_and_shapes(golden_runs, name):
    want = load_golden_full_op()[name]["autograd"]
    for key in gf.OUTPUT_KEYS:
        got = golden_runs[name]["upstream_sm90"][key]
        if want[key] is None:
            assert got is None, key
        else:
            assert got.dtype == want[key].dtype and got.shape == want[key].shape, key


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_upstream_sm90_is_closer_than_fp32(golden_runs, name):
    want = load_golden_full_op()[name]["autograd"]
    sm90 = gf.errors(golden_runs[name]["upstream_sm90"], want)
    fp32 = gf.errors(golden_runs[name]["fp32"], want)
    assert set(sm90) == {k for k in gf.OUTPUT_KEYS if want[k] is not None}
    ratio = tolerances.get("whole_op_golden_fp32_over_sm90_ratio_min")
    far = {k: (sm90[k], fp32[k]) for k in sm90 if not fp32[k] >= ratio * sm90[k]}
    assert not far, f"outputs not {ratio}x closer to upstream under upstream_sm90 than fp32: {far}"


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_upstream_sm90_within_gate(golden_runs, name):
    want = load_golden_full_op()[name]["autograd"]
    sm90 = gf.errors(golden_runs[name]["upstream_sm90"], want, gf.GATED_OUTPUTS)
    limit = tolerances.get("whole_op_golden_sm90_rel_rms")
    over = {k: v for k, v in sm90.items() if not v <= limit}
    assert not over, f"rel RMS to upstream above {limit}: {over}"


# ---------------------------------------------------------------------------------------------------- record, API

def _small_inputs(**fields):
    spec = small_case(seqlen=16, chunk_size=8, value_dim=8, **fields)
    return spec, make_op_inputs(spec)


def test_record_holds_every_operator_of_the_chain_and_matches_the_outputs():
    spec, inputs = _small_inputs()
    leaves, record = _leaves(inputs), {}
    out = mamba3_mimo(*leaves.values(), spec.chunk_size, spec.rotary_dim_divisor, record=record)
    assert {key.split(".")[0] for key in record} == {"mamba3_mimo_preprocess", "mamba_mimo_fwd"}
    out.backward(inputs["dout"])
    assert {key.split(".")[0] for key in record} == set(RECORD_PREFIXES)
    for key in ("mamba_mimo_fwd.out", "mamba_mimo_bwd_fwd.state", "mamba_mimo_bwd_bwd.dstates",
                "mamba3_mimo_preprocess.segsum", "mamba3_mimo_epilogue.ddt_core"):
        assert key in record, key
    sections = golden_sections(record)
    assert torch.equal(sections["fwd"]["o"], out)
    for grad in OP_GRAD_NAMES:
        assert torch.equal(sections["grads"][grad], leaves[grad[1:]].grad), grad
    # the recorded stage-1 outputs are those stage 2 consumed: stage 2 rerun on them gives the recorded dq
    inputs_with_dout = {**inputs}
    again = chain.run_stage2(inputs_with_dout, sections["pre"], sections["bwd_fwd"], "upstream_sm90")
    assert torch.equal(again["dq"], sections["bwd_bwd"]["dq"])


def test_forward_without_gradients_accepts_a_tail_chunk():
    spec, inputs = _small_inputs()
    cut = {n: (None if inputs[n] is None else inputs[n]) for n in OP_INPUT_NAMES}
    S = 13  # not a multiple of C = 8: upstream's forward accepts it, its backward does not
    for name in ("Q", "K", "V", "Z", "Angles"):
        cut[name] = cut[name][:, :S].contiguous()
    for name in ("ADT", "DT", "Trap"):
        cut[name] = cut[name][..., :S].contiguous()
    out = mamba3_mimo(*cut.values(), spec.chunk_size, spec.rotary_dim_divisor)
    assert out.shape[1] == S
    with pytest.raises(ValueError, match="multiple of chunk_size"):
        mamba3_mimo(*[t.requires_grad_(True) if n == "V" else t for n, t in cut.items()], spec.chunk_size,
                    spec.rotary_dim_divisor)


def _with(inputs, **changes):
    args = {n: inputs[n] for n in OP_INPUT_NAMES}
    args.update(changes)
    return list(args.values())


@pytest.mark.parametrize("change,kwargs,error,match", [
    (lambda x: dict(Q=x["Q"].float()), {}, TypeError, "Q must have dtype torch.bfloat16 or torch.float16"),
    (lambda x: dict(ADT=x["ADT"].to(torch.bfloat16)), {}, TypeError, "ADT must have dtype torch.float32"),
    (lambda x: dict(Trap=x["Trap"].float()), {}, TypeError, "Trap must have dtype torch.bfloat16"),
    (lambda x: dict(MIMO_Out=x["MIMO_Out"].double()), {}, TypeError, "MIMO_Out must have dtype torch.float32"),
    (lambda x: dict(K_bias=x["K_bias"][:, :1]), {}, ValueError, "K_bias must have shape"),
    (lambda x: dict(Angles=x["Angles"][..., :-1]), {}, ValueError, "Angles must have shape"),
    (lambda x: dict(MIMO_Z=None), {}, ValueError, "Z and MIMO_Z must be given together"),
    (lambda x: dict(V=None), {}, TypeError, "V is required"),
    (lambda x: dict(D=[1.0, 2.0]), {}, TypeError, "D must be a torch.Tensor"),
    (lambda x: {}, dict(dtype=torch.float16), TypeError, "dtype=torch.float16 does not match"),
    (lambda x: {}, dict(dtype="bfloat16"), TypeError, "dtype must be a torch.dtype"),
    (lambda x: {}, dict(policy="upstream_sm90_fp16"), TypeError, "policy's lp_dtype is torch.float16"),
    (lambda x: {}, dict(chunk_size=6), ValueError, "chunk_size"),
    (lambda x: {}, dict(rotary_dim_divisor=3), ValueError, "rotary_dim_divisor must be one of"),
    (lambda x: {}, dict(return_state=1), TypeError, "return_state must be a bool"),
    (lambda x: {}, dict(cu_seqlens=torch.tensor([0, 15])), ValueError, "cu_seqlens must end at the packed length"),
    (lambda x: {}, dict(backend="cuda"), ValueError, "backend must be one of"),
    (lambda x: {}, dict(record=[]), TypeError, "record must be a dict"),
    (lambda x: {}, dict(policy="seed_bf16"), PolicyUndefined, "mamba_mimo_fwd"),
    (lambda x: {}, dict(policy=presets.get("fp64").replace(**{"mamba_mimo_bwd_bwd.dphio": True})),
     NotImplementedError, "mamba_mimo_bwd_bwd.dphio"),
    (lambda x: {}, dict(policy=presets.get("fp32").replace(round_outputs=False)), NotImplementedError,
     "round_outputs=False"),
])
def test_bad_inputs_raise_naming_the_argument(change, kwargs, error, match):
    _, inputs = _small_inputs()
    args = _with(inputs, **change(inputs))
    kwargs = {"chunk_size": 8, "rotary_dim_divisor": 4, **kwargs}
    with pytest.raises(error, match=match):
        mamba3_mimo(*args, **kwargs)


def test_backward_limits_are_checked_before_the_forward_runs():
    _, inputs = _small_inputs(heads=4, groups=2)
    args = _with(inputs, V=inputs["V"].clone().requires_grad_(True))
    with pytest.raises(ValueError, match="G == 1 or G == H"):
        mamba3_mimo(*args, chunk_size=8, rotary_dim_divisor=4)
    with torch.no_grad():  # the forward alone supports 1 < G < H
        assert mamba3_mimo(*args, chunk_size=8, rotary_dim_divisor=4).shape == inputs["dout"].shape


def test_device_mismatch_names_the_argument():
    _, inputs = _small_inputs()
    meta = inputs["D"].to("meta")
    with pytest.raises(ValueError, match="D must be on device cpu"):
        mamba3_mimo(*_with(inputs, D=meta), chunk_size=8, rotary_dim_divisor=4)


@pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
def test_triton_backend_runs_every_step_by_kernel_and_says_what_falls_back(monkeypatch):
    spec = small_case(seqlen=16, chunk_size=8, value_dim=16)
    inputs = make_op_inputs(spec)
    record = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)  # every step has a kernel here
        got = gf.run_op(inputs, "upstream_sm90", backend="triton", record=record)
    assert set(autograd.TRITON_STAGES.values()) == {"triton"}
    # where a step does fall back (stage 2 beyond its Ascend bounds), the call names it
    monkeypatch.setattr(autograd, "triton_stages",
                        lambda *a, **k: {**autograd.TRITON_STAGES, "mamba_mimo_bwd_bwd": "reference"})
    with pytest.warns(BackendFallbackWarning, match="mamba_mimo_bwd_bwd run the reference"):
        with torch.no_grad():
            autograd.mamba3_mimo(*(inputs[n] for n in OP_INPUT_NAMES), chunk_size=8, rotary_dim_divisor=4,
                                 backend="triton")
    monkeypatch.undo()
    assert triton_stages("npu", 64, 64, 64)["mamba_mimo_bwd_bwd"] == "triton"  # within Ascend's tile bounds
    assert triton_stages("npu", 64, 128, 32)["mamba_mimo_bwd_bwd"] == "reference"  # would overflow the buffer
    # the kernels' records, under the reference's stage names
    assert "mamba_mimo_bwd_fwd.state" in record and "mamba_mimo_fwd.o_rank" in record
    # one policy, two implementations (on the same preprocessing outputs): FP32 orders only
    got, want, _ = kernels_against_reference(inputs, "upstream_sm90")
    for key in gf.OUTPUT_KEYS:
        if want[key] is not None:
            assert rel_rms(got[key], want[key]) <= tolerances.get("same_policy_rel_rms"), key


def test_triton_backend_rejects_policies_the_kernels_cannot_express():
    _, inputs = _small_inputs()
    if not kernels.triton_available():
        with pytest.raises(ImportError, match="'triton' extra"):
            mamba3_mimo(*_with(inputs), chunk_size=8, rotary_dim_divisor=4, backend="triton")
        return
    with pytest.raises(kernels.UnsupportedPolicyError, match="math_dtype"):
        mamba3_mimo(*_with(inputs), chunk_size=8, rotary_dim_divisor=4, backend="triton", policy="fp64")
    with pytest.raises(ValueError, match="P=8; the Triton kernels support"):  # before the forward runs
        mamba3_mimo(*_with(inputs), chunk_size=8, rotary_dim_divisor=4, backend="triton")


def test_auto_backend_runs_the_reference_on_cpu_with_the_same_bits():
    spec = small_case(seqlen=16, chunk_size=8, value_dim=16)
    inputs = make_op_inputs(spec)
    tensors = {n: inputs[n] for n in OP_INPUT_NAMES}
    choice, why = autograd.auto_backend(presets.get("upstream_sm90"), tensors, inputs["chunk_size"])
    assert choice == "reference" and "on cpu" in why
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)  # auto -> reference says nothing
        got = gf.run_op(inputs, "upstream_sm90", backend="auto")
    want = gf.run_op(inputs, "upstream_sm90", backend="reference")
    for key, value in want.items():
        assert (value is None and got[key] is None) or torch.equal(got[key], value), key


@pytest.mark.parametrize("policy, change, choice, why", [
    ("upstream_sm90", {}, "triton", "express this policy"),
    ("fp64", {}, "reference", "fp64"),
    ("upstream_sm90", {"value_dim": 8}, "reference", "P=8"),
])
def test_auto_backend_picks_the_kernels_only_where_they_express_the_call(monkeypatch, policy, change, choice, why):
    """The device condition opened to the CPU, so the policy and size conditions are what decides."""
    monkeypatch.setattr(autograd, "AUTO_KERNEL_DEVICES", ("cpu",))
    inputs = make_op_inputs(small_case(seqlen=16, chunk_size=8, **{"value_dim": 16, **change}))
    tensors = {n: inputs[n] for n in OP_INPUT_NAMES}
    got, reason = autograd.auto_backend(presets.get(policy), tensors, inputs["chunk_size"])
    assert got == choice and why in reason, reason
