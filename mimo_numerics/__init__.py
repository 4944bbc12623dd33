"""mimo_numerics: rounding semantics of the Mamba-3 MIMO op's kernels (forward, backward stage 1 and stage 2).

Main entry points::

    import mimo_numerics as mn
    policy = mn.presets.get("upstream_sm90")                    # one policy for every kernel of the op
    out = mn.mamba_mimo_fwd(*fwd_tensors, chunk_size=16, rotary_dim_divisor=4, policy=policy)          # forward
    out = mn.mamba_mimo_bwd_fwd(*tensors, chunk_size=16, rotary_dim_divisor=4, policy=policy)          # stage 1
    out = mn.mamba_mimo_bwd_bwd(*stage2_tensors, chunk_size=16, rotary_dim_divisor=4, policy=policy)   # stage 2
    ref64 = mn.oracle.mamba_mimo_bwd_fwd_oracle(*tensors, chunk_size=16, rotary_dim_divisor=4)
    mn.metrics.rel_rms(out.dz, ref64.dz)
    out = mn.mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                         chunk_size=16, rotary_dim_divisor=4, policy=policy)   # the whole op, with autograd
    out.backward(dout)                                          # every input's .grad, as upstream computes them
    op = mn.operator.get("mamba_mimo_fwd")                      # what the generic tools know of an operator

``mn.reference.mamba_mimo_bwd_fwd`` is the same function as ``mn.mamba_mimo_bwd_fwd``.
"""

from . import outputs, policy, presets, reference, rounding, validation  # noqa: F401
from .outputs import INPUT_NAMES, OUTPUT_NAMES, MimoBwdFwdOutputs  # noqa: F401
from .policy import RoundingPolicy  # noqa: F401
from .reference import mamba_mimo_bwd_fwd  # noqa: F401

__version__ = "0.1.0"


_LAZY_MODULES = ("oracle", "cases", "metrics", "tolerances", "bundles", "upstream", "envinfo", "golden", "drift",
                 "sensitivity", "inference", "sweep", "report", "plots", "testing", "kernels", "operator",
                 "exact_random", "ops")
#: The other operators' entry points, loaded on first use: name -> (module, attribute).
_LAZY_FUNCTIONS = {
    "mamba_mimo_fwd": ("mimo_numerics.ops.mamba_mimo_fwd.reference", "mamba_mimo_fwd"),
    "mamba_mimo_bwd_bwd": ("mimo_numerics.ops.mamba_mimo_bwd_bwd.reference", "mamba_mimo_bwd_bwd"),
    "mamba3_mimo": ("mimo_numerics.ops.mamba3_mimo.autograd", "mamba3_mimo"),
    "precompile_mamba3_mimo": ("mimo_numerics.ops.mamba3_mimo.autograd", "precompile_mamba3_mimo"),
}


def __getattr__(name):
    # modules with heavier imports load on first use
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_FUNCTIONS:
        module, attribute = _LAZY_FUNCTIONS[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'mimo_numerics' has no attribute {name!r}")
