"""CPU (Triton interpreter) tests of the stage-2 Triton kernels ``mimo_numerics.kernels.mamba_mimo_bwd_bwd``.

Gates (issue 23, acceptance 1): on the forward kernel's case list (``ops.mamba_mimo_fwd.cases.kernel_cases``: reduced
and full output, Z and D on and off, G = 1 < H and G = H, R in {1, 2, 3, 4, 8}, tails, bf16 and fp16), stage 2's
inputs drawn from it, the kernels under policy P match the stage-2 reference under P on every output (rel RMS <=
same_policy_rel_rms = 3e-4, measured worst 1.6e-4 in the native, avx2 and scalar configurations: group
stage2_kernels of ``scripts/measure_test_tolerances.py``; outputs and workspaces poisoned with NaN first) and are closer to it than to the
reference under another preset with stage-2 semantics; every stage-2 site and knob is honoured; bad inputs and
policies raise the reference's errors; the launches compile for sm_90.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics import operator as _operator
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import rel_rms, ulp_distance
from mimo_numerics.ops.mamba_mimo_bwd_bwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd as stage2_reference
from mimo_numerics.ops.mamba_mimo_bwd_bwd.sites import SITES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_fwd.cases import kernel_cases, kernel_policies
from mimo_numerics.policy import PolicyUndefined

pytestmark = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")

GATE_RTOL = tolerances.get("same_policy_rel_rms")
CASES = kernel_cases()
GATE_PARAMS = [pytest.param(spec, name, pol, id=f"{spec.case_id}-{name}")
               for spec in CASES for name, pol in kernel_policies(spec)]
_inputs_cache, _kernel_cache, _ref_cache = {}, {}, {}


def _inputs(spec):
    if spec not in _inputs_cache:
        _inputs_cache[spec] = make_inputs(spec)
    return _inputs_cache[spec]


#: the tensors in API order and the scalar arguments of an inputs dict (the operator's own calling convention)
_args = _operator.get("mamba_mimo_bwd_bwd").args
_kw = _operator.get("mamba_mimo_bwd_bwd").kwargs


def _kernel(spec, name, policy):
    if (spec, name) not in _kernel_cache:
        x = _inputs(spec)
        _kernel_cache[spec, name] = kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy=policy, poison=True)
    return _kernel_cache[spec, name]


def _reference(spec, name, policy):
    if (spec, name) not in _ref_cache:
        x = _inputs(spec)
        _ref_cache[spec, name] = stage2_reference(*_args(x), **_kw(x), policy=policy)
    return _ref_cache[spec, name]


def _distances(a, b) -> dict:
    return {n: rel_rms(getattr(a, n).float(), getattr(b, n).float()) for n in OUTPUT_NAMES
            if getattr(b, n) is not None}


def _check_same_policy(got, want, what):
    for n in OUTPUT_NAMES:
        a, b = getattr(got, n), getattr(want, n)
        assert (a is None) == (b is None), (what, n)
        if b is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, (what, n, a.dtype, b.dtype, a.shape, b.shape)
        assert not torch.isnan(a.float()).any(), f"{what} {n}: NaN left by the poisoned launch"
        err = rel_rms(a.float(), b.float())
        assert err <= GATE_RTOL, f"{what} {n}: kernel vs reference rel RMS {err:.3e} > {GATE_RTOL}"


@pytest.mark.parametrize("spec, name, policy", GATE_PARAMS)
def test_stage2_kernels_match_reference(spec, name, policy):
    _check_same_policy(_kernel(spec, name, policy), _reference(spec, name, policy), f"{spec.case_id} {name}")


@pytest.mark.parametrize("spec, name, policy", GATE_PARAMS)
def test_stage2_kernels_closest_to_their_own_policy(spec, name, policy):
    got = _kernel(spec, name, policy)
    own_ref = _reference(spec, name, policy)
    own = sum(_distances(got, own_ref).values())
    compared = 0
    for other, other_policy in kernel_policies(spec):
        gap = sum(_distances(_reference(spec, other, other_policy), own_ref).values())
        if other == name or gap <= 1e-5 + 2 * own:
            continue
        compared += 1
        far = sum(_distances(got, _reference(spec, other, other_policy)).values())
        assert own < far, f"kernels under {name} closer to the reference under {other}: {far:.3e} <= {own:.3e}"
    assert compared >= 1


_SWITCH_CASE = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True)
_FULL_CASE = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=8, reduce_o=False, has_z=True,
                      has_d=True)
_VARIANTS = ([pytest.param(_SWITCH_CASE, {s: False}, id=f"{s}_off") for s in SITES]
             + [pytest.param(_FULL_CASE, {"dphio_gate": False}, id="dphio_gate_off_full_dout"),
                pytest.param(_SWITCH_CASE, {"diag_mode": "mul_then_add"}, id="diag_mul_then_add"),
                pytest.param(_SWITCH_CASE, {"state_update": "separate"}, id="state_separate"),
                pytest.param(_SWITCH_CASE, {"silu_form": "sigmoid"}, id="silu_sigmoid")])


@pytest.mark.parametrize("spec, change", _VARIANTS)
def test_every_stage2_switch_and_knob_is_honoured(spec, change):
    base = mn.presets.get("upstream_sm90")
    sites = {k: v for k, v in change.items() if k in SITES}
    knobs = {k: v for k, v in change.items() if k not in SITES}
    variant = base.replace(**knobs) if knobs else base
    variant = variant.with_sites("mamba_mimo_bwd_bwd", **sites) if sites else variant
    x = _inputs(spec)
    got = kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy=variant, poison=True)
    ref_v = stage2_reference(*_args(x), **_kw(x), policy=variant)
    ref_b = stage2_reference(*_args(x), **_kw(x), policy=base)
    _check_same_policy(got, ref_v, str(change))
    if sum(_distances(ref_v, ref_b).values()) > 1e-5:
        assert sum(_distances(got, ref_v).values()) < sum(_distances(got, ref_b).values()), change


def test_stage2_constexprs():
    cx = kernels.stage2_constexprs("upstream_sm90")
    assert all(cx[s.upper()] for s in SITES) and cx["DIAG_FMA"] and cx["ACCUMULATE"] and cx["LPK"] == 0
    assert not any(kernels.stage2_constexprs("fp32")[s.upper()] for s in SITES)
    assert kernels.stage2_constexprs("upstream_sm90_fp16")["LPK"] == 1
    with pytest.raises(PolicyUndefined, match="mamba_mimo_bwd_bwd"):
        kernels.stage2_constexprs("seed_bf16")
    for policy, field in (("fp64", "math_dtype"), (mn.presets.get("fp32").replace(round_outputs=False),
                                                   "round_outputs")):
        with pytest.raises(kernels.UnsupportedPolicyError, match=field):
            kernels.stage2_constexprs(policy)


def _bad_inputs():
    x = _inputs(CASES[0])
    return [("dtype", dict(x, q=x["q"].float())), ("shape", dict(x, v=x["v"][:, :-1])),
            ("pairing", dict(x, mimo_z=None)), ("states", dict(x, states=x["states"].float())),
            ("divisor", dict(x, rotary_dim_divisor=3))]


@pytest.mark.parametrize("label, bad", _bad_inputs(), ids=[b[0] for b in _bad_inputs()])
def test_bad_inputs_raise_the_reference_errors(label, bad):
    with pytest.raises((TypeError, ValueError)) as ref_err:
        stage2_reference(*_args(bad), **_kw(bad), policy="upstream_sm90")
    with pytest.raises(type(ref_err.value)) as ker_err:
        kernels.mamba_mimo_bwd_bwd(*_args(bad), **_kw(bad), policy="upstream_sm90")
    assert str(ker_err.value) == str(ref_err.value)


def test_unsupported_sizes_raise_value_error():
    x = make_inputs(CaseSpec(seqlen=8, state_dim=8, value_dim=16, rank=2, chunk_size=8))
    with pytest.raises(ValueError, match="N=8"):
        kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy="upstream_sm90")


def test_deterministic():
    x = _inputs(CASES[4])
    a = kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy="upstream_sm90")
    b = kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy="upstream_sm90", poison=True)
    for n in OUTPUT_NAMES:
        if getattr(a, n) is not None:
            assert torch.equal(getattr(a, n), getattr(b, n)), n


@pytest.mark.parametrize("tiles", [(8, 16), (8, 4), (16, 16), (16, 16, 4, None, None, 8, None, 8)],
                         ids=["ascend_8x16", "ascend_cp128_8x4", "16x16", "16x16_kside8_qside8"])
@pytest.mark.parametrize("spec", CASES, ids=[c.case_id for c in CASES])
def test_stage2_tile_plans_agree(spec, tiles):
    """Blocks of rows and tokens (Ascend's plans, several programs per chunk; the k-side and q-side kernels on blocks
    of their own)
    give the whole-chunk plan's outputs up to
    FP32 summation order: FP32 outputs within ``stage2_tile_plan_sum_order_rel_rms`` (the per-block partial sums
    dmimo_v and dD follow the plan, and the interpreter's dots of other shapes may take other BLAS kernels), lp
    outputs (dq, dk, dv) up to a few roundings flipped by one ulp (``stage2_tile_plan_lp_*``)."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = _inputs(spec)
    name, policy = kernel_policies(spec)[0]
    whole = _kernel(spec, name, policy)
    plan = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy=policy, poison=True,
                                       tiles=mimo_bwd_bwd.Stage2Tiles(*tiles))
    kside_rows = tiles[5] if len(tiles) > 5 else tiles[0]
    qside_rows = tiles[7] if len(tiles) > 7 else tiles[0]
    default = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy=policy)
    grids = {la.name: la.grid for la in default.launches}
    LP, CP = (next(la.constexprs[k] for la in default.launches if la.name == "token") for k in ("LP", "CP"))
    for la in plan.launches:  # the blocks in use: whole chunks by default in the interpreter
        blocks = {"rows": LP // tiles[0], "kside": LP // kside_rows, "qside": LP // qside_rows, "token": CP // tiles[1]}
        assert la.grid == grids[la.name] * blocks.get(la.name, 1), la.name
    blocked = plan.run()
    for n in OUTPUT_NAMES:
        a, b = getattr(blocked, n), getattr(whole, n)
        if b is None:
            continue
        assert not torch.isnan(a.float()).any(), n
        if b.dtype in (torch.bfloat16, torch.float16):
            differing = int((a != b).sum())
            assert differing <= tolerances.get("stage2_tile_plan_lp_differing_max"), (n, differing)
            if differing:
                ulps = float(ulp_distance(a, b, b.dtype).max())
                assert ulps <= tolerances.get("stage2_tile_plan_lp_ulps_max"), (n, ulps)
        else:
            assert rel_rms(a, b) <= tolerances.get("stage2_tile_plan_sum_order_rel_rms"), n


def _batch_of_three():
    from mimo_numerics.ops.mamba3_mimo import chain
    from mimo_numerics.ops.mamba3_mimo.cases import make_op_inputs, small_case

    x = make_op_inputs(small_case(seqlen=32, chunk_size=16, heads=2, groups=1, batch=3, seed=3))
    pre = chain.preprocess(x, torch.float32)
    return chain.stage2_args(x, pre, chain.run_stage1(x, pre, "upstream_sm90")), chain.stage2_kwargs(x)


@pytest.mark.parametrize("rows", [1, 2])
def test_stage2_batch_slices_change_no_bit(monkeypatch, rows):
    """The launcher's batch slices (devices: ``batch_slice_rows``; forced here in the interpreter), 1 and 2 rows of a
    3-row batch (the last slice shorter): every output the whole batch's bits, every element written."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    args, kw = _batch_of_three()
    whole = kernels.mamba_mimo_bwd_bwd(*args, **kw, poison=True)
    monkeypatch.setattr(mimo_bwd_bwd, "batch_slice_rows", lambda *a, **k: rows)
    prep = mimo_bwd_bwd.build_launches(*args, **kw, poison=True)
    assert sum(la.name.startswith("token[") for la in prep.launches) == -(-3 // rows)
    sliced = prep.run()
    for n in OUTPUT_NAMES:
        if getattr(whole, n) is not None:
            assert torch.equal(getattr(sliced, n), getattr(whole, n)), n


def test_stage2_batch_slices_fit_the_workspace_budget():
    from mimo_numerics.kernels import mimo_bwd_bwd

    args, kw = _batch_of_three()
    prep = mimo_bwd_bwd.build_launches(*args, **kw)
    dims = prep.dims
    formats = mimo_bwd_bwd.workspace_formats(mimo_bwd_bwd.stage2_constexprs("upstream_sm90"), dims)
    per_row = mimo_bwd_bwd.workspace_bytes_per_batch_row(dims, 64, 16, formats)
    assert mimo_bwd_bwd.batch_slice_rows(dims, 64, 16, formats, "interpreter") == 3  # the interpreter: whole
    assert mimo_bwd_bwd.batch_slice_rows(dims, 64, 16, formats, "cuda") == 3  # small rows: one slice
    assert per_row * 3 < mimo_bwd_bwd.WORKSPACE_BUDGET_BYTES
    fp32 = mimo_bwd_bwd.workspace_formats(mimo_bwd_bwd.stage2_constexprs("fp32"), dims)
    assert not any(fp32.values()) and all(formats.values())  # every site off: FP32 workspaces; all on: lp
    assert mimo_bwd_bwd.workspace_bytes_per_batch_row(dims, 64, 16, fp32) > per_row


def test_stage2_lp_workspaces_change_no_bit(monkeypatch):
    """Workspaces stored as lp bits where the policy's roundings put every value on the grid (the default) against
    every workspace in FP32: the same bits."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    args, kw = _batch_of_three()
    lp = kernels.mamba_mimo_bwd_bwd(*args, **kw, poison=True)
    original = mimo_bwd_bwd.workspace_formats
    monkeypatch.setattr(mimo_bwd_bwd, "workspace_formats",
                        lambda cx, dims, backend="cuda": {k: False for k in original(cx, dims, backend)})
    f32 = kernels.mamba_mimo_bwd_bwd(*args, **kw, poison=True)
    for n in OUTPUT_NAMES:
        if getattr(lp, n) is not None:
            assert torch.equal(getattr(lp, n), getattr(f32, n)), n


def test_stage2_tile_plan_is_checked():
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = _inputs(CASES[0])
    with pytest.raises(ValueError, match="tiles"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32", tiles=mimo_bwd_bwd.Stage2Tiles(24, 16))
    with pytest.raises(ValueError, match="walk_warps"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32",
                                    tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, walk_warps=0))
    with pytest.raises(ValueError, match="walk_stages"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32",
                                    tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, walk_stages=True))
    with pytest.raises(ValueError, match="kside_rows 24"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32",
                                    tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, kside_rows=24))
    with pytest.raises(ValueError, match="kside_warps"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32",
                                    tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, kside_warps=0))
    # cvt.rn rounding is a CUDA code form: refused where the kernels run interpreted or on Ascend
    for backend in (None, "npu"):
        with pytest.raises(ValueError, match="native_lp is a CUDA code form"):
            mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32", backend=backend,
                                        tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, native_lp=True))
    with pytest.raises(ValueError, match="native_lp must be a bool"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="fp32", backend="cuda", sm_count=132,
                                    tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, native_lp=1))


def test_stage2_plan_text_is_parsed_or_refused():
    from mimo_numerics.kernels import mimo_bwd_bwd

    assert mimo_bwd_bwd.parse_stage2_plan("32x4", 16) == mimo_bwd_bwd.Stage2Tiles(32, 16, 4)
    assert mimo_bwd_bwd.parse_stage2_plan(" 64x4w1s6", 8) == mimo_bwd_bwd.Stage2Tiles(64, 8, 4, 1, 6)
    assert mimo_bwd_bwd.parse_stage2_plan("16x8s3", 16) == mimo_bwd_bwd.Stage2Tiles(16, 16, 8, None, 3)
    assert mimo_bwd_bwd.parse_stage2_plan("32x4k16", 16) == mimo_bwd_bwd.Stage2Tiles(32, 16, 4, kside_rows=16)
    assert mimo_bwd_bwd.parse_stage2_plan("32x4k64x8w1s6", 16) == mimo_bwd_bwd.Stage2Tiles(32, 16, 4, 1, 6, 64, 8)
    assert mimo_bwd_bwd.parse_stage2_plan("32x4k64q64", 16) == mimo_bwd_bwd.Stage2Tiles(32, 16, 4, kside_rows=64,
                                                                                         qside_rows=64)
    assert mimo_bwd_bwd.parse_stage2_plan("32x4q16", 16) == mimo_bwd_bwd.Stage2Tiles(32, 16, 4, qside_rows=16)
    assert mimo_bwd_bwd.parse_stage2_plan("32x4k64q64n", 16) == mimo_bwd_bwd.Stage2Tiles(
        32, 16, 4, kside_rows=64, qside_rows=64, native_lp=True)
    assert not mimo_bwd_bwd.parse_stage2_plan("32x4k64q64", 16).native_lp
    for bad in ("64-4", "64x", "x4", "64x4w", "64x4s6w1", "32x4k", "32x4kx8", "32x4w1k16", "32x4q", "32x4q16k64",
                "32x4nk64", "32x4nn"):
        with pytest.raises(ValueError, match="ROWSxWARPS"):
            mimo_bwd_bwd.parse_stage2_plan(bad, 16)


def test_stage2_default_cuda_plan_and_the_qside_rows():
    """The CUDA default: 32 rows a program of the rows kernel, 64 of the k-side and q-side kernels (at LP = 64: one
    program a chunk; 32 where N or P is 128), whole chunks of tokens; a plan's ``qside_rows`` sets the q-side grid and BR alone, and a
    ``qside_rows`` that does not divide LP is refused by name."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    assert mimo_bwd_bwd.stage2_tiles(None, "cuda", 64, 16) == mimo_bwd_bwd.Stage2Tiles(
        32, 16, mimo_bwd_bwd.CUDA_NUM_WARPS, kside_rows=64, qside_rows=64, native_lp=True)
    assert mimo_bwd_bwd.stage2_tiles(None, "cuda", 16, 16) == mimo_bwd_bwd.Stage2Tiles(16, 16, 4, kside_rows=16,
                                                                                       qside_rows=16, native_lp=True)
    wide = types.SimpleNamespace(state_dim=128, value_dim=64)  # N = 128: the chunk kernels keep 32 rows
    assert mimo_bwd_bwd.stage2_tiles(wide, "cuda", 64, 16) == mimo_bwd_bwd.Stage2Tiles(32, 16, 4, native_lp=True)
    narrow = types.SimpleNamespace(state_dim=32, value_dim=64)  # N < 64: the form the GPU last checked there
    assert mimo_bwd_bwd.stage2_tiles(narrow, "cuda", 64, 32) == mimo_bwd_bwd.Stage2Tiles(32, 32, 4)
    for backend in ("interpreter", "npu"):  # cvt.rn is CUDA's: the other backends keep the integer helpers
        assert not mimo_bwd_bwd.stage2_tiles(None, backend, 64, 16).native_lp
    x = _inputs(CASES[0])
    base = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", backend="cuda", sm_count=132,
                                       tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4))
    LP = next(la.constexprs["LP"] for la in base.launches if la.name == "qside")
    plan = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", backend="cuda", sm_count=132,
                                       tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, qside_rows=LP))
    grids = {la.name: (la.grid, la.constexprs.get("BR")) for la in base.launches}
    for la in plan.launches:
        if la.name == "qside":
            assert (la.grid, la.constexprs["BR"]) == (grids["qside"][0] // (LP // 16), LP)
        else:
            assert (la.grid, la.constexprs.get("BR")) == grids[la.name], la.name
    with pytest.raises(ValueError, match="qside_rows 3 must be a power of 2 dividing LP"):
        mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", backend="cuda", sm_count=132,
                                    tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, qside_rows=3))


def test_stage2_walk_has_its_own_warps_and_stages_on_cuda():
    """A CUDA plan (planned from CPU tensors) gives the walk ``walk_warps`` and ``walk_stages`` and every other
    stage-2 launch ``num_warps``; the default plan leaves the walk at ``num_warps`` and Triton's stages."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = _inputs(CASES[0])
    tiles = mimo_bwd_bwd.Stage2Tiles(16, 16, 4, walk_warps=1, walk_stages=6)
    for plan, walk in ((tiles, {"num_warps": 1, "num_stages": 6}), (None, {"num_warps": mimo_bwd_bwd.CUDA_NUM_WARPS})):
        prep = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", backend="cuda", sm_count=132,
                                           tiles=plan)
        for launch in prep.launches:
            options = {k: v for k, v in launch.options.items() if k != "enable_fp_fusion"}
            if launch.name.startswith("dstates"):
                assert options == walk, launch.options
            elif "num_warps" in options:
                assert options == {"num_warps": 4 if plan else mimo_bwd_bwd.CUDA_NUM_WARPS}, (launch.name, options)


def test_stage2_kside_has_its_own_rows_and_warps_on_cuda():
    """A CUDA plan with ``kside_rows`` and ``kside_warps`` gives the k-side launch its own grid, BR and warps and
    leaves the rows and q-side kernels at ``rows`` and ``num_warps``."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = _inputs(CASES[0])
    kw = dict(policy="upstream_sm90", backend="cuda", sm_count=132)
    base = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), **kw, tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4))
    own = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), **kw,
                                      tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, 4, kside_rows=8, kside_warps=8))
    for a, b in zip(base.launches, own.launches):
        if a.name == "kside":
            assert (b.grid, b.constexprs["BR"], b.options["num_warps"]) == (2 * a.grid, 8, 8)
        else:
            assert (b.grid, b.constexprs.get("BR"), b.options.get("num_warps")) == (
                a.grid, a.constexprs.get("BR"), a.options.get("num_warps")), a.name


def _toolchain():
    from mimo_numerics.kernels import _devtools

    return _devtools.nvidia_toolchain_available()


@pytest.mark.skipif(not _toolchain(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_compiles_for_sm90():
    """Every stage-2 launch compiles for sm_90 (no GPU needed) at N = P = 64, R = 4, C = 16."""
    from mimo_numerics.kernels import _devtools, mimo_bwd_bwd

    x = make_inputs(CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
                             has_d=True))
    prep = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90", backend="cuda", sm_count=132)
    assert prep.launches[3].constexprs["DOT_KQ_LP"] and prep.launches[2].constexprs["DOT_WALK_LP"]
    for launch in prep.launches:
        assert _devtools.resource_usage(_devtools.compile_launch(launch, arch=90))["regs"] > 0, launch.name


@pytest.mark.skipif(not _toolchain(), reason="Triton's NVIDIA backend (ptxas) is not installed")
def test_native_lp_plan_rounds_with_cvt_rn_and_shrinks_the_rows_kernel():
    """``Stage2Tiles.native_lp`` (the CUDA default) on CUDA: every stage-2 kernel that rounds takes ``LPK`` + 2,
    and the rows kernel compiled for sm_90 rounds with ``cvt.rn.bf16.f32`` and has fewer SASS instructions than with
    the integer RNE helpers (the static count behind ``docs/kernels.md``'s figure; its bits on a GPU:
    ``test_bwd_bwd_kernels_gpu.py``)."""
    import dataclasses

    from mimo_numerics.kernels import _devtools, mimo_bwd_bwd

    x = make_inputs(CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
                             has_d=True))
    kw = dict(policy="upstream_sm90", backend="cuda", sm_count=132)
    native = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), **kw)  # the default plan
    tiles = dataclasses.replace(mimo_bwd_bwd.stage2_tiles(None, "cuda", 64, 16), native_lp=False)
    base = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), **kw, tiles=tiles)
    for a, b in zip(base.launches, native.launches):
        assert a.name == b.name and a.grid == b.grid
        if "LPK" in a.constexprs:
            assert (a.constexprs["LPK"], b.constexprs["LPK"]) == (0, 2), a.name
    rows = {p: _devtools.compile_launch(next(la for la in prep.launches if la.name == "rows"), arch=90)
            for p, prep in (("int", base), ("native", native))}
    assert "cvt.rn.bf16.f32" in rows["native"].asm["ptx"] and "cvt.rn.bf16.f32" not in rows["int"].asm["ptx"]
    sass = {p: _devtools.resource_usage(k)["sass"] for p, k in rows.items()}
    assert sass["native"] < sass["int"], sass


def test_stage2_launch_benchmark_smoke_run_compares_bits_and_refuses_bad_caps(tmp_path, monkeypatch):
    """``benchmarks/bench_stage2_launches.py --smoke``: a CPU dry run writes its table (the bits of each plan against
    the first), and a malformed register cap is refused before anything runs."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_stage2_launches.py"
    monkeypatch.syspath_prepend(str(path.parent))  # as when run as a script: benchmarks/ on sys.path
    spec = importlib.util.spec_from_file_location("bench_stage2_launches", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--smoke", "--runs", "32x4,32x4k16", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "stage2_launches_s.md").read_text()
    assert "**Smoke run" in table and "| `32x4k16` |" in table and "reference run" in table
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--runs", "32x4/kside=big", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown kernels"):
        bench.run_plan(bench.stage2_inputs(bench.kernel_shape("s"), torch.device("cpu")), "32x4", {"nope": 64},
                       torch.device("cpu"))


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("spec", CASES, ids=[c.case_id for c in CASES])
def test_stage2_kside_parts_change_no_bit(spec, parts):
    """The k-side kernel as two or three launches (``Stage2Tiles.kside_parts``: the dΨV side, then the dk side, or
    dSSdA's terms and dk apart) gives every output bit for bit as the one launch: each output is computed by the
    same operations in the same order."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = _inputs(spec)
    name, policy = kernel_policies(spec)[0]
    whole = _kernel(spec, name, policy)
    LP, CP = max(16, mimo_bwd_bwd._pow2(spec.chunk_size * spec.rank)), max(16, mimo_bwd_bwd._pow2(spec.chunk_size))
    split = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy=policy, poison=True,
                                        tiles=mimo_bwd_bwd.Stage2Tiles(LP, CP, kside_parts=parts))
    kside = [(la.name, la.constexprs["SIDES"]) for la in split.launches if la.name.startswith("kside")]
    assert kside == list(mimo_bwd_bwd.KSIDE_LAUNCHES[parts]), kside
    masks = [sides for _, sides in kside]
    assert sum(masks) == 7 and all(a & b == 0 for a in masks for b in masks if a is not b)  # each output once
    out = split.run()
    for n in OUTPUT_NAMES:
        if getattr(whole, n) is not None:
            assert torch.equal(getattr(out, n), getattr(whole, n)), n


def test_stage2_kside_parts_refuse_other_counts():
    x = _inputs(CASES[0])
    from mimo_numerics.kernels import mimo_bwd_bwd

    for bad in (0, 4, True, 2.0):
        with pytest.raises(ValueError, match="kside_parts must be 1, 2 or 3"):
            mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy="upstream_sm90",
                                        tiles=mimo_bwd_bwd.Stage2Tiles(16, 16, kside_parts=bad))
    assert mimo_bwd_bwd.parse_stage2_plan("32x4k64p2q64n", 16) == mimo_bwd_bwd.Stage2Tiles(
        32, 16, 4, kside_rows=64, qside_rows=64, native_lp=True, kside_parts=2)
