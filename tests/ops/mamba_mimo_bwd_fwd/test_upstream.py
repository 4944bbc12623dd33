"""The upstream oracle's CPU-testable parts: errors, the C·R refusal, source lookup and the module loader.

The loader tests use a tiny fake ``mamba_ssm`` tree whose package ``__init__.py`` files raise, so they prove the two
kernel modules are executed without running any package ``__init__``. The GPU test (marker ``gpu``) checks bit-exact
reproduction of the golden H200 outputs when CUDA, TileLang and the mamba-ssm source are present.
"""

import sys
import tarfile
from pathlib import Path

import pytest
import torch

from mimo_numerics import cases
from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream
from mimo_numerics.bundles import bit_identical
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES, OUTPUT_NAMES, MimoBwdFwdOutputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.validation import validate_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "upstream_h200_seed_cases.pt"

_RAISING_INIT = "raise RuntimeError('package __init__ executed: {}')\n"
_UTILS = "def bwd_dadt_fused_triton():\n    return 'utils'\n\ndef bwd_dtrap_ddt_triton():\n    return 'utils'\n"
_KERNEL = ("from mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils import bwd_dadt_fused_triton, bwd_dtrap_ddt_triton\n"
           "{extra}\nMARK = 'fake upstream kernel'\n")


def _fake_tree(root: Path, extra: str = "") -> Path:
    """An sdist-like tree ``root/mamba_ssm/...`` with raising package __init__ files; returns ``root``."""
    for package in ("mamba_ssm", "mamba_ssm/ops", "mamba_ssm/ops/triton", "mamba_ssm/ops/triton/mamba3",
                    "mamba_ssm/ops/tilelang", "mamba_ssm/ops/tilelang/mamba3"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text(_RAISING_INIT.format(package))
    (root / upstream.UTILS_RELPATH).write_text(_UTILS)
    (root / upstream.KERNEL_RELPATH).write_text(_KERNEL.format(extra=extra))
    return root


@pytest.fixture
def clean_modules(monkeypatch):
    """Isolate sys.modules entries of mamba_ssm and the loader's caches; no environment lookup."""
    monkeypatch.delenv(upstream.ENV_VAR, raising=False)
    saved = {k: v for k, v in sys.modules.items() if k == "mamba_ssm" or k.startswith("mamba_ssm.")}
    saved_loaded = dict(upstream._loaded)
    for k in saved:
        del sys.modules[k]
    upstream._loaded.clear()
    yield
    upstream.unload_upstream()
    for k in [k for k in sys.modules if k == "mamba_ssm" or k.startswith("mamba_ssm.")]:
        del sys.modules[k]
    sys.modules.update(saved)
    upstream._loaded.update(saved_loaded)


def _dims(**kw):
    inputs = stage1_cases.make_inputs(cases.CaseSpec(**kw))
    return validate_inputs(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs))


# ---------------------------------------------------------------------------------------------------------- errors
@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the error raised without CUDA")
def test_missing_cuda_is_a_clear_error():
    inputs = stage1_cases.make_inputs(cases.CaseSpec())
    with pytest.raises(upstream.UpstreamUnavailable, match="runs on CUDA only; the inputs are on cpu"):
        upstream.mamba_mimo_bwd_fwd(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs))
    with pytest.raises(upstream.UpstreamUnavailable, match="CUDA is not available"):
        upstream.check_cuda()
    ok, reason = upstream.availability()
    assert not ok and "CUDA is not available" in reason


def test_invalid_inputs_raise_the_validation_errors():
    inputs = stage1_cases.make_inputs(cases.CaseSpec())
    inputs["k"] = inputs["k"].float()
    with pytest.raises(TypeError, match="k must have dtype"):
        upstream.mamba_mimo_bwd_fwd(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs))


# ---------------------------------------------------------------------------------------------------------- refusal
@pytest.mark.parametrize(("chunk_size", "rank", "refused"), [(6, 3, True), (4, 3, True), (2, 2, False),
                                                            (8, 1, False), (6, 4, False), (16, 4, False),
                                                            (64, 1, False), (5, 1, True)])
def test_fused_chunk_refusal_rule(chunk_size, rank, refused):
    dims = _dims(seqlen=2 * chunk_size, state_dim=16, value_dim=16, rank=rank, chunk_size=chunk_size)
    reason = upstream.refusal_reason(dims)
    assert (reason is not None) == refused
    if refused:
        assert f"= {chunk_size * rank}" in reason and "upstream limitation" in reason
        with pytest.raises(upstream.UpstreamUnsupported):
            upstream.check_supported(dims)


def test_cr18_is_refused_before_looking_for_cuda():
    """The seed PR's C·R = 18 case is an upstream limitation on any machine, never a crash."""
    inputs = stage1_cases.make_inputs(cases.CaseSpec(seqlen=13, rank=3, chunk_size=6, has_z=True, has_d=True))
    with pytest.raises(upstream.UpstreamUnsupported, match=r"6\*3 = 18 .*stride=18"):
        upstream.mamba_mimo_bwd_fwd(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs))
    assert issubclass(upstream.UpstreamUnsupported, upstream.UpstreamError)


def test_every_golden_shape_is_accepted():
    golden = torch.load(GOLDEN, weights_only=True)
    for name, item in golden.items():
        dims = validate_inputs(*stage1_cases.as_args(item["inputs"]), **stage1_cases.as_kwargs(item["inputs"]))
        assert upstream.refusal_reason(dims) is None, name


# ---------------------------------------------------------------------------------------------------------- source
def test_find_source_accepts_root_package_dir_and_tarball(tmp_path, clean_modules):
    root = _fake_tree(tmp_path / "mamba_ssm-9.9")
    assert upstream.find_source(root) == root
    assert upstream.find_source(root / "mamba_ssm") == root
    tarball = tmp_path / "mamba_ssm-9.9.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(root, arcname="mamba_ssm-9.9")
    extracted = upstream.find_source(tarball)
    assert (extracted / upstream.KERNEL_RELPATH).read_text() == (root / upstream.KERNEL_RELPATH).read_text()


def test_find_source_lookup_order(tmp_path, clean_modules, monkeypatch):
    explicit = _fake_tree(tmp_path / "explicit")
    from_env = _fake_tree(tmp_path / "env")
    on_path = _fake_tree(tmp_path / "site" / "mamba_ssm-2.3.2.post1")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    monkeypatch.chdir(tmp_path)
    assert upstream.find_source() == on_path
    monkeypatch.setenv(upstream.ENV_VAR, str(from_env))
    assert upstream.find_source() == from_env
    assert upstream.find_source(explicit) == explicit


def test_find_source_errors(tmp_path, clean_modules, monkeypatch):
    with pytest.raises(upstream.UpstreamUnavailable, match=r"source_dir=.*: no mamba_ssm/ops/tilelang"):
        upstream.find_source(tmp_path)
    monkeypatch.setenv(upstream.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(upstream.UpstreamUnavailable, match=upstream.ENV_VAR):
        upstream.find_source()
    monkeypatch.delenv(upstream.ENV_VAR)
    monkeypatch.setattr(sys, "path", [])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(upstream.UpstreamUnavailable, match=r"source not found: pass source_dir="):
        upstream.find_source()


# ---------------------------------------------------------------------------------------------------------- loader
def test_loader_runs_the_two_modules_without_package_inits(tmp_path, clean_modules):
    root = _fake_tree(tmp_path / "src")
    module = upstream.load_upstream(root, check_hash=False)
    assert module.MARK == "fake upstream kernel"
    assert module.bwd_dadt_fused_triton() == "utils"
    assert module.__name__ == upstream.KERNEL_MODULE
    assert sys.modules[upstream.KERNEL_MODULE] is module
    stub = sys.modules["mamba_ssm"]
    assert getattr(stub, upstream._STUB_MARK) and stub.__path__ == [str(root / "mamba_ssm")]
    assert sys.modules["mamba_ssm.ops.triton.mamba3"].mamba3_mimo_utils is sys.modules[upstream.UTILS_MODULE]
    assert upstream.load_upstream(root, check_hash=False) is module  # cached
    upstream.unload_upstream()
    assert not any(k == "mamba_ssm" or k.startswith("mamba_ssm.") for k in sys.modules)


def test_loader_checks_the_kernel_hash(tmp_path, clean_modules):
    root = _fake_tree(tmp_path / "src")
    with pytest.raises(upstream.UpstreamUnavailable, match=r"sha256 .* is not the kernel of mamba-ssm==2.3.2.post1"):
        upstream.load_upstream(root)


def test_loader_reports_a_missing_dependency(tmp_path, clean_modules):
    root = _fake_tree(tmp_path / "src", extra="import tilelang_not_installed_for_this_test")
    with pytest.raises(upstream.UpstreamUnavailable,
                       match=r"needs the Python package 'tilelang_not_installed_for_this_test'.*\[upstream\]"):
        upstream.load_upstream(root, check_hash=False)
    assert not any(k == "mamba_ssm" or k.startswith("mamba_ssm.") for k in sys.modules)


def test_source_info_reads_the_version(tmp_path, clean_modules):
    root = _fake_tree(tmp_path / "src")
    (root / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: mamba_ssm\nVersion: 2.3.2.post1\n")
    info = upstream.source_info(root)
    assert info["mamba_ssm"] == "2.3.2.post1" and info["source_dir"] == str(root)
    assert len(info["kernel_sha256"]) == 64


# ---------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_upstream_reproduces_the_golden_outputs_bit_for_bit():
    ok, reason = upstream.availability()
    if not ok:
        pytest.skip(reason)
    golden = torch.load(GOLDEN, weights_only=True)
    for name, item in golden.items():
        inputs = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in item["inputs"].items()}
        out = upstream.mamba_mimo_bwd_fwd(*stage1_cases.as_args(inputs), **stage1_cases.as_kwargs(inputs))
        for output in OUTPUT_NAMES:
            got = getattr(out, output)
            assert bit_identical(None if got is None else got.cpu(), item["upstream"][output]), (name, output)


# ---------------------------------------------------------------------------------------------------------- make_golden
def test_plumbing_make_golden_flow_with_a_stand_in_kernel(tmp_path, monkeypatch, capsys):
    """Plumbing: golden/make_golden.py end to end on CPU: the kernel is replaced by a stand-in that returns the golden
    outputs for golden inputs (found by digest) and the reference's otherwise, so its golden check agrees by
    construction; this tests the pipeline's wiring, not a kernel (the real kernel's run: tests/ops/mamba_mimo_bwd_fwd/test_golden.py)."""
    import importlib.util

    from mimo_numerics import bundles
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference

    spec = importlib.util.spec_from_file_location("make_golden", Path(__file__).resolve().parents[3] / "golden" /
                                                  "make_golden.py")
    make_golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_golden)
    golden = torch.load(GOLDEN, weights_only=True)
    by_digest = {bundles.inputs_digest(item["inputs"]): item["upstream"] for item in golden.values()}
    real_check = upstream.check_supported

    def stand_in(*tensors, chunk_size, rotary_dim_divisor, source_dir=None):
        inputs = dict(zip(INPUT_NAMES, tensors), chunk_size=chunk_size,
                      rotary_dim_divisor=rotary_dim_divisor)
        real_check(validate_inputs(*tensors, chunk_size, rotary_dim_divisor))
        known = by_digest.get(bundles.inputs_digest(inputs))
        if known is not None:
            return MimoBwdFwdOutputs(**known)
        return reference.mamba_mimo_bwd_fwd(*tensors, chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor,
                                            policy="upstream_sm90")

    monkeypatch.setattr(upstream, "mamba_mimo_bwd_fwd", stand_in)
    monkeypatch.setattr(upstream, "check_cuda", lambda device=None: None)
    monkeypatch.setattr(upstream, "source_info", lambda source_dir=None: {"mamba_ssm": "stand-in"})
    monkeypatch.setattr(upstream, "load_upstream", lambda source_dir=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    out = tmp_path / "golden_bundle"
    code = make_golden.main(["--out", str(out), "--device", "cpu", "--jobs", "1", "--only", "seed_*", "--only",
                             "realistic_B2_S256*", "--repeat", "2"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "golden check: 15/15 seed case(s) bit-identical" in text
    bundle = bundles.load_bundle(out)
    assert len(bundle) == 18
    skipped = [c.name for c in bundle if c.outputs is None]
    assert skipped == ["seed_non_pow2_fused_tail", "seed_shape_N64_P64_R3_C6"]
    assert all(c.meta["repeat_identical"] for c in bundle if c.outputs is not None)
    assert bundle.case("realistic_B2_S256_H2_G1_N64_P64_R4_C16_roZD_bf16_s123").meta["set"] == "realistic"
    assert bundle.meta["golden_checked"] == 15 and not bundle.meta["golden_mismatches"]
