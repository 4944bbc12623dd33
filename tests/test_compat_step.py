"""The compat layer's CuTe decode kernel (``mamba_ssm.ops.cute.mamba3.mamba3_step_fn``), called as ``Mamba3.step``
calls upstream's: with the rotary step, fed back token by token (``decode_cases.run_kernel_chain``), it gives the
package's policy step in the op's layouts bit for bit (under the preset and under every FP32-level model); upstream's
in-place and per-rank forms; under ``fp64`` the FP64 step; upstream's refusals as errors naming the argument."""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import compat
from mimo_numerics.ops._common.special import special_functions
from mimo_numerics.ops.mamba3_mimo import decode_cases
from mimo_numerics.ops.mamba3_mimo.step import DecodeState, mamba3_mimo_step_fp64
from mimo_numerics.policy import FP32_LEVEL_SM90
from mamba3_mimo_support import upstream_step_kernels


@pytest.fixture(scope="module")
def kernels():
    return upstream_step_kernels()


def _policy(fields, models):
    preset = decode_cases.step_policy(fields)
    return preset.replace(**FP32_LEVEL_SM90) if models else preset


@pytest.mark.parametrize("models", [False, True], ids=["preset", "fp32_level"])
@pytest.mark.parametrize("name", sorted(decode_cases.STEP_CASES))
def test_upstreams_two_kernels_fed_back_are_the_policy_step(kernels, name, models):
    fields = decode_cases.STEP_CASES[name]
    inputs = decode_cases.make_step_inputs(fields)
    policy = _policy(fields, models)
    with compat.use_policy(policy):  # the caller's gate as the policy models it (torch's sigmoid on the device)
        got = decode_cases.run_kernel_chain(*kernels, fields, inputs, step_kwargs=dict(tile_D=64, num_warps=4),
                                            gate_fn=special_functions(policy).torch_sigmoid)
    want = decode_cases.run_policy_chain(fields, inputs, policy)
    lp = getattr(torch, fields["dtype"])
    assert got["out"].dtype == lp and got["k_rot"].dtype == lp and got["angle"].dtype == torch.float32
    per_rank = (fields["steps"], fields["B"], fields["R"], fields["H"], fields["P"])
    assert got["out"].shape == ((fields["steps"], fields["B"], fields["H"], fields["P"]) if fields["has_outproj"]
                                else per_rank)
    for key in ("out", "k_rot", "angle"):
        assert torch.equal(got[key], want[key]), key
    assert sorted(got["ssm"]) == decode_cases.kept_state_steps(fields["steps"])
    assert all(torch.equal(got["ssm"][t], want["ssm"][t]) for t in got["ssm"])


def _one_token(fields, dtype=None):
    """The kernel's arguments for a case's first token (the rotary step done by the policy step's rotary part)."""
    from mimo_numerics.ops.mamba3_mimo.decode import rotary_step

    x = decode_cases.make_step_inputs(fields)
    s, H, G = x["state"], fields["H"], fields["G"]
    heads = torch.arange(H) // (H // G)
    cast = (lambda t: t) if dtype is None else (lambda t: None if t is None else t.to(dtype))
    q_rot, k_rot, _ = rotary_step(cast(x["Q"][0][:, :, heads]), cast(x["K"][0][:, :, heads]), cast(s["angle"]),
                                  cast(x["Angles"][0]), cast(x["DT"][0]), cast(x["Q_bias"].transpose(0, 1)),
                                  cast(x["K_bias"].transpose(0, 1)), rotate_pairwise=False,
                                  policy="fp64" if dtype == torch.float64 else decode_cases.step_policy(fields))
    args = dict(state=cast(s["ssm"]).clone(), Bstate=cast(s["k"]), Xstate=cast(s["v"]), A=cast(x["A"][0]), B=k_rot,
                C=q_rot, D=cast(x["D"]), x=cast(x["V"][0]), dt=cast(x["DT"][0]),
                trap=torch.sigmoid(x["Trap"][0].to(dtype or torch.float32)),
                xproj=cast(x["MIMO_V"].transpose(0, 1).contiguous()),
                outproj=cast(None if x["MIMO_Out"] is None else x["MIMO_Out"].transpose(0, 1).contiguous()),
                z=cast(None if x["Z"] is None else x["Z"][0]),
                zproj=cast(None if x["MIMO_Z"] is None else x["MIMO_Z"].transpose(0, 1).contiguous()))
    B, R, P = fields["B"], fields["R"], fields["P"]
    out_dtype = args["x"].dtype
    args["out"] = torch.empty((B, H, P) if fields["has_outproj"] else (B, R, H, P), dtype=out_dtype)
    return x, args


def test_in_place_update_equals_a_separate_state_out(kernels):
    _, step = kernels
    fields = decode_cases.STEP_CASES["step_B2_H4_G1_N128_P64_R4_K32_bf16"]
    _, args = _one_token(fields)
    separate = dict(args, state=args["state"].clone(), out=args["out"].clone())
    separate["state_out"] = torch.empty_like(args["state"])
    step(**separate)
    before = args["state"].clone()
    assert step(**args) is None  # upstream's returns nothing: it writes state (in place) and out
    assert not torch.equal(args["state"], before)
    assert torch.equal(args["state"], separate["state_out"]) and torch.equal(args["out"], separate["out"])
    assert torch.equal(separate["state"], before)


def test_without_outproj_the_output_is_per_rank_and_z_does_not_gate_it(kernels):
    """As upstream's kernel: ``z`` only acts in the ``outproj`` branch."""
    _, step = kernels
    fields = dict(decode_cases.STEP_CASES["step_B2_H4_G1_N64_P64_R4_K16_bf16_per_rank_from_zero"], has_z=True,
                  init="random")
    _, args = _one_token(fields)
    assert args["out"].dim() == 4 and args["z"] is not None
    gated = dict(args, state=args["state"].clone(), out=torch.empty_like(args["out"]))
    ungated = dict(args, state=args["state"].clone(), out=torch.empty_like(args["out"]), z=None, zproj=None)
    step(**gated)
    step(**ungated)
    assert torch.equal(gated["out"], ungated["out"])


def test_under_fp64_with_float64_buffers_it_is_the_fp64_step(kernels):
    _, step = kernels
    fields = decode_cases.STEP_CASES["step_B2_H4_G1_N128_P64_R4_K32_bf16"]
    x, args = _one_token(fields, dtype=torch.float64)
    step(**args, policy="fp64")
    s = x["state"]
    f64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in x.items() if k != "state"}
    want, state = mamba3_mimo_step_fp64(
        f64["Q"][0], f64["K"][0], f64["V"][0], f64["A"][0] * f64["DT"][0], f64["DT"][0], f64["Trap"][0],
        f64["Q_bias"], f64["K_bias"], f64["MIMO_V"], f64["MIMO_Z"], f64["MIMO_Out"], f64["Angles"][0], f64["D"],
        f64["Z"][0], DecodeState(*(s[k].double() for k in ("angle", "ssm", "k", "v"))))
    assert args["out"].dtype == torch.float64
    assert (args["out"] - want).abs().max().item() <= 1e-12 * want.abs().max().item()
    assert (args["state"] - state.ssm).abs().max().item() <= 1e-12 * state.ssm.abs().max().item()


def _misaligned(t):
    """``t``'s values at an address 4 bytes past a 16-byte boundary."""
    buffer = torch.empty(t.numel() * t.element_size() + 32, dtype=torch.uint8)
    start = (-buffer.data_ptr()) % 16 + 4
    view = buffer[start:start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    return view.copy_(t)


def _strided(t, last_stride=1, row_pad=0):
    """``t``'s values in a view whose last dimension has stride ``last_stride`` and whose rows are ``row_pad``
    elements longer than they need be."""
    shape = (*t.shape[:-1], t.shape[-1] * last_stride + row_pad)
    return torch.zeros(shape, dtype=t.dtype)[..., row_pad::last_stride].copy_(t)


@pytest.mark.parametrize("change, error, match", [
    (lambda a: a.update(A=a["A"][:, :1]), ValueError, "A must have shape"),
    (lambda a: a.update(xproj=a["xproj"][:1]), ValueError, "xproj must have shape"),
    (lambda a: a.update(out=a["out"][..., :8]), ValueError, "out must have shape"),
    (lambda a: a.update(zproj=None), ValueError, "z and zproj must be given together"),
    (lambda a: a.update(out=a["out"].float()), TypeError, "out must have x's dtype"),
    (lambda a: a.update(C=a["C"].float()), TypeError, "C must have Bstate's dtype"),
    (lambda a: a.update(state=a["state"].to(torch.int32)), TypeError, "state must be float16"),
    (lambda a: a.update(trap=[0.5]), TypeError, "trap must be a torch.Tensor"),
    # upstream's launcher (the kernel is compiled for 16-byte aligned data and rows; seen on the H200)
    (lambda a: a.update(A=_misaligned(a["A"])), ValueError, "A must start at a 16-byte aligned address"),
    (lambda a: a.update(x=_strided(a["x"], last_stride=2)), ValueError, "x must be contiguous in its last dimension"),
    (lambda a: a.update(xproj=_strided(a["xproj"], row_pad=1)), ValueError,
     r"xproj.stride\(1\) must be a multiple of 4"),
])
def test_upstreams_refusals_name_the_argument(kernels, change, error, match):
    _, step = kernels
    _, args = _one_token(decode_cases.STEP_CASES["step_B2_H4_G1_N128_P64_R4_K32_bf16"])
    change(args)
    with pytest.raises(error, match=match):
        step(**args)


def test_two_heads_with_a_batch_of_two_are_refused_as_upstream_refuses_them(kernels):
    """Upstream's float32 ``[B, H]`` arguments need ``H`` a multiple of 4 when ``B > 1`` (seen on the H200: its
    launcher refuses ``A.strides[0] = 2``); with ``B = 1`` that stride is not checked, upstream's launcher does not
    check it either (seen on the H200 too)."""
    _, step = kernels
    fields = decode_cases.STEP_CASES["step_B2_H4_G1_N128_P64_R4_K32_bf16"]
    _, args = _one_token(dict(fields, H=2))
    with pytest.raises(ValueError, match=r"A.stride\(0\) must be a multiple of 4 .*nheads must be a multiple of 4"):
        step(**args)
    _, args = _one_token(dict(fields, B=1, H=2))
    step(**args)
    assert torch.isfinite(args["out"].float()).all()


def test_the_golden_comparison_sees_the_step_store_sites(kernels):
    """``decode_cases.golden_distances`` on a case whose "upstream" run is the compat kernels' under
    ``upstream_sm90``: zero under that policy; without the step's lp stores (``round_outputs=False``) the output and
    the rotated k are about half an lp ulp away and the state drifts with the unrounded k. (The ``fp32`` preset
    rounds the stores too: in the step it differs from ``upstream_sm90`` only in FP32-level knobs.)"""

    name = "step_B2_H4_G1_N128_P64_R4_K32_bf16"
    fields = decode_cases.STEP_CASES[name]
    inputs = decode_cases.make_step_inputs(fields)
    with compat.use_policy("upstream_sm90"):
        upstream = decode_cases.run_kernel_chain(*kernels, fields, inputs)
    case = {"fields": fields, "inputs": inputs, "upstream": upstream}
    same = decode_cases.golden_distances(case, "upstream_sm90")
    assert all(value == 0.0 for value in same.values()), same
    unrounded = decode_cases.golden_distances(case, mn.presets.get("upstream_sm90").replace(round_outputs=False))
    assert 5e-4 <= unrounded["out"] <= 5e-3 and 5e-4 <= unrounded["k_rot"] <= 5e-3, unrounded
    assert unrounded["ssm"] > 1e-5 and unrounded["angle"] == 0.0, unrounded
    fp32 = decode_cases.golden_distances(case, "fp32")
    assert fp32["out"] < 1e-4 and fp32["k_rot"] < 1e-6, fp32
