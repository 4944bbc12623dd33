"""``mimo_numerics.reference_cpu`` is :mod:`mimo_numerics.ops.mamba_mimo_bwd_fwd.reference_cpu` (stage 1's reference cpu, in its operator
folder): this module makes the old import path the same module object, so the public stage-1 API keeps working."""

import sys

from .ops.mamba_mimo_bwd_fwd import reference_cpu as _module

sys.modules[__name__] = _module
