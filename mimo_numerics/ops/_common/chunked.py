"""Pieces of the chunked references: padding, discretisation, rotation, the diagonal sum, chunk decays and outputs.

Shapes: B, S, H, G, N, P, R as in the API; Sp = nc·C the padded length, L = C·R the fused rows of a chunk. Every
function computes exactly what the references computed in place before (the same operations in the same order),
so the bits do not change.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ...rounding import fma_fp32, round_sum_to_lp, round_to_lp
from ...validation import Dims
from .gemm import Matmul, plain_matmul
from .special import ACCURATE


def pad_time(x: Optional[torch.Tensor], length: int, dim: int) -> Optional[torch.Tensor]:
    """Zero-pad x along ``dim`` to ``length`` (upstream's predicated loads read rows t >= S as 0); None stays None."""
    if x is None or x.shape[dim] == length:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, length - x.shape[dim]]
    return F.pad(x, pad)


@contextlib.contextmanager
def ieee_fp32_matmul():
    """Run with TF32 off for CUDA matmuls: a global torch flag must not change the reference's numerics."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def discretisation(dt: torch.Tensor, trap: torch.Tensor, dims: Dims, md: torch.dtype, rnd, fns=ACCURATE):
    """dt' = rnd(dt) (``dt_input``), γ = dt'·σ(trap), shifted γ = dt'_{t+1}·σ(−trap_{t+1}) (0 at t = S − 1,
    ``shifted_gamma``) and the trap scale γ + shifted γ (``trap_scale``), each ``[B, H, Sp]`` in ``md``.

    Args:
        dt, trap (Tensor): ``[B, H, S]``. rnd: a :class:`~.rounder.SiteRounder` (or any ``rnd(site, x)``).
        fns: the policy's :class:`~.special.SpecialFunctions` (σ).

    Returns:
        tuple: ``(dt_lp, gamma, shifted, trap_scale)``.
    """
    S, Sp = dims.seqlen, dims.padded_seqlen
    dt_lp = rnd("dt_input", pad_time(dt, Sp, 2).to(md))
    trap_md = pad_time(trap, Sp, 2).to(md)
    gamma = dt_lp * fns.sigmoid(trap_md)
    shifted = torch.zeros_like(gamma)
    shifted[..., :S - 1] = rnd("shifted_gamma", dt_lp[..., 1:S] * fns.sigmoid(-trap_md[..., 1:S]))
    trap_scale = rnd("trap_scale", gamma + shifted)
    return dt_lp, gamma, shifted, trap_scale


def biased_heads(x: torch.Tensor, bias: torch.Tensor, dims: Dims, md: torch.dtype, rnd) -> torch.Tensor:
    """rnd(x + rnd(b)) per head (``qk_biased``, ``qk_bias``): x ``[B, S, R, G, N]`` -> ``[B, H, Sp, R, N]``, head h
    reading group h // (H / G); bias ``[H, R, N]``."""
    group_of_head = torch.arange(dims.heads, device=dims.device) // dims.heads_per_group
    heads = pad_time(x, dims.padded_seqlen, 1).to(md).index_select(3, group_of_head).permute(0, 3, 1, 2, 4)
    return rnd("qk_biased", heads + rnd("qk_bias", bias.to(md))[None, :, None])


def rotation_angles(angles: torch.Tensor, dims: Dims, md: torch.dtype,
                    fns=ACCURATE) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos θ, sin θ ``[B, H, Sp, 1, N/d]`` of the cumulative angles ``[B, S, H, N/d]`` (whole tensors; ``fns``: the
    policy's :class:`~.special.SpecialFunctions`)."""
    theta = pad_time(angles, dims.padded_seqlen, 1).to(md).permute(0, 2, 1, 3).unsqueeze(3)
    return fns.cos_sin(theta)


def fused_first(a: torch.Tensor, b: torch.Tensor, rest: torch.Tensor, fused: bool) -> torch.Tensor:
    """``a·b + rest`` in float32 as nvcc contracts ``a*b ± c*d`` (``rest = ±fl(c·d)``): one FMA rounding with
    ``fused`` (the policy's ``fp32_fma``), else the product rounded, then the sum."""
    return fma_fp32(a, b, rest) if fused else a * b + rest


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dims: Dims, rnd, site: str = "rotary",
           inverse: bool = False, fma: bool = False) -> torch.Tensor:
    """Rotate columns [0, N/d) against [N/2, N/2 + N/d) of x [B, H, T, R, N] by θ (``inverse``: by −θ).

    Forward: [c·x1 − s·x2, s·x1 + c·x2]; inverse: [c·x1 + s·x2, −s·x1 + c·x2]. cos, sin are [B, H, T, 1, N/d];
    the rotated columns are rounded by ``site``, the others keep x. ``fma`` (``fp32_fma``, float32 only): the first
    product of each fused into the sum, ``fma(c, x1, −fl(s·x2))`` and so on (:func:`fused_first`).
    """
    width, half = dims.state_dim // dims.rotary_dim_divisor, dims.state_dim // 2
    first, second = x[..., :width], x[..., half:half + width]
    out = x.clone()
    if inverse:
        out[..., :width] = rnd(site, fused_first(cos, first, sin * second, fma))
        out[..., half:half + width] = rnd(site, fused_first(-sin, first, cos * second, fma))
    else:
        out[..., :width] = rnd(site, fused_first(cos, first, -(sin * second), fma))
        out[..., half:half + width] = rnd(site, fused_first(sin, first, cos * second, fma))
    return out


def diagonal_rank_sum(qk: torch.Tensor, psiv: torch.Tensor, policy, accumulate: bool) -> torch.Tensor:
    """acc[..., r_out, p] = Σ_{r_in ascending} qk[..., r_out, r_in]·psiv[..., r_in, p] under the policy (S26).

    ``accumulate``: carry the sum in lp (the operator's ``diag_accum`` switch), fused (``diag_mode="fma"``) or
    product-rounded (``"mul_then_add"``); otherwise one GEMM.
    """
    if not accumulate:
        return qk @ psiv
    acc = None
    for r_in in range(qk.shape[-1]):
        prod = qk[..., :, r_in, None] * psiv[..., None, r_in, :]
        if acc is None:  # rnd(0 + a·b) = rnd(a·b) under both modes
            acc = round_to_lp(prod, policy.lp_dtype)
        elif policy.diag_mode == "fma":
            acc = round_sum_to_lp(acc, prod, policy.lp_dtype)
        else:
            acc = round_to_lp(acc + round_to_lp(prod, policy.lp_dtype), policy.lp_dtype)
    return acc


def chunk_decay(exp_da_cs: torch.Tensor, dims: Dims) -> torch.Tensor:
    """exp(da_cs) at the last valid token of each chunk: ``[B, H, Sp]`` -> ``[B, H, nc]`` (a tail chunk's is token
    S − 1)."""
    C, S, nc = dims.chunk_size, dims.seqlen, dims.nchunks
    last_valid = torch.clamp(torch.arange(1, nc + 1, device=exp_da_cs.device) * C, max=S) - 1
    return exp_da_cs.index_select(2, last_valid)


def chunk_outputs(q_rot_c: torch.Tensor, k_scaled_c: torch.Tensor, psiv_c: torch.Tensor,
                  state_operand: torch.Tensor, exp_da_cs: torch.Tensor, segsum: torch.Tensor, dims: Dims,
                  md: torch.dtype, rnd, matmul: Matmul = plain_matmul, intra_into_inter: bool = False,
                  exp=torch.exp):
    """The chunk outputs of every chunk at once: the inter term, the strictly causal decayed scores and the intra
    term.

    Args:
        q_rot_c, k_scaled_c (Tensor): ``[B, H, nc, L, N]``. psiv_c (Tensor): ``[B, H, nc, L, P]``.
        state_operand (Tensor): ``[B, H, nc, N, P]``. exp_da_cs (Tensor): ``[B, H, Sp]``.
        segsum (Tensor): ``[B, H, nc, C, C]``. rnd: rounds the masked scores (``causal_scores``).
        matmul: the three GEMMs (``gemm.policy_matmul``: the policy's ``gemm_model``).
        exp: the decay's exponential (the policy's ``SpecialFunctions.exp``).
        intra_into_inter (bool): the intra GEMM accumulates into ``inter`` (the forward's L316 under a tensor-core
            ``gemm_model``); the third result is then ``inter + masked·ΨV`` as that one GEMM gives it.

    Returns:
        tuple: ``inter = (q_rot·h)·exp(da_cs)`` ``[B, H, nc, L, P]``, the masked scores ``[B, H, nc, L, L]`` and
        ``intra = masked·ΨV`` ``[B, H, nc, L, P]``.
    """
    B, H, nc, C, R = dims.batch, dims.heads, dims.nchunks, dims.chunk_size, dims.rank
    L = C * R
    row_decay = exp_da_cs.reshape(B, H, nc, C).repeat_interleave(R, dim=3)  # [B, H, nc, L]
    inter = matmul(q_rot_c, state_operand) * row_decay[..., None]  # [B, H, nc, L, P]
    scores = matmul(q_rot_c, k_scaled_c.transpose(-1, -2))  # [B, H, nc, L, L]
    # strictly causal mask and decay at token granularity [C, C], broadcast over the rank axes of the L x L scores
    step = torch.arange(C, device=dims.device)
    causal = (step[:, None] > step[None, :])[:, None, :, None]  # [C, 1, C, 1]
    seg = segsum.to(md)[:, :, :, :, None, :, None]  # [B, H, nc, C, 1, C, 1]
    decay_ij = exp(torch.where(causal, seg, torch.zeros_like(seg)))
    masked = torch.where(causal, scores.view(B, H, nc, C, R, C, R) * decay_ij,
                         torch.zeros((), dtype=md, device=dims.device))
    masked = rnd("causal_scores", masked.reshape(B, H, nc, L, L))
    return inter, masked, matmul(masked, psiv_c, inter if intra_into_inter else None)
