"""``mimo_numerics.reference_cpu`` is :mod:`mimo_numerics.ops.mamba_mimo_bwd_fwd.reference_cpu` (stage 1's reference cpu):
the same module object under its old public path.

An alias by identity, not a re-export: the module holds settings users change at run time (``BLOCK_CHUNKS``,
``BLOCK_ELEMENTS``), and a re-exported copy of such a flag would be set without effect. Code inside the package,
the scripts and the tests import the operator module itself (``tests/test_layout.py`` refuses an internal import
of this alias).
"""

import sys

from .ops.mamba_mimo_bwd_fwd import reference_cpu as _module

sys.modules[__name__] = _module
