"""Upstream's ``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd_varlen``: ``mamba_mimo_bwd_combined_varlen``
(``mimo_numerics.compat``)."""

from __future__ import annotations

from mimo_numerics.compat import _varlen_rows
from mimo_numerics.ops.mamba3_mimo import varlen

from .mamba3_mimo_bwd import mamba_mimo_bwd_combined

#: The time axis of upstream's 14 outputs (None: a parameter gradient, summed over every token and sequence).
_OUTPUT_TIME_AXES = (1, 1, 1, 2, 2, 2, None, None, None, None, None, 1, None, 1)


def mamba_mimo_bwd_combined_varlen(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, dA_cs,
                                   dA_cs_rev, dt, trap, D, segsum, chunk_size, rotary_dim_divisor, dtype,
                                   cu_seqlens=None, bf_threads: int = 128, bf_num_stages: int = 0,
                                   bb_threads: int = 256, bb_num_stages: int = 0, *, policy=None):
    """Upstream's varlen backward under ``policy``: ``cu_seqlens`` None is ``mamba_mimo_bwd_combined``; else the
    packed sequences (``B = 1``; ``segsum`` in the global chunk layout) run as batch rows of
    ``mamba_mimo_bwd_combined`` and the per-token gradients are gathered back; the parameter gradients are its
    sums over every row (every token and sequence, as upstream's ``sum(dim=(0, 1))`` / ``sum(dim=(0, 2))``).

    Returns:
        tuple: upstream's 14 gradients, packed ``[1, S, ...]`` / ``[1, H, S]`` where per token.
    """
    if cu_seqlens is not None:
        args = dict(q=q, k=k, v=v, z=z, angles=angles, dA_cs=dA_cs, dA_cs_rev=dA_cs_rev, dt=dt, trap=trap,
                    dout=dout)
        rows, segsum, bounds = _varlen_rows.to_rows(args, segsum, cu_seqlens, chunk_size)
        q, k, v, z, angles, dA_cs, dA_cs_rev, dt, trap, dout = (
            rows[n] for n in ("q", "k", "v", "z", "angles", "dA_cs", "dA_cs_rev", "dt", "trap", "dout"))
    grads = mamba_mimo_bwd_combined(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, dA_cs,
                                    dA_cs_rev, dt, trap, D, segsum, chunk_size, rotary_dim_divisor, dtype,
                                    bf_threads, bf_num_stages, bb_threads, bb_num_stages, policy=policy)
    if cu_seqlens is None:
        return grads
    return tuple(g if g is None or axis is None else varlen.unpack(g, bounds, axis)
                 for g, axis in zip(grads, _OUTPUT_TIME_AXES))
