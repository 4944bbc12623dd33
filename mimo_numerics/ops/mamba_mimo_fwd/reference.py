"""PyTorch reference of the forward kernel ``mamba_mimo_fwd``, parameterised by a rounding policy.

Chunked and vectorised over batch, heads and chunks; only the inter-chunk state recurrence loops in Python. Runs on
any torch device. Every rounding goes through ``mimo_numerics.rounding``; each one is a site of ``sites.SITES``,
switched by ``policy.mamba_mimo_fwd.<site>``, except the output store (``policy.round_outputs``). The math is
written out in ``docs/forward.md``; ``spec.STAGES`` lists what ``record`` receives.

Reused from stage 1's reference (``mimo_numerics/ops/mamba_mimo_bwd_fwd/reference.py``), imported, not copied, because the forward does
the same thing there: the zero padding of a tail chunk (``_pad_time``), the rotation (``_rotate``, L255-257 and
L271-273 here), the diagonal rank sum under ``diag_mode`` (``_diagonal_rank_sum``, L319-323), the state recurrence
under ``state_update`` (``_state_recurrence``, L405-407) and the TF32 guard (``_ieee_fp32_matmul``). They read the
policy through :class:`_ForwardView`, which answers site names from the forward's section.

Where the forward differs from stage 1's recomputation of ``o``: the intra GEMM accumulates onto the scaled inter
term (L316) instead of starting from zero; the diagonal term, with D·ΨV added, is rounded to lp before it is added
to ``o`` (``d_term``, L333); ``o`` itself is never rounded before the gate; the reduced output is a rank sum carried
in lp (``out_proj``, ``out_accum``).

Not modelled (FP32 level, as in stage 1): MUFU ``tanh``/``ex2``/``sin``/``cos``/``rcp`` approximations (fast
math; ``tanh`` feeds the lp rounding of the gate), FMA contraction of fp32 ops, the tensor cores' accumulation
order inside a GEMM, and the intra GEMM's k16 steps into the inter term (modelled as one add).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ... import presets as _presets
from ..mamba_mimo_bwd_fwd.reference import _diagonal_rank_sum, _ieee_fp32_matmul, _pad_time, _rotate, _state_recurrence
from ...rounding import round_to_lp
from ...validation import Dims
from .sites import SITES
from .spec import MambaMimoFwdOutputs
from .validation import validate_inputs

#: The policy section this reference reads.
OPERATOR_NAME = "mamba_mimo_fwd"


class _SiteRounder:
    """``r(site, x)`` rounds x to lp when the forward's switch ``site`` is on; ``output`` is an lp output store."""

    def __init__(self, policy, switches):
        self.policy, self.switches, self.lp = policy, switches, policy.lp_dtype

    def __call__(self, site: str, x: torch.Tensor) -> torch.Tensor:
        return round_to_lp(x, self.lp) if getattr(self.switches, site) else x

    def carried(self, site: str, terms: torch.Tensor) -> torch.Tensor:
        """Σ over dim -2 in ascending order from 0; with ``site`` on the sum is carried in lp (one rounding a step)."""
        acc = self(site, terms[..., 0, :])  # rnd(0 + x) = rnd(x)
        for r in range(1, terms.shape[-2]):
            acc = self(site, acc + terms[..., r, :])
        return acc

    def output(self, x: torch.Tensor) -> torch.Tensor:
        if self.policy.round_outputs:
            return round_to_lp(x, self.lp).to(self.policy.lp_torch_dtype)
        return x


@torch.no_grad()
def mamba_mimo_fwd(
    q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype: Optional[torch.dtype] = None, *, policy,
    record: Optional[Dict[str, torch.Tensor]] = None, return_state: bool = False, cu_seqlens=None,
) -> MambaMimoFwdOutputs:
    """The Mamba-3 MIMO forward kernel, rounded as ``policy`` says.

    Args:
        q, k (Tensor): ``[B, S, R, G, N]`` lp. v (Tensor): ``[B, S, H, P]`` lp.
        q_bias, k_bias (Tensor): ``[H, R, N]`` fp32. mimo_v (Tensor): Ψ ``[H, R, P]`` fp32.
        mimo_o (Tensor | None): Φ ``[H, R, P]`` fp32; selects the reduced output.
        z (Tensor | None): ``[B, S, H, P]`` lp, with mimo_z. d (Tensor | None): ``[H]`` fp32.
        mimo_z (Tensor | None): ζ ``[H, R, P]`` fp32, with z.
        angles (Tensor): cumulative angles ``[B, S, H, N/d]`` fp32. da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]``
            fp32. trap (Tensor): ``[B, H, S]`` lp. segsum (Tensor): ``[B, H, ceil(S/C), C, C]`` fp32.
        chunk_size (int): C. rotary_dim_divisor (int): d, 2 or 4.
        dtype (torch.dtype | None): upstream's argument; when given, it must be the dtype of the lp inputs.
        policy (RoundingPolicy | str): a policy or a preset name (its ``mamba_mimo_fwd`` section and knobs; a
            preset that defines no forward semantics, such as ``seed_bf16``, raises ``PolicyUndefined``); the lp
            inputs must have its ``lp_dtype``.
        record (dict, optional): filled with the stages of ``spec.STAGES`` (math dtype, S tokens).
        return_state, cu_seqlens: upstream's final-state and varlen paths, not implemented (they raise).

    Returns:
        MambaMimoFwdOutputs: ``o`` ``[B, S, H, P]`` (reduced) or ``[B, S, R, H, P]``, in lp, or unrounded in the
        math dtype when ``policy.round_outputs`` is false.
    """
    if return_state:
        raise NotImplementedError("return_state=True (FINAL_STATE, FINAL_K) is not implemented by the reference")
    if cu_seqlens is not None:
        raise NotImplementedError("cu_seqlens (the varlen kernel mamba3_mimo_fwd_varlen.py) is not implemented "
                                  "by the reference")
    policy = _presets.resolve(policy)
    switches = policy.section(OPERATOR_NAME)
    dims = validate_inputs(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt,
                           trap, segsum, chunk_size, rotary_dim_divisor, dtype, lp_dtype=policy.lp_torch_dtype)
    # contiguous inputs: torch's reduction order follows the operands' strides
    tensors = [None if t is None else t.contiguous() for t in (q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d,
                                                                mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum)]
    with _ieee_fp32_matmul():
        return _forward(*tensors, dims=dims, policy=policy, switches=switches, record=record)


def _forward(q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, d, mimo_z, angles, da_cs, da_cs_rev, dt, trap, segsum, *,
             dims: Dims, policy, switches, record) -> MambaMimoFwdOutputs:
    md = policy.math_torch_dtype
    rnd = _SiteRounder(policy, switches)
    B, S, H, R, C, nc = dims.batch, dims.seqlen, dims.heads, dims.rank, dims.chunk_size, dims.nchunks
    Sp, L = dims.padded_seqlen, C * R

    def put(name, value):
        if record is not None:
            record[name] = value

    def tokens(x):  # [B, H, Sp, ...] -> [B, H, S, ...]
        return x[:, :, :S]

    # ---------------------------------------------------------------- per token, [B, H, Sp, R, *] (L174-219)
    group_of_head = torch.arange(H, device=dims.device) // dims.heads_per_group

    def heads_of(x):  # [B, S, R, G, N] -> [B, H, Sp, R, N] in md
        return _pad_time(x, Sp, 1).to(md).index_select(3, group_of_head).permute(0, 3, 1, 2, 4)

    dt_lp = rnd("dt_input", _pad_time(dt, Sp, 2).to(md))  # [B, H, Sp]
    trap_md = _pad_time(trap, Sp, 2).to(md)
    shifted = torch.zeros_like(dt_lp)
    shifted[..., :S - 1] = rnd("shifted_gamma", dt_lp[..., 1:S] * torch.sigmoid(-trap_md[..., 1:S]))
    gamma = dt_lp * torch.sigmoid(trap_md)
    trap_scale = rnd("trap_scale", gamma + shifted)
    put("gamma", tokens(gamma)), put("shifted_gamma", tokens(shifted)), put("trap_scale", tokens(trap_scale))

    psi = rnd("psi_weight", mimo_v.to(md))  # [H, R, P]
    v_h = _pad_time(v, Sp, 1).to(md).permute(0, 2, 1, 3)  # [B, H, Sp, P]
    psiv = rnd("psiv", v_h[:, :, :, None, :] * psi[None, :, None])  # [B, H, Sp, R, P]
    put("psiv", tokens(psiv))

    q_biased = rnd("qk_biased", heads_of(q) + rnd("qk_bias", q_bias.to(md))[None, :, None])
    k_biased = rnd("qk_biased", heads_of(k) + rnd("qk_bias", k_bias.to(md))[None, :, None])
    qk = rnd("qk_dot", q_biased @ k_biased.transpose(-1, -2))  # [B, H, Sp, R, R]
    put("q_biased", tokens(q_biased)), put("k_biased", tokens(k_biased)), put("qk_dot", tokens(qk))

    theta = _pad_time(angles, Sp, 1).to(md).permute(0, 2, 1, 3).unsqueeze(3)  # [B, H, Sp, 1, N/d]
    cos, sin = theta.cos(), theta.sin()
    q_rot = _rotate(q_biased, cos, sin, dims, rnd)
    k_rot = _rotate(k_biased, cos, sin, dims, rnd)
    k_scaled = rnd("k_scaled", k_rot * trap_scale[..., None, None])
    put("q_rot", tokens(q_rot)), put("k_rot", tokens(k_rot)), put("k_scaled", tokens(k_scaled))

    # ---------------------------------------------------------------- state recurrence (L386-407)
    exp_da_cs = torch.exp(_pad_time(da_cs, Sp, 2).to(md))  # [B, H, Sp]
    k_state = rnd("k_state", k_scaled * torch.exp(_pad_time(da_cs_rev, Sp, 2).to(md))[..., None, None])
    put("k_state", tokens(k_state))
    last_valid = torch.clamp(torch.arange(1, nc + 1, device=dims.device) * C, max=S) - 1  # L398-404
    decay = exp_da_cs.index_select(2, last_valid)  # [B, H, nc]

    def chunked(x):  # [B, H, Sp, R, X] -> [B, H, nc, L, X]
        return x.reshape(B, H, nc, L, x.shape[-1])

    def unchunked(x):  # [B, H, nc, L, X] -> [B, H, Sp, R, X]
        return x.reshape(B, H, Sp, R, x.shape[-1])

    psiv_c = chunked(psiv)
    state = _state_recurrence(chunked(k_state), psiv_c, decay, policy)  # [B, H, nc, N, P]
    state_operand = rnd("state_operand", state)
    put("state", state), put("state_operand", state_operand)

    # ---------------------------------------------------------------- chunk outputs, all chunks at once (L243-316)
    q_rot_c = chunked(q_rot)
    row_decay = exp_da_cs.reshape(B, H, nc, C).repeat_interleave(R, dim=3)  # [B, H, nc, L]
    inter = (q_rot_c @ state_operand) * row_decay[..., None]  # [B, H, nc, L, P]
    scores = q_rot_c @ chunked(k_scaled).transpose(-1, -2)  # [B, H, nc, L, L]
    # strictly causal mask and decay at token granularity [C, C], broadcast over the rank axes of the L x L scores
    step = torch.arange(C, device=dims.device)
    causal = (step[:, None] > step[None, :])[:, None, :, None]  # [C, 1, C, 1]
    seg = segsum.to(md)[:, :, :, :, None, :, None]  # [B, H, nc, C, 1, C, 1]
    decay_ij = torch.exp(torch.where(causal, seg, torch.zeros_like(seg)))
    masked = torch.where(causal, scores.view(B, H, nc, C, R, C, R) * decay_ij,
                         torch.zeros((), dtype=md, device=dims.device))
    masked = rnd("causal_scores", masked.reshape(B, H, nc, L, L))
    intra = masked @ psiv_c
    put("inter", tokens(unchunked(inter))), put("causal_scores", masked), put("intra", tokens(unchunked(intra)))

    # ---------------------------------------------------------------- diagonal and D terms (L318-336)
    diag_acc = _diagonal_rank_sum(qk, psiv, policy, accumulate=switches.diag_accum)  # [B, H, Sp, R, P]
    diag = rnd("diag_gamma", diag_acc * gamma[..., None, None])
    put("diag_accum", tokens(diag_acc)), put("diag", tokens(diag))
    if dims.has_d:
        diag = rnd("d_term", diag + d.to(md)[None, :, None, None, None] * psiv)
        put("d_term", tokens(diag))
    out = tokens(unchunked(inter + intra) + diag)  # [B, H, S, R, P]
    put("out", out)

    # ---------------------------------------------------------------- gate and output (L338-384)
    if dims.has_z:
        x = z.to(md).permute(0, 2, 1, 3)[:, :, :, None, :] * mimo_z.to(md)[None, :, None]  # [B, H, S, R, P]
        if policy.silu_form == "tanh":
            half = x * 0.5
            gate = rnd("gate", half * torch.tanh(half) + half)
        else:
            gate = rnd("gate", x * torch.sigmoid(x))
        put("gate", gate)
    if dims.reduce_o:
        phi = rnd("phi_weight", mimo_o.to(md))[None, :, None]  # [1, H, 1, R, P]
        if dims.has_z:
            phi = rnd("phi_gate", phi * gate)
            put("phi_gate", phi)
        o_rank = rnd("out_proj", out * phi)
        o_sum = rnd.carried("out_accum", o_rank)  # [B, H, S, P]
        put("o_rank", o_rank), put("o_sum", o_sum)
        o = rnd.output(o_sum).permute(0, 2, 1, 3)  # [B, S, H, P]
    else:
        gated = out * gate if dims.has_z else out
        o = rnd.output(gated).permute(0, 2, 3, 1, 4)  # [B, S, R, H, P]
    o = o.contiguous()
    put("o", o.to(md))
    return MambaMimoFwdOutputs(o=o)
