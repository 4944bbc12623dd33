"""Non-finite values: propagation of NaN/±Inf from every input, FP16 overflow sites, and locating them.

The rules are ``docs/nonfinite.md`` (executable form: ``mimo_numerics.nonfinite.predict_nonfinite_outputs``):

* the reference, under random policies, makes exactly the predicted output elements non-finite for a NaN, +Inf or
  −Inf at a random element of a random input (hypothesis);
* the Triton kernels (interpreter) give the reference's class (finite, NaN, +Inf, −Inf) on every output element;
* FP16 overflow at a rounding site: reference and kernels agree, and ``nonfinite.first_nonfinite`` names the site
  on the records of both (and ``nonfinite_switches`` names the switch responsible);
* the FP64 oracle is not a reference for non-finite propagation (pinned difference, see the doc).

GPU variants (``@pytest.mark.gpu``, skipped without CUDA) compare the CUDA kernels and the CUDA reference with the
CPU reference; ``scripts/gpu_nonfinite_upstream.py`` does the same for the upstream kernel.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mimo_numerics as mn  # noqa: E402
from mimo_numerics import nonfinite as nf  # noqa: E402
from mimo_numerics import operator as _operator  # noqa: E402
from mimo_numerics.ops import registry  # noqa: E402
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as SWITCHES  # noqa: E402

# ---------------------------------------------------------------------------------------------------- profiles
from reliability_support import counts_writer, kernels_or_none, policies, profile  # noqa: E402
from reliability_support import run_case as _run  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference  # noqa: E402

COUNTS = collections.Counter()
_write_counts = counts_writer(COUNTS, __file__)


KERNELS = kernels_or_none()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="triton is not installed")
_CUDA = torch.cuda.is_available()

# ---------------------------------------------------------------------------------------------------- strategies
NONFINITE = (float("nan"), float("inf"), float("-inf"))


@st.composite
def specs(draw, kernel=False):
    groups = draw(st.integers(1, 2))
    heads = groups * draw(st.integers(1, 2))
    batch = draw(st.integers(1, 2))
    rank = draw(st.integers(1, 4))
    chunk = draw(st.integers(1, 8))
    seqlen = draw(st.integers(1, 24))
    divisor = draw(st.sampled_from([2, 4]))
    if kernel:
        assume(batch * heads * -(-seqlen // chunk) <= 6)
        state_dim, value_dim = draw(st.sampled_from([16, 32])), 16
    else:
        state_dim, value_dim = divisor * draw(st.integers(1, 8)), draw(st.integers(1, 16))
    return CaseSpec(batch=batch, seqlen=seqlen, heads=heads, groups=groups, state_dim=state_dim,
                    value_dim=value_dim, rank=rank, chunk_size=chunk, reduce_o=draw(st.booleans()),
                    has_z=draw(st.booleans()), has_d=draw(st.booleans()),
                    formula=draw(st.sampled_from(["seed", "realistic"])),
                    dtype=draw(st.sampled_from(["bfloat16", "float16"])), seed=draw(st.integers(0, 10 ** 6)),
                    rotary_dim_divisor=divisor)



#: the branch an optional input needs
_BRANCH_OF = {"mimo_o": {"reduce_o": True}, "z": {"has_z": True}, "mimo_z": {"has_z": True}, "d": {"has_d": True}}


def with_input(spec: CaseSpec, name: str) -> CaseSpec:
    """``spec`` with the branch that makes input ``name`` present switched on."""
    return spec.replace(**_BRANCH_OF.get(name, {}))


@st.composite
def injections(draw, inputs, name):
    """(input name, index, value): one non-finite value at one element of input ``name``."""
    index = tuple(draw(st.integers(0, s - 1)) for s in inputs[name].shape)
    return name, index, draw(st.sampled_from(NONFINITE))



def _assert_pattern(out, expected, label):
    for name in OUTPUT_NAMES:
        got, want = getattr(out, name), expected[name]
        assert (got is None) == (want is None), (label, name)
        if got is None:
            continue
        mask = nf.nonfinite_mask(got).cpu()
        missing = int((want & ~mask).sum())
        extra = int((mask & ~want).sum())
        assert missing == 0 and extra == 0, (
            f"{label}: {name}: {missing} predicted non-finite element(s) are finite, {extra} unpredicted "
            f"non-finite element(s) (predicted {int(want.sum())} of {want.numel()})")


# ---------------------------------------------------------------------------------------------------- reference
def _reference_pattern(profile_name: str, examples: int):
    counter = f"nonfinite_reference_vs_rules[{profile_name}]"

    @pytest.mark.parametrize("name", INPUT_NAMES)
    @profile(profile_name, examples)
    @given(data=st.data(), spec=specs())
    def check(data, spec, name):
        spec = with_input(spec, name)
        policy = data.draw(policies(spec.dtype), label="policy")
        x = make_inputs(spec)
        name, index, value = data.draw(injections(x, name), label="injection")
        note(f"{spec.case_id}: {name}{list(index)} = {value}")
        COUNTS[counter] += 1
        COUNTS[f"{counter} {name}"] += 1
        y = nf.with_value(x, name, index, value)
        out = _run(stage1_reference.mamba_mimo_bwd_fwd, y, policy=policy)
        _assert_pattern(out, nf.predict_nonfinite_outputs(y, name, index, value), f"{name}{list(index)}={value}")

    return check


# per input: 17 inputs x examples
test_nonfinite_reference_follows_the_rules = _reference_pattern("fast", 9)
test_nonfinite_reference_follows_the_rules_slow = pytest.mark.slow(_reference_pattern("slow", 150))


@pytest.mark.parametrize("name", INPUT_NAMES)
def test_nonfinite_in_every_input_follows_the_rules(name):
    # every input, at its first, middle and last element, NaN, +Inf and -Inf, on a case with every branch and a tail
    spec = CaseSpec(batch=2, seqlen=11, heads=2, groups=1, state_dim=16, value_dim=8, rank=3, chunk_size=4,
                    has_z=True, has_d=True)
    x = make_inputs(spec)
    shape = x[name].shape
    for flat in (0, x[name].numel() // 2, x[name].numel() - 1):
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))
        for value in NONFINITE:
            y = nf.with_value(x, name, index, value)
            COUNTS["nonfinite_reference_vs_rules[enumerated]"] += 1
            out = _run(stage1_reference.mamba_mimo_bwd_fwd, y, policy="upstream_sm90")
            _assert_pattern(out, nf.predict_nonfinite_outputs(y, name, index, value), f"{name}{list(index)}={value}")


# ---------------------------------------------------------------------------------------------------- kernels
def _kernel_pattern(profile_name: str, examples: int):
    counter = f"nonfinite_kernels_vs_reference[{profile_name}]"

    @needs_kernels
    @pytest.mark.filterwarnings("ignore::RuntimeWarning")
    @profile(profile_name, examples)
    @pytest.mark.parametrize("name", INPUT_NAMES if profile_name == "slow" else [None])
    @given(data=st.data(), spec=specs(kernel=True), drawn=st.sampled_from(INPUT_NAMES))
    def check(data, spec, drawn, name):
        name = name or drawn  # fast: a drawn input; slow: every input in turn
        spec = with_input(spec, name)
        policy = data.draw(policies(spec.dtype, kernel=True), label="policy")
        x = make_inputs(spec)
        name, index, value = data.draw(injections(x, name), label="injection")
        note(f"{spec.case_id}: {name}{list(index)} = {value}")
        COUNTS[counter] += 1
        y = nf.with_value(x, name, index, value)
        ref = _run(stage1_reference.mamba_mimo_bwd_fwd, y, policy=policy)
        got = _run(KERNELS.mamba_mimo_bwd_fwd, y, policy=policy)
        mismatches = nf.pattern_mismatches(got, ref, exact=True)
        assert all(not m for m in mismatches.values()), f"kernel vs reference class mismatches: {mismatches}"
        _assert_pattern(got, nf.predict_nonfinite_outputs(y, name, index, value), "kernels")

    return check


test_nonfinite_kernels_match_reference = _kernel_pattern("fast", 4)
test_nonfinite_kernels_match_reference_slow = pytest.mark.slow(_kernel_pattern("slow", 5))  # x 17 inputs


# ---------------------------------------------------------------------------------------------------- first stage
FIRST_SPEC = CaseSpec(seqlen=10, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True)
#: where a NaN at (an interior element of) each input first shows in the record, in pipeline order
FIRST_STAGE = {
    "dout": "dphio", "q": "q_biased", "k": "k_biased", "v": "psiv", "q_bias": "q_biased", "k_bias": "k_biased",
    "mimo_v": "psiv", "mimo_o": "dphio", "z": "gate", "mimo_z": "gate", "angles": "q_rot", "da_cs": "inter",
    "da_cs_rev": "k_state", "dt": "gamma", "trap": "gamma", "d": "out", "segsum": "causal_scores",
}


def _interior_index(name, x):
    index = [s // 2 for s in x[name].shape]
    if name == "segsum":  # strictly below the diagonal of a full chunk, so that it is used
        index[-2], index[-1] = 2, 1
    if name == "angles":
        index[-1] = 0
    if name == "da_cs":  # not the last token of a chunk (that one also decays the state: see below)
        index[-1] = 1
    return tuple(index)


@pytest.mark.parametrize("name", INPUT_NAMES)
def test_first_nonfinite_stage_of_a_nan_in_each_input(name):
    x = make_inputs(FIRST_SPEC)
    y = nf.with_value(x, name, _interior_index(name, x), float("nan"))
    record = {}
    out = _run(stage1_reference.mamba_mimo_bwd_fwd, y, policy="upstream_sm90", record=record)
    first = nf.first_nonfinite(record, out)
    COUNTS["first_nonfinite_stage[enumerated]"] += 1
    assert first is not None and first.stage == FIRST_STAGE[name], (name, first)
    assert first.kind == "nan"


def test_first_nonfinite_stage_state_before_inter_for_a_chunk_end_decay():
    x = make_inputs(FIRST_SPEC)
    y = nf.with_value(x, "da_cs", (0, 0, FIRST_SPEC.chunk_size - 1), float("nan"))  # decay of chunk 0
    assert nf.locate_nonfinite(y, "upstream_sm90").stage == "state"


@needs_kernels
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_kernel_records_locate_the_same_first_stage():
    x = make_inputs(FIRST_SPEC)
    for name in ("q", "v", "dt", "segsum", "mimo_o"):
        y = nf.with_value(x, name, _interior_index(name, x), float("nan"))
        record = {}
        out = _run(KERNELS.mamba_mimo_bwd_fwd, y, policy="upstream_sm90", record=record)
        COUNTS["first_nonfinite_stage[kernels]"] += 1
        assert nf.first_nonfinite_stage(record, out) == FIRST_STAGE[name], name


# ---------------------------------------------------------------------------------------------------- overflow
OVERFLOW_SPEC = CaseSpec(seqlen=10, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True,
                         dtype="float16")
FP16 = mn.presets.get("upstream_sm90_fp16")
FP32_AT_FP16 = mn.presets.get("fp32").replace(lp_dtype="float16")


def _scaled(**factors):
    x = make_inputs(OVERFLOW_SPEC)
    for name, factor in factors.items():
        x[name] = (x[name].float() * factor).to(x[name].dtype)
    assert not nf.nonfinite_inputs(x)  # the inputs themselves are finite: every Inf below is an overflow
    return x


#: (label, scaled inputs, policy, expected first stage): FP16 overflow (max 65504) at one rounding site
OVERFLOWS = [
    ("psiv", dict(mimo_v=4e3, v=30), FP16, "psiv"),
    ("psiv_switch_off", dict(mimo_v=4e3, v=30), FP16.replace(psiv=False), "state_operand"),
    ("state_output_store", dict(mimo_v=4e3, v=30), FP32_AT_FP16, "output.states"),
    ("qk_dot", dict(q=100, k=100), FP16, "qk_dot"),
    ("qk_dot_output_store", dict(q=100, k=100), FP32_AT_FP16, "output.qk_dot"),
    ("dphio", dict(dout=3e3, mimo_o=1e3), FP16, "dphio"),
    ("dz_output_store", dict(dout=3e3, mimo_o=1e3), FP32_AT_FP16, "output.dz"),
]


@pytest.mark.parametrize("label, factors, policy, stage", OVERFLOWS, ids=[o[0] for o in OVERFLOWS])
def test_fp16_overflow_site_is_located_in_the_reference(label, factors, policy, stage):
    x = _scaled(**factors)
    record = {}
    out = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy, record=record)
    first = nf.first_nonfinite(record, out)
    COUNTS["fp16_overflow[reference]"] += 1
    assert first is not None and first.stage == stage, (label, first)
    assert first.kind in ("+inf", "-inf") and first.nan == 0
    if first.switch not in (None, "round_outputs"):
        assert policy.get(first.switch)  # the site's switch is on in this policy


@needs_kernels
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("label, factors, policy, stage", OVERFLOWS[::2] + OVERFLOWS[1:2],
                         ids=[o[0] for o in OVERFLOWS[::2] + OVERFLOWS[1:2]])
def test_fp16_overflow_kernels_agree_with_the_reference(label, factors, policy, stage):
    x = _scaled(**factors)
    rk = {}
    got = _run(KERNELS.mamba_mimo_bwd_fwd, x, policy=policy, record=rk)
    ref = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy)
    COUNTS["fp16_overflow[kernels]"] += 1
    mismatches = nf.pattern_mismatches(got, ref, exact=True)
    assert all(not m for m in mismatches.values()), (label, mismatches)
    assert nf.first_nonfinite_stage(rk, got) == stage


def test_nonfinite_switches_names_the_overflowing_site():
    x = _scaled(mimo_v=4e3, v=30)
    base = nf.locate_nonfinite(x, FP16)
    moved = nf.nonfinite_switches(x, FP16)
    assert base.stage == "psiv"
    # turning psiv off moves the overflow to a later site; no other switch removes or moves it
    assert moved["psiv"] is not None and moved["psiv"].stage != "psiv"
    assert nf.PIPELINE.index(moved["psiv"].stage) > nf.PIPELINE.index("psiv")
    assert all(v is not None and v.stage == "psiv" for k, v in moved.items() if k != "psiv")


def test_overflow_is_reported_by_drift_as_nan_not_as_a_crash():
    from mimo_numerics import drift

    x = _scaled(mimo_v=4e3, v=30)
    runs = {"fp64": drift.reference_run(x, mn.presets.get("fp64").replace(lp_dtype="float16")),
            "fp16": drift.reference_run(x, FP16)}
    table = drift.stage_drift(runs, "fp64", lp_dtype="float16")
    rows = {r.stage: r for r in table.rows}
    assert not math.isfinite(rows["psiv"].rel_rms)
    # stages before the site are unaffected: q_biased is one fp16 rounding of q + bias (a structural bound, not a
    # tolerance: RN to fp16 errs by at most 2^-11 relative per element, so by at most 2^-11 in rel RMS; 2^-10 leaves
    # room for the FP32 sum's own rounding)
    assert rows["q_biased"].rel_rms <= 2.0 ** -10


# ---------------------------------------------------------------------------------------------------- the module
def test_first_nonfinite_orders_by_pipeline_not_by_dict_order():
    record = {"out": torch.tensor([1.0, float("inf")]), "psiv": torch.tensor([[0.0, float("nan")]]),
              "q_biased": torch.zeros(3), "custom_stage": torch.tensor([float("-inf")])}
    first = nf.first_nonfinite(record)
    assert first.stage == "psiv" and first.index == (0, 1) and first.kind == "nan" and first.switch == "psiv"
    assert [s.stage for s in nf.nonfinite_stages(record)] == ["psiv", "out", "custom_stage"]
    assert nf.first_nonfinite_stage({"q_biased": torch.zeros(2)}) is None
    outputs = {"dmimo_o": None, "states": torch.zeros(2), "dz": torch.tensor([float("-inf")]), "dmimo_z": None,
               "qk_dot": torch.zeros(1)}
    only_out = nf.first_nonfinite(None, outputs)
    assert only_out.stage == "output.dz" and only_out.kind == "-inf" and only_out.switch == "round_outputs"
    assert "1/1 non-finite" in only_out.describe()


def test_pipeline_and_sites_match_the_reference_record():
    from mimo_numerics import drift

    assert nf.PIPELINE == drift.STAGES
    assert set(nf.STAGE_SWITCH) == set(nf.PIPELINE)
    assert {v for v in nf.STAGE_SWITCH.values() if v} <= set(SWITCHES) | {"round_outputs"}
    record = {}
    _run(stage1_reference.mamba_mimo_bwd_fwd, make_inputs(FIRST_SPEC), policy="upstream_sm90", record=record)
    assert list(record) == [s for s in nf.PIPELINE if s in record]  # recorded in pipeline order, every name known
    assert set(record) == {s for s in nf.PIPELINE if not s.startswith(nf.OUTPUT_PREFIX)}


@pytest.mark.parametrize("op", registry.OPERATORS)
def test_every_operators_pipeline_and_sites_match_its_reference_record(op):
    from mimo_numerics import drift

    assert nf.pipeline(op) == drift.pipeline(op)
    switches = nf.stage_switches(op)
    assert set(switches) == set(nf.pipeline(op))
    assert {v for v in switches.values() if v} <= set(registry.site_table(op)) | {"round_outputs"}
    assert {s for s, v in switches.items() if v == "round_outputs"} == {
        nf.OUTPUT_PREFIX + o for o in _operator.get(op).lp_outputs}
    record = {}
    _operator.get(op).run_reference(_operator.get(op).draw(FIRST_SPEC), "upstream_sm90", record=record)
    assert list(record) == [s for s in nf.pipeline(op) if s in record]
    assert set(record) == {s for s in nf.pipeline(op) if not s.startswith(nf.OUTPUT_PREFIX)}


#: Where a NaN at (an interior element of) an input of the forward and of stage 2 first shows, in pipeline order:
#: the first stage (``ops/<op>/spec.py``) whose formula reads that input.
FIRST_STAGE_OF = {
    "mamba_mimo_fwd": {
        "q": "q_biased", "k": "k_biased", "v": "psiv", "q_bias": "q_biased", "k_bias": "k_biased", "mimo_v": "psiv",
        "mimo_o": "phi_gate", "z": "gate", "d": "d_term", "mimo_z": "gate", "angles": "q_rot", "da_cs": "inter",
        "da_cs_rev": "k_state", "dt": "gamma", "trap": "gamma", "segsum": "causal_scores"},
    "mamba_mimo_bwd_bwd": {
        "dout": "dphio", "q": "q_biased", "k": "k_biased", "v": "dd_terms", "q_bias": "q_biased",
        "k_bias": "k_biased", "mimo_v": "dd_terms", "mimo_o": "dphio", "states": "dda_terms", "z": "gate",
        "mimo_z": "gate", "angles": "q_rot", "da_cs": "dphio_scaled", "da_cs_rev": "dpsiv_inter", "dt": "gamma",
        "trap": "gamma", "d": "dpsiv_accum", "qk_dot": "dpsiv_accum", "segsum": "lkq_masked"},
}


@pytest.mark.parametrize("op, name", [(op, name) for op, table in FIRST_STAGE_OF.items() for name in table])
def test_first_nonfinite_stage_of_a_nan_in_the_forward_and_stage_2(op, name):
    x = _operator.get(op).draw(FIRST_SPEC)
    y = nf.with_value(x, name, _interior_index(name, x), float("nan"), op=op)
    assert nf.nonfinite_inputs(y, op=op) == {name: 1}
    first = nf.locate_nonfinite(y, "upstream_sm90", op=op)
    assert first is not None and first.stage == FIRST_STAGE_OF[op][name] and first.kind == "nan", (name, first)
    assert first.switch == _operator.get(op).stage(first.stage).site


@pytest.mark.parametrize("op, moved_to", [("mamba_mimo_fwd", "state_operand"), ("mamba_mimo_bwd_bwd", None)])
def test_fp16_overflow_of_psiv_in_the_forward_and_stage_2(op, moved_to):
    """v·Ψ above the FP16 range overflows at the ``psiv`` rounding of both; without it the forward's state still
    overflows at its lp operand, while stage 2 keeps ΨV in FP32 and stays finite."""
    x = _operator.get(op).draw(OVERFLOW_SPEC)
    for name, factor in dict(mimo_v=4e3, v=30).items():
        x[name] = (x[name].float() * factor).to(x[name].dtype)
    assert not nf.nonfinite_inputs(x, op=op)
    base = nf.locate_nonfinite(x, FP16, op=op)
    assert base.stage == "psiv" and base.switch == "psiv" and base.kind in ("+inf", "-inf") and base.nan == 0
    moved = nf.nonfinite_switches(x, FP16, op=op)
    assert (moved["psiv"] and moved["psiv"].stage) == moved_to
    assert all(v is not None and v.stage == "psiv" for k, v in moved.items() if k != "psiv")


def test_propagation_rules_exist_for_stage_1_only():
    x = _operator.get("mamba_mimo_fwd").draw(FIRST_SPEC)
    with pytest.raises(ValueError, match="mamba_mimo_fwd has no non-finite propagation rules"):
        nf.predict_nan_outputs(x, "v", (0, 0, 0, 0), op="mamba_mimo_fwd")
    assert nf.EXP_ONLY_INPUTS == ("da_cs", "da_cs_rev", "segsum") and nf.SIGMOID_ONLY_INPUTS == ("trap",)
    with pytest.raises(ValueError, match="unknown output"):
        nf.first_nonfinite(None, {"dz": torch.zeros(1)}, op="mamba_mimo_fwd")
    only_o = nf.first_nonfinite(None, torch.tensor([float("inf")]), op="mamba_mimo_fwd")  # the bare output tensor
    assert only_o.stage == "output.o" and only_o.switch == "round_outputs"


def test_value_class_and_errors():
    t = torch.tensor([0.0, float("nan"), float("inf"), float("-inf"), -1.0], dtype=torch.bfloat16)
    assert nf.value_class(t).tolist() == [0, 1, 2, 3, 0]
    assert nf.value_class(torch.arange(3)).tolist() == [0, 0, 0]
    with pytest.raises(TypeError):
        nf.value_class([1.0])
    with pytest.raises(TypeError, match="record"):
        nf.first_nonfinite({"q_biased": [1.0]})
    with pytest.raises(ValueError, match="unknown output"):
        nf.first_nonfinite(None, {"dq": torch.zeros(1)})
    with pytest.raises(ValueError, match="NaN, \\+Inf or -Inf"):
        nf.predict_nonfinite_outputs(make_inputs(FIRST_SPEC), "v", (0, 0, 0, 0), 1.0)
    with pytest.raises(ValueError, match="unknown input"):
        nf.predict_nan_outputs(make_inputs(FIRST_SPEC), "w", (0,))
    assert nf.nonfinite_inputs(nf.with_value(make_inputs(FIRST_SPEC), "v", (0, 1, 0, 2), float("nan"))) == {"v": 1}


# ---------------------------------------------------------------------------------------------------- the oracle
def test_oracle_is_not_a_nonfinite_reference():
    # documented (docs/nonfinite.md): its token-pair weights multiply exact zeros by every token's values, so a NaN
    # in v at chunk 1 reaches states[0] and states[1] in the oracle, but only states[c > 1] in the reference
    x = make_inputs(FIRST_SPEC)
    y = nf.with_value(x, "v", (0, 5, 0, 3), float("nan"))
    ref = _run(stage1_reference.mamba_mimo_bwd_fwd, y, policy="fp64")
    orc = _run(stage1_oracle.mamba_mimo_bwd_fwd_oracle, y)
    assert torch.isfinite(ref.states[:, :, :2]).all() and not torch.isfinite(ref.states[:, :, 2:]).all()
    assert not torch.isfinite(orc.states[:, :, :2]).all()


# ---------------------------------------------------------------------------------------------------- GPU
GPU_SPEC = CaseSpec(batch=2, seqlen=40, heads=2, groups=1, state_dim=64, value_dim=64, rank=4, chunk_size=16,
                    has_z=True, has_d=True)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["reference", "kernels"])
@pytest.mark.parametrize("name", INPUT_NAMES)
def test_gpu_nonfinite_patterns_match_cpu_reference(backend, name):
    if backend == "kernels" and KERNELS is None:
        pytest.skip("triton is not installed")
    x = make_inputs(GPU_SPEC)
    if x[name] is None:
        pytest.skip(f"{name} is absent in this case")
    fn = stage1_reference.mamba_mimo_bwd_fwd if backend == "reference" else KERNELS.mamba_mimo_bwd_fwd
    for value in NONFINITE:
        index = tuple(s // 2 for s in x[name].shape)
        y = nf.with_value(x, name, index, value)
        y_gpu = {n: (t.to("cuda") if isinstance(t, torch.Tensor) else t) for n, t in y.items()}
        want = _run(stage1_reference.mamba_mimo_bwd_fwd, y, policy="upstream_sm90")
        got = _run(fn, y_gpu, policy="upstream_sm90")
        mismatches = nf.pattern_mismatches({n: (None if t is None else t.cpu()) for n, t in got._asdict().items()},
                                           want, exact=True)
        assert all(not m for m in mismatches.values()), (backend, name, value, mismatches)
