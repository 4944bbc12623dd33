"""Decode drift: a prefill, then a long decode under a policy, each token's output and the carried state against
FP64.

Upstream decodes token by token from the state the prefill returns (``mamba3_mimo(..., return_state=True)``, then
``Mamba3.step``). The decode step stores the rotated k in lp, and that k is the next token's ``k_state``: does the
error of a decode grow with its length, where the chunked op's does not? :func:`run` answers it for one case:

* the prefill of the first ``prefill`` tokens under the policy (the op's reference), giving the decode state;
* ``tokens`` steps of :func:`..ops.mamba3_mimo.decode.mamba3_mimo_step` under the policy;
* the truth: the FP64 prefill and the FP64 step (:func:`..ops.mamba3_mimo.step.mamba3_mimo_step_fp64`; one FP64
  prefill of every token gives the same to 4e-16, ``tests/ops/mamba3_mimo/test_return_state.py``);
* a baseline: the chunked op under the same policy over all ``prefill + tokens`` tokens, at the decoded tokens.

An FP32 policy without output stores (``round_outputs=False``) decodes without the step's three lp stores; its
prefill and chunked baseline keep them (the whole op needs them in FP32: stage 2 reads stage 1's lp outputs).

Recorded per token: the rel RMS of the output against FP64 (decode and chunked), and, at :func:`checkpoints`, the
rel RMS of the carried SSM state and k. :func:`write_report` writes ``decode_drift.json``, the plot
(``plots.plot_decode_drift``) and a README (``scripts/measure_decode_drift.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Mapping, Optional

import torch

from .. import presets, provenance
from ..metrics import rel_rms
from ..ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs
from ..ops.mamba3_mimo.decode import mamba3_mimo_step
from ..ops.mamba3_mimo.decode_cases import one_token, token_range
from ..ops.mamba3_mimo.step import DecodeState, mamba3_mimo_step_fp64
from ..policy import FP32_LEVEL_SM90

#: The policies of the default run: label -> policy (a preset name or a ``RoundingPolicy``).
DEFAULT_POLICIES = {"fp32": "fp32", "upstream_sm90": "upstream_sm90",
                    "upstream_sm90 + FP32-level models": presets.get("upstream_sm90").replace(**FP32_LEVEL_SM90),
                    "upstream_sm90 without output stores": presets.get("upstream_sm90").replace(round_outputs=False)}


def default_spec(prefill: int, tokens: int, seed: int = 2101) -> OpCaseSpec:
    """A realistic head shape (N = 128, P = 64, R = 4, H = 4 heads sharing one group, C = 64, bf16, Z and D on,
    the reduced output) over ``prefill + tokens`` tokens."""
    return OpCaseSpec(batch=1, seqlen=prefill + tokens, heads=4, groups=1, state_dim=128, value_dim=64, rank=4,
                      chunk_size=64, seed=seed)


def checkpoints(tokens: int) -> List[int]:
    """Decode tokens (0-based) at which the state is compared: 0, then powers of two, and the last."""
    return sorted({0, tokens - 1} | {2 ** i - 1 for i in range(1, int(math.log2(max(tokens, 1))) + 1)})


def _prefill(raw: dict, prefill: int, policy) -> DecodeState:
    from ..ops.mamba3_mimo.autograd import mamba3_mimo

    out = mamba3_mimo(*token_range(raw, 0, prefill), chunk_size=raw["chunk_size"],
                      rotary_dim_divisor=raw["rotary_dim_divisor"], policy=policy, return_state=True)
    return DecodeState(*out[1:])


def _angle_distance(angle: torch.Tensor, truth: torch.Tensor) -> float:
    """The rel RMS of an angle state against the FP64 one, both taken mod 2π (the policy step keeps it unreduced)."""
    two_pi = 2 * math.pi
    diff = torch.remainder(angle.double() - truth + math.pi, two_pi) - math.pi
    return (diff.pow(2).mean().sqrt() / torch.remainder(truth, two_pi).pow(2).mean().sqrt()).item()


def run(spec: OpCaseSpec, prefill: int, policies: Optional[Mapping[str, object]] = None, chunked: bool = True,
        progress: bool = True, command: Optional[str] = None) -> dict:
    """The study on one case (module docstring): per policy label, ``out`` (decode, per token), ``chunked`` (the
    chunked op, per token; empty without ``chunked``: it costs a whole-op run over every token), ``state``
    {checkpoint: {ssm, k, angle}} rel RMS against FP64 (the angle's taken mod 2π); ``provenance``: the commit and
    tree the run started from (``command``: the command line it records)."""
    from tqdm.auto import tqdm

    from ..ops.mamba3_mimo.autograd import mamba3_mimo

    policies = DEFAULT_POLICIES if policies is None else policies
    recorded = provenance.collect(command=command)  # the commit and tree the run starts from
    raw = make_op_inputs(spec)
    tokens = spec.seqlen - prefill
    if not 0 < prefill < spec.seqlen:
        raise ValueError(f"prefill must be in 1 .. seqlen - 1 = {spec.seqlen - 1}, got {prefill}")
    marks = set(checkpoints(tokens))
    truth_state = _prefill(raw, prefill, "fp64")
    truth_out, truth_states = [], {}
    for t in tqdm(range(tokens), desc="fp64 decode", disable=not progress):
        out, truth_state = mamba3_mimo_step_fp64(*one_token(raw, prefill + t), truth_state)
        truth_out.append(out)
        if t in marks:
            truth_states[t] = truth_state
    results = {}
    for label, policy in policies.items():
        policy = presets.resolve(policy)
        # the op in FP32 needs its stores (the fp64 preset has none and needs none)
        unstored = not policy.round_outputs and policy.math_torch_dtype == torch.float32
        op_policy = policy.replace(round_outputs=True) if unstored else policy
        state = _prefill(raw, prefill, op_policy)
        whole = None if not chunked else mamba3_mimo(
            *token_range(raw, 0, spec.seqlen), chunk_size=raw["chunk_size"],
            rotary_dim_divisor=raw["rotary_dim_divisor"], policy=op_policy)[:, prefill:]
        record = {"out": [], "chunked": [], "state": {}}
        for t in tqdm(range(tokens), desc=label, disable=not progress):
            out, state = mamba3_mimo_step(*one_token(raw, prefill + t), state, policy=policy)
            record["out"].append(rel_rms(out, truth_out[t]))
            if whole is not None:
                record["chunked"].append(rel_rms(whole[:, t], truth_out[t]))
            if t in marks:
                want = truth_states[t]
                record["state"][t] = {"ssm": rel_rms(state.ssm, want.ssm), "k": rel_rms(state.k, want.k),
                                      "angle": _angle_distance(state.angle, want.angle)}
        results[label] = record
    return {"provenance": recorded, "spec": spec.case_id, "prefill": prefill, "tokens": tokens,
            "policies": {label: presets.resolve(p).to_dict() for label, p in policies.items()}, "results": results}


def _window_mean(values: List[float], first: bool) -> float:
    n = max(1, len(values) // 10)
    part = values[:n] if first else values[-n:]
    return sum(part) / len(part)


def reading(study: dict) -> Dict[str, Dict[str, float]]:
    """Per policy: the decode's and the chunked op's mean rel RMS over the first and the last tenth of the decoded
    tokens, and the state's rel RMS at the first and last checkpoints."""
    rows = {}
    for label, record in study["results"].items():
        marks = sorted(record["state"], key=int)
        rows[label] = {"decode_first": _window_mean(record["out"], True),
                       "decode_last": _window_mean(record["out"], False),
                       "chunked_first": _window_mean(record["chunked"], True) if record["chunked"] else math.nan,
                       "chunked_last": _window_mean(record["chunked"], False) if record["chunked"] else math.nan,
                       "ssm_first": record["state"][marks[0]]["ssm"], "ssm_last": record["state"][marks[-1]]["ssm"],
                       "k_last": record["state"][marks[-1]]["k"], "angle_first": record["state"][marks[0]]["angle"],
                       "angle_last": record["state"][marks[-1]]["angle"]}
    return rows


def write_report(study: dict, out_dir, command: str = "", smoke: bool = False) -> Path:
    """``decode_drift.json``, ``decode_drift.png`` and ``README.md`` into ``out_dir``; the header is the provenance
    the run recorded (else collected now, with ``command``); ``smoke``: marked as a smoke run."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    compact = dict(study, results={label: dict(record, **{key: [float(f"{v:.4g}") for v in record[key]]
                                                          for key in ("out", "chunked")})
                                   for label, record in study["results"].items()})  # 4 digits per token
    (out_dir / "decode_drift.json").write_text(json.dumps(compact, default=str) + "\n")
    from ..plots import plot_decode_drift, save_figure

    save_figure(plot_decode_drift(study), out_dir / "decode_drift.png")
    header = provenance.markdown_header(study.get("provenance") or provenance.collect(command=command))
    if smoke:
        header += " **Smoke run (a small case): not the report's figures.**"
    lines = [f"# Decode drift: {study['spec']}", "", header, "",
             f"A prefill of {study['prefill']} tokens, then {study['tokens']} decode steps under each policy, against "
             "FP64 (`mimo_numerics.studies.decode_drift`). *chunked*: the chunked op under the same policy over every "
             "token, at the same tokens. Means over the first and last tenth of the decoded tokens.", "",
             "| policy | decode, first | decode, last | chunked, first | chunked, last | state, first | state, last |"
             " k, last | angle, first | angle, last |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, row in reading(study).items():
        cells = [row[k] for k in ("decode_first", "decode_last", "chunked_first", "chunked_last", "ssm_first",
                                  "ssm_last", "k_last", "angle_first", "angle_last")]
        lines.append(f"| {label} | " + " | ".join("-" if math.isnan(v) else f"{v:.2e}" for v in cells) + " |")
    lines += ["", "![decode drift](decode_drift.png)", ""]
    (out_dir / "README.md").write_text("\n".join(lines))
    return out_dir / "README.md"
