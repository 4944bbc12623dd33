"""The stored golden data of the repository (``tests/data/``): the one place that knows its files.

Every file here was made by the real upstream kernels on one NVIDIA H200 (provenance, layout and the formula of the
inputs: ``tests/data/README.md``), except ``inference_counterexamples.pt`` (inputs only, see the README). The
operators' golden loaders (``ops/*/golden.py``), the test support modules, the scripts and the report generators
take the paths, sha256 digests and recorded versions from here; nothing else writes a ``tests/data`` path.

The files are found relative to the package, i.e. in a source checkout (an editable install); a wheel carries no
copy, so :func:`path` raises ``FileNotFoundError`` there and loaders take an explicit path instead.

Usage::

    from mimo_numerics import golden_data
    cases = golden_data.load("full_op")          # name -> case dict (7 whole-op cases)
    golden_data.verify("full_op")                # sha256 check against the README's digest
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Tuple

#: The data folder of a source checkout.
DATA_DIR = Path(__file__).resolve().parent.parent / "tests" / "data"
#: Where the provenance of every file is written down.
README = DATA_DIR / "README.md"

#: Versions of the seed-case file's upstream run (TileLang 0.1.15).
SEED_VERSIONS = {"torch": "2.11.0+cu130", "torch_cuda": "13.0", "tilelang": "0.1.15", "mamba_ssm": "2.3.2.post1"}
#: Versions of the whole-op and realistic files' upstream runs (mamba-ssm's own pin, TileLang 0.1.8).
WHOLE_OP_VERSIONS = {"torch": "2.11.0+cu130", "torch_cuda": "13.0", "tilelang": "0.1.8",
                     "apache_tvm_ffi": "0.1.8.post2", "mamba_ssm": "2.3.2.post1"}
#: Versions of the decode rotary-step file's upstream run (a Triton kernel: no TileLang).
DECODE_VERSIONS = {"torch": "2.11.0+cu130", "torch_cuda": "13.0", "triton": "3.6.0", "mamba_ssm": "2.3.2.post1"}
#: Versions of the decode-step file's upstream run (the Triton rotary kernel and the CuTe state update, compiled
#: ahead of time by ``golden/build_cute_step.py``; ``.cute_step/manifest.json`` names the CuTe DSL's version).
DECODE_STEP_VERSIONS = dict(DECODE_VERSIONS, apache_tvm_ffi="0.1.9", nvidia_cutlass_dsl="4.5.0")
#: The device every upstream file was made on.
DEVICE_NAME = "NVIDIA H200 (sm_90)"


@dataclass(frozen=True)
class GoldenFile:
    """One stored file: its name in ``tests/data``, sha256, what it holds, and the upstream versions that made it
    (empty for a file that holds no upstream output)."""

    filename: str
    sha256: str
    what: str
    versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return DATA_DIR / self.filename


#: The stored files by key (``tests/data/README.md`` has one section per file).
FILES: Dict[str, GoldenFile] = {
    "seed_cases": GoldenFile(
        "upstream_h200_seed_cases.pt", "238ee4f20fb30e7ad78efb6e71ea10cc104b543bedd2e35400538fa613680f52",
        "stage 1 on the seed PR's 15 cases, inputs stored", SEED_VERSIONS),
    "realistic_outputs": GoldenFile(
        "upstream_h200_realistic_outputs.pt", "804d3d2a06a4f970dcaf00a4e5a6ea3a0e82020f4c5e8222c37dff8b56a735fa",
        "stage 1 on the six long cases of the sweep grid, inputs regenerated from CaseSpecs", WHOLE_OP_VERSIONS),
    "full_op": GoldenFile(
        "upstream_h200_full_op_cases.pt", "91b5d11984d66cb9a69a3b48369ff6ddd947ec51792681111b74199f60d8c3cf",
        "the whole op forward and backward, every kernel's outputs, 7 cases, inputs stored", WHOLE_OP_VERSIONS),
    "full_op_extra": GoldenFile(
        "upstream_h200_full_op_extra_cases.pt", "d2a965b600e5a96dd23dc2d61568321d077554c0a8263ad07f5972cd8d2de5f2",
        "the whole op on 6 more cases (R=1, R=8, fp16, a forward tail, G=H with N=32), with upstream's refusals",
        WHOLE_OP_VERSIONS),
    "full_op_parity": GoldenFile(
        "upstream_h200_full_op_parity_cases.pt", "b2fb3d3a5b4c7d5fd77f091a67ce84d9b663b278ab08fd85d4731f8d12680087",
        "the whole op with return_state and with cu_seqlens (varlen, length-1 and tail sequences), 5 cases, inputs "
        "stored", WHOLE_OP_VERSIONS),
    "decode_rotary": GoldenFile(
        "upstream_h200_decode_rotary_cases.pt", "15901f157edb0e0a671f867a837bd45aea19b8e71876ff670bf2bfb703ad6bb2",
        "the decode step's rotary kernel (apply_rotary_qk_inference_fwd) on 5 cases, one a 256-step chain, inputs "
        "stored", DECODE_VERSIONS),
    "decode_step": GoldenFile(
        "upstream_h200_decode_step_cases.pt", "f0d0e17af04e7fbce160316108f801b3d79ac0059c73f7808c7b53d126c45492",
        "the decode step as Mamba3.step chains it (the rotary kernel, then the CuTe state update) on 4 cases, one a "
        "256-token chain, inputs stored", DECODE_STEP_VERSIONS),
    "full_op_long": GoldenFile(
        "upstream_h200_full_op_long_cases.pt", "653738b5b70e8974a3c0cdcfa90bfb9da5131907e22bb19f8fb0e8cd3db36f8b",
        "the whole op at S = 2048 and 8192 (bf16 reduced, fp16 not reduced), every kernel's outputs as sampled "
        "records (golden_samples), inputs regenerated from the spec", WHOLE_OP_VERSIONS),
    "mufu_samples": GoldenFile(
        "mufu_h200_samples.pt", "dc52da4811456dda14d72170c201790c5a2c512a0fdf982728bb0c3ae0326a13",
        "the H200's ex2/rcp/sin/cos/tanh.approx outputs on 65536 sampled float32 inputs (scripts/fit_mufu_models.py "
        "--samples)", {"torch": "2.11.0+cu130", "triton": "3.6.0"}),
    "inference_counterexamples": GoldenFile(
        "inference_counterexamples.pt", "2508ecee5864358dd7d2a15a7319045f5c8b55fdbf77f46f7e95056f4a8873ed",
        "inputs of four infer_policy counterexamples (reports/reliability.md), no upstream output"),
}
#: The whole-op files in the order the whole-op loader merges them.
WHOLE_OP_KEYS: Tuple[str, ...] = ("full_op", "full_op_extra")

_CACHE: Dict[str, dict] = {}


def _file(key: str) -> GoldenFile:
    if key not in FILES:
        raise ValueError(f"golden file key must be one of {sorted(FILES)}, got {key!r}")
    return FILES[key]


def path(key: str, must_exist: bool = True) -> Path:
    """The path of stored file ``key`` (a key of :data:`FILES`); ``FileNotFoundError`` when ``must_exist`` and the
    file is not there (outside a source checkout)."""
    found = _file(key).path
    if must_exist and not found.is_file():
        raise FileNotFoundError(f"golden file {found} does not exist; mimo_numerics finds tests/data relative to the "
                                "package only in a source (editable) install: pass an explicit path otherwise")
    return found


def sha256_of(file: Path) -> str:
    """The sha256 hex digest of ``file``."""
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(key: str) -> Path:
    """Check stored file ``key`` against its recorded sha256; its path, or ``ValueError`` naming both digests."""
    found = path(key)
    got = sha256_of(found)
    if got != _file(key).sha256:
        raise ValueError(f"golden file {found} has sha256 {got}, expected {_file(key).sha256} (tests/data/README.md)")
    return found


def load(key: str) -> dict:
    """The content of stored file ``key`` (``torch.load(..., weights_only=True)``), cached per process; callers
    must not modify it."""
    if key not in _CACHE:
        import torch

        _CACHE[key] = torch.load(path(key), weights_only=True)
    return _CACHE[key]
