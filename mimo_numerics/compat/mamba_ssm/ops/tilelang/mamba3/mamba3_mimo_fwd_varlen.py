"""Upstream's ``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd_varlen``: ``mamba_mimo_forward_varlen``
(``mimo_numerics.compat``)."""

from __future__ import annotations

from mimo_numerics import compat
from mimo_numerics.compat import _varlen_rows
from mimo_numerics.ops.mamba3_mimo import varlen
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd as _forward_reference

from .mamba3_mimo_fwd import mamba_mimo_forward


def mamba_mimo_forward_varlen(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, D, mimo_z, angles, dA_cs, dA_cs_rev, dt,
                              trap, segsum, chunk_size, rotary_dim_divisor, dtype, cu_seqlens=None,
                              return_state: bool = False, threads: int = 128, num_stages: int = 0, *, policy=None):
    """Upstream's varlen forward under ``policy``: ``cu_seqlens`` None is :func:`mamba_mimo_forward`; else the
    packed sequences (``B = 1``; ``segsum`` in the global chunk layout of
    ``compute_dacs_segsum_triton_varlen``) run as batch rows of the forward reference.

    Returns:
        tuple: ``(o [1, S, ...], final_state [NS, H, N, P], final_k [NS, R, H, N])`` (the last two None without
        ``return_state``).
    """
    if cu_seqlens is None:
        return mamba_mimo_forward(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, D, mimo_z, angles, dA_cs, dA_cs_rev,
                                  dt, trap, segsum, chunk_size, rotary_dim_divisor, dtype, return_state, threads,
                                  num_stages, policy=policy)
    del threads, num_stages  # launch knobs
    compat.check_dtype(dtype, q.dtype)
    policy = compat.policy_for(policy, q)
    args = dict(q=q, k=k, v=v, z=z, angles=angles, dA_cs=dA_cs, dA_cs_rev=dA_cs_rev, dt=dt, trap=trap)
    rows, seg_rows, bounds = _varlen_rows.to_rows(args, segsum, cu_seqlens, chunk_size)
    out = _forward_reference(rows["q"], rows["k"], rows["v"], q_bias, k_bias, mimo_v, mimo_o, rows["z"], D, mimo_z,
                             rows["angles"], rows["dA_cs"], rows["dA_cs_rev"], rows["dt"], rows["trap"], seg_rows,
                             chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor, policy=policy,
                             return_state=bool(return_state),
                             final_tokens=varlen.last_tokens(bounds) if return_state else None)
    o = varlen.unpack(out.o, bounds)
    if return_state:
        return o, out.final_state, out.final_k
    return o, None, None
