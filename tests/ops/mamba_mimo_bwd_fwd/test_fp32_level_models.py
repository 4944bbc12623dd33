"""The references under a tensor-core ``gemm_model`` (``mimo_numerics.tensor_core``), against the real upstream
kernels on an H200 (the golden files of tests/data), and the consumers that refuse the knob.

The H200 runs TileLang's ``wgmma`` GEMMs: with ``sm90_wgmma`` stage 1's reference must match upstream at least as
well as with FP32 GEMMs on every golden output, give more bit-identical outputs, make ``qk_dot`` (one GEMM then a
store) bit-identical everywhere, and tell Hopper's model from Ampere's (``sm80_mma``) on this data; the forward's
and stage 2's references, on upstream's recorded inputs of each kernel, within the measured margins.
"""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.reference import mamba_mimo_bwd_fwd
from mimo_numerics import golden_data

OUTPUTS = ("states", "qk_dot", "dz", "dmimo_o", "dmimo_z")
MODELS = ("fp32", "sm90_wgmma", "sm80_mma")


def _policy(lp, gemm_model):
    base = "upstream_sm90" if lp == torch.bfloat16 else "upstream_sm90_fp16"
    return mn.presets.get(base).replace(gemm_model=gemm_model)


@pytest.fixture(scope="module")
def seed_errors():
    """{(case, output): {model: rel RMS to upstream}} over the seed golden cases."""
    out = {}
    for name, (inputs, upstream) in golden.load_golden().items():
        runs = {m: mamba_mimo_bwd_fwd(**inputs, policy=_policy(inputs["q"].dtype, m)) for m in MODELS}
        for output in OUTPUTS:
            if upstream[output] is not None:
                out[name, output] = {m: rel_rms(getattr(r, output), upstream[output]) for m, r in runs.items()}
    return out


def test_wgmma_model_is_never_worse_than_fp32_gemms(seed_errors):
    limit = tolerances.get("golden_gemm_model_over_fp32_ratio_max")
    worse = {key: e for key, e in seed_errors.items() if e["sm90_wgmma"] > limit * e["fp32"]}
    assert not worse, f"sm90_wgmma further from the H200 than fp32 GEMMs: {worse}"


def test_wgmma_model_makes_more_outputs_bit_identical(seed_errors):
    exact = {m: {key for key, e in seed_errors.items() if e[m] == 0} for m in MODELS}
    assert exact["fp32"] <= exact["sm90_wgmma"], f"lost by the model: {exact['fp32'] - exact['sm90_wgmma']}"
    gained = exact["sm90_wgmma"] - exact["fp32"]
    assert len(gained) >= 3, f"only {sorted(gained)} became bit-identical"
    assert all(e["sm90_wgmma"] == 0 for (case, output), e in seed_errors.items() if output == "qk_dot")


def test_the_h200_data_tells_hopper_from_ampere(seed_errors):
    """Upstream ran on Hopper: sm90_wgmma matches outputs that sm80_mma (k8 halves, 24 bits) does not."""
    only_hopper = [key for key, e in seed_errors.items() if e["sm90_wgmma"] == 0 < e["sm80_mma"]]
    only_ampere = [key for key, e in seed_errors.items() if e["sm80_mma"] == 0 < e["sm90_wgmma"]]
    assert len(only_hopper) >= 2 and not only_ampere, (only_hopper, only_ampere)


def test_infer_policy_recovers_the_hopper_gemm_model():
    """With ``gemm_model`` among the searched fields, inference on H200 data picks Hopper's model, by a margin."""
    from mimo_numerics import inference

    cases = golden.load_golden()
    names = ["seed_gqa", "seed_shape_N128_P64_R8_C8", "seed_branch_ro0_z0_d1", "seed_tail_seed1"]
    assert "gemm_model" not in inference.searched_fields()  # searched on request only
    result = inference.infer_policy([cases[n][0] for n in names], [cases[n][1] for n in names], start="upstream_sm90",
                                    fields=inference.searched_fields() + ("gemm_model",), restarts=(), escapes=(),
                                    pair_moves=False)
    assert result.best.gemm_model == "sm90_wgmma"
    others = {c.label(): c.distance for c in result.neighbours if c.label().startswith("gemm_model=")}
    assert set(others) == {"gemm_model=fp32", "gemm_model=sm80_mma"}
    margin = tolerances.get("inference_gemm_model_margin_min")
    assert all(d >= margin * result.distance for d in others.values()), (result.distance, others)


REALISTIC = golden_data.load("realistic_outputs")["cases"]
#: the realistic cases whose modelled run takes over ~5 s on CPU (S >= 1024 or N = 128): marked slow
_LONG = {name for name, case in REALISTIC.items()
         if case["spec"]["seqlen"] >= 1024 or case["spec"]["state_dim"] >= 128}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _LONG else n
                                  for n in sorted(REALISTIC)])
def test_wgmma_model_on_realistic_cases(name):
    """qk_dot bit-identical to the H200 on the long realistic cases, every other output no further away."""
    case = REALISTIC[name]
    spec = CaseSpec.from_dict(case["spec"])
    x = make_inputs(spec)
    lp = x["q"].dtype
    runs = {m: mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=_policy(lp, m)) for m in ("fp32", "sm90_wgmma")}
    limit = tolerances.get("golden_gemm_model_over_fp32_ratio_max")
    for output, want in case["upstream"].items():
        if want is None:
            continue
        model, plain = (rel_rms(getattr(runs[m], output), want) for m in ("sm90_wgmma", "fp32"))
        if output == "qk_dot":
            assert torch.equal(runs["sm90_wgmma"].qk_dot, want)
        assert model <= limit * plain, (output, model, plain)


def test_fp32_gemm_model_keeps_the_cpu_path_bits():
    """gemm_model='fp32' is the reference as before (the CPU fast path); a model takes the generic path."""
    inputs, _ = golden.load_golden()["seed_gqa"]
    a = mamba_mimo_bwd_fwd(**inputs, policy="upstream_sm90")
    b = mamba_mimo_bwd_fwd(**inputs, policy=_policy(torch.bfloat16, "fp32"))
    assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in OUTPUTS if getattr(a, n) is not None)


WHOLE_OP = {**golden_data.load("full_op"), **golden_data.load("full_op_extra")}
#: whole-op cases with every kernel's recorded outputs; three (reduced + Z + D, not reduced, GQA) by default
_STAGED = sorted(n for n, c in WHOLE_OP.items() if all(k in c for k in ("pre", "fwd", "bwd_fwd", "bwd_bwd")))
_DEFAULT_STAGED = ("g_B1_S64_H2_N64_P64_R4_C16_zdo", "g_B1_S48_H2_N64_P64_R4_C16_nored_z",
                   "g_B2_S48_H4_G1_N64_P64_R4_C16_gqa")


@pytest.mark.parametrize("name", [n if n in _DEFAULT_STAGED else pytest.param(n, marks=pytest.mark.slow)
                                  for n in _STAGED])
def test_forward_and_stage2_under_the_model_on_whole_op_cases(name):
    """The forward (intra GEMM into inter, state update into h·decay) and stage 2 (nine GEMMs, three accumulating,
    dstates by mma.sync into D·decay) under sm90_wgmma, each on upstream's recorded inputs of that kernel: the
    forward's ``o`` no further from the H200 than with FP32 GEMMs, stage 2's outputs within the measured margin,
    and stage 2 bit-equal on more elements overall."""
    from mimo_numerics.ops.mamba3_mimo import chain
    from mimo_numerics.studies.golden_figures import STAGE2_OUTPUTS, bit_equal, errors

    case = WHOLE_OP[name]
    x = dict(case["inputs"])
    runs = {}
    for model in ("fp32", "sm90_wgmma"):
        policy = _policy(x["Q"].dtype, model)
        forward = {"o": chain.run_forward(x, case["pre"], policy)}
        stage2 = chain.run_stage2(x, case["pre"], case["bwd_fwd"], policy)
        runs[model] = (errors(forward, case["fwd"], ("o",)), errors(stage2, case["bwd_bwd"], STAGE2_OUTPUTS),
                       bit_equal(stage2, case["bwd_bwd"], STAGE2_OUTPUTS))
    (fwd_plain, s2_plain, be_plain), (fwd_model, s2_model, be_model) = runs["fp32"], runs["sm90_wgmma"]
    assert fwd_model["o"] <= tolerances.get("golden_gemm_model_over_fp32_ratio_max") * fwd_plain["o"]
    limit = tolerances.get("golden_stage2_gemm_model_over_fp32_ratio_max")
    worse = {o: (s2_model[o], s2_plain[o]) for o in s2_plain if s2_model[o] > limit * s2_plain[o]}
    assert not worse, worse
    assert sum(be_model.values()) >= sum(be_plain.values()), (be_model, be_plain)


def test_whole_op_runs_under_the_model():
    """The autograd function takes a tensor-core gemm_model through every reference (no refusal, finite)."""
    from mimo_numerics.ops.mamba3_mimo.runs import run_op

    case = WHOLE_OP["g_B1_S48_H2_N64_P64_R4_C16_nored_z"]
    got = run_op(dict(case["inputs"]), _policy(torch.bfloat16, "sm90_wgmma"))
    assert got["Out"] is not None and all(torch.isfinite(t.float()).all() for t in got.values() if t is not None)


def test_sequential_time_order_reproduces_upstreams_dmimo_o():
    """reduction_order='sequential_time' (dΦ as one FMA chain over t): dmimo_o bit-equal on more elements of every
    golden case, equal in value to upstream's on the cases without Z whose out is already bit-identical."""
    from mimo_numerics.metrics import bit_equal_fraction

    exact, fractions = [], {}
    for name, (inputs, upstream) in golden.load_golden().items():
        if upstream["dmimo_o"] is None:
            continue
        base = _policy(inputs["q"].dtype, "sm90_wgmma")
        runs = {order: mamba_mimo_bwd_fwd(**inputs, policy=base.replace(reduction_order=order)).dmimo_o
                for order in ("pairwise", "sequential_time")}
        fractions[name] = {o: bit_equal_fraction(r, upstream["dmimo_o"]) for o, r in runs.items()}
        if torch.equal(runs["sequential_time"], upstream["dmimo_o"]):
            exact.append(name)
    assert all(f["sequential_time"] >= f["pairwise"] for f in fractions.values()), fractions
    assert sum(f["sequential_time"] for f in fractions.values()) > sum(f["pairwise"] for f in fractions.values())
    assert len(exact) >= 4, exact


def test_sequential_time_dmimo_z_is_a_serial_sum_per_chunk():
    """dζ under 'sequential_time': each chunk's terms summed serially in FP32, the chunk sums added to the running
    total in order (checked against a float32 numpy loop over the recorded terms, at C = 64 where it differs from
    torch's order)."""
    import numpy as np

    spec = CaseSpec(batch=1, seqlen=150, heads=2, state_dim=16, value_dim=16, rank=2, chunk_size=64, has_z=True,
                    reduce_o=True)
    x = make_inputs(spec)
    record = {}
    policy = _policy(x["q"].dtype, "fp32").replace(reduction_order="sequential_time")
    got = mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy, record=record).dmimo_z
    terms = (record["dzz"] * x["z"].float().permute(0, 2, 1, 3)[:, :, :, None, :]).numpy()  # [B, H, S, R, P]
    total = np.zeros(terms.shape[:2] + terms.shape[3:], dtype=np.float32)
    for start in range(0, spec.seqlen, spec.chunk_size):
        part = terms[:, :, start].copy()
        for t in range(start + 1, min(start + spec.chunk_size, spec.seqlen)):
            part = part + terms[:, :, t]
        total = total + part
    assert torch.equal(got, torch.from_numpy(total))
    pairwise = mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy.replace(reduction_order="pairwise"))
    assert not torch.equal(pairwise.dmimo_z, got)  # the case tells the orders apart


def _refusals():
    """What refuses ``gemm_model`` (the decode step has no matrix-unit product and takes every value:
    ``tests/ops/mamba3_mimo/test_decode_fp32_level.py``)."""
    def kernel_config(operator):
        return lambda policy: kernels.operator_constexprs(policy, operator)

    return {
        "stage-1 kernels": kernel_config("mamba_mimo_bwd_fwd"),
        "forward kernels": kernel_config("mamba_mimo_fwd"),
        "stage-2 kernels": kernel_config("mamba_mimo_bwd_bwd"),
    }


@pytest.mark.parametrize("consumer", sorted(_refusals()))
def test_consumers_without_the_model_refuse_it(consumer):
    policy = mn.presets.get("upstream_sm90").replace(gemm_model="sm90_wgmma")
    with pytest.raises(NotImplementedError, match="gemm_model"):
        _refusals()[consumer](policy)


def test_consumers_without_upstreams_time_order_refuse_it():
    from mimo_numerics.ops.mamba3_mimo.chain import chain_kind
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd

    policy = mn.presets.get("upstream_sm90").replace(reduction_order="sequential_time")
    refusals = [lambda: mamba_mimo_bwd_bwd(*([None] * 19), policy=policy), lambda: chain_kind(policy),
                lambda: kernels.operator_constexprs(policy, "mamba_mimo_bwd_fwd")]
    for refuse in refusals:
        with pytest.raises(NotImplementedError, match="reduction_order"):
            refuse()
    with pytest.raises(ValueError, match="reduction_order"):
        policy.replace(math_dtype="float64")


def test_every_fp32_level_model_with_upstreams_time_order_on_the_seed_cases():
    """Stage 1 with every FP32-level model, ``reduction_order="sequential_time"`` and ``tilelang="0.1.15"`` on the
    15 seed golden cases (recorded with TileLang 0.1.15): every output bit-identical to the H200's. dζ per chunk is
    an FMA chain there (nvcc contracts ``dZetaZ *= z`` into the sum), over the even and the odd tokens apart with
    unreduced DOUT; the SiLU gate is ``fma(u/2, tanh(u/2), u/2)``; ``seed_shape_N64_P128_R4_C16``, whose two
    ``k_rot`` elements moved under the fast trig functions alone, is back in line through the rotation's
    contraction."""
    from mimo_numerics.policy import FP32_LEVEL_SM90

    for name, (inputs, upstream) in golden.load_golden().items():
        policy = _policy(inputs["q"].dtype, "fp32").replace(**FP32_LEVEL_SM90, reduction_order="sequential_time",
                                                            tilelang="0.1.15")
        run = mamba_mimo_bwd_fwd(**inputs, policy=policy)
        for output in OUTPUTS:
            if upstream[output] is not None:
                assert torch.equal(getattr(run, output), upstream[output]), (name, output)


def _whole_op_stage1_cases():
    """Stage 1's inputs (from upstream's recorded preprocessing) and recorded outputs of the whole-op cases with Z."""
    from mimo_numerics.ops.mamba3_mimo import golden as op_golden
    from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES

    for stored in op_golden.stored_cases("bwd_fwd", INPUT_NAMES):
        if stored.inputs["z"] is not None:
            yield stored.source, stored.inputs, op_golden.upstream_outputs(stored.source, "bwd_fwd")


def test_tilelang_018s_dzeta_order_on_the_whole_op_cases():
    """The whole-op golden data (TileLang 0.1.8, mamba-ssm's pin): stage 1 from upstream's recorded inputs with every
    FP32-level model and ``reduction_order="sequential_time"``: under the default ``tilelang="0.1.8"`` (reduced DOUT:
    the products rounded, then summed) ``dmimo_z`` is bit-identical on every bf16 case with Z, reduced or not;
    ``tilelang="0.1.15"`` (contracted) is not, on any reduced case. The fp16 case (its ``dz`` already differs in
    a few elements; ``dmimo_z`` 1.07e-6, 99.6 % bit-equal, measured 2026-12-04) within
    ``golden_stage1_fp32_level_rel_rms_max``."""
    from mimo_numerics.policy import FP32_LEVEL_SM90

    seen = {"bf16": 0, "fp16": 0, "reduced_015_differs": 0}
    for name, inputs, upstream in _whole_op_stage1_cases():
        base = _policy(inputs["q"].dtype, "fp32").replace(**FP32_LEVEL_SM90, reduction_order="sequential_time")
        got = {v: mamba_mimo_bwd_fwd(**inputs, policy=base.replace(tilelang=v)).dmimo_z for v in ("0.1.8", "0.1.15")}
        want = upstream["dmimo_z"]
        if inputs["q"].dtype == torch.bfloat16:
            assert torch.equal(got["0.1.8"], want), name
            seen["bf16"] += 1
        else:
            assert rel_rms(got["0.1.8"], want) <= tolerances.get("golden_stage1_fp32_level_rel_rms_max"), name
            seen["fp16"] += 1
        if inputs["mimo_o"] is not None and inputs["q"].dtype == torch.bfloat16:
            assert not torch.equal(got["0.1.15"], want), name
            seen["reduced_015_differs"] += 1
        else:
            assert (inputs["mimo_o"] is not None) or torch.equal(got["0.1.15"], got["0.1.8"]), name
    assert seen["bf16"] >= 8 and seen["fp16"] >= 1 and seen["reduced_015_differs"] >= 6, seen


@pytest.mark.parametrize("data, version", [("seed", "0.1.15"), ("whole_op", "0.1.8")])
def test_infer_policy_recovers_the_tilelang_version(data, version):
    """Issue 24, acceptance 3 for ``tilelang``: from the other version, with every FP32-level model and
    ``reduction_order="sequential_time"``, inference on upstream's stage-1 outputs of the bf16 cases with Z picks the
    version that recorded them (seed cases: TileLang 0.1.15, at distance 0; whole-op cases: 0.1.8); only ``dmimo_z``
    tells them apart, and it is exact under the right one (the tests above), so its neighbour is further."""
    from mimo_numerics import inference
    from mimo_numerics.policy import FP32_LEVEL_SM90

    if data == "seed":
        cases = [(i, o) for i, o in golden.load_golden().values()
                 if i["q"].dtype == torch.bfloat16 and i.get("z") is not None]
    else:
        cases = [(i, o) for _, i, o in _whole_op_stage1_cases() if i["q"].dtype == torch.bfloat16]
    other = "0.1.8" if version == "0.1.15" else "0.1.15"
    start = mn.presets.get("upstream_sm90").replace(**FP32_LEVEL_SM90, reduction_order="sequential_time",
                                                    tilelang=other)
    result = inference.infer_policy([c[0] for c in cases], [c[1] for c in cases], start=start,
                                    op="mamba_mimo_bwd_fwd", fields=("tilelang",), restarts=(), escapes=(),
                                    pair_moves=False)
    assert result.best.tilelang == version
    neighbour = {c.label(): c.distance for c in result.neighbours}[f"tilelang={other}"]
    assert neighbour > result.distance, (result.distance, neighbour)
    if data == "seed":
        assert result.distance == 0


def test_infer_policy_recovers_upstreams_time_order():
    """Issue 24, acceptance 3 for ``reduction_order``: with every other FP32-level model of the seed cases' setup
    (TileLang 0.1.15), inference on upstream's stage-1 outputs from ``"pairwise"`` picks ``"sequential_time"``, which
    reproduces every output (distance 0)."""
    from mimo_numerics import inference
    from mimo_numerics.policy import FP32_LEVEL_SM90

    cases = [(i, o) for i, o in golden.load_golden().values() if i["q"].dtype == torch.bfloat16]
    start = mn.presets.get("upstream_sm90").replace(**FP32_LEVEL_SM90, tilelang="0.1.15")
    result = inference.infer_policy([c[0] for c in cases], [c[1] for c in cases], start=start,
                                    op="mamba_mimo_bwd_fwd", fields=("reduction_order",), restarts=(), escapes=(),
                                    pair_moves=False)
    assert result.best.reduction_order == "sequential_time" and result.distance == 0
    assert {c.label(): c.distance for c in result.neighbours}["reduction_order=pairwise"] > 0
