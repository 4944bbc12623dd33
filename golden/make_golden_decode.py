#!/usr/bin/env python
"""Run upstream's decode step on a CUDA GPU and write golden data: ``--part rotary`` its first kernel alone (the
Triton ``apply_rotary_qk_inference_fwd``), ``--part step`` both kernels token by token as ``Mamba3.step`` chains them.

``--part step`` runs upstream's second kernel, the CuTe ``mamba3_step_fn``, from the shared libraries that
``golden/build_cute_step.py`` compiled ahead of time from upstream's source on a machine without a GPU (the CuTe DSL's
compiler is a 75 MB wheel, more than a device call carries; the compiled kernels are 100 KB each and need only
``apache-tvm-ffi``). Its cases are ``mimo_numerics.ops.mamba3_mimo.decode_cases.STEP_CASES``; the inputs are drawn
there, the kernels are chained by ``decode_cases.run_kernel_chain`` (the same function the CPU tests run with the
compat layer's kernels).

Rotary cases (:data:`CASES`): inputs drawn with the machine-independent generator (``mimo_numerics.exact_random``) in
upstream's layouts: q, k ``[B, R, H, D]`` in the lp dtype, ``angle_state`` and ``angle_proj`` ``[B, H, K]`` and
``dt [B, H]`` in float32, biases ``[R, H, D]`` in float32. ``angle_scale`` sets the size of the entering angle state
(``U[0, 1) * angle_scale``): upstream's step keeps the angle sum unreduced, so after a long decode it is large.
A ``chain`` case feeds the returned angle state back ``steps`` times (a decode of that many tokens, new q, k,
angles and dt each step) and keeps every step's outputs. Every case runs twice and must give identical bits.

Usage (on the GPU machine; the rotary part needs only Triton and the mamba-ssm source, the step part also
``apache-tvm-ffi`` and the folder ``build_cute_step.py`` wrote)::

    python golden/make_golden_decode.py --out out/upstream_h200_decode_rotary_cases.pt
    python golden/make_golden_decode.py --part step --cute-lib .cute_step --out out/upstream_h200_decode_step_cases.pt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch

from mimo_numerics import envinfo, exact_random
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import decode_cases
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


def load_cute_step(lib_dir):
    """Upstream's CuTe kernel from the ahead-of-time modules in ``lib_dir`` (``build_cute_step.py``): a function with
    ``mamba3_step_fn``'s signature that picks the module of its arguments' specialization, and the manifest."""
    import tvm_ffi

    lib_dir = Path(lib_dir)
    manifest = json.loads((lib_dir / "manifest.json").read_text())
    functions, modules = {}, []
    for entry in manifest["modules"]:
        path = lib_dir / entry["file"]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != entry["sha256"]:
            raise SystemExit(f"{path}: sha256 {digest[:16]}... is not the manifest's {entry['sha256'][:16]}...")
        module = tvm_ffi.load_module(str(path))
        modules.append(module)  # kept alive with the functions
        functions[entry["function"]] = getattr(module, entry["function"])
    launch = manifest["launch"]

    def mamba3_step_fn(state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj, outproj=None, state_out=None,
                       out=None, z=None, zproj=None, tile_D=64, num_warps=2):
        if (tile_D, num_warps) != (launch["tile_D"], launch["num_warps"]):
            raise ValueError(f"compiled for tile_D={launch['tile_D']}, num_warps={launch['num_warps']}")
        spec = dict(N=state.shape[3], P=state.shape[2], R=Bstate.shape[1], dtype=str(x.dtype).split(".")[-1],
                    has_z=z is not None, has_outproj=outproj is not None)
        name = decode_cases.cute_function_name(spec)
        if name not in functions:
            raise ValueError(f"no compiled module {name} in {lib_dir} (build_cute_step.py compiles STEP_CASES')")
        functions[name](state, Bstate, Xstate, A, B, C, D, x, dt, trap, xproj.contiguous(), outproj,
                        state if state_out is None else state_out, out, z, zproj)

    mamba3_step_fn.modules = modules
    return mamba3_step_fn, manifest


def _check_policies(fields: dict) -> dict:
    """The policies the log compares with upstream's run: the preset, with every FP32-level model, without stores."""
    from mimo_numerics import presets
    from mimo_numerics.policy import FP32_LEVEL_SM90

    preset = presets.get("upstream_sm90" if fields["dtype"] == "bfloat16" else "upstream_sm90_fp16")
    return {"preset": preset, "fp32_level": preset.replace(**FP32_LEVEL_SM90),
            "no_stores": preset.replace(round_outputs=False)}


def run_step_part(args, rotary, versions: dict) -> int:
    """Both kernels over :data:`decode_cases.STEP_CASES`, twice each; a line per case with the policy step's
    distances and bit-equal fractions (run here, on the CPU; ``ssm``: the last token's state) as a first check."""
    step_fn, manifest = load_cute_step(args.cute_lib)
    launch = manifest["launch"]
    out, bad = {}, []
    for name, fields in decode_cases.STEP_CASES.items():
        inputs = decode_cases.make_step_inputs(fields)
        start = time.perf_counter()
        runs = [decode_cases.run_kernel_chain(rotary.apply_rotary_qk_inference_fwd, step_fn, fields, inputs,
                                              device="cuda", step_kwargs=launch) for _ in range(2)]
        same = all(torch.equal(runs[0][k], runs[1][k]) for k in ("out", "k_rot", "angle", "gate")) and all(
            torch.equal(runs[0]["ssm"][t], runs[1]["ssm"][t]) for t in runs[0]["ssm"])
        if not same:
            bad.append(name)
        cpu_gate = torch.sigmoid(inputs["Trap"].to(torch.float32))
        report = [f"gate (torch's sigmoid, CUDA vs CPU) {(runs[0]['gate'] == cpu_gate).double().mean().item():.4f} "
                  "equal"]
        for label, policy in _check_policies(fields).items():
            policy_run = decode_cases.run_policy_chain(fields, inputs, policy)
            distance = decode_cases.chain_distances(policy_run, runs[0])
            last = max(runs[0]["ssm"])
            pairs = {k: (policy_run[k], runs[0][k]) for k in ("out", "k_rot", "angle")}
            pairs["ssm"] = (policy_run["ssm"][last], runs[0]["ssm"][last])
            same_bits = {k: (a == b).double().mean().item() for k, (a, b) in pairs.items()}
            report.append(f"{label}: " + ", ".join(f"{k} {v:.2e} ({same_bits[k]:.4f} equal)"
                                                    for k, v in distance.items()))
        out[name] = {"fields": dict(fields), "inputs": inputs, "upstream": runs[0], "repeat_identical": same,
                     "versions": versions, "device_name": envinfo.device_name("cuda"),
                     "cute": {k: manifest[k] for k in ("source", "arch", "launch", "versions")}}
        print(f"{name}: {time.perf_counter() - start:.1f}s, repeat identical: {same}; the policy step vs upstream, "
              + "; ".join(report), file=sys.stderr)
    torch.save(out, args.out)
    print(f"wrote {args.out}: {len(out)} case(s)", file=sys.stderr)
    return 1 if bad else 0


def run_rotary_part(args, module, versions: dict) -> int:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the .pt file to write")
    parser.add_argument("--part", choices=("rotary", "step"), default="rotary",
                        help="the rotary kernel alone (default) or both kernels chained")
    parser.add_argument("--cute-lib", default=".cute_step", help="build_cute_step.py's folder (--part step)")
    parser.add_argument("--upstream-src", default=None, help="the mamba-ssm source (default: as the loader finds it)")
    args = parser.parse_args(argv)
    _loader.check_cuda("cuda")
    module = _loader.load_upstream_files((ROTARY_FILE,), args.upstream_src)[ROTARY_FILE[0]]
    versions = {k: str(v) for k, v in envinfo.versions().items()}
    if args.part == "step":
        return run_step_part(args, module, versions)
    return run_rotary_part(args, module, versions)


if __name__ == "__main__":
    sys.exit(main())
