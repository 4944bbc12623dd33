"""Upstream main's chunk-state storage and bias sums, modelled on the package's reference chain: what they do to
the gradients, against FP64.

Two of upstream main's changes after 2.3.2.post1 reach the whole op's backward without the fused output norm
(``docs/upstream_main.md``, items 1 and 3):

* **bf16 chunk states.** Stage 1 stores ``STATES`` in ``states_dtype``, bf16 by default, and ``mamba3_mimo`` passes
  none: an fp16 run stores its chunk states in bf16. Stage 2 loads them to FP32 and stages them to its lp shared
  memory, so its dq GEMM and its ``ddA`` state term see the bf16 values. A bf16 run is unchanged.
* **FP32 bias sums.** ``dq_bias`` and ``dk_bias`` are summed and returned in FP32 (the tag rounds them to lp).

The policy has no switch for either yet. The study models them without one, on the tensors passed between the
package's per-kernel references (nothing inside a reference changes):

* the states: stage 1 runs under the policy; its FP32 chunk states (its record's ``state``, which its own store
  rounds to lp) are rounded to bf16 instead and converted to the lp dtype for stage 2. For fp16 the conversion is
  exact for every bf16 value in fp16's normal range; a value below it (or above its largest) is rounded again, where
  main's ``ddA`` term would read the bf16 value itself: :func:`run_case` counts such values
  (``states_not_exact``);
* the bias sums: the epilogue reference's own ``bias_sums_in_lp=False``.

Variants per case (:data:`VARIANTS`): ``2.3.2.post1`` (the policy as it is), ``main: bf16 states``, ``main: fp32
bias sums``, ``main: both``. Each gradient's rel RMS against the FP64 chain (``chain.fp64_chain``), and the ratio
of ``main: both`` to ``2.3.2.post1``. ``Out`` is the forward's and is the same in every variant.
:func:`write_report` writes ``upstream_main_model.json`` and ``README.md`` (``scripts/measure_upstream_main.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from .. import provenance
from ..metrics import rel_rms
from ..ops.mamba3_mimo import chain
from ..ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs
from ..ops.mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference

#: label -> (bf16 chunk states, FP32 bias sums)
VARIANTS: Dict[str, tuple] = {"2.3.2.post1": (False, False), "main: bf16 states": (True, False),
                              "main: fp32 bias sums": (False, True), "main: both": (True, True)}
#: The gradients compared (the epilogue's names; None where a branch is off).
GRADIENTS = ("dQ", "dK", "dV", "dADT", "dDT", "dTrap", "dQ_bias", "dK_bias", "dMIMO_V", "dMIMO_Z", "dMIMO_Out",
             "dAngles", "dD", "dZ")


def default_specs(seqlens: Sequence[int] = (2048, 8192), dtypes: Sequence[str] = ("float16", "bfloat16"),
                  seed: int = 3301) -> List[OpCaseSpec]:
    """The realistic cases: N = P = 64, R = 4, C = 16, Z and D on, the reduced output, one group; H = 8 at S = 2048,
    16 at S = 8192 (the FP64 chain's benchmark shapes, ``reports/bench/fp64_chain_cpu.md``)."""
    return [OpCaseSpec(batch=1, seqlen=s, heads=8 if s <= 2048 else 16, groups=1, state_dim=64, value_dim=64, rank=4,
                       chunk_size=16, dtype=dtype, seed=seed) for s in seqlens for dtype in dtypes]


_PRESET_OF_DTYPE = {"float16": "upstream_sm90_fp16", "bfloat16": "upstream_sm90"}


def policy_for(dtype: str) -> str:
    """The 2.3.2.post1 preset of an lp dtype: ``upstream_sm90`` (``"bfloat16"``) or ``upstream_sm90_fp16``
    (``"float16"``)."""
    if dtype not in _PRESET_OF_DTYPE:
        raise ValueError(f"dtype must be one of {sorted(_PRESET_OF_DTYPE)}, got {dtype!r}")
    return _PRESET_OF_DTYPE[dtype]


def _check_state(state, lp_dtype) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.float32:
        raise TypeError(f"state must be a float32 torch.Tensor (stage 1's states before their store), got "
                        f"{getattr(state, 'dtype', type(state).__name__)}")
    if lp_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"lp_dtype must be torch.bfloat16 or torch.float16, got {lp_dtype!r}")


def states_as_main(state: torch.Tensor, lp_dtype: torch.dtype) -> torch.Tensor:
    """Stage 1's FP32 chunk states ``[B, H, nc, N, P]`` (before its store) as upstream main's stage 2 reads them:
    stored in bf16, then converted to the lp dtype."""
    _check_state(state, lp_dtype)
    return state.to(torch.bfloat16).to(lp_dtype)


def states_not_exact(state: torch.Tensor, lp_dtype: torch.dtype) -> int:
    """How many of the bf16-stored states the lp dtype does not hold exactly: for fp16, values below its normal
    range (where main's FP32 ``ddA`` term reads the bf16 value and :func:`states_as_main` the fp16 one) or above
    its largest."""
    _check_state(state, lp_dtype)
    bf16 = state.to(torch.bfloat16)
    return int((bf16.to(lp_dtype).float() != bf16.float()).sum())


def _epilogue(inputs: dict, pre: dict, bwd_fwd: dict, bwd_bwd: dict, policy, fp32_bias: bool) -> dict:
    knobs = chain.epilogue_reference_kwargs(policy)
    knobs["bias_sums_in_lp"] = knobs["bias_sums_in_lp"] and not fp32_bias
    return mamba3_mimo_epilogue_reference(*chain.epilogue_args(inputs, pre, bwd_fwd, bwd_bwd),
                                          **chain.epilogue_kwargs(inputs), **knobs)


def variant_gradients(inputs: dict, policy) -> Dict[str, dict]:
    """The epilogue's outputs (the 14 gradients, ...) of every variant of :data:`VARIANTS` on the op's ``inputs``
    (``make_op_inputs``, with ``dout``) under ``policy``, and ``"state"``: stage 1's FP32 chunk states before
    their store (its record's ``state``)."""
    pre = chain.run_preprocess(inputs, policy)
    record: dict = {}
    bwd_fwd = chain.run_stage1(inputs, pre, policy, record=record)
    state = record["mamba_mimo_bwd_fwd.state"]
    del record  # every other stage: gigabytes at S = 8192
    main_states = states_as_main(state, bwd_fwd["states"].dtype)
    stage1 = {False: bwd_fwd, True: dict(bwd_fwd, states=main_states)}
    stage2 = {main: chain.run_stage2(inputs, pre, stage1[main], policy) for main in (False, True)}
    out: Dict[str, dict] = {label: _epilogue(inputs, pre, stage1[bf16_states], stage2[bf16_states], policy, fp32_bias)
                            for label, (bf16_states, fp32_bias) in VARIANTS.items()}
    out["state"] = state
    return out


def run_case(spec: OpCaseSpec, policy=None) -> dict:
    """One case (module docstring): ``{"errors": {variant: {gradient: rel RMS}}, "states_not_exact": int,
    "states": int, "policy": name}``. ``policy``: default :func:`policy_for` the case's dtype."""
    policy = policy or policy_for(spec.dtype)
    inputs = make_op_inputs(spec)
    truth = chain.fp64_chain(inputs)
    grads = variant_gradients(inputs, policy)
    errors = {label: {name: rel_rms(grads[label][name], truth[name]) for name in GRADIENTS
                      if grads[label].get(name) is not None} for label in VARIANTS}
    return {"case": spec.case_id, "policy": policy if isinstance(policy, str) else "custom",
            "dtype": spec.dtype, "seqlen": spec.seqlen, "heads": spec.heads, "errors": errors,
            "states": grads["state"].numel(),
            "states_not_exact": states_not_exact(grads["state"], inputs["V"].dtype)}


def run(specs: Sequence[OpCaseSpec], progress: bool = True, command: Optional[str] = None) -> dict:
    """Every case of ``specs`` (:func:`run_case`); ``provenance``: the commit and tree the run started from."""
    from tqdm.auto import tqdm

    recorded = provenance.collect(command=command)
    cases = [run_case(spec) for spec in tqdm(specs, desc="upstream main model", disable=not progress)]
    return {"provenance": recorded, "cases": cases}


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x else "0"


def render(study: dict, smoke: bool = False) -> str:
    """The README: per case, each gradient's rel RMS against FP64 under every variant and the ratio main / tag."""
    lines = [provenance.markdown_header(study["provenance"]), "",
             "# Upstream main's bf16 chunk states and FP32 bias sums, modelled on the package's references",
             "", ("**Smoke run (small case): not a measurement to quote.**\n" if smoke else ""),
             "`mimo_numerics.studies.upstream_main` (the method, and what it models exactly: its docstring; the "
             "changes: `docs/upstream_main.md`). Each cell: a gradient's rel RMS against the FP64 chain. "
             "`main / tag`: `main: both` over `2.3.2.post1`. Modelled on the package's references, not run with "
             "upstream main's kernels.", ""]
    for case in study["cases"]:
        names = [n for n in GRADIENTS if n in case["errors"]["2.3.2.post1"]]
        lines += [f"## {case['case']} (`{case['policy']}`, S = {case['seqlen']}, H = {case['heads']})", "",
                  f"States the lp dtype does not hold exactly after the bf16 rounding: {case['states_not_exact']} "
                  f"of {case['states']}.", "",
                  "| variant | " + " | ".join(f"`{n}`" for n in names) + " |",
                  "|---|" + "---:|" * len(names)]
        for label, errs in case["errors"].items():
            lines.append(f"| {label} | " + " | ".join(_fmt(errs[n]) for n in names) + " |")
        tag, main = case["errors"]["2.3.2.post1"], case["errors"]["main: both"]
        lines.append("| main / tag | " + " | ".join(f"{main[n] / tag[n]:.2f}" if tag[n] else "–" for n in names)
                     + " |")
        lines.append("")
    return "\n".join(lines)


def write_report(study: dict, out_dir, smoke: bool = False) -> Path:
    """``upstream_main_model.json`` and ``README.md`` into ``out_dir``; returns the README's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "upstream_main_model.json").write_text(json.dumps(study, indent=1) + "\n", encoding="utf-8")
    readme = out_dir / "README.md"
    readme.write_text(render(study, smoke) + "\n", encoding="utf-8")
    return readme
