"""FP64 oracle of ``mamba_mimo_fwd``, the forward kernel of the Mamba-3 MIMO op: nothing rounded.

Written from the definitions (``docs/fp64_model.md``; upstream ``ops/tilelang/mamba3/mamba3_mimo_fwd.py``) as
explicit sums over token pairs: no state recurrence. The pairs of one chunk are summed pair by pair; the pairs
across chunks, whose weight factors (below), as an explicit sum over the earlier chunks of per-chunk totals
(:class:`~mimo_numerics.ops._oracle.pair_weights.ChunkPairs`), so memory is ``O(B·H·S·(C·R² + N·P/C))``. With, per batch b and head h (group
``g = h // (H / G)``), token t in chunk ``c_t`` and rank r::

    q̂[t, r] = q[t, r, g] + q_bias[h, r]          k̂ likewise                    (biased, unrotated)
    q̃, k̃    = q̂, k̂ with columns (a, N/2 + a), a < N / divisor, rotated by angles[t, a]
    γ[t]     = dt[t] · σ(trap[t])                 γ'[t] = dt[t+1] · σ(-trap[t+1]) (0 at t = S - 1)
    ΨV[t, r] = v[t] ⊙ mimo_v[h, r]
    o[t, r]  = Σ_{s < t} w(s, t) · (γ[s] + γ'[s]) · Σ_{r'} (q̃[t, r] · k̃[s, r']) ΨV[s, r']
             + γ[t] · Σ_{r'} (q̂[t, r] · k̂[t, r']) ΨV[t, r']  +  d[h] · ΨV[t, r]

The same-token term uses the unrotated q̂, k̂ (both tokens rotate by the same angle, so it is the same dot product)
and γ alone; sources are scaled by the trapezoid factor γ + γ'. The pair weight is, from the kernel's inputs,

* ``w(s, t) = exp(segsum[c_t, t mod C, s mod C])`` for ``c_s = c_t``;
* ``w(s, t) = exp(da_cs[t] + Σ_{c_s < c < c_t} da_cs[last(c)] + da_cs_rev[s])`` for ``c_s < c_t``, with
  ``last(c) = min((c + 1)·C, S) - 1``: the state leaves chunk ``c_s`` scaled by ``exp(da_cs_rev[s])``, decays by
  ``exp(da_cs[last(c)])`` through every chunk in between and is read by token t with ``exp(da_cs[t])``.

Inside a chunk the weight is one ``exp``; across chunks it is the product ``exp(da_cs[t])·exp(Σ ...)·exp(da_cs_rev[s])``,
so that the sum over the sources of every earlier chunk is a sum over those chunks of per-chunk totals. The output is, with the SiLU gate
``ζ[t, r] = silu(z[t] ⊙ mimo_z[h, r])`` (``x·σ(x)``; upstream's ``g·tanh(g) + g``, ``g = x/2``, is the same
function) or 1 without z: ``O[t] = Σ_r o[t, r] ⊙ mimo_o[h, r] ⊙ ζ[t, r]`` (reduced, ``[B, S, H, P]``), else
``O[t, r] = o[t, r] ⊙ ζ[t, r]`` (``[B, S, R, H, P]``). Tokens past S (a tail chunk) are not formed: the kernel reads
them as zeros (dt = 0, so their trapezoid factor is 0) and stores none of their outputs.
"""

from __future__ import annotations

import torch

from .._oracle.pair_weights import ChunkPairs
from .validation import validate_inputs

_F64 = torch.float64


def _rotate_pairs(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate columns ``(a, N/2 + a)`` of ``x`` by ``theta[..., a]`` for ``a < K``; other columns unchanged.

    Args:
        x (Tensor): ``[B, H, S, R, N]`` float64. theta (Tensor): ``[B, H, S, 1, K]`` float64.
    """
    width, half = theta.shape[-1], x.shape[-1] // 2
    cos, sin = torch.cos(theta), torch.sin(theta)
    first, second = x[..., :width], x[..., half:half + width]
    return torch.cat([cos * first - sin * second, x[..., width:half],
                      sin * first + cos * second, x[..., half + width:]], dim=-1)


def mamba_mimo_fwd_oracle(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt,
                          trap, segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4,
                          return_state: bool = False, final_tokens=None):
    """The forward kernel's output in float64 with no rounding (module docstring for the math).

    Args (upstream's ``mamba_mimo_forward`` order):
        q, k (Tensor): ``[B, S, R, G, N]``. v (Tensor): ``[B, S, H, P]``.
        q_bias, k_bias (Tensor): ``[H, R, N]``. mimo_v (Tensor): Ψ, ``[H, R, P]``.
        mimo_o (Tensor | None): Φ, ``[H, R, P]``; None for the non-reduced output.
        z (Tensor | None): ``[B, S, H, P]`` (with ``mimo_z``). d (Tensor | None): ``[H]``.
        mimo_z (Tensor | None): ζ, ``[H, R, P]``.
        angles (Tensor): ``[B, S, H, N / rotary_dim_divisor]``, the cumulative angles (``angle_dt_fwd``'s output).
        da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]``. trap (Tensor): ``[B, H, S]``, before the sigmoid.
        segsum (Tensor): ``[B, H, nc, C, C]``.
        chunk_size (int): C. rotary_dim_divisor (int): 2 or 4.
        return_state (bool): also the final state and k of upstream's ``return_state=True``.
        final_tokens (sequence of int, optional): the token of each batch row whose k is the final k (default
            S − 1).
        Dtypes: see ``validation.validate_inputs`` (upstream's, or float64).

    Returns:
        Tensor: float64 on the input device, ``[B, S, H, P]`` with ``mimo_o``, else ``[B, S, R, H, P]``. With
        ``return_state`` a triple ``(o, final_state [B, H, N, P], final_k [B, R, H, N])``: the state after the
        last chunk, ``Σ_s exp(da_cs_rev[s] + Σ_{c_s < c < nc} Λ_c) (γ + γ')[s] Σ_r k̃[s, r]ᵀ ΨV[s, r]``, and the
        last token's biased, rotated k.

    Raises:
        TypeError, ValueError: from ``validation.validate_inputs``, naming the argument.
    """
    dims = validate_inputs(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt,
                           trap, segsum, chunk_size, rotary_dim_divisor, wide=True)
    B, S, H, P, R, C = dims.batch, dims.seqlen, dims.heads, dims.value_dim, dims.rank, dims.chunk_size

    def per_head(x):  # [B, S, R, G, N] -> [B, H, S, R, N]
        return x.to(_F64).repeat_interleave(dims.heads_per_group, dim=3).permute(0, 3, 1, 2, 4)

    q_hat = per_head(q) + q_bias.to(_F64)[None, :, None]
    k_hat = per_head(k) + k_bias.to(_F64)[None, :, None]
    theta = angles.to(_F64).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, K]
    q_rot, k_rot = _rotate_pairs(q_hat, theta), _rotate_pairs(k_hat, theta)

    dt64, trap64 = dt.to(_F64), trap.to(_F64)
    gamma = dt64 * torch.sigmoid(trap64)  # [B, H, S]
    gamma_next = torch.cat([dt64[..., 1:] * torch.sigmoid(-trap64[..., 1:]),
                            torch.zeros_like(dt64[..., :1])], dim=-1)
    trap_scale = gamma + gamma_next
    psi_v = v.to(_F64).permute(0, 2, 1, 3)[:, :, :, None, :] * mimo_v.to(_F64)[None, :, None]  # [B, H, S, R, P]

    pairs = ChunkPairs(da_cs, da_cs_rev, segsum, C)
    q_c, k_c, psi_c = pairs.by_chunk(q_rot, 2), pairs.by_chunk(k_rot, 2), pairs.by_chunk(psi_v, 2)
    scale_c = pairs.by_chunk(trap_scale, 2)  # [B, H, nc, C]
    # earlier chunks: Σ_{c' < c_t} E[c_t, c'] Σ_{s in c'} exp(da_cs_rev[s]) (γ + γ')[s] k̃[s]ᵀ ΨV[s], read at t
    totals = torch.einsum("bhcs,bhcsun,bhcsup->bhcnp", pairs.leave * scale_c, k_c, psi_c)  # [B, H, nc, N, P]
    out_c = pairs.read[..., None, None] * torch.einsum("bhctrn,bhcnp->bhctrp", q_c,
                                                       pairs.from_earlier_chunks(totals))
    # the chunk's own earlier tokens, pair by pair
    scores = torch.einsum("bhctrn,bhcsun->bhctrsu", q_c, k_c)
    scores = scores * (pairs.intra * scale_c[:, :, :, None, :])[:, :, :, :, None, :, None]
    out = pairs.to_tokens(out_c + torch.einsum("bhctrsu,bhcsup->bhctrp", scores, psi_c), 2)  # [B, H, S, R, P]
    same_token = torch.einsum("bhtrn,bhtun->bhtru", q_hat, k_hat)
    out = out + gamma[..., None, None] * torch.einsum("bhtru,bhtup->bhtrp", same_token, psi_v)
    if dims.has_d:
        out = out + d.to(_F64)[None, :, None, None, None] * psi_v

    if dims.has_z:
        x = z.to(_F64).permute(0, 2, 1, 3)[:, :, :, None, :] * mimo_z.to(_F64)[None, :, None]
        out = out * (x * torch.sigmoid(x))
    if dims.reduce_o:
        o = (out * mimo_o.to(_F64)[None, :, None]).sum(dim=3).permute(0, 2, 1, 3).contiguous()
    else:
        o = out.permute(0, 2, 3, 1, 4).contiguous()  # [B, H, S, R, P] -> [B, S, R, H, P]
    if not return_state:
        return o
    last = torch.tensor([S - 1] * B if final_tokens is None else list(final_tokens), device=k_rot.device)
    final_k = k_rot[torch.arange(B, device=k_rot.device), :, last]  # [B, H, R, N]
    return o, pairs.to_end(totals), final_k.permute(0, 2, 1, 3).contiguous()
