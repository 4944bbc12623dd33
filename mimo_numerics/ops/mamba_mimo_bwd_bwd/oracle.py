"""FP64 oracle of ``mamba_mimo_bwd_bwd`` (stage 2 of the Mamba-3 MIMO backward): nothing rounded.

Stage 2 differentiates ``L = Σ dout · Out`` (``Out`` the forward output) for one ``dout``. It does not return
the gradients of the op's inputs only: several outputs are partial derivatives w.r.t. intermediate quantities
that the FP32 epilogue (``mimo_numerics.ops.mamba3_mimo_epilogue``) turns into ``dADT``, ``dDT`` and ``dTrap``.
``docs/stage2_oracle.md`` derives them from the kernel source (``mamba3_mimo_bwd.py`` of mamba-ssm 2.3.2.post1);
this module computes them from these definitions in float64, by explicit sums over token pairs, sharing no code
with any reference and containing no state recurrence. The pairs inside a chunk are formed one by one; across
chunks, where ``W`` factors into ``exp(da_cs[j])``, ``exp(M[c_j, c_i])`` and ``exp(da_cs_rev[i])``, a sum over the
targets of every later chunk is an explicit sum over those chunks of per-chunk totals
(:class:`~mimo_numerics.ops._oracle.pair_weights.ChunkPairs`), so memory is ``O(B·H·S·(C·R² + N·P/C))``.

Per batch ``b`` and value head ``h`` (group ``h // (H / G)`` of ``q``, ``k``), token ``t`` in chunk ``c_t = t // C``,
ranks ``r``:

* ``q̃ = q + q_bias``, ``k̃ = k + k_bias`` (biased, pre-rotary), ``q̊``, ``k̊`` their rotary (angles θ = ``angles``,
  the cumulative angles: pairs ``(a, N/2 + a)`` for ``a < N / rotary_dim_divisor``);
  ``γ_t = dt_t σ(trap_t)``, ``γ'_t = dt_{t+1} σ(-trap_{t+1})`` (0 at ``t = S - 1``), ``f_t = γ_t + γ'_t`` (the
  "factor", upstream's ``trap_scale``), ``k̂ = f · k̊``, ``ΨV[t, r] = v_t ⊙ Ψ_r``.
* ``Λ_c = da_cs[last(c)]``, ``last(c) = min((c+1)·C, S) - 1``; ``M[c, c'] = Σ_{c' < c'' < c} Λ_{c''}``.
  Token-pair weight from source ``i`` to target ``j > i``: ``W[j, i] = exp(segsum[c, j mod C, i mod C])`` in one
  chunk, ``exp(da_cs[j] + M[c_j, c_i] + da_cs_rev[i])`` across chunks.
* Forward (per rank): ``o[j, r] = Σ_{i<j, r'} W[j,i] (q̊[j,r]·k̂[i,r']) ΨV[i,r'] + γ_j Σ_{r'} qk_dot[j,r,r'] ΨV[j,r']
  + D ΨV[j,r]`` with ``qk_dot[j,r,r'] = q̃[j,r]·k̃[j,r']``; the inter-chunk part of the first sum equals
  ``exp(da_cs[j]) q̊[j,r] · states[c_j]``, ``states[c]`` the state entering chunk ``c`` (stage 1's output).
* ``g[j, r] = ∂L/∂o[j, r]``: ``dout_j ⊙ Φ_r ⊙ silu(z_j ⊙ ζ_r)`` (reduced DOUT; ``dout[j, r]`` per rank without
  ``mimo_o``; the silu factor only with ``z``).

Outputs (the golden file's ``bwd_bwd`` names), each the derivative of ``L`` w.r.t. the named quantity, where a
quantity used in several places is treated as separate variables and only the listed use is differentiated:

* ``dq``, ``dk`` ``[B, S, R, H, N]``: ``∂L/∂q̃``, ``∂L/∂k̃`` per value head (= ``∂L/∂q``, ``∂L/∂k`` of that head;
  the epilogue sums heads of a group and, over ``(B, S)``, forms ``dQ_bias``/``dK_bias``).
* ``dv`` ``[B, S, H, P]``, ``dmimo_v`` ``[B, H, R, P]`` (per batch), ``dD`` ``[B, H]`` (per batch): full
  gradients of ``v``, Ψ and D.
* ``dangles`` ``[B, S, H, N/d]``: ``∂L/∂θ`` (the cumulative angles; the epilogue's ``angle_dt_bwd`` maps it to
  ``dAngles`` and ``dDT``).
* ``dfactor`` ``[B, H, S]``: ``∂L/∂f_t`` through ``k̂ = f · k̊`` (the epilogue splits it into ``γ`` and ``γ'``).
* ``dgamma_diag`` ``[B, H, S]``: ``∂L/∂γ_t`` through the same-token term only.
* ``ddA`` ``[B, H, S]``: ``∂L/∂Λ_{c_t}`` through the chunk-to-chunk decay ``exp(Λ_c)`` of the state only,
  ``= Σ_{j : c_j > c} exp(da_cs[j] + M[c_j, c] + Λ_c) Σ_{r,n,p} q̊[j,r,n] g[j,r,p] states[c][n,p]``, written to every
  token of chunk ``c`` (``∂Λ_c/∂ADT_t = 1`` for each ``t`` in ``c``); 0 for the last chunk.
* ``ddA_cs`` ``[B, H, S]``: ``∂L/∂exp(da_cs[j])`` through the inter-chunk output term,
  ``= Σ_{r,n,p} q̊[j,r,n] g[j,r,p] states[c_j][n,p]`` (the epilogue multiplies by ``exp(da_cs)``).
* ``ddA_cs_rev`` ``[B, H, S]``: ``∂L/∂exp(da_cs_rev[i])`` through the state update,
  ``= Σ_{j : c_j > c_i} exp(da_cs[j] + M[c_j, c_i]) Σ_{r,r'} (q̊[j,r]·k̂[i,r']) (g[j,r]·ΨV[i,r'])``.
* ``dSSdA`` ``[B, H, nc, C, C]``: ``dSSdA[c, i, j] = Σ_{r,r'} (q̊[j,r]·k̂[i,r']) (g[j,r]·ΨV[i,r'])`` for local source
  ``i`` and target ``j`` of chunk ``c`` (stored source-major, "transposed"): for ``i < j`` it is
  ``∂L/∂exp(segsum[c, j, i])``; for ``i >= j`` the kernel stores the same unmasked product, which no later step
  reads (the epilogue masks it). Entries of padded tokens (``t >= S`` in a tail chunk) are 0 here.

``states`` and ``qk_dot`` are used as given, as the kernel uses them: ``states`` in ``ddA``, ``ddA_cs`` and the
inter-chunk part of ``dq``; ``qk_dot`` in the same-token terms of ``dv``/``dmimo_v`` and in ``dgamma_diag``. Every
other inter-chunk term (``dk``, ``dv``, ``ddA_cs_rev``, ``ddA``'s weights) is an explicit sum over token pairs (across
chunks: over chunk pairs of the targets' per-chunk totals, with the pair weights above), never a walk that carries
a state from chunk to chunk, and never reads the given ``states``. Given stage 1's FP64 outputs (``mimo_numerics.oracle``) this is the FP64 derivative of the
forward; given upstream's bf16 ``states``/``qk_dot`` it is the kernel's function in exact arithmetic.

``da_cs``, ``da_cs_rev`` and ``segsum`` are used as given: upstream's preprocessing clamps them to ``<= 0`` and
stage 2 uses the clamped values in its weights; how the epilogue differentiates through the clamp is documented
in ``mimo_numerics.ops.mamba3_mimo_epilogue``. Tail chunks (``S % C != 0``) are accepted, as the kernel accepts
them (the epilogue does not).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ...validation import Dims, check_int
from .._oracle.pair_weights import ChunkPairs

_F64 = torch.float64

#: The 19 tensor arguments, in the kernel's order (``mamba_mimo_bwd_bwd_kernel``, outputs left out).
INPUT_NAMES = ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "states", "z", "mimo_z", "angles",
               "da_cs", "da_cs_rev", "dt", "trap", "d", "qk_dot", "segsum")
#: Arguments that may be None.
OPTIONAL_INPUTS = ("mimo_o", "z", "mimo_z", "d")
#: The raw outputs, with the golden file's ``bwd_bwd`` key names.
OUTPUT_NAMES = ("dq", "dk", "dv", "dmimo_v", "dD", "dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA",
                "ddA_cs_rev", "ddA_cs")
_ROTARY_DIVISORS = (2, 4)
_REAL_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(name: str, tensor: torch.Tensor, shape: tuple, device: torch.device) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    if tensor.dtype not in _REAL_FLOATS:
        raise TypeError(f"{name} must have a real floating dtype (bfloat16, float16, float32 or float64), "
                        f"got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{name} must be on device {device} (the device of q), got {tensor.device}")


def validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev,
                    dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor) -> Dims:
    """Check the 19 tensors and two sizes of the oracle and return their dimensions.

    Shapes are the kernel's; any real floating dtype is accepted for every tensor (the oracle computes in float64:
    upstream's bf16/fp16/fp32 tensors or the float64 outputs of the FP64 chain).

    Raises:
        TypeError: a required tensor is None or not a dense tensor, a non-floating dtype, a non-int size.
        ValueError: a shape, a device, the pairing of ``z`` and ``mimo_z``, an unsupported size.
    """
    values = dict(zip(INPUT_NAMES, (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles,
                                    da_cs, da_cs_rev, dt, trap, d, qk_dot, segsum)))
    for name, value in values.items():
        if value is None:
            if name not in OPTIONAL_INPUTS:
                raise TypeError(f"{name} is required: expected a torch.Tensor, got None")
        elif not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor{' or None' if name in OPTIONAL_INPUTS else ''}, "
                            f"got {type(value).__name__}")
        elif value.layout != torch.strided or value.is_nested:
            raise TypeError(f"{name} must be a dense (strided) torch.Tensor")
    chunk_size = check_int("chunk_size", chunk_size, 1)
    rotary_dim_divisor = check_int("rotary_dim_divisor", rotary_dim_divisor, 1)
    if rotary_dim_divisor not in _ROTARY_DIVISORS:
        raise ValueError(f"rotary_dim_divisor must be one of {_ROTARY_DIVISORS}, got {rotary_dim_divisor}")
    if q.dim() != 5:
        raise ValueError(f"q must have 5 dimensions [B, S, R, G, N], got shape {list(q.shape)}")
    if v.dim() != 4:
        raise ValueError(f"v must have 4 dimensions [B, S, H, P], got shape {list(v.shape)}")
    batch, seqlen, rank, groups, state_dim = q.shape
    heads, value_dim = v.shape[2], v.shape[3]
    for dim_name, size, source in (("B", batch, "q"), ("S", seqlen, "q"), ("R", rank, "q"), ("G", groups, "q"),
                                   ("N", state_dim, "q"), ("H", heads, "v"), ("P", value_dim, "v")):
        if size == 0:
            raise ValueError(f"{source} has an empty dimension {dim_name}; every dimension must be >= 1")
    if heads % groups:
        raise ValueError(f"v has H={heads} heads, not a multiple of the G={groups} groups of q (H % G must be 0)")
    if state_dim % 2 or state_dim % rotary_dim_divisor:
        raise ValueError(f"q has N={state_dim}, which must be even and divisible by "
                         f"rotary_dim_divisor={rotary_dim_divisor}")
    if (z is None) != (mimo_z is None):
        raise ValueError("z and mimo_z must be given together: got z "
                         f"{'None' if z is None else 'present'} and mimo_z {'None' if mimo_z is None else 'present'}")
    device = q.device
    nchunks = -(-seqlen // chunk_size)
    reduce_o = mimo_o is not None
    bshp = (batch, seqlen, heads, value_dim)
    hrp = (heads, rank, value_dim)
    hs = (batch, heads, seqlen)
    expected = {
        "dout": bshp if reduce_o else (batch, seqlen, rank, heads, value_dim), "q": tuple(q.shape),
        "k": tuple(q.shape), "v": bshp, "q_bias": (heads, rank, state_dim), "k_bias": (heads, rank, state_dim),
        "mimo_v": hrp, "mimo_o": hrp, "states": (batch, heads, nchunks, state_dim, value_dim), "z": bshp,
        "mimo_z": hrp, "angles": (batch, seqlen, heads, state_dim // rotary_dim_divisor), "da_cs": hs,
        "da_cs_rev": hs, "dt": hs, "trap": hs, "d": (heads,), "qk_dot": (batch, heads, seqlen, rank, rank),
        "segsum": (batch, heads, nchunks, chunk_size, chunk_size),
    }
    for name, value in values.items():
        if value is not None:
            _check(name, value, expected[name], device)
    return Dims(batch=batch, seqlen=seqlen, heads=heads, groups=groups, state_dim=state_dim, value_dim=value_dim,
                rank=rank, chunk_size=chunk_size, nchunks=nchunks, rotary_dim_divisor=rotary_dim_divisor,
                reduce_o=reduce_o, has_z=z is not None, has_d=d is not None, lp_dtype=q.dtype, device=device)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` rotated by θ (``cos θ``, ``sin θ``) on the pairs ``(a, N/2 + a)``, ``a < width``; other columns unchanged.

    Args:
        x (Tensor): ``[B, H, S, R, N]`` float64. cos, sin (Tensor): ``[B, H, S, 1, width]`` float64.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :width], x[..., half:half + width]
    out = x.clone()
    out[..., :width] = cos * x1 - sin * x2
    out[..., half:half + width] = sin * x1 + cos * x2
    return out


def _rotary_transpose(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> torch.Tensor:
    """The adjoint of :func:`_rotary`: ``∂L/∂x`` from ``∂L/∂(rotated x)`` (the rotation by -θ)."""
    return _rotary(dy, cos, -sin, width)


def _rotary_angle_grad(dy: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       width: int) -> torch.Tensor:
    """``Σ_r ∂L/∂θ`` of the rotation of ``x``: ``dy₁·(-x₁ sin θ - x₂ cos θ) + dy₂·(x₁ cos θ - x₂ sin θ)``.

    Args:
        dy, x (Tensor): ``[B, H, S, R, N]``. cos, sin (Tensor): ``[B, H, S, 1, width]``.

    Returns:
        Tensor: ``[B, H, S, width]``.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :width], x[..., half:half + width]
    dy1, dy2 = dy[..., :width], dy[..., half:half + width]
    return (dy1 * (-x1 * sin - x2 * cos) + dy2 * (x1 * cos - x2 * sin)).sum(dim=3)


def _evaluate(dims: Dims, f64: Dict[str, Optional[torch.Tensor]], with_abs_terms: bool = False):
    """Every output and the intermediates :func:`mamba_mimo_bwd_bwd_abs_terms` needs (float64; ``ddA``'s absolute
    terms only ``with_abs_terms``)."""
    B, S, H, N, P, R = dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank
    C, nc, width, device = dims.chunk_size, dims.nchunks, N // dims.rotary_dim_divisor, dims.device

    # ---- per-token quantities, layout [B, H, S, R, *] ----
    def per_head(x):  # [B, S, R, G, N] -> [B, H, S, R, N]
        return x.repeat_interleave(dims.heads_per_group, dim=3).permute(0, 3, 1, 2, 4)

    q_biased = per_head(f64["q"]) + f64["q_bias"][None, :, None]
    k_biased = per_head(f64["k"]) + f64["k_bias"][None, :, None]
    theta = f64["angles"].permute(0, 2, 1, 3)[:, :, :, None, :]  # [B, H, S, 1, width]
    cos, sin = torch.cos(theta), torch.sin(theta)
    q_rot = _rotary(q_biased, cos, sin, width)
    k_rot = _rotary(k_biased, cos, sin, width)
    dt64, trap64 = f64["dt"], f64["trap"]
    gamma = dt64 * torch.sigmoid(trap64)  # [B, H, S]
    gamma_next = torch.zeros_like(gamma)
    gamma_next[..., :-1] = dt64[..., 1:] * torch.sigmoid(-trap64[..., 1:])
    factor = gamma + gamma_next
    k_hat = k_rot * factor[..., None, None]
    v64 = f64["v"].permute(0, 2, 1, 3)  # [B, H, S, P]
    psi = f64["mimo_v"]
    psi_v = v64[:, :, :, None, :] * psi[None, :, None]  # [B, H, S, R, P]

    # g = ∂L/∂o [B, H, S, R, P]
    if dims.reduce_o:
        grad_o = f64["dout"].permute(0, 2, 1, 3)[:, :, :, None, :] * f64["mimo_o"][None, :, None]
    else:
        grad_o = f64["dout"].permute(0, 3, 1, 2, 4)
    if dims.has_z:
        x = f64["z"].permute(0, 2, 1, 3)[:, :, :, None, :] * f64["mimo_z"][None, :, None]
        grad_o = grad_o * (x * torch.sigmoid(x))

    # ---- token pairs: a chunk's own pairs one by one, pairs across chunks through per-chunk totals ----
    pairs = ChunkPairs(f64["da_cs"], f64["da_cs_rev"], f64["segsum"], C)
    q_c, k_c, g_c, psi_c = (pairs.by_chunk(x, 2) for x in (q_rot, k_hat, grad_o, psi_v))  # [B, H, nc, C, R, *]
    st = f64["states"]

    # pairs inside a chunk: j (target) and i (source) of chunk c
    scores = torch.einsum("bhcjrn,bhcisn->bhcjris", q_c, k_c)  # q̊[j,r]·k̂[i,s]
    grads = torch.einsum("bhcjrp,bhcisp->bhcjris", g_c, psi_c)  # g[j,r]·ΨV[i,s]
    w_intra = pairs.intra[:, :, :, :, None, :, None]
    d_scores = w_intra * grads  # ∂L/∂(q̊[j,r]·k̂[i,s])
    pair = (scores * grads).sum(dim=(4, 6))  # [B, H, nc, C (j), C (i)]
    d_k_hat = torch.einsum("bhcjris,bhcjrn->bhcisn", d_scores, q_c)
    d_q_rot = torch.einsum("bhcjris,bhcisn->bhcjrn", d_scores, k_c)
    d_psi_pairs = torch.einsum("bhcjris,bhcjrp->bhcisp", w_intra * scores, g_c)
    # dSSdA[c, i, j] = pair[j, i] for i, j in chunk c, unmasked (padded tokens are 0)
    dSSdA = pair.transpose(-1, -2).contiguous()

    # pairs across chunks: W[j, i] = exp(da_cs[j]) E[c_j, c_i] exp(da_cs_rev[i]). With
    # Y[j] = Σ_r q̊[j,r]ᵀ g[j,r] [N, P] and D[c'] = Σ_{c > c'} E[c, c'] Σ_{j in c} exp(da_cs[j]) Y[j], every sum over
    # the targets of later chunks of a source i of chunk c' is a product with D[c']
    later = pairs.from_later_chunks(torch.einsum("bhcj,bhcjrn,bhcjrp->bhcnp", pairs.read, q_c, g_c))  # D [B,H,nc,N,P]
    d_k_hat = d_k_hat + pairs.leave[..., None, None] * torch.einsum("bhcnp,bhcisp->bhcisn", later, psi_c)
    d_psi_pairs = d_psi_pairs + pairs.leave[..., None, None] * torch.einsum("bhcnp,bhcisn->bhcisp", later, k_c)
    ddA_cs_rev = torch.einsum("bhcisn,bhcnp,bhcisp->bhci", k_c, later, psi_c)  # ∂L/∂exp(da_cs_rev[i])
    # the state entering j's chunk, as given: ∂L/∂q̊[j] and ∂L/∂exp(da_cs[j])
    d_q_rot = d_q_rot + pairs.read[..., None, None] * torch.einsum("bhcjrp,bhcnp->bhcjrn", g_c, st)
    ddA_cs = torch.einsum("bhcjrn,bhcjrp,bhcnp->bhcj", q_c, g_c, st)
    # ∂L/∂Λ_c' = Σ_{j : c_j > c'} exp(da_cs[j]) E[c_j, c'] exp(Λ_c') Y[j]·states[c'] = exp(Λ_c') D[c']·states[c']
    ddA_chunk = torch.exp(pairs.lam) * (later * st).sum(dim=(3, 4))  # [B, H, nc]
    abs_ddA_chunk = None
    if with_abs_terms:
        later_abs = pairs.from_later_chunks(torch.einsum("bhcj,bhcjrn,bhcjrp->bhcnp", pairs.read, q_c.abs(),
                                                         g_c.abs()))
        abs_ddA_chunk = torch.exp(pairs.lam) * (later_abs * st.abs()).sum(dim=(3, 4))
    d_k_hat, d_q_rot, d_psi_pairs = (pairs.to_tokens(x, 2) for x in (d_k_hat, d_q_rot, d_psi_pairs))
    ddA_cs_rev, ddA_cs = pairs.to_tokens(ddA_cs_rev, 2), pairs.to_tokens(ddA_cs, 2)

    qk = f64["qk_dot"]
    d_psi_v = d_psi_pairs + gamma[..., None, None] * torch.einsum("bhtop,bhtor->bhtrp", grad_o, qk)
    dD = None
    if dims.has_d:
        d_psi_v = d_psi_v + f64["d"][None, :, None, None, None] * grad_o
        dD = (grad_o * psi_v).sum(dim=(2, 3, 4))  # [B, H]
    dv = (d_psi_v * psi[None, :, None]).sum(dim=3).permute(0, 2, 1, 3)  # [B, S, H, P]
    dmimo_v = (d_psi_v * v64[:, :, :, None, :]).sum(dim=2)  # [B, H, R, P]

    # same-token products: ∂L/∂qk_dot[t, r_out, r_in] = γ_t g[t,r_out]·ΨV[t,r_in]
    diag = torch.einsum("bhtop,bhtip->bhtoi", grad_o, psi_v)
    dgamma_diag = (qk * diag).sum(dim=(3, 4))
    d_qk = gamma[..., None, None] * diag

    dfactor = (k_rot * d_k_hat).sum(dim=(3, 4))
    d_k_rot = d_k_hat * factor[..., None, None]
    dk = _rotary_transpose(d_k_rot, cos, sin, width) + torch.einsum("bhtoi,bhton->bhtin", d_qk, q_biased)
    dq = _rotary_transpose(d_q_rot, cos, sin, width) + torch.einsum("bhtoi,bhtin->bhton", d_qk, k_biased)
    dangles = (_rotary_angle_grad(d_k_rot, k_biased, cos, sin, width)
               + _rotary_angle_grad(d_q_rot, q_biased, cos, sin, width)).permute(0, 2, 1, 3)
    chunk_of = torch.arange(S, device=device) // C
    ddA = ddA_chunk[:, :, chunk_of]  # ∂Λ_c/∂ADT_t = 1 for every token t of chunk c

    def to_bsrhn(x):  # [B, H, S, R, N] -> [B, S, R, H, N]
        return x.permute(0, 2, 3, 1, 4).contiguous()

    out = {"dq": to_bsrhn(dq), "dk": to_bsrhn(dk), "dv": dv.contiguous(), "dmimo_v": dmimo_v.contiguous(), "dD": dD,
           "dangles": dangles.contiguous(), "dfactor": dfactor.contiguous(), "dgamma_diag": dgamma_diag.contiguous(),
           "ddA": ddA.contiguous(), "dSSdA": dSSdA, "ddA_cs_rev": ddA_cs_rev.contiguous(),
           "ddA_cs": ddA_cs.contiguous()}
    abs_ddA = None if abs_ddA_chunk is None else abs_ddA_chunk[:, :, chunk_of]
    parts = {"grad_o": grad_o, "psi_v": psi_v, "abs_ddA": abs_ddA,
             "d_k_rot": d_k_rot, "d_q_rot": d_q_rot, "q_biased": q_biased, "k_biased": k_biased, "cos": cos, "sin": sin}
    return {name: out[name] for name in OUTPUT_NAMES}, parts


def mamba_mimo_bwd_bwd_oracle(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
    qk_dot, segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4,
) -> Dict[str, Optional[torch.Tensor]]:
    """Stage 2 of the MIMO backward in float64 with no rounding, from the definitions of the module docstring.

    Args:
        dout (Tensor): ``[B, S, H, P]`` with ``mimo_o``, else ``[B, S, R, H, P]``.
        q, k (Tensor): ``[B, S, R, G, N]``.
        v (Tensor): ``[B, S, H, P]``.
        q_bias, k_bias (Tensor): ``[H, R, N]``.
        mimo_v (Tensor): Ψ ``[H, R, P]``. mimo_o (Tensor | None): Φ ``[H, R, P]``.
        states (Tensor): ``[B, H, nc, N, P]``, the state entering each chunk (stage 1's ``states``).
        z (Tensor | None): ``[B, S, H, P]``, with mimo_z (Tensor | None): ζ ``[H, R, P]``.
        angles (Tensor): ``[B, S, H, N / rotary_dim_divisor]``, the cumulative angles.
        da_cs, da_cs_rev, dt, trap (Tensor): ``[B, H, S]``.
        d (Tensor | None): ``[H]``.
        qk_dot (Tensor): ``[B, H, S, R, R]`` (stage 1's ``qk_dot``).
        segsum (Tensor): ``[B, H, nc, C, C]``.
        chunk_size (int): C. rotary_dim_divisor (int): 2 or 4.
        Any real floating dtype; everything is converted to float64 first.

    Returns:
        dict: float64 tensors on the input device by :data:`OUTPUT_NAMES` (module docstring); ``dD`` is None
        without ``d``.

    Raises:
        TypeError, ValueError: from :func:`validate_inputs`, naming the argument.
    """
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                           da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor)
    tensors = (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt,
               trap, d, qk_dot, segsum)
    return _evaluate(dims, _as_f64(tensors))[0]


def _as_f64(tensors) -> Dict[str, Optional[torch.Tensor]]:
    return {name: (None if t is None else t.to(_F64).contiguous()) for name, t in zip(INPUT_NAMES, tensors)}


def mamba_mimo_bwd_bwd_abs_terms(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
    qk_dot, segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4,
) -> Dict[str, Optional[torch.Tensor]]:
    """``Σ |terms|`` of the three sums of stage 2 that cancel most, to judge their errors against.

    Each is the output's last sum with every product replaced by its absolute value (float64, arguments as
    :func:`mamba_mimo_bwd_bwd_oracle`):

    * ``dD`` ``[B, H]``: ``Σ_{t,r,p} |g[t,r,p] ΨV[t,r,p]|``;
    * ``ddA`` ``[B, H, S]``: ``Σ_{j : c_j > c} w[j, c] Σ_{r,n,p} |q̊[j,r,n] g[j,r,p] states[c][n,p]|``;
    * ``dangles`` ``[B, S, H, N/d]``: ``Σ_r`` of the four products ``|∂L/∂x̊₁ x₁ sin θ|``, ... of the rotation of
      ``q`` and of ``k`` (with the gradients w.r.t. the rotated vectors as they are).

    Returns:
        dict: ``dD`` (None without ``d``), ``ddA``, ``dangles``.
    """
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                           da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor)
    tensors = (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt,
               trap, d, qk_dot, segsum)
    _, parts = _evaluate(dims, _as_f64(tensors), with_abs_terms=True)
    g = parts["grad_o"].abs()
    width = dims.state_dim // dims.rotary_dim_divisor
    cos, sin = parts["cos"].abs(), parts["sin"].abs()

    def rotation_terms(dy, x):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :width].abs(), x[..., half:half + width].abs()
        dy1, dy2 = dy[..., :width].abs(), dy[..., half:half + width].abs()
        return (dy1 * (x1 * sin + x2 * cos) + dy2 * (x1 * cos + x2 * sin)).sum(dim=3)

    dangles = (rotation_terms(parts["d_k_rot"], parts["k_biased"])
               + rotation_terms(parts["d_q_rot"], parts["q_biased"])).permute(0, 2, 1, 3).contiguous()
    return {"dD": (g * parts["psi_v"].abs()).sum(dim=(2, 3, 4)) if dims.has_d else None,
            "ddA": parts["abs_ddA"].contiguous(), "dangles": dangles}
