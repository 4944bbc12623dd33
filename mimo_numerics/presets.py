"""Named rounding policies: each one hardware or software setup, meaning the same thing for every operator.

A preset fixes the knobs here; each operator's ``sites.py`` says which of its sites the preset turns on
(``PRESET_SITES``) and the evidence for it on that operator (``PRESET_EVIDENCE``). An operator that does not list a
preset gets no section: the preset defines no semantics there, and using it for that operator raises
:class:`mimo_numerics.policy.PolicyUndefined` naming the operator (``seed_bf16`` is the seed PR's stage-1
reference; it says nothing about the other kernels).

``get(name)`` returns a preset, ``names()`` lists them, ``describe(name)`` gives what it models and the evidence per
operator, ``name_of(policy)`` finds the preset a policy equals, ``resolve(x)`` accepts a name, a policy or a JSON
file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Tuple

from .ops import registry
from .policy import ALL_KNOBS, FP32_LEVEL_SM90, RoundingPolicy

#: preset -> (knobs, what it models).
_KNOBS: Dict[str, Tuple[dict, str]] = {
    "fp64": (
        dict(math_dtype="float64", diag_mode="mul_then_add", state_update="separate", silu_form="sigmoid",
             round_outputs=False, helper_fma="separate"),
        "Nothing rounded, float64 math, outputs returned unrounded in float64: the semantics of the FP64 oracles.",
    ),
    "fp32": (
        dict(math_dtype="float32", diag_mode="mul_then_add", state_update="separate", silu_form="sigmoid",
             round_outputs=True, helper_fma="separate"),
        "FP32 math, only the lp output stores rounded (the seed PR's all-FP32 golden for stage 1).",
    ),
    "seed_bf16": (
        dict(lp_dtype="bfloat16", diag_mode="mul_then_add", state_update="separate", silu_form="sigmoid"),
        "The seed PR's BF16 reference: every site on, bf16 mul+add pairs rounded twice (product, then sum), sigmoid "
        "SiLU, state GEMM summed then added. Defined by the seed PR for backward stage 1 only.",
    ),
    "upstream_sm80": (
        dict(lp_dtype="bfloat16", diag_mode="mul_then_add", state_update="accumulate_into", silu_form="tanh"),
        "Upstream TileLang kernels, bf16, on A100/A40/L40 (sm_80-89): bf16 mul+add pairs lower to fma.rn.bf16 "
        "pairs (two roundings); tanh-form SiLU; state GEMMs accumulate into the state. Not run on such a GPU.",
    ),
    "upstream_sm90": (
        dict(lp_dtype="bfloat16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh"),
        "Upstream TileLang kernels, bf16, on H100/H200 (sm_90): ptxas fuses bf16 mul+add pairs into one HFMA2.BF16 "
        "(one rounding); tanh-form SiLU; state GEMMs accumulate into the state.",
    ),
    "upstream_sm90_fp16": (
        dict(lp_dtype="float16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh"),
        "Upstream kernels with dtype=float16 on sm_90: fp16 mul+add is fused on every architecture.",
    ),
    "upstream_sm90_exact": (
        dict(lp_dtype="bfloat16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh",
             **FP32_LEVEL_SM90),
        "The closest model of the real kernels on H100/H200 (sm_90), bf16: upstream_sm90's roundings plus every "
        "FP32-level model of the H200 (gemm_model='sm90_wgmma': the tensor cores' accumulation; "
        "special_functions='fast_sm90': the MUFU exp/tanh/sin/cos/rcp bit for bit; fp32_fma=True: nvcc's "
        "contractions). Not bit-exact: the worst of Out and the 14 gradients is 1.1e-7 to 7.0e-5 from the H200's "
        "on the bf16 golden cases up to S = 8192, where upstream_sm90 alone is at 9.4e-4 to 7.3e-2 "
        "(reports/fp32_level_whole_op.md). For fidelity; the reference runs slower than under upstream_sm90 "
        "(docs/gating.md, Presets) and the Triton kernels refuse it.",
    ),
    "upstream_sm90_exact_fp16": (
        dict(lp_dtype="float16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh",
             **FP32_LEVEL_SM90),
        "upstream_sm90_exact with dtype=float16: upstream_sm90_fp16's roundings plus every FP32-level model of the "
        "H200: the worst of Out and the gradients is 6.6e-6 to 8.5e-5 from the H200's on the fp16 golden cases up to "
        "S = 8192 (reports/fp32_level_whole_op.md); the Triton kernels refuse it.",
    ),
    "upstream_sm80_fp16": (
        dict(lp_dtype="float16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh"),
        "Upstream kernels with dtype=float16 on sm_80-89: fp16 mul+add is fused there too, so this equals "
        "upstream_sm90_fp16 at the policy level (they differ in tensor-core accumulation, an FP32-level knob not "
        "modelled yet).",
    ),
}


def _build(name: str) -> RoundingPolicy:
    knobs, _ = _KNOBS[name]
    sites = {op: registry.preset_sites(op).get(name) for op in registry.OPERATORS}
    return RoundingPolicy(sites=sites, **knobs)


_PRESETS: Dict[str, RoundingPolicy] = {name: _build(name) for name in _KNOBS}


def names() -> Tuple[str, ...]:
    """The preset names."""
    return tuple(_PRESETS)


def get(name) -> RoundingPolicy:
    """The preset called ``name`` (a ``RoundingPolicy`` is returned as is); ``ValueError`` listing the valid names
    otherwise."""
    if isinstance(name, RoundingPolicy):
        return name
    try:
        return _PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; known presets: {list(_PRESETS)}") from None


def describe(name: str) -> str:
    """What the preset models, and per operator whether it is defined there and the evidence."""
    policy = get(name)
    lines = [_KNOBS[name][1]]
    for op in registry.OPERATORS:
        if policy.defines(op):
            evidence = registry.preset_evidence(op).get(name, "no evidence recorded")
            lines.append(f"{op}: {evidence}")
        else:
            lines.append(f"{op}: not defined by this preset")
    return "\n".join(lines)


def name_of(policy: RoundingPolicy, operator: Optional[str] = None) -> Optional[str]:
    """The first preset equal to ``policy`` (compared on the knobs and ``operator``'s section only, when given),
    or None."""
    for preset_name, preset in _PRESETS.items():
        if operator is None:
            if preset == policy:
                return preset_name
        elif (preset.defines(operator) and policy.defines(operator)
              and preset.section(operator) == policy.section(operator)
              and all(getattr(preset, k) == getattr(policy, k) for k in ALL_KNOBS)):
            return preset_name
    return None


def label(policy: RoundingPolicy, operator: Optional[str] = None,
          relative_to: Optional[RoundingPolicy] = None) -> str:
    """A short name for ``policy``: the preset it equals, else ``"<base> with <field>=<value>, ..."`` where the base
    is ``relative_to`` or the nearest preset (fewest differing fields). With ``operator``, only the knobs and that
    operator's sites count, named bare (``"upstream_sm90 with out=False"``)."""
    name = name_of(policy, operator=operator)
    if name:
        return name
    candidates = [relative_to] if relative_to is not None else [
        p for p in _PRESETS.values() if operator is None or p.defines(operator)]
    base = min(candidates, key=lambda p: len(p.diff(policy, operator=operator)))
    changes = ", ".join(f"{k}={b}" for k, (a, b) in base.diff(policy, operator=operator).items())
    base_name = name_of(base, operator=operator) or "custom"
    return f"{base_name} with {changes}" if changes else base_name


def resolve(policy) -> RoundingPolicy:
    """The policy of a preset name, a ``RoundingPolicy`` or the path of a policy JSON file: the package's file loader
    (``mimo-numerics policy show NAME > p.json`` writes such a file; :meth:`RoundingPolicy.from_json` takes the JSON
    text instead). A file is named in errors."""
    if isinstance(policy, RoundingPolicy):
        return policy
    if isinstance(policy, (str, Path)):
        text = str(policy)
        if text in _PRESETS:
            return _PRESETS[text]
        if text.endswith(".json"):
            path = Path(text)
            if not path.is_file():
                raise ValueError(f"policy file {text} does not exist")
            content = path.read_text(encoding="utf-8")
            if content.lstrip().startswith("#"):
                raise ValueError(f"policy file {text} is not valid JSON: it starts with a '#' line (the name line "
                                 "older versions of `mimo-numerics policy show` printed to stdout); delete that line")
            return RoundingPolicy.from_json(content, source=text)
        return get(text)
    raise TypeError(f"policy must be a RoundingPolicy, a preset name or a .json path, got {type(policy).__name__}")
