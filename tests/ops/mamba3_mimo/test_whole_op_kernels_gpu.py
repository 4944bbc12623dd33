"""The whole op with ``backend="triton"`` on the GPU (``@pytest.mark.gpu``; issue 23, acceptance 2):

* against the reference chain on the GPU under the same policy at S up to 8192, on the kernels' own preprocessing
  outputs (those within ``chain_kernels_vs_reference_rel_rms`` of the reference's): ``Out`` and every gradient
  within ``whole_op_kernels_vs_reference_rel_rms``, the cancelling sums within ``..._cancelling_rel_rms`` (the
  interpreter test's gates, ``test_whole_op_kernels.py``), at S = 8192 within ``..._cancelling_long_rel_rms``;
* the golden whole-op cases: the reference's own golden gates (``whole_op_golden_sm90_rel_rms`` on the gated
  outputs, ``upstream_sm90`` at least ``whole_op_golden_fp32_over_sm90_ratio_min`` times closer to upstream than
  ``fp32`` on every output) hold with the kernels in the chain.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from mimo_numerics import kernels, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs
from mimo_numerics.studies import golden_figures as gf
from mamba3_mimo_support import GOLDEN_NAMES, kernels_against_reference, load_golden_full_op
from mimo_numerics.ops.mamba3_mimo.autograd import BackendFallbackWarning
from test_whole_op_kernels import CANCELLING

_cuda = torch.cuda.is_available() and kernels.triton_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda, reason="needs a CUDA GPU and triton")]

CASES = {
    "S8192_roZD": OpCaseSpec(batch=1, seqlen=8192, heads=4, groups=1, state_dim=64, value_dim=64, rank=4,
                             chunk_size=16),
    "S2048_B2_foZ": OpCaseSpec(batch=2, seqlen=2048, heads=8, groups=8, state_dim=64, value_dim=64, rank=2,
                               chunk_size=32, reduce_o=False, has_d=False, seed=1),
}


def _cuda_inputs(inputs: dict) -> dict:
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _run(inputs, policy, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return gf.run_op(inputs, policy, backend=backend)


@pytest.mark.parametrize("policy", ["upstream_sm90", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
def test_gpu_whole_op_on_kernels_matches_the_reference_chain(case, policy):
    inputs = _cuda_inputs(make_op_inputs(CASES[case]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)  # every step has a kernel
        got, want, pre_error = kernels_against_reference(inputs, policy)
    rows = {k: rel_rms(got[k], want[k]) for k in gf.OUTPUT_KEYS if want[k] is not None}
    print(case, policy, f"pre {pre_error:.1e}", {k: f"{v:.1e}" for k, v in rows.items()})
    assert pre_error <= tolerances.get("chain_kernels_vs_reference_rel_rms"), pre_error
    # at S = 8192 the epilogue's reverse cumulative sum over S carries dAngles' cancellation further: its own gate
    long = CASES[case].seqlen > 2048
    for key, err in rows.items():
        name = ("cancelling_long_rel_rms" if long else "cancelling_rel_rms") if key in CANCELLING else "rel_rms"
        assert err <= tolerances.get(f"whole_op_kernels_vs_reference_{name}"), (key, err)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_gpu_whole_op_on_kernels_within_the_golden_gates(name):
    case = load_golden_full_op()[name]
    inputs, want = _cuda_inputs(case["inputs"]), {k: (None if v is None else v.cuda())
                                                  for k, v in case["autograd"].items()}
    got = _run(inputs, "upstream_sm90", "triton")
    sm90 = gf.errors(got, want)
    fp32 = gf.errors(_run(inputs, "fp32", "triton"), want)
    print(name, {k: f"{v:.1e}" for k, v in sm90.items()})
    limit = tolerances.get("whole_op_golden_sm90_rel_rms")
    gated = gf.errors(got, want, gf.GATED_OUTPUTS)
    assert all(v <= limit for v in gated.values()), gated
    ratio = tolerances.get("whole_op_golden_fp32_over_sm90_ratio_min")
    far = {k: (sm90[k], fp32[k]) for k in sm90 if not fp32[k] >= ratio * sm90[k]}
    assert not far, far


def _small_cuda_inputs():
    inputs = _cuda_inputs(make_op_inputs(OpCaseSpec(batch=1, seqlen=64, heads=2, groups=1, state_dim=16,
                                                    value_dim=16, rank=2, chunk_size=16)))
    return {k: inputs[k] for k in OP_INPUT_NAMES}


def _call(tensors, backend="triton"):
    import mimo_numerics as mn

    return mn.mamba3_mimo(*tensors.values(), chunk_size=16, rotary_dim_divisor=4, policy="upstream_sm90",
                          backend=backend)


def test_gpu_sign_check_is_deferred_but_still_refuses_and_warns():
    """On CUDA the DT/ADT sign check reads its verdict after the forward's launches
    (``validation.start_dt_adt_sign_check``); a swapped pair is still refused and a negative DT alone still warns, on
    the kernels and on the reference."""
    tensors = _small_cuda_inputs()
    swapped = dict(tensors, ADT=tensors["DT"], DT=tensors["ADT"])
    negative = dict(tensors, DT=-tensors["DT"])
    for backend in ("triton", "reference"):
        with pytest.raises(ValueError, match=r"DT has negative entries and ADT positive ones: were DT and ADT "
                                             r"swapped\?"):
            _call(swapped, backend)
        with pytest.warns(UserWarning, match="DT has negative entries"):
            _call(negative, backend)


def test_gpu_forward_on_kernels_does_not_synchronize_the_host(monkeypatch):
    """No implicit device synchronisation while the forward issues its launches: torch's sync debug mode raises on
    one (a ``.item()``, a ``bool(tensor)``, a blocking copy). The deferred sign check's event wait comes after."""
    import mimo_numerics.ops.mamba3_mimo.autograd as autograd
    from mimo_numerics.ops.mamba3_mimo import validation

    tensors = _small_cuda_inputs()
    _call(tensors)  # compiles and caches first
    torch.cuda.synchronize()
    finishes = []

    def recording(dt, adt, defer=True):  # the check as mamba3_mimo starts it; its verdict is read below
        finish = validation.start_dt_adt_sign_check(dt, adt, defer)
        finishes.append(finish)
        return (lambda: None) if finish is not None else None

    monkeypatch.setattr(autograd, "start_dt_adt_sign_check", recording)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = _call(tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(finishes) == 1 and finishes[0] is not None  # the check was deferred on CUDA
    finishes[0]()  # the verdict: these inputs are legal (no error, no warning)
    assert torch.isfinite(out.float()).all()
