"""``mn.precompile_mamba3_mimo`` on a CUDA GPU (``@pytest.mark.gpu``; issue 23, the first-call compile cost): it
compiles kernel specializations without running them, and the real forward + backward afterwards asks Triton to
compile nothing more (counted with Triton's ``jit_cache_hook``, called before every compile), builds no C launcher
(counted at ``triton.runtime.build._build``, which runs the host C compiler; issue 43: in a cold process the first
call built them one after another) and gives the bits of a call made without it."""

from __future__ import annotations

import warnings

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels
from mimo_numerics.ops.mamba3_mimo.autograd import BackendFallbackWarning
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs

_cuda = torch.cuda.is_available() and kernels.triton_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda, reason="needs a CUDA GPU and triton")]


def _call(raw, policy):
    leaves = [None if raw[n] is None else raw[n].cuda().requires_grad_(raw[n].is_floating_point())
              for n in OP_INPUT_NAMES]
    out = mn.mamba3_mimo(*leaves, raw["chunk_size"], raw["rotary_dim_divisor"], policy=policy, backend="triton")
    out.backward(raw["dout"].cuda().to(out.dtype))
    return [out.detach()] + [None if t is None else t.grad for t in leaves]


def test_after_precompile_the_call_compiles_nothing_and_gives_the_same_bits():
    import triton

    # sizes no other test uses, so this process has compiled none of these specializations yet
    raw = make_op_inputs(OpCaseSpec(batch=1, seqlen=96, heads=3, groups=1, state_dim=32, value_dim=32, rank=2,
                                    chunk_size=16, dtype="float16", seed=11))
    policy = "upstream_sm90_fp16"
    import triton.runtime.build as triton_build

    compiles, builds = [], []
    hook = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = lambda *args, **kwargs: compiles.append(1) and None
    real_build = triton_build._build

    def counted_build(*args, **kwargs):
        builds.append(args[0])
        return real_build(*args, **kwargs)

    triton_build._build = counted_build
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendFallbackWarning)
            report = mn.precompile_mamba3_mimo(*[None if raw[n] is None else raw[n].cuda() for n in OP_INPUT_NAMES],
                                               raw["chunk_size"], raw["rotary_dim_divisor"], policy=policy)
            asked, built = len(compiles), len(builds)
            first = _call(raw, policy)
            after, built_after = len(compiles) - asked, builds[built:]
            second = _call(raw, policy)
    finally:
        triton.knobs.runtime.jit_cache_hook = hook
        triton_build._build = real_build
    print(report)
    assert report.parallel and report.compiled and report.compiled > 0 and report.launches >= report.compiled
    assert report.launchers == report.compiled
    assert after == 0, f"the real call compiled {after} kernel(s) after precompile"
    assert not built_after, f"the real call built C modules after precompile: {built_after}"
    for a, b in zip(first, second):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
