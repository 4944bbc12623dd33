"""The FP64 oracle of the forward kernel (mamba_mimo_fwd): against the independent FP64 model of the whole op, against
the golden H200 forward output, its causality, layout and input validation."""

import pytest
import torch

from mamba3_mimo_support import GOLDEN_NAMES, load_golden_full_op
from mimo_numerics import tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import cases
from mimo_numerics.studies import measure
from mimo_numerics.ops.mamba3_mimo.preprocess import angle_cumsum, dacs_segsum
from mimo_numerics.ops.mamba_mimo_fwd.oracle import mamba_mimo_fwd_oracle
from mimo_numerics.ops.mamba_mimo_fwd.validation import INPUT_NAMES


def _fwd_args(x, chunk):
    """The 16 tensors of mamba_mimo_forward by name, from drawn raw inputs and the float64 preprocessing."""
    da_cs, da_cs_rev, segsum = dacs_segsum(x["ADT"], chunk, math_dtype=torch.float64)
    angles = angle_cumsum(x["Angles"], x["DT"], chunk, math_dtype=torch.float64)
    return {"q": x["Q"], "k": x["K"], "v": x["V"], "q_bias": x["Q_bias"], "k_bias": x["K_bias"],
            "mimo_v": x["MIMO_V"], "mimo_o": x["MIMO_Out"], "z": x["Z"], "d": x["D"], "mimo_z": x["MIMO_Z"],
            "angles": angles, "da_cs": da_cs, "da_cs_rev": da_cs_rev, "dt": x["DT"], "trap": x["Trap"],
            "segsum": segsum}


def _run(args, chunk, divisor=4):
    return mamba_mimo_fwd_oracle(*[args[n] for n in INPUT_NAMES], chunk_size=chunk, rotary_dim_divisor=divisor)


@pytest.mark.parametrize("spec", cases.ORACLE_GRID, ids=cases.case_id)
def test_fwd_oracle_matches_the_fp64_model(spec):
    value = measure.fwd_oracle_vs_model(cases.make_op_inputs(spec), spec.chunk_size, spec.rotary_dim_divisor)
    assert value <= tolerances.get("fwd_oracle_vs_fp64_model_rel_rms")


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_fwd_oracle_on_golden_pre_matches_upstream_forward(name):
    case = load_golden_full_op()[name]
    got, want = measure.fwd_oracle_on_golden_pre(case), case["fwd"]["o"]
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert rel_rms(want, got) <= tolerances.get("golden_full_op_out_rel_rms")


@pytest.mark.parametrize("spec", [cases.ORACLE_GRID[1], cases.ORACLE_GRID[2]], ids=cases.case_id)
def test_fwd_oracle_output_layout(spec):
    x = cases.make_op_inputs(spec)
    out = _run(_fwd_args(x, spec.chunk_size), spec.chunk_size)
    B, S, H, P, R = spec.batch, spec.seqlen, spec.heads, spec.value_dim, spec.rank
    assert out.dtype == torch.float64 and torch.isfinite(out).all()
    assert out.shape == ((B, S, H, P) if spec.reduce_o else (B, S, R, H, P))


@pytest.mark.parametrize("spec", [cases.ORACLE_GRID[1], cases.ORACLE_GRID[6]], ids=cases.case_id)
def test_fwd_oracle_is_causal(spec):
    """Outputs up to token t0 do not move when every input after t0 changes (the tail chunk included)."""
    x, t0 = cases.make_op_inputs(spec), spec.seqlen // 2
    base = _run(_fwd_args(x, spec.chunk_size), spec.chunk_size)
    later = dict(x)
    for name, seq_dim in (("Q", 1), ("K", 1), ("V", 1), ("Z", 1), ("Angles", 1), ("DT", 2), ("ADT", 2),
                          ("Trap", 2)):
        if x[name] is not None:
            t = x[name].clone()
            t.narrow(seq_dim, t0 + 1, spec.seqlen - t0 - 1).mul_(-1.5)
            later[name] = t
    moved = _run(_fwd_args(later, spec.chunk_size), spec.chunk_size)
    assert torch.equal(moved[:, :t0 + 1], base[:, :t0 + 1])
    assert not torch.equal(moved[:, t0 + 1:], base[:, t0 + 1:])


_SPEC = cases.small_case(seqlen=10, heads=2, groups=1, state_dim=32, value_dim=8, rank=2, chunk_size=4)


def _bad(**changes):
    args = _fwd_args(cases.make_op_inputs(_SPEC), _SPEC.chunk_size)
    args.update(changes)
    return args


def _swapped():
    args = _bad()
    args["d"], args["mimo_z"] = args["mimo_z"], args["d"]
    return args


@pytest.mark.parametrize("make, kwargs, error, match", [
    (_swapped, {}, ValueError, r"^(d|mimo_z) must have shape .*z, d, mimo_z"),
    (lambda: dict(_bad(z=None)), {}, ValueError, "z and mimo_z"),
    (lambda: dict(_bad(mimo_z=None)), {}, ValueError, "z and mimo_z"),
    (lambda: _bad(q=None), {}, TypeError, "q is required"),
    (lambda: _bad(k=_bad()["k"].float()), {}, TypeError, "^k must have dtype"),
    (lambda: _bad(q_bias=_bad()["q_bias"].half()), {}, TypeError, "^q_bias"),
    (lambda: _bad(segsum=_bad()["segsum"][:, :, :1]), {}, ValueError, "^segsum must have shape"),
    (lambda: _bad(angles=_bad()["angles"][..., :4]), {}, ValueError, "^angles must have shape"),
    (lambda: _bad(trap=_bad()["trap"].float()), {}, TypeError, "^trap"),
    (lambda: _bad(dt=_bad()["dt"][:, :, :5]), {}, ValueError, "^dt must have shape"),
    (lambda: _bad(mimo_v=_bad()["mimo_v"].numpy()), {}, TypeError, "^mimo_v must be a torch.Tensor"),
    (lambda: _bad(), {"chunk_size": 4.0}, TypeError, "chunk_size"),
    (lambda: _bad(), {"rotary_dim_divisor": 3}, ValueError, "rotary_dim_divisor"),
    (lambda: _bad(q=torch.zeros(1, 10, 2, 4, 32, dtype=torch.bfloat16)), {}, ValueError, "H % G must be 0"),
], ids=range(14))
def test_fwd_oracle_rejects_bad_inputs(make, kwargs, error, match):
    args = make()
    with pytest.raises(error, match=match):
        mamba_mimo_fwd_oracle(*[args[n] for n in INPUT_NAMES], **{"chunk_size": 4, **kwargs})
