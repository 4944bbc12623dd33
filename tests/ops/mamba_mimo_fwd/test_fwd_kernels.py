"""CPU (Triton interpreter) tests of the forward Triton kernel ``mimo_numerics.kernels.mamba_mimo_fwd``.

Gates (issue 23, acceptance 1): on the small cases of ``ops.mamba_mimo_fwd.cases.kernel_cases`` (reduced and full
output, Z and D on and off, G = 1 < H and G = H, R in {1, 2, 3, 4, 8}, tails, bf16 and fp16) the kernel under policy
P matches the forward reference under P (rel RMS <= same_policy_rel_rms = 3e-4, and o equal but for a few elements
a few lp ulps apart: tolerances.py, fwd_kernel_interpreter_vs_reference_*) and is closer to it than to the reference
under any other preset with forward semantics; the output and every workspace are poisoned with NaN first and must
come back without NaN. Plus: every forward site and knob honoured, records, tile plans (device and Ascend), the
policy constexprs, bad inputs and policies, and an sm_90 compile. The whole op on kernels: test_whole_op_kernels.py.
"""

from __future__ import annotations

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics import operator as _operator
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import rel_rms, ulp_distance
from mimo_numerics.ops.mamba_mimo_fwd.cases import kernel_cases, kernel_policies, make_inputs
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd as forward_reference
from mimo_numerics.ops.mamba_mimo_fwd.sites import SITES
from mimo_numerics.ops.mamba_mimo_fwd.spec import stages_for
from mimo_numerics.ops.mamba_mimo_fwd.validation import validate_inputs
from mimo_numerics.policy import PolicyUndefined

pytestmark = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")

GATE_RTOL = tolerances.get("same_policy_rel_rms")
LP_DIFFERING = tolerances.get("fwd_kernel_interpreter_vs_reference_lp_differing_max")
LP_ULPS = tolerances.get("fwd_kernel_interpreter_vs_reference_lp_ulps_max")
CASES = kernel_cases()
GATE_PARAMS = [pytest.param(spec, name, pol, id=f"{spec.case_id}-{name}")
               for spec in CASES for name, pol in kernel_policies(spec)]

_inputs_cache, _kernel_cache, _ref_cache = {}, {}, {}


def _inputs(spec):
    if spec not in _inputs_cache:
        _inputs_cache[spec] = make_inputs(spec)
    return _inputs_cache[spec]


#: the tensors in API order and the scalar arguments of an inputs dict (the operator's own calling convention)
_args = _operator.get("mamba_mimo_fwd").args
_kw = _operator.get("mamba_mimo_fwd").kwargs


def _kernel(spec, name, policy):
    if (spec, name) not in _kernel_cache:
        x = _inputs(spec)
        _kernel_cache[spec, name] = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy=policy, poison=True).o
    return _kernel_cache[spec, name]


def _reference(spec, name, policy):
    if (spec, name) not in _ref_cache:
        x = _inputs(spec)
        _ref_cache[spec, name] = forward_reference(*_args(x), **_kw(x), policy=policy).o
    return _ref_cache[spec, name]


def _check_same_policy(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    assert not torch.isnan(got.float()).any(), f"{what}: NaN left by the poisoned launch (element not written)"
    err = rel_rms(got.float(), want.float())
    ulps = ulp_distance(got, want, want.dtype)
    differing, worst = int((ulps > 0).sum()), int(ulps.max())
    assert err <= GATE_RTOL, f"{what}: kernel vs reference rel RMS {err:.3e} > {GATE_RTOL}"
    assert differing <= LP_DIFFERING and worst <= LP_ULPS, f"{what}: {differing} elements differ, up to {worst} ulps"


# ---------------------------------------------------------------------------------------------------- gates
def test_cases_cover_the_issue_grid():
    """>= 6 cases; Z, D, reduced and not; G = 1 < H and G = H; R in {1, 2, 4, 8}; bf16 and fp16."""
    assert len(CASES) >= 6
    for flag in ("has_z", "has_d", "reduce_o"):
        assert {getattr(s, flag) for s in CASES} == {True, False}, flag
    assert any(s.groups == 1 < s.heads for s in CASES) and any(s.groups == s.heads > 1 for s in CASES)
    assert {1, 2, 4, 8} <= {s.rank for s in CASES} and {s.dtype for s in CASES} == {"bfloat16", "float16"}


@pytest.mark.parametrize("spec, name, policy", GATE_PARAMS)
def test_fwd_kernel_matches_reference(spec, name, policy):
    _check_same_policy(_kernel(spec, name, policy), _reference(spec, name, policy), f"{spec.case_id} {name}")


@pytest.mark.parametrize("spec, name, policy", GATE_PARAMS)
def test_fwd_kernel_closest_to_its_own_policy(spec, name, policy):
    got = _kernel(spec, name, policy)
    own_ref = _reference(spec, name, policy)
    own = rel_rms(got.float(), own_ref.float())
    compared = 0
    for other, other_policy in kernel_policies(spec):
        other_ref = _reference(spec, other, other_policy)
        gap = rel_rms(other_ref.float(), own_ref.float())
        # presets that give this case the same (or nearly the same) output cannot be told apart by any kernel
        if other == name or gap <= 1e-5 + 2 * own:
            continue
        compared += 1
        far = rel_rms(got.float(), other_ref.float())
        assert own < far, f"kernel under {name} is closer to the reference under {other}: {far:.3e} <= {own:.3e}"
    assert compared >= 1  # every case separates the policy from fp32 at least


# ---------------------------------------------------------------------------------------------------- policy
_SWITCH_CASE = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True)
_FULL_CASE = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=8, reduce_o=False, has_z=True,
                      has_d=True)
_VARIANTS = ([pytest.param(_SWITCH_CASE, {s: False}, id=f"{s}_off") for s in SITES]
             + [pytest.param(_FULL_CASE, {"gate": False}, id="gate_off_full_output"),
                pytest.param(_SWITCH_CASE, {"diag_mode": "mul_then_add"}, id="diag_mul_then_add"),
                pytest.param(_SWITCH_CASE, {"state_update": "separate"}, id="state_separate"),
                pytest.param(_SWITCH_CASE, {"silu_form": "sigmoid"}, id="silu_sigmoid")])


def _variant(base, change):
    sites = {k: v for k, v in change.items() if k in SITES}
    knobs = {k: v for k, v in change.items() if k not in SITES}
    policy = base.replace(**knobs) if knobs else base
    return policy.with_sites("mamba_mimo_fwd", **sites) if sites else policy


@pytest.mark.parametrize("spec, change", _VARIANTS)
def test_every_forward_switch_and_knob_is_honoured(spec, change):
    base = mn.presets.get("upstream_sm90")
    variant = _variant(base, change)
    x = _inputs(spec)
    got = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy=variant, poison=True).o
    ref_v = forward_reference(*_args(x), **_kw(x), policy=variant).o
    ref_b = forward_reference(*_args(x), **_kw(x), policy=base).o
    _check_same_policy(got, ref_v, str(change))
    if rel_rms(ref_v.float(), ref_b.float()) > 1e-5:
        assert rel_rms(got.float(), ref_v.float()) < rel_rms(got.float(), ref_b.float()), change


def test_forward_policy_constexprs():
    cx = kernels.policy_constexprs("upstream_sm90", "mamba_mimo_fwd")
    assert cx["FORWARD"] and cx["QK_DOT_INTERNAL"] and cx["D_TERM"] and cx["OUT_ACCUM"]
    assert not (cx["OUT"] or cx["DPHIO"] or cx["DZ_ACCUM"])  # stage 1's own switches, off in the forward
    off = kernels.policy_constexprs(mn.presets.get("upstream_sm90").with_sites("mamba_mimo_fwd", qk_dot=False),
                                    "mamba_mimo_fwd")
    assert not off["QK_DOT_INTERNAL"]
    stage1 = kernels.policy_constexprs("upstream_sm90")
    assert not stage1["FORWARD"] and not any(stage1[k] for k in ("D_TERM", "GATE", "PHI_GATE", "OUT_PROJ",
                                                                 "OUT_ACCUM"))
    fp32 = kernels.policy_constexprs("fp32", "mamba_mimo_fwd")
    assert not any(fp32[name.upper()] for name in SITES if name != "qk_dot") and not fp32["QK_DOT_INTERNAL"]
    with pytest.raises(ValueError, match="operator must be one of"):
        kernels.policy_constexprs("fp32", "mamba_mimo_bwd_bwd")
    with pytest.raises(PolicyUndefined, match="mamba_mimo_fwd"):
        kernels.policy_constexprs("seed_bf16", "mamba_mimo_fwd")


@pytest.mark.parametrize("policy, field", [("fp64", "math_dtype"),
                                           (mn.presets.get("fp32").replace(round_outputs=False), "round_outputs")])
def test_unexpressible_policy_names_the_field(policy, field):
    x = _inputs(CASES[0])
    with pytest.raises(kernels.UnsupportedPolicyError, match=field):
        kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy=policy)


# ---------------------------------------------------------------------------------------------------- plans
_PLANS = {
    "device_tiles": dict(BN=16, BP2=16, BP3=16, CB=2, RBK=2, max_programs=3),
    "ascend_plan": dict(RB=16, qk_gemm=0, BN=16, BP2=16, BP3=16, TB=16, RBK=1, JB=16, max_programs=3),
    "token_blocks": dict(TB=16, RBK=2, JB=32),
}


@pytest.mark.parametrize("reduce_o", [True, False], ids=["reduced", "full"])
@pytest.mark.parametrize("tiling", list(_PLANS))
def test_tile_plans_match_reference(tiling, reduce_o):
    """The device and Ascend plans under the interpreter: several P tiles, rank blocks of two ranks (the lp rank
    sum out_accum across blocks in ascending order), more virtual programs than launched, the Ascend prep plan and
    16-row k̂/ΨV steps; and two 16-token blocks per chunk (C = 24, R = 3 padded to 4)."""
    if tiling == "token_blocks":
        spec = CaseSpec(seqlen=40, state_dim=16, value_dim=16, rank=3, chunk_size=24, has_z=True, has_d=True,
                        reduce_o=reduce_o)
    else:
        spec = CaseSpec(seqlen=36, state_dim=32, value_dim=32, rank=4, chunk_size=8, has_z=True, has_d=True,
                        reduce_o=reduce_o)
    x = _inputs(spec)
    from mimo_numerics.kernels import mimo_fwd

    prep = mimo_fwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", tuning=_PLANS[tiling])
    assert [la.name for la in prep.launches] == ["angles", "prep", "state", "out"]
    assert prep.config.forward and prep.config.n_sums == 0
    got = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy="upstream_sm90", poison=True, tuning=_PLANS[tiling]).o
    _check_same_policy(got, forward_reference(*_args(x), **_kw(x), policy="upstream_sm90").o, tiling)


def test_npu_plan_builds_from_cpu_tensors():
    """The Ascend compile gate builds the forward's NPU launches from CPU tensors."""
    from mimo_numerics.kernels import mimo_fwd

    spec = CaseSpec(seqlen=40, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True, has_d=True)
    x = _inputs(spec)
    prep = mimo_fwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", backend="npu")
    assert [la.name for la in prep.launches] == ["angles", "prep", "state", "out"]
    out = next(la for la in prep.launches if la.name == "out")
    assert out.constexprs["FORWARD"] and out.constexprs["DIAG_LOOP"] and out.options == {}


# ---------------------------------------------------------------------------------------------------- records
@pytest.mark.parametrize("spec", [CASES[0], CASES[2]], ids=["reduced_ZD", "full_ZD"])
def test_record_stages_match_reference(spec):
    x = _inputs(spec)
    rk, rr = {}, {}
    kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy="upstream_sm90", record=rk, poison=True)
    forward_reference(*_args(x), **_kw(x), policy="upstream_sm90", record=rr)
    dims = validate_inputs(*_args(x), **_kw(x))
    assert set(rk) == set(rr) == {s.name for s in stages_for(dims)}, sorted(set(rk) ^ set(rr))
    for name, ref in rr.items():
        got = rk[name]
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert not torch.isnan(got).any(), name
        assert rel_rms(got, ref.float()) <= GATE_RTOL, (name, rel_rms(got, ref.float()))


def test_deterministic():
    x = _inputs(CASES[4])
    a = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy="upstream_sm90").o
    b = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy="upstream_sm90", poison=True).o
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---------------------------------------------------------------------------------------------------- errors
def _bad_inputs():
    x = _inputs(CASES[0])

    def mutate(**changes):
        return dict(x, **changes)

    return [("dtype", mutate(q=x["q"].float())), ("shape", mutate(v=x["v"][:, :-1])),
            ("pairing", mutate(mimo_z=None)), ("missing", mutate(segsum=None)),
            ("divisor", mutate(rotary_dim_divisor=3)), ("policy_dtype", mutate(q=x["q"].half(), k=x["k"].half()))]


@pytest.mark.parametrize("label, bad", _bad_inputs(), ids=[b[0] for b in _bad_inputs()])
def test_bad_inputs_raise_the_reference_errors(label, bad):
    with pytest.raises((TypeError, ValueError)) as ref_err:
        forward_reference(*_args(bad), **_kw(bad), policy="upstream_sm90")
    with pytest.raises(type(ref_err.value)) as ker_err:
        kernels.mamba_mimo_fwd(*_args(bad), **_kw(bad), policy="upstream_sm90")
    assert str(ker_err.value) == str(ref_err.value)


def test_dtype_argument_is_checked_as_upstream_takes_it():
    x = _inputs(CASES[0])
    got = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), dtype=torch.bfloat16, policy="upstream_sm90").o
    assert torch.equal(got, _reference(CASES[0], "upstream_sm90", mn.presets.get("upstream_sm90")))
    with pytest.raises((TypeError, ValueError), match="dtype"):
        kernels.mamba_mimo_fwd(*_args(x), **_kw(x), dtype=torch.float16, policy="upstream_sm90")


@pytest.mark.parametrize("spec, word", [
    (CaseSpec(seqlen=8, state_dim=8, value_dim=16, rank=2, chunk_size=8), "N=8"),
    (CaseSpec(seqlen=8, state_dim=16, value_dim=24, rank=2, chunk_size=8), "P=24"),
    (CaseSpec(seqlen=8, state_dim=16, value_dim=16, rank=3, chunk_size=48), "chunk_size"),
], ids=["N8", "P24", "CR144"])
def test_unsupported_sizes_raise_value_error(spec, word):
    x = make_inputs(spec)
    forward_reference(*_args(x), **_kw(x), policy="upstream_sm90")  # valid for the reference
    with pytest.raises(ValueError, match=word):
        kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy="upstream_sm90")


# ---------------------------------------------------------------------------------------------------- sm_90 compile
def _toolchain():
    from mimo_numerics.kernels import _devtools

    return _devtools.nvidia_toolchain_available()


@pytest.mark.skipif(not _toolchain(), reason="Triton's NVIDIA backend (ptxas) is not installed")
@pytest.mark.parametrize("policy, spec", [
    ("upstream_sm90", CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
                               has_d=True)),
    ("upstream_sm90", CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
                               reduce_o=False)),
    ("fp32", CaseSpec(seqlen=24, state_dim=32, value_dim=16, rank=3, chunk_size=6, has_d=True)),
], ids=["sm90_reduced_ZD", "sm90_full_Z", "fp32_R3_C6"])
def test_compiles_for_sm90(policy, spec):
    """The compiled (CUDA) path of the forward: every launch compiles for sm_90 with the CUDA launch options (no GPU
    needed); the output kernel's spill stays under 1 KiB (its 128-register cap, as in stage 1)."""
    from mimo_numerics.kernels import _devtools, mimo_fwd

    x = _inputs(spec)
    prep = mimo_fwd.build_launches(*_args(x), **_kw(x), policy=policy, backend="cuda", sm_count=132)
    for row in _devtools.compile_launches(prep, arch=90):
        assert row["regs"] > 0 and row["stack"] <= (1024 if row["name"] == "out" else 0), row


# ---------------------------------------------------------------------------------------------------- golden
def test_golden_upstream_cases_on_cpu():
    """The forward reference's golden gates for the kernel, through the interpreter: within 1e-3 of the real
    upstream H200 output under upstream_sm90, >= 98 % of the elements bit-equal, fp32 >= 5x further (the GPU run:
    test_fwd_kernels_gpu.py)."""
    from mamba_mimo_fwd_support import check_kernel_golden

    assert len(check_kernel_golden(torch.device("cpu"))) == 12
