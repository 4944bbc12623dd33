"""``mimo_numerics.golden``: stage 1's golden data, re-exported for users from
:mod:`mimo_numerics.ops.mamba_mimo_bwd_fwd.golden`.

The module lives in stage 1's operator folder; code inside the package, the scripts and the tests import it from
there (``tests/test_layout.py`` refuses an internal import of this alias).
"""

from .ops.mamba_mimo_bwd_fwd.golden import (  # noqa: F401
    DEFAULT_PATH, DEFAULT_CASE, PathLike, default_path, load_golden, golden_names, golden_case,
    upstream_outputs, golden_kwargs, stored_cases,
)

__all__ = ["DEFAULT_PATH", "DEFAULT_CASE", "PathLike", "default_path", "load_golden",
           "golden_names", "golden_case", "upstream_outputs", "golden_kwargs", "stored_cases"]
