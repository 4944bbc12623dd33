"""Policy inference (mimo_numerics.inference): synthetic recovery, identifiability, the H200 golden data."""

import json
import math

import pytest
import torch

from mimo_numerics import cases, inference, presets, tolerances
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as SWITCHES
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

# Every branch on (reduced DOUT, Z, D), R = 2 rank steps, C·R = 32 rows (two 16-row accumulate steps), 3 chunks.
SYNTHETIC = cases.CaseSpec(formula="realistic", seqlen=40, state_dim=16, value_dim=16, rank=2, chunk_size=16,
                           has_z=True, has_d=True)


@pytest.fixture(scope="module")
def tiny():
    return stage1_cases.make_inputs(SYNTHETIC)


def _reference(inputs, policy):
    with inference.torch_threads(1):
        return inference.run_reference(inputs, policy)


def _random_policies(n, seed=20261129):
    gen = torch.Generator().manual_seed(seed)
    return [inference.random_policy(gen) for _ in range(n)]


@pytest.mark.parametrize("index, policy", list(enumerate(_random_policies(10))), ids=lambda x: str(x)
                         if isinstance(x, int) else "")
def test_inference_recovers_random_policy_exactly(tiny, index, policy):
    """Acceptance 1: distance 0, outputs reproduced bit for bit, and equal to P on every identifiable field.

    A field is identifiable when changing it in P (every other field held) changes at least one output bit; the
    others (typically diag_mode with diag_accum off, state_update when the state's FP32 order is hidden by later
    roundings) cannot be recovered by any method from these outputs.
    """
    target = _reference(tiny, policy)
    result = inference.infer_policy(tiny, target, start="seed_bf16")
    assert result.distance == 0.0
    recovered = _reference(tiny, result.best)
    for name, want in target.items():
        if want is None:
            assert recovered[name] is None
        else:
            assert torch.equal(recovered[name].view(torch.int16 if want.element_size() == 2 else torch.int32),
                               want.view(torch.int16 if want.element_size() == 2 else torch.int32)), name
    check = inference.compare_to_truth(tiny, policy, result)
    assert check["wrong"] == [] and check["exact"]
    # every field the result reports as a tie is one that is not identifiable
    assert set(result.ties) <= set(check["unidentifiable"])
    # the fixed fields are the data's
    assert (result.best.lp_dtype, result.best.math_dtype, result.best.round_outputs) == ("bfloat16", "float32", True)


def test_identifiable_fields_are_honest_about_missing_branches():
    # reduced DOUT without Z: phi_weight, dphio and dz_accum never act; with diag_accum off, neither does diag_mode
    inputs = stage1_cases.make_inputs(cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8,
                                              has_d=True))
    policy = presets.get("upstream_sm90").replace(diag_accum=False)
    identifiable = inference.identifiable_fields(inputs, policy)
    assert not identifiable["phi_weight"] and not identifiable["dphio"] and not identifiable["dz_accum"]
    assert not identifiable["diag_mode"] and not identifiable["silu_form"]
    assert identifiable["psiv"] and identifiable["qk_biased"] and identifiable["diag_accum"]
    # full DOUT without Z: o is never an output, so nothing after the state is identifiable
    inputs = stage1_cases.make_inputs(cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8,
                                              reduce_o=False, has_d=True))
    identifiable = inference.identifiable_fields(inputs, presets.get("upstream_sm90"))
    assert not any(identifiable[f] for f in ("out", "diag_accum", "causal_scores", "state_operand"))
    assert identifiable["k_state"] and identifiable["qk_bias"]


def test_unidentifiable_fields_keep_their_start_value():
    inputs = stage1_cases.make_inputs(cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8,
                                              reduce_o=False, has_d=True))
    policy = presets.get("upstream_sm90").replace(psiv=False)
    result = inference.infer_policy(inputs, _reference(inputs, policy), start="seed_bf16")
    assert result.distance == 0.0 and result.best.get("psiv") is False
    start = presets.get("seed_bf16")
    for field in ("phi_weight", "dphio", "dz_accum", "silu_form"):
        assert result.best.get(field) == start.get(field)
        assert field in result.ties


def test_output_distance_definition(tiny):
    out = _reference(tiny, "upstream_sm90")
    zero = inference.output_distance(out, out)
    assert zero.distance == 0.0 and set(zero.per_output) == {n for n, t in out.items() if t is not None}
    # missing and None target outputs are skipped
    partial = inference.output_distance(out, {"dz": out["dz"], "states": None})
    assert set(partial.per_output) == {"dz"}
    # one flipped lp element in dz: weight 10 on the mismatch fraction plus rel RMS over u = 2**-8
    changed = dict(out)
    dz = out["dz"].clone()
    dz.view(torch.int16).view(-1)[0] += 1  # the next bf16 value away from zero (1 ulp)
    changed["dz"] = dz
    ev = inference.output_distance(changed, out)
    want = 10.0 / dz.numel() + ev.rel_rms["dz"] / 2 ** -8
    assert ev.per_output["dz"] == pytest.approx(want)
    # float32 projections: relative RMS only, even though no element matches bit for bit
    off = dict(out)
    off["dmimo_o"] = out["dmimo_o"] * (1 + 2 ** -20)
    ev = inference.output_distance(off, out)
    assert ev.mismatch["dmimo_o"] == 1.0
    assert ev.per_output["dmimo_o"] == pytest.approx(ev.rel_rms["dmimo_o"] / 2 ** -8)
    # -0 and +0 count as equal
    signed = dict(out)
    signed["dz"] = out["dz"].clone()
    signed["dz"][out["dz"] == 0] = -0.0
    assert inference.output_distance(signed, out).distance == 0.0


def test_output_distance_sums_per_batch_projections_when_the_target_is_summed():
    inputs = stage1_cases.make_inputs(cases.CaseSpec(batch=2, seqlen=16, state_dim=16, value_dim=16, rank=2,
                                              chunk_size=8, has_z=True))
    out = _reference(inputs, "upstream_sm90")
    summed = {"dmimo_o": out["dmimo_o"].sum(0), "dmimo_z": out["dmimo_z"].sum(0)}
    assert inference.output_distance(out, summed).distance == 0.0
    with pytest.raises(ValueError, match="dz"):
        inference.output_distance({"dz": None}, {"dz": out["dz"]})


def test_candidates_mode_ranks_given_policies(tiny):
    target = _reference(tiny, "upstream_sm80")
    result = inference.infer_policy(tiny, target, candidates=["seed_bf16", "upstream_sm90", "upstream_sm80"])
    assert result.best == presets.get("upstream_sm80") and result.distance == 0.0
    assert [s.kind for s in result.trace] == ["start", "candidate"]
    json.dumps(result.to_dict())  # plain JSON types
    assert "upstream_sm80" in result.to_markdown()


def test_search_is_deterministic_and_cached(tiny):
    target = _reference(tiny, presets.get("seed_bf16").replace(out=False, rotary=False))
    first = inference.infer_policy(tiny, target)
    second = inference.infer_policy(tiny, target)
    assert first.to_dict() == second.to_dict()
    assert first.evaluations == len(first.distances)
    assert first.distance_of(first.best) == 0.0


@pytest.mark.parametrize("bad", [((1, 5),), ((3, 2),), ((3,),), (("3", 14),), ((True, 4),), (3, 14)])
def test_bad_escapes_are_refused_naming_the_argument(tiny, bad):
    target = _reference(tiny, "seed_bf16")
    with pytest.raises(ValueError, match="escapes"):
        inference.infer_policy(tiny, target, escapes=bad)


def test_describe_policy_names_the_nearest_preset():
    assert inference.describe_policy("upstream_sm90") == "upstream_sm90"
    assert (inference.describe_policy(presets.get("upstream_sm90").replace(silu_form="sigmoid"))
            == "upstream_sm90 with silu_form=sigmoid")


@pytest.fixture(scope="module")
def golden_result():
    data = golden.load_golden()
    inputs = [v[0] for v in data.values()]
    outputs = [v[1] for v in data.values()]
    return inference.infer_policy(inputs, outputs, start="seed_bf16")


def test_golden_inference_recovers_upstream_semantics(golden_result):
    """Acceptance 2: from seed_bf16 on the 15 H200 cases: diag_mode fma, every switch on, >= 3x closer."""
    best = golden_result.best
    assert best.diag_mode == "fma"
    assert all(best.get(s) for s in SWITCHES)
    seed = golden_result.distance_of(inference.normalise_policy("seed_bf16", "bfloat16"))
    assert seed == golden_result.start_distance
    assert seed >= tolerances.get("inference_golden_start_over_best_min") * golden_result.distance
    assert golden_result.distance < tolerances.get("inference_golden_best_distance_max") and not math.isinf(seed)
