"""Named rounding policies, each with the hardware or document it models and the evidence behind it.

``get(name)`` returns a preset, ``names()`` lists them, ``describe(name)`` gives its docstring, ``name_of(policy)``
finds the preset a policy equals. Evidence refers to ``shared/docs/upstream_rounding_sites.md`` (the catalog).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .policy import SWITCHES, RoundingPolicy

_ALL_OFF = {s: False for s in SWITCHES}

_PRESETS: Dict[str, Tuple[RoundingPolicy, str]] = {
    "fp64": (
        RoundingPolicy(**_ALL_OFF, math_dtype="float64", diag_mode="mul_then_add", state_update="separate",
                       silu_form="sigmoid", round_outputs=False),
        "Nothing rounded, float64 math, outputs returned unrounded in float64: the semantics of the FP64 oracle. "
        "Evidence: definition (docs/semantics.md with every switch off); tested against the independent oracle.",
    ),
    "fp32": (
        RoundingPolicy(**_ALL_OFF, math_dtype="float32", diag_mode="mul_then_add", state_update="separate",
                       silu_form="sigmoid", round_outputs=True),
        "The seed PR's all-FP32 golden (`mamba_mimo_bwd_fwd_golden`): FP32 math, only the lp output stores of "
        "states, dz and qk_dot rounded. Evidence: catalog §2.1 column 'Seed FP32 ref'.",
    ),
    "seed_bf16": (
        RoundingPolicy(lp_dtype="bfloat16", diag_mode="mul_then_add", state_update="separate",
                       silu_form="sigmoid"),
        "The seed PR's BF16 reference: every switch on, diagonal product and sum rounded separately, sigmoid SiLU, "
        "state GEMM summed then added. Matches upstream bf16 on sm_80/86/89 (A100, A40, L40) at the bf16 level. "
        "Evidence: catalog §2.1 (site-by-site), D1 and D4.",
    ),
    "upstream_sm80": (
        RoundingPolicy(lp_dtype="bfloat16", diag_mode="mul_then_add", state_update="accumulate_into",
                       silu_form="tanh"),
        "Upstream TileLang kernel, bf16, on A100/A40/L40 (sm_80-89): `__hmul`/`__hadd` lower to explicit "
        "`fma.rn.bf16` pairs, so the diagonal rounds product and sum; tanh-form SiLU; state GEMM accumulates into h. "
        "Evidence: catalog §1.5 (SASS for sm_86); not run on such a GPU.",
    ),
    "upstream_sm90": (
        RoundingPolicy(lp_dtype="bfloat16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh"),
        "Upstream TileLang kernel, bf16, on H100/H200 (sm_90): ptxas fuses the diagonal's bf16 mul+add into one "
        "HFMA2.BF16 (one rounding per rank step); tanh-form SiLU; state GEMM accumulates into h. Evidence: catalog "
        "§1.5 (SASS for sm_90a) and §2.2 D1 (H200 runs: DZ bit-exact in 3 seed cases with the fused model); the "
        "golden tests in tests/test_golden.py measure it against the real H200 outputs.",
    ),
    "upstream_sm90_fp16": (
        RoundingPolicy(lp_dtype="float16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh"),
        "Upstream kernel with dtype=float16 on sm_90: fp16 mul+add is fused on every architecture. Evidence: "
        "catalog §1.5 (SASS for sm_86 and sm_90a); no fp16 GPU run.",
    ),
    "upstream_sm80_fp16": (
        RoundingPolicy(lp_dtype="float16", diag_mode="fma", state_update="accumulate_into", silu_form="tanh"),
        "Upstream kernel with dtype=float16 on sm_80-89: the fp16 diagonal is fused there too, so this equals "
        "upstream_sm90_fp16 at the policy level (they differ only in tensor-core accumulation, an FP32-level "
        "knob not modelled yet). Evidence: catalog §1.5; no GPU run.",
    ),
}


def names() -> Tuple[str, ...]:
    """The preset names."""
    return tuple(_PRESETS)


def get(name: str) -> RoundingPolicy:
    """The preset called ``name``; ``ValueError`` listing the valid names otherwise."""
    if isinstance(name, RoundingPolicy):
        return name
    try:
        return _PRESETS[name][0]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; known presets: {list(_PRESETS)}") from None


def describe(name: str) -> str:
    """What the preset models and the evidence for it."""
    get(name)
    return _PRESETS[name][1]


def name_of(policy: RoundingPolicy) -> Optional[str]:
    """The first preset equal to ``policy``, or None."""
    for preset_name, (preset, _) in _PRESETS.items():
        if preset == policy:
            return preset_name
    return None


def resolve(policy) -> RoundingPolicy:
    """Accept a preset name, a ``RoundingPolicy`` or a path to a policy JSON file."""
    if isinstance(policy, RoundingPolicy):
        return policy
    if isinstance(policy, str):
        if policy in _PRESETS:
            return _PRESETS[policy][0]
        if policy.endswith(".json"):
            with open(policy, encoding="utf-8") as fh:
                return RoundingPolicy.from_json(fh.read())
        return get(policy)
    raise TypeError(f"policy must be a RoundingPolicy, a preset name or a .json path, got {type(policy).__name__}")
