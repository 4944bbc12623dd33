"""Shared by the tests of the whole-op FP64 side: the golden whole-op data (``mimo_numerics.golden_data``)."""

from __future__ import annotations

from mimo_numerics import golden_data
# one decode step's arguments and a prefill's (re-exported for the tests)
from mimo_numerics.ops.mamba3_mimo.decode_cases import one_token, token_range  # noqa: F401

#: The golden whole-op data of the upstream op on an H200 (tests/data/README.md).
GOLDEN_FULL_OP = golden_data.path("full_op")
GOLDEN_FULL_OP_SHA256 = golden_data.FILES["full_op"].sha256


def load_golden_full_op() -> dict:
    """The 7 cases, name -> dict (``inputs``, ``pre``, ``fwd``, ``autograd``, ...); cached by ``golden_data``."""
    return golden_data.load("full_op")


GOLDEN_NAMES = sorted(load_golden_full_op())

