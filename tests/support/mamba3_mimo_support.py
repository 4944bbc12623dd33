"""Shared by the tests of the whole-op FP64 side: the golden whole-op data (``mimo_numerics.golden_data``)."""

from __future__ import annotations

from mimo_numerics import golden_data

#: The golden whole-op data of the upstream op on an H200 (tests/data/README.md).
GOLDEN_FULL_OP = golden_data.path("full_op")
GOLDEN_FULL_OP_SHA256 = golden_data.FILES["full_op"].sha256


def load_golden_full_op() -> dict:
    """The 7 cases, name -> dict (``inputs``, ``pre``, ``fwd``, ``autograd``, ...); cached by ``golden_data``."""
    return golden_data.load("full_op")


GOLDEN_NAMES = sorted(load_golden_full_op())


def token_range(raw: dict, lo: int, hi: int) -> list:
    """The op's 14 inputs (``OP_INPUT_NAMES`` order) of tokens ``lo .. hi - 1``: every input with a time axis
    (``varlen.TIME_AXES``) cut along it, the parameters as they are."""
    from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES
    from mimo_numerics.ops.mamba3_mimo.varlen import TIME_AXES

    return [raw[n].narrow(TIME_AXES[n], lo, hi - lo) if raw[n] is not None and n in TIME_AXES else raw[n]
            for n in OP_INPUT_NAMES]


def one_token(raw: dict, t: int) -> list:
    """The op's 14 inputs of token ``t``, its time axis dropped (one decode step's arguments)."""
    from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES
    from mimo_numerics.ops.mamba3_mimo.varlen import TIME_AXES

    return [raw[n].select(TIME_AXES[n], t) if raw[n] is not None and n in TIME_AXES else raw[n]
            for n in OP_INPUT_NAMES]
