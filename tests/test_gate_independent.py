"""The gates against implementations that are not the reference, and the noise-floor gate at its edge.

The reference gated against itself (``test_plumbing_*`` in tests/test_testing.py, tests/test_testing_ops.py) only
checks the gate's wiring. Here every registered operator is gated against an implementation that shares no code
with its policy reference, and the noise-floor gate's formula ``rel_rms(fn, fp64) <= alpha·rel_rms(ref[P], fp64) +
floor`` is probed just above and just below its bound:

* **stage 1, the Triton kernels** (Triton's CPU interpreter): a second implementation of the same rounding policy,
  written as tiled kernels; they must pass the gate under the policy they are configured with.
* **every operator, the FP64 oracle with only the output stores rounded, under ``fp32``**: the ``fp32`` preset is
  FP32 math with only the lp output stores rounded, so the oracle (explicit FP64 sums, no code shared with the
  reference: ``docs/architecture.md``) with its lp outputs rounded to the lp dtype and its other outputs to FP32 is
  an implementation of ``fp32`` that differs from the reference only in FP32-level arithmetic (more accurate, in
  fact). The same-policy gate must accept it through the case's own noise floor (its ``fp64_math`` perturbation is
  the same semantics computed by the reference's code in FP64), and the noise-floor gate because it is at least as
  accurate as ``fp32``. Under ``upstream_sm90`` (bf16 intermediates) the same function must fail the same-policy
  gate: the gate tells the two policies apart on an independent implementation too.
* **the noise-floor gate's edge**: synthetic kernels ``ref[P] + t·(ref[P] − fp64)`` on one FP32 output, with ``t``
  calibrated so that ``rel_rms(fn, fp64) = bound ± floor/2`` (``bound`` from ``tolerances.py`` through
  :class:`mimo_numerics.testing.GateSettings`), under a bf16 policy (where ``alpha·err(ref)`` dominates) and under
  ``fp32`` (where the floor does), for stage 1 and stage 2. Just above must fail that gate and nothing else; just
  below must pass. A floor ten times larger, or an ``alpha`` larger by 0.02, lets the "just above" kernels pass.
  The same-policy gate is switched off for these (``tol_same=1``): the extra error is far above it by design.
"""

from __future__ import annotations

import functools

import pytest
import torch

from mimo_numerics import operator as _operator
from mimo_numerics import presets, testing
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops import registry

OPS = registry.OPERATORS


def _smoke_bf16(op):
    return [c for c in _operator.get(op).cases("smoke") if c.dtype == "bfloat16"]


# ---------------------------------------------------------------------------------------------------- stage 1 kernels
#: Two interpreter-sized stage-1 cases: reduced DOUT with Z and D; full DOUT, realistic formula, GQA, divisor 2.
KERNEL_CASES = (
    CaseSpec(seqlen=13, state_dim=16, value_dim=16, rank=3, chunk_size=6, has_z=True, has_d=True),
    CaseSpec(formula="realistic", seqlen=16, heads=2, groups=1, state_dim=16, value_dim=16, rank=2, chunk_size=8,
             reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2),
)


def _kernels():
    try:
        from mimo_numerics import kernels
    except ImportError:
        return None
    return kernels if kernels.triton_available() else None


@pytest.mark.parametrize("preset", ["upstream_sm90", "fp32"])
def test_gate_stage1_triton_kernels_pass_under_their_policy(preset):
    kernels = _kernels()
    if kernels is None:
        pytest.skip("Triton is not usable here")
    report = testing.check(kernels.mamba_mimo_bwd_fwd, op="mamba_mimo_bwd_fwd", policy=preset,
                           cases=list(KERNEL_CASES), pass_policy=True)
    assert report.passed, report.failure_message()
    assert len(report.checked) == len(KERNEL_CASES)
    # an implementation of its own: not the reference's bits everywhere (else this would be a plumbing test)
    assert any(o.err_same > 0 for c in report.checked for o in c.outputs if o.status != "absent"), report.table()


def test_gate_stage1_triton_kernels_fail_under_another_policy():
    kernels = _kernels()
    if kernels is None:
        pytest.skip("Triton is not usable here")
    # the kernels run upstream_sm90's roundings but claim fp32: the same-policy gate must see it
    sm90 = functools.partial(kernels.mamba_mimo_bwd_fwd, policy=presets.get("upstream_sm90"))
    report = testing.check(sm90, op="mamba_mimo_bwd_fwd", policy="fp32", cases=[KERNEL_CASES[0]])
    assert not report.passed
    problems = [p for _, _, p in report.failures()]
    assert any(p.startswith("same-policy gate") for p in problems), report.failure_message()


# ---------------------------------------------------------------------------------------------------- rounded oracle
def rounded_oracle(op_name: str, policy):
    """The FP64 oracle of ``op_name`` with only its output stores rounded: lp outputs to ``policy``'s lp dtype,
    the others to float32 (the ``fp32`` preset's output semantics), as a gate ``fn``."""
    op = _operator.get(op_name)
    oracle = op.load("oracle")
    lp = presets.resolve(policy).lp_torch_dtype

    def fn(*tensors, **scalars):
        outs = testing.as_output_dict(oracle(*tensors, **scalars), op)
        return {name: (None if value is None else value.to(lp if name in op.lp_outputs else torch.float32))
                for name, value in outs.items()}

    return fn


@pytest.mark.parametrize("op", OPS)
def test_gate_rounded_fp64_oracle_passes_under_fp32(op):
    report = testing.check(rounded_oracle(op, "fp32"), op=op, policy="fp32", cases=_smoke_bf16(op))
    assert report.passed, report.failure_message()
    # an implementation of its own: its unrounded outputs are not the reference's (the forward's one bf16 output
    # can still be bit-equal to the reference's after the store: FP32-level differences rarely cross a bf16 tie)
    spec = _operator.get(op)
    case = report.checked[0].case
    raw = testing.as_output_dict(testing.oracle_outputs(case, spec), spec)
    ref = testing.as_output_dict(testing.reference_outputs(case, "fp32", spec), spec)
    assert any(rel_rms(raw[n], ref[n].double()) > 0 for n in spec.output_names if ref[n] is not None)


@pytest.mark.parametrize("op", OPS)
def test_gate_rounded_fp64_oracle_fails_under_upstream_sm90(op):
    report = testing.check(rounded_oracle(op, "upstream_sm90"), op=op, policy="upstream_sm90",
                           cases=_smoke_bf16(op)[:1])
    assert not report.passed
    problems = [p for _, _, p in report.failures()]
    assert any(p.startswith("same-policy gate") for p in problems), report.failure_message()


# ---------------------------------------------------------------------------------------------------- noise-floor edge
#: (operator, FP32 output probed)
EDGE_OUTPUTS = (("mamba_mimo_bwd_fwd", "dmimo_o"), ("mamba_mimo_bwd_bwd", "dmimo_v"))
EDGE_POLICIES = ("upstream_sm90", "fp32")


def _edge_kernel(op_name: str, output: str, policy: str, side: float):
    """``(fn, bound, floor, target)``: ``fn`` returns ``ref[P]`` with ``output`` replaced by
    ``ref + t·(ref − fp64)``, ``t`` chosen so that ``rel_rms(fn.output, fp64) = bound + side·floor/2``."""
    op = _operator.get(op_name)
    policy = presets.resolve(policy)
    case = _smoke_bf16(op_name)[0]
    ref = testing.as_output_dict(testing.reference_outputs(case, policy, op), op)
    oracle = testing.as_output_dict(testing.oracle_outputs(case, op), op)
    r, o = ref[output], oracle[output]
    assert r.dtype == torch.float32 and output not in op.lp_outputs
    settings = testing.GateSettings.from_table(op=op_name, output=output, fmt=policy.lp_dtype)
    ref_err = rel_rms(r, o)
    assert ref_err > 0, f"{op_name}.{output} under {policy}: the reference equals the oracle; nothing to scale"
    bound = settings.alpha * ref_err + settings.floor
    target = bound + side * settings.floor / 2
    # err(ref + t·(ref − o), o) = (1 + t)·ref_err before the float32 store; rounding moves it by ~1e-8 relative
    t = target / ref_err - 1.0
    edited = (r.double() + t * (r.double() - o.double())).to(torch.float32)
    measured = rel_rms(edited, o)
    assert abs(measured - target) < settings.floor / 20, (measured, target)
    outs = dict(ref, **{output: edited})
    reference = op.load("reference")

    def fn(*tensors, **scalars):
        got = testing.as_output_dict(reference(*tensors, policy=policy, **scalars), op)
        return dict(got, **{output: outs[output].to(got[output].device)})

    return fn, case, bound, measured


@pytest.mark.parametrize("policy", EDGE_POLICIES)
@pytest.mark.parametrize("op, output", EDGE_OUTPUTS)
def test_noise_floor_gate_fails_just_above_its_bound(op, output, policy):
    fn, case, bound, measured = _edge_kernel(op, output, policy, side=+1.0)
    report = testing.check(fn, op=op, policy=policy, cases=[case], tol_same=1.0)
    (result,) = report.cases
    failing = {o.output: o.problems for o in result.outputs if o.problems}
    assert not result.problems and list(failing) == [output], report.failure_message()
    (problem,) = failing[output]
    assert problem.startswith("noise-floor gate:"), problem
    check = next(o for o in result.outputs if o.output == output)
    assert check.err_oracle == pytest.approx(measured, rel=1e-12) and check.err_oracle > bound


@pytest.mark.parametrize("policy", EDGE_POLICIES)
@pytest.mark.parametrize("op, output", EDGE_OUTPUTS)
def test_noise_floor_gate_passes_just_below_its_bound(op, output, policy):
    fn, case, bound, measured = _edge_kernel(op, output, policy, side=-1.0)
    report = testing.check(fn, op=op, policy=policy, cases=[case], tol_same=1.0)
    assert report.passed, report.failure_message()
    check = next(o for o in report.cases[0].outputs if o.output == output)
    assert check.err_oracle < bound and check.bound_oracle == pytest.approx(bound, rel=1e-12)
