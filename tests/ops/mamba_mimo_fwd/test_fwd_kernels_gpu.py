"""GPU tests of the forward Triton kernel (``@pytest.mark.gpu``; skipped without CUDA). Issue 23, acceptance 2::

    python -m pytest tests/ops/mamba_mimo_fwd/test_fwd_kernels_gpu.py tests/ops/mamba3_mimo/test_whole_op_kernels_gpu.py -m gpu -s -q

* the interpreter gates of ``test_fwd_kernels.py`` at realistic sizes, S up to 8192 (kernel vs the reference on the
  GPU under the same policy: rel RMS <= same_policy_rel_rms; poisoned launches leave no NaN; closer to its own
  policy than to the other presets with forward semantics);
* the golden whole-op cases (``tests/data``): the forward reference's golden gates for the kernel on the GPU;
* bit-identical reruns, and the CUDA code forms (``native_lp``, ``rcp_approx``, ``state_one_dot``,
  ``walk_psiv_from_v``) giving the same bits on and off for the forward as well.
"""

from __future__ import annotations

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels, tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_fwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd as forward_reference
from mimo_numerics.ops.mamba_mimo_fwd.spec import INPUT_NAMES

GATE_RTOL = tolerances.get("same_policy_rel_rms")
_cuda = torch.cuda.is_available() and kernels.triton_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda, reason="needs a CUDA GPU and triton")]


def _c(**kw):
    return CaseSpec(formula="realistic", **kw)


#: realistic sizes: every branch combination, GQA, R in {1, 2, 4, 8}, N = 128, fp16, S up to 8192, tails
CASES = (
    _c(seqlen=8192, heads=4, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True, has_d=True),
    _c(batch=2, seqlen=4096, heads=8, groups=1, state_dim=64, value_dim=64, rank=4, chunk_size=16, reduce_o=False,
       has_z=True),
    _c(seqlen=2048, heads=4, groups=4, state_dim=128, value_dim=64, rank=2, chunk_size=32, has_d=True),
    _c(seqlen=4000, heads=2, state_dim=64, value_dim=64, rank=8, chunk_size=8, has_z=True, has_d=True),
    _c(seqlen=2048, heads=2, state_dim=64, value_dim=64, rank=1, chunk_size=64, reduce_o=False, has_d=True),
    _c(seqlen=8192, heads=2, state_dim=128, value_dim=128, rank=4, chunk_size=16, has_z=True, has_d=True,
       dtype="float16"),
)


def _policies(spec):
    if spec.dtype == "bfloat16":
        return ("upstream_sm90", "fp32", "upstream_sm80")
    return ("upstream_sm90_fp16", "fp32@fp16")


def _policy(name):
    if name.endswith("@fp16"):
        return mn.presets.get(name.split("@")[0]).replace(lp_dtype="float16")
    return mn.presets.get(name)


def _run(x, policy, **kw):
    return kernels.mamba_mimo_fwd(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"],
                                  rotary_dim_divisor=x["rotary_dim_divisor"], policy=policy, **kw).o


def _ref(x, policy):
    return forward_reference(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"],
                             rotary_dim_divisor=x["rotary_dim_divisor"], policy=policy).o


@pytest.mark.parametrize("spec", CASES, ids=[s.case_id for s in CASES])
def test_gpu_fwd_kernel_matches_reference_at_realistic_sizes(spec):
    x = make_inputs(spec, "cuda")
    names = _policies(spec)
    refs = {n: _ref(x, _policy(n)) for n in names}
    rows = {}
    for name in names:
        got = _run(x, _policy(name), poison=True)
        assert not torch.isnan(got.float()).any(), name
        d = {other: rel_rms(got.float(), ref.float()) for other, ref in refs.items()}
        rows[name] = d
        assert d[name] <= GATE_RTOL, (name, d)
        for other in names:
            gap = rel_rms(refs[other].float(), refs[name].float())
            if other != name and gap > 1e-5 + 2 * d[name]:
                assert d[name] < d[other], (name, other, d)
    print(spec.case_id, {n: {o: f"{v:.1e}" for o, v in d.items()} for n, d in rows.items()})


def test_gpu_fwd_golden_upstream_cases():
    from mamba_mimo_fwd_support import check_kernel_golden

    assert len(check_kernel_golden(torch.device("cuda"))) == 12


@pytest.mark.parametrize("switch", ["native_lp", "rcp_approx", "state_one_dot", "walk_psiv_from_v"])
@pytest.mark.parametrize("policy", ["upstream_sm90", "upstream_sm90_fp16"])
def test_gpu_fwd_performance_switches_are_bit_identical(policy, switch):
    spec = _c(batch=2, seqlen=1000, heads=4, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True,
              has_d=True, dtype="float16" if policy.endswith("fp16") else "bfloat16")
    x = make_inputs(spec, "cuda")
    on = _run(x, policy, tuning={switch: 1})
    off = _run(x, policy, tuning={switch: 0}, poison=True)
    assert torch.equal(on.view(torch.int16), off.view(torch.int16)), switch


def test_gpu_fwd_deterministic():
    x = make_inputs(CASES[0], "cuda")
    a = _run(x, "upstream_sm90")
    b = _run(x, "upstream_sm90", poison=True)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
