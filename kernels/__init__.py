"""Policy-configured Triton kernels of ``mamba_mimo_fwd``, ``mamba_mimo_bwd_fwd`` and ``mamba_mimo_bwd_bwd``
(installed as ``mimo_numerics.kernels``).

Usage::

    import mimo_numerics as mn
    from mimo_numerics import kernels
    out = kernels.mamba_mimo_bwd_fwd(*tensors, chunk_size=16, rotary_dim_divisor=4,
                                     policy=mn.presets.get("upstream_sm90"))
    o = kernels.mamba_mimo_fwd(*forward_tensors, chunk_size=16, rotary_dim_divisor=4, policy="upstream_sm90").o
    grads = kernels.mamba_mimo_bwd_bwd(*stage2_tensors, chunk_size=16, rotary_dim_divisor=4, policy="upstream_sm90")

CPU tensors run in Triton's interpreter (set up internally: nothing to export), CUDA tensors run compiled, NPU
tensors go to triton-ascend. Importing this package never imports ``triton``; calling the kernels without it
raises ``ImportError`` naming the extra to install. Benchmarks pass per-call overrides of tiles, warps and the
bit-identical code forms of the forward and stage 1 as ``tuning={...}`` (keys ``TUNING_KEYS``); ``launch_config``
shows the frozen ``LaunchConfig`` (constexprs, grids, launch options) a call would use. Stage 2's kernels take a
plan (``mimo_bwd_bwd.Stage2Tiles``) through ``mimo_bwd_bwd.build_launches(..., tiles=)`` only, and refuse NPU tensors
beyond their Ascend bounds (``mimo_bwd_bwd.backend_refusal``). Design, grids and rounding sites:
``docs/kernels.md``.
"""

from .mimo_bwd_fwd import (  # noqa: F401
    INTERPRETER_LIMIT_S,
    SUPPORTED_DIMS,
    TUNING_KEYS,
    LaunchConfig,
    SlowInterpreterError,
    UnsupportedPolicyError,
    estimate_interpreter_seconds,
    launch_config,
    mamba_mimo_bwd_fwd,
    plan,
    policy_constexprs,
    triton_available,
)
from ._compile_ahead import CompileAheadReport, compile_ahead  # noqa: F401
from .mimo_fwd import mamba_mimo_fwd  # noqa: F401
from .mimo_bwd_bwd import mamba_mimo_bwd_bwd, stage2_constexprs  # noqa: F401
from .chain_steps import chain_constexprs  # noqa: F401


def operator_constexprs(policy, operator: str) -> dict:
    """The constexprs of ``operator``'s kernels under ``policy`` (``policy_constexprs`` for the forward and stage 1,
    ``stage2_constexprs`` for stage 2): raises ``UnsupportedPolicyError`` / ``PolicyUndefined`` for a policy they
    cannot express."""
    if operator == "mamba_mimo_bwd_bwd":
        return stage2_constexprs(policy)
    return policy_constexprs(policy, operator)

__all__ = ["mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd", "stage2_constexprs", "chain_constexprs",
           "operator_constexprs",
           "policy_constexprs", "launch_config", "LaunchConfig",
           "TUNING_KEYS", "UnsupportedPolicyError", "SlowInterpreterError", "triton_available",
           "estimate_interpreter_seconds", "plan", "SUPPORTED_DIMS", "INTERPRETER_LIMIT_S", "compile_ahead",
           "CompileAheadReport"]
