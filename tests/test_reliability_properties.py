"""Property-based reliability tests (hypothesis) over random valid shapes, branches and policies.

Properties (each runs twice: ``test_<name>`` in the fast profile of CI, ``test_<name>_slow`` with many more
examples under ``-m slow``; ``scripts/reliability.py --profile fast|slow`` runs them and writes
``reports/reliability.md``):

* the Triton kernels (CPU interpreter) match the policy reference under the same random policy within the
  issue-level tolerance ``tolerances.get("same_policy_rel_rms")``, widened only by the case's own FP32-order noise
  as the project's same-policy gate does (``mimo_numerics.testing``; counted separately in the report);
* the reference under the ``fp64`` preset matches the independent FP64 oracle
  (``tolerances.get("fp64_reference_vs_oracle_rel_rms")``);
* the reference under any random policy returns the documented output structure (presence, shape, dtype, device)
  and only finite values on the finite inputs of both formulas;
* ``RoundingPolicy`` JSON/dict round trips are exact, and older JSON (fields missing) loads with defaults;
* ``infer_policy`` on hypothesis-drawn tiny cases: what it returns is always consistent (its distance is the
  distance of its policy, never above the start's, and distance 0 means bit-identical outputs); the exact-recovery
  rate is counted (a counterexample where a single descent stalls, found by the restarts since F4, is pinned in
  ``test_inference_stall_counterexample``).

Shapes: the reference/oracle draw B ≤ 3, S ≤ 64 (tails included), H = G·m ≤ 9, N = d·k ≤ 64, P ≤ 48, R ≤ 8 and
C with C·R ≤ 128 (non-powers of two included); the kernels under the interpreter draw N, P ∈ {16, 32}, S ≤ 24 and at
most 6 chunk programs. Profiles are derandomized (reproducible in CI); set ``MIMO_RELIABILITY_EXPLORE=1`` (and
pytest's ``--hypothesis-seed``) to explore new examples.
"""

from __future__ import annotations

import collections
from pathlib import Path
import json
import warnings

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import Phase, assume, given, note, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mimo_numerics as mn  # noqa: E402
from mimo_numerics import inference, testing, tolerances  # noqa: E402
from mimo_numerics.bundles import _output_layout  # noqa: E402
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.metrics import rel_rms  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES  # noqa: E402
from mimo_numerics.policy import ALL_KNOBS, KNOBS_ADDED_TO_V2, RoundingPolicy  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd.validation import validate_inputs

# ---------------------------------------------------------------------------------------------------- profiles
from reliability_support import counts_writer, kernels_or_none, policies, profile  # noqa: E402
from reliability_support import partial_policy_files  # noqa: E402
from reliability_support import run_case as _run  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference  # noqa: E402

STAGE1 = "mamba_mimo_bwd_fwd"
#: The fields of a schema_version 1 policy file: the stage-1 switches and the knobs.
V1_FIELDS = tuple(SITES) + ALL_KNOBS

#: generated cases run, per "property[profile]" (written to $MIMO_RELIABILITY_STATS/<module>.json for the report)
COUNTS = collections.Counter()
_write_counts = counts_writer(COUNTS, __file__)


needs_kernels = pytest.mark.skipif(kernels_or_none() is None, reason="triton is not installed")


# ---------------------------------------------------------------------------------------------------- strategies
@st.composite
def general_specs(draw):
    """Any valid case of the reference: tails, GQA, non-power-of-two sizes, C·R ≤ 128, every branch."""
    divisor = draw(st.sampled_from([2, 4]))
    groups = draw(st.integers(1, 3))
    rank = draw(st.integers(1, 8))
    return CaseSpec(
        batch=draw(st.integers(1, 3)), seqlen=draw(st.integers(1, 64)), groups=groups,
        heads=groups * draw(st.integers(1, 3)), state_dim=divisor * draw(st.integers(1, 16)),
        value_dim=draw(st.integers(1, 48)), rank=rank, chunk_size=draw(st.integers(1, min(64, 128 // rank))),
        reduce_o=draw(st.booleans()), has_z=draw(st.booleans()), has_d=draw(st.booleans()),
        formula=draw(st.sampled_from(["seed", "realistic"])), dtype=draw(st.sampled_from(["bfloat16", "float16"])),
        seed=draw(st.integers(0, 2 ** 31 - 1)), rotary_dim_divisor=divisor)


@st.composite
def kernel_specs(draw):
    """Tiny cases the interpreter runs in about a second: N, P ∈ {16, 32}, S ≤ 24, ≤ 6 chunk programs."""
    groups = draw(st.integers(1, 2))
    heads = groups * draw(st.integers(1, 2))
    batch = draw(st.integers(1, 2))
    rank = draw(st.integers(1, 4))
    chunk = draw(st.integers(1, 16))
    seqlen = draw(st.integers(1, 24))
    assume(batch * heads * -(-seqlen // chunk) <= 6)
    return CaseSpec(
        batch=batch, seqlen=seqlen, heads=heads, groups=groups, state_dim=draw(st.sampled_from([16, 32])),
        value_dim=draw(st.sampled_from([16, 32])), rank=rank, chunk_size=chunk, reduce_o=draw(st.booleans()),
        has_z=draw(st.booleans()), has_d=draw(st.booleans()), formula=draw(st.sampled_from(["seed", "realistic"])),
        dtype=draw(st.sampled_from(["bfloat16", "float16"])), seed=draw(st.integers(0, 2 ** 31 - 1)),
        rotary_dim_divisor=draw(st.sampled_from([2, 4])))




# ---------------------------------------------------------------------------------------------------- kernels
def _same_policy_checks(spec, policy, got, ref, counter):
    """Structure, no NaN left by the poisoned launch, and rel RMS <= max(same_policy_rel_rms, factor · noise)."""
    tol = tolerances.get("same_policy_rel_rms")
    factor = tolerances.get("gate_same_policy_noise_factor")
    for name in OUTPUT_NAMES:
        a, e = getattr(got, name), getattr(ref, name)
        assert (a is None) == (e is None), f"{name}: present in one implementation only"
        if a is None:
            continue
        assert a.dtype == e.dtype and tuple(a.shape) == tuple(e.shape), (name, a.dtype, e.dtype, a.shape, e.shape)
        assert torch.isfinite(a.float()).all(), f"{name}: non-finite values (an element the kernels did not write?)"
        err = rel_rms(a, e)
        if err <= tol:
            continue
        noise, label = testing.self_noise(spec, policy)[name]
        COUNTS[f"{counter}: above same_policy_rel_rms, within factor x own FP32 noise"] += 1
        note(f"{name}: rel RMS {err:.3e} > {tol:.1e}; the case's own FP32-order noise is {noise:.3e} ({label})")
        assert err <= max(tol, factor * noise), (
            f"{name}: kernel vs reference rel RMS {err:.3e} > max({tol:.1e}, {factor} x noise {noise:.3e})")


def _kernel_vs_reference(profile_name: str, examples: int):
    counter = f"kernel_vs_reference[{profile_name}]"

    @needs_kernels
    @pytest.mark.filterwarnings("ignore::RuntimeWarning")
    @profile(profile_name, examples)
    @given(data=st.data(), spec=kernel_specs())
    def check(data, spec):
        from mimo_numerics import kernels

        policy = data.draw(policies(spec.dtype, kernel=True), label="policy")
        note(f"case {spec.case_id}; policy diff from upstream_sm90: {policy.diff(mn.presets.get('upstream_sm90'))}")
        COUNTS[counter] += 1
        x = make_inputs(spec)
        got = _run(kernels.mamba_mimo_bwd_fwd, x, policy=policy, poison=True)
        ref = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy)
        _same_policy_checks(spec, policy, got, ref, counter)

    return check


test_kernel_matches_reference_same_policy = _kernel_vs_reference("fast", 10)
test_kernel_matches_reference_same_policy_slow = pytest.mark.slow(_kernel_vs_reference("slow", 120))


# ---------------------------------------------------------------------------------------------------- oracle
def _fp64_vs_oracle(profile_name: str, examples: int):
    counter = f"fp64_reference_vs_oracle[{profile_name}]"

    @profile(profile_name, examples)
    @given(spec=general_specs())
    def check(spec):
        note(spec.case_id)
        COUNTS[counter] += 1
        x = make_inputs(spec)
        ref = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=mn.presets.get("fp64").replace(lp_dtype=spec.dtype))
        orc = _run(stage1_oracle.mamba_mimo_bwd_fwd_oracle, x)
        tol = tolerances.get("fp64_reference_vs_oracle_rel_rms")
        for name in OUTPUT_NAMES:
            a, e = getattr(ref, name), getattr(orc, name)
            assert (a is None) == (e is None), name
            if a is None:
                continue
            assert a.dtype == e.dtype == torch.float64 and a.shape == e.shape, name
            err = rel_rms(a, e)
            assert err <= tol, f"{name}: fp64 reference vs oracle rel RMS {err:.3e} > {tol:.0e}"

    return check


test_fp64_reference_matches_oracle = _fp64_vs_oracle("fast", 60)
test_fp64_reference_matches_oracle_slow = pytest.mark.slow(_fp64_vs_oracle("slow", 2000))


# ---------------------------------------------------------------------------------------------------- structure
def _reference_contract(profile_name: str, examples: int):
    counter = f"reference_output_contract[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data(), spec=general_specs())
    def check(data, spec):
        policy = data.draw(policies(spec.dtype), label="policy")
        note(spec.case_id)
        COUNTS[counter] += 1
        x = make_inputs(spec)
        before = {n: t.clone() for n, t in x.items() if isinstance(t, torch.Tensor)}
        out = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy)
        dims = validate_inputs(*as_args(x), **as_kwargs(x))
        layout = _output_layout(dims, policy)
        for name in OUTPUT_NAMES:
            value, expect = getattr(out, name), layout[name]
            assert (value is None) == (expect is None), f"{name}: presence"
            if value is None:
                continue
            shape, _ = expect
            assert tuple(value.shape) == shape, (name, value.shape, shape)
            if not policy.round_outputs:
                dtype = policy.math_torch_dtype
            else:
                dtype = policy.lp_torch_dtype if name in ("states", "dz", "qk_dot") else torch.float32
            assert value.dtype == dtype, (name, value.dtype, dtype)
            assert value.device == dims.device and value.is_contiguous(), name
            assert torch.isfinite(value).all(), f"{name}: non-finite output on finite inputs"
        for n, t in before.items():  # the reference never writes into its inputs
            assert torch.equal(t, x[n]), f"input {n} was modified"

    return check


test_reference_output_contract = _reference_contract("fast", 40)
test_reference_output_contract_slow = pytest.mark.slow(_reference_contract("slow", 600))


# ---------------------------------------------------------------------------------------------------- policies
def _policy_round_trip(profile_name: str, examples: int):
    counter = f"policy_json_round_trip[{profile_name}]"

    @profile(profile_name, examples)
    @given(policy=policies(), drop=st.sets(st.sampled_from(V1_FIELDS)), indent=st.sampled_from([None, 0, 2]))
    def check(policy, drop, indent):
        COUNTS[counter] += 1
        text = policy.to_json(indent=indent)
        back = RoundingPolicy.from_json(text)
        assert back == policy and hash(back) == hash(policy) and back.diff(policy) == {}
        assert back.name == policy.name
        assert RoundingPolicy.from_dict(policy.to_dict()) == policy
        assert json.loads(text) == policy.to_dict()
        # an old (schema_version 1, stage 1 only) file without some fields loads with their defaults
        v1 = {"schema_version": 1, **policy.section(STAGE1).to_dict(), **{k: getattr(policy, k) for k in ALL_KNOBS}}
        data = {k: v for k, v in v1.items() if k not in drop}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            partial = RoundingPolicy.from_json(json.dumps(data))
        default = RoundingPolicy()
        for f in V1_FIELDS:
            assert partial.get(f) == (default.get(f) if f in drop else v1[f]), f
        # a version-2 file that leaves fields out needs a base preset, but for knobs added after such files were
        # written, which take the value those files meant, with a warning naming them
        v2 = {k: v for k, v in policy.to_dict().items() if k not in drop}
        if drop & (set(ALL_KNOBS) - set(KNOBS_ADDED_TO_V2)):
            with pytest.raises(ValueError, match="base"):
                RoundingPolicy.from_json(json.dumps(v2))
        elif drop & set(KNOBS_ADDED_TO_V2):
            with pytest.warns(UserWarning, match="added after the file was written"):
                loaded = RoundingPolicy.from_json(json.dumps(v2))
            assert loaded == policy.replace(**{k: KNOBS_ADDED_TO_V2[k] for k in drop & set(KNOBS_ADDED_TO_V2)})
        # key order does not matter
        assert RoundingPolicy.from_json(json.dumps(dict(reversed(list(policy.to_dict().items()))))) == policy

    return check


test_policy_json_round_trip = _policy_round_trip("fast", 200)
test_policy_json_round_trip_slow = pytest.mark.slow(_policy_round_trip("slow", 5000))


def _partial_file_read(profile_name: str, examples: int):
    counter = f"partial_policy_file_read[{profile_name}]"

    @profile(profile_name, examples)
    @given(drawn=partial_policy_files(), indent=st.sampled_from([None, 2]))
    def check(drawn, indent):
        # a "base" file with some knobs and some sites of every operator means the base preset with exactly those
        # fields replaced: every site it gives is honoured on read, every other field is the base's
        data, expected = drawn
        COUNTS[counter] += 1
        note(json.dumps(data))
        back = RoundingPolicy.from_json(json.dumps(data, indent=indent))
        assert back == expected, back.diff(expected)
        for op, given_sites in data.get("sites", {}).items():
            for site, value in given_sites.items():
                assert back.get(f"{op}.{site}") is value, (op, site)
        assert RoundingPolicy.from_json(back.to_json()) == back

    return check


test_partial_policy_file_is_read_field_by_field = _partial_file_read("fast", 150)
test_partial_policy_file_is_read_field_by_field_slow = pytest.mark.slow(_partial_file_read("slow", 3000))


# ---------------------------------------------------------------------------------------------------- inference
@st.composite
def inference_specs(draw):
    """Tiny cases for the policy search (a few hundred reference runs each)."""
    rank = draw(st.integers(1, 3))
    return CaseSpec(
        formula=draw(st.sampled_from(["seed", "realistic"])), seqlen=draw(st.integers(4, 20)),
        state_dim=draw(st.sampled_from([8, 16])), value_dim=draw(st.sampled_from([4, 8, 16])), rank=rank,
        chunk_size=draw(st.integers(2, 8)), reduce_o=draw(st.booleans()), has_z=draw(st.booleans()),
        has_d=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 31 - 1)))


#: The hypothesis seed of the inference consistency property (both profiles).
INFERENCE_PROPERTY_SEED = 20261202


def _inference(profile_name: str, examples: int):
    counter = f"infer_policy[{profile_name}]"

    # A stall is pinned as drawn (KNOWN_STALLS), so the draws must not move: a fixed seed (derandomize alone seeds
    # from the test's source, so any edit of this body drew other cases) and no shrinking (a shrunk stall is another
    # case: pinning it left the drawn one failing, and shrinking an inference search takes hours)
    @seed(INFERENCE_PROPERTY_SEED)
    @settings(profile(profile_name, examples), phases=(Phase.explicit, Phase.reuse, Phase.generate))
    @given(spec=inference_specs(), policy_seed=st.integers(0, 2 ** 31 - 1))
    def check(spec, policy_seed):
        policy = inference.random_policy(torch.Generator().manual_seed(policy_seed))
        note(f"{spec.case_id}; policy {policy.to_json(indent=None)}")
        COUNTS[counter] += 1
        x = make_inputs(spec)
        with inference.torch_threads(1):
            target = inference.run_reference(x, policy)
            result = inference.infer_policy(x, target, start="seed_bf16")
            evaluator = inference.PolicyEvaluator([x], [target], "bfloat16")
            assert evaluator.distance(policy) == 0.0  # the truth is in the search space
            assert result.distance == evaluator.distance(result.best)
            assert result.distance <= result.start_distance
            if result.distance == 0.0:
                recovered = inference.run_reference(x, result.best)
                for name, want in target.items():
                    assert (want is None) == (recovered[name] is None)
                    if want is not None:  # distance 0: equal values (+0 = -0), so compare values, not bits
                        assert torch.equal(recovered[name], want), name
                check_truth = inference.compare_to_truth(x, policy, result)
                COUNTS[f"{counter}: recovered exactly"] += int(check_truth["exact"])
            else:
                # a stall is a finding: only the pinned ones (each with its strict-xfail test) are accepted, so a new
                # stall (another generator, MIMO_RELIABILITY_EXPLORE, a regression of the search) fails here
                COUNTS[f"{counter}: search stalled (distance > 0)"] += 1
                assert (spec.case_id, policy_seed) in KNOWN_STALLS, (
                    f"infer_policy stalled at distance {result.distance:.3g} on {spec.case_id} with policy seed "
                    f"{policy_seed} (a new stall: pin it as a counterexample test and in reports/reliability.md)")

    return check


test_infer_policy_is_consistent = _inference("fast", 3)
test_infer_policy_is_consistent_slow = pytest.mark.slow(_inference("slow", 60))

# The counterexamples below were found on inputs of the generator before it became machine-independent; their
# inputs are stored (tests/data/inference_counterexamples.pt) so that each stays the very case of its finding.
_COUNTEREXAMPLES = torch.load(Path(__file__).parent / "data" / "inference_counterexamples.pt",
                              weights_only=True)["cases"]


def _counterexample_inputs(spec: CaseSpec) -> dict:
    return dict(_COUNTEREXAMPLES[spec.case_id]["inputs"])


# A drawn tiny case where a single descent of infer_policy stalls at distance 7.44 with five identifiable fields
# wrong, from the seed_bf16, upstream_sm90 and upstream_sm80 starts (the fp32 start finds it): reports/reliability.md,
# finding F4, fixed by the restarts of infer_policy.
STALL_SPEC = CaseSpec(formula="realistic", seqlen=9, state_dim=8, value_dim=4, rank=3, chunk_size=6, reduce_o=False,
                      has_z=True, has_d=True, seed=2)


def _stall_policy() -> RoundingPolicy:
    gen = torch.Generator().manual_seed(5)
    return [inference.random_policy(gen) for _ in range(3)][2]


def test_inference_stall_counterexample():
    x = _counterexample_inputs(STALL_SPEC)
    policy = _stall_policy()
    with inference.torch_threads(1):
        target = inference.run_reference(x, policy)
        result = inference.infer_policy(x, target, start="seed_bf16")
    assert result.distance == 0.0, (result.distance, result.best.diff(policy))
    check = inference.compare_to_truth(x, policy, result)
    assert check["exact"] and check["wrong"] == [], check
    assert "restart" in [s.kind for s in result.trace]  # found by a restart, not by the first descent
    # the winning restart's unidentifiable fields were set back to the start's values
    start = inference.normalise_policy("seed_bf16", "bfloat16")
    for name in check["unidentifiable"]:
        assert result.best.get(name) == start.get(name), name
    assert set(result.ties) <= set(check["unidentifiable"])


def _drawn_case(spec: CaseSpec, policy_seed: int):
    """Inputs, the ``random_policy`` of ``policy_seed`` and its reference outputs (whose distance to that policy is 0:
    the truth is in the search space)."""
    x = _counterexample_inputs(spec)
    policy = inference.random_policy(torch.Generator().manual_seed(policy_seed))
    target = inference.run_reference(x, policy)
    assert inference.PolicyEvaluator([x], [target], "bfloat16").distance(policy) == 0.0
    return x, policy, target


# A drawn tiny case where the search stalled even with the restarts (finding F9 of reports/reliability.md): from every
# preset start it ends at distance 0.136 or 0.169, no pair of changes helps, one triple does; fixed by the escapes of
# infer_policy.
RESIDUAL_STALL_SPEC = CaseSpec(seqlen=6, state_dim=16, value_dim=4, rank=2, chunk_size=8, seed=403123852)
RESIDUAL_STALL_POLICY_SEED = 2095328386


def test_inference_stall_with_restarts_counterexample():
    with inference.torch_threads(1):
        x, policy, target = _drawn_case(RESIDUAL_STALL_SPEC, RESIDUAL_STALL_POLICY_SEED)
        without = inference.infer_policy(x, target, start="seed_bf16", escapes=())
        result = inference.infer_policy(x, target, start="seed_bf16")
    assert without.distance > 0.1  # the restarts alone stall (F9)
    assert result.distance == 0.0, (result.distance, result.best.diff(policy))
    assert "escape3" in [s.kind for s in result.trace]  # found by the triple escape
    check = inference.compare_to_truth(x, policy, result)
    assert check["exact"], check
    start = inference.normalise_policy("seed_bf16", "bfloat16")
    for name in check["unidentifiable"]:  # the escape's unidentifiable fields were set back to the start's values
        assert result.best.get(name) == start.get(name), name


# Finding F10: a drawn tiny case that stalls at 0.0323 with four identifiable fields wrong after the restarts and the
# triple escape; fixed by the quadruple escape.
QUADRUPLE_STALL_SPEC = CaseSpec(formula="realistic", seqlen=13, state_dim=16, value_dim=4, rank=1, chunk_size=4,
                                has_d=True, seed=1733103649)
QUADRUPLE_STALL_POLICY_SEED = 1574284413


def test_inference_quadruple_stall_counterexample():
    with inference.torch_threads(1):
        x, policy, target = _drawn_case(QUADRUPLE_STALL_SPEC, QUADRUPLE_STALL_POLICY_SEED)
        triples_only = inference.infer_policy(x, target, start="seed_bf16", escapes=((3, 14),))
        result = inference.infer_policy(x, target, start="seed_bf16")
    assert triples_only.distance > 0.03  # the triple escape alone stalls (F10)
    assert result.distance == 0.0, (result.distance, result.best.diff(policy))
    assert "escape4" in [s.kind for s in result.trace]
    assert inference.compare_to_truth(x, policy, result)["exact"]


# Finding F11: the third drawn case of the fast property stalls at 0.347 even with the escapes: five identifiable
# fields wrong, three of them among the costliest single changes on their own.
WIDE_STALL_SPEC = CaseSpec(formula="realistic", seqlen=6, state_dim=16, value_dim=8, rank=1, chunk_size=6,
                           has_d=True, seed=134217729)
WIDE_STALL_POLICY_SEED = 36
# Finding F12: a case the slow profile of the consistency property reported (hypothesis's shrink of its draw; seed
# S4 N8 P8 R2 C8, reduced DOUT, no Z, no D, seed 101; policy seed 2) stalls at 0.121 with restarts and escapes. Its inputs come from make_inputs (the
# generator is machine-independent since the counterexamples above were stored).
SLOW_PROFILE_STALL_SPEC = CaseSpec(formula="seed", seqlen=4, state_dim=8, value_dim=8, rank=2, chunk_size=8,
                                   reduce_o=True, seed=101)
SLOW_PROFILE_STALL_POLICY_SEED = 2
# Finding F13: the one stall of the slow profile's 60 draws since the property has a fixed seed
# (INFERENCE_PROPERTY_SEED): seed S9 N16 P8 R3 C7, per-rank DOUT, no Z, no D, seed 195004; policy seed 19784337.
DRAWN_STALL_SPEC = CaseSpec(formula="seed", seqlen=9, state_dim=16, value_dim=8, rank=3, chunk_size=7,
                            reduce_o=False, has_z=False, has_d=False, seed=195004)
DRAWN_STALL_POLICY_SEED = 19784337
#: The stalls the consistency property accepts: ``(case_id, policy seed)`` of the pinned open findings (F11, F12,
#: F13; F11 and F12 were drawn before the fixed seed, and stay accepted should a draw meet them again).
KNOWN_STALLS = {(WIDE_STALL_SPEC.case_id, WIDE_STALL_POLICY_SEED),
                (SLOW_PROFILE_STALL_SPEC.case_id, SLOW_PROFILE_STALL_POLICY_SEED),
                (DRAWN_STALL_SPEC.case_id, DRAWN_STALL_POLICY_SEED)}


def _search_made_inputs(spec: CaseSpec, policy_seed: int):
    """``infer_policy`` from ``seed_bf16`` on ``make_inputs(spec)`` and the ``random_policy`` of ``policy_seed``
    (checked to have distance 0: the truth is in the search space); the result and its comparison to the truth."""
    x = make_inputs(spec)
    policy = inference.random_policy(torch.Generator().manual_seed(policy_seed))
    with inference.torch_threads(1):
        target = inference.run_reference(x, policy)
        assert inference.PolicyEvaluator([x], [target], "bfloat16").distance(policy) == 0.0
        result = inference.infer_policy(x, target, start="seed_bf16")
        return result, inference.compare_to_truth(x, policy, result)


def test_inference_slow_profile_drawn_stall_counterexample():
    """The open finding F13 as it stands (the slow profile's draw, as drawn): the truth has distance 0, the search
    ends at 2.56 (from 11.46) with three identifiable fields wrong. A fix of the search fails this test."""
    result, check = _search_made_inputs(DRAWN_STALL_SPEC, DRAWN_STALL_POLICY_SEED)
    assert result.distance > 1.0
    assert check["wrong"] == ["shifted_gamma", "trap_scale", "k_state"]


def test_inference_slow_profile_stall_counterexample():
    """The open finding F12 as it stands: the truth has distance 0, the search ends above it with three identifiable
    fields wrong. A fix of the search fails this test: then it becomes an exactness test like F4's and F9's."""
    result, check = _search_made_inputs(SLOW_PROFILE_STALL_SPEC, SLOW_PROFILE_STALL_POLICY_SEED)
    assert result.distance > 0.1
    assert check["wrong"] == ["rotary", "causal_scores", "diag_gamma"]


@pytest.mark.xfail(strict=True, reason="infer_policy stalls above distance 0 on this tiny case even with restarts and "
                                       "escapes (reports/reliability.md, finding F11)")
def test_inference_wide_stall_counterexample():
    with inference.torch_threads(1):
        x, policy, target = _drawn_case(WIDE_STALL_SPEC, WIDE_STALL_POLICY_SEED)
        result = inference.infer_policy(x, target, start="seed_bf16")
    assert result.distance == 0.0, (result.distance, result.best.diff(policy))


def test_inference_stall_counterexample_is_a_search_limit_not_a_model_gap():
    # the truth has distance 0 and is found from another start: the stall is the search's, not the distance's
    x = _counterexample_inputs(STALL_SPEC)
    policy = _stall_policy()
    with inference.torch_threads(1):
        target = inference.run_reference(x, policy)
        evaluator = inference.PolicyEvaluator([x], [target], "bfloat16")
        assert evaluator.distance(policy) == 0.0
        assert inference.infer_policy(x, target, start="fp32", restarts=()).distance == 0.0
        assert inference.infer_policy(x, target, start="seed_bf16", restarts=()).distance > 0.0  # the stall itself

