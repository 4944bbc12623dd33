"""The upstream runners of the forward and stage 2 on a GPU: the real TileLang kernels, launched by
``mimo_numerics.ops.mamba3_mimo.upstream.run_forward`` / ``run_stage2`` on a golden case's recorded kernel inputs,
give the kernel outputs upstream's own ``mamba3_mimo`` recorded on the H200, bit for bit.

The golden kernel outputs were captured inside upstream's autograd function (``run_whole_op``, TileLang 0.1.8,
``tests/data/README.md``); both kernels repeat bit for bit in one process (the golden ``repeat_differs`` lists are
empty), so a correct launch (argument order, output buffers, compile-time constants) reproduces them exactly on an
H200. Needs CUDA, TileLang 0.1.8 and the mamba-ssm 2.3.2.post1 source (``scripts/use_upstream_wheels.sh``).
"""

import pytest
import torch

from mimo_numerics.ops.mamba3_mimo import golden
from mimo_numerics.ops.mamba3_mimo import upstream as op_upstream
from mimo_numerics.ops.mamba_mimo_bwd_fwd.upstream import UpstreamUnavailable

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: Two specializations: every branch (reduced o, Z, D; G = 1) and G = H without a reduced o or D.
CASES = ("g_B1_S64_H2_N64_P64_R4_C16_zdo", "x_B2_S64_H2_G2_N32_P64_R2_C32_nored_z")


def _on_cuda(x):
    return x.cuda() if isinstance(x, torch.Tensor) else x


def _kernel_inputs(name):
    case = golden.load()[name]
    args = {k: _on_cuda(v) for k, v in golden.kernel_inputs(case["inputs"], case["pre"]).items()}
    return case, args


def _assert_same_bits(got, want, label):
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), label
    got = got.detach().cpu()
    differ = int((got.view(torch.uint8) != want.contiguous().view(torch.uint8)).sum())
    assert differ == 0, f"{label}: {differ} bytes of {want.numel() * want.element_size()} differ"


def _skip_unavailable(exc):
    pytest.skip(f"upstream kernels unavailable: {exc}")


@pytest.mark.parametrize("name", CASES)
def test_run_forward_reproduces_upstreams_recorded_o(name):
    case, x = _kernel_inputs(name)
    try:
        out = op_upstream.run_forward(x["q"], x["k"], x["v"], x["q_bias"], x["k_bias"], x["mimo_v"], x["mimo_o"],
                                      x["z"], x["d"], x["mimo_z"], x["angles"], x["da_cs"], x["da_cs_rev"], x["dt"],
                                      x["trap"], x["segsum"], x["chunk_size"], x["rotary_dim_divisor"])
    except UpstreamUnavailable as exc:
        _skip_unavailable(exc)
    _assert_same_bits(out.o, case["fwd"]["o"], f"{name} o")


@pytest.mark.parametrize("name", CASES)
def test_run_stage2_reproduces_upstreams_recorded_outputs(name):
    case, x = _kernel_inputs(name)
    stage1 = {k: _on_cuda(case["bwd_fwd"][k]) for k in ("states", "qk_dot")}
    try:
        out = op_upstream.run_stage2(x["dout"], x["q"], x["k"], x["v"], x["q_bias"], x["k_bias"], x["mimo_v"],
                                     x["mimo_o"], stage1["states"], x["z"], x["mimo_z"], x["angles"], x["da_cs"],
                                     x["da_cs_rev"], x["dt"], x["trap"], x["d"], stage1["qk_dot"], x["segsum"],
                                     x["chunk_size"], x["rotary_dim_divisor"])
    except UpstreamUnavailable as exc:
        _skip_unavailable(exc)
    want = case["bwd_bwd"]
    for output, value in out.as_dict().items():
        if value is None:
            assert want.get(output) is None, output
            continue
        _assert_same_bits(value, want[output], f"{name} {output}")
