"""Shared by the tests of the whole-op FP64 side: where the golden whole-op data lives (the one place to repoint)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

#: The golden whole-op data of the upstream op on an H200 (README beside it).
GOLDEN_FULL_OP = Path(__file__).parent / "data" / "upstream_h200_full_op_cases.pt"
GOLDEN_FULL_OP_SHA256 = "91b5d11984d66cb9a69a3b48369ff6ddd947ec51792681111b74199f60d8c3cf"


@functools.lru_cache(maxsize=1)
def load_golden_full_op() -> dict:
    """The 7 cases, name -> dict (``inputs``, ``pre``, ``fwd``, ``autograd``, ...)."""
    return torch.load(GOLDEN_FULL_OP, weights_only=True)


GOLDEN_NAMES = sorted(load_golden_full_op())
