"""The forward's golden cases: the whole-op H200 data (``ops.mamba3_mimo.golden``) with upstream's recorded
preprocessing as the forward's inputs and ``fwd.o`` as its output."""

from __future__ import annotations

from ..mamba3_mimo import golden as _golden
from .spec import INPUT_NAMES


def stored_cases(paths=None):
    """The cases as ``StoredCase`` objects (inputs from the recorded ``pre``)."""
    return _golden.stored_cases("fwd", INPUT_NAMES, paths=paths)


def upstream_outputs(name: str, paths=None):
    """Upstream's ``{"o": ...}`` for case ``name``."""
    return _golden.upstream_outputs(name, "fwd", paths)
