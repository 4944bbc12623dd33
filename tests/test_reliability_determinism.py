"""Determinism: the same inputs give the same bits, run after run.

CPU (run in CI): the reference and the oracle under random cases and policies (hypothesis), twice in a row, with
the stage records; the reference with 1 thread and with every core; a fresh Python process; the reference on
other CPU kernels and BLAS paths (a subprocess, within a tolerance: not bits); ``make_inputs`` independent of the
global RNG; the Triton kernels under the interpreter (second run poisoned); bundles written twice.

GPU (``@pytest.mark.gpu``, skipped without CUDA; the lead runs them on the H200, see ``reports/reliability.md``):
the reference and the Triton kernels on CUDA over the golden shapes and three presets, three runs each (the third
after unrelated GPU work), and the upstream TileLang kernel on the golden cases when it is available.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mimo_numerics as mn  # noqa: E402
from mimo_numerics import tolerances  # noqa: E402
from mimo_numerics.bundles import BundleCase, manifest_digest, save_bundle  # noqa: E402
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES

# ---------------------------------------------------------------------------------------------------- profiles
from reliability_support import counts_writer, kernels_or_none, policies, profile  # noqa: E402
from reliability_support import run_case as _run  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference  # noqa: E402

COUNTS = collections.Counter()
_write_counts = counts_writer(COUNTS, __file__)


KERNELS = kernels_or_none()
_CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------------- helpers
def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
        t.element_size()])


def assert_same_bits(a, b, label=""):
    a = a._asdict() if hasattr(a, "_asdict") else dict(a)
    b = b._asdict() if hasattr(b, "_asdict") else dict(b)
    assert a.keys() == b.keys(), label
    for name in a:
        x, y = a[name], b[name]
        assert (x is None) == (y is None), (label, name)
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, (label, name)
            assert torch.equal(bits(x.cpu()), bits(y.cpu())), f"{label}: {name} differs between runs"


def digest(outputs) -> str:
    h = hashlib.sha256()
    for name in OUTPUT_NAMES:
        t = getattr(outputs, name)
        h.update(name.encode())
        if t is not None:
            h.update(bits(t.cpu()).numpy().tobytes())
    return h.hexdigest()


@st.composite
def specs(draw):
    divisor = draw(st.sampled_from([2, 4]))
    groups = draw(st.integers(1, 3))
    rank = draw(st.integers(1, 6))
    return CaseSpec(batch=draw(st.integers(1, 2)), seqlen=draw(st.integers(1, 48)), groups=groups,
                    heads=groups * draw(st.integers(1, 2)), state_dim=divisor * draw(st.integers(1, 12)),
                    value_dim=draw(st.integers(1, 32)), rank=rank,
                    chunk_size=draw(st.integers(1, min(48, 128 // rank))), reduce_o=draw(st.booleans()),
                    has_z=draw(st.booleans()), has_d=draw(st.booleans()),
                    formula=draw(st.sampled_from(["seed", "realistic"])),
                    dtype=draw(st.sampled_from(["bfloat16", "float16"])), seed=draw(st.integers(0, 10 ** 6)),
                    rotary_dim_divisor=divisor)




# ---------------------------------------------------------------------------------------------------- reference
def _repeatable(profile_name: str, examples: int):
    counter = f"determinism_reference_oracle[{profile_name}]"

    @profile(profile_name, examples)
    @given(data=st.data(), spec=specs())
    def check(data, spec):
        policy = data.draw(policies(spec.dtype), label="policy")
        note(spec.case_id)
        COUNTS[counter] += 1
        x = make_inputs(spec)
        r1, r2 = {}, {}
        a = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy, record=r1)
        b = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy, record=r2)
        assert_same_bits(a, b, "reference")
        assert_same_bits(r1, r2, "reference record")
        assert_same_bits(_run(stage1_oracle.mamba_mimo_bwd_fwd_oracle, x), _run(stage1_oracle.mamba_mimo_bwd_fwd_oracle, x),
                         "oracle")

    return check


test_reference_and_oracle_are_bitwise_repeatable = _repeatable("fast", 20)
test_reference_and_oracle_are_bitwise_repeatable_slow = pytest.mark.slow(_repeatable("slow", 250))


THREAD_CASE = CaseSpec(formula="realistic", batch=2, seqlen=300, heads=2, state_dim=64, value_dim=64, rank=4,
                       chunk_size=16, has_z=True, has_d=True)


@pytest.mark.parametrize("policy", ["upstream_sm90", "fp64"])
def test_reference_bits_do_not_depend_on_the_thread_count(policy):
    x = make_inputs(THREAD_CASE)
    old = torch.get_num_threads()
    many = max(2, os.cpu_count() or 2)
    try:
        torch.set_num_threads(1)
        one = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy)
        oracle_one = _run(stage1_oracle.mamba_mimo_bwd_fwd_oracle, x)
        torch.set_num_threads(many)
        all_cores = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=policy)
        oracle_all = _run(stage1_oracle.mamba_mimo_bwd_fwd_oracle, x)
    finally:
        torch.set_num_threads(old)
    COUNTS["determinism_thread_count[fast]"] += 1
    assert_same_bits(one, all_cores, f"reference with 1 vs {many} threads")
    assert_same_bits(oracle_one, oracle_all, f"oracle with 1 vs {many} threads")


def test_reference_bits_are_the_same_in_a_fresh_process():
    spec = CaseSpec(formula="realistic", seqlen=50, heads=2, groups=1, state_dim=32, value_dim=16, rank=3,
                    chunk_size=8, has_z=True, has_d=True)
    x = make_inputs(spec)
    here = digest(_run(stage1_reference.mamba_mimo_bwd_fwd, x, policy="upstream_sm90"))
    code = textwrap.dedent(f"""
        import hashlib, torch
        import mimo_numerics as mn
        from mimo_numerics.cases import CaseSpec, make_inputs, as_args, as_kwargs
        torch.manual_seed(999)  # the global RNG must not matter
        x = make_inputs(CaseSpec(**{spec.to_dict()!r}))
        out = mn.reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90")
        h = hashlib.sha256()
        for name in {OUTPUT_NAMES!r}:
            t = getattr(out, name)
            h.update(name.encode())
            if t is not None:
                t = t.contiguous()
                h.update(t.view({{2: torch.int16, 4: torch.int32, 8: torch.int64}}[t.element_size()]).numpy().tobytes())
        print(h.hexdigest())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    COUNTS["determinism_fresh_process[fast]"] += 1
    assert result.stdout.strip().splitlines()[-1] == here


#: The environment of a CPU without AVX: torch's scalar kernels, MKL's SSE4.2 path, OpenBLAS's Nehalem kernels
#: (the ``scalar`` configuration of scripts/cpu_emulation_suite.sh).
OTHER_CPU_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OPENBLAS_CORETYPE": "Nehalem"}


def test_reference_on_other_cpu_kernels_within_tolerance(tmp_path):
    """The stage-1 reference in a process that uses other CPU kernels and another BLAS code path: the inputs are the
    same bits (exact_random), the outputs agree to the FP32 summation order only. Not bits: the reference's FP32
    GEMMs and sums go through the CPU's BLAS and vectorised reductions, which sum in another order on another CPU
    (docs/reproducibility.md), so this is what the golden tests can rely on when CI runs on another machine."""
    policies = ("upstream_sm90", "fp32")
    x = make_inputs(THREAD_CASE)
    here = {p: _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy=p) for p in policies}
    path = tmp_path / "other_cpu.pt"
    code = textwrap.dedent(f"""
        import torch
        import mimo_numerics as mn
        from mimo_numerics.cases import CaseSpec, make_inputs, as_args, as_kwargs
        x = make_inputs(CaseSpec(**{THREAD_CASE.to_dict()!r}))
        out = {{p: mn.reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=p)._asdict()
               for p in {policies!r}}}
        torch.save({{"capability": torch.backends.cpu.get_cpu_capability(), "inputs": x, "outputs": out}},
                   {str(path)!r})
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, **OTHER_CPU_ENV))
    assert result.returncode == 0, result.stderr
    other = torch.load(path, weights_only=False)
    assert other["capability"] == "DEFAULT"
    COUNTS["determinism_other_cpu_kernels[fast]"] += 1
    for name in INPUT_NAMES:
        if x[name] is not None:
            assert torch.equal(bits(x[name]), bits(other["inputs"][name])), f"input {name} differs on other CPU kernels"
    for policy in policies:
        for name in OUTPUT_NAMES:
            want, got = getattr(here[policy], name), other["outputs"][policy][name]
            assert (want is None) == (got is None), (policy, name)
            if want is not None:
                err = mn.metrics.rel_rms(got, want)
                assert err <= tolerances.get("reference_cross_cpu_rel_rms"), (policy, name, err)


@given(spec=specs(), noise=st.integers(0, 2 ** 31 - 1))
@profile("fast", 25)
def test_make_inputs_ignores_the_global_rng(spec, noise):
    COUNTS["determinism_make_inputs[fast]"] += 1
    a = make_inputs(spec)
    torch.manual_seed(noise)
    torch.rand(3)
    b = make_inputs(spec)
    for name in INPUT_NAMES:
        assert (a[name] is None) == (b[name] is None), name
        if a[name] is not None:
            assert torch.equal(bits(a[name]), bits(b[name])), name


# ---------------------------------------------------------------------------------------------------- kernels
@st.composite
def kernel_specs(draw):
    groups = draw(st.integers(1, 2))
    heads = groups * draw(st.integers(1, 2))
    chunk = draw(st.integers(1, 16))
    seqlen = draw(st.integers(1, 24))
    assume(heads * -(-seqlen // chunk) <= 6)
    return CaseSpec(seqlen=seqlen, heads=heads, groups=groups, state_dim=draw(st.sampled_from([16, 32])),
                    value_dim=draw(st.sampled_from([16, 32])), rank=draw(st.integers(1, 4)), chunk_size=chunk,
                    reduce_o=draw(st.booleans()), has_z=draw(st.booleans()), has_d=draw(st.booleans()),
                    dtype=draw(st.sampled_from(["bfloat16", "float16"])), seed=draw(st.integers(0, 10 ** 6)))


def _kernels_repeatable(profile_name: str, examples: int):
    counter = f"determinism_kernels_interpreter[{profile_name}]"

    @pytest.mark.skipif(KERNELS is None, reason="triton is not installed")
    @profile(profile_name, examples)
    @given(data=st.data(), spec=kernel_specs())
    def check(data, spec):
        policy = data.draw(policies(spec.dtype, kernel=True), label="policy")
        note(spec.case_id)
        COUNTS[counter] += 1
        x = make_inputs(spec)
        a = _run(KERNELS.mamba_mimo_bwd_fwd, x, policy=policy)
        b = _run(KERNELS.mamba_mimo_bwd_fwd, x, policy=policy, poison=True)
        assert_same_bits(a, b, "kernels (interpreter)")

    return check


test_kernels_interpreter_is_bitwise_repeatable = _kernels_repeatable("fast", 2)
test_kernels_interpreter_is_bitwise_repeatable_slow = pytest.mark.slow(_kernels_repeatable("slow", 30))


# ---------------------------------------------------------------------------------------------------- bundles
def test_bundles_written_twice_have_identical_tensor_files(tmp_path):
    spec = CaseSpec(seqlen=9, state_dim=8, value_dim=8, rank=2, chunk_size=4, has_z=True, has_d=True)
    x = make_inputs(spec)
    out = _run(stage1_reference.mamba_mimo_bwd_fwd, x, policy="seed_bf16")
    case = BundleCase(name="c", inputs=x, outputs=out, spec=spec, policy=mn.presets.get("seed_bf16"),
                      created="2026-01-01T00:00:00Z")
    a = save_bundle(tmp_path / "a", [case], meta={"k": 1})
    b = save_bundle(tmp_path / "b", [case], meta={"k": 1})
    COUNTS["determinism_bundles[fast]"] += 1
    for name in sorted(os.listdir(a)):
        if name == "manifest.json":
            ma, mb = (json.loads((p / name).read_text()) for p in (a, b))
            for m in (ma, mb):  # the bundle's creation time, and so the manifest's digest, may differ
                assert m.pop("manifest_sha256") == manifest_digest(m)
                m.pop("created")
            assert ma == mb
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


# ---------------------------------------------------------------------------------------------------- GPU
def _golden_cases():
    """The stage-1 golden cases (a committed file): a missing or corrupt file fails the test, never skips it."""
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden

    cases = golden.load_golden()
    assert cases, "the golden file holds no case"
    return cases


GPU_PRESETS = ("upstream_sm90", "seed_bf16", "fp32")


def _to(inputs, device):
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in inputs.items()}


def _unrelated_gpu_work():
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        a = torch.tanh(a @ a.T / 2048)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend, preset", [("reference", p) for p in GPU_PRESETS] + [("kernels", "upstream_sm90")])
def test_gpu_golden_shapes_are_bitwise_repeatable(backend, preset):
    # (the kernels under one preset only: every golden shape class is a separate compile)
    if backend == "kernels" and KERNELS is None:
        pytest.skip("triton is not installed")
    fn = stage1_reference.mamba_mimo_bwd_fwd if backend == "reference" else KERNELS.mamba_mimo_bwd_fwd
    cases = _golden_cases()
    for name, (inputs, _) in cases.items():
        x = _to(inputs, "cuda")
        runs = [_run(fn, x, policy=preset)]
        runs.append(_run(fn, x, policy=preset))
        _unrelated_gpu_work()
        runs.append(_run(fn, x, policy=preset))
        for other in runs[1:]:
            assert_same_bits(runs[0], other, f"{backend} {preset} {name}")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
def test_gpu_upstream_golden_cases_are_bitwise_repeatable():
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream

    ok, why = upstream.availability()
    if not ok:
        pytest.skip(why)
    cases = _golden_cases()
    for name, (inputs, stored) in cases.items():
        x = _to(inputs, "cuda")
        first = upstream.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x))
        second = upstream.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x))
        assert_same_bits(first, second, f"upstream {name}")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
@pytest.mark.skipif(KERNELS is None, reason="triton is not installed")
def test_gpu_kernels_are_repeatable_on_a_long_fp16_case():
    spec = CaseSpec(formula="realistic", batch=2, seqlen=1000, heads=4, groups=2, state_dim=128, value_dim=64, rank=4,
                    chunk_size=16, has_z=True, has_d=True, dtype="float16")
    x = make_inputs(spec, device="cuda")
    a = _run(KERNELS.mamba_mimo_bwd_fwd, x, policy="upstream_sm90_fp16")
    _unrelated_gpu_work()
    b = _run(KERNELS.mamba_mimo_bwd_fwd, x, policy="upstream_sm90_fp16", poison=True)
    assert_same_bits(a, b, "kernels fp16 long case")


def test_golden_loader_fails_on_a_corrupt_file(tmp_path):
    # what the GPU tests above rely on: a corrupt golden file is an error (they would otherwise gate nothing)
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden

    bad = tmp_path / "golden.pt"
    torch.save({"case": {"inputs": {}}}, bad)
    with pytest.raises((ValueError, KeyError)):
        golden.load_golden(bad)
    with pytest.raises(FileNotFoundError):
        golden.load_golden(tmp_path / "absent.pt")
