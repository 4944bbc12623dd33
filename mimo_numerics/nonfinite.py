"""Non-finite values (NaN, ±Inf) in ``mamba_mimo_bwd_fwd``: where they first appear, and where they must show up.

Two tools, both described in ``docs/nonfinite.md``:

* **Locating**: :func:`first_nonfinite` / :func:`first_nonfinite_stage` take a stage record of the reference (or of
  the kernels, which record under the same names) or a drift *run* (``mimo_numerics.drift``: stages plus
  ``"output.<name>"`` tensors) and return the first stage, in pipeline order (``drift.STAGES``), that holds a
  non-finite value, with the rounding switch of that stage (the *site*, e.g. ``psiv`` for an FP16 overflow of v·Ψ).
  :func:`locate_nonfinite` runs the reference with a record and does it in one call; :func:`nonfinite_switches`
  says which rounding switches of a policy a non-finite result depends on (turning one off makes it go away or
  moves it).
* **Predicting**: :func:`predict_nan_outputs` gives, for one NaN placed at one element of one input (every other
  input finite and moderate), the output elements that must be NaN when ``docs/semantics.md`` is evaluated in IEEE
  arithmetic, which is what the reference and the Triton kernels do; :func:`predict_nonfinite_outputs` does the
  same for ±Inf. The rules are the tables of ``docs/nonfinite.md``; ``tests/test_reliability_nonfinite.py`` checks
  the reference and the kernels against them.

Classes of values (:func:`value_class`): 0 finite, 1 NaN, 2 +Inf, 3 −Inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .outputs import INPUT_NAMES, OUTPUT_NAMES

#: Prefix of output tensors in a drift run (same as ``drift.OUTPUT_PREFIX``).
OUTPUT_PREFIX = "output."

#: The stages of ``reference.mamba_mimo_bwd_fwd(record=...)`` in pipeline order, then the outputs (the order of
#: ``drift.STAGES``, repeated here so that this module imports nothing heavy).
PIPELINE: Tuple[str, ...] = (
    "q_biased", "k_biased", "qk_dot", "q_rot", "k_rot", "gamma", "shifted_gamma", "trap_scale", "k_scaled", "psiv",
    "k_state", "state", "state_operand", "inter", "causal_scores", "intra", "diag_accum", "diag", "out", "gate",
    "dphio", "dzz", "dz_accum",
) + tuple(OUTPUT_PREFIX + o for o in OUTPUT_NAMES)

#: The policy switch that rounds each stage (the site an FP16/BF16 overflow to ±Inf happens at), None for stages
#: computed in the math dtype only. The lp output stores (``states``, ``qk_dot``, ``dz``) round under
#: ``round_outputs``; ``dmimo_o``/``dmimo_z`` are FP32 sums.
STAGE_SWITCH: Dict[str, Optional[str]] = {
    "q_biased": "qk_biased", "k_biased": "qk_biased", "qk_dot": "qk_dot_internal", "q_rot": "rotary",
    "k_rot": "rotary", "gamma": None, "shifted_gamma": "shifted_gamma", "trap_scale": "trap_scale",
    "k_scaled": "k_scaled", "psiv": "psiv", "k_state": "k_state", "state": None, "state_operand": "state_operand",
    "inter": None, "causal_scores": "causal_scores", "intra": None, "diag_accum": "diag_accum", "diag": "diag_gamma",
    "out": "out", "gate": None, "dphio": "dphio", "dzz": None, "dz_accum": "dz_accum",
    OUTPUT_PREFIX + "dmimo_o": None, OUTPUT_PREFIX + "states": "round_outputs", OUTPUT_PREFIX + "dz": "round_outputs",
    OUTPUT_PREFIX + "dmimo_z": None, OUTPUT_PREFIX + "qk_dot": "round_outputs",
}

_CLASS_NAMES = {1: "nan", 2: "+inf", 3: "-inf"}


# ---------------------------------------------------------------------------------------------- classes of values
def value_class(t: torch.Tensor) -> torch.Tensor:
    """Per element: 0 finite, 1 NaN, 2 +Inf, 3 −Inf (int8, same shape; any floating dtype)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    x = t.detach()
    out = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    if not x.is_floating_point():
        return out
    out = torch.where(torch.isnan(x), torch.ones_like(out), out)
    out = torch.where(torch.isposinf(x), torch.full_like(out, 2), out)
    return torch.where(torch.isneginf(x), torch.full_like(out, 3), out)


def nonfinite_mask(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``~isfinite(t)`` (None for None)."""
    return None if t is None else ~torch.isfinite(t.detach())


def pattern_mismatches(actual, expected, exact: bool = True) -> Dict[str, Optional[int]]:
    """Per output, the number of elements whose class differs (``exact``) or whose finiteness differs.

    Args:
        actual, expected: ``MimoBwdFwdOutputs`` or dicts by output name.
        exact (bool): compare the full class (NaN, +Inf, −Inf, finite); False compares only finite vs non-finite.

    Returns:
        dict: output name -> mismatch count, None where both are None.

    Raises:
        ValueError: when one side has an output the other lacks, or the shapes differ.
    """
    a_all = actual._asdict() if hasattr(actual, "_asdict") else dict(actual)
    e_all = expected._asdict() if hasattr(expected, "_asdict") else dict(expected)
    result: Dict[str, Optional[int]] = {}
    for name in OUTPUT_NAMES:
        a, e = a_all.get(name), e_all.get(name)
        if a is None and e is None:
            result[name] = None
            continue
        if a is None or e is None:
            raise ValueError(f"output {name}: present on one side only")
        if tuple(a.shape) != tuple(e.shape):
            raise ValueError(f"output {name}: shapes {list(a.shape)} and {list(e.shape)} differ")
        if exact:
            diff = value_class(a).cpu() != value_class(e).cpu()
        else:
            diff = nonfinite_mask(a).cpu() != nonfinite_mask(e).cpu()
        result[name] = int(diff.sum())
    return result


# ---------------------------------------------------------------------------------------------- locating
@dataclass(frozen=True)
class NonFinite:
    """Non-finite values of one stage.

    Attributes:
        stage (str): the stage (a record name, or ``"output.<name>"``).
        count (int): number of non-finite elements. total (int): number of elements.
        nan, posinf, neginf (int): counts per class.
        index (tuple): the first non-finite element (row-major order).
        kind (str): ``"nan"``, ``"+inf"`` or ``"-inf"``: the class of that element.
        switch (str | None): the policy switch rounding this stage (``STAGE_SWITCH``), None for math-dtype stages.
    """

    stage: str
    count: int
    total: int
    nan: int
    posinf: int
    neginf: int
    index: Tuple[int, ...]
    kind: str
    switch: Optional[str]

    def describe(self) -> str:
        site = f" (rounded by switch {self.switch!r})" if self.switch else " (math dtype, not a rounding site)"
        return (f"{self.stage}{site}: {self.count}/{self.total} non-finite (NaN {self.nan}, +Inf {self.posinf}, "
                f"-Inf {self.neginf}); first at index {list(self.index)} ({self.kind})")


def _as_run(record: Optional[Mapping[str, Any]], outputs: Any) -> Dict[str, torch.Tensor]:
    run: Dict[str, torch.Tensor] = {}
    if record is not None:
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a dict of named tensors, got {type(record).__name__}")
        for name, value in record.items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"record[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
            run[name] = value
    if outputs is not None:
        mapping = outputs._asdict() if hasattr(outputs, "_asdict") else dict(outputs)
        unknown = sorted(set(mapping) - set(OUTPUT_NAMES))
        if unknown:
            raise ValueError(f"unknown output name(s) {unknown}; outputs are {list(OUTPUT_NAMES)}")
        for name in OUTPUT_NAMES:
            if mapping.get(name) is not None:
                run[OUTPUT_PREFIX + name] = mapping[name]
    return run


def pipeline_order(stages) -> List[str]:
    """``stages`` sorted in pipeline order (``PIPELINE``); unknown names follow, in their given order."""
    stages = list(stages)
    return [s for s in PIPELINE if s in stages] + [s for s in stages if s not in PIPELINE]


def _describe_stage(stage: str, tensor: torch.Tensor) -> Optional[NonFinite]:
    cls = value_class(tensor).reshape(-1).cpu()
    bad = cls != 0
    count = int(bad.sum())
    if count == 0:
        return None
    flat = int(torch.nonzero(bad)[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(tensor.shape))) if tensor.dim() else ()
    return NonFinite(stage=stage, count=count, total=int(cls.numel()), nan=int((cls == 1).sum()),
                     posinf=int((cls == 2).sum()), neginf=int((cls == 3).sum()), index=index,
                     kind=_CLASS_NAMES[int(cls[flat])], switch=STAGE_SWITCH.get(stage))


def nonfinite_stages(record: Optional[Mapping[str, Any]] = None, outputs: Any = None) -> List[NonFinite]:
    """Every stage (and output) holding a non-finite value, in pipeline order.

    Args:
        record (dict, optional): a stage record (``record=`` of the reference or the kernels) or a drift run.
        outputs (optional): ``MimoBwdFwdOutputs`` or a dict by output name, checked after the stages.
    """
    run = _as_run(record, outputs)
    found = []
    for stage in pipeline_order(run):
        item = _describe_stage(stage, run[stage])
        if item is not None:
            found.append(item)
    return found


def first_nonfinite(record: Optional[Mapping[str, Any]] = None, outputs: Any = None) -> Optional[NonFinite]:
    """The first stage, in pipeline order, holding a non-finite value (None when everything is finite)."""
    run = _as_run(record, outputs)
    for stage in pipeline_order(run):
        item = _describe_stage(stage, run[stage])
        if item is not None:
            return item
    return None


def first_nonfinite_stage(record: Optional[Mapping[str, Any]] = None, outputs: Any = None) -> Optional[str]:
    """The name of :func:`first_nonfinite`'s stage, or None."""
    item = first_nonfinite(record, outputs)
    return None if item is None else item.stage


def nonfinite_inputs(inputs: Mapping[str, Any]) -> Dict[str, int]:
    """Inputs holding non-finite values, with their counts (absent or all-finite inputs are left out)."""
    result = {}
    for name in INPUT_NAMES:
        value = inputs.get(name)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            count = int((~torch.isfinite(value.detach())).sum())
            if count:
                result[name] = count
    return result


def locate_nonfinite(inputs: Mapping[str, Any], policy: Any = "upstream_sm90") -> Optional[NonFinite]:
    """Run the reference on ``inputs`` (a ``cases.make_inputs`` dict) with a record; :func:`first_nonfinite`."""
    from .cases import as_args, as_kwargs
    from .reference import mamba_mimo_bwd_fwd

    record: Dict[str, torch.Tensor] = {}
    with torch.no_grad():
        outputs = mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy, record=record)
    return first_nonfinite(record, outputs)


def nonfinite_switches(inputs: Mapping[str, Any], policy: Any = "upstream_sm90") -> Dict[str, Optional[NonFinite]]:
    """Which rounding switches a non-finite result depends on.

    For every switch that is on in ``policy`` (and ``round_outputs`` when on), the first non-finite stage of the
    reference with that one switch turned off. A switch whose entry is None, or names a later stage than
    :func:`locate_nonfinite` under ``policy`` itself, is where the overflow happens; switches whose entry is
    unchanged do not matter.

    Returns:
        dict: switch -> ``NonFinite`` or None (everything finite with that switch off), in ``SWITCHES`` order.
    """
    from . import presets
    from .ops import registry
    from .policy import read_field, write_fields

    op = registry.DEFAULT_OPERATOR
    policy = presets.resolve(policy)
    result: Dict[str, Optional[NonFinite]] = {}
    for name in tuple(registry.site_table(op)) + ("round_outputs",):
        if read_field(policy, op, name):
            result[name] = locate_nonfinite(inputs, write_fields(policy, op, **{name: False}))
    return result


# ---------------------------------------------------------------------------------------------- predicting
def _dims_of(inputs_or_dims):
    from .validation import Dims, validate_inputs

    if isinstance(inputs_or_dims, Dims):
        return inputs_or_dims
    x = inputs_or_dims
    return validate_inputs(*(x[n] for n in INPUT_NAMES), x["chunk_size"], x["rotary_dim_divisor"])


def rotary_partners(n: int, state_dim: int, rotary_dim_divisor: int) -> List[int]:
    """The state columns that column ``n`` of q̃ or k̃ reaches through the rotation: its rotary pair, or itself."""
    width, half = state_dim // rotary_dim_divisor, state_dim // 2
    if n < width:
        return [n, half + n]
    if half <= n < half + width:
        return [n - half, n]
    return [n]


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


def with_value(inputs: Mapping[str, Any], name: str, index: Sequence[int], value: float) -> Dict[str, Any]:
    """A copy of ``inputs`` with ``inputs[name][index] = value`` (the other tensors shared, not copied)."""
    if name not in INPUT_NAMES or inputs.get(name) is None:
        raise ValueError(f"input {name!r} is absent or unknown")
    result = dict(inputs)
    tensor = inputs[name].clone()
    tensor[tuple(int(i) for i in index)] = value
    result[name] = tensor
    return result


__all__ = [
    "PIPELINE", "STAGE_SWITCH", "NonFinite", "value_class", "nonfinite_mask", "pattern_mismatches",
    "pipeline_order", "nonfinite_stages", "first_nonfinite", "first_nonfinite_stage", "nonfinite_inputs",
    "locate_nonfinite", "nonfinite_switches", "rotary_partners", "predict_nan_outputs", "predict_nonfinite_outputs",
    "with_value", "EXP_ONLY_INPUTS", "SIGMOID_ONLY_INPUTS",
]
