"""Non-finite propagation rules of backward stage 1: for one NaN or ±Inf at one element of one input, the output
elements that must be non-finite (``docs/nonfinite.md``, tables 1 and 2).

The rules evaluate ``docs/semantics.md`` in IEEE arithmetic, which is what stage 1's reference and Triton kernels do;
``tests/test_reliability_nonfinite.py`` checks both against them. The generic tools reach this module through the
operator spec (``OPERATOR.extra["nonfinite_rules"]``): ``mimo_numerics.nonfinite.predict_nan_outputs`` and
``predict_nonfinite_outputs``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch

from ...nonfinite import rotary_partners
from .outputs import INPUT_NAMES


def _dims_of(inputs_or_dims):
    from ...validation import Dims
    from .validation import validate_inputs

    if isinstance(inputs_or_dims, Dims):
        return inputs_or_dims
    x = inputs_or_dims
    return validate_inputs(*(x[n] for n in INPUT_NAMES), x["chunk_size"], x["rotary_dim_divisor"])


def predict_nan_outputs(inputs_or_dims, name: str, index: Sequence[int]) -> Dict[str, Optional[torch.Tensor]]:
    """The output elements a single NaN at ``inputs[name][index]`` makes NaN (``docs/nonfinite.md``, table 1).

    The prediction evaluates ``docs/semantics.md`` in IEEE arithmetic: NaN enters every sum and product it takes
    part in, including products with the exact zeros of the causal mask inside the chunk GEMMs (``0·NaN = NaN``),
    and is stopped only where a value is *selected* away: the causal mask of the scores and of ``exp(segsum)``,
    padding rows, the shifted γ of the last token. Every other input must be finite and small enough not to
    overflow; then the prediction is exact for the reference (any policy) and the Triton kernels. It does not depend
    on the policy or on the values of the other inputs.

    Args:
        inputs_or_dims: a ``cases.make_inputs`` dict (validated) or a ``validation.Dims``.
        name (str): one of ``INPUT_NAMES`` (not None in these inputs).
        index (sequence of int): a full index into that input.

    Returns:
        dict: output name -> bool tensor of the output's shape (True = NaN expected), None for absent outputs.
    """
    dims = _dims_of(inputs_or_dims)
    if name not in INPUT_NAMES:
        raise ValueError(f"unknown input {name!r}; inputs are {list(INPUT_NAMES)}")
    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    hpg = dims.heads_per_group
    index = tuple(int(i) for i in index)
    out = torch.zeros((B, H, S, R, P), dtype=torch.bool)  # o after S30, per token and rank
    states = torch.zeros((B, H, nc, N, P), dtype=torch.bool)
    qk = torch.zeros((B, H, S, R, R), dtype=torch.bool)
    dphio_extra = torch.zeros((B, H, S, R, P), dtype=torch.bool)  # dΦO poisoned by dout or Φ
    x_bad = torch.zeros((B, H, S, R, P), dtype=torch.bool)  # x = z·ζ poisoned (gate, dZζ)
    dout_reduced = torch.zeros((B, H, S, P), dtype=torch.bool)

    def last_valid(c):
        return min((c + 1) * C, S) - 1

    def khat(b, heads, t, cols):
        """k̂[t] (all ranks) poisoned in state columns ``cols``: scores of later rows, states of later chunks."""
        c = t // C
        for h in heads:
            out[b, h, t + 1:] = True  # later rows of chunk c (scores) and every row of later chunks (inter)
            for n in cols:
                states[b, h, c + 1:, n, :] = True

    def psiv_at(b, heads, t, cols):
        """ΨV[t] (all ranks) poisoned in value columns ``cols``."""
        c = t // C
        for h in heads:
            for p in cols:
                out[b, h, c * C:, :, p] = True  # every row of chunk c (0·NaN in the intra GEMM) and later chunks
                states[b, h, c + 1:, :, p] = True

    def decay_after(b, heads, c):
        for h in heads:
            states[b, h, c + 1:] = True
            out[b, h, (c + 1) * C:] = True

    if name == "dout":
        if dims.reduce_o:
            b, t, h, p = index
            dout_reduced[b, h, t, p] = True
            dphio_extra[b, h, t, :, p] = True
        else:
            b, t, r, h, p = index
            dphio_extra[b, h, t, r, p] = True
        if not dims.has_z:
            dphio_extra.zero_()
    elif name == "q":
        b, t, r, g, n = index
        heads = range(g * hpg, (g + 1) * hpg)
        for h in heads:
            qk[b, h, t, r, :] = True
            out[b, h, t, r, :] = True  # diagonal, inter row (even with h_0 = 0), scores row
    elif name == "k":
        b, t, r, g, n = index
        heads = range(g * hpg, (g + 1) * hpg)
        for h in heads:
            qk[b, h, t, :, r] = True
            out[b, h, t] = True  # the diagonal term of token t mixes every rank
        khat(b, heads, t, rotary_partners(n, N, dims.rotary_dim_divisor))
    elif name == "v":
        b, t, h, p = index
        psiv_at(b, [h], t, [p])
    elif name == "q_bias":
        h, r, n = index
        qk[:, h, :, r, :] = True
        out[:, h, :, r, :] = True
    elif name == "k_bias":
        h, r, n = index
        qk[:, h, :, :, r] = True
        out[:, h] = True
        for m in rotary_partners(n, N, dims.rotary_dim_divisor):
            states[:, h, 1:, m, :] = True  # padded rows too: k̂ = NaN·0
    elif name == "mimo_v":
        h, r, p = index
        for b in range(B):
            psiv_at(b, [h], 0, [p])
    elif name == "mimo_o":
        h, r, p = index
        if dims.reduce_o and dims.has_z:
            dphio_extra[:, h, :, r, p] = True
    elif name == "z":
        b, t, h, p = index
        x_bad[b, h, t, :, p] = True
    elif name == "mimo_z":
        h, r, p = index
        x_bad[:, h, :, r, p] = True
    elif name == "angles":
        b, t, h, j = index
        out[b, h, t] = True  # the inter row of token t
        khat(b, [h], t, rotary_partners(j, N, dims.rotary_dim_divisor))
    elif name == "da_cs":
        b, h, t = index
        out[b, h, t] = True  # inter row decay, multiplied even when h_c = 0
        c = t // C
        if t == last_valid(c) and c < nc - 1:
            decay_after(b, [h], c)
    elif name == "da_cs_rev":
        b, h, t = index
        decay_after(b, [h], t // C)
    elif name in ("dt", "trap"):
        b, h, t = index
        out[b, h, t] = True  # γ_t in the diagonal
        khat(b, [h], t, range(N))  # trap_scale_t
        if t >= 1:
            khat(b, [h], t - 1, range(N))  # shifted γ_{t-1} reads dt_t, trap_t
    elif name == "d":
        (h,) = index
        out[:, h] = True
    elif name == "segsum":
        b, h, c, i, j = index
        if i > j and c * C + i < S:
            out[b, h, c * C + i] = True

    dmimo_o = dz = dmimo_z = None
    if dims.has_z:
        dzz = out | dphio_extra | x_bad
        dz = dzz.any(dim=3).permute(0, 2, 1, 3).contiguous()  # [B, S, H, P]
        dmimo_z = dzz.any(dim=2)
    if dims.reduce_o:
        gated = out | x_bad if dims.has_z else out
        dmimo_o = (gated | dout_reduced[:, :, :, None, :]).any(dim=2)
    return {"dmimo_o": dmimo_o, "states": states, "dz": dz, "dmimo_z": dmimo_z, "qk_dot": qk}


#: Inputs that reach the outputs only through ``exp`` (da_cs, da_cs_rev, segsum: exp(−Inf) = 0 is a full decay) or
#: only through ``σ`` (trap: σ(±Inf) is 0 or 1).
EXP_ONLY_INPUTS = ("da_cs", "da_cs_rev", "segsum")
SIGMOID_ONLY_INPUTS = ("trap",)


def predict_nonfinite_outputs(inputs_or_dims, name: str, index: Sequence[int],
                              value: float = float("nan")) -> Dict[str, Optional[torch.Tensor]]:
    """The output elements a single NaN, +Inf or −Inf at ``inputs[name][index]`` makes non-finite.

    A NaN gives :func:`predict_nan_outputs`. An infinity reaches the same elements (it turns into NaN at the first
    ``Inf·0`` or ``Inf − Inf`` and stays non-finite through every sum, product and rounding), except where the
    function it enters is bounded there (``docs/nonfinite.md``, table 2): ``trap = ±Inf`` gives σ = 1 or 0 and
    finite outputs; ``da_cs``, ``da_cs_rev`` or ``segsum`` = −Inf gives ``exp = 0``, a complete decay, and finite
    outputs. The class of each element (NaN or which infinity) is not predicted, only that it is not finite.

    Returns:
        dict: output name -> bool tensor (True = non-finite expected), None for absent outputs.
    """
    value = float(value)
    if math.isfinite(value):
        raise ValueError(f"value must be NaN, +Inf or -Inf, got {value!r}")
    pattern = predict_nan_outputs(inputs_or_dims, name, index)
    infinite = not math.isnan(value)
    if infinite and (name in SIGMOID_ONLY_INPUTS or (name in EXP_ONLY_INPUTS and value < 0)):
        pattern = {k: (None if m is None else torch.zeros_like(m)) for k, m in pattern.items()}
    return pattern
