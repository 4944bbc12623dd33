"""Upstream's API for the Mamba-3 MIMO op, on the package: ``mimo_numerics.compat.mamba_ssm`` mirrors the import
paths and signatures of mamba-ssm 2.3.2.post1 for this op, each function taking one extra keyword, ``policy=``.

Modules (upstream's path under ``mamba_ssm.``, then what it offers here):

* ``ops.tilelang.mamba3.mamba3_mimo``: ``mamba3_mimo`` (the whole op, differentiable; ``return_state``);
* ``ops.tilelang.mamba3.mamba3_mimo_fwd``: ``mamba_mimo_forward`` (returns upstream's ``(o, final_state, final_k)``);
* ``ops.tilelang.mamba3.mamba3_mimo_bwd``: ``mamba_mimo_bwd_combined`` (stage 1, stage 2 and the FP32 helpers after
  them; upstream's 14-tuple, names and dtypes);
* ``ops.tilelang.mamba3.mamba3_mimo_fwd_varlen``, ``..._bwd_varlen``: ``mamba_mimo_forward_varlen``,
  ``mamba_mimo_bwd_combined_varlen`` (packed sequences, ``cu_seqlens``);
* ``ops.triton.mamba3.mamba3_mimo_utils``: ``compute_dacs_segsum_triton`` and ``..._varlen``;
* ``ops.triton.mamba3.angle_dt``: ``angle_dt_fwd`` (with ``return_output_state``);
* ``ops.triton.mamba3.mamba3_mimo_rotary_step``: ``apply_rotary_qk_inference_fwd`` (the decode step's rotary
  kernel);
* ``ops.cute.mamba3.mamba3_step_fn``: ``mamba3_step_fn`` (the decode step's state update and output, writing into
  the caller's buffers as upstream's CuTe kernel does; the whole policy step in the op's layouts is
  ``mimo_numerics.ops.mamba3_mimo.decode.mamba3_mimo_step``).

Launch knobs (``threads``, ``num_stages``, ``bf_threads``, ``bf_num_stages``, ``bb_threads``, ``bb_num_stages``) are
accepted and ignored: they choose how upstream's kernels are launched, not what they compute. ``policy`` defaults to
:func:`default_policy` everywhere (``"upstream_sm90"`` unless :func:`use_policy` says otherwise), and the backend to
``"reference"``. Deliberate differences are documented in ``docs/compat.md`` (under the ``fp64`` policy every
floating output is float64, for one).

To make ``import mamba_ssm...`` resolve here (for a test file written against upstream), call :func:`install`
(it registers the modules under the ``mamba_ssm`` names in ``sys.modules``), or run pytest with
``--mamba-ssm-compat`` (``--mamba-ssm-compat-policy NAME`` for another policy). :func:`uninstall` undoes it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Iterator, Optional

from .. import presets as _presets

#: The policy of every compat function when the call gives none and no :func:`use_policy` is active.
DEFAULT_POLICY = "upstream_sm90"
#: The backend of the whole op and the kernels' operators in the compat functions.
DEFAULT_BACKEND = "reference"
#: Upstream's module names this package provides, parents first.
MODULES = (
    "mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.tilelang", "mamba_ssm.ops.tilelang.mamba3",
    "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo", "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd",
    "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd", "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd_varlen",
    "mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd_varlen", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.mamba3",
    "mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils", "mamba_ssm.ops.triton.mamba3.angle_dt",
    "mamba_ssm.ops.triton.mamba3.mamba3_mimo_rotary_step", "mamba_ssm.ops.cute", "mamba_ssm.ops.cute.mamba3",
    "mamba_ssm.ops.cute.mamba3.mamba3_step_fn",
)
#: Launch keywords of upstream's functions, accepted and ignored.
LAUNCH_KNOBS = ("threads", "num_stages", "bf_threads", "bf_num_stages", "bb_threads", "bb_num_stages")

_active = {"policy": None, "backend": None}
_installed = {}


def default_policy():
    """The policy a compat call without ``policy=`` runs (a ``RoundingPolicy``)."""
    return _presets.resolve(_active["policy"] or DEFAULT_POLICY)


def default_backend() -> str:
    """The backend of the compat calls (``"reference"`` unless :func:`use_policy` says otherwise)."""
    return _active["backend"] or DEFAULT_BACKEND


def policy_for(policy, q):
    """``policy`` (None: :func:`default_policy`) as a ``RoundingPolicy`` at the lp dtype of ``q`` (upstream's
    functions take either lp dtype; a preset is one hardware/software setup for both)."""
    policy = default_policy() if policy is None else _presets.resolve(policy)
    lp = str(q.dtype).replace("torch.", "")
    if lp in ("bfloat16", "float16") and policy.lp_dtype != lp:
        return policy.replace(lp_dtype=lp)
    return policy


@contextlib.contextmanager
def use_policy(policy, backend: Optional[str] = None) -> Iterator[None]:
    """Within the block, compat calls without ``policy=`` run ``policy`` (a preset name, a ``RoundingPolicy`` or
    a policy JSON path; resolved now, so a bad name fails here) and, when given, ``backend``."""
    resolved = _presets.resolve(policy)
    if backend is not None and backend not in ("reference", "triton"):
        raise ValueError(f"backend must be 'reference' or 'triton', got {backend!r}")
    saved = dict(_active)
    _active.update(policy=resolved, backend=backend or saved["backend"])
    try:
        yield
    finally:
        _active.update(saved)


def set_default_policy(policy, backend: Optional[str] = None) -> None:
    """Make ``policy`` (and ``backend``) the default of compat calls until changed (the pytest option's way);
    None: back to :data:`DEFAULT_POLICY` and :data:`DEFAULT_BACKEND`."""
    if backend is not None and backend not in ("reference", "triton"):
        raise ValueError(f"backend must be 'reference' or 'triton', got {backend!r}")
    _active.update(policy=None if policy is None else _presets.resolve(policy), backend=backend)


def install() -> None:
    """Register the compat modules under upstream's names (``sys.modules["mamba_ssm..."]``), so that
    ``import mamba_ssm.ops.tilelang.mamba3.mamba3_mimo`` gives this package's. Raises ``ImportError`` if a real
    ``mamba_ssm`` is already imported (the two would mix)."""
    real = sys.modules.get("mamba_ssm")
    if real is not None and not getattr(real, "__mimo_numerics_compat__", False):
        raise ImportError("a real mamba_ssm is already imported in this process; install() would shadow it "
                          "half-way: call it before anything imports mamba_ssm")
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        if name not in _installed:
            _installed[name] = sys.modules.get(name)
        sys.modules[name] = module


def uninstall() -> None:
    """Undo :func:`install`: the ``mamba_ssm`` names get back what they held before (nothing, usually)."""
    for name, previous in reversed(list(_installed.items())):
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    _installed.clear()


def check_dtype(dtype, lp_dtype, argument: str = "dtype"):
    """Upstream's ``dtype`` argument (a ``torch.dtype`` or its name, ``"bfloat16"``) as a ``torch.dtype``; it must
    be the lp inputs' dtype."""
    import torch

    if isinstance(dtype, str):
        named = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
        if dtype not in named:
            raise TypeError(f"{argument} must be a torch.dtype or one of {sorted(named)}, got {dtype!r}")
        dtype = named[dtype]
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{argument} must be a torch.dtype or its name, got {type(dtype).__name__}")
    if dtype is not None and dtype != lp_dtype:
        raise TypeError(f"{argument}={dtype} does not match the dtype {lp_dtype} of q (upstream computes in dtype)")
    return lp_dtype
