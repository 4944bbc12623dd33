"""Stage 1 with every FP32-level model on a CUDA GPU against the real upstream kernels (``@pytest.mark.gpu``;
issue 24, acceptance 1 "on CUDA"): the six realistic H200 cases (S up to 2048), the same gates as the CPU test
(``test_fp32_level_golden.py``), and the CUDA run against the CPU run of the same reference: the models are
IEEE float32/float64 arithmetic in a fixed order and table lookups, so the device must not move them further from
upstream than the measured CPU figures allow."""

import pytest
import torch

from mimo_numerics import tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import bit_equal_fraction, rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.reference import mamba_mimo_bwd_fwd
from test_fp32_level_golden import REALISTIC, _policies

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name", sorted(REALISTIC))
def test_stage1_with_every_fp32_level_model_on_cuda(name):
    case = REALISTIC[name]
    x = make_inputs(CaseSpec.from_dict(case["spec"]))
    policy = _policies(x["q"].dtype)["on"]
    cuda = {k: v.cuda() if torch.is_tensor(v) else v for k, v in x.items()}
    on_gpu = mamba_mimo_bwd_fwd(*as_args(cuda), **as_kwargs(cuda), policy=policy)
    worst = tolerances.get("golden_stage1_fp32_level_rel_rms_max")
    for output, want in case["upstream"].items():
        if want is None:
            continue
        got = getattr(on_gpu, output).cpu()
        assert rel_rms(got, want) <= worst, (output, rel_rms(got, want))
    assert torch.equal(on_gpu.qk_dot.cpu(), case["upstream"]["qk_dot"])
    assert bit_equal_fraction(on_gpu.states.cpu(), case["upstream"]["states"]) >= tolerances.get(
        "golden_stage1_fp32_level_states_bit_equal_min")
