"""``mimo_numerics.compat``: upstream's import paths and signatures for the Mamba-3 MIMO op, on the package.

Called as upstream's own test module calls mamba-ssm's (its four entry points, positional arguments in upstream's
order, launch knobs given), and checked against the package's API: the same bits under the same policy, upstream's
return structures and dtypes, the policy switch, the import hook and its pytest option.
"""

import subprocess
import sys
import textwrap
import types

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import compat
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, make_op_inputs, small_case
from mimo_numerics.ops.mamba3_mimo.preprocess import angle_cumsum, dacs_segsum


@pytest.fixture
def mods():
    """The compat modules by upstream's names (installed for the test, removed after)."""
    compat.install()
    try:
        import mamba_ssm.ops.tilelang.mamba3.mamba3_mimo as top
        import mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd as bwd
        import mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_fwd as fwd
        import mamba_ssm.ops.triton.mamba3.angle_dt as angle_dt
        import mamba_ssm.ops.triton.mamba3.mamba3_mimo_utils as utils

        yield types.SimpleNamespace(top=top, fwd=fwd, bwd=bwd, utils=utils, angle_dt=angle_dt)
    finally:
        compat.uninstall()
    assert "mamba_ssm" not in sys.modules


@pytest.fixture(scope="module")
def case():
    raw = make_op_inputs(small_case(seqlen=32, seed=11))
    return raw, {n: raw[n] for n in OP_INPUT_NAMES}


def _package_run(x: dict, raw: dict, policy="upstream_sm90"):
    """Out, the leaves' gradients and the record of ``mn.mamba3_mimo`` (the package's own API)."""
    leaves = {n: (None if t is None else t.clone().requires_grad_()) for n, t in x.items()}
    record = {}
    out = mn.mamba3_mimo(*leaves.values(), raw["chunk_size"], raw["rotary_dim_divisor"], policy=policy,
                         record=record)
    out.backward(raw["dout"].to(out.dtype))
    return out.detach(), {n: (None if leaf is None else leaf.grad) for n, leaf in leaves.items()}, record


def _preprocessed(mods, x: dict, C: int):
    angles = mods.angle_dt.angle_dt_fwd(x["Angles"], x["DT"], chunk_size=C)
    da_cs, da_cs_rev, segsum = mods.utils.compute_dacs_segsum_triton(x["ADT"], C)
    return angles, da_cs, da_cs_rev, segsum


def test_upstream_module_paths_resolve_to_the_compat_layer(mods):
    assert mods.top.mamba3_mimo.__module__ == "mimo_numerics.compat.mamba_ssm.ops.tilelang.mamba3.mamba3_mimo"
    assert sys.modules["mamba_ssm.ops.tilelang.mamba3.mamba3_mimo_bwd"] is mods.bwd
    assert set(compat.MODULES) <= set(sys.modules)


def test_install_refuses_to_shadow_a_real_mamba_ssm(monkeypatch):
    monkeypatch.setitem(sys.modules, "mamba_ssm", types.ModuleType("mamba_ssm"))
    with pytest.raises(ImportError, match="a real mamba_ssm is already imported"):
        compat.install()


def test_whole_op_is_the_packages_op(mods, case):
    raw, x = case
    leaves = {n: (None if t is None else t.clone().requires_grad_()) for n, t in x.items()}
    out = mods.top.mamba3_mimo(*leaves.values(), raw["chunk_size"], raw["rotary_dim_divisor"], torch.bfloat16)
    out.backward(raw["dout"])
    want, grads, _ = _package_run(x, raw)
    assert torch.equal(out, want)
    for name, leaf in leaves.items():
        if leaf is not None:
            assert torch.equal(leaf.grad, grads[name]), name
    state = mods.top.mamba3_mimo(*x.values(), raw["chunk_size"], raw["rotary_dim_divisor"], "bfloat16",
                                 return_state=True)
    assert isinstance(state, tuple) and len(state) == 5 and torch.equal(state[0], want)
    one_sequence = mods.top.mamba3_mimo(*x.values(), raw["chunk_size"], raw["rotary_dim_divisor"], torch.bfloat16,
                                        cu_seqlens=torch.tensor([0, 32], dtype=torch.int32))
    assert torch.equal(one_sequence, want)  # varlen with one sequence is the plain op


def test_forward_returns_upstreams_triple(mods, case):
    raw, x = case
    C, d = raw["chunk_size"], raw["rotary_dim_divisor"]
    angles, da_cs, da_cs_rev, segsum = _preprocessed(mods, x, C)
    args = (x["Q"], x["K"], x["V"], x["Q_bias"], x["K_bias"], x["MIMO_V"], x["MIMO_Out"], x["Z"], x["D"],
            x["MIMO_Z"], angles, da_cs, da_cs_rev, x["DT"], x["Trap"], segsum, C, d)
    o, h, k_final = mods.fwd.mamba_mimo_forward(*args, torch.bfloat16, threads=256, num_stages=2)
    assert h is None and k_final is None and torch.equal(o, _package_run(x, raw)[0])
    o2, h, k_final = mods.fwd.mamba_mimo_forward(*args, "bfloat16", return_state=True)
    B, S, R, G, N = x["Q"].shape
    H, P = x["V"].shape[2:]
    assert torch.equal(o2, o)
    assert tuple(h.shape) == (B, H, N, P) and h.dtype == torch.float32
    assert tuple(k_final.shape) == (B, R, H, N) and k_final.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="does not match the dtype"):
        mods.fwd.mamba_mimo_forward(*args, torch.float16)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype or one of"):
        mods.fwd.mamba_mimo_forward(*args, "bf16")


@pytest.mark.parametrize("policy", ["upstream_sm90", "fp32", "fp64"])
def test_backward_combined_returns_upstreams_fourteen(mods, case, policy):
    raw, x = case
    C, d = raw["chunk_size"], raw["rotary_dim_divisor"]
    angles, da_cs, da_cs_rev, segsum = _preprocessed(mods, x, C)
    if policy == "fp64":  # the package's fp64 chain preprocesses in float64; so does the compat call then
        angles = angle_cumsum(x["Angles"], x["DT"], C, math_dtype=torch.float64)
        da_cs, da_cs_rev, segsum = dacs_segsum(x["ADT"], C, math_dtype=torch.float64)
    elif mn.presets.get(policy).helper_fma == "separate":  # the chain's angles under it: products rounded first
        angles = angle_cumsum(x["Angles"], x["DT"], C, math_dtype=torch.float32, fma=False)
    grads = mods.bwd.mamba_mimo_bwd_combined(
        raw["dout"], x["Q"], x["K"], x["V"], x["Q_bias"], x["K_bias"], x["MIMO_V"], x["MIMO_Out"], x["Z"],
        x["MIMO_Z"], angles, da_cs, da_cs_rev, x["DT"], x["Trap"], x["D"], segsum, C, d, torch.bfloat16,
        bf_threads=256, bf_num_stages=1, bb_threads=128, bb_num_stages=1, policy=policy)
    assert isinstance(grads, tuple) and len(grads) == 14
    dq, dk, dv, ddA, ddt, dtrap, dq_bias, dk_bias, dmimo_v, dmimo_z, dmimo_o, dangles, dD, dz = grads
    _, want, record = _package_run(x, raw, policy)
    if policy == "fp64":  # autograd casts .grad to the inputs' dtypes: the record holds the float64 gradients
        want = {n[1:]: record.get(f"mamba3_mimo_epilogue.{n}") for n in
                ("dQ", "dK", "dV", "dADT", "dTrap", "dQ_bias", "dK_bias", "dMIMO_V", "dMIMO_Z", "dMIMO_Out", "dD",
                 "dZ")}
    for got, name in ((dq, "Q"), (dk, "K"), (dv, "V"), (ddA, "ADT"), (dmimo_v, "MIMO_V"), (dmimo_z, "MIMO_Z"),
                      (dmimo_o, "MIMO_Out"), (dD, "D"), (dz, "Z"), (dtrap, "Trap")):
        assert torch.equal(got, want[name]), name
    for got, name in ((dq_bias, "Q_bias"), (dk_bias, "K_bias")):
        assert got.dtype == (torch.float64 if policy == "fp64" else torch.bfloat16), name  # upstream: lp sums
        assert torch.equal(got.to(want[name].dtype), want[name]), name
    assert torch.equal(ddt, record["mamba3_mimo_epilogue.ddt_core"])  # upstream's ddt: dDT without the angle part
    assert torch.equal(dangles, record["mamba_mimo_bwd_bwd.outputs.dangles"])


def test_preprocessing_helpers_are_the_packages(mods, case):
    raw, x = case
    C = raw["chunk_size"]
    for got, want in zip(mods.utils.compute_dacs_segsum_triton(x["ADT"], C),
                         dacs_segsum(x["ADT"], C, math_dtype=torch.float32)):
        assert torch.equal(got, want)
    angles, final = mods.angle_dt.angle_dt_fwd(x["Angles"], x["DT"], chunk_size=C, return_output_state=True)
    assert torch.equal(angles, angle_cumsum(x["Angles"], x["DT"], C, math_dtype=torch.float32))
    assert tuple(final.shape) == (x["V"].shape[0], x["V"].shape[2], x["Angles"].shape[-1])
    with pytest.raises(NotImplementedError, match="init_state"):
        mods.angle_dt.angle_dt_fwd(x["Angles"], x["DT"], init_state=final)


def test_use_policy_switches_every_compat_call(mods, case):
    raw, x = case
    C, d = raw["chunk_size"], raw["rotary_dim_divisor"]
    default = mods.top.mamba3_mimo(*x.values(), C, d, torch.bfloat16)
    with compat.use_policy("fp32"):
        assert compat.default_policy().name == "fp32"
        inside = mods.top.mamba3_mimo(*x.values(), C, d, torch.bfloat16)
    assert torch.equal(inside, _package_run(x, raw, "fp32")[0]) and not torch.equal(inside, default)
    assert compat.default_policy().name == compat.DEFAULT_POLICY
    with pytest.raises(ValueError, match="unknown preset"):
        with compat.use_policy("sm90"):
            pass
    with pytest.raises(ValueError, match="backend must be"):
        compat.set_default_policy("fp32", backend="cuda")


def test_pytest_option_points_a_test_file_at_the_compat_layer(tmp_path):
    """A test file written against upstream (it imports ``mamba_ssm``) runs with ``--mamba-ssm-compat``."""
    test = tmp_path / "test_upstream_style.py"
    test.write_text(textwrap.dedent("""
        import mamba_ssm.ops.tilelang.mamba3.mamba3_mimo as top
        from mimo_numerics import compat

        def test_imports_resolve():
            assert top.__name__.startswith("mimo_numerics.compat.")
            assert compat.default_policy().name == "fp32"
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
                           "--mamba-ssm-compat", "--mamba-ssm-compat-policy", "fp32"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
                          "--mamba-ssm-compat-policy", "fp32"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "needs --mamba-ssm-compat" in bad.stdout + bad.stderr


def _runner():
    """``scripts/run_upstream_op_tests.py`` as a module (the tests import scripts this way; scripts never do)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "run_upstream_op_tests.py"
    spec = importlib.util.spec_from_file_location("run_upstream_op_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_upstream_test_adaptation_rewrites_only_what_it_says():
    """The runner's CPU adaptation on a file shaped like upstream's (written here, not upstream's text)."""
    runner = _runner()
    source = textwrap.dedent("""
        FIXED_B = 4
        FIXED_S = 2048
        FIXED_H = 16

        def _require():
            if not torch.cuda.is_available():
                pytest.skip("CUDA is required")
            pytest.importorskip("tilelang")
            pytest.importorskip("triton")

        x = torch.zeros(3, device="cuda")
    """)
    cpu = runner.adapt(source, "cpu")
    assert "FIXED_B = 1" in cpu and "FIXED_S = 128" in cpu and "FIXED_H = 2" in cpu
    assert 'device="cpu"' in cpu and "importorskip" not in cpu and "is_available" not in cpu
    cuda = runner.adapt(source, "cuda")
    assert "FIXED_S = 2048" in cuda and 'device="cuda"' in cuda and "importorskip" not in cuda
    with pytest.raises(ValueError, match="skip was not found"):
        runner.adapt("FIXED_B = 4\n", "cpu")


def test_rotary_step_is_upstreams_call_on_the_policy_step():
    """``apply_rotary_qk_inference_fwd`` as ``Mamba3.step`` calls it (MIMO: ``rotate_pairwise=False``): the policy
    step's rotary part, upstream's dtypes (q's lp, the float32 angle state), and ``inplace`` writing the inputs."""
    from mimo_numerics.ops.mamba3_mimo.decode import rotary_step

    compat.install()
    try:
        import mamba_ssm.ops.triton.mamba3.mamba3_mimo_rotary_step as rotary
    finally:
        compat.uninstall()
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, 4, 3, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    state, proj = torch.rand(2, 3, 4, generator=gen) * 6, torch.randn(2, 3, 4, generator=gen)
    dt, bias = torch.rand(2, 3, generator=gen) / 10, torch.randn(4, 3, 16, generator=gen) / 8
    got = rotary.apply_rotary_qk_inference_fwd(q, k, state, proj, dt, bias, bias, rotate_pairwise=False)
    want = rotary_step(q, k, state, proj, dt, bias, bias, rotate_pairwise=False, policy="upstream_sm90")
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16, torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    q2, k2, s2 = q.clone(), k.clone(), state.clone()
    written = rotary.apply_rotary_qk_inference_fwd(q2, k2, s2, proj, dt, bias, bias, inplace=True,
                                                   rotate_pairwise=False)
    assert written[0] is q2 and written[2] is s2 and all(torch.equal(a, b) for a, b in zip(written, got))
    q64 = rotary.apply_rotary_qk_inference_fwd(q, k, state, proj, dt, policy="fp64")
    assert all(t.dtype == torch.float64 for t in q64)
