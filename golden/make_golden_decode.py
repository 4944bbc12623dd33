#!/usr/bin/env python
"""Run upstream's decode rotary step (``apply_rotary_qk_inference_fwd``, a Triton kernel) on a CUDA GPU and write
golden data: the first of the two kernels of upstream's decode step (``Mamba3.step``).

The second kernel, ``mamba3_step_fn``, is written in the CuTe DSL (``nvidia-cutlass-dsl``, ``quack-kernels``): its
wheels are about 76 MB compressed, more than one device call may carry, so it is not run here.

Cases (:data:`CASES`): inputs drawn with the machine-independent generator (``mimo_numerics.exact_random``) in
upstream's layouts: q, k ``[B, R, H, D]`` in the lp dtype, ``angle_state`` and ``angle_proj`` ``[B, H, K]`` and
``dt [B, H]`` in float32, biases ``[R, H, D]`` in float32. ``angle_scale`` sets the size of the entering angle state
(``U[0, 1) * angle_scale``): upstream's step keeps the angle sum unreduced, so after a long decode it is large.
A ``chain`` case feeds the returned angle state back ``steps`` times (a decode of that many tokens, new q, k,
angles and dt each step) and keeps every step's outputs. Every case runs twice and must give identical bits.

Usage (on the GPU machine, after ``. scripts/use_upstream_wheels.sh``; needs only Triton and the mamba-ssm sdist)::

    python golden/make_golden_decode.py --out out/upstream_h200_decode_rotary_cases.pt
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from mimo_numerics import envinfo, exact_random
from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream as _loader

ROTARY_FILE = ("mamba_ssm.ops.triton.mamba3.mamba3_mimo_rotary_step",
               "mamba_ssm/ops/triton/mamba3/mamba3_mimo_rotary_step.py",
               "e117b5da3d2ddfcfa66673a88dfd88a6d688100291d3b6a1b0b3c24c82ef79d6")

#: name -> fields (B, R, H, D, K, dtype, bias, conjugate, pairwise, angle_scale, steps, seed).
CASES = {
    "rot_B2_R4_H4_D64_K16_bf16": dict(B=2, R=4, H=4, D=64, K=16, dtype="bfloat16", bias=True, conjugate=False,
                                      pairwise=False, angle_scale=2 * math.pi, steps=1, seed=401),
    "rot_B1_R2_H8_D128_K32_fp16": dict(B=1, R=2, H=8, D=128, K=32, dtype="float16", bias=True, conjugate=False,
                                       pairwise=False, angle_scale=2 * math.pi, steps=1, seed=402),
    "rot_B2_R4_H2_D64_K32_bf16_pairwise_conj_nobias": dict(B=2, R=4, H=2, D=64, K=32, dtype="bfloat16", bias=False,
                                                           conjugate=True, pairwise=True,
                                                           angle_scale=2 * math.pi, steps=1, seed=403),
    "rot_B2_R4_H4_D64_K16_bf16_large_angle": dict(B=2, R=4, H=4, D=64, K=16, dtype="bfloat16", bias=True,
                                                  conjugate=False, pairwise=False, angle_scale=4096.0, steps=1,
                                                  seed=404),
    "rot_chain256_B1_R4_H4_D64_K16_bf16": dict(B=1, R=4, H=4, D=64, K=16, dtype="bfloat16", bias=True,
                                               conjugate=False, pairwise=False, angle_scale=0.0, steps=256,
                                               seed=405),
}


def make_inputs(fields: dict) -> dict:
    """The inputs of a case on the CPU: ``q, k, angle_proj, dt`` with a leading steps axis ``[T, ...]``, the entering
    ``angle_state``, ``bias_q``, ``bias_k`` (None without bias)."""
    gen = torch.Generator().manual_seed(fields["seed"])
    T, B, R, H, D, K = (fields[k] for k in ("steps", "B", "R", "H", "D", "K"))
    lp = getattr(torch, fields["dtype"])
    inputs = {
        "q": exact_random.normal((T, B, R, H, D), gen).to(lp),
        "k": exact_random.normal((T, B, R, H, D), gen).to(lp),
        "angle_state": (exact_random.uniform((B, H, K), gen) * fields["angle_scale"]).to(torch.float32),
        "angle_proj": exact_random.normal((T, B, H, K), gen).to(torch.float32),
        "dt": (0.05 + 0.1 * exact_random.uniform((T, B, H), gen)).to(torch.float32),
        "bias_q": None, "bias_k": None,
    }
    if fields["bias"]:
        inputs["bias_q"] = (exact_random.normal((R, H, D), gen) / 8).to(torch.float32)
        inputs["bias_k"] = (exact_random.normal((R, H, D), gen) / 8).to(torch.float32)
    return inputs


def run_case(module, fields: dict, inputs: dict) -> dict:
    """Upstream's rotary step over the case's steps: ``q_out``, ``k_out`` ``[T, B, R, H, D]``, ``angle_state``
    ``[T, B, H, K]`` (the state after each step)."""
    dev = torch.device("cuda")
    state = inputs["angle_state"].to(dev)
    bias_q = None if inputs["bias_q"] is None else inputs["bias_q"].to(dev)
    bias_k = None if inputs["bias_k"] is None else inputs["bias_k"].to(dev)
    q_out, k_out, states = [], [], []
    for t in range(fields["steps"]):
        q, k, state = module.apply_rotary_qk_inference_fwd(
            inputs["q"][t].to(dev), inputs["k"][t].to(dev), state, inputs["angle_proj"][t].to(dev),
            inputs["dt"][t].to(dev), bias_q, bias_k, inplace=False, conjugate=fields["conjugate"],
            rotate_pairwise=fields["pairwise"])
        torch.cuda.synchronize()
        q_out.append(q.cpu())
        k_out.append(k.cpu())
        states.append(state.cpu())
    return {"q_out": torch.stack(q_out), "k_out": torch.stack(k_out), "angle_state": torch.stack(states)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the .pt file to write")
    parser.add_argument("--upstream-src", default=None, help="the mamba-ssm source (default: as the loader finds it)")
    args = parser.parse_args(argv)
    _loader.check_cuda("cuda")
    module = _loader.load_upstream_files((ROTARY_FILE,), args.upstream_src)[ROTARY_FILE[0]]
    versions = {k: str(v) for k, v in envinfo.versions().items()}
    out, bad = {}, []
    for name, fields in CASES.items():
        inputs = make_inputs(fields)
        start = time.perf_counter()
        first, second = run_case(module, fields, inputs), run_case(module, fields, inputs)
        same = all(torch.equal(first[k], second[k]) for k in first)
        if not same:
            bad.append(name)
        out[name] = {"fields": dict(fields), "inputs": inputs, "upstream": first, "repeat_identical": same,
                     "versions": versions, "device_name": envinfo.device_name("cuda")}
        print(f"{name}: {time.perf_counter() - start:.1f}s, repeat identical: {same}", file=sys.stderr)
    torch.save(out, args.out)
    print(f"wrote {args.out}: {len(out)} case(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
