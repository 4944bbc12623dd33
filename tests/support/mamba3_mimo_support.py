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
