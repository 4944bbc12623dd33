"""``kernels.compile_ahead`` and ``mn.precompile_mamba3_mimo`` (issue 23: the first-call compile cost): inside, a
launch of this package becomes the kernel's ``warmup`` with the launch's own arguments (a compile request, no run);
outside, launches run. Interpreted kernels (CPU tensors) are counted and skipped. The GPU test
(``test_compile_ahead_gpu.py``) checks that the real call afterwards compiles nothing more and gives the same bits."""

from __future__ import annotations

import warnings

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import kernels
from mimo_numerics.kernels import _compile_ahead
from mimo_numerics.ops.mamba3_mimo.autograd import BackendFallbackWarning
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, make_op_inputs, small_case


class _FakeKernel:
    """Records how it was called: ``kernel[grid](...)`` (a run) or ``kernel.warmup(...)`` (a compile request)."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("run", grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.calls.append(("warmup", grid, args, kwargs))


def test_a_launch_runs_outside_and_becomes_a_compile_request_inside():
    kernel = _FakeKernel()
    args, kwargs = (1, 2.0), {"BLOCK": 128, "num_warps": 4}
    _compile_ahead.launch(kernel, (3,), args, kwargs)
    report = kernels.compile_ahead(_compile_ahead.launch, kernel, (5,), args, kwargs, workers=2)
    assert kernel.calls == [("run", (3,), args, kwargs), ("warmup", (5,), args, kwargs)]
    assert report.launches == 1 and report.interpreted == 0 and report.workers == 2
    assert report.parallel == (_compile_ahead._async_compile_mode() is not None)
    assert not kernels._compile_ahead.compiling_ahead()


def test_compile_ahead_refuses_bad_workers_and_nesting():
    with pytest.raises(ValueError, match="workers"):
        kernels.compile_ahead(lambda: None, workers=0)
    with pytest.raises(TypeError, match="fn"):
        kernels.compile_ahead(None)
    with pytest.raises(RuntimeError, match="does not nest"):
        kernels.compile_ahead(lambda: kernels.compile_ahead(lambda: None))
    assert not _compile_ahead.compiling_ahead()


def test_compile_ahead_resets_after_an_error():
    def fails():
        raise KeyError("inside")

    with pytest.raises(KeyError):
        kernels.compile_ahead(fails)
    assert not _compile_ahead.compiling_ahead()


class _FakeCompiled:
    def __init__(self, name):
        self.src, self.metadata = f"src of {name}", f"metadata of {name}"


def test_build_launchers_builds_each_compiled_kernels_launcher_on_the_pool():
    from concurrent.futures import ThreadPoolExecutor
    import threading

    built, threads = [], set()

    def launcher_class(src, metadata):
        threads.add(threading.get_ident())
        built.append((src, metadata))

    kernels_ = [_FakeCompiled(n) for n in ("a", "b", "c")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert _compile_ahead.build_launchers(kernels_, pool, launcher_class) == 3
        assert _compile_ahead.build_launchers([], pool, launcher_class) == 0
    assert sorted(built) == [(f"src of {n}", f"metadata of {n}") for n in ("a", "b", "c")]
    assert threading.get_ident() not in threads  # on the pool, not the caller's thread

    def broken(src, metadata):
        raise OSError("gcc failed")

    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(OSError, match="gcc"):
        _compile_ahead.build_launchers(kernels_[:1], pool, broken)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only case")
def test_no_launcher_is_built_without_a_cuda_driver():
    from concurrent.futures import ThreadPoolExecutor

    assert _compile_ahead._cuda_launcher_class() is None
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert _compile_ahead.build_launchers([_FakeCompiled("a")], pool) == 0


@pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
def test_precompile_on_cpu_tensors_counts_the_interpreted_launches_and_runs_none():
    inputs = make_op_inputs(small_case(seqlen=16, chunk_size=8, value_dim=16, state_dim=16, heads=1, rank=2))
    tensors = [inputs[n] for n in OP_INPUT_NAMES]
    before = [None if t is None else t.clone() for t in tensors]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendFallbackWarning)
        report = mn.precompile_mamba3_mimo(*tensors, inputs["chunk_size"], inputs["rotary_dim_divisor"],
                                           policy="upstream_sm90")
    # forward, stage 1 and stage 2 launch several kernels each; on the CPU all are interpreted, so none compiles
    assert report.launches >= 3 and report.interpreted == report.launches
    assert report.compiled in (0, None) and report.launchers == 0
    for t, b in zip(tensors, before):  # the inputs are untouched and keep no gradient
        assert (t is None) == (b is None)
        if t is not None:
            assert torch.equal(t, b) and t.grad is None


def test_precompile_names_a_bad_backward_flag():
    inputs = make_op_inputs(small_case(seqlen=16, chunk_size=8, value_dim=16, state_dim=16, heads=1, rank=2))
    if not kernels.triton_available():
        pytest.skip("triton is not installed")
    with pytest.raises(TypeError, match="backward"):
        mn.precompile_mamba3_mimo(*[inputs[n] for n in OP_INPUT_NAMES], backward="yes")


def test_launches_from_another_thread_are_caught_too():
    """Autograd runs the backward of CUDA tensors on its own device thread: its launches must compile, not run."""
    import threading

    kernel = _FakeKernel()

    def from_a_thread():
        worker = threading.Thread(target=_compile_ahead.launch, args=(kernel, (2,), (7,), {"BLOCK": 64}))
        worker.start()
        worker.join()

    report = kernels.compile_ahead(from_a_thread, workers=1)
    assert kernel.calls == [("warmup", (2,), (7,), {"BLOCK": 64})] and report.launches == 1


def test_the_site_ranking_compiles_its_kernel_variants_ahead_on_a_gpu(monkeypatch):
    """``sensitivity.rank_sites_one_off`` with ``backend="triton"`` on a compiled device hands every (case, policy)
    run the kernels make, and none that the reference makes, to one ``compile_ahead`` before it times anything."""
    from mimo_numerics import sensitivity
    from mimo_numerics.ops.mamba3_mimo import cases as op_cases, runs

    x = op_cases.make_op_inputs(op_cases.small_case())
    recorded = runs.policy_run(x, "upstream_sm90")
    ahead = []
    monkeypatch.setattr(sensitivity, "_on_compiled_device", lambda cases: True)
    monkeypatch.setattr(sensitivity, "compile_variants_ahead", lambda run, calls: ahead.extend(calls))
    monkeypatch.setattr(runs, "policy_run", lambda inputs, policy, *, backend="reference": recorded)
    sensitivity.rank_sites_one_off([x], "upstream_sm90", op="mamba3_mimo", backend="triton", progress=False)
    assert ahead and all(inputs is x for inputs, _ in ahead)
    assert all(runs.backend_for(p, "triton") == "triton" for _, p in ahead)
    policy = mn.presets.get("upstream_sm90")
    variants, _ = sensitivity.one_off_variants(policy, "mamba3_mimo")
    on_kernels = [v for *_, v in variants if runs.backend_for(v, "triton") == "triton"]
    assert len(on_kernels) < len(variants)  # the FP32-level models' variants run the reference, not compiled
    assert len(ahead) == 1 + len(on_kernels)
