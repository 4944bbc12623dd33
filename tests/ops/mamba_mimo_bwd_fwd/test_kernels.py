"""CPU (Triton interpreter) tests of the policy-configured Triton kernels ``mimo_numerics.kernels``.

Gates (issue acceptance 1, 4): on small cases covering every branch, GQA, tails, B > 1 and R = 3 / C = 6, the
kernel under policy P matches the reference under P (fp32 outputs within an FP32-order rel RMS, lp outputs equal
but for a few elements a lp ulp or two apart: tolerances.py, kernels_interpreter_vs_reference_*) and is closer to it
than to the reference under any other preset that accepts the same inputs; outputs and intermediate buffers are
poisoned with NaN before each launch and must come back without NaN. Plus: rounding helpers against torch, every
policy switch and knob honoured, records, determinism, bad inputs, unsupported sizes and policies, the interpreter
time guard, and ``import mimo_numerics.kernels`` without Triton.

Shapes are tiny: the interpreter costs milliseconds per op per program. GPU versions: ``test_kernels_gpu.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.metrics import rel_rms, ulp_distance
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as SWITCHES
from mimo_numerics.rounding import round_sum_to_lp, round_to_lp
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference
from mimo_numerics.ops.mamba_mimo_bwd_fwd import validation as stage1_validation

pytestmark = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")

#: Two correct implementations of one policy (the kernels and the reference) differ by FP32 summation order.
GATE_RTOL = tolerances.get("same_policy_rel_rms")
#: The gate cases' own bounds (measured on CASES: scripts/measure_test_tolerances.py, group kernels): FP32 outputs
#: by rel RMS; lp outputs by how many elements differ and by how many lp ulps, since on these small outputs one
#: flipped rounding (what another CPU's BLAS order can cause) is worth up to 4e-3 in rel RMS.
FP32_RTOL = tolerances.get("kernels_interpreter_vs_reference_fp32_rel_rms")
LP_DIFFERING = tolerances.get("kernels_interpreter_vs_reference_lp_differing_max")
LP_ULPS = tolerances.get("kernels_interpreter_vs_reference_lp_ulps_max")


# ---------------------------------------------------------------------------------------------------- cases
def _case(**kw):
    return CaseSpec(**kw)


#: small cases, each < ~10 interpreter programs; together every branch, GQA, tails, B > 1, R = 3 / C = 6, R = 1,
#: rotary divisor 2, both formulas, bf16 and fp16
CASES = (
    _case(seqlen=13, state_dim=16, value_dim=16, rank=3, chunk_size=6, has_z=True, has_d=True),  # roZD, C·R=18
    _case(batch=2, heads=4, groups=2, seqlen=12, state_dim=16, value_dim=32, rank=2, chunk_size=8),  # ro--, GQA
    _case(formula="realistic", seqlen=24, heads=2, groups=1, state_dim=32, value_dim=16, rank=2, chunk_size=8,
          reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2),  # foZD, GQA, divisor 2
    _case(seqlen=20, state_dim=32, value_dim=16, rank=1, chunk_size=16, reduce_o=False, has_d=True),  # fo-D, R=1
    _case(formula="realistic", seqlen=16, state_dim=16, value_dim=16, rank=4, chunk_size=4, has_z=True),  # roZ-
    _case(seqlen=11, state_dim=16, value_dim=16, rank=2, chunk_size=8, reduce_o=False),  # fo--, tail
    _case(seqlen=19, heads=2, groups=2, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True,
          dtype="float16"),  # roZD fp16, tail
    _case(seqlen=12, state_dim=16, value_dim=16, rank=1, chunk_size=4, reduce_o=False, has_z=True,
          dtype="float16", rotary_dim_divisor=2),  # foZ- fp16, R=1
)

BF16_PRESETS = ("fp32", "seed_bf16", "upstream_sm90")
FP16_PRESETS = ("upstream_sm90_fp16",)


def _policies_for(spec: CaseSpec):
    """(name, policy) pairs that accept the case's inputs: the four gate presets by dtype; for fp16 cases also the
    fp32 and seed_bf16 presets with lp_dtype float16 (so there is something to be closer than)."""
    if spec.dtype == "bfloat16":
        return [(n, mn.presets.get(n)) for n in BF16_PRESETS]
    return [(n, mn.presets.get(n)) for n in FP16_PRESETS] + [
        (f"{n}@fp16", mn.presets.get(n).replace(lp_dtype="float16")) for n in ("fp32", "seed_bf16")]


GATE_PARAMS = [pytest.param(spec, name, pol, id=f"{spec.case_id}-{name}")
               for spec in CASES for name, pol in _policies_for(spec)]

_inputs_cache = {}
_kernel_cache = {}
_ref_cache = {}


def _inputs(spec):
    if spec not in _inputs_cache:
        _inputs_cache[spec] = make_inputs(spec)
    return _inputs_cache[spec]


def _kernel(spec, name, policy):
    key = (spec, name)
    if key not in _kernel_cache:
        x = _inputs(spec)
        _kernel_cache[key] = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy, poison=True)
    return _kernel_cache[key]


def _reference(spec, name, policy):
    key = (spec, name)
    if key not in _ref_cache:
        x = _inputs(spec)
        _ref_cache[key] = stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)
    return _ref_cache[key]


def _distances(a, b):
    """Per-output relative RMS of a against b (outputs present in b)."""
    return {n: rel_rms(getattr(a, n).float(), getattr(b, n).float()) for n in OUTPUT_NAMES
            if getattr(b, n) is not None}


# ---------------------------------------------------------------------------------------------------- gates
@pytest.mark.parametrize("spec, name, policy", GATE_PARAMS)
def test_kernels_match_reference(spec, name, policy):
    out = _kernel(spec, name, policy)
    ref = _reference(spec, name, policy)
    for n in OUTPUT_NAMES:
        a, b = getattr(out, n), getattr(ref, n)
        assert (a is None) == (b is None), n
        if a is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, (n, a.dtype, b.dtype, a.shape, b.shape)
        assert not torch.isnan(a.float()).any(), f"{n}: NaN left by the poisoned launch (element not written)"
        if b.dtype in (torch.bfloat16, torch.float16):
            ulps = ulp_distance(a, b, b.dtype)
            differing, worst = int((ulps > 0).sum()), int(ulps.max())
            assert differing <= LP_DIFFERING and worst <= LP_ULPS, f"{n}: {differing} differ, up to {worst} ulps"
        else:
            err = rel_rms(a, b)
            assert err <= FP32_RTOL, f"{n}: kernel vs reference rel RMS {err:.3e} > {FP32_RTOL}"


@pytest.mark.parametrize("spec, name, policy", GATE_PARAMS)
def test_kernels_closest_to_their_own_policy(spec, name, policy):
    out = _kernel(spec, name, policy)
    own_ref = _reference(spec, name, policy)
    own = sum(_distances(out, own_ref).values())
    for other, other_policy in _policies_for(spec):
        if other == name:
            continue
        other_ref = _reference(spec, other, other_policy)
        # the two references differ beyond FP32 noise: the kernel must sit strictly closer to its own
        if sum(_distances(other_ref, own_ref).values()) > 1e-5:
            far = sum(_distances(out, other_ref).values())
            assert own < far, f"kernel under {name} is closer to the reference under {other}: {far:.3e} <= {own:.3e}"


def test_gate_presets_are_distinguished():
    # the closeness gate has teeth: on a Z case every pair of bf16 gate presets gives different references
    spec = CASES[0]
    for i, a in enumerate(BF16_PRESETS):
        for b in BF16_PRESETS[i + 1:]:
            ra = _reference(spec, a, mn.presets.get(a))
            rb = _reference(spec, b, mn.presets.get(b))
            assert sum(_distances(ra, rb).values()) > 1e-4, (a, b)


# ---------------------------------------------------------------------------------------------------- policy
_KNOB_CASE = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True)
_KNOB_CASE_FULL = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=8, reduce_o=False,
                           has_z=True)
_VARIANTS = ([pytest.param(_KNOB_CASE, {s: False}, id=f"{s}_off") for s in SWITCHES]
             + [pytest.param(_KNOB_CASE_FULL, {"dphio": False}, id="dphio_off_full_dout"),
                pytest.param(_KNOB_CASE, {"diag_mode": "mul_then_add"}, id="diag_mul_then_add"),
                pytest.param(_KNOB_CASE, {"state_update": "separate"}, id="state_separate"),
                pytest.param(_KNOB_CASE, {"silu_form": "sigmoid"}, id="silu_sigmoid")])


@pytest.mark.parametrize("spec, change", _VARIANTS)
def test_every_switch_and_knob_is_honoured(spec, change):
    base = mn.presets.get("upstream_sm90")
    variant = base.replace(**change)
    x = _inputs(spec)
    out = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=variant, poison=True)
    ref_v = stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=variant)
    ref_b = stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=base)
    d_own = _distances(out, ref_v)
    assert max(d_own.values()) <= GATE_RTOL, d_own
    if sum(_distances(ref_v, ref_b).values()) > 1e-5:
        assert sum(d_own.values()) < sum(_distances(out, ref_b).values())


_TILINGS = {
    "device_tiles": dict(BN=16, BP2=16, BP3=16, CB=2, CBR=2, BLKR=16, RBK=2, max_programs=3),
    "ascend_plan": dict(RB=16, qk_gemm=0, BN=16, BP2=16, BP3=16, TB=16, RBK=1, JB=16, max_programs=3),
}


def _check_tiled(spec, preset, overrides, check_plan):
    """Kernel under the tile plan ``overrides`` (``check_plan`` asserts on the plan) vs the reference: the gate
    tolerance on every output, and every output element written (poisoned launch)."""
    from mimo_numerics.kernels import mimo_bwd_fwd

    x = _inputs(spec)
    check_plan(mimo_bwd_fwd.build_launches(*as_args(x), **as_kwargs(x), policy=preset, tuning=overrides).plan)
    out = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=preset, poison=True, tuning=overrides)
    d = _distances(out, stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=preset))
    assert max(d.values()) <= GATE_RTOL, d
    for n in OUTPUT_NAMES:
        if getattr(out, n) is not None:
            assert not torch.isnan(getattr(out, n).float()).any(), n


@pytest.mark.parametrize("tiling", list(_TILINGS))
@pytest.mark.parametrize("preset", ["upstream_sm90", "seed_bf16"])
def test_tiled_plan_matches_reference(preset, tiling):
    """The device plans under the interpreter: several N/P tiles in the state walk and output kernel, decays
    loaded two chunks at a time, dmimo sums over blocks of chunks and columns, the chunk kernels looping over more
    virtual programs than launched (the Ascend grid cap), the output kernel's rank blocks (two blocks of two ranks;
    one rank per block with k̂/ΨV in 16-row steps), and the Ascend prep plan (16-row programs, same-step products
    without the [LP, LP] GEMM)."""
    spec = CaseSpec(seqlen=36, state_dim=32, value_dim=32, rank=4, chunk_size=8, has_z=True, has_d=True)

    def check_plan(pl):
        assert pl.grid1 == pl.grid3 == 3 and pl.virt3 == 2 * spec.nchunks
        if tiling == "ascend_plan":
            assert pl.RB == 16 and not pl.QK_GEMM and pl.virt1 == 2 * spec.nchunks

    _check_tiled(spec, preset, _TILINGS[tiling], check_plan)


@pytest.mark.parametrize("preset", ["upstream_sm90", "fp32"])
def test_token_blocks_match_reference(preset):
    """Output kernel with two 16-token blocks per chunk (C = 24, a tail chunk) and ranks split over two blocks
    (R = 3 padded to 4): the dmimo partials of both blocks are summed, dz rounds over ranks across blocks."""
    spec = CaseSpec(seqlen=40, state_dim=16, value_dim=16, rank=3, chunk_size=24, has_z=True, has_d=True)

    def check_plan(pl):
        assert (pl.n_tb, pl.RBK, pl.LP // pl.JB) == (2, 2, 4)

    _check_tiled(spec, preset, dict(TB=16, RBK=2, JB=32), check_plan)


@pytest.mark.parametrize("tuning, error, match", [
    ({"RBKK": 2}, ValueError, r"unknown keys \['RBKK'\]"),
    ([("RBK", 2)], TypeError, "tuning must be a mapping"),
    ({"TB": 16.0}, TypeError, r"values must be ints.*'TB'"),
    ({"native_lp": True}, TypeError, r"values must be ints.*'native_lp'"),
    ({"BN": 24}, ValueError, r"tuning\['BN'\]=24: must be a power of two"),
    ({"warps_k3": 0}, ValueError, r"tuning\['warps_k3'\]=0: must be a power of two"),
    ({"rcp_approx": 2}, ValueError, r"tuning\['rcp_approx'\]=2: must be 0 \(off\) or 1"),
    ({"max_programs": 0}, ValueError, r"tuning\['max_programs'\]=0: must be >= 1"),
    ({"maxnreg_k3": -1}, ValueError, r"tuning\['maxnreg_k3'\]=-1: must be >= 0"),
], ids=["unknown", "not_mapping", "float", "bool", "not_pow2", "zero_warps", "switch", "max_programs", "maxnreg"])
def test_bad_tuning_is_refused_naming_the_key(tuning, error, match):
    x = _inputs(CASES[5])
    with pytest.raises(error, match=match):
        kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90", tuning=tuning)
    dims = stage1_validation.validate_inputs(*as_args(x), **as_kwargs(x))
    with pytest.raises(error, match=match):
        kernels.launch_config("upstream_sm90", dims, "cuda", tuning=tuning, sm_count=132)


def test_launch_config_is_frozen_and_per_call():
    """One frozen object derived from (policy, sizes, backend, tuning) alone (memoized by value, nothing else kept),
    so a tuned call leaves the next untuned one as it was, and the caller's tuning dict is copied."""
    import dataclasses

    from mimo_numerics.kernels import mimo_bwd_fwd

    assert not hasattr(mimo_bwd_fwd, "TUNING") and not hasattr(mimo_bwd_fwd, "tuning")
    spec = CaseSpec(seqlen=40, heads=4, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True, has_d=True)
    x = _inputs(spec)
    dims = stage1_validation.validate_inputs(*as_args(x), **as_kwargs(x))
    base = kernels.launch_config("upstream_sm90", dims, "cuda", sm_count=132)
    overrides = {"RBK": 2, "warps_k3": 8, "native_lp": 0, "maxnreg_k3": 0}
    tuned = kernels.launch_config("upstream_sm90", dims, "cuda", tuning=overrides, sm_count=132)
    overrides["RBK"] = 4  # the config holds its own copy
    assert tuned.plan.RBK == 2 and base.plan.RBK == 1 and tuned.tuning["RBK"] == 2
    assert tuned.kernels["out"].options == {"num_warps": 8, "num_stages": 1, "enable_fp_fusion": False}
    assert base.kernels["out"].options["maxnreg"] == 128 and base.kernels["out"].options["num_warps"] == 4
    assert base.switches.native_lp and not tuned.switches.native_lp
    assert base.constexprs["LPK"] == 2 and tuned.constexprs["LPK"] == 0
    assert base == kernels.launch_config("upstream_sm90", dims, "cuda", sm_count=132)  # nothing leaked
    assert list(base.kernels) == ["angles", "prep", "state", "out", "reduce"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.plan = tuned.plan
    with pytest.raises(TypeError):
        base.constexprs["LPK"] = 0
    with pytest.raises(TypeError):
        base.kernels["state"].constexprs["ONE_DOT"] = False
    # the policy constexprs are policy_constexprs(policy), unchanged; the CUDA-only switches are off elsewhere
    assert dict(base.policy_constexprs) == kernels.policy_constexprs("upstream_sm90")
    for backend in ("interpreter", "npu"):
        cfg = kernels.launch_config("upstream_sm90", dims, backend, tuning={"native_lp": 1, "rcp_approx": 1})
        sw = cfg.switches
        assert not (sw.native_lp or sw.state_one_dot or sw.rcp_approx or sw.walk_psiv_from_v), backend
        assert cfg.constexprs["LPK"] == 0 and all(not kc.options for kc in cfg.kernels.values())
    with pytest.raises(ValueError, match="backend must be one of"):
        kernels.launch_config("upstream_sm90", dims, "metal")


def test_policy_constexprs_and_launch_config_are_memoized_by_value():
    """The host-side memo (``_config.per_policy``, ``launch_config``): a repeated call returns the same frozen
    config, an equal policy read back from JSON finds it, any other policy or size gets its own, each caller gets a
    fresh constexpr dict, and an unexpressible policy is refused on every call (errors are not cached)."""
    import dataclasses

    from mimo_numerics.kernels import mimo_bwd_bwd
    from mimo_numerics.kernels.chain_steps import chain_constexprs

    spec = CaseSpec(seqlen=40, heads=4, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True, has_d=True)
    x = _inputs(spec)
    dims = stage1_validation.validate_inputs(*as_args(x), **as_kwargs(x))
    policy = mn.presets.get("upstream_sm90")
    base = kernels.launch_config(policy, dims, "cuda", sm_count=132)
    assert kernels.launch_config("upstream_sm90", dims, "cuda", sm_count=132) is base
    again = mn.RoundingPolicy.from_json(policy.to_json())
    assert again is not policy and kernels.launch_config(again, dims, "cuda", sm_count=132) is base
    # one site off: other constexprs, another config (the memo keys on the policy's value)
    site = next(s for s in SWITCHES if policy.section("mamba_mimo_bwd_fwd")[s])
    off = policy.with_sites("mamba_mimo_bwd_fwd", **{site: False})
    other = kernels.launch_config(off, dims, "cuda", sm_count=132)
    assert other.constexprs[site.upper()] is False and base.constexprs[site.upper()] is True
    assert kernels.launch_config(policy, dims, "cuda", sm_count=100) is not base
    bigger = dataclasses.replace(dims, seqlen=80, nchunks=5)
    assert kernels.launch_config(policy, bigger, "cuda", sm_count=132).plan != base.plan
    for make in (kernels.policy_constexprs, mimo_bwd_bwd.stage2_constexprs, chain_constexprs):
        first = make(policy)
        first.clear()  # a caller's dict is its own
        assert make(policy) and make(policy) == make(again) and make(policy) is not make(policy)
    assert kernels.policy_constexprs(off)[site.upper()] is False
    assert kernels.policy_constexprs(policy, "mamba_mimo_fwd") == kernels.policy_constexprs(
        policy, operator="mamba_mimo_fwd")
    for _ in range(2):
        with pytest.raises(kernels.UnsupportedPolicyError, match="math_dtype"):
            kernels.launch_config("fp64", dims, "cuda", sm_count=132)
        with pytest.raises(kernels.UnsupportedPolicyError, match="math_dtype"):
            mimo_bwd_bwd.stage2_constexprs("fp64")
    with pytest.raises(TypeError, match="RoundingPolicy"):
        kernels.policy_constexprs(42)
    with pytest.raises(ValueError, match="operator must be one of"):
        kernels.policy_constexprs(policy, "mamba_mimo_bwd_bwd")
    with pytest.raises((TypeError, ValueError), match="tuning"):
        kernels.launch_config(policy, dims, "cuda", tuning=[("RBK", 2)], sm_count=132)
    # a memoized int does not let the equal bool through: the tuning check still refuses it
    assert not kernels.launch_config(policy, dims, "cuda", tuning={"native_lp": 0}, sm_count=132).switches.native_lp
    with pytest.raises(TypeError, match="native_lp"):
        kernels.launch_config(policy, dims, "cuda", tuning={"native_lp": False}, sm_count=132)


def test_build_launches_passes_the_config():
    """Every launch gets its kernel's own constexprs and the options of the config, nothing else."""
    from mimo_numerics.kernels import mimo_bwd_fwd

    x = _inputs(CASES[0])
    prep = mimo_bwd_fwd.build_launches(*as_args(x), **as_kwargs(x), policy="seed_bf16", backend="cuda",
                                       sm_count=132, tuning={"stages_k3": 2})
    assert [la.name for la in prep.launches] == list(prep.config.kernels)
    for launch in prep.launches:
        kc = prep.config.kernels[launch.name]
        assert launch.grid == kc.grid and launch.options == dict(kc.options)
        assert launch.constexprs == {k: v for k, v in kc.constexprs.items() if k in launch.kernel.arg_names}
    assert prep.config.kernels["out"].options["num_stages"] == 2


def test_npu_plan_builds_from_cpu_tensors():
    """The Ascend compile gate builds the NPU launches from CPU tensors (no device, no torch_npu)."""
    from mimo_numerics.kernels import _backend, mimo_bwd_fwd

    spec = CaseSpec(seqlen=40, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True, has_d=True)
    x = _inputs(spec)
    prep = mimo_bwd_fwd.build_launches(*as_args(x), **as_kwargs(x), policy="upstream_sm90", backend="npu")
    names = [launch.name for launch in prep.launches]
    assert names == ["angles", "prep", "state", "out", "reduce"], names
    assert prep.plan.RB == 16 and not prep.plan.QK_GEMM and prep.plan.BN == prep.plan.BP2 == 16
    for launch in prep.launches:
        assert not _backend.is_interpreted(launch.kernel) or os.environ.get("TRITON_INTERPRET") == "1"
        assert launch.grid <= 65535 and launch.options == {}


def test_policy_constexprs():
    cx = kernels.policy_constexprs("upstream_sm90")
    assert {s.upper() for s in SWITCHES} <= set(cx)
    assert cx["LPK"] == 0 and cx["DIAG_FMA"] and cx["ACCUMULATE"] and cx["SILU_TANH"]
    cx = kernels.policy_constexprs(mn.presets.get("seed_bf16"))
    assert not cx["DIAG_FMA"] and not cx["ACCUMULATE"] and not cx["SILU_TANH"]
    assert kernels.policy_constexprs("upstream_sm90_fp16")["LPK"] == 1
    assert not any(v for k, v in kernels.policy_constexprs("fp32").items() if k.lower() in SWITCHES)


@pytest.mark.parametrize("change, field", [({"math_dtype": "float64"}, "math_dtype"),
                                           ({"round_outputs": False}, "round_outputs")])
def test_unexpressible_policy_names_the_field(change, field):
    policy = mn.presets.get("fp32").replace(**change)
    with pytest.raises(kernels.UnsupportedPolicyError, match=field):
        kernels.policy_constexprs(policy)
    x = _inputs(CASES[5])
    with pytest.raises(kernels.UnsupportedPolicyError, match=field):
        kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)
    with pytest.raises(kernels.UnsupportedPolicyError, match="math_dtype"):
        kernels.policy_constexprs("fp64")


# ---------------------------------------------------------------------------------------------------- records
def test_record_stages_match_reference():
    spec = CASES[0]
    x = _inputs(spec)
    rk, rr = {}, {}
    kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90", record=rk, poison=True)
    stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90", record=rr)
    assert set(rr) <= set(rk), sorted(set(rr) - set(rk))
    for name, ref in rr.items():
        got = rk[name]
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert not torch.isnan(got).any(), name
        assert rel_rms(got, ref) <= GATE_RTOL, (name, rel_rms(got, ref))


def _bits_of(t):
    return t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t.view(torch.int32)


def test_deterministic():
    # no atomics: two launches give the same bits (the second one also poisoned first)
    spec = CASES[4]
    x = _inputs(spec)
    a = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90")
    b = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90", poison=True)
    for n in OUTPUT_NAMES:
        if getattr(a, n) is not None:
            assert torch.equal(_bits_of(getattr(a, n)), _bits_of(getattr(b, n))), n


# ---------------------------------------------------------------------------------------------------- rounding
def _probe(x, y, lpk):
    from mimo_numerics.kernels import _backend

    mod = _backend.kernel_module(interpreted=True)
    n, block = x.numel(), 1 << 16
    bits = torch.empty(n, dtype=torch.int16)
    val, de, sm = torch.empty(n), torch.empty(n), torch.empty(n)
    mod._rounding_probe_kernel[(-(-n // block),)](x.contiguous(), y.contiguous(), bits, val, de, sm, n, LPK=lpk,
                                                  BLOCK=block)
    return bits, val, de, sm


def _special_values():
    return torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 65536.0, 3.3e38, 3.4e38, float("inf"),
                         -float("inf"), 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25, 1e-40,
                         -1e-45, float.fromhex("0x1.fefp127")])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("lp", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rounding_helpers_match_torch(lp):
    lpk = 0 if lp == torch.bfloat16 else 1
    g = torch.Generator().manual_seed(7)
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(lp).float()  # every lp value
    random_bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (100000,), generator=g, dtype=torch.int64)
    random_bits = random_bits.to(torch.int32).view(torch.float32)
    low = 0xFFFF if lpk == 0 else 0x1FFF
    half = 0x8000 if lpk == 0 else 0x1000
    ties = ((torch.randint(-2 ** 31, 2 ** 31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32) & ~low)
            | half).view(torch.float32)
    sub_ties = (torch.randint(0, 2048, (2000,), generator=g) * 2 + 1).float() * 2.0 ** -25
    x = torch.cat([every, random_bits, ties, sub_ties, -sub_ties, _special_values(), torch.tensor([float("nan")])])
    bits, val, de, _ = _probe(x, torch.zeros_like(x), lpk)
    nan = torch.isnan(x)
    want = x.to(lp)
    assert torch.equal(bits[~nan], want.view(torch.int16)[~nan])
    assert torch.isnan(bits.view(lp)[nan].float()).all() and torch.isnan(val[nan]).all()
    assert torch.equal(val[~nan], want.float()[~nan]) and torch.equal(val[~nan], round_to_lp(x, lp)[~nan])
    assert torch.equal(de[~nan], want.float()[~nan])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("lp", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_sum_rounding_matches_reference(lp):
    lpk = 0 if lp == torch.bfloat16 else 1
    g = torch.Generator().manual_seed(11)
    # diagonal-like steps: acc on the grid plus an exact product of two grid values
    n = 100000
    acc = torch.randn(n, generator=g).to(lp).float()
    scale = 2.0 ** torch.randint(-12, 12, (n,), generator=g).float()
    prod = torch.randn(n, generator=g).to(lp).float() * (torch.randn(n, generator=g) * scale).to(lp).float()
    # exact ties of the FP32 sum with a nonzero residual: s = midpoint, e = ±ulp(s)/4
    if lpk == 0:
        mid = ((torch.randint(0, 2 ** 31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
                & 0x7F7F0000) | 0x8000)
        mid = torch.cat([mid, torch.tensor([0x7F7F8000], dtype=torch.int32)])  # overflow boundary
    else:
        expo = torch.randint(113, 143, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
        mant = torch.randint(0, 1 << 23, (20000,), generator=g, dtype=torch.int64).to(torch.int32) & 0x7FE000
        mid = (expo << 23) | mant | 0x1000
    mid = mid.view(torch.float32)
    if lpk == 1:
        sub = (torch.randint(0, 2048, (2000,), generator=g) * 2 + 1).float() * 2.0 ** -25
        mid = torch.cat([mid, sub, torch.tensor([65520.0])])
    sign = torch.where(torch.rand(mid.shape, generator=g) < 0.5, -1.0, 1.0)
    mid = mid * sign
    ulp = (mid.abs().view(torch.int32) + 1).view(torch.float32) - mid.abs()
    e = torch.where(torch.rand(mid.shape, generator=g) < 0.5, -1.0, 1.0) * ulp * 0.25
    a = torch.cat([acc, mid])
    b = torch.cat([prod, e])
    _, _, _, got = _probe(a, b, lpk)
    want = round_sum_to_lp(a, b, lp)
    assert torch.equal(got, want)
    # the tie block really exercises the residual: plain rounding of the FP32 sum differs there
    assert (want[n:] != (a[n:] + b[n:]).to(lp).float()).float().mean() > 0.3


# ---------------------------------------------------------------------------------------------------- errors
def _mutate(x, **changes):
    y = dict(x)
    y.update(changes)
    return y


def _bad_inputs():
    x = _inputs(CASES[0])
    return [
        ("dtype", _mutate(x, q=x["q"].float())),
        ("shape", _mutate(x, v=x["v"][:, :-1])),
        ("pairing", _mutate(x, mimo_z=None)),
        ("missing", _mutate(x, segsum=None)),
        ("divisor", _mutate(x, rotary_dim_divisor=3)),
        ("chunk", _mutate(x, chunk_size=0)),
        ("policy_dtype", _mutate(x, q=x["q"].half(), k=x["k"].half())),
    ]


@pytest.mark.parametrize("label, bad", _bad_inputs(), ids=[b[0] for b in _bad_inputs()])
def test_bad_inputs_raise_the_reference_errors(label, bad):
    with pytest.raises((TypeError, ValueError)) as ref_err:
        stage1_reference.mamba_mimo_bwd_fwd(*as_args(bad), **as_kwargs(bad), policy="upstream_sm90")
    with pytest.raises(type(ref_err.value)) as ker_err:
        kernels.mamba_mimo_bwd_fwd(*as_args(bad), **as_kwargs(bad), policy="upstream_sm90")
    assert str(ker_err.value) == str(ref_err.value)


@pytest.mark.parametrize("spec, word", [
    (CaseSpec(seqlen=8, state_dim=8, value_dim=16, rank=2, chunk_size=8), "N=8"),
    (CaseSpec(seqlen=8, state_dim=16, value_dim=24, rank=2, chunk_size=8), "P=24"),
    (CaseSpec(seqlen=8, state_dim=256, value_dim=16, rank=2, chunk_size=8), "N=256"),
    (CaseSpec(seqlen=8, state_dim=16, value_dim=16, rank=3, chunk_size=48), "chunk_size"),
], ids=["N8", "P24", "N256", "CR144"])
def test_unsupported_sizes_raise_value_error(spec, word):
    x = make_inputs(spec)
    stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90")  # valid for the reference
    with pytest.raises(ValueError, match=word):
        kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90")


def test_slow_interpreter_run_is_refused_with_an_estimate():
    spec = CaseSpec(seqlen=2048, heads=8, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True)
    x = make_inputs(spec)
    with pytest.raises(kernels.SlowInterpreterError, match=r"about \d+ s.*allow_slow_interpreter=True"):
        kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90")
    small = kernels.estimate_interpreter_seconds(
        stage1_validation.validate_inputs(*as_args(_inputs(CASES[0])), **as_kwargs(_inputs(CASES[0]))))
    assert small < kernels.INTERPRETER_LIMIT_S


def test_cpu_runs_interpreted_and_devices_compiled():
    from mimo_numerics.kernels import _backend

    interp = _backend.kernel_module(interpreted=True)
    assert _backend.is_interpreted(interp._mimo_out_kernel)
    compiled = _backend.kernel_module(interpreted=False)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        assert not _backend.is_interpreted(compiled._mimo_out_kernel)
    assert _backend.backend_of(torch.device("cpu")) == "interpreter"
    assert _backend.backend_of(torch.device("cuda", 0)) == "cuda"
    with pytest.raises(ValueError, match="meta"):
        _backend.backend_of(torch.device("meta"))


def test_import_without_triton():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("No module named 'triton' (blocked for the test)")
                return None
        sys.meta_path.insert(0, Block())
        import mimo_numerics.kernels as k
        assert not k.triton_available()
        assert k.policy_constexprs("upstream_sm90")["DIAG_FMA"]
        try:
            k.mamba_mimo_bwd_fwd(*([None] * 17))
        except ImportError as exc:
            assert "'triton' extra" in str(exc) and "npu" in str(exc), exc
            print("OK")
        """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr


# ---------------------------------------------------------------------------------------------------- sm_90 compile
def _toolchain():
    from mimo_numerics.kernels import _devtools

    return _devtools.nvidia_toolchain_available()


@pytest.mark.skipif(not _toolchain(), reason="Triton's NVIDIA backend (ptxas) is not installed")
@pytest.mark.parametrize("policy, spec, tuning", [
    ("upstream_sm90", CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
                               has_d=True), {"native_lp": 0}),
    ("upstream_sm90", CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
                               has_d=True), {}),
    ("fp32", CaseSpec(seqlen=24, state_dim=32, value_dim=16, rank=3, chunk_size=6, reduce_o=False, has_z=True), {}),
    ("upstream_sm90_fp16", CaseSpec(seqlen=24, state_dim=128, value_dim=128, rank=4, chunk_size=16, has_d=True,
                                    dtype="float16"), {}),
], ids=["sm90_N64_P64_R4_C16_emulated", "sm90_native_lp", "fp32_R3_C6", "fp16_N128_P128_native_lp"])
def test_compiles_for_sm90_without_spills(policy, spec, tuning):
    """The compiled (CUDA) path: every kernel compiles for sm_90 with the CUDA launch options (Triton's own
    ptxas/cuobjdump, no GPU needed) and none spills registers, except the output kernel, whose spill stays under
    1 KiB: it runs 4 warps capped at 128 registers, which spills a little (24 B at N = P = 64, 88 B with FP16
    N = P = 128) and was measured faster on an H200 than without the cap (0.304 against 0.367 ms for this kernel at
    shape (a) with 2 warps at 255 registers; docs/kernels.md, Performance).
    The launches go through the JIT's argument binder, so they get the specialization of a real launch (B = 1
    arrives as a constexpr: the H200 failure of an earlier snapshot)."""
    from mimo_numerics.kernels import _devtools, mimo_bwd_fwd

    x = _inputs(spec)
    prep = mimo_bwd_fwd.build_launches(*as_args(x), **as_kwargs(x), policy=policy, backend="cuda", sm_count=132,
                                       tuning=tuning)
    for row in _devtools.compile_launches(prep, arch=90):
        assert row["regs"] > 0 and row["stack"] <= (1024 if row["name"] == "out" else 0), row


# ---------------------------------------------------------------------------------------------------- golden
def test_golden_upstream_cases_on_cpu():
    """The GPU gate of test_kernels_gpu.py through the interpreter (~40 s): within 1e-3 of the real upstream H200
    outputs under upstream_sm90 on every output, 3x closer than seed_bf16 on dz, dmimo_o, dmimo_z."""
    from test_kernels_gpu import check_golden

    check_golden(torch.device("cpu"))
