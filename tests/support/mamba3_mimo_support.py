"""Shared by the tests of the whole-op FP64 side: the golden whole-op data (``mimo_numerics.golden_data``), and by
the decode tests: the compat layer's two decode kernels."""

from __future__ import annotations

from mimo_numerics import compat, golden_data
# one decode step's arguments and a prefill's (re-exported for the tests)
from mimo_numerics.ops.mamba3_mimo.decode_cases import one_token, token_range  # noqa: F401

#: The golden whole-op data of the upstream op on an H200 (tests/data/README.md).
GOLDEN_FULL_OP = golden_data.path("full_op")
GOLDEN_FULL_OP_SHA256 = golden_data.FILES["full_op"].sha256


def load_golden_full_op() -> dict:
    """The 7 cases, name -> dict (``inputs``, ``pre``, ``fwd``, ``autograd``, ...); cached by ``golden_data``."""
    return golden_data.load("full_op")


GOLDEN_NAMES = sorted(load_golden_full_op())



def upstream_step_kernels():
    """The compat layer's ``apply_rotary_qk_inference_fwd`` and ``mamba3_step_fn``, imported by upstream's module
    paths (``decode_cases.run_kernel_chain``'s two kernels)."""
    compat.install()
    try:
        import mamba_ssm.ops.cute.mamba3.mamba3_step_fn as cute_step
        import mamba_ssm.ops.triton.mamba3.mamba3_mimo_rotary_step as rotary
    finally:
        compat.uninstall()
    return rotary.apply_rotary_qk_inference_fwd, cute_step.mamba3_step_fn


#: FP32-level knobs the whole op's noise floor flips: each keeps every rounding site and changes FP32 orders only.
NOISE_KNOBS = {"helper_fma": ("contracted", "separate"), "state_update": ("accumulate_into", "separate")}


def chain_noise(inputs, policy, want) -> dict:
    """Per output of ``golden_figures.run_op``, the largest rel RMS between the reference chain under ``policy``
    (its outputs ``want``) and under ``policy`` with one knob of :data:`NOISE_KNOBS` flipped: the case's FP32-level
    noise floor (``tolerances: whole_op_kernels_noise_factor``)."""
    import mimo_numerics as mn
    from mimo_numerics.metrics import rel_rms
    from mimo_numerics.studies import golden_figures as gf

    base = mn.presets.resolve(policy)
    noise = {key: 0.0 for key, value in want.items() if value is not None}
    for knob, (a, b) in NOISE_KNOBS.items():
        other = gf.run_op(inputs, base.replace(**{knob: b if getattr(base, knob) == a else a}))
        for key in noise:
            noise[key] = max(noise[key], rel_rms(other[key], want[key]))
    return noise


def kernels_against_reference(inputs, policy):
    """``(got, want, pre_error)``: ``Out`` and the gradients of the whole op on kernels (``backend="triton"``), the
    reference chain's on the kernels' own preprocessing outputs, and the largest rel RMS of those preprocessing
    outputs against the reference preprocessing. The whole op's gate is the composition of the two: the
    preprocessing within ``chain_kernels_vs_reference_rel_rms`` (an FP32 difference of the cumulative angles flips
    lp roundings of the rotated q and k downstream, in the reference as in the kernels), the rest of the chain
    against the reference on the same preprocessing."""
    import torch

    from mimo_numerics.metrics import rel_rms
    from mimo_numerics.ops.mamba3_mimo import chain
    from mimo_numerics.studies import golden_figures as gf

    record = {}
    got = gf.run_op(inputs, policy, backend="triton", record=record)
    prefix = "mamba3_mimo_preprocess."
    pre = {key[len(prefix):]: value for key, value in record.items() if key.startswith(prefix)}
    reference_pre = chain.run_preprocess(inputs, policy)
    pre_error = max(preprocessing_distance(k, pre[k], reference_pre[k]) for k in chain.PRE_NAMES)
    with torch.no_grad():
        want = gf.chain_on_pre(inputs, {k: pre[k] for k in chain.PRE_NAMES}, policy)
    return got, want, pre_error


def preprocessing_distance(name, got, want) -> float:
    """rel RMS of a preprocessing output; for ``angles_cumsum`` (angles mod 2π) of the difference taken on the
    circle (in (−π, π]): an FP32 difference at a wrap is 2π apart in value and nothing apart as an angle."""
    import math

    import torch

    from mimo_numerics.metrics import rel_rms

    if name not in ("angles_cumsum", "final_angle"):
        return rel_rms(got, want)
    d = torch.remainder(got.double() - want.double() + math.pi, 2 * math.pi) - math.pi
    return float(d.norm() / want.double().norm())
