"""The policy reference of the forward kernel ``mamba_mimo_fwd``: the real H200 output (golden gate), FP64
identities, one-switch sensitivity, knobs, branches, records, tails and bad inputs.

The FP64 oracle of the forward is written elsewhere (``ops/mamba_mimo_fwd/oracle.py``, another helper); until it is
merged, the fp64 preset is checked here against identities that need no oracle: the output does not depend on the
chunk size (C = 1 goes through the state only, C = S through the intra-chunk term only), a one-token closed form,
and the group expansion of GQA.
"""

import pytest
import torch

from mamba_mimo_fwd_support import (case_args, case_policy, golden_args, golden_table, load_golden, run_forward,
                                    site_is_live, fwd_policy)
from mimo_numerics import tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import chunk_cumsums, make_inputs
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd
from mimo_numerics.ops.mamba_mimo_fwd.sites import SITES
from mimo_numerics.ops.mamba_mimo_fwd.spec import INPUT_NAMES, STAGE_NAMES, stage_shape, stages_for
from mimo_numerics.ops.mamba_mimo_fwd.validation import validate_inputs
from mimo_numerics.policy import PolicyUndefined

GOLDEN = load_golden()
GOLDEN_NAMES = sorted(GOLDEN)
SM90 = fwd_policy("upstream_sm90")
FP64 = fwd_policy("fp64")


# ---------------------------------------------------------------------------------------------------- golden gate
@pytest.fixture(scope="module")
def table():
    return {row["case"]: row for row in golden_table(GOLDEN)}


def test_fwd_golden_cases_are_the_shared_seven_and_the_extra_five(table):
    # the extra H200 cases: R = 1 (C = 64), R = 8, fp16, a tail (S % C != 0), G = H with N = 32
    assert len(GOLDEN_NAMES) == 12 and set(table) == set(GOLDEN_NAMES)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_fwd_golden_upstream_sm90_matches_the_h200_output(table, name, record_property):
    row = table[name]
    record_property("fwd_golden_row", row)
    assert row["upstream_sm90"] <= tolerances.get("fwd_golden_upstream_sm90_rel_rms")
    fp16 = GOLDEN[name]["inputs"]["Q"].dtype == torch.float16
    assert row["bit_equal"] >= tolerances.get("fwd_golden_bit_equal_min" + ("_fp16" if fp16 else ""))
    assert row["fp32"] >= tolerances.get("fwd_golden_fp32_over_sm90_ratio_min") * row["upstream_sm90"]


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_fwd_golden_output_has_upstream_shape_and_dtype(name):
    out = run_forward(golden_args(GOLDEN[name]), case_policy("upstream_sm90", GOLDEN[name]))
    want = GOLDEN[name]["fwd"]["o"]
    assert out.o.shape == want.shape and out.o.dtype == want.dtype == GOLDEN[name]["inputs"]["Q"].dtype
    assert out["o"] is out.o is out[0]


# ---------------------------------------------------------------------------------------------------- sensitivity
@pytest.fixture(scope="module")
def sm90_golden():
    return {name: run_forward(golden_args(GOLDEN[name]), case_policy("upstream_sm90", GOLDEN[name])).o
            for name in GOLDEN_NAMES}


@pytest.mark.parametrize("site", list(SITES))
def test_fwd_golden_each_site_off_changes_exactly_its_live_cases(sm90_golden, site, record_property):
    """A site changes the output on every case where its branch runs, and nowhere else; off is further away."""
    changed, ratios = [], []
    for name in GOLDEN_NAMES:
        case = GOLDEN[name]
        off = run_forward(golden_args(case), case_policy("upstream_sm90", case, sites={site: False})).o
        if not torch.equal(off, sm90_golden[name]):
            changed.append(name)
            want = case["fwd"]["o"]
            ratios.append(rel_rms(off, want) / rel_rms(sm90_golden[name], want))
    record_property("changed_cases", changed)
    assert changed == [n for n in GOLDEN_NAMES if site_is_live(site, GOLDEN[n]["kw"], GOLDEN[n]["inputs"])]
    assert min(ratios) >= tolerances.get("fwd_golden_site_off_ratio_min")


def test_fwd_golden_unfused_diagonal_is_further_from_upstream(sm90_golden):
    """diag_mode="mul_then_add" (sm_80's two roundings per rank step) against the fused sm_90 model."""
    unfused = fwd_policy("upstream_sm90", diag_mode="mul_then_add")
    # bf16 cases with a rank sum: fp16 pairs are fused on every architecture, and with R = 1 nothing is summed
    for name in [n for n in GOLDEN_NAMES if GOLDEN[n]["inputs"]["Q"].dtype == torch.bfloat16
                 and GOLDEN[n]["inputs"]["Q"].shape[2] > 1]:
        want = GOLDEN[name]["fwd"]["o"]
        ratio = rel_rms(run_forward(golden_args(GOLDEN[name]), unfused).o, want) / rel_rms(sm90_golden[name], want)
        assert ratio >= tolerances.get("fwd_golden_site_off_ratio_min"), name


# ---------------------------------------------------------------------------------------------------- fp64 identities
def _exact_decay_inputs(spec: CaseSpec, chunk_size: int) -> dict:
    """``spec``'s inputs with a log decay dA on a 2^-6 grid, so that its chunk sums are exact in float32 for any C."""
    inputs = make_inputs(spec.replace(chunk_size=chunk_size))
    gen = torch.Generator().manual_seed(spec.seed + 1)
    da = -torch.randint(0, 9, (spec.batch, spec.heads, spec.seqlen), generator=gen).float() * 2.0 ** -6
    inputs["da_cs"], inputs["da_cs_rev"], inputs["segsum"] = chunk_cumsums(da, chunk_size)
    return case_args(inputs)


IDENTITY_SPECS = [
    CaseSpec(batch=2, seqlen=13, heads=2, groups=1, state_dim=16, value_dim=8, rank=3, has_z=True, has_d=True,
             formula="realistic", seed=3),
    CaseSpec(seqlen=12, heads=2, groups=2, state_dim=16, value_dim=8, rank=2, reduce_o=False, has_z=True,
             formula="realistic", seed=4, rotary_dim_divisor=2),
    CaseSpec(seqlen=9, state_dim=8, value_dim=8, rank=1, reduce_o=False, has_d=True, dtype="float16", seed=5),
]


@pytest.mark.parametrize("spec", IDENTITY_SPECS, ids=lambda s: s.case_id)
@pytest.mark.parametrize("chunk_size", [1, 4, 5])
def test_fwd_fp64_output_does_not_depend_on_the_chunk_size(spec, chunk_size):
    """C = 1 (every token its own chunk: state path only) and tails agree with one chunk over S (intra only)."""
    policy = fwd_policy("fp64", lp_dtype=spec.dtype)
    whole = run_forward(_exact_decay_inputs(spec, spec.seqlen), policy).o
    chunked = run_forward(_exact_decay_inputs(spec, chunk_size), policy).o
    assert whole.dtype == chunked.dtype == torch.float64
    assert rel_rms(chunked, whole) <= tolerances.get("fwd_fp64_identity_rel_rms")


def _silu(x):
    return x * torch.sigmoid(x)


@pytest.mark.parametrize("reduce_o", [True, False])
def test_fwd_fp64_one_token_closed_form(reduce_o):
    """S = 1: no state and no intra term; o_r = γ·Σ_r' (q̃_r·k̃_r')·ψv_r' + D·ψv_r, then the gate and Φ."""
    spec = CaseSpec(seqlen=1, heads=2, groups=1, state_dim=8, value_dim=4, rank=3, chunk_size=4, reduce_o=reduce_o,
                    has_z=True, has_d=True, formula="realistic", seed=8)
    args = case_args(make_inputs(spec))
    got = run_forward(args, FP64).o
    f64 = {name: (None if args[name] is None else args[name].double()) for name in INPUT_NAMES}
    q = f64["q"][0, 0, :, 0] + f64["q_bias"]  # [H, R, N]
    k = f64["k"][0, 0, :, 0] + f64["k_bias"]
    psiv = f64["v"][0, 0][:, None, :] * f64["mimo_v"]  # [H, R, P]
    gamma = f64["dt"][0, :, 0] * torch.sigmoid(f64["trap"][0, :, 0])  # [H]
    o = gamma[:, None, None] * torch.einsum("hrn,hsn,hsp->hrp", q, k, psiv) + f64["d"][:, None, None] * psiv
    gated = o * _silu(f64["z"][0, 0][:, None, :] * f64["mimo_z"])
    want = (gated * f64["mimo_o"]).sum(1)[None, None] if reduce_o else gated.transpose(0, 1)[None, None]
    assert got.shape == want.shape
    assert rel_rms(got, want) <= tolerances.get("fwd_fp64_identity_rel_rms")


def test_fwd_fp64_gqa_equals_the_expanded_groups():
    spec = CaseSpec(seqlen=10, heads=4, groups=2, state_dim=8, value_dim=8, rank=2, chunk_size=4, has_z=True,
                    has_d=True, formula="realistic", seed=6)
    args = case_args(make_inputs(spec))
    expanded = dict(args, q=args["q"].repeat_interleave(2, dim=3), k=args["k"].repeat_interleave(2, dim=3))
    assert rel_rms(run_forward(args, FP64).o, run_forward(expanded, FP64).o) <= tolerances.get(
        "fwd_fp64_identity_rel_rms")


# ---------------------------------------------------------------------------------------------------- knobs, branches
ALL_BRANCHES = CaseSpec(batch=2, seqlen=21, heads=2, groups=1, state_dim=32, value_dim=16, rank=3, chunk_size=8,
                        reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=4)


@pytest.fixture(scope="module")
def branch_args():
    return case_args(make_inputs(ALL_BRANCHES))


@pytest.mark.parametrize("knob, value", [("diag_mode", "mul_then_add"), ("silu_form", "sigmoid"),
                                         ("state_update", "separate"), ("math_dtype", "float64")])
def test_fwd_every_knob_changes_the_result(branch_args, knob, value):
    # state_update is an FP32 summation order: visible in the FP32 state; the two SiLU forms differ at FP32 level,
    # which the gate's lp rounding hides on this case: seen with the gate site off; math_dtype in the unrounded o
    stage = {"state_update": "state", "silu_form": "gate", "math_dtype": "out"}.get(knob, "o")
    sites = {"gate": False} if knob == "silu_form" else {}
    base, other = {}, {}
    run_forward(branch_args, fwd_policy("upstream_sm90", sites=sites), record=base)
    run_forward(branch_args, fwd_policy("upstream_sm90", sites=sites, **{knob: value}), record=other)
    assert not torch.equal(base[stage].double(), other[stage].double()), knob


def test_fwd_round_outputs_false_returns_the_math_dtype(branch_args):
    assert run_forward(branch_args, FP64).o.dtype == torch.float64
    assert run_forward(branch_args, fwd_policy("fp32")).o.dtype == torch.bfloat16


BRANCH_SPECS = [
    CaseSpec(seqlen=13, state_dim=16, value_dim=8, rank=2, chunk_size=4, reduce_o=ro, has_z=hz, has_d=hd, seed=s)
    for s, (ro, hz, hd) in enumerate([(True, False, False), (True, True, False), (False, False, True),
                                      (False, True, True)])
] + [CaseSpec(seqlen=11, heads=4, groups=2, state_dim=16, value_dim=8, rank=3, chunk_size=4, has_z=True, has_d=True,
              dtype="float16", seed=9)]


@pytest.mark.parametrize("spec", BRANCH_SPECS, ids=lambda s: s.case_id)
def test_fwd_branches_give_upstream_layout_and_finite_values(spec):
    policy = SM90 if spec.dtype == "bfloat16" else fwd_policy("upstream_sm90_fp16")
    args = case_args(make_inputs(spec))
    o = mamba_mimo_fwd(**args, dtype=spec.lp_dtype, policy=policy).o
    B, S, H, P, R = spec.batch, spec.seqlen, spec.heads, spec.value_dim, spec.rank
    assert o.shape == ((B, S, H, P) if spec.reduce_o else (B, S, R, H, P)) and o.dtype == spec.lp_dtype
    assert torch.isfinite(o.float()).all()
    # the fp32 preset (only the output store rounded) is an lp rounding away from the sm90 model, not more
    fp32 = run_forward(args, fwd_policy("fp32", lp_dtype=spec.dtype)).o
    assert 0 < rel_rms(o, fp32) <= tolerances.get("fwd_sm90_vs_fp32_preset_rel_rms")


def test_fwd_record_holds_the_documented_stages(branch_args):
    record = {}
    out = run_forward(branch_args, SM90, record=record)
    assert torch.equal(out.o, run_forward(branch_args, SM90).o)  # recording changes nothing
    dims = validate_inputs(**branch_args)
    assert list(record) == [s.name for s in stages_for(dims)]
    for name, value in record.items():
        assert tuple(value.shape) == stage_shape(name, dims), name
        assert value.dtype == torch.float32, name
    assert torch.equal(record["o"].bfloat16(), out.o)


def test_fwd_record_of_the_unreduced_output_without_branches():
    spec = CaseSpec(seqlen=6, state_dim=8, value_dim=8, rank=2, chunk_size=4, reduce_o=False, seed=3)
    args = case_args(make_inputs(spec))
    record = {}
    run_forward(args, SM90, record=record)
    assert set(record) == set(STAGE_NAMES) - {"d_term", "gate", "phi_gate", "o_rank", "o_sum"}
    assert record["o"].shape == (1, 6, 2, 1, 8)


# ---------------------------------------------------------------------------------------------------- tails
TAIL_SPEC = CaseSpec(seqlen=16, heads=2, state_dim=16, value_dim=8, rank=2, chunk_size=6, has_z=True, has_d=True,
                     formula="realistic", seed=12)


def _truncated(args: dict, length: int) -> dict:
    """The first ``length`` tokens of every per-token tensor (segsum keeps its chunks: ceil(length / C) is equal)."""
    out = dict(args)
    for name in ("q", "k", "v", "z", "angles"):
        out[name] = args[name][:, :length].contiguous()
    for name in ("da_cs", "da_cs_rev", "dt", "trap"):
        out[name] = args[name][..., :length].contiguous()
    return out


def test_fwd_tail_output_is_the_prefix_of_the_longer_sequence():
    """S = 14 with C = 6 (tail of 2) equals the first 14 tokens of S = 16: o_t depends on tokens <= t only."""
    args = case_args(make_inputs(TAIL_SPEC))
    full = run_forward(args, SM90).o
    tail = run_forward(_truncated(args, 14), SM90).o
    assert torch.equal(tail, full[:, :14])


def test_fwd_padding_of_the_last_chunk_does_not_leak():
    args = case_args(make_inputs(TAIL_SPEC.replace(seqlen=14)))
    seg = args["segsum"].clone()
    seg[:, :, -1, 2:, :] += 100.0  # rows 2.. of the last chunk (t = 14, 15, ...) are padding
    seg[:, :, -1, :, 2:] += 100.0
    assert torch.equal(run_forward(dict(args, segsum=seg), SM90).o, run_forward(args, SM90).o)


# ---------------------------------------------------------------------------------------------------- bad inputs
BAD_SPEC = CaseSpec(seqlen=8, heads=2, groups=1, state_dim=16, value_dim=8, rank=2, chunk_size=4, has_z=True,
                    has_d=True, seed=1)


def _set(name, value):
    def mutate(args):
        args[name] = value(args) if callable(value) else value
    return mutate


def _swap(a, b):
    def mutate(args):
        args[a], args[b] = args[b], args[a]
    return mutate


BF16 = torch.bfloat16
BAD_INPUTS = [
    # (id, mutation, error type, text the message must contain)
    ("q_wrong_rank", _set("q", lambda a: a["q"][0]), ValueError, "q must have 5 dimensions"),
    ("v_wrong_rank", _set("v", lambda a: a["v"][..., 0]), ValueError, "v must have 4 dimensions"),
    ("k_wrong_shape", _set("k", lambda a: a["k"][:, :4]), ValueError, "k must have shape"),
    ("q_float32", _set("q", lambda a: a["q"].float()), TypeError, "q must have dtype"),
    ("v_float16_mixed", _set("v", lambda a: a["v"].half()), TypeError, "v must have dtype"),
    ("trap_float32", _set("trap", lambda a: a["trap"].float()), TypeError, "trap must have dtype"),
    ("q_bias_none", _set("q_bias", None), TypeError, "q_bias is required"),
    ("k_bias_none", _set("k_bias", None), TypeError, "k_bias is required"),
    ("k_bias_bf16", _set("k_bias", lambda a: a["k_bias"].bfloat16()), TypeError, "k_bias must have dtype"),
    ("mimo_v_wrong_shape", _set("mimo_v", lambda a: a["mimo_v"][:, :1]), ValueError, "mimo_v must have shape"),
    ("mimo_o_wrong_shape", _set("mimo_o", lambda a: a["mimo_o"][0]), ValueError, "mimo_o must have shape"),
    ("angles_wrong_width", _set("angles", lambda a: torch.zeros(1, 8, 2, 8)), ValueError, "angles must have"),
    ("segsum_wrong_chunks", _set("segsum", lambda a: a["segsum"][:, :, :1]), ValueError, "segsum must have"),
    ("dt_wrong_length", _set("dt", lambda a: a["dt"][..., :5]), ValueError, "dt must have shape"),
    ("da_cs_rev_float64", _set("da_cs_rev", lambda a: a["da_cs_rev"].double()), TypeError, "da_cs_rev must"),
    ("d_wrong_shape", _set("d", lambda a: torch.zeros(3)), ValueError, "d must have shape"),
    ("z_without_mimo_z", _set("mimo_z", None), ValueError, "uninitialised placeholder"),
    ("mimo_z_without_z", _set("z", None), ValueError, "z and mimo_z must be given together"),
    ("z_and_d_swapped", _swap("z", "d"), ValueError, "z must have shape [1, 8, 2, 8], got [2] (the forward takes"),
    ("d_given_a_z_tensor", _set("d", lambda a: a["v"].clone()), ValueError, "d must have shape [2], got [1, 8, 2, 8]"),
    ("d_and_mimo_z_swapped", _swap("d", "mimo_z"), ValueError, "mimo_z must have shape"),
    ("backward_order_without_d", lambda a: a.update(d=a["mimo_z"], mimo_z=None), ValueError, "backward's order"),
    ("q_missing", _set("q", None), TypeError, "q is required"),
    ("v_not_a_tensor", _set("v", [[1.0]]), TypeError, "v must be a torch.Tensor"),
    ("d_not_a_tensor", _set("d", 0.5), TypeError, "d must be a torch.Tensor or None"),
    ("chunk_size_zero", _set("chunk_size", 0), ValueError, "chunk_size must be >= 1"),
    ("chunk_size_float", _set("chunk_size", 4.0), TypeError, "chunk_size must be an int"),
    ("rotary_divisor_3", _set("rotary_dim_divisor", 3), ValueError, "rotary_dim_divisor must be one of"),
    ("heads_not_multiple_of_groups", lambda a: a.update(q=torch.zeros(1, 8, 2, 3, 16, dtype=BF16),
                                                        k=torch.zeros(1, 8, 2, 3, 16, dtype=BF16)),
     ValueError, "H % G"),
    ("n_not_divisible_by_rotary", lambda a: a.update(q=torch.zeros(1, 8, 2, 1, 18, dtype=BF16)),
     ValueError, "rotary_dim_divisor=4"),
    ("empty_seqlen", _set("q", lambda a: a["q"][:, :0]), ValueError, "empty dimension S"),
    ("device_mismatch", _set("dt", lambda a: a["dt"].to("meta")), ValueError, "dt must be on device"),
    ("dtype_mismatch", _set("dtype", torch.float16), TypeError, "dtype is torch.float16 but q has dtype"),
    ("dtype_string", _set("dtype", "bfloat16"), TypeError, "dtype must be a torch.dtype"),
    ("dtype_float32", _set("dtype", torch.float32), TypeError, "dtype must be torch.bfloat16 or torch.float16"),
]


@pytest.mark.parametrize("case_id, mutate, error, text", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_fwd_bad_inputs_raise_naming_the_argument(case_id, mutate, error, text):
    args = case_args(make_inputs(BAD_SPEC))
    mutate(args)
    with pytest.raises(error) as info:
        run_forward(args, SM90)
    assert text in str(info.value)


def test_fwd_lp_inputs_must_match_the_policy():
    args = case_args(make_inputs(BAD_SPEC.replace(dtype="float16")))
    with pytest.raises(TypeError, match="policy's lp_dtype"):
        run_forward(args, SM90)


@pytest.mark.parametrize("keyword, value", [("cu_seqlens", torch.tensor([0, 8]))])
def test_fwd_out_of_scope_paths_raise_not_implemented(keyword, value):
    with pytest.raises(NotImplementedError, match=keyword):
        run_forward(case_args(make_inputs(BAD_SPEC)), SM90, **{keyword: value})


def test_fwd_policy_must_define_the_forward():
    # seed_bf16 is the seed PR's stage-1 reference: it defines no forward semantics, and says so
    with pytest.raises(PolicyUndefined, match="mamba_mimo_fwd"):
        run_forward(case_args(make_inputs(BAD_SPEC)), "seed_bf16")
    with pytest.raises(TypeError, match="policy must be"):
        run_forward(case_args(make_inputs(BAD_SPEC)), object())


def test_fwd_outputs_key_access_rejects_unknown_names(branch_args):
    out = run_forward(branch_args, SM90)
    with pytest.raises(KeyError, match="unknown output 'dz'"):
        out["dz"]
    assert out.as_dict() == {"o": out.o}
