"""Shared helpers of the stage-2 oracle and epilogue tests: the golden whole-op file and argument builders.

``GOLDEN_FULL_OP`` is the one place that names the golden file (``shared/golden/README.md``); the integrator repoints
it to ``tests/data``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from mimo_numerics.ops.mamba3_mimo import chain

GOLDEN_FULL_OP = Path(__file__).parent / "data" / "upstream_h200_full_op_cases.pt"
GOLDEN_FULL_OP_SHA256 = "91b5d11984d66cb9a69a3b48369ff6ddd947ec51792681111b74199f60d8c3cf"


@lru_cache(maxsize=1)
def load_full_op() -> dict:
    """The golden whole-op cases, ``name -> case`` (README beside the file)."""
    return torch.load(GOLDEN_FULL_OP, weights_only=True)


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
