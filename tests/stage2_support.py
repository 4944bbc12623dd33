"""Shared helpers of the stage-2 oracle and epilogue tests: the golden whole-op file and argument builders.

``GOLDEN_FULL_OP`` comes from ``mimo_numerics.golden_data`` (provenance: ``tests/data/README.md``).
"""

from __future__ import annotations

from mimo_numerics import golden_data
from mimo_numerics.ops.mamba3_mimo import chain

GOLDEN_FULL_OP = golden_data.path("full_op")
GOLDEN_FULL_OP_SHA256 = golden_data.FILES["full_op"].sha256


def load_full_op() -> dict:
    """The golden whole-op cases, ``name -> case`` (``tests/data/README.md``); cached by ``golden_data``."""
    return golden_data.load("full_op")


def case_names() -> list:
    return sorted(load_full_op())


# The argument builders and the FP64 stage-1 helper live in the package (``mimo_numerics.ops.mamba3_mimo.chain``),
# where ``mamba3_mimo``'s autograd function uses them; re-exported here for the tests and scripts that import them.
stage1_args = chain.stage1_args
stage2_args = chain.stage2_args
stage2_kwargs = chain.stage2_kwargs
epilogue_args = chain.epilogue_args
epilogue_kwargs = chain.epilogue_kwargs
stage1_oracle_fp64 = chain.stage1_oracle_fp64
