"""Generated inputs are the same bits on every machine: pinned digests of every formula and dtype.

The digests were measured once (2026-12-01, torch 2.13.0+cpu) and are identical under ``ATEN_CPU_CAPABILITY``
``default``, ``avx2`` and ``avx512`` and with 1 or 2 threads; ``test_digests_do_not_depend_on_the_cpu_kernels``
re-checks the scalar kernels in a subprocess. A mismatch names the tensors that differ.
"""

import json
import os
import subprocess
import sys

import pytest

from mimo_numerics.cases import CaseSpec, tensor_digests
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs

SPECS = (
    CaseSpec(formula="seed", seqlen=20, heads=2, groups=1, state_dim=16, value_dim=16, rank=2, chunk_size=8,
             has_z=True, has_d=True),
    CaseSpec(formula="seed", seqlen=35, heads=2, groups=2, state_dim=32, value_dim=16, rank=4, chunk_size=16,
             reduce_o=False, has_z=True, dtype="float16"),
    CaseSpec(formula="realistic", batch=2, seqlen=40, heads=2, state_dim=32, value_dim=32, rank=2, chunk_size=8,
             reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2),
    # the shape of the stage-1 sweep case whose torch-softplus inputs differed between AVX2 and AVX-512 machines
    CaseSpec(formula="realistic", seqlen=1000, heads=2, state_dim=128, value_dim=128, rank=4, chunk_size=16,
             has_z=True, has_d=True, dtype="float16"),
)

#: First 16 hex digits of ``tensor_digests(make_inputs(spec))`` per case id and tensor (None: absent).
PINNED = {
    "seed_B1_S20_H2_G1_N16_P16_R2_C8_roZD_bf16_s123": {
        "dout": "5902d2ea323f8a36", "q": "5adfdd1e91085995", "k": "091041536685d2a7", "v": "2f255c69e2bf2180",
        "q_bias": "160d39e3d265d39a", "k_bias": "5a81d0809e8d0af4", "mimo_v": "82b670d3a7496809",
        "mimo_o": "4c47b00bb64a3bc0", "z": "19d590f70a27660d", "mimo_z": "227b85e4e5572812",
        "angles": "1f40bbc19213b78b", "da_cs": "0f516925d15caa8f", "da_cs_rev": "12635b61a6e5ecfe",
        "dt": "f81cdc5e19f4eace", "trap": "ada236f984bc7759", "d": "bf454895f0aeed59", "segsum": "d6e5e4f634ccf157",
    },
    "seed_B1_S35_H2_G2_N32_P16_R4_C16_foZ-_fp16_s123": {
        "dout": "15a122b2dce35410", "q": "f22a507cb621a62b", "k": "4438da9aa4da35d1", "v": "f5beef7cc7c63a82",
        "q_bias": "b627a0068af803f8", "k_bias": "aed411f34656cb5a", "mimo_v": "18e0eb6035401171", "mimo_o": None,
        "z": "e0084ba6a64315ad", "mimo_z": "954bada6d46eec41", "angles": "8efd8f12b17da44a",
        "da_cs": "c16014909faa96b4", "da_cs_rev": "276a3bb62d5e6efa", "dt": "7bffd3e99de22881",
        "trap": "0ea005542b49b436", "d": None, "segsum": "fcd9dd61ff93f77f",
    },
    "realistic_B2_S40_H2_G1_N32_P32_R2_C8_foZD_bf16_s123_rd2": {
        "dout": "3d1ea15dd8121716", "q": "118dfb6133dd9caf", "k": "d9792f5617958aff", "v": "1147065514746289",
        "q_bias": "08c4c06b0eb34d32", "k_bias": "ca115084db9c067c", "mimo_v": "063e8561cc109307", "mimo_o": None,
        "z": "87622cb562e1aa6f", "mimo_z": "4d0b90bced434bda", "angles": "9401d483c4ad17b9",
        "da_cs": "46c9ca847a6f6a45", "da_cs_rev": "4c83adea091d137a", "dt": "af27a4a9211f9c8e",
        "trap": "de725f5f81f71397", "d": "ae41400a2a66b4f6", "segsum": "c0bf96368ac15cc8",
    },
    "realistic_B1_S1000_H2_G1_N128_P128_R4_C16_roZD_fp16_s123": {
        "dout": "52db7441983e1e82", "q": "12cfb6e9f369916c", "k": "bfb88d43db1cfd85", "v": "725a7bf42ea17092",
        "q_bias": "a158efc34dc2039a", "k_bias": "d8176d8736e1cb45", "mimo_v": "6283d3d6e8b7e6ed",
        "mimo_o": "bf137d2501c9ac97", "z": "2a2c569d988b7c22", "mimo_z": "fa9f3a1757a1f942",
        "angles": "ee693c7013f09fca", "da_cs": "3c58728f06d3c3ae", "da_cs_rev": "dcb3227eeb10ed63",
        "dt": "f43ac1d2d057d70c", "trap": "528d7c59f22125d8", "d": "a074c954f8f8695a", "segsum": "96bb4e833f1eba97",
    },
}


def _short(digests):
    return {name: (None if value is None else value[:16]) for name, value in digests.items()}


def _differing(got, want):
    return sorted(name for name in set(got) | set(want) if got.get(name, "missing") != want.get(name, "missing"))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.case_id)
def test_generated_inputs_match_pinned_digests(spec):
    got = _short(tensor_digests(make_inputs(spec)))
    differing = _differing(got, PINNED[spec.case_id])
    assert not differing, f"{spec.case_id}: generated tensors differ from the pinned digests: {differing}"


def test_every_formula_and_dtype_is_pinned():
    assert {(s.formula, s.dtype) for s in SPECS} == {(f, d) for f in ("seed", "realistic")
                                                   for d in ("bfloat16", "float16")}


def test_digests_do_not_depend_on_the_cpu_kernels():
    # torch's scalar kernels (no SIMD) and one thread: a machine with other vector units gives these bits too
    code = ("import json, torch; torch.set_num_threads(1); from tests.test_case_digests import SPECS, _short; "
            "from mimo_numerics.cases import make_inputs, tensor_digests; "
            "print(json.dumps({s.case_id: _short(tensor_digests(make_inputs(s))) for s in SPECS}))")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    for case_id, digests in got.items():
        assert not _differing(digests, PINNED[case_id]), (case_id, _differing(digests, PINNED[case_id]))


def test_mismatch_names_the_tensor():
    spec = SPECS[0]
    inputs = make_inputs(spec)
    inputs["segsum"] = inputs["segsum"].clone()
    inputs["segsum"].view(-1)[0] += 1.0
    assert _differing(_short(tensor_digests(inputs)), PINNED[spec.case_id]) == ["segsum"]
