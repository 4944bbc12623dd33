"""``mimo_numerics.outputs``: stage 1's input and output names and outputs NamedTuple, re-exported for users from
:mod:`mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs`.

The module lives in stage 1's operator folder; code inside the package, the scripts and the tests import it from
there (``tests/test_layout.py`` refuses an internal import of this alias).
"""

from .ops.mamba_mimo_bwd_fwd.outputs import (  # noqa: F401
    INPUT_NAMES, OPTIONAL_INPUTS, OUTPUT_NAMES, MimoBwdFwdOutputs,
)

__all__ = ["INPUT_NAMES", "OPTIONAL_INPUTS", "OUTPUT_NAMES", "MimoBwdFwdOutputs"]
