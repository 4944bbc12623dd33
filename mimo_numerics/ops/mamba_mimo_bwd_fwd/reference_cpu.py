"""Cache-blocked CPU path of ``reference.mamba_mimo_bwd_fwd``: the same operations on the same values, the same bits.

The generic path (``reference_generic.reference_generic``) builds every stage as a whole ``[B, H, S, R, N|P]``
tensor; at the headline shape each is 134 MB, so on a CPU every elementwise pass runs at memory speed (plus page
faults on each fresh allocation), and the state recurrence is 2 600 tiny torch calls. Here the sequence is processed in blocks of
whole chunks (about ``BLOCK_ELEMENTS`` elements per block tensor), stages are updated in place in reused
allocations, the diagonal's fused rounding resolves ties only where they occur (``rounding.round_sum_to_lp_``), and
the recurrence runs in numpy (no OpenMP regions). ``scripts/check_reference_bits.py`` proves the outputs and the
stage records bit-identical to the generic path.

What may change and what may not, for the bits to stay the same:

1. Elementwise ``+ − ×``, comparisons, selections and casts to lp are IEEE operations whose value does not depend
   on where an element sits: they are blocked, reordered and done in place freely. (The NaN *payload* of a cast may
   depend on the kernel's vector or scalar path; every block keeps a unit inner stride, so it takes the vector path,
   as the generic path's dense tensors do.)
2. ``exp, sin, cos, tanh, sigmoid`` may round differently in a kernel's vector body and its scalar tail (torch's
   CPU sigmoid does), so they are evaluated exactly as in the generic path: once, on whole tensors of the same shape
   and strides.
3. The sums over t of ``dmimo_o`` and ``dmimo_z`` depend on the operand's strides: their operands are filled block
   by block into a tensor with the generic path's strides (found by running its expressions on meta tensors) and
   reduced whole.
4. Every GEMM keeps the generic path's per-matrix shapes, strides and transposition (operands are made contiguous
   where the generic path's ``matmul`` copied them); only the batch is split into blocks of chunks, and BLAS
   computes the matrices of a batch independently of one another.
5. The recurrence multiplies and adds the same values in the same order (numpy float32/float64 IEEE arithmetic).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...policy import RoundingPolicy
from ...rounding import round_sum_to_lp_, round_to_lp, round_to_lp_
from ...validation import Dims
from .._common.chunked import chunk_decay, discretisation, pad_time, rotation_angles
from .._common.recurrence import STATE_ACCUMULATE_ROWS
from .._common.rounder import SiteRounder
from .outputs import MimoBwdFwdOutputs
from .reference_generic import OPERATOR_NAME, reference_generic

#: Target size (elements) of one ``[B, H, T_block, R, max(N, P)]`` block tensor: 16 MiB of float32 (8 blocks at the
#: headline shape). Smaller blocks stay in L2 and are about 25% faster on an idle machine, but each block costs some
#: 150 torch calls, and every call on a tensor of more than 32k elements is an OpenMP parallel region: when other
#: processes keep the cores busy, a region waits (spinning) for a descheduled thread, and 20k regions made a call
#: 5-30x slower on a loaded 2-core machine. Any value gives the same bits; only the speed changes.
BLOCK_ELEMENTS = 1 << 22

#: Chunks per block, when set, instead of the size rule of ``chunks_per_block`` (for tests of the blocking:
#: ``scripts/check_reference_bits.py --block-chunks 1``). Any value gives the same bits, NaN payloads aside (see
#: ``chunks_per_block``).
BLOCK_CHUNKS: Optional[int] = None


def chunks_per_block(dims: Dims) -> int:
    """Chunks per block: about ``BLOCK_ELEMENTS / (B·H·C·R·max(N, P))``, or ``BLOCK_CHUNKS`` when that is set.

    The count is rounded up so that every block tensor holds a multiple of 8 elements (automatic when N, P and N/d
    are multiples of 8): then no element of a block falls into the scalar tail of a vectorised cast where it would
    not in the generic path's whole tensor (torch's float16 -> float32 tail gives other NaN payloads).
    """
    if BLOCK_CHUNKS is not None:
        return max(1, min(BLOCK_CHUNKS, dims.nchunks))
    B, H, C, R, N, P = (dims.batch, dims.heads, dims.chunk_size, dims.rank, dims.state_dim, dims.value_dim)
    per_chunk = B * H * C * R * max(N, P)
    chunks = max(1, BLOCK_ELEMENTS // per_chunk)
    sizes = (B * H * C * R * n for n in (N, P, R, N // dims.rotary_dim_divisor, C * R))  # per chunk, per tensor
    step = 8 // math.gcd(8, functools.reduce(math.gcd, sizes, B * H * N * P))
    chunks = -(-chunks // step) * step
    return min(chunks, dims.nchunks)


class _Policy(SiteRounder):
    """Stage 1's switches (``pol(site, x)``, as the generic path), and in place: ``site_(name, x)`` rounds x in place
    when switch ``name`` is on."""

    def __init__(self, policy: RoundingPolicy):
        super().__init__(policy, OPERATOR_NAME)
        self.lp_torch = policy.lp_torch_dtype
        self.md = policy.math_torch_dtype

    def site_(self, site: str, x: torch.Tensor) -> torch.Tensor:
        """Round x in place (x must be a tensor this module allocated)."""
        return round_to_lp_(x, self.lp) if getattr(self.sites, site) else x

    def site(self, site: str, x: torch.Tensor) -> torch.Tensor:
        """Round out of place (x may alias an input, e.g. ``q_bias.to(md)`` when q_bias is in the math dtype)."""
        return self(site, x)

    def store(self, dst: torch.Tensor, x: torch.Tensor) -> None:
        """``dst ← rnd.output(x)`` of the generic path (dst in lp, or in the math dtype when outputs are unrounded)."""
        if not self.policy.round_outputs:
            dst.copy_(x)
        elif x.dtype == torch.float32:  # x.to(lp) equals round_to_lp(x).to(lp) from float32 (one RNE rounding)
            dst.copy_(x)
        else:  # float64 -> lp through torch would round twice
            dst.copy_(round_to_lp(x, self.lp))


class _LayoutLog(TorchDispatchMode):
    """Records the operand layouts of every bmm and sum that runs under it."""

    def __init__(self):
        super().__init__()
        self.bmm: List[Tuple[tuple, tuple]] = []
        self.sums: List[tuple] = []
        self.other_gemms = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default:
            self.bmm.append((args[0].stride()[1:], args[1].stride()[1:]))
        elif func is torch.ops.aten.sum.dim_IntList:
            self.sums.append(args[0].stride())
        elif func in (torch.ops.aten.mm.default, torch.ops.aten.baddbmm.default, torch.ops.aten.addmm.default):
            self.other_gemms += 1
        return func(*args, **(kwargs or {}))


def layout_policy(policy: RoundingPolicy) -> RoundingPolicy:
    """The part of ``policy`` the generic path's operand layouts depend on: every knob, and of stage 1's switches
    only ``diag_accum`` (it decides whether the diagonal is a bmm); the other switches off, the other operators'
    sections dropped.

    A switch rounds a tensor in place of itself with ``x.to(lp).to(math)``, which keeps the strides of the dense
    tensors the sites round, so it cannot change a later GEMM's operand layout; ``tests/ops/mamba_mimo_bwd_fwd/
    test_reference_cpu_layouts.py`` checks that on drawn policies and shapes. It makes :func:`generic_layouts` one
    meta run per shape and structure, not per policy (the policy inference evaluates hundreds of policies).
    """
    sites = policy.section(OPERATOR_NAME)
    switches = {name: (name == "diag_accum" and value) for name, value in sites.to_dict().items()}
    others = {op: None for op in policy.sites if op != OPERATOR_NAME}
    return policy.replace(**{OPERATOR_NAME: switches}, **others)


def generic_layouts(dims: Dims, policy: RoundingPolicy):
    """The generic path's per-matrix bmm operand strides (in call order) and the strides of its sums' operands,
    for ``layout_policy(policy)`` (the same layouts as ``policy``'s; see there)."""
    return _generic_layouts(dims, layout_policy(policy))


@functools.lru_cache(maxsize=256)
def _generic_layouts(dims: Dims, policy: RoundingPolicy):
    """The generic path's per-matrix bmm operand strides (in call order) and the strides of its sums' operands.

    Found by running ``reference_generic.reference_generic`` on meta tensors of the call's shapes (no data, no compute):
    its ``matmul`` hands bmm either a contiguous copy or a strided view of an operand, depending on whether the
    batch dims can be merged (e.g. H = 1), and BLAS may round the two differently.
    """
    B, S, H, G, N, P, R, C = (dims.batch, dims.seqlen, dims.heads, dims.groups, dims.state_dim, dims.value_dim,
                              dims.rank, dims.chunk_size)
    lp, f32 = dims.lp_dtype, torch.float32

    def meta(*shape, dtype=f32):
        return torch.empty(shape, dtype=dtype, device="meta")

    dout = meta(B, S, H, P, dtype=lp) if dims.reduce_o else meta(B, S, R, H, P, dtype=lp)
    args = (dout, meta(B, S, R, G, N, dtype=lp), meta(B, S, R, G, N, dtype=lp), meta(B, S, H, P, dtype=lp),
            meta(H, R, N), meta(H, R, N), meta(H, R, P), meta(H, R, P) if dims.reduce_o else None,
            meta(B, S, H, P, dtype=lp) if dims.has_z else None, meta(H, R, P) if dims.has_z else None,
            meta(B, S, H, N // dims.rotary_dim_divisor), meta(B, H, S), meta(B, H, S), meta(B, H, S),
            meta(B, H, S, dtype=lp), meta(H) if dims.has_d else None, meta(B, H, dims.nchunks, C, C))
    log = _LayoutLog()
    with log:
        reference_generic(*args, dataclasses.replace(dims, device=torch.device("meta")), policy, None)
    if log.other_gemms:
        raise RuntimeError("the generic reference called a GEMM other than bmm; reference_cpu does not mirror it")
    return tuple(log.bmm), tuple(log.sums)


def _row_major(shape, strides) -> bool:
    """Whether an (m, k) matrix with these strides is row-major, rows possibly padded (size-1 dims match any stride)."""
    (m, k), (sm, sk) = shape, strides
    return (m == 1 or sm >= k) and (k == 1 or sk == 1)


def _rows(x: torch.Tensor, lead: int) -> torch.Tensor:
    """x [..., m, k] as a [batch, m, k] tensor whose rows start ``lead`` >= k elements apart (a padded copy if needed)."""
    m, k = x.shape[-2:]
    y = x.reshape(-1, m, k)
    if _row_major((m, k), y.stride()[1:]) and (m == 1 or y.stride(1) == lead):
        return y
    buf = x.new_empty(y.shape[0], m, max(lead, k))
    buf[..., :k] = y
    return buf[..., :k]


def _operand(x: torch.Tensor, strides: tuple) -> torch.Tensor:
    """x [..., m, k] as a [batch, m, k] bmm operand whose matrices have the given strides.

    The generic path's operands are row- or column-major, possibly with padded rows or columns (a slice of a wider
    tensor); the copy here has the same per-matrix strides, so the BLAS call sees the same layout.
    """
    m, k = x.shape[-2:]
    sm, sk = strides
    if _row_major((m, k), strides):
        y = _rows(x, sm if m > 1 else k)
    elif _row_major((k, m), (sk, sm)):  # column-major: the transpose of a row-major (k, m) matrix
        y = _rows(x.transpose(-1, -2), sk if k > 1 else m).transpose(-1, -2)
    else:
        raise RuntimeError(f"reference_cpu: matrix strides {strides} of shape {(m, k)} are neither row- nor "
                           "column-major")
    if y.stride()[1:] != tuple(strides):  # only the strides of size-1 dims can differ; they address no data
        y = y.as_strided(y.shape, (y.stride(0),) + tuple(strides))
    return y


def _bmm(a: torch.Tensor, b: torch.Tensor, layout: Tuple[tuple, tuple]) -> torch.Tensor:
    """``a @ b`` for [..., m, k] @ [..., k, n] with the generic path's per-matrix operand strides -> [..., m, n]."""
    out = torch.bmm(_operand(a, layout[0]), _operand(b, layout[1]))
    return out.view(*a.shape[:-1], b.shape[-1])


class _Record:
    """Fills ``record`` with the generic path's stage tensors (math dtype, trimmed to S tokens), block by block."""

    def __init__(self, record: Optional[Dict[str, torch.Tensor]], seqlen: int):
        self.record, self.seqlen = record, seqlen

    @property
    def on(self) -> bool:
        return self.record is not None

    def whole(self, name: str, value: torch.Tensor) -> None:
        if self.record is not None:
            self.record[name] = value

    def allocate(self, name: str, shape, dtype) -> None:
        if self.record is not None:
            self.record[name] = torch.empty(shape, dtype=dtype)

    def tokens(self, name: str, block: torch.Tensor, t0: int) -> None:
        """Copy the valid tokens of ``block`` (time on dim 2, starting at token t0) into ``record[name]``."""
        if self.record is not None:
            valid = min(block.shape[2], self.seqlen - t0)
            if valid > 0:
                self.record[name][:, :, t0:t0 + valid].copy_(block[:, :, :valid])

    def chunks(self, name: str, block: torch.Tensor, c0: int) -> None:
        if self.record is not None:
            self.record[name][:, :, c0:c0 + block.shape[2]].copy_(block)


def _rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dims: Dims, pol: _Policy,
             out: torch.Tensor) -> torch.Tensor:
    """``_common.chunked.rotate`` into ``out`` (which may be x itself): columns [0, N/d) against [N/2, N/2 + N/d).

    The rotated halves are rounded as whole tensors before they are written, as in the generic path.
    """
    width, half = dims.state_dim // dims.rotary_dim_divisor, dims.state_dim // 2
    first, second = x[..., :width], x[..., half:half + width]
    rotated_first = pol.site_("rotary", torch.sub(cos * first, sin * second))
    rotated_second = pol.site_("rotary", torch.add(sin * first, cos * second))
    if out is not x and width < half:
        out[..., width:half] = x[..., width:half]
        out[..., half + width:] = x[..., half + width:]
    out[..., :width] = rotated_first
    out[..., half:half + width] = rotated_second
    return out


def _diagonal_rank_sum(qk: torch.Tensor, psiv: torch.Tensor, pol: _Policy, layout) -> torch.Tensor:
    """``_common.chunked.diagonal_rank_sum`` on one block: qk [..., R, R], psiv [..., R, P] -> [..., R, P]."""
    policy = pol.policy
    if not pol.sites.diag_accum:
        return _bmm(qk, psiv, layout)
    acc = qk[..., :, 0, None] * psiv[..., None, 0, :]
    round_to_lp_(acc, pol.lp)  # rnd(0 + a·b) = rnd(a·b) under both modes
    prod = torch.empty_like(acc)
    for r_in in range(1, qk.shape[-1]):
        torch.mul(qk[..., :, r_in, None], psiv[..., None, r_in, :], out=prod)
        if policy.diag_mode == "fma":
            round_sum_to_lp_(acc, prod, pol.lp)
        else:
            acc.add_(round_to_lp_(prod, pol.lp))
            round_to_lp_(acc, pol.lp)
    return acc


def _recurrence_numpy(states: np.ndarray, steps, decay: np.ndarray, first: int, last: int,
                      scratch: np.ndarray) -> None:
    """``_common.recurrence.recurrence_loop`` for chunks [first, last): fills ``states[:, :, c + 1]`` for c < nc − 1.

    Args:
        states (ndarray): [B, H, nc, N, P]; ``states[:, :, first]`` is known.
        steps (list of ndarray): per accumulate step, [B, H, last − first, N, P].
        decay (ndarray): [B, H, nc, 1, 1]. scratch (ndarray): [B, H, N, P].
    """
    nchunks = states.shape[2]
    with np.errstate(over="ignore", invalid="ignore"):  # inf/nan propagate silently, as in the torch path
        for c in range(first, min(last, nchunks - 1)):
            i = c - first
            np.multiply(states[:, :, c], decay[:, :, c], out=scratch)
            for step in steps[:-1]:
                np.add(scratch, step[:, :, i], out=scratch)
            np.add(scratch, steps[-1][:, :, i], out=states[:, :, c + 1])


def reference_cpu(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
                  segsum, dims: Dims, policy: RoundingPolicy, record) -> MimoBwdFwdOutputs:
    """The generic path's computation on CPU tensors (validated, contiguous), block by block; same outputs and record.

    Shapes as in ``reference.mamba_mimo_bwd_fwd``.
    """
    md = policy.math_torch_dtype
    pol = _Policy(policy)
    rec = _Record(record, dims.seqlen)
    B, S, H, G, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.groups, dims.state_dim, dims.value_dim,
                                  dims.rank, dims.chunk_size, dims.nchunks)
    Sp, L, hpg = dims.padded_seqlen, C * R, dims.heads_per_group

    # ------------------------------------------------------------ whole-sequence quantities, as the generic path
    q_md, k_md = pad_time(q, Sp, 1).to(md), pad_time(k, Sp, 1).to(md)  # [B, Sp, R, G, N]
    bias_q = pol.site("qk_bias", q_bias.to(md)).view(G, hpg, R, N)
    bias_k = pol.site("qk_bias", k_bias.to(md)).view(G, hpg, R, N)
    cos, sin = rotation_angles(angles, dims, md)  # [B, H, Sp, 1, N/d]
    _, gamma, shifted, trap_scale = discretisation(dt, trap, dims, md, pol)  # [B, H, Sp], as the generic path
    psi = pol.site("psi_weight", mimo_v.to(md))  # [H, R, P]
    v_h = pad_time(v, Sp, 1).to(md).permute(0, 2, 1, 3)  # [B, H, Sp, P]
    exp_da_cs = torch.exp(pad_time(da_cs, Sp, 2).to(md))  # [B, H, Sp]
    exp_da_cs_rev = torch.exp(pad_time(da_cs_rev, Sp, 2).to(md))
    decay = chunk_decay(exp_da_cs, dims)  # [B, H, nc]
    row_decay = exp_da_cs.reshape(B, H, nc, C).repeat_interleave(R, dim=3)  # [B, H, nc, L]
    row_decay_rev = exp_da_cs_rev.reshape(B, H, nc, C).repeat_interleave(R, dim=3)
    row_trap_scale = trap_scale.reshape(B, H, nc, C).repeat_interleave(R, dim=3)
    step = torch.arange(C)
    causal = (step[:, None] > step[None, :])[:, None, :, None]  # [C, 1, C, 1]
    not_causal_rows = (~causal).expand(C, R, C, R).reshape(L, L)  # [L, L], the mask at row granularity
    seg = segsum.to(md)[:, :, :, :, None, :, None]  # [B, H, nc, C, 1, C, 1]
    decay_ij = torch.exp(torch.where(causal, seg, torch.zeros_like(seg)))
    d_h = d.to(md)[None, :, None, None, None] if dims.has_d else None

    rows = L if policy.state_update == "separate" else STATE_ACCUMULATE_ROWS
    slices = [(r0, min(r0 + rows, L)) for r0 in range(0, L, rows)]  # accumulate steps of the state GEMM
    # the generic path's GEMM operand layouts (rule 4) and its sums' operand strides (rule 3)
    bmm_layouts, sum_strides = generic_layouts(dims, policy)
    bmm_layouts = list(bmm_layouts)
    lay_qk = bmm_layouts.pop(0)
    lay_state = [bmm_layouts.pop(0) for _ in slices]
    lay_inter, lay_scores, lay_intra = bmm_layouts.pop(0), bmm_layouts.pop(0), bmm_layouts.pop(0)
    lay_diag = bmm_layouts.pop(0) if not pol.sites.diag_accum else None
    sum_strides = list(sum_strides)
    dmimo_o_terms = torch.empty_strided((B, H, S, R, P), sum_strides.pop(0), dtype=md) if dims.reduce_o else None
    dmimo_z_terms = torch.empty_strided((B, H, S, R, P), sum_strides.pop(0), dtype=md) if dims.has_z else None

    # the gradient branches' transcendental functions, whole, as the generic path evaluates them (rule 2)
    if dims.has_z:
        z_h = z.to(md).permute(0, 2, 1, 3)  # [B, H, S, P]
        x = z_h[:, :, :, None, :] * mimo_z.to(md)[None, :, None]  # [B, H, S, R, P]
        sig_x = torch.sigmoid(x)
        # gate = half·tanh(half) + half with half = x·0.5 (recomputed per block), or x·σ(x)
        tanh_half = None
        if policy.silu_form == "tanh":
            tanh_half = x * 0.5
            torch.tanh(tanh_half, out=tanh_half)  # in place: the same traversal as torch.tanh(half)
        sig_neg_x = torch.neg(x)
        torch.sigmoid(sig_neg_x, out=sig_neg_x)  # dzz = dphio·σ(x)·(1 + x·σ(−x))
        zeta = mimo_z.to(md)[None, :, None]  # [1, H, 1, R, P]
    if dims.reduce_o:
        dout_h = dout.to(md).permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, P]
        if dims.has_z:
            phi = pol.site("phi_weight", mimo_o.to(md))[None, :, None]
    elif dims.has_z:
        dout_r = dout.to(md).permute(0, 3, 1, 2, 4)  # DOUT_r [B, H, S, R, P]

    # ------------------------------------------------------------ outputs and record, filled block by block
    out_dtype = policy.lp_torch_dtype if policy.round_outputs else md
    qk_dot_out = torch.empty((B, H, S, R, R), dtype=out_dtype)
    states = torch.empty((B, H, nc, N, P), dtype=md)
    dz_out = torch.empty((B, S, H, P), dtype=out_dtype) if dims.has_z else None
    for name, shape in (("q_biased", (B, H, S, R, N)), ("k_biased", (B, H, S, R, N)), ("qk_dot", (B, H, S, R, R)),
                        ("q_rot", (B, H, S, R, N)), ("k_rot", (B, H, S, R, N))):
        rec.allocate(name, shape, md)
    rec.whole("gamma", gamma[:, :, :S]), rec.whole("shifted_gamma", shifted[:, :, :S])
    rec.whole("trap_scale", trap_scale[:, :, :S])
    for name, shape in (("k_scaled", (B, H, S, R, N)), ("psiv", (B, H, S, R, P)), ("k_state", (B, H, S, R, N))):
        rec.allocate(name, shape, md)
    rec.whole("state", states)
    for name, shape in (("state_operand", (B, H, nc, N, P)), ("inter", (B, H, S, R, P)),
                        ("causal_scores", (B, H, nc, L, L)), ("intra", (B, H, S, R, P)),
                        ("diag_accum", (B, H, S, R, P)), ("diag", (B, H, S, R, P)), ("out", (B, H, S, R, P))):
        rec.allocate(name, shape, md)
    if dims.has_z:
        for name, shape in (("gate", (B, H, S, R, P)), ("dphio", (B, H, S, R, P)), ("dzz", (B, H, S, R, P)),
                            ("dz_accum", (B, H, S, P))):
            rec.allocate(name, shape, md)

    states_np = states.numpy()
    states_np[:, :, 0] = 0
    decay_np = decay[..., None, None].contiguous().numpy()
    scratch = np.empty((B, H, N, P), dtype=states_np.dtype)

    per_block = chunks_per_block(dims)
    for c0 in range(0, nc, per_block):
        c1 = min(nc, c0 + per_block)
        cb, t0, t1 = c1 - c0, c0 * C, c1 * C
        T, tv = t1 - t0, min(t1, S) - t0  # block tokens, valid tokens

        def chunked(x):  # [B, H, T, R, X] -> [B, H, cb, L, X]
            return x.view(B, H, cb, L, x.shape[-1])

        # q̃, k̃ (S12, S13), q̃·k̃ᵀ (S14)
        q_b = torch.empty((B, G, hpg, T, R, N), dtype=md)
        torch.add(q_md[:, t0:t1].permute(0, 3, 1, 2, 4)[:, :, None], bias_q[None, :, :, None], out=q_b)
        q_b = pol.site_("qk_biased", q_b.view(B, H, T, R, N))
        k_b = torch.empty((B, G, hpg, T, R, N), dtype=md)
        torch.add(k_md[:, t0:t1].permute(0, 3, 1, 2, 4)[:, :, None], bias_k[None, :, :, None], out=k_b)
        k_b = pol.site_("qk_biased", k_b.view(B, H, T, R, N))
        qk = _bmm(q_b, k_b.transpose(-1, -2), lay_qk)  # [B, H, T, R, R]
        pol.store(qk_dot_out[:, :, t0:t0 + tv], qk[:, :, :tv])
        qk_internal = pol.site_("qk_dot_internal", qk)  # the output took the unrounded values already
        rec.tokens("q_biased", q_b, t0), rec.tokens("k_biased", k_b, t0), rec.tokens("qk_dot", qk_internal, t0)

        # rotation (S16, S17), k̂ (S18), ΨV (S11), k̂·exp(da_cs_rev) (S42)
        cos_b, sin_b = cos[:, :, t0:t1], sin[:, :, t0:t1]
        q_rot = _rotate_(q_b, cos_b, sin_b, dims, pol, q_b if not rec.on else torch.empty_like(q_b))
        k_rot = _rotate_(k_b, cos_b, sin_b, dims, pol, k_b if not rec.on else torch.empty_like(k_b))
        rec.tokens("q_rot", q_rot, t0), rec.tokens("k_rot", k_rot, t0)
        # k̂ stored transposed per chunk, [B, H, cb, N, L]: the layout the scores GEMM takes it in
        k_scaled_t = torch.empty((B, H, cb, N, L), dtype=md)
        torch.mul(chunked(k_rot), row_trap_scale[:, :, c0:c1, :, None], out=k_scaled_t.transpose(-1, -2))
        pol.site_("k_scaled", k_scaled_t)
        psiv = torch.empty((B, H, T, R, P), dtype=md)
        torch.mul(v_h[:, :, t0:t1, None, :], psi[None, :, None], out=psiv)
        pol.site_("psiv", psiv)
        psiv_c = chunked(psiv)
        if rec.on:
            rec.tokens("k_scaled", k_scaled_t.transpose(-1, -2).reshape(B, H, T, R, N), t0)
        rec.tokens("psiv", psiv, t0)
        # k̂·exp(da_cs_rev) (S42) per accumulate step, [B, H, cb, rows, N], and the state GEMM (S41–S45)
        k_state_t = [pol.site_("k_state", torch.mul(k_scaled_t[..., r0:r1], row_decay_rev[:, :, c0:c1, None, r0:r1]))
                     for r0, r1 in slices]  # [B, H, cb, N, rows] per accumulate step
        if rec.on:
            rec.tokens("k_state", torch.cat(k_state_t, dim=-1).transpose(-1, -2).reshape(B, H, T, R, N), t0)
        steps = [_bmm(part, psiv_c[..., r0:r1, :], lay).numpy()
                 for part, (r0, r1), lay in zip(k_state_t, slices, lay_state)]
        _recurrence_numpy(states_np, steps, decay_np, c0, c1, scratch)
        state_operand = states[:, :, c0:c1].clone(memory_format=torch.contiguous_format)
        pol.site_("state_operand", state_operand)
        rec.chunks("state_operand", state_operand, c0)

        # chunk outputs: inter (S19, S23), masked scores (S22), intra (S24)
        q_rot_c = chunked(q_rot)
        inter = _bmm(q_rot_c, state_operand, lay_inter).mul_(row_decay[:, :, c0:c1, :, None])  # [B, H, cb, L, P]
        scores = _bmm(q_rot_c, k_scaled_t, lay_scores)  # [B, H, cb, L, L]
        scores.view(B, H, cb, C, R, C, R).mul_(decay_ij[:, :, c0:c1])
        scores.masked_fill_(not_causal_rows, 0)
        masked = pol.site_("causal_scores", scores)
        intra = _bmm(masked, psiv_c, lay_intra)
        rec.tokens("inter", inter.view(B, H, T, R, P), t0), rec.chunks("causal_scores", masked, c0)
        rec.tokens("intra", intra.view(B, H, T, R, P), t0)
        o = intra.add_(inter).view(B, H, T, R, P)

        # diagonal (S26, S27), D term, o (S30)
        diag_acc = _diagonal_rank_sum(qk_internal, psiv, pol, lay_diag)
        rec.tokens("diag_accum", diag_acc, t0)
        diag = diag_acc.mul_(gamma[:, :, t0:t1, None, None]) if not rec.on else \
            diag_acc * gamma[:, :, t0:t1, None, None]
        pol.site_("diag_gamma", diag)
        rec.tokens("diag", diag, t0)
        o.add_(diag)
        if dims.has_d:
            o.add_(torch.mul(d_h, psiv, out=psiv if not rec.on else torch.empty_like(psiv)))
        out = pol.site_("out", o)
        rec.tokens("out", out, t0)

        # gradient branches (S31–S39) on the valid tokens
        out_v = out[:, :, :tv]
        ts = slice(t0, t0 + tv)
        if dims.has_z:
            if tanh_half is not None:
                half = x[:, :, ts] * 0.5
                gate = (half * tanh_half[:, :, ts]).add_(half)
            else:
                gate = x[:, :, ts] * sig_x[:, :, ts]
            rec.tokens("gate", gate, t0)
        if dims.reduce_o:
            terms = dmimo_o_terms[:, :, ts]
            if dims.has_z:
                torch.mul(gate, out_v, out=terms).mul_(dout_h[:, :, ts])
                dphio = dout_h[:, :, ts] * phi
                pol.site_("dphio", dphio)
                pol.site_("dphio", dphio.mul_(out_v))
            else:
                torch.mul(out_v, dout_h[:, :, ts], out=terms)
        elif dims.has_z:
            dphio = pol.site_("dphio", dout_r[:, :, ts] * out_v)
        if dims.has_z:
            rec.tokens("dphio", dphio, t0)
            xs, s1, s2 = x[:, :, ts], sig_x[:, :, ts], sig_neg_x[:, :, ts]
            dzz = dphio.mul_(s1) if not rec.on else dphio * s1
            dzz.mul_((xs * s2).add_(1))
            rec.tokens("dzz", dzz, t0)
            torch.mul(dzz, z_h[:, :, ts, None, :], out=dmimo_z_terms[:, :, ts])
            acc = dzz[..., 0, :] * zeta[..., 0, :]
            if pol.sites.dz_accum:
                round_to_lp_(acc, pol.lp)
            for r in range(1, R):
                acc.add_(dzz[..., r, :] * zeta[..., r, :])
                if pol.sites.dz_accum:
                    round_to_lp_(acc, pol.lp)
            rec.tokens("dz_accum", acc, t0)
            pol.store(dz_out[:, ts].permute(0, 2, 1, 3), acc)

    out_fp = torch.float32 if policy.round_outputs else md
    dmimo_o = dmimo_o_terms.sum(dim=2).to(out_fp) if dims.reduce_o else None
    dmimo_z = dmimo_z_terms.sum(dim=2).to(out_fp) if dims.has_z else None
    states_out = torch.empty((B, H, nc, N, P), dtype=out_dtype)
    pol.store(states_out, states)
    return MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states_out, dz=dz_out, dmimo_z=dmimo_z, qk_dot=qk_dot_out)
