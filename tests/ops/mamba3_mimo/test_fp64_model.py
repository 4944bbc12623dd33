"""The FP64 model of the whole op (mamba3_mimo_fp64) and its autograd gradients: against the golden H200 output and
gradients of upstream's op, the clamp's two backward modes, chunking, the dD diagnostic, input validation."""

import pytest
import torch

from mamba3_mimo_support import GOLDEN_NAMES, load_golden_full_op
from mimo_numerics import tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import cases
from mimo_numerics.studies import measure
from mimo_numerics.ops.mamba3_mimo.diagnostics import d_skip_terms
from mimo_numerics.ops.mamba3_mimo.fp64_model import INPUT_NAMES, mamba3_mimo_fp64

_SPECIAL_GRADIENTS = {"dAngles": "golden_full_op_dangles_rel_rms", "dD": "golden_full_op_dd_rel_rms"}


@pytest.fixture(scope="module")
def golden_runs():
    return {}


def _golden_run(golden_runs, name):
    if name not in golden_runs:
        golden_runs[name] = measure.model_output_and_grads(load_golden_full_op()[name])
    return golden_runs[name]


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_fp64_model_output_matches_upstream(golden_runs, name):
    want = load_golden_full_op()[name]["autograd"]["Out"]
    out, _ = _golden_run(golden_runs, name)
    assert out.dtype == torch.float64 and out.shape == want.shape
    assert rel_rms(want, out) <= tolerances.get("golden_full_op_out_rel_rms")


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_fp64_model_gradients_match_upstream(golden_runs, name):
    case = load_golden_full_op()[name]
    _, grads = _golden_run(golden_runs, name)
    present = {key for key, value in case["autograd"].items() if key != "Out" and value is not None}
    assert set(grads) == present
    for key, grad in grads.items():
        want = case["autograd"][key]
        assert grad.shape == want.shape, key
        bound = tolerances.get(_SPECIAL_GRADIENTS.get(key, "golden_full_op_grad_rel_rms"))
        assert rel_rms(want, grad) <= bound, key
    if "dD" in grads:
        assert measure.dd_error_over_abs_terms(case, grads["dD"]) <= tolerances.get("golden_full_op_dd_over_abs_terms")


def _leaves(x):
    return {n: (None if x[n] is None else x[n].detach().to(torch.float64).requires_grad_(True)) for n in INPUT_NAMES}


def _run(leaves, spec, **kwargs):
    return mamba3_mimo_fp64(*[leaves[n] for n in INPUT_NAMES], spec.chunk_size, spec.rotary_dim_divisor, **kwargs)


def _grads(spec, x, clamp_backward):
    leaves = _leaves(x)
    out = _run(leaves, spec, clamp_backward=clamp_backward)
    names = [n for n in INPUT_NAMES if leaves[n] is not None]
    grads = torch.autograd.grad(out, [leaves[n] for n in names], grad_outputs=x["dout"].to(torch.float64))
    return out.detach(), dict(zip(names, grads))


def test_fp64_model_clamp_modes_agree_when_adt_is_negative():
    spec = cases.ORACLE_GRID[0]
    x = cases.make_op_inputs(spec)
    out_up, grads_up = _grads(spec, x, "upstream")
    out_ex, grads_ex = _grads(spec, x, "exact")
    assert torch.equal(out_up, out_ex)
    for name in grads_up:
        assert rel_rms(grads_ex[name], grads_up[name]) <= 1e-15, name


def test_fp64_model_clamp_modes_differ_only_in_the_backward_when_the_clamp_is_active():
    spec = cases.ORACLE_GRID[6]  # positive_adt: some chunk sums of ADT are > 0
    assert spec.positive_adt
    x = cases.make_op_inputs(spec)
    out_up, grads_up = _grads(spec, x, "upstream")
    out_ex, grads_ex = _grads(spec, x, "exact")
    assert torch.equal(out_up, out_ex)
    assert rel_rms(grads_ex["ADT"], grads_up["ADT"]) > 0.1
    assert rel_rms(grads_ex["Q"], grads_up["Q"]) <= 1e-15  # the clamp only sits on the ADT path


@pytest.mark.parametrize("positive_adt", [False, True])
def test_fp64_model_depends_on_chunk_size_only_through_the_clamp(positive_adt):
    spec = cases.small_case(seqlen=24, value_dim=8, chunk_size=4, positive_adt=positive_adt, seed=11)
    x = cases.make_op_inputs(spec)
    with torch.no_grad():
        by_chunk = [mamba3_mimo_fp64(*[x[n] for n in INPUT_NAMES], chunk, 4) for chunk in (4, 8, 24)]
    differences = [rel_rms(other, by_chunk[0]) for other in by_chunk[1:]]
    if positive_adt:
        assert min(differences) > 1e-6  # upstream's clamp is per chunk, so its output depends on C
    else:
        assert max(differences) <= 1e-13


def test_d_skip_terms_sum_to_the_autograd_dd():
    spec = cases.ORACLE_GRID[2]  # non-reduced output with Z and D
    x = cases.make_op_inputs(spec)
    _, grads = _grads(spec, x, "upstream")
    terms = d_skip_terms(x["dout"], x["V"], x["MIMO_V"], x["MIMO_Z"], x["MIMO_Out"], x["Z"])
    torch.testing.assert_close(terms.sum(dim=(0, 1, 2, 4)), grads["D"], rtol=1e-12, atol=1e-12)
    assert terms.abs().sum() > 3 * grads["D"].abs().sum()  # the cancellation the diagnostic is there for


_SPEC = cases.small_case(seqlen=6, heads=2, state_dim=32, value_dim=8, chunk_size=4)


def _call(**changes):
    x = cases.make_op_inputs(_SPEC)
    kwargs = {"chunk_size": 4}
    kwargs.update({key: changes.pop(key) for key in ("chunk_size", "rotary_dim_divisor", "clamp_backward")
                   if key in changes})
    x.update(changes)
    return mamba3_mimo_fp64(*[x[n] for n in INPUT_NAMES], **kwargs)


@pytest.mark.parametrize("changes, error, match", [
    ({"Z": None}, ValueError, "Z and MIMO_Z"),
    ({"MIMO_Z": None}, ValueError, "Z and MIMO_Z"),
    ({"Q": None}, TypeError, "Q is required"),
    ({"D": torch.zeros(2, 2, 8)}, ValueError, r"^D must have shape \[2\]"),
    ({"Angles": torch.zeros(1, 6, 2, 16)}, ValueError, "^Angles must have shape"),
    ({"ADT": torch.zeros(1, 2, 6, dtype=torch.int32)}, TypeError, "^ADT must have a floating dtype"),
    ({"K": [1.0]}, TypeError, "^K must be a torch.Tensor"),
    ({"V": torch.zeros(1, 6, 3, 8)}, ValueError, r"^ADT must have shape \[1, 3, 6\]"),
    ({"Q": torch.zeros(1, 6, 2, 4, 32)}, ValueError, "H % G must be 0"),
    ({"chunk_size": 0}, ValueError, "chunk_size"),
    ({"rotary_dim_divisor": 8}, ValueError, "rotary_dim_divisor"),
    ({"clamp_backward": "none"}, ValueError, "clamp_backward"),
], ids=range(12))
def test_fp64_model_rejects_bad_inputs(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)
