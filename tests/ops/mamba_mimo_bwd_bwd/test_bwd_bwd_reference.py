"""Stage-2 policy reference (``mamba_mimo_bwd_bwd``): the real upstream kernel's outputs (golden H200 data), the
independent FP64 oracle, sites and knobs, the R == 1 special case, tails, GQA, fp16, records and bad inputs.

The golden figures are printed by ``test_bwd_bwd_golden_table`` (``pytest -s``) and written with the site
sensitivity by ``scripts/stage2_site_sensitivity.py`` into ``reports/stage2_site_sensitivity.md``. fp32 GEMMs go
through BLAS, so every comparison of fp32 results uses a tolerance, never bits.
"""

import math
from pathlib import Path

import pytest
import torch

from bwd_bwd_support import (CANCELLING_OUTPUTS, abs_term_sums, args_of, golden_stage2_inputs, kwargs_of,
                             load_golden, rel_to_abs_terms, run_reference, stage2_policy, synthetic_stage2_inputs)
from mimo_numerics.policy import PolicyUndefined
from mimo_numerics import tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import bit_equal_fraction, rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
from mimo_numerics.ops.mamba_mimo_bwd_bwd.sites import OP_NAME, SITES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import (LP_OUTPUTS, OUTPUT_NAMES, STAGES, MimoBwdBwdOutputs)

GOLDEN = load_golden()
GOLDEN_NAMES = list(GOLDEN)
#: The golden case with every branch on (reduced DOUT, Z, D).
ALL_BRANCH_CASE = "g_B1_S64_H2_N64_P64_R4_C16_zdo"
GATED_LP = ("dq", "dk", "dv", "dmimo_v")

# drawn cases beyond the golden ones: R in {1, 2, 4, 8}, fp16, tails, 1 < G < H, full DOUT, both rotary divisors
SYNTHETIC = [
    CaseSpec(seqlen=40, state_dim=16, value_dim=16, rank=1, chunk_size=16, has_z=True, has_d=True,
             formula="realistic", seed=21),
    CaseSpec(batch=2, seqlen=32, heads=2, state_dim=16, value_dim=32, rank=2, chunk_size=8, reduce_o=False,
             has_z=True, formula="realistic", seed=22),
    CaseSpec(seqlen=27, heads=2, state_dim=32, value_dim=16, rank=4, chunk_size=8, has_z=True, has_d=True,
             dtype="float16", formula="realistic", seed=23),
    CaseSpec(seqlen=20, heads=4, groups=2, state_dim=16, value_dim=16, rank=8, chunk_size=4, reduce_o=False,
             has_d=True, seed=24),
    CaseSpec(seqlen=24, state_dim=32, value_dim=16, rank=4, chunk_size=8, formula="realistic", seed=25,
             rotary_dim_divisor=2),
]
SYNTHETIC_IDS = [s.case_id for s in SYNTHETIC]


def _lp_name(inputs):
    return "float16" if inputs["q"].dtype == torch.float16 else "bfloat16"


def _preset(name, inputs, **changes):
    """A stand-in preset with the inputs' lp dtype (``upstream_sm90`` becomes ``upstream_sm90_fp16`` for fp16)."""
    if name == "upstream_sm90" and _lp_name(inputs) == "float16":
        return stage2_policy("upstream_sm90_fp16", **changes)
    return stage2_policy(name, lp_dtype=_lp_name(inputs), **changes)


@pytest.fixture(scope="module")
def golden_runs():
    runs = {}
    for name in GOLDEN_NAMES:
        inputs = golden_stage2_inputs(GOLDEN[name])
        for preset in ("upstream_sm90", "fp32", "fp64"):
            runs[name, preset] = run_reference(inputs, _preset(preset, inputs))
        runs[name, "mul_then_add"] = run_reference(inputs, _preset("upstream_sm90", inputs, diag_mode="mul_then_add"))
    return runs


@pytest.fixture(scope="module")
def synthetic_inputs():
    return {spec.case_id: synthetic_stage2_inputs(spec) for spec in SYNTHETIC}


GOLDEN_OUTPUTS = [(name, o) for name in GOLDEN_NAMES for o in OUTPUT_NAMES if GOLDEN[name]["bwd_bwd"][o] is not None]


# ---------------------------------------------------------------------------------------------- golden H200 data
def test_bwd_bwd_golden_cases_cover_the_branches():
    kws = [GOLDEN[n]["inputs"] for n in GOLDEN_NAMES]
    # the shared 7 and the extra H200 cases R = 1 (C = 64), R = 8, fp16, G = H with N = 32 (the tail case has no
    # backward: upstream refuses S % C != 0)
    assert len(GOLDEN_NAMES) == 11
    assert {i["Q"].shape[2] for i in kws} >= {1, 2, 4, 8} and any(i["Q"].dtype == torch.float16 for i in kws)
    assert {(i["MIMO_Out"] is not None, i["Z"] is not None) for i in kws} >= {(True, True), (True, False),
                                                                            (False, True)}
    assert any(i["D"] is None for i in kws) and any(i["D"] is not None for i in kws)
    assert all(GOLDEN[n]["bwd_bwd"]["states_unchanged"] and GOLDEN[n]["bwd_bwd"]["qk_dot_unchanged"]
               for n in GOLDEN_NAMES)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_bwd_bwd_golden_outputs_have_upstream_shapes_and_dtypes(golden_runs, name):
    got, want = golden_runs[name, "upstream_sm90"], GOLDEN[name]["bwd_bwd"]
    for o in OUTPUT_NAMES:
        if want[o] is None:
            assert got[o] is None, o
            continue
        assert got[o].shape == want[o].shape and got[o].dtype == want[o].dtype, o


@pytest.mark.parametrize("name,output", GOLDEN_OUTPUTS, ids=[f"{n}-{o}" for n, o in GOLDEN_OUTPUTS])
def test_bwd_bwd_golden_upstream_sm90_closer_than_fp32(golden_runs, name, output):
    want = GOLDEN[name]["bwd_bwd"][output]
    sm90 = rel_rms(golden_runs[name, "upstream_sm90"][output], want)
    fp32 = rel_rms(golden_runs[name, "fp32"][output], want)
    assert fp32 >= tolerances.get("stage2_golden_fp32_over_sm90_ratio_min") * sm90


@pytest.mark.parametrize("name,output", [(n, o) for n, o in GOLDEN_OUTPUTS if o in GATED_LP],
                         ids=[f"{n}-{o}" for n, o in GOLDEN_OUTPUTS if o in GATED_LP])
def test_bwd_bwd_golden_dq_dk_dv_dmimo_v_within_gate(golden_runs, name, output):
    got, want = golden_runs[name, "upstream_sm90"][output], GOLDEN[name]["bwd_bwd"][output]
    assert rel_rms(got, want) <= tolerances.get("stage2_golden_lp_rel_rms")


@pytest.mark.parametrize("name", [n for n in GOLDEN_NAMES if GOLDEN[n]["inputs"]["Q"].shape[2] > 1])
def test_bwd_bwd_golden_dv_rank_sum_is_one_rounding_per_step(golden_runs, name):  # (R = 1: nothing is summed)
    """The DV rank sum's lp mul+add pair (the one of stage 2): fused (``fma``) matches, unfused is far off."""
    want = GOLDEN[name]["bwd_bwd"]["dv"]
    fused = rel_rms(golden_runs[name, "upstream_sm90"]["dv"], want)
    unfused = rel_rms(golden_runs[name, "mul_then_add"]["dv"], want)
    assert unfused >= tolerances.get("stage2_golden_dv_unfused_over_fused_ratio_min") * fused
    for o in OUTPUT_NAMES:  # diag_mode governs dv only
        if o != "dv" and GOLDEN[name]["bwd_bwd"][o] is not None:
            assert torch.equal(golden_runs[name, "upstream_sm90"][o], golden_runs[name, "mul_then_add"][o]), o


def test_bwd_bwd_golden_table(golden_runs):
    """Print the golden table (``pytest -s``); the sums that cancel are judged against Σ|terms| too."""
    lines = [f"{'case':40s} {'output':12s} {'sm90':>9s} {'fp32':>9s} {'fp64':>9s} {'bit-eq':>7s} "
             f"{'sm90/Σ|t|':>10s} {'fp32/Σ|t|':>10s}"]
    worst_terms = {}
    for name in GOLDEN_NAMES:
        want = GOLDEN[name]["bwd_bwd"]
        sums = abs_term_sums(golden_stage2_inputs(GOLDEN[name]))
        for o in OUTPUT_NAMES:
            if want[o] is None:
                continue
            if not want[o].any():  # e.g. ddA with two chunks: the first state is 0 and the last decay unused
                assert not golden_runs[name, "upstream_sm90"][o].any(), (name, o)
                lines.append(f"{name:40s} {o:12s} exactly 0, as upstream's")
                continue
            errs = [rel_rms(golden_runs[name, p][o], want[o]) for p in ("upstream_sm90", "fp32", "fp64")]
            bits = bit_equal_fraction(golden_runs[name, "upstream_sm90"][o], want[o])
            terms = ""
            if o in CANCELLING_OUTPUTS:
                pair = [rel_to_abs_terms(golden_runs[name, p][o], want[o], sums[o]) for p in ("upstream_sm90",
                                                                                              "fp32")]
                worst_terms[o] = max(worst_terms.get(o, 0.0), pair[0])
                terms = f" {pair[0]:10.2e} {pair[1]:10.2e}"
                assert pair[1] >= tolerances.get("stage2_golden_fp32_over_sm90_ratio_min") * pair[0], (name, o)
            assert all(math.isfinite(e) for e in errs), (name, o)
            lines.append(f"{name:40s} {o:12s} {errs[0]:9.2e} {errs[1]:9.2e} {errs[2]:9.2e} {bits:7.4f}{terms}")
    print("\n" + "\n".join(lines))
    assert set(worst_terms) == set(CANCELLING_OUTPUTS)
    assert max(worst_terms.values()) <= tolerances.get("stage2_golden_cancelling_rel_abs_terms")


def test_bwd_bwd_golden_every_site_is_seen_in_the_upstream_outputs():
    """On the all-branch case, turning any one site off moves some output at least 2x further from upstream."""
    inputs, want = golden_stage2_inputs(GOLDEN[ALL_BRANCH_CASE]), GOLDEN[ALL_BRANCH_CASE]["bwd_bwd"]
    base = run_reference(inputs, "upstream_sm90")
    base_err = {o: rel_rms(base[o], want[o]) for o in OUTPUT_NAMES}
    for site in SITES:
        out = run_reference(inputs, _preset("upstream_sm90", inputs, sites={site: False}))
        growth = max(rel_rms(out[o], want[o]) / max(base_err[o], 1e-12) for o in OUTPUT_NAMES)
        assert growth >= tolerances.get("stage2_golden_site_off_growth_min"), site


# ---------------------------------------------------------------------------------------------- FP64 oracle
def _oracle():
    from mimo_numerics.ops.mamba_mimo_bwd_bwd import oracle

    return oracle


@pytest.mark.parametrize("name", GOLDEN_NAMES + SYNTHETIC_IDS)
def test_bwd_bwd_fp64_matches_oracle(synthetic_inputs, name):
    oracle = _oracle()
    inputs = golden_stage2_inputs(GOLDEN[name]) if name in GOLDEN else synthetic_inputs[name]
    got = run_reference(inputs, _preset("fp64", inputs))
    want = oracle.mamba_mimo_bwd_bwd_oracle(*args_of(inputs), **kwargs_of(inputs))
    for o in OUTPUT_NAMES:
        if want[o] is None:
            assert got[o] is None, o
            continue
        assert got[o].dtype == torch.float64 and got[o].shape == want[o].shape, o
        assert rel_rms(got[o], want[o]) <= tolerances.get("stage2_fp64_reference_vs_oracle_rel_rms"), o


# ---------------------------------------------------------------------------------------------- drawn cases
@pytest.mark.parametrize("name", SYNTHETIC_IDS)
def test_bwd_bwd_fp32_preset_differs_from_fp64_only_by_fp32_math_and_lp_stores(synthetic_inputs, name):
    inputs = synthetic_inputs[name]
    fp32, fp64 = run_reference(inputs, _preset("fp32", inputs)), run_reference(inputs, _preset("fp64", inputs))
    for o in OUTPUT_NAMES:
        if fp64[o] is None:
            assert fp32[o] is None, o
            continue
        limit = "stage2_fp32_vs_fp64_lp_rel_rms" if o in LP_OUTPUTS else "stage2_fp32_vs_fp64_fp32_rel_rms"
        assert fp32[o].dtype == (inputs["q"].dtype if o in LP_OUTPUTS else torch.float32), o
        assert rel_rms(fp32[o], fp64[o]) <= tolerances.get(limit), o


def test_bwd_bwd_fp16_policy_rounds_to_fp16(synthetic_inputs):
    """Same values in fp16 and in bf16: the fp16 policy's dq, dk, dv are >= 4x closer to FP64 (3 more bits)."""
    name = next(n for n in SYNTHETIC_IDS if "fp16" in n)
    inputs16 = synthetic_inputs[name]
    inputs_bf = {k: (v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v)
                 for k, v in inputs16.items()}
    err = {}
    for label, inputs in (("fp16", inputs16), ("bf16", inputs_bf)):
        got, exact = run_reference(inputs, _preset("upstream_sm90", inputs)), run_reference(inputs, _preset("fp64",
                                                                                                           inputs))
        assert got.dq.dtype == inputs["q"].dtype
        err[label] = {o: rel_rms(got[o], exact[o]) for o in ("dq", "dk", "dv")}
    for o in ("dq", "dk", "dv"):
        assert err["fp16"][o] * 4 <= err["bf16"][o], o


def test_bwd_bwd_tail_chunk_equals_the_padded_sequence(synthetic_inputs):
    """S % C != 0 is handled as the kernel's predicated loads do: the same as zero-padding to a whole chunk (with
    da_cs padded by its last value, which the tail chunk's decay reads), trimmed back to S."""
    name = SYNTHETIC_IDS[0]
    inputs = synthetic_inputs[name]
    S, C = inputs["q"].shape[1], inputs["chunk_size"]
    Sp = -(-S // C) * C
    assert S % C

    def pad(x, dim, mode="zeros"):
        if x is None:
            return None
        shape = list(x.shape)
        shape[dim] = Sp - S
        fill = x.narrow(dim, S - 1, 1).expand(shape) if mode == "edge" else torch.zeros(shape, dtype=x.dtype)
        return torch.cat((x, fill), dim=dim)

    padded = dict(inputs)
    for key in ("dout", "q", "k", "v", "z", "angles"):
        padded[key] = pad(inputs[key], 1)
    for key in ("da_cs_rev", "dt", "trap", "qk_dot"):
        padded[key] = pad(inputs[key], 2)
    padded["da_cs"] = pad(inputs["da_cs"], 2, mode="edge")
    policy = _preset("upstream_sm90", inputs)
    tail, full = run_reference(inputs, policy), run_reference(padded, policy)
    for o in OUTPUT_NAMES:
        if tail[o] is None:
            continue
        want = full[o]
        if o in ("dq", "dk", "dv", "dangles"):
            want = want[:, :S]
        elif o in ("dfactor", "dgamma_diag", "ddA", "ddA_cs_rev", "ddA_cs"):
            want = want[..., :S]
        # Bit-identical on every machine: both runs pad to the same Sp (the reference pads the tail itself), so every
        # torch op, GEMM included, gets tensors of the same shapes and strides and runs the same kernel in the same
        # order. The padded positions hold other values (da_cs: edge here, zeros inside the reference); that the kept
        # outputs are equal shows they reach them only as exact zeros (products with a zero-padded operand; the
        # chunk decay reads the last valid token), and adding an exact 0 leaves a partial sum as it is in any order
        assert torch.equal(tail[o], want), o


def test_bwd_bwd_groups_map_heads_as_expanded_heads(synthetic_inputs):
    """1 < G < H (which upstream's wrapper refuses): the same as giving every head its group's q and k (G = H)."""
    name = next(n for n in SYNTHETIC_IDS if "_H4_G2_" in n)
    inputs = synthetic_inputs[name]
    heads, groups = inputs["v"].shape[2], inputs["q"].shape[3]
    expanded = dict(inputs)
    for key in ("q", "k"):
        expanded[key] = inputs[key].repeat_interleave(heads // groups, dim=3)
    policy = _preset("upstream_sm90", inputs)
    got, want = run_reference(inputs, policy), run_reference(expanded, policy)
    for o in OUTPUT_NAMES:
        if want[o] is not None:
            # bit-identical on every machine: the reference maps heads to groups by index_select before any
            # arithmetic, so both runs compute on tensors of the same shapes, strides and values, op for op
            assert torch.equal(got[o], want[o]), o


@pytest.mark.parametrize("rank_case,masked_input_rounded", [(0, True), (1, False)], ids=["R1", "R2"])
def test_bwd_bwd_rank_one_masks_the_rounded_lkq(synthetic_inputs, rank_case, masked_input_rounded):
    """L824-834: with R == 1 the mask multiplies the lp lkq (two roundings); with R > 1 the fp32 one (one)."""
    inputs = synthetic_inputs[SYNTHETIC_IDS[rank_case]]
    assert (inputs["q"].shape[2] == 1) == masked_input_rounded
    with_lkq, without_lkq = {}, {}
    run_reference(inputs, _preset("upstream_sm90", inputs), record=with_lkq)
    run_reference(inputs, _preset("upstream_sm90", inputs, sites={"lkq": False}), record=without_lkq)
    assert not torch.equal(with_lkq["lkq"], without_lkq["lkq"])
    assert torch.equal(with_lkq["lkq_masked"], without_lkq["lkq_masked"]) != masked_input_rounded


def test_bwd_bwd_knobs_act_where_documented(synthetic_inputs):
    with_z = synthetic_inputs[SYNTHETIC_IDS[1]]
    no_z = synthetic_inputs[SYNTHETIC_IDS[4]]
    assert with_z["z"] is not None and no_z["z"] is None

    def differs(inputs, **knobs):
        a, b = run_reference(inputs, _preset("upstream_sm90", inputs)), run_reference(
            inputs, _preset("upstream_sm90", inputs, **knobs))
        return {o for o in OUTPUT_NAMES if a[o] is not None and not torch.equal(a[o], b[o])}

    assert differs(with_z, diag_mode="mul_then_add") == {"dv"}
    assert differs(no_z, silu_form="sigmoid") == set()

    def recorded(inputs, stage, **knobs):
        record = {}
        run_reference(inputs, _preset("upstream_sm90", inputs, **knobs), record=record)
        return record[stage]

    assert not torch.equal(recorded(with_z, "gate"), recorded(with_z, "gate", silu_form="sigmoid"))
    # two accumulate steps need C·R > 16 rows: the R = 4, C = 8 case; the two orders agree to FP32 level
    two_steps = synthetic_inputs[SYNTHETIC_IDS[2]]
    a, b = recorded(two_steps, "dstates"), recorded(two_steps, "dstates", state_update="separate")
    assert not torch.equal(a, b)
    assert rel_rms(a, b) <= tolerances.get("stage2_state_update_orders_rel_rms")


def test_bwd_bwd_record_has_every_stage_with_its_shape(synthetic_inputs):
    inputs = synthetic_inputs[SYNTHETIC_IDS[2]]  # Z, D, reduced DOUT: every stage exists
    B, S, R, G, N = inputs["q"].shape
    H, P, C = inputs["v"].shape[2], inputs["v"].shape[3], inputs["chunk_size"]
    sizes = {"B": B, "S": S, "R": R, "N": N, "P": P, "H": H, "nc": -(-S // C), "L": C * R,
             "N/d": N // inputs["rotary_dim_divisor"], "4": 4}
    record = {}
    run_reference(inputs, _preset("upstream_sm90", inputs), record=record)
    assert list(record) == [s for s in STAGES if s in record] and set(record) == set(STAGES)
    for stage, shape in STAGES.items():
        want = [sizes[d.strip()] for d in shape.strip("[]").split(",")]
        assert list(record[stage].shape) == want, stage
        assert record[stage].dtype == torch.float32, stage


def test_bwd_bwd_strided_inputs_give_the_same_outputs(synthetic_inputs):
    inputs = synthetic_inputs[SYNTHETIC_IDS[1]]
    strided = {k: (v.transpose(0, -1).contiguous().transpose(0, -1) if isinstance(v, torch.Tensor) and v.dim() > 1
                   else v) for k, v in inputs.items()}
    assert not strided["dout"].is_contiguous()
    policy = _preset("upstream_sm90", inputs)
    got, want = run_reference(strided, policy), run_reference(inputs, policy)
    for o in OUTPUT_NAMES:
        if want[o] is not None:
            # bit-identical on every machine: the reference makes every input contiguous before any arithmetic, so
            # from there both runs perform the same ops on tensors of the same shapes, strides and values
            assert torch.equal(got[o], want[o]), o


def test_bwd_bwd_outputs_by_name_position_and_attribute(synthetic_inputs):
    inputs = synthetic_inputs[SYNTHETIC_IDS[4]]
    out = run_reference(inputs, _preset("upstream_sm90", inputs))
    assert isinstance(out, MimoBwdBwdOutputs) and out.keys() == OUTPUT_NAMES
    assert out["dq"] is out.dq is out[0] and out["ddA_cs"] is out[-1]
    assert out["dD"] is None and list(out.as_dict()) == list(OUTPUT_NAMES)
    with pytest.raises(KeyError, match="dz"):
        out["dz"]


def test_bwd_bwd_round_outputs_false_returns_the_math_dtype(synthetic_inputs):
    inputs = synthetic_inputs[SYNTHETIC_IDS[0]]
    out = run_reference(inputs, _preset("fp64", inputs))
    assert all(t.dtype == torch.float64 for t in out if t is not None)
    out = run_reference(inputs, _preset("fp32", inputs, round_outputs=False))
    assert all(t.dtype == torch.float32 for t in out if t is not None)


def test_bwd_bwd_sites_are_described_with_line_numbers_and_documented():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "stage2.md").read_text(encoding="utf-8")
    assert len(SITES) == len(set(SITES)) >= 30
    for site, text in SITES.items():
        assert site == site.lower() and text.startswith("L") and "round" in text, site
        assert f"| `{site}` | {text.split(':')[0]} |" in doc, site


# ---------------------------------------------------------------------------------------------- bad inputs
BAD_SPEC = CaseSpec(seqlen=8, heads=2, state_dim=16, value_dim=8, rank=2, chunk_size=4, has_z=True, has_d=True)


@pytest.fixture(scope="module")
def bad_base():
    return synthetic_stage2_inputs(BAD_SPEC)


def _set(name, value):
    def mutate(inputs):
        inputs[name] = value(inputs) if callable(value) else value
    return mutate


BAD_INPUTS = [
    ("states_wrong_chunks", _set("states", lambda i: i["states"][:, :, :1]), ValueError, "states"),
    ("states_transposed", _set("states", lambda i: i["states"].transpose(-1, -2)), ValueError, "states"),
    ("states_float32", _set("states", lambda i: i["states"].float()), TypeError, "states"),
    ("states_missing", _set("states", None), TypeError, "states"),
    ("qk_dot_wrong_shape", _set("qk_dot", lambda i: i["qk_dot"][..., :1]), ValueError, "qk_dot"),
    ("qk_dot_float32", _set("qk_dot", lambda i: i["qk_dot"].float()), TypeError, "qk_dot"),
    ("qk_dot_list", _set("qk_dot", lambda i: i["qk_dot"].tolist()), TypeError, "qk_dot"),
    ("q_wrong_rank", _set("q", lambda i: i["q"][0]), ValueError, "q"),
    ("k_float16_mixed", _set("k", lambda i: i["k"].half()), TypeError, "k"),
    ("v_wrong_length", _set("v", lambda i: i["v"][:, :4]), ValueError, "v"),
    ("dout_full_layout_with_mimo_o", _set("dout", lambda i: torch.zeros(1, 8, 2, 2, 8, dtype=torch.bfloat16)),
     ValueError, "dout"),
    ("trap_float32", _set("trap", lambda i: i["trap"].float()), TypeError, "trap"),
    ("q_bias_bf16", _set("q_bias", lambda i: i["q_bias"].bfloat16()), TypeError, "q_bias"),
    ("mimo_v_wrong_shape", _set("mimo_v", lambda i: i["mimo_v"][:, :1]), ValueError, "mimo_v"),
    ("angles_wrong_width", _set("angles", lambda i: torch.zeros(1, 8, 2, 8)), ValueError, "angles"),
    ("segsum_wrong_chunk_size", _set("segsum", lambda i: i["segsum"][..., :2, :2]), ValueError, "segsum"),
    ("da_cs_wrong_length", _set("da_cs", lambda i: i["da_cs"][..., :5]), ValueError, "da_cs"),
    ("d_wrong_shape", _set("d", torch.zeros(3)), ValueError, "d"),
    ("z_without_mimo_z", _set("mimo_z", None), ValueError, "mimo_z"),
    ("mimo_z_without_z", _set("z", None), ValueError, "z"),
    ("chunk_size_zero", _set("chunk_size", 0), ValueError, "chunk_size"),
    ("chunk_size_float", _set("chunk_size", 4.0), TypeError, "chunk_size"),
    ("rotary_divisor_3", _set("rotary_dim_divisor", 3), ValueError, "rotary_dim_divisor"),
    ("states_on_meta", _set("states", lambda i: i["states"].to("meta")), ValueError, "states"),
]


@pytest.mark.parametrize("mutate,error,needle", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bwd_bwd_bad_inputs_raise_naming_the_argument(bad_base, mutate, error, needle):
    inputs = dict(bad_base)
    mutate(inputs)
    with pytest.raises(error, match=rf"\b{needle}\b"):
        run_reference(inputs, "upstream_sm90")


BAD_CALLS = [
    ("dtype_mismatch", dict(dtype=torch.float16), {}, ValueError, "dtype"),
    ("dtype_float32", dict(dtype=torch.float32), {}, ValueError, "dtype"),
    ("dtype_unknown_string", dict(dtype="half"), {}, TypeError, "dtype"),
    ("policy_lp_mismatch", {}, dict(policy=stage2_policy("upstream_sm90_fp16")), TypeError, "lp_dtype"),
    ("policy_undefined_here", {}, dict(policy="seed_bf16"), PolicyUndefined, OP_NAME),
    ("policy_not_a_policy", {}, dict(policy=object()), TypeError, "policy must be"),
]


@pytest.mark.parametrize("extra,override,error,needle", [b[1:] for b in BAD_CALLS], ids=[b[0] for b in BAD_CALLS])
def test_bwd_bwd_bad_dtype_or_policy_raise_naming_it(bad_base, extra, override, error, needle):
    kwargs = dict(kwargs_of(bad_base), policy=stage2_policy("upstream_sm90"), **extra)
    kwargs.update(override)
    with pytest.raises(error, match=needle):
        mamba_mimo_bwd_bwd(*args_of(bad_base), **kwargs)


def test_bwd_bwd_dtype_argument_matching_the_inputs_is_accepted(bad_base):
    for dtype in (None, torch.bfloat16, "bfloat16"):
        out = mamba_mimo_bwd_bwd(*args_of(bad_base), **kwargs_of(bad_base), dtype=dtype,
                                 policy=stage2_policy("upstream_sm90"))
        assert out.dq.dtype == torch.bfloat16
