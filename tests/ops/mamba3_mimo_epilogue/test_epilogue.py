"""The chain after stage 2 (``mamba3_mimo_epilogue``) and the whole FP64 backward chain.

* FP32 reference, given upstream's recorded stage-1/stage-2 outputs, ``pre`` and raw inputs, against the golden
  ``post`` and ``autograd`` entries (near-exact: FP32-level differences only; tolerances from the measurements).
  The reference's sums are sequential IEEE additions, but torch's fp32 ``exp``/``sigmoid``/``tanh`` may differ by an
  ulp between CPUs: every comparison has a tolerance.
* FP64 oracle against the FP32 reference (two independent implementations of upstream's definitions).
* Chain check: FP64 preprocessing -> stage-1 FP64 oracle -> stage-2 FP64 oracle -> FP64 epilogue equals torch
  autograd of the FP64 forward model (``ops/mamba3_mimo/fp64_model.py``) for every input gradient; the clamp finding;
  the FP64 chain against the golden upstream gradients.
"""

import itertools

import pytest
import torch

import chain_support as chain
import bwd_bwd_support as support
from mimo_numerics import tolerances
from mimo_numerics.metrics import bit_equal_fraction, rel_rms
from mimo_numerics.ops.mamba3_mimo_epilogue.oracle import mamba3_mimo_epilogue_oracle
from mimo_numerics.ops.mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference
from mimo_numerics.ops.mamba3_mimo_epilogue.spec import GRAD_NAMES, INPUT_NAMES, OUTPUT_NAMES, POST_NAMES
from mimo_numerics.rounding import round_to_lp

NAMES = support.case_names()
LP_OUTPUTS = ("dQ", "dK", "dV", "dTrap", "dZ", "dQ_bias", "dK_bias")
FP32_SUMS = ("dMIMO_V", "dMIMO_Z", "dMIMO_Out", "dD")
EXP_OUTPUTS = ("ddt_core", "dADT")
TANH_OUTPUTS = ("dAngles", "dDT_angle", "dDT")
#: Equal to upstream's recorded bits in every element of every golden case, on every machine: the reference forms
#: these from the recorded stage-2 outputs with copies, sequential fp32 additions (``_sum_sequential``: one IEEE add
#: per element in a fixed order, no BLAS, no vector order) and ``round_to_lp``, so its bits are the same on any CPU,
#: and the golden data are fixed (scripts/measure_test_tolerances.py: 0 differing elements). dTrap goes through
#: torch's vectorised sigmoid, which may differ by an ulp between CPUs: it keeps a bit-equal fraction tolerance.
EXACT_OUTPUTS = ("dQ", "dK", "dV", "dZ", "dQ_bias", "dK_bias") + FP32_SUMS


def _golden_args(name):
    case = support.load_full_op()[name]
    inputs = case["inputs"]
    return case, support.epilogue_args(inputs, case["pre"], case["bwd_fwd"], case["bwd_bwd"]), \
        support.epilogue_kwargs(inputs)


def _targets(case):
    """Golden values by output key: ``post`` entries and ``autograd`` gradients (they agree where both exist)."""
    targets = {k: v for k, v in case["autograd"].items() if k in GRAD_NAMES}
    for post_name, key in POST_NAMES.items():
        if key in targets:
            assert torch.equal(targets[key], case["post"][post_name]), post_name
        targets[key] = case["post"][post_name]
    return targets


@pytest.fixture(scope="module")
def golden_runs():
    runs = {}
    for name in NAMES:
        case, args, kwargs = _golden_args(name)
        runs[name] = (case, mamba3_mimo_epilogue_reference(*args, **kwargs),
                      mamba3_mimo_epilogue_oracle(*args, **kwargs))
    return runs


# ---- FP32 reference vs the golden upstream data ----

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("output", LP_OUTPUTS + FP32_SUMS + EXP_OUTPUTS + TANH_OUTPUTS)
def test_epilogue_reference_matches_upstream(golden_runs, name, output):
    case, got, _ = golden_runs[name]
    want = _targets(case).get(output)
    if want is None:
        assert got[output] is None
        return
    assert got[output].dtype == want.dtype and got[output].shape == want.shape
    if output in EXACT_OUTPUTS:
        assert torch.equal(got[output], want), output
        return
    if output in LP_OUTPUTS:
        assert bit_equal_fraction(got[output], want) >= tolerances.get(
            "epilogue_reference_vs_upstream_dtrap_bit_equal_min")
        return
    key = {**{o: "exp" for o in EXP_OUTPUTS},
           **{o: "tanh" for o in TANH_OUTPUTS}}[output]
    assert rel_rms(got[output], want) <= tolerances.get(f"epilogue_reference_vs_upstream_{key}_rel_rms")


def test_epilogue_fma_matches_upstream_better_on_ddt_core():
    """Evidence for the ``fma`` knob: upstream's ``ddt = dsdt_shift + dgamma·σ(trap)`` is one rounding."""
    for name in NAMES:
        case, args, kwargs = _golden_args(name)
        want = case["post"]["ddt_core"]
        fused = bit_equal_fraction(mamba3_mimo_epilogue_reference(*args, **kwargs, fma=True)["ddt_core"], want)
        separate = bit_equal_fraction(mamba3_mimo_epilogue_reference(*args, **kwargs, fma=False)["ddt_core"], want)
        assert fused > separate, name


def test_epilogue_bias_sums_are_rounded_to_lp_upstream():
    """Evidence for ``bias_sums_in_lp``: 2.3.2.post1's ``dQ_bias`` holds bf16 values; the fp32 sum does not match."""
    case, args, kwargs = _golden_args("g_B2_S48_H4_G1_N64_P64_R4_C16_gqa")
    want = case["autograd"]["dQ_bias"]
    assert want.dtype == torch.float32 and torch.equal(want, want.to(torch.bfloat16).float())
    unrounded = mamba3_mimo_epilogue_reference(*args, **kwargs, bias_sums_in_lp=False)["dQ_bias"]
    assert rel_rms(unrounded, want) > 1e-4
    assert rel_rms(unrounded, want) <= 2.0 ** -8


# ---- FP64 oracle vs FP32 reference ----

@pytest.mark.parametrize("name", NAMES)
def test_epilogue_oracle_matches_reference(golden_runs, name):
    case, ref, orc = golden_runs[name]
    lp = case["inputs"]["Q"].dtype
    for output in OUTPUT_NAMES:
        if ref[output] is None:
            assert orc[output] is None, output
            continue
        assert orc[output].dtype == torch.float64, output
        expected = round_to_lp(orc[output], lp) if output in LP_OUTPUTS else orc[output]
        assert rel_rms(ref[output], expected) <= tolerances.get("epilogue_reference_vs_oracle_rel_rms"), output


# ---- bad inputs ----

def _args_by_name(name="g_B1_S64_H2_N64_P64_R4_C16_zdo"):
    _, args, kwargs = _golden_args(name)
    return dict(zip(INPUT_NAMES, args)), kwargs


@pytest.mark.parametrize("change,error,match", [
    (lambda a, k: a.update(ddA=None), TypeError, "ddA is required"),
    (lambda a, k: a.update(dmimo_z=None), ValueError, "dz and dmimo_z"),
    (lambda a, k: a.update(dSSdA=a["dSSdA"][:, :, :2]), ValueError, "dSSdA must have shape"),
    (lambda a, k: a.update(trap=a["trap"].float()), TypeError, "trap must have dtype torch.bfloat16"),
    (lambda a, k: a.update(dfactor=a["dfactor"].double()), TypeError, "dfactor must have dtype torch.float32"),
    (lambda a, k: a.update(dq=a["dq"].float()), TypeError, "dq must have dtype torch.bfloat16 or torch.float16"),
    (lambda a, k: a.update(angles=a["angles"][..., 0]), ValueError, "angles must have 4 dimensions"),
    (lambda a, k: k.update(chunk_size=24), ValueError, "multiple of chunk_size"),
    (lambda a, k: k.update(groups=3), ValueError, "groups=3 must divide"),
    (lambda a, k: k.update(groups=1.0), TypeError, "groups must be an int"),
])
def test_epilogue_reference_rejects_bad_inputs(change, error, match):
    args, kwargs = _args_by_name()
    change(args, kwargs)
    with pytest.raises(error, match=match):
        mamba3_mimo_epilogue_reference(*args.values(), **kwargs)


def test_epilogue_rejects_groups_between_one_and_heads_as_upstream():
    args, kwargs = _args_by_name("g_B2_S48_H4_G1_N64_P64_R4_C16_gqa")
    for fn in (mamba3_mimo_epilogue_reference, mamba3_mimo_epilogue_oracle):
        with pytest.raises(ValueError, match="G == 1 or G == H"):
            fn(*args.values(), **{**kwargs, "groups": 2})


def test_epilogue_oracle_accepts_float64_and_still_checks_shapes():
    args, kwargs = _args_by_name()
    args = {k: (None if v is None else v.double()) for k, v in args.items()}
    assert mamba3_mimo_epilogue_oracle(*args.values(), **kwargs)["dADT"].dtype == torch.float64
    args["dgamma_diag"] = args["dgamma_diag"][..., :-1]
    with pytest.raises(ValueError, match="dgamma_diag must have shape"):
        mamba3_mimo_epilogue_oracle(*args.values(), **kwargs)


# ---- the whole FP64 chain vs torch autograd of the FP64 forward ----

def _c(rank, state_dim, dtype, reduce_o, has_z, has_d, **kw):
    return chain.ChainCase(rank=rank, state_dim=state_dim, dtype=dtype, reduce_o=reduce_o, has_z=has_z,
                           has_d=has_d, **kw)


#: A covering design: every pair of branch flags, G = 1 and G = H, R in {1, 2, 4, 8}, N in {32, 64, 128}, bf16 and
#: fp16, both rotary divisors, B = 2, three chunks (C = 4 or 8) each.
CHAIN_CASES = [
    _c(1, 32, "bfloat16", True, True, True, chunk_size=8, seed=1),
    _c(2, 64, "float16", False, True, False, groups=2, batch=2, rotary_dim_divisor=2, seed=2),
    _c(4, 128, "bfloat16", True, False, False, groups=2, seed=3),
    _c(8, 32, "float16", True, False, True, heads=3, rotary_dim_divisor=2, seed=4),
    _c(4, 64, "bfloat16", False, False, True, heads=1, chunk_size=8, seed=5),
    _c(8, 128, "float16", False, True, True, groups=2, seed=6),
    _c(2, 32, "bfloat16", True, True, False, heads=4, batch=2, nchunks=4, seed=7),
]
#: The rest of the product (slow): R x N x dtype x branch sets, G alternating.
SLOW_CHAIN_CASES = [
    _c(r, n, dt, ro, z, d, groups=1 + (i % 2), seed=100 + i)
    for i, (r, n, dt, (ro, z, d)) in enumerate(itertools.product(
        (1, 2, 4, 8), (32, 64, 128), ("bfloat16", "float16"),
        ((True, True, True), (False, False, False), (True, False, True), (False, True, False))))
]


def _assert_chain_matches_autograd(case):
    inputs = chain.draw_inputs(case)
    assert not chain.positive_partial_sums(inputs)
    got, want = chain.fp64_chain(inputs), chain.autograd_fp64(inputs)
    for name in GRAD_NAMES:
        if want[name] is None:
            assert got[name] is None, name
            continue
        assert got[name].shape == want[name].shape, name
        assert rel_rms(got[name], want[name]) <= tolerances.get("fp64_chain_vs_autograd_rel_rms"), name


@pytest.mark.parametrize("case", CHAIN_CASES, ids=lambda c: c.id)
def test_fp64_chain_equals_autograd_of_fp64_forward(case):
    _assert_chain_matches_autograd(case)


# in the default suite: it reproduces the figure of fp64_chain_vs_autograd_rel_rms (96 cases, ~70 s loaded)
@pytest.mark.parametrize("case", SLOW_CHAIN_CASES, ids=lambda c: c.id)
def test_fp64_chain_equals_autograd_of_fp64_forward_slow(case):
    _assert_chain_matches_autograd(case)


def test_fp64_chain_follows_upstream_through_the_clamp():
    """Where ADT makes a chunk partial sum positive, upstream's backward (and so this chain) differentiates the
    clamp ``min(·, 0)`` as the identity: it equals the straight-through gradient of the clamped forward and, for
    dADT only, differs from the exact gradient."""
    inputs = chain.draw_inputs(_c(2, 32, "bfloat16", True, True, True, positive_adt=True, seed=3))
    assert chain.positive_partial_sums(inputs)
    got = chain.fp64_chain(inputs)
    straight_through, exact = chain.autograd_fp64(inputs, "upstream"), chain.autograd_fp64(inputs, "exact")
    for name in GRAD_NAMES:
        assert rel_rms(got[name], straight_through[name]) <= tolerances.get("fp64_chain_vs_autograd_rel_rms"), name
        if name != "dADT":
            assert rel_rms(got[name], exact[name]) <= tolerances.get("fp64_chain_vs_autograd_rel_rms"), name
    assert rel_rms(got["dADT"], exact["dADT"]) > 0.1


@pytest.mark.parametrize("name", NAMES)  # all 7 golden cases (the entry's figures), ~2 s each loaded
def test_fp64_chain_vs_upstream_gradients(name):
    """Upstream's gradients (BF16 kernels) against the FP64 chain from the raw inputs alone: bf16-level."""
    case = support.load_full_op()[name]
    got = chain.fp64_chain(case["inputs"])
    for grad in GRAD_NAMES:
        want = case["autograd"][grad]
        if want is None:
            assert got[grad] is None, grad
        elif grad != "dD":  # a cancelling sum: gated against its terms in test_bwd_bwd_oracle.py
            assert rel_rms(want, got[grad]) <= tolerances.get("fp64_chain_vs_upstream_autograd_rel_rms"), grad


def test_long_sequential_sum_is_the_same_chain_of_adds():
    """Past ``SEQUENTIAL_LOOP_MAX`` terms the ordered sum runs as one numpy accumulate: the same bits as one torch
    add per term, left to right, also with -0, subnormals, infinities and NaN among the terms (CPU)."""
    from mimo_numerics.ops.mamba3_mimo_epilogue import reference as epilogue_reference

    g = torch.Generator().manual_seed(5)
    terms = (torch.randn(1000, 3, 7, generator=g) * torch.logspace(-30, 30, 1000)[:, None, None]).float()
    terms[10, 0, 0], terms[11, 0, 1], terms[12, 1, 1] = -0.0, 1e-40, float("inf")
    terms[13, 1, 1], terms[14, 2, 2], terms[:, 2, 3] = float("-inf"), float("nan"), -0.0
    assert terms.shape[0] > epilogue_reference.SEQUENTIAL_LOOP_MAX
    want = terms[0].clone()
    for row in terms[1:]:
        want = want + row
    got = epilogue_reference._sum_sequential(terms.movedim(0, 1), dim=1)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
