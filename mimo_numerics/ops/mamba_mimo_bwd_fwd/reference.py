"""PyTorch reference of ``mamba_mimo_bwd_fwd`` parameterised by a ``RoundingPolicy``.

Chunked and vectorised over batch, heads and chunks; only the inter-chunk state recurrence loops in Python. Runs on
any torch device (CPU, CUDA, NPU). Every rounding goes through ``mimo_numerics.rounding``. The math is written out in
``docs/semantics.md``; site numbers below (S…) are those of the upstream catalog.

Two implementations: ``_reference_generic`` (this module; every stage a whole tensor; used on every device but the
CPU) and, on CPU tensors, ``reference_cpu.reference_cpu`` (cache-blocked, in place; same bits on the same machine,
see that module and ``CPU_FAST_PATH``).

Stage names written to ``record`` (every tensor in the math dtype, trimmed to the S valid tokens):

=================  ====================  ============================================================
name               shape                 quantity
=================  ====================  ============================================================
q_biased           [B, H, S, R, N]       q̃ = q + b_q (S12)
k_biased           [B, H, S, R, N]       k̃ = k + b_k (S13)
qk_dot             [B, H, S, R, R]       q̃·k̃ᵀ as fed to the diagonal (S14)
q_rot, k_rot       [B, H, S, R, N]       rotated q̃, k̃ (S16, S17)
gamma              [B, H, S]             γ = dt·σ(trap) (S9)
shifted_gamma      [B, H, S]             dt_{t+1}·σ(−trap_{t+1}) (S6)
trap_scale         [B, H, S]             γ + shifted γ (S10)
k_scaled           [B, H, S, R, N]       k̂ = k_rot·trap_scale (S18)
psiv               [B, H, S, R, P]       ΨV = v·Ψ (S11)
k_state            [B, H, S, R, N]       k̂·exp(da_cs_rev) (S42)
state              [B, H, nc, N, P]      h at the start of each chunk, unrounded (S1, S41)
state_operand      [B, H, nc, N, P]      h as fed to the inter GEMM (S19)
inter              [B, H, S, R, P]       (q_rot·h)·exp(da_cs) (S19, S23)
causal_scores      [B, H, nc, L, L]      masked decayed scores fed to the intra GEMM, L = C·R (S22)
intra              [B, H, S, R, P]       scores·ΨV (S24)
diag_accum         [B, H, S, R, P]       rank sum Σ qk·ΨV (S26)
diag               [B, H, S, R, P]       rank sum · γ (S27)
out                [B, H, S, R, P]       o after the D term and its rounding (S30)
gate               [B, H, S, R, P]       SiLU(z·ζ) (S31, Z only)
dphio              [B, H, S, R, P]       dΦO (S34–S36, Z only)
dzz                [B, H, S, R, P]       dZζ (S37, Z only)
dz_accum           [B, H, S, P]          DZ rank sum before the output store (S38, Z only)
=================  ====================  ============================================================
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ... import presets as _presets
from .outputs import MimoBwdFwdOutputs
from ...policy import RoundingPolicy
from ...rounding import round_sum_to_lp, round_to_lp
from .reference_cpu import reference_cpu
from ...validation import Dims
from .validation import validate_inputs

#: The operator whose policy section this reference reads.
OPERATOR_NAME = "mamba_mimo_bwd_fwd"
#: Rows per accumulate step of the state GEMM under ``state_update="accumulate_into"`` (the wgmma k16 step).
STATE_ACCUMULATE_ROWS = 16


class _Rounder:
    """Applies the policy's switches: ``r(site, x)`` rounds x when switch ``site`` is on."""

    def __init__(self, policy: RoundingPolicy):
        self.policy = policy
        self.sites = policy.section(OPERATOR_NAME)
        self.lp = policy.lp_dtype

    def __call__(self, site: str, x: torch.Tensor) -> torch.Tensor:
        return round_to_lp(x, self.lp) if self.sites[site] else x

    def always(self, x: torch.Tensor) -> torch.Tensor:
        return round_to_lp(x, self.lp)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """An lp output store: rounded and cast to lp, or unrounded in the math dtype (``round_outputs=False``)."""
        if self.policy.round_outputs:
            return round_to_lp(x, self.lp).to(self.policy.lp_torch_dtype)
        return x


def _pad_time(x: Optional[torch.Tensor], length: int, dim: int) -> Optional[torch.Tensor]:
    if x is None or x.shape[dim] == length:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, length - x.shape[dim]]
    return F.pad(x, pad)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dims: Dims, rnd: _Rounder) -> torch.Tensor:
    """Rotate columns [0, N/d) against [N/2, N/2 + N/d) of x [B, H, T, R, N]; cos, sin [B, H, T, 1, N/d]."""
    width, half = dims.state_dim // dims.rotary_dim_divisor, dims.state_dim // 2
    first, second = x[..., :width], x[..., half:half + width]
    out = x.clone()
    out[..., :width] = rnd("rotary", cos * first - sin * second)
    out[..., half:half + width] = rnd("rotary", sin * first + cos * second)
    return out


def _diagonal_rank_sum(qk: torch.Tensor, psiv: torch.Tensor, policy: RoundingPolicy,
                       accumulate: Optional[bool] = None) -> torch.Tensor:
    """acc[..., r_out, p] = Σ_{r_in ascending} qk[..., r_out, r_in]·psiv[..., r_in, p] under the policy (S26).

    ``accumulate``: carry the sum in lp (default: this operator's ``diag_accum`` switch; the forward passes its own).
    """
    if accumulate is None:
        accumulate = policy.section(OPERATOR_NAME).diag_accum
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


#: On CPU tensors, run ``reference_cpu`` (cache-blocked, in place, same bits as the generic path; see that module).
#: Set to False to run the generic whole-tensor path everywhere (``scripts/check_reference_bits.py --against-generic``
#: compares the two).
CPU_FAST_PATH = True

#: On CUDA, replay the recurrence's kernels from a captured CUDA graph (same kernels, same bits) once there are this
#: many chunks: the loop is otherwise bound by the host's per-launch cost (about 2 600 launches at S = 8192, C = 16).
USE_CUDA_GRAPHS = True
CUDA_GRAPH_MIN_CHUNKS = 64
_GRAPH_CACHE: Dict[tuple, tuple] = {}


def _recurrence_loop(steps: torch.Tensor, decay: torch.Tensor, states: torch.Tensor, nchunks: int,
                     n_steps: int) -> None:
    """h_0 = 0; h_{c+1} = (((h_c·decay_c) + steps_0) + steps_1) + ...; writes h_c into ``states[c]``.

    Args:
        steps (Tensor): [nc·n_steps, B, H, N, P] the chunk sums (one per accumulate step).
        decay (Tensor): [nc, B, H, 1, 1]. states (Tensor): [nc, B, H, N, P], written.
    """
    step_views, decay_views, state_views = steps.unbind(0), decay.unbind(0), states.unbind(0)
    state_views[0].zero_()
    h = torch.empty_like(state_views[0])
    for c in range(nchunks - 1):
        torch.mul(state_views[c], decay_views[c], out=h)
        first = c * n_steps
        for s in range(first, first + n_steps - 1):
            h.add_(step_views[s])
        torch.add(h, step_views[first + n_steps - 1], out=state_views[c + 1])


def _recurrence_cuda_graph(steps: torch.Tensor, decay: torch.Tensor, nchunks: int, n_steps: int) -> torch.Tensor:
    """``_recurrence_loop`` captured once per shape as a CUDA graph and replayed (only the latest shape is kept)."""
    key = (tuple(steps.shape), tuple(decay.shape), steps.dtype, steps.device, nchunks, n_steps)
    entry = _GRAPH_CACHE.get(key)
    if entry is None:
        _GRAPH_CACHE.clear()
        static_steps, static_decay = torch.empty_like(steps), torch.empty_like(decay)
        static_states = torch.empty((nchunks,) + steps.shape[1:], dtype=steps.dtype, device=steps.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _recurrence_loop(static_steps, static_decay, static_states, nchunks, n_steps)
        entry = _GRAPH_CACHE[key] = (graph, static_steps, static_decay, static_states)
    graph, static_steps, static_decay, static_states = entry
    static_steps.copy_(steps)
    static_decay.copy_(decay)
    graph.replay()
    return static_states.clone()


def _state_recurrence(k_state: torch.Tensor, psiv: torch.Tensor, decay: torch.Tensor,
                      policy: RoundingPolicy) -> torch.Tensor:
    """States at the start of every chunk (S41–S45).

    Args:
        k_state (Tensor): [B, H, nc, L, N] rows of each chunk, L = C·R.
        psiv (Tensor): [B, H, nc, L, P].
        decay (Tensor): [B, H, nc] exp(da_cs) at the last valid token of each chunk.

    Returns:
        Tensor: [B, H, nc, N, P] h_c, unrounded, in the math dtype.
    """
    batch, heads, nchunks, rows, _ = k_state.shape
    kt = k_state.transpose(-1, -2)  # [B, H, nc, N, L]
    if policy.state_update == "separate":
        steps = (kt @ psiv).unsqueeze(3)  # [B, H, nc, 1, N, P]
    else:
        slices = [kt[..., s:s + STATE_ACCUMULATE_ROWS] @ psiv[..., s:s + STATE_ACCUMULATE_ROWS, :]
                  for s in range(0, rows, STATE_ACCUMULATE_ROWS)]
        steps = torch.stack(slices, dim=3)  # [B, H, nc, n_slices, N, P]
    # chunk-major copies: steps [nc * n_steps, B, H, N, P], decay [nc, B, H, 1, 1]
    n_steps = steps.shape[3]
    steps = steps.permute(2, 3, 0, 1, 4, 5).reshape((nchunks * n_steps,) + steps.shape[:2] + steps.shape[4:])
    decay = decay.permute(2, 0, 1)[..., None, None].contiguous()
    if steps.is_cuda and nchunks >= CUDA_GRAPH_MIN_CHUNKS and USE_CUDA_GRAPHS:
        states = _recurrence_cuda_graph(steps, decay, nchunks, n_steps)
    else:
        states = torch.empty((nchunks,) + steps.shape[1:], dtype=steps.dtype, device=steps.device)
        _recurrence_loop(steps, decay, states, nchunks, n_steps)
    return states.permute(1, 2, 0, 3, 4)


@contextlib.contextmanager
def _ieee_fp32_matmul():
    """Run with TF32 off for CUDA matmuls: a global torch flag must not change the reference's numerics."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@torch.no_grad()
def mamba_mimo_bwd_fwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90",
    record: Optional[Dict[str, torch.Tensor]] = None,
) -> MimoBwdFwdOutputs:
    """Stage 1 of the Mamba-3 MIMO backward pass, rounded as ``policy`` says.

    Args:
        dout (Tensor): ``[B, S, H, P]`` when ``mimo_o`` is given, else ``[B, S, R, H, P]``; lp.
        q, k (Tensor): ``[B, S, R, G, N]`` lp. v (Tensor): ``[B, S, H, P]`` lp.
        q_bias, k_bias (Tensor): ``[H, R, N]`` fp32. mimo_v (Tensor): Ψ ``[H, R, P]`` fp32.
        mimo_o (Tensor | None): Φ ``[H, R, P]`` fp32; selects reduced DOUT.
        z (Tensor | None): ``[B, S, H, P]`` lp, with mimo_z (ζ ``[H, R, P]`` fp32).
        angles (Tensor): ``[B, S, H, N/d]`` fp32. da_cs, da_cs_rev, dt (Tensor): ``[B, H, S]`` fp32.
        trap (Tensor): ``[B, H, S]`` lp. d (Tensor | None): ``[H]`` fp32.
        segsum (Tensor): ``[B, H, ceil(S/C), C, C]`` fp32.
        chunk_size (int): C. rotary_dim_divisor (int): d, 2 or 4.
        policy (RoundingPolicy | str): a policy or a preset name; lp inputs must have its ``lp_dtype``.
        record (dict, optional): filled with the per-stage tensors listed in the module docstring.

    Returns:
        MimoBwdFwdOutputs: ``dmimo_o``, ``dmimo_z`` ``[B, H, R, P]`` float32 per batch; ``states``
        ``[B, H, nc, N, P]``, ``dz`` ``[B, S, H, P]``, ``qk_dot`` ``[B, H, S, R, R]`` in lp (in the math dtype,
        unrounded, when ``policy.round_outputs`` is false); None where a branch is off.
    """
    with _ieee_fp32_matmul():
        return _reference(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
                          d, segsum, chunk_size, rotary_dim_divisor, _presets.resolve(policy), record)


def _reference(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
               segsum, chunk_size, rotary_dim_divisor, policy: RoundingPolicy, record) -> MimoBwdFwdOutputs:
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev,
                           dt, trap, d, segsum, chunk_size, rotary_dim_divisor, lp_dtype=policy.lp_torch_dtype)
    # contiguous inputs: torch reduces in the order of the operands' strides, so a strided view (e.g. a transposed
    # dout) would change the FP32 sums over t (dmimo_*) by an ulp; with this the bits depend on the values only
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum = (
        None if t is None else t.contiguous() for t in (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z,
                                                         angles, da_cs, da_cs_rev, dt, trap, d, segsum))
    if dims.device.type == "cpu" and CPU_FAST_PATH:
        return reference_cpu(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                             trap, d, segsum, dims, policy, record)
    return _reference_generic(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                              trap, d, segsum, dims, policy, record)


def _reference_generic(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap,
                       d, segsum, dims: Dims, policy: RoundingPolicy, record) -> MimoBwdFwdOutputs:
    """The reference on any device, every stage a whole tensor (validated, contiguous inputs)."""
    md = policy.math_torch_dtype
    rnd = _Rounder(policy)
    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    Sp, L = dims.padded_seqlen, C * R
    keep = record is not None

    def put(name, value):
        if keep:
            record[name] = value

    def tokens(x):  # [B, H, Sp, ...] -> [B, H, S, ...]
        return x[:, :, :S]

    # ---------------------------------------------------------------- per-token quantities, [B, H, Sp, R, *]
    group_of_head = torch.arange(H, device=dims.device) // dims.heads_per_group
    def heads_of(x):  # [B, S, R, G, N] -> [B, H, Sp, R, N] in md
        x = _pad_time(x, Sp, 1).to(md).index_select(3, group_of_head)
        return x.permute(0, 3, 1, 2, 4)

    q_biased = rnd("qk_biased", heads_of(q) + rnd("qk_bias", q_bias.to(md))[None, :, None])
    k_biased = rnd("qk_biased", heads_of(k) + rnd("qk_bias", k_bias.to(md))[None, :, None])
    qk_full = q_biased @ k_biased.transpose(-1, -2)  # [B, H, Sp, R, R]
    qk_internal = rnd("qk_dot_internal", qk_full)
    put("q_biased", tokens(q_biased)), put("k_biased", tokens(k_biased)), put("qk_dot", tokens(qk_internal))

    theta = _pad_time(angles, Sp, 1).to(md).permute(0, 2, 1, 3).unsqueeze(3)  # [B, H, Sp, 1, N/d]
    cos, sin = theta.cos(), theta.sin()
    q_rot = _rotate(q_biased, cos, sin, dims, rnd)
    k_rot = _rotate(k_biased, cos, sin, dims, rnd)
    put("q_rot", tokens(q_rot)), put("k_rot", tokens(k_rot))

    dt_lp = rnd("dt_input", _pad_time(dt, Sp, 2).to(md))  # [B, H, Sp]
    trap_md = _pad_time(trap, Sp, 2).to(md)
    gamma = dt_lp * torch.sigmoid(trap_md)
    shifted = torch.zeros_like(gamma)
    shifted[..., :S - 1] = rnd("shifted_gamma", dt_lp[..., 1:S] * torch.sigmoid(-trap_md[..., 1:S]))
    trap_scale = rnd("trap_scale", gamma + shifted)
    k_scaled = rnd("k_scaled", k_rot * trap_scale[..., None, None])
    put("gamma", tokens(gamma)), put("shifted_gamma", tokens(shifted)), put("trap_scale", tokens(trap_scale))
    put("k_scaled", tokens(k_scaled))

    psi = rnd("psi_weight", mimo_v.to(md))  # [H, R, P]
    v_h = _pad_time(v, Sp, 1).to(md).permute(0, 2, 1, 3)  # [B, H, Sp, P]
    psiv = rnd("psiv", v_h[:, :, :, None, :] * psi[None, :, None])  # [B, H, Sp, R, P]
    put("psiv", tokens(psiv))

    # ---------------------------------------------------------------- state recurrence (S41–S45)
    exp_da_cs = torch.exp(_pad_time(da_cs, Sp, 2).to(md))  # [B, H, Sp]
    exp_da_cs_rev = torch.exp(_pad_time(da_cs_rev, Sp, 2).to(md))
    k_state = rnd("k_state", k_scaled * exp_da_cs_rev[..., None, None])
    put("k_state", tokens(k_state))
    last_valid = torch.clamp(torch.arange(1, nc + 1, device=dims.device) * C, max=S) - 1
    decay = exp_da_cs.index_select(2, last_valid)  # [B, H, nc]
    chunked = lambda x: x.reshape(B, H, nc, L, x.shape[-1])  # [B, H, Sp, R, X] -> [B, H, nc, L, X]
    psiv_c = chunked(psiv)
    state = _state_recurrence(chunked(k_state), psiv_c, decay, policy)  # [B, H, nc, N, P]
    state_operand = rnd("state_operand", state)
    put("state", state), put("state_operand", state_operand)

    # ---------------------------------------------------------------- chunk outputs, all chunks at once
    q_rot_c = chunked(q_rot)
    row_decay = exp_da_cs.reshape(B, H, nc, C).repeat_interleave(R, dim=3)  # [B, H, nc, L]
    inter = (q_rot_c @ state_operand) * row_decay[..., None]  # [B, H, nc, L, P]
    scores = q_rot_c @ chunked(k_scaled).transpose(-1, -2)  # [B, H, nc, L, L]
    # mask and decay at token granularity [C, C], broadcast over the rank axes of the L x L scores
    step = torch.arange(C, device=dims.device)
    causal = (step[:, None] > step[None, :])[:, None, :, None]  # [C, 1, C, 1]
    seg = segsum.to(md)[:, :, :, :, None, :, None]  # [B, H, nc, C, 1, C, 1]
    decay_ij = torch.exp(torch.where(causal, seg, torch.zeros_like(seg)))
    scores7 = scores.view(B, H, nc, C, R, C, R)
    masked = torch.where(causal, scores7 * decay_ij, torch.zeros((), dtype=md, device=dims.device))
    masked = rnd("causal_scores", masked.reshape(B, H, nc, L, L))
    intra = masked @ psiv_c
    unchunk = lambda x: x.reshape(B, H, Sp, R, x.shape[-1])
    put("inter", tokens(unchunk(inter))), put("causal_scores", masked), put("intra", tokens(unchunk(intra)))
    o = unchunk(intra + inter)  # [B, H, Sp, R, P]

    diag_acc = _diagonal_rank_sum(qk_internal, psiv, policy)
    diag = rnd("diag_gamma", diag_acc * gamma[..., None, None])
    put("diag_accum", tokens(diag_acc)), put("diag", tokens(diag))
    o = o + diag
    if dims.has_d:
        o = o + d.to(md)[None, :, None, None, None] * psiv
    out = rnd("out", o)
    put("out", tokens(out))

    # ---------------------------------------------------------------- gradient branches (S31–S39)
    out_v = tokens(out)  # [B, H, S, R, P]
    dmimo_o = dz = dmimo_z = None
    out_fp = torch.float32 if policy.round_outputs else md
    if dims.has_z:
        z_h = z.to(md).permute(0, 2, 1, 3)  # [B, H, S, P]
        x = z_h[:, :, :, None, :] * mimo_z.to(md)[None, :, None]  # [B, H, S, R, P]
        if policy.silu_form == "tanh":
            half = x * 0.5
            gate = half * torch.tanh(half) + half
        else:
            gate = x * torch.sigmoid(x)
        put("gate", gate)
    if dims.reduce_o:
        dout_h = dout.to(md).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, P]
        gated = gate * out_v if dims.has_z else out_v
        dmimo_o = (gated * dout_h).sum(dim=2).to(out_fp)
        if dims.has_z:
            phi = rnd("phi_weight", mimo_o.to(md))
            dphio = rnd("dphio", rnd("dphio", dout_h * phi[None, :, None]) * out_v)
    elif dims.has_z:
        dphio = rnd("dphio", dout.to(md).permute(0, 3, 1, 2, 4) * out_v)  # DOUT_r [B, H, S, R, P]
    if dims.has_z:
        put("dphio", dphio)
        dzz = dphio * torch.sigmoid(x) * (1 + x * torch.sigmoid(-x))
        put("dzz", dzz)
        zeta = mimo_z.to(md)[None, :, None]  # [1, H, 1, R, P]
        terms = dzz * zeta
        acc = terms[..., 0, :]
        if rnd.sites.dz_accum:
            acc = rnd.always(acc)
        for r in range(1, R):
            acc = acc + terms[..., r, :]
            if rnd.sites.dz_accum:
                acc = rnd.always(acc)
        put("dz_accum", acc)
        dz = rnd.output(acc).permute(0, 2, 1, 3).contiguous()  # [B, S, H, P]
        dmimo_z = (dzz * z_h[:, :, :, None, :]).sum(dim=2).to(out_fp)

    states = rnd.output(state).contiguous()
    qk_dot = rnd.output(tokens(qk_full)).contiguous()
    return MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states, dz=dz, dmimo_z=dmimo_z, qk_dot=qk_dot)
