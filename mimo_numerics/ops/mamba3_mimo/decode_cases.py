"""Decode runs in upstream's layouts: the cases of the decode step's golden data and the two ways to run them.

Upstream decodes a token with two kernels (``Mamba3.step`` of mamba-ssm 2.3.2.post1): the rotary step
``apply_rotary_qk_inference_fwd(q, k, angle_state, angle_proj, dt, bias_q, bias_k, inplace, conjugate,
rotate_pairwise)`` and the state update ``mamba3_step_fn(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj,
outproj, state_out, out, z, zproj, tile_D, num_warps)``. :func:`run_kernel_chain` runs a case's tokens through any
such pair, fed back as ``Mamba3.step`` feeds them (the new angle state, the new SSM state, the rotated k as the next
``Bstate``, x as the next ``Xstate``): upstream's kernels on a GPU (``golden/make_golden_decode.py``) or the compat
layer's (``mimo_numerics.compat``, any device). :func:`run_policy_chain` runs the same tokens through the package's
step in the op's layouts (:func:`.decode.mamba3_mimo_step`); the two agree bit for bit under one policy
(``tests/test_compat_step.py``), so the policy step is what the golden data gates.

A case's inputs (:func:`make_step_inputs`, drawn with the machine-independent ``exact_random`` on the CPU) are the
op's, token by token, in the op's convention (a raw ``Trap``):

* ``Q``, ``K`` ``[T, B, R, G, N]``, ``V``, ``Z`` ``[T, B, H, P]`` and ``Trap`` ``[T, B, H]`` in the lp dtype;
* ``A``, ``DT`` ``[T, B, H]``, ``Angles`` ``[T, B, H, K]``, ``Q_bias``, ``K_bias`` ``[H, R, N]``, ``MIMO_V``,
  ``MIMO_Z``, ``MIMO_Out`` ``[H, R, P]`` and ``D`` ``[H]`` in float32;
* the entering ``state``: ``angle [B, H, K]`` and ``ssm [B, H, P, N]`` in float32, ``k [B, R, H, N]`` and
  ``v [B, H, P]`` in lp;
* ``ADT = A·DT``, the product upstream's kernel forms in FP32 (exactly rounded: the same bits everywhere).

The kernel chain passes upstream's kernel the gate ``trap = σ(Trap)`` formed by torch in float32 on the run's
device, token by token, as the policy step forms it (``Mamba3.step`` forms it in the model's dtype, which the op's
convention does not model: ``docs/compat.md``).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch

from ... import exact_random, presets
from .decode import mamba3_mimo_step
from .step import DecodeState

#: name -> fields: B, H, G, N, P, R, K (angles), dtype, has_z, has_outproj, init ("random" | "zeros"), steps, seed.
#: The CuTe kernel's limits: N in 32/64/128, P a multiple of its tile_D = 64 (``Mamba3.step``'s launch).
STEP_CASES: Dict[str, dict] = {
    "step_B2_H4_G1_N128_P64_R4_K32_bf16": dict(B=2, H=4, G=1, N=128, P=64, R=4, K=32, dtype="bfloat16", has_z=True,
                                             has_outproj=True, init="random", steps=16, seed=601),
    "step_B1_H2_G2_N64_P128_R2_K16_fp16": dict(B=1, H=2, G=2, N=64, P=128, R=2, K=16, dtype="float16", has_z=True,
                                             has_outproj=True, init="random", steps=16, seed=602),
    "step_B2_H4_G1_N64_P64_R4_K16_bf16_per_rank_from_zero": dict(B=2, H=4, G=1, N=64, P=64, R=4, K=16,
                                                               dtype="bfloat16", has_z=False, has_outproj=False,
                                                               init="zeros", steps=8, seed=603),
    "step_chain256_B1_H4_G1_N128_P64_R4_K32_bf16": dict(B=1, H=4, G=1, N=128, P=64, R=4, K=32, dtype="bfloat16",
                                                      has_z=True, has_outproj=True, init="random", steps=256,
                                                      seed=604),
}

#: The fields that select a compiled specialization of upstream's CuTe kernel (``build_cute_step.py``).
CUTE_SPEC_FIELDS = ("N", "P", "R", "dtype", "has_z", "has_outproj")


def cute_function_name(fields: dict) -> str:
    """The name of the ahead-of-time compiled kernel for a case's specialization, e.g.
    ``mamba3_step_N128_P64_R4_bfloat16_z_outproj``."""
    return (f"mamba3_step_N{fields['N']}_P{fields['P']}_R{fields['R']}_{fields['dtype']}_"
            f"{'z' if fields['has_z'] else 'noz'}_{'outproj' if fields['has_outproj'] else 'per_rank'}")


def cute_specializations() -> list:
    """The distinct specializations of :data:`STEP_CASES` (dicts of :data:`CUTE_SPEC_FIELDS`), in case order."""
    seen = {}
    for fields in STEP_CASES.values():
        seen.setdefault(cute_function_name(fields), {k: fields[k] for k in CUTE_SPEC_FIELDS})
    return list(seen.values())


def kept_state_steps(steps: int):
    """``0, 1, 3, 7, ...`` (after 1, 2, 4, 8, ... tokens) and the last token: a run keeps its SSM state there."""
    kept = {2 ** i - 1 for i in range(int(math.log2(steps)) + 1)} | {steps - 1}
    return sorted(kept)


def make_step_inputs(fields: dict) -> dict:
    """A case's inputs on the CPU (module docstring), drawn from ``fields["seed"]``."""
    gen = torch.Generator().manual_seed(fields["seed"])
    T, B, H, G, N, P, R, K = (fields[k] for k in ("steps", "B", "H", "G", "N", "P", "R", "K"))
    lp, f32 = getattr(torch, fields["dtype"]), torch.float32

    def normal(*shape, scale=1.0, dtype=f32):
        return (exact_random.normal(shape, gen) * scale).to(dtype)

    def uniform(*shape, low=0.0, high=1.0):
        return (low + (high - low) * exact_random.uniform(shape, gen)).to(f32)

    x = {"Q": normal(T, B, R, G, N, dtype=lp), "K": normal(T, B, R, G, N, dtype=lp), "V": normal(T, B, H, P, dtype=lp),
         "A": -uniform(T, B, H, low=0.5, high=1.5), "DT": uniform(T, B, H, low=0.01, high=0.1),
         "Trap": normal(T, B, H, dtype=lp), "Angles": normal(T, B, H, K),
         "Z": normal(T, B, H, P, dtype=lp) if fields["has_z"] else None,
         "Q_bias": normal(H, R, N, scale=0.125), "K_bias": normal(H, R, N, scale=0.125),
         "MIMO_V": normal(H, R, P, scale=0.5), "MIMO_Z": normal(H, R, P, scale=0.5) if fields["has_z"] else None,
         "MIMO_Out": normal(H, R, P, scale=0.5) if fields["has_outproj"] else None, "D": normal(H)}
    x["ADT"] = x["A"] * x["DT"]
    if fields["init"] == "random":
        x["state"] = {"angle": uniform(B, H, K, high=2 * math.pi), "ssm": normal(B, H, P, N, scale=0.5),
                      "k": normal(B, R, H, N, dtype=lp), "v": normal(B, H, P, dtype=lp)}
    else:
        x["state"] = {"angle": torch.zeros(B, H, K), "ssm": torch.zeros(B, H, P, N),
                      "k": torch.zeros(B, R, H, N, dtype=lp), "v": torch.zeros(B, H, P, dtype=lp)}
    return x


def token_range(raw: dict, lo: int, hi: int) -> list:
    """The op's 14 inputs (``OP_INPUT_NAMES`` order) of tokens ``lo .. hi - 1`` of ``raw`` (``cases.make_op_inputs``):
    every input with a time axis (``varlen.TIME_AXES``) cut along it, the parameters as they are."""
    from .cases import OP_INPUT_NAMES
    from .varlen import TIME_AXES

    return [raw[n].narrow(TIME_AXES[n], lo, hi - lo) if raw[n] is not None and n in TIME_AXES else raw[n]
            for n in OP_INPUT_NAMES]


def one_token(raw: dict, t: int) -> list:
    """The op's 14 inputs of token ``t``, its time axis dropped: one decode step's arguments
    (:func:`.decode.mamba3_mimo_step`, :func:`.step.mamba3_mimo_step_fp64`)."""
    from .cases import OP_INPUT_NAMES
    from .varlen import TIME_AXES

    return [raw[n].select(TIME_AXES[n], t) if raw[n] is not None and n in TIME_AXES else raw[n]
            for n in OP_INPUT_NAMES]


def _outputs() -> dict:
    return {"out": [], "k_rot": [], "angle": [], "ssm": {}}


def _stacked(outs: dict) -> dict:
    return {key: (value if key == "ssm" else torch.stack(value)) for key, value in outs.items()}


def run_kernel_chain(rotary_fn: Callable, step_fn: Callable, fields: dict, inputs: dict, device="cpu",
                     step_kwargs: Optional[dict] = None, gate_fn: Callable = torch.sigmoid) -> dict:
    """The case's tokens through a rotary step and a state update with upstream's signatures, fed back as
    ``Mamba3.step`` feeds them, on ``device``; everything returned on the CPU. ``gate_fn`` forms the gate from the
    float32 ``Trap`` as ``Mamba3.step`` does (default ``torch.sigmoid`` on ``device``; a CPU run that stands in for
    the GPU passes the policy's model of it, ``SpecialFunctions.torch_sigmoid``).

    Returns:
        dict: ``out`` ``[T, B, H, P]`` (``[T, B, R, H, P]`` without ``MIMO_Out``; lp, the store), ``k_rot``
        ``[T, B, R, H, N]`` (the rotated k, stored in lp: the next token's ``Bstate``), ``angle`` ``[T, B, H, K]``
        (the angle state after each token), ``ssm`` {token: ``[B, H, P, N]``} at :func:`kept_state_steps`,
        ``gate`` ``[T, B, H]`` (the float32 ``σ(Trap)`` passed to the kernel, formed on ``device``). The rotated q is
        not kept: the rotary kernel has golden data of its own.
    """
    dev = torch.device(device)
    x = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items() if k != "state"}
    s = {k: v.to(dev) for k, v in inputs["state"].items()}
    H, G, R, P = fields["H"], fields["G"], fields["R"], fields["P"]
    heads = torch.arange(H, device=dev) // (H // G)

    def token(name, t):  # a fresh tensor, as Mamba3.step's are: a slice of [T, ...] may start off 16-byte alignment
        return None if x[name] is None else x[name][t].clone(memory_format=torch.contiguous_format)

    def per_rank(name):
        return None if x[name] is None else x[name].transpose(0, 1).contiguous()  # [H, R, .] -> [R, H, .]

    bias_q, bias_k, proj_v, proj_z, proj_o = (per_rank(n) for n in ("Q_bias", "K_bias", "MIMO_V", "MIMO_Z",
                                                                     "MIMO_Out"))
    angle, ssm, k_state, v_state = s["angle"], s["ssm"], s["k"], s["v"]
    kept, outs, gates = set(kept_state_steps(fields["steps"])), _outputs(), []
    for t in range(fields["steps"]):
        q = x["Q"][t][:, :, heads].contiguous()  # [B, R, H, N]
        k = x["K"][t][:, :, heads].contiguous()
        q_rot, k_rot, angle = rotary_fn(q, k, angle, token("Angles", t), token("DT", t),
                                        bias_q=bias_q, bias_k=bias_k, inplace=False, conjugate=False,
                                        rotate_pairwise=False)
        v = token("V", t)
        shape = (v.shape[0], H, P) if proj_o is not None else (v.shape[0], R, H, P)
        out, ssm_out = torch.empty(shape, dtype=v.dtype, device=dev), torch.empty_like(ssm)
        gates.append(gate_fn(x["Trap"][t].to(torch.float32)))
        step_fn(ssm, k_state, v_state, token("A", t), k_rot, q_rot, x["D"], v, token("DT", t),
                gates[-1], proj_v, proj_o, ssm_out, out, token("Z", t), proj_z,
                **(step_kwargs or {}))
        ssm, k_state, v_state = ssm_out, k_rot, v
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        for key, value in (("out", out), ("k_rot", k_rot), ("angle", angle)):
            outs[key].append(value.cpu())
        if t in kept:
            outs["ssm"][t] = ssm.cpu()
    return dict(_stacked(outs), gate=torch.stack(gates).cpu())


def run_policy_chain(fields: dict, inputs: dict, policy="upstream_sm90") -> dict:
    """The case's tokens through the package's step in the op's layouts (:func:`.decode.mamba3_mimo_step`) under
    ``policy``, on the CPU; the same outputs as :func:`run_kernel_chain` (the angle state not reduced mod 2π, as
    upstream's step keeps it)."""
    policy = presets.resolve(policy)
    x, s = inputs, inputs["state"]
    state = DecodeState(s["angle"], s["ssm"], s["k"], s["v"])
    kept, outs = set(kept_state_steps(fields["steps"])), _outputs()
    for t in range(fields["steps"]):
        out, state = mamba3_mimo_step(x["Q"][t], x["K"][t], x["V"][t], x["ADT"][t], x["DT"][t], x["Trap"][t],
                                      x["Q_bias"], x["K_bias"], x["MIMO_V"], x["MIMO_Z"], x["MIMO_Out"],
                                      x["Angles"][t], x["D"], None if x["Z"] is None else x["Z"][t], state,
                                      policy=policy)
        for key, value in (("out", out), ("k_rot", state.k), ("angle", state.angle)):
            outs[key].append(value)
        if t in kept:
            outs["ssm"][t] = state.ssm
    return _stacked(outs)


def run_rotary_case(case: dict, policy) -> dict:
    """A stored case of upstream's rotary kernel (``golden/make_golden_decode.py --part rotary``: ``fields``,
    ``inputs``) rerun on the CPU by :func:`.decode.rotary_step` under ``policy``, its angle state fed back as upstream
    fed it: ``q_out``, ``k_out`` ``[T, B, R, H, D]`` and ``angle_state`` ``[T, B, H, K]`` (after each step)."""
    from .decode import rotary_step

    fields, x = case["fields"], case["inputs"]
    state, outs = x["angle_state"], {"q_out": [], "k_out": [], "angle_state": []}
    for t in range(fields["steps"]):
        q, k, state = rotary_step(x["q"][t], x["k"][t], state, x["angle_proj"][t], x["dt"][t], x["bias_q"],
                                  x["bias_k"], conjugate=fields["conjugate"], rotate_pairwise=fields["pairwise"],
                                  policy=policy)
        for key, value in zip(outs, (q, k, state)):
            outs[key].append(value)
    return {key: torch.stack(values) for key, values in outs.items()}


def chain_distances(got: dict, want: dict) -> Dict[str, float]:
    """Relative RMS distances of one chain's outputs from another's (:func:`run_kernel_chain`'s layout): ``out``,
    ``k_rot`` and ``angle`` over every token, ``ssm`` the worst over the kept tokens."""
    from ...metrics import rel_rms

    distances = {key: rel_rms(got[key], want[key]) for key in ("out", "k_rot", "angle")}
    distances["ssm"] = max(rel_rms(got["ssm"][t], want["ssm"][t]) for t in want["ssm"])
    return distances


def golden_distances(case: dict, policy) -> Dict[str, float]:
    """The policy step's distances from a golden case's upstream run (``golden/make_golden_decode.py --part step``:
    ``fields``, ``inputs``, ``upstream``), re-run on the CPU from the stored inputs."""
    return chain_distances(run_policy_chain(case["fields"], case["inputs"], policy), case["upstream"])


def step_policy(fields: dict, name: str = "upstream_sm90"):
    """Preset ``name`` for a case's lp dtype: ``upstream_sm90`` means ``upstream_sm90_fp16`` for an fp16 case, any
    other preset gets ``lp_dtype="float16"``.

    Raises:
        ValueError: ``fields["dtype"]`` is not ``"bfloat16"`` or ``"float16"``.
    """
    if fields.get("dtype") not in ("bfloat16", "float16"):
        raise ValueError(f"fields['dtype'] must be 'bfloat16' or 'float16', got {fields.get('dtype')!r}")
    if fields["dtype"] == "float16":
        if name == "upstream_sm90":
            return presets.get("upstream_sm90_fp16")
        return presets.get(name).replace(lp_dtype="float16")
    return presets.get(name)


#: The outputs the step's lp stores round (``out`` and the rotated k); the angle and the SSM state are FP32.
STORED_OUTPUTS = ("out", "k_rot")


def step_golden_verdict(case: dict) -> dict:
    """The decode step's golden gate on one case (``fields``, ``inputs``, ``upstream``; issue 25, acceptance 2).

    The whole op's gates, adapted to the step: under ``upstream_sm90`` (:func:`step_policy`) every output is within
    ``whole_op_golden_sm90_rel_rms`` of upstream's, and the outputs the lp stores round (:data:`STORED_OUTPUTS`) are
    at least ``whole_op_golden_fp32_over_sm90_ratio_min`` times farther without those stores (``round_outputs=
    False``). The whole op compares with the ``fp32`` preset instead; in the step that says nothing: upstream's two
    step kernels compute in FP32 and round only at their lp stores, which ``fp32`` keeps too (``docs/compat.md``).

    Returns:
        dict: ``policy`` and ``unrounded`` (:func:`golden_distances` of each) and ``failures`` (one line per failed
        check, empty when the case passes).

    Raises:
        ValueError: ``case`` lacks ``fields``, ``inputs`` or ``upstream``, or its upstream run lacks an output.
    """
    from ... import tolerances

    missing = [key for key in ("fields", "inputs", "upstream") if key not in case]
    if missing:
        raise ValueError("case must have 'fields', 'inputs' and 'upstream' (golden/make_golden_decode.py --part "
                         f"step); missing {missing}")
    lacking = [key for key in ("out", "k_rot", "angle", "ssm") if key not in case["upstream"]]
    if lacking:
        raise ValueError(f"case['upstream'] must hold out, k_rot, angle and ssm (run_kernel_chain's outputs); "
                         f"missing {lacking}")
    policy = step_policy(case["fields"])
    near = golden_distances(case, policy)
    far = golden_distances(case, policy.replace(round_outputs=False))
    bound = tolerances.get("whole_op_golden_sm90_rel_rms")
    ratio = tolerances.get("whole_op_golden_fp32_over_sm90_ratio_min")
    failures = [f"{key}: {value:.3g} from upstream under {policy.name}, over the gate {bound:g}"
                for key, value in near.items() if not value <= bound]
    failures += [f"{key}: without the lp stores {far[key]:.3g}, not {ratio:g}x the policy's {near[key]:.3g}"
                 for key in STORED_OUTPUTS if not (far[key] > 0 and far[key] >= ratio * near[key])]
    return {"policy": near, "unrounded": far, "failures": failures}
