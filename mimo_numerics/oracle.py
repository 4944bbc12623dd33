"""``mimo_numerics.oracle``: stage 1's FP64 oracle, re-exported for users from
:mod:`mimo_numerics.ops.mamba_mimo_bwd_fwd.oracle`.

The module lives in stage 1's operator folder; code inside the package, the scripts and the tests import it from
there (``tests/test_layout.py`` refuses an internal import of this alias).
"""

from .ops.mamba_mimo_bwd_fwd.oracle import (  # noqa: F401
    mamba_mimo_bwd_fwd_oracle,
)

__all__ = ["mamba_mimo_bwd_fwd_oracle"]
