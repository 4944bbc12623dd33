"""GPU tests of the stage-2 Triton kernels (``@pytest.mark.gpu``; issue 23, acceptance 2): the interpreter gates of
``test_bwd_bwd_kernels.py`` at realistic sizes, S up to 8192 (kernels vs the stage-2 reference on the GPU under the
same policy, every output within same_policy_rel_rms; poisoned launches leave no NaN), and bit-identical reruns."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from mimo_numerics import kernels, tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_bwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd as stage2_reference
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES, OUTPUT_NAMES

GATE_RTOL = tolerances.get("same_policy_rel_rms")
_cuda = torch.cuda.is_available() and kernels.triton_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda, reason="needs a CUDA GPU and triton")]

CASES = (
    (CaseSpec(formula="realistic", seqlen=8192, heads=4, state_dim=64, value_dim=64, rank=4, chunk_size=16,
              has_z=True, has_d=True), ("upstream_sm90", "fp32")),
    (CaseSpec(formula="realistic", batch=2, seqlen=2048, heads=4, groups=4, state_dim=128, value_dim=64, rank=2,
              chunk_size=32, reduce_o=False, has_z=True), ("upstream_sm90",)),
    (CaseSpec(formula="realistic", seqlen=4096, heads=2, state_dim=64, value_dim=64, rank=8, chunk_size=8,
              has_d=True, dtype="float16"), ("upstream_sm90_fp16",)),
)


def _run(fn, x, policy, **kw):
    return fn(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"], rotary_dim_divisor=x["rotary_dim_divisor"],
              policy=policy, **kw)


@pytest.mark.parametrize("spec, policies", CASES, ids=[c[0].case_id for c in CASES])
def test_gpu_stage2_kernels_match_reference_at_realistic_sizes(spec, policies):
    x = make_inputs(spec, "cuda")
    for policy in policies:
        got = _run(kernels.mamba_mimo_bwd_bwd, x, policy, poison=True)
        want = _run(stage2_reference, x, policy)
        rows = {}
        for n in OUTPUT_NAMES:
            a, b = getattr(got, n), getattr(want, n)
            if b is None:
                continue
            assert not torch.isnan(a.float()).any(), (policy, n)
            rows[n] = rel_rms(a.float(), b.float())
        print(spec.case_id, policy, {k: f"{v:.1e}" for k, v in rows.items()})
        assert all(v <= GATE_RTOL for v in rows.values()), (policy, rows)


def test_gpu_stage2_deterministic():
    x = make_inputs(CASES[1][0], "cuda")
    a = _run(kernels.mamba_mimo_bwd_bwd, x, "upstream_sm90")
    b = _run(kernels.mamba_mimo_bwd_bwd, x, "upstream_sm90", poison=True)
    for n in OUTPUT_NAMES:
        if getattr(a, n) is not None:
            assert torch.equal(getattr(a, n), getattr(b, n)), n


def _default_cuda_plan(spec):
    """The default CUDA stage-2 plan of ``spec`` (it reads only N, P and the padded rows LP and tokens CP of a
    chunk)."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    pow2 = mimo_bwd_bwd._pow2
    LP, CP = max(16, pow2(spec.chunk_size * spec.rank)), max(16, pow2(spec.chunk_size))
    dims = types.SimpleNamespace(state_dim=spec.state_dim, value_dim=spec.value_dim)
    return mimo_bwd_bwd.stage2_tiles(dims, "cuda", LP, CP)


@pytest.mark.parametrize("walk_warps, walk_stages", [(1, None), (1, 6), (2, 4)])
def test_gpu_stage2_walk_warps_and_stages_change_no_bit(walk_warps, walk_stages):
    """The reverse walk under its own warps and pipeline stages (``Stage2Tiles.walk_warps``, ``walk_stages``: plans
    that ``benchmarks/bench_steps.py --stage2-plans`` times) gives the default plan's bits."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    spec = CASES[0][0]
    x = make_inputs(spec, "cuda")
    default = _run(kernels.mamba_mimo_bwd_bwd, x, "upstream_sm90")
    tiles = dataclasses.replace(_default_cuda_plan(spec), walk_warps=walk_warps, walk_stages=walk_stages)
    args = [x[n] for n in INPUT_NAMES]
    got = mimo_bwd_bwd.build_launches(*args, chunk_size=x["chunk_size"], rotary_dim_divisor=x["rotary_dim_divisor"],
                                      policy="upstream_sm90", tiles=tiles).run()
    for n in OUTPUT_NAMES:
        if getattr(default, n) is not None:
            assert torch.equal(getattr(got, n), getattr(default, n)), n


#: The FP32 outputs that are token sums of the chunk kernels' per-row GEMM sums (rowsum rows 0-2): another MMA
#: instruction (wgmma from 64 rows on 4 warps, mma.sync below) accumulates those GEMMs in another order.
ROW_SUM_OUTPUTS = ("dfactor", "ddA_cs_rev", "ddA_cs")


@pytest.mark.parametrize("kside_rows, kside_warps, qside_rows", [(16, None, None), (64, 8, None), (32, None, 32)])
def test_gpu_stage2_chunk_kernel_rows_and_warps(kside_rows, kside_warps, qside_rows):
    """The k-side and q-side kernels on rows per program and warps other than the default's
    (``Stage2Tiles.kside_rows``, ``kside_warps``, ``qside_rows``): their outputs are per row (no sum runs over the
    rows of a block), so every output keeps the default plan's bits but the FP32 row sums of :data:`ROW_SUM_OUTPUTS`,
    which may move in their last bits when the MMA instruction changes (within the tile-plan sum-order gate)."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    spec = CASES[0][0]
    x = make_inputs(spec, "cuda")
    default = _run(kernels.mamba_mimo_bwd_bwd, x, "upstream_sm90")
    base = _default_cuda_plan(spec)
    tiles = dataclasses.replace(base, kside_rows=kside_rows, kside_warps=kside_warps,
                                qside_rows=base.qside_rows if qside_rows is None else qside_rows)
    got = mimo_bwd_bwd.build_launches(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"],
                                      rotary_dim_divisor=x["rotary_dim_divisor"], policy="upstream_sm90",
                                      tiles=tiles).run()
    for n in OUTPUT_NAMES:
        a, b = getattr(got, n), getattr(default, n)
        if b is None:
            continue
        if n in ROW_SUM_OUTPUTS:
            err = rel_rms(a, b)
            print(n, f"{err:.2e}")
            assert err <= tolerances.get("stage2_tile_plan_sum_order_rel_rms"), (n, err)
        else:
            assert torch.equal(a, b), n


@pytest.mark.parametrize("spec, policies", CASES, ids=[c[0].case_id for c in CASES])
def test_gpu_stage2_native_lp_rounding_changes_no_bit(spec, policies):
    """``Stage2Tiles.native_lp`` (the CUDA default): every rounding by ``cvt.rn`` (``LPK`` 2 / 3) gives the bits of
    the integer RNE helpers, output by output, in bf16 and fp16 at realistic sizes (the condition for making it the
    CUDA default: ``docs/kernels.md``)."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = make_inputs(spec, "cuda")
    assert _default_cuda_plan(spec).native_lp
    tiles = dataclasses.replace(_default_cuda_plan(spec), native_lp=False)
    for policy in policies:
        default = _run(kernels.mamba_mimo_bwd_bwd, x, policy)
        got = mimo_bwd_bwd.build_launches(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"],
                                          rotary_dim_divisor=x["rotary_dim_divisor"], policy=policy,
                                          tiles=tiles).run()
        for n in OUTPUT_NAMES:
            if getattr(default, n) is not None:
                assert torch.equal(getattr(got, n), getattr(default, n)), (policy, n)


@pytest.mark.parametrize("spec, policies", CASES, ids=[c[0].case_id for c in CASES])
def test_gpu_stage2_kside_parts_change_no_bit(spec, policies):
    """``Stage2Tiles.kside_parts=2``: the k-side kernel as two launches (dΨV side, dk side) gives the default plan's
    bits, output by output, in two and three launches, with ``cvt.rn`` (the default) and with the integer helpers,
    at realistic sizes (the same GEMMs on the same operands)."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = make_inputs(spec, "cuda")
    default_plan = _default_cuda_plan(spec)
    for policy in policies:
        default = _run(kernels.mamba_mimo_bwd_bwd, x, policy)
        for tiles in (dataclasses.replace(default_plan, kside_parts=2),
                      dataclasses.replace(default_plan, kside_parts=3),
                      dataclasses.replace(default_plan, kside_parts=2, native_lp=False)):
            got = mimo_bwd_bwd.build_launches(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"],
                                              rotary_dim_divisor=x["rotary_dim_divisor"], policy=policy,
                                              tiles=tiles).run()
            for n in OUTPUT_NAMES:
                if getattr(default, n) is not None:
                    assert torch.equal(getattr(got, n), getattr(default, n)), (policy, tiles, n)


#: N or P below 64 (the golden case x_B2_S64_H2_G2_N32_P64_R2_C32_nored_z's sizes at a realistic length): the
#: default there keeps 32 rows and the integer helpers (``stage2_tiles``); these are the faster forms of N = P = 64.
NARROW = CaseSpec(formula="realistic", batch=2, seqlen=2048, heads=2, groups=2, state_dim=32, value_dim=64, rank=2,
                  chunk_size=32, reduce_o=False, has_z=True)


@pytest.mark.parametrize("plan", ["32x4n", "32x4k64q64", "32x4k64", "32x4q64", "32x4k64q64n"])
def test_gpu_stage2_plans_below_64_match_the_reference(plan):
    """At N = 32, P = 64 each of the forms the default leaves off there (``cvt.rn``, 64-row k-side / q-side
    kernels) against the stage-2 reference on the GPU under ``upstream_sm90``, every output within
    same_policy_rel_rms: which of them gave the wrong dq of the golden whole-op run (``stage2_tiles``)."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    x = make_inputs(NARROW, "cuda")
    tiles = mimo_bwd_bwd.parse_stage2_plan(plan, 32)
    got = mimo_bwd_bwd.build_launches(*[x[n] for n in INPUT_NAMES], chunk_size=x["chunk_size"],
                                      rotary_dim_divisor=x["rotary_dim_divisor"], policy="upstream_sm90",
                                      poison=True, tiles=tiles).run()
    want = _run(stage2_reference, x, "upstream_sm90")
    rows = {n: rel_rms(getattr(got, n).float(), getattr(want, n).float()) for n in OUTPUT_NAMES
            if getattr(want, n) is not None}
    print(plan, {k: f"{v:.1e}" for k, v in rows.items()})
    assert all(v <= GATE_RTOL for v in rows.values()), (plan, rows)
