"""The FP64 oracle of stage 2 (``mamba_mimo_bwd_bwd``): against the real upstream kernel, its structure, bad inputs.

The golden comparison feeds the oracle upstream's own stage-2 inputs (the raw inputs, ``pre`` and the recorded
stage-1 ``states``/``qk_dot``) and compares every raw output with what the kernel wrote: the differences are the
kernel's bf16 roundings, so they must be at bf16 level (``tolerances.py``), which a wrong definition is not
(``test_bwd_bwd_golden_gate_rejects_wrong_stage2_inputs``).
"""

import hashlib

import pytest
import torch

import bwd_bwd_support as support
from mimo_numerics import tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_bwd.oracle import (
    INPUT_NAMES, OUTPUT_NAMES, mamba_mimo_bwd_bwd_abs_terms, mamba_mimo_bwd_bwd_oracle)

NAMES = support.case_names()
REL_GATED = tuple(o for o in OUTPUT_NAMES if o != "dD")


def _golden_run(name):
    case = support.load_full_op()[name]
    args = support.stage2_args(case["inputs"], case["pre"], case["bwd_fwd"])
    return case, args, support.stage2_kwargs(case["inputs"])


@pytest.fixture(scope="module")
def oracle_runs():
    runs = {}
    for name in NAMES:
        case, args, kwargs = _golden_run(name)
        runs[name] = (case, mamba_mimo_bwd_bwd_oracle(*args, **kwargs), mamba_mimo_bwd_bwd_abs_terms(*args, **kwargs))
    return runs


def test_golden_full_op_file_is_the_recorded_one():
    assert hashlib.sha256(support.GOLDEN_FULL_OP.read_bytes()).hexdigest() == support.GOLDEN_FULL_OP_SHA256
    assert len(NAMES) == 7


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("output", REL_GATED)
def test_bwd_bwd_oracle_matches_upstream(oracle_runs, name, output):
    case, got, _ = oracle_runs[name]
    want = case["bwd_bwd"][output]
    assert got[output].dtype == torch.float64 and got[output].shape == want.shape
    assert rel_rms(want, got[output]) <= tolerances.get("bwd_bwd_oracle_vs_upstream_rel_rms")


@pytest.mark.parametrize("name", NAMES)
def test_bwd_bwd_oracle_dD_matches_upstream_against_its_terms(oracle_runs, name):
    case, got, terms = oracle_runs[name]
    want = case["bwd_bwd"]["dD"]
    if want is None:
        assert got["dD"] is None and terms["dD"] is None
        return
    ratio = (want.double() - got["dD"]).abs() / terms["dD"]
    assert ratio.max().item() <= tolerances.get("bwd_bwd_oracle_vs_upstream_dD_abs_terms")


@pytest.mark.parametrize("wrong", ["states_zero", "qk_dot_transposed", "da_cs_swapped", "trap_negated"])
def test_bwd_bwd_golden_gate_rejects_wrong_stage2_inputs(wrong):
    """The bf16-level gate separates the right function from plausible wrong ones (each breaks some outputs)."""
    case, args, kwargs = _golden_run("g_B1_S64_H2_N64_P64_R4_C16_zdo")
    args = dict(zip(INPUT_NAMES, args))
    if wrong == "states_zero":
        args["states"] = torch.zeros_like(args["states"])
    elif wrong == "qk_dot_transposed":
        args["qk_dot"] = args["qk_dot"].transpose(-1, -2).contiguous()
    elif wrong == "da_cs_swapped":
        args["da_cs"], args["da_cs_rev"] = args["da_cs_rev"], args["da_cs"]
    else:
        args["trap"] = -args["trap"]
    got = mamba_mimo_bwd_bwd_oracle(*args.values(), **kwargs)
    worst = max(rel_rms(case["bwd_bwd"][o], got[o]) for o in REL_GATED)
    assert worst > 5 * tolerances.get("bwd_bwd_oracle_vs_upstream_rel_rms")


def _small_inputs(seqlen=10, chunk_size=4, reduce_o=True, has_z=True, has_d=True, heads=2, groups=1, rank=2,
                  seed=0):
    """Random stage-2 inputs of a tiny case (float64 stage-1 intermediates drawn, not computed)."""
    gen = torch.Generator().manual_seed(seed)
    B, S, H, G, N, P, R, C = 1, seqlen, heads, groups, 8, 4, rank, chunk_size
    nc = -(-S // C)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "dout": rn(B, S, H, P) if reduce_o else rn(B, S, R, H, P), "q": rn(B, S, R, G, N), "k": rn(B, S, R, G, N),
        "v": rn(B, S, H, P), "q_bias": rn(H, R, N), "k_bias": rn(H, R, N), "mimo_v": rn(H, R, P),
        "mimo_o": rn(H, R, P) if reduce_o else None, "states": rn(B, H, nc, N, P),
        "z": rn(B, S, H, P) if has_z else None, "mimo_z": rn(H, R, P) if has_z else None,
        "angles": rn(B, S, H, N // 4), "da_cs": -rn(B, H, S).abs(), "da_cs_rev": -rn(B, H, S).abs(),
        "dt": rn(B, H, S).abs() / 10, "trap": rn(B, H, S), "d": rn(H) if has_d else None,
        "qk_dot": rn(B, H, S, R, R), "segsum": -rn(B, H, nc, C, C).abs(),
    }


def _run_small(inputs, chunk_size=4):
    return mamba_mimo_bwd_bwd_oracle(*(inputs[n] for n in INPUT_NAMES), chunk_size=chunk_size, rotary_dim_divisor=4)


@pytest.mark.parametrize("reduce_o,has_z,has_d", [(True, True, True), (False, False, False), (True, False, True)])
def test_bwd_bwd_oracle_output_layout_and_structure(reduce_o, has_z, has_d):
    inputs = _small_inputs(reduce_o=reduce_o, has_z=has_z, has_d=has_d)
    out = _run_small(inputs)
    B, S, H, N, P, R, C, nc = 1, 10, 2, 8, 4, 2, 4, 3
    shapes = {"dq": (B, S, R, H, N), "dk": (B, S, R, H, N), "dv": (B, S, H, P), "dmimo_v": (B, H, R, P),
              "dD": (B, H), "dangles": (B, S, H, N // 4), "dfactor": (B, H, S), "dgamma_diag": (B, H, S),
              "ddA": (B, H, S), "dSSdA": (B, H, nc, C, C), "ddA_cs_rev": (B, H, S), "ddA_cs": (B, H, S)}
    assert tuple(out) == OUTPUT_NAMES
    for name, value in out.items():
        if name == "dD" and not has_d:
            assert value is None
            continue
        assert value.shape == shapes[name] and value.dtype == torch.float64, name
        assert torch.isfinite(value).all(), name
    # ddA is one value per chunk and 0 on the last chunk (no later state); no later chunk reads the last state
    assert torch.equal(out["ddA"][..., 0:4], out["ddA"][..., 0:1].expand(-1, -1, 4))
    assert (out["ddA"][..., 8:] == 0).all() and (out["ddA_cs_rev"][..., 8:] == 0).all()
    # the tail chunk's padded rows and columns of dSSdA are 0
    assert (out["dSSdA"][:, :, 2, 2:] == 0).all() and (out["dSSdA"][:, :, 2, :, 2:] == 0).all()


def test_bwd_bwd_oracle_uses_states_and_qk_dot_only_where_the_kernel_does():
    inputs = _small_inputs()
    base = _run_small(inputs)
    states_changed = _run_small({**inputs, "states": inputs["states"] * 2})
    qk_changed = _run_small({**inputs, "qk_dot": inputs["qk_dot"] * 2})
    for name in OUTPUT_NAMES:
        uses_states = name in ("dq", "ddA", "ddA_cs", "dangles")
        uses_qk = name in ("dv", "dmimo_v", "dgamma_diag")
        assert torch.equal(base[name], states_changed[name]) != uses_states, name
        assert torch.equal(base[name], qk_changed[name]) != uses_qk, name


def test_bwd_bwd_oracle_is_linear_in_dout():
    inputs = _small_inputs()
    base = _run_small(inputs)
    doubled = _run_small({**inputs, "dout": 2 * inputs["dout"]})
    for name in OUTPUT_NAMES:
        assert torch.allclose(doubled[name], 2 * base[name], rtol=1e-12, atol=0), name


# ---- bad inputs ----

@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.update(states=None), TypeError, "states is required"),
    (lambda a: a.update(qk_dot=a["qk_dot"][..., :1]), ValueError, "qk_dot must have shape"),
    (lambda a: a.update(states=a["states"][:, :, :2]), ValueError, "states must have shape"),
    (lambda a: a.update(mimo_z=None), ValueError, "z and mimo_z"),
    (lambda a: a.update(segsum=a["segsum"].to(torch.int32)), TypeError, "segsum must have a real floating"),
    (lambda a: a.update(trap=a["trap"].numpy()), TypeError, "trap must be a torch.Tensor"),
    (lambda a: a.update(dout=a["dout"][:, :, None].expand(-1, -1, 2, -1, -1)), ValueError, "dout must have shape"),
    (lambda a: a.update(q=a["q"][..., 0]), ValueError, "q must have 5 dimensions"),
])
def test_bwd_bwd_oracle_rejects_bad_inputs(change, error, match):
    inputs = _small_inputs()
    change(inputs)
    with pytest.raises(error, match=match):
        _run_small(inputs)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"chunk_size": 0, "rotary_dim_divisor": 4}, ValueError, "chunk_size"),
    ({"chunk_size": 4.0, "rotary_dim_divisor": 4}, TypeError, "chunk_size must be an int"),
    ({"chunk_size": 4, "rotary_dim_divisor": 3}, ValueError, "rotary_dim_divisor"),
])
def test_bwd_bwd_oracle_rejects_bad_sizes(kwargs, error, match):
    inputs = _small_inputs()
    with pytest.raises(error, match=match):
        mamba_mimo_bwd_bwd_oracle(*(inputs[n] for n in INPUT_NAMES), **kwargs)


def test_bwd_bwd_oracle_rejects_heads_not_a_multiple_of_groups():
    inputs = _small_inputs(heads=3, groups=2)
    with pytest.raises(ValueError, match="H % G"):
        _run_small(inputs)


def test_bwd_bwd_oracle_with_a_tail_chunk_gives_the_gradients():
    """S % C != 0 (the kernel accepts tails; upstream's epilogue does not): the raw outputs that are gradients of the
    op's inputs (dq, dk summed over heads; dv; dmimo_v, dD summed over B) equal autograd of the FP64 forward."""
    import chain_support as chain

    inputs = chain.draw_inputs(chain.ChainCase(rank=2, state_dim=32, dtype="bfloat16", reduce_o=True, has_z=True,
                                               has_d=True, batch=2, seed=11))
    S = 10  # chunks of 4: 4 + 4 + a tail of 2
    for name in ("Q", "K", "V", "Z", "dout", "Angles"):
        inputs[name] = inputs[name][:, :S].contiguous()
    for name in ("ADT", "DT", "Trap"):
        inputs[name] = inputs[name][..., :S].contiguous()
    pre = chain.fp64_pre(inputs)
    stage1 = support.stage1_oracle_fp64(*support.stage1_args(inputs, pre), chunk_size=4, rotary_dim_divisor=4)
    got = mamba_mimo_bwd_bwd_oracle(*support.stage2_args(inputs, pre, stage1.as_dict()), chunk_size=4,
                                    rotary_dim_divisor=4)
    want = chain.autograd_fp64(inputs)
    pairs = {"dQ": got["dq"].sum(dim=3, keepdim=True), "dK": got["dk"].sum(dim=3, keepdim=True), "dV": got["dv"],
             "dMIMO_V": got["dmimo_v"].sum(dim=0), "dD": got["dD"].sum(dim=0)}
    for name, value in pairs.items():
        assert rel_rms(value, want[name]) <= tolerances.get("fp64_chain_vs_autograd_rel_rms"), name
