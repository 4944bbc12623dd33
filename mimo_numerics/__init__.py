"""mimo_numerics: rounding semantics of the Mamba-3 MIMO backward kernel ``mamba_mimo_bwd_fwd``.

Main entry points::

    import mimo_numerics as mn
    policy = mn.presets.get("upstream_sm90")
    out = mn.reference.mamba_mimo_bwd_fwd(*tensors, chunk_size=16, rotary_dim_divisor=4, policy=policy)
    ref64 = mn.oracle.mamba_mimo_bwd_fwd_oracle(*tensors, chunk_size=16, rotary_dim_divisor=4)
    mn.metrics.rel_rms(out.dz, ref64.dz)
"""

from . import outputs, policy, presets, reference, rounding, validation  # noqa: F401
from .outputs import INPUT_NAMES, OUTPUT_NAMES, MimoBwdFwdOutputs  # noqa: F401
from .policy import RoundingPolicy  # noqa: F401

__version__ = "0.1.0"


_LAZY_MODULES = ("oracle", "cases", "metrics", "tolerances", "bundles", "upstream", "envinfo", "golden", "drift",
                 "sensitivity", "inference", "sweep", "report", "plots", "testing", "kernels")


def __getattr__(name):
    # modules with heavier imports load on first use
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mimo_numerics' has no attribute {name!r}")
