"""Upstream's ``mamba_ssm.ops.cute.mamba3.mamba3_step_fn``: ``mamba3_step_fn``, the second kernel of upstream's
decode step (the state update and the output; CuTe DSL upstream), under a rounding policy (``mimo_numerics.compat``).

Like upstream's, the function returns nothing: it writes the new state into ``state_out`` (into ``state`` when
``state_out`` is None) and the output into ``out``. The stores land in those buffers, so their dtypes are the
caller's, as upstream's kernel stores into them (``out`` in x's dtype: the policy's ``round_outputs`` site rounds
it there; a float32 ``state`` is not rounded). Under the ``fp64`` policy pass float64 buffers to keep the FP64
values. The math is :func:`mimo_numerics.ops.mamba3_mimo.decode.state_update` (``docs/compat.md`` lists what it
models of upstream's kernel): ``α = exp(A·dt)``, ``γ = trap·dt``, ``β = ((1 - trap)·dt)·α`` with ``trap`` the gate
``σ(trap_proj)`` as upstream's caller passes it. As upstream's kernel, the gate ``z`` acts only with ``outproj``
(without it the output is per rank, ``[B, R, H, D]``, ungated). ``tile_D`` and ``num_warps`` are launch knobs:
accepted and ignored; the kernel's own limits (``dstate`` in 32/64/128, ``hdim`` a multiple of ``tile_D``) are not
enforced here. Its launcher's layout contract is (16-byte aligned data and rows, contiguous last dimensions:
``_check_layout``), so a call upstream refuses for its layout is refused here too.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from mimo_numerics import compat
from mimo_numerics.ops.mamba3_mimo.decode import state_update


def _check(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj, state_out, out, z, zproj) -> None:
    """Upstream's shape contract, as errors naming the argument (upstream asserts)."""
    named = {"state": state, "Bstate": Bstate, "Xstate": Xstate, "A": A, "B": B, "C": C, "D": D, "x": x, "dt": dt,
             "trap": trap, "xproj": xproj, "out": out}
    for name, value in named.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if state.dim() != 4:
        raise ValueError(f"state must be [B, H, D, N], got shape {list(state.shape)}")
    batch, nheads, hdim, dstate = state.shape
    if Bstate.dim() != 4:
        raise ValueError(f"Bstate must be [B, R, H, N], got shape {list(Bstate.shape)}")
    mimo = Bstate.shape[1]
    per_rank = (mimo, nheads, hdim)
    expected = {"Bstate": (Bstate, (batch, mimo, nheads, dstate)), "Xstate": (Xstate, (batch, nheads, hdim)),
                "A": (A, (batch, nheads)), "B": (B, (batch, mimo, nheads, dstate)),
                "C": (C, (batch, mimo, nheads, dstate)), "D": (D, (nheads,)), "x": (x, (batch, nheads, hdim)),
                "dt": (dt, (batch, nheads)), "trap": (trap, (batch, nheads)), "xproj": (xproj, per_rank),
                "outproj": (outproj, per_rank), "z": (z, (batch, nheads, hdim)), "zproj": (zproj, per_rank),
                "state_out": (state_out, tuple(state.shape)),
                "out": (out, (batch, nheads, hdim) if outproj is not None else (batch, mimo, nheads, hdim))}
    for name, (value, shape) in expected.items():
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")
    if (z is None) != (zproj is None):
        raise ValueError("z and zproj must be given together (the gate) or both be None")
    if state.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"state must be float16, bfloat16 or float32 (float64 under the fp64 policy), got "
                        f"{state.dtype}")
    pairs = (("state_out", state_out, "state", state), ("out", out, "x", x), ("z", z, "x", x),
             ("B", B, "Bstate", Bstate), ("C", C, "Bstate", Bstate), ("outproj", outproj, "xproj", xproj),
             ("zproj", zproj, "xproj", xproj))
    for name, value, other_name, other in pairs:
        if value is not None and value.dtype != other.dtype:
            raise TypeError(f"{name} must have {other_name}'s dtype {other.dtype} (upstream's kernel is compiled "
                            f"for one), got {value.dtype}")
    devices = {value.device for value in (*named.values(), outproj, state_out, z, zproj) if value is not None}
    if len(devices) > 1:
        raise ValueError(f"every tensor must be on one device, got {sorted(map(str, devices))}")


def _check_layout(tensors: dict) -> None:
    """Upstream's compiled layout contract, as errors naming the argument (upstream's tvm-ffi launcher refuses these;
    seen on an H200, ``docs/compat.md``): each tensor contiguous in its last dimension, every other stride of a
    dimension longer than 1 a multiple of 16 bytes, and the data 16-byte aligned. So a float32 ``[B, H]`` argument
    needs ``H`` a multiple of 4 when ``B > 1``, and a token's slice ``x[t]`` of a ``[T, ...]`` tensor may start off
    the alignment (pass a fresh tensor, as ``Mamba3.step`` does)."""
    for name, value in tensors.items():
        if value is None:
            continue
        per_16_bytes = max(1, 16 // value.element_size())
        strides = list(value.stride())
        if value.dim() and value.shape[-1] > 1 and value.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride 1), got strides {strides}")
        for dim in range(value.dim() - 1):
            if value.shape[dim] > 1 and value.stride(dim) % per_16_bytes:
                raise ValueError(
                    f"{name}.stride({dim}) must be a multiple of {per_16_bytes} (16 bytes of {value.dtype}: upstream's "
                    f"kernel is compiled for 16-byte aligned rows), got strides {strides} for shape "
                    f"{list(value.shape)}; for a float32 [B, H] argument nheads must be a multiple of 4 when B > 1")
        if value.data_ptr() % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address (upstream's kernel loads 16 bytes at a "
                             f"time), got an offset of {value.data_ptr() % 16} bytes; a slice such as x[t] of a "
                             "[T, ...] tensor may be off it: pass a fresh tensor (x[t].clone())")


def mamba3_step_fn(state: Tensor, Bstate: Tensor, Xstate: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor,
                   x: Tensor, dt: Tensor, trap: Tensor, xproj: Tensor, outproj: Optional[Tensor] = None,
                   state_out: Optional[Tensor] = None, out: Tensor = None, z: Optional[Tensor] = None,
                   zproj: Optional[Tensor] = None, tile_D: int = 64, num_warps: int = 2, *, policy=None) -> None:
    """Upstream's decode state update and output under ``policy`` (default ``compat.default_policy()``).

    Args: upstream's (B batch, H heads, D head dim, N state dim, R rank): state ``[B, H, D, N]`` (updated in place
    when ``state_out`` is None); Bstate ``[B, R, H, N]`` the previous token's rotated k; Xstate ``[B, H, D]`` its
    x; A, dt, trap ``[B, H]`` (trap the gate ``σ(trap_proj)``); B, C ``[B, R, H, N]`` the rotated k and q;
    D ``[H]``; x ``[B, H, D]``; xproj, outproj, zproj ``[R, H, D]``; out ``[B, H, D]``, or ``[B, R, H, D]``
    without ``outproj``; z ``[B, H, D]``. ``tile_D``, ``num_warps``: accepted and ignored.

    Raises:
        TypeError, ValueError: naming the argument (upstream's asserts and its launcher's layout checks).
    """
    _check(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj, state_out, out, z, zproj)
    _check_layout(dict(state=state, Bstate=Bstate, Xstate=Xstate, A=A, B=B, C=C, D=D, x=x, dt=dt, trap=trap,
                       xproj=xproj, outproj=outproj, state_out=state_out, out=out, z=z, zproj=zproj))
    policy = compat.policy_for(policy, x)
    math_dtype = policy.math_torch_dtype
    adt = A.to(math_dtype) * dt.to(math_dtype)  # the kernel's A·dt, one product in the math dtype
    gated = outproj is not None and z is not None
    y, new_state = state_update(C, B, x, adt, dt, trap, xproj, zproj if gated else None, outproj, D,
                                z if gated else None, state, Bstate, Xstate, policy=policy)
    (state if state_out is None else state_out).copy_(new_state)
    out.copy_(y)
