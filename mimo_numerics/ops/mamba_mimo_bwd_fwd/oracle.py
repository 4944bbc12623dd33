"""FP64 oracle of ``mamba_mimo_bwd_fwd`` (stage 1 of the Mamba-3 MIMO backward): nothing rounded.

This is ``docs/semantics.md`` with every ``R_x`` the identity, unrounded outputs and the sigmoid SiLU, evaluated in
float64. It is written to share no computation with the chunked reference: no state recurrence and no chunked
GEMMs. Every output element is an explicit sum over tokens, formed with token-pair weight matrices:

* the weight of source token ``j`` (chunk ``c_j``) in ``states[c]`` (``c_j < c``) is
  ``exp(da_cs_rev[t_j]) · Π_{c''=c_j+1}^{c-1} exp(da_cs[last(c'')])``, with ``last(c'') = min((c''+1)·C, S) - 1``;
* the weight of source token ``j`` in the output row ``i`` (token ``t_i`` in chunk ``c_i``) is
  ``exp(da_cs[t_i]) · Π_{c''=c_j+1}^{c_i-1} exp(da_cs[last(c'')]) · exp(da_cs_rev[t_j])`` for ``c_j < c_i`` and
  ``exp(segsum[c_i, t_i mod C, t_j mod C])`` for ``c_j = c_i, t_j < t_i``.

Inside a chunk the weight is one ``exp``; across chunks it is the product of the three factors (equal in exact
arithmetic to one ``exp`` of the sum; in float64 a few ulp apart). Padded rows ``t >= S`` never contribute (their ``v`` and ``dt`` read as 0)
and their outputs are not stored, so only the ``S`` real tokens are formed. Across chunks the weight factors into
``exp(da_cs[t_i])``, a chunk-pair factor and ``exp(da_cs_rev[t_j])``, so those pairs are summed as an explicit sum
over the earlier chunks of per-chunk totals (:class:`~mimo_numerics.ops._oracle.pair_weights.ChunkPairs`; no
recurrence: nothing is carried from chunk to chunk); memory ``O(B·H·S·(C·R² + N·P/C))``.
"""

from __future__ import annotations

import torch

from .._oracle.pair_weights import ChunkPairs
from .outputs import MimoBwdFwdOutputs
from .validation import validate_inputs

_F64 = torch.float64


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> torch.Tensor:
    """Rotary on columns ``[0, width)`` paired with ``[N/2, N/2 + width)``; other columns unchanged.

    Args:
        x (Tensor): ``[B, H, S, R, N]`` float64.
        cos, sin (Tensor): ``[B, H, S, 1, width]`` float64.
    """
    half = x.shape[-1] // 2
    first = x[..., :width]
    second = x[..., half:half + width]
    out = x.clone()
    out[..., :width] = cos * first - sin * second
    out[..., half:half + width] = sin * first + cos * second
    return out


def mamba_mimo_bwd_fwd_oracle(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4,
) -> MimoBwdFwdOutputs:
    """Stage 1 of the MIMO backward in float64 with no rounding (``docs/semantics.md``, every ``R_x`` = identity).

    Args:
        dout (Tensor): ``[B, S, H, P]`` with ``mimo_o`` (reduced DOUT), else ``[B, S, R, H, P]``; lp.
        q, k (Tensor): ``[B, S, R, G, N]`` lp.
        v (Tensor): ``[B, S, H, P]`` lp.
        q_bias, k_bias (Tensor): ``[H, R, N]`` fp32.
        mimo_v (Tensor): Ψ, ``[H, R, P]`` fp32.
        mimo_o (Tensor | None): Φ, ``[H, R, P]`` fp32.
        z (Tensor | None): ``[B, S, H, P]`` lp (with ``mimo_z``).
        mimo_z (Tensor | None): ζ, ``[H, R, P]`` fp32.
        angles (Tensor): ``[B, S, H, N / rotary_dim_divisor]`` fp32.
        da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]`` fp32.
        trap (Tensor): ``[B, H, S]`` lp.
        d (Tensor | None): ``[H]`` fp32.
        segsum (Tensor): ``[B, H, nc, C, C]`` fp32.
        chunk_size (int): C.
        rotary_dim_divisor (int): 2 or 4.

    Returns:
        MimoBwdFwdOutputs: all float64 on the input device, unrounded: ``dmimo_o [B, H, R, P]`` (per batch; None
        without ``mimo_o``), ``states [B, H, nc, N, P]``, ``dz [B, S, H, P]`` and ``dmimo_z [B, H, R, P]`` (None
        without ``z``), ``qk_dot [B, H, S, R, R]``.

    Raises:
        TypeError, ValueError: from ``validation.validate_inputs``.
    """
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                           trap, d, segsum, chunk_size, rotary_dim_divisor)
    # contiguous inputs: einsum reduces in the order of the operands' strides, so the bits would depend on layout
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum = (
        None if t is None else t.contiguous() for t in (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z,
                                                         angles, da_cs, da_cs_rev, dt, trap, d, segsum))
    B, S, H, N, P, R = dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank
    C, nc, width = dims.chunk_size, dims.nchunks, dims.state_dim // dims.rotary_dim_divisor
    device = dims.device

    # ---- per-token quantities, layout [B, H, S, R, *] ----
    def per_head(x):  # [B, S, R, G, N] -> [B, H, S, R, N]; head h reads group h // (H // G)
        return x.to(_F64).repeat_interleave(dims.heads_per_group, dim=3).permute(0, 3, 1, 2, 4)

    q_biased = per_head(q) + q_bias.to(_F64)[None, :, None]
    k_biased = per_head(k) + k_bias.to(_F64)[None, :, None]
    qk_dot = torch.einsum("bhsrn,bhsun->bhsru", q_biased, k_biased)  # [B, H, S, R, R]

    theta = angles.to(_F64).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, width]
    cos, sin = torch.cos(theta), torch.sin(theta)
    q_rot = _rotate(q_biased, cos, sin, width)
    k_rot = _rotate(k_biased, cos, sin, width)

    dt64, trap64 = dt.to(_F64), trap.to(_F64)  # [B, H, S]
    gamma = dt64 * torch.sigmoid(trap64)
    shifted_gamma = torch.zeros_like(gamma)
    shifted_gamma[..., :-1] = dt64[..., 1:] * torch.sigmoid(-trap64[..., 1:])
    trap_scale = gamma + shifted_gamma
    k_hat = k_rot * trap_scale[..., None, None]  # [B, H, S, R, N]

    v64 = v.to(_F64).permute(0, 2, 1, 3)  # [B, H, S, P]
    psi_v = v64[:, :, :, None, :] * mimo_v.to(_F64)[None, :, None]  # [B, H, S, R, P]

    # ---- decay weights between tokens: a chunk's own pairs, and sums over earlier chunks' totals ----
    pairs = ChunkPairs(da_cs, da_cs_rev, segsum, C)
    q_c, k_c, psi_c = pairs.by_chunk(q_rot, 2), pairs.by_chunk(k_hat, 2), pairs.by_chunk(psi_v, 2)

    # states[c] = Σ_{c' < c} E[c, c'] Σ_{j in c'} exp(da_cs_rev[t_j]) · k̂[j]ᵀ ΨV[j]   (sum over t_j and rank)
    totals = torch.einsum("bhcs,bhcsun,bhcsup->bhcnp", pairs.leave, k_c, psi_c)  # [B, H, nc, N, P]
    states = pairs.from_earlier_chunks(totals)

    outputs_needed = dims.reduce_o or dims.has_z
    dmimo_o = dz = dmimo_z = None
    if outputs_needed:
        # earlier chunks through their totals, read at t_i with exp(da_cs[t_i]); then the chunk's own pairs
        out_c = pairs.read[..., None, None] * torch.einsum("bhcirn,bhcnp->bhcirp", q_c, states)
        scores = torch.einsum("bhcirn,bhcjsn->bhcirjs", q_c, k_c)  # q_rot[i, r_i] · k̂[j, r_j], one chunk
        weighted = scores * pairs.intra[:, :, :, :, None, :, None]
        out = pairs.to_tokens(out_c + torch.einsum("bhcirjs,bhcjsp->bhcirp", weighted, psi_c), 2)
        # same-token term: γ_t · Σ_{r_in} qk[t, r_out, r_in] · ΨV[t, r_in]
        out = out + gamma[..., None, None] * torch.einsum("bhsru,bhsup->bhsrp", qk_dot, psi_v)
        if dims.has_d:
            out = out + d.to(_F64)[None, :, None, None, None] * psi_v

        if dims.has_z:
            z64 = z.to(_F64).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, P]
            zeta = mimo_z.to(_F64)[None, :, None]  # [1, H, 1, R, P]
            x = z64 * zeta
            sig = torch.sigmoid(x)
            gate = x * sig
        if dims.reduce_o:
            dout_r = dout.to(_F64).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, P]
            gated = gate * out if dims.has_z else out
            dmimo_o = (gated * dout_r).sum(dim=2)  # [B, H, R, P]
            if dims.has_z:
                d_phi_o = dout_r * mimo_o.to(_F64)[None, :, None] * out
        elif dims.has_z:
            d_phi_o = dout.to(_F64).permute(0, 3, 1, 2, 4) * out  # dout [B, S, R, H, P] -> [B, H, S, R, P]
        if dims.has_z:
            dz_zeta = d_phi_o * sig * (1 + x * torch.sigmoid(-x))  # [B, H, S, R, P]
            dz = (dz_zeta * zeta).sum(dim=3).permute(0, 2, 1, 3).contiguous()  # [B, S, H, P]
            dmimo_z = (dz_zeta * z64).sum(dim=2)  # [B, H, R, P]

    return MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states.contiguous(), dz=dz, dmimo_z=dmimo_z,
                             qk_dot=qk_dot.contiguous())
