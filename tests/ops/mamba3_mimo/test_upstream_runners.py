"""The upstream runners of the forward and of stage 2 (``ops/mamba3_mimo/upstream.py``), on the CPU.

``run_forward`` and ``run_stage2`` launch the real TileLang kernels, which need CUDA; here the upstream modules are
replaced by stand-ins that record what they receive and answer with the policy reference's outputs, so the tests
check the runners' own work: input validation before anything else, the argument order and contiguity, the
compile-time constants, the output buffers (shapes, dtypes, the ``[B, S·R, H, N]`` views of ``dq``/``dk``, NaN
poison), the mapping of compile failures to ``UpstreamUnsupported`` / ``UpstreamError``, and the kernel cache. The
stage-2 argument positions are checked against ``_STAGE2_OUTPUTS`` / ``_STAGE2_INPUTS_KEPT``, the positions the
whole-op golden data was captured at from upstream's own ``mamba_mimo_bwd_combined`` call, and against the kernel
signature (``mamba3_mimo_bwd.py`` L536-566) written out below.
"""

from types import SimpleNamespace

import pytest
import torch

from mimo_numerics import operator, presets
from mimo_numerics.bundles import bit_identical
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba3_mimo import upstream as runners

FWD = operator.get("mamba_mimo_fwd")
STAGE2 = operator.get("mamba_mimo_bwd_bwd")
SPEC = CaseSpec(seqlen=12, state_dim=16, value_dim=8, rank=2, chunk_size=4, has_z=True, has_d=True)
BARE = CaseSpec(seqlen=10, state_dim=16, value_dim=8, rank=1, chunk_size=4, reduce_o=False)
#: Positions of stage 2's inputs in the kernel's parameter list (DOUT, Q, K, V, Q_BIAS, K_BIAS, MIMO_V, MIMO_O, DK,
#: DV, DMIMO_V, STATES, DQ, Z, MIMO_Z, ANGLES, DA_CS, DA_CS_REV, DT, TRAP, DFACTOR, DGAMMA_DIAG, DANGLES, D, DD,
#: QK_DOT, DDA, DSSDA, DDA_CS_REV, DDA_CS, SEGSUM).
STAGE2_INPUT_POSITIONS = {"dout": 0, "q": 1, "k": 2, "v": 3, "q_bias": 4, "k_bias": 5, "mimo_v": 6, "mimo_o": 7,
                          "states": 11, "z": 13, "mimo_z": 14, "angles": 15, "da_cs": 16, "da_cs_rev": 17, "dt": 18,
                          "trap": 19, "d": 23, "qk_dot": 25, "segsum": 30}


@pytest.fixture
def no_cuda_check(monkeypatch):
    monkeypatch.setattr(runners, "check_cuda", lambda device=None: None)
    monkeypatch.setattr(runners, "_stage2_kernels", {})


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout."""
    wide = torch.zeros(t.shape + (2,), dtype=t.dtype)
    wide[..., 0] = t
    return wide[..., 0]


# ---------------------------------------------------------------------------------------------------------- forward
class StandInForward:
    """``mamba_mimo_forward`` of upstream, answered by the forward reference under upstream_sm90."""

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def mamba_mimo_forward(self, *args, chunk_size, rotary_dim_divisor, dtype, return_state=False):
        self.calls.append(dict(args=args, chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor, dtype=dtype,
                               return_state=return_state))
        if self.fail is not None:
            raise self.fail
        inputs = dict(zip(FWD.input_names, args), chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor)
        return FWD.run_reference(inputs, presets.get("upstream_sm90")).o, None, None


@pytest.mark.parametrize("spec", [SPEC, BARE], ids=lambda s: s.case_id)
def test_run_forward_passes_upstreams_arguments(monkeypatch, no_cuda_check, spec):
    stand_in = StandInForward()
    monkeypatch.setattr(runners, "forward_module", lambda source_dir=None, check_hash=True: stand_in)
    inputs = FWD.draw(spec)
    inputs["dt"] = _strided(inputs["dt"])
    out = runners.run_forward(*FWD.args(inputs), **FWD.kwargs(inputs))
    [call] = stand_in.calls
    assert len(call["args"]) == 16 and call["return_state"] is False
    for name, given in zip(FWD.input_names, call["args"]):
        assert bit_identical(given, inputs[name]), name
        assert given is None or given.is_contiguous(), name
    assert (call["chunk_size"], call["rotary_dim_divisor"], call["dtype"]) == (4, 4, torch.bfloat16)
    assert out._fields == ("o",) and type(out).__name__ == "MimoFwdOutputs"
    expected = FWD.run_reference(inputs, presets.get("upstream_sm90")).o
    assert bit_identical(out.o, expected)
    assert runners.last_launch == {"kernel": "mamba_mimo_forward", "dtype": "bfloat16"}


def test_run_forward_maps_compile_failures(monkeypatch, no_cuda_check):
    inputs = FWD.draw(SPEC)
    check = RuntimeError("InternalError: Check failed: (m_warp * n_warp == num_warps) is false: m_warp * n_warp "
                         "must equal num_warps")
    monkeypatch.setattr(runners, "forward_module", lambda source_dir=None, check_hash=True: StandInForward(check))
    with pytest.raises(runners.UpstreamUnsupported, match=r"does not compile mamba_mimo_fwd for N=16 P=8 R=2 C=4 "
                                                          r"dtype=bfloat16: .*m_warp \* n_warp"):
        runners.run_forward(*FWD.args(inputs), **FWD.kwargs(inputs))
    other = RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(runners, "forward_module", lambda source_dir=None, check_hash=True: StandInForward(other))
    with pytest.raises(runners.UpstreamError, match="failed to compile or run") as info:
        runners.run_forward(*FWD.args(inputs), **FWD.kwargs(inputs))
    assert not isinstance(info.value, runners.UpstreamUnsupported) and info.value.__cause__ is other


def test_run_forward_validates_before_looking_for_cuda(monkeypatch):
    inputs = FWD.draw(SPEC)
    bad = dict(inputs, k=inputs["k"].float())
    with pytest.raises(TypeError, match="k must have dtype"):
        runners.run_forward(*FWD.args(bad), **FWD.kwargs(bad))
    if not torch.cuda.is_available():
        with pytest.raises(runners.UpstreamUnavailable, match="runs on CUDA only; the inputs are on cpu"):
            runners.run_forward(*FWD.args(inputs), **FWD.kwargs(inputs))


# ---------------------------------------------------------------------------------------------------------- stage 2
class StandInStage2:
    """The module of ``mamba_mimo_bwd_bwd``: records the compile arguments; its kernel records the launch and writes
    the stage-2 reference's outputs (upstream_sm90) into the output buffers at the golden capture positions."""

    def __init__(self):
        self.compiled, self.launches = [], []
        self.T = SimpleNamespace(dynamic=lambda name: f"dynamic {name}")

    def mamba_mimo_bwd_bwd(self, *compile_args):
        self.compiled.append(compile_args)

        def kernel(*args):
            self.launches.append(args)
            inputs = {name: args[i] for name, i in STAGE2_INPUT_POSITIONS.items()}
            C, divisor = compile_args[10], compile_args[11]
            out = STAGE2.run_reference(dict(inputs, chunk_size=C, rotary_dim_divisor=divisor),
                                       presets.get("upstream_sm90"))
            self.untouched = {name: args[i].clone() for name, i in runners._STAGE2_OUTPUTS.items()
                              if args[i] is not None}
            for name, i in runners._STAGE2_OUTPUTS.items():
                if args[i] is not None:
                    args[i].copy_(getattr(out, name).reshape(args[i].shape))
            self.expected = out

        return kernel


@pytest.mark.parametrize("spec", [SPEC, BARE], ids=lambda s: s.case_id)
def test_run_stage2_launches_the_kernel_as_upstream_does(monkeypatch, no_cuda_check, spec):
    stand_in = StandInStage2()
    monkeypatch.setattr(runners, "stage2_module", lambda source_dir=None, check_hash=True: stand_in)
    inputs = STAGE2.draw(spec)
    inputs["segsum"] = _strided(inputs["segsum"])
    out = runners.run_stage2(*STAGE2.args(inputs), **STAGE2.kwargs(inputs))
    B, S, R, H, N, P = spec.batch, spec.seqlen, spec.rank, spec.heads, spec.state_dim, spec.value_dim
    [compile_args] = stand_in.compiled
    assert compile_args == ("dynamic B", "dynamic S", "dynamic H", "dynamic G", N, P, R, spec.has_z, spec.has_d,
                            spec.reduce_o, spec.chunk_size, spec.rotary_dim_divisor, "bfloat16", 256, 0)
    [args] = stand_in.launches
    assert len(args) == 31
    for name, i in STAGE2_INPUT_POSITIONS.items():
        assert bit_identical(args[i], inputs[name]), name
        assert args[i] is None or args[i].is_contiguous(), name
    for name, i in runners._STAGE2_INPUTS_KEPT.items():
        assert STAGE2_INPUT_POSITIONS[name] == i
    buffers = {name: stand_in.untouched.get(name) for name in runners._STAGE2_OUTPUTS}
    assert buffers["dq"].shape == buffers["dk"].shape == (B, S * R, H, N) and buffers["dq"].dtype == torch.bfloat16
    assert buffers["dv"].shape == (B, S, H, P) and buffers["dmimo_v"].dtype == torch.float32
    for name in ("dq", "dk", "dv", "dmimo_v") + (("dD",) if spec.has_d else ()):  # torch.empty upstream: poisoned
        assert torch.isnan(buffers[name]).all(), name
    for name in ("dangles", "dfactor", "dgamma_diag", "ddA", "dSSdA", "ddA_cs_rev", "ddA_cs"):  # zeros upstream
        assert not buffers[name].any(), name
    assert (args[24] is None) == (not spec.has_d) and (args[7] is None) == (not spec.reduce_o)
    assert type(out).__name__ == "MimoBwdBwdOutputs" and out.dq.shape == (B, S, R, H, N)
    for name in STAGE2.output_names:  # what the kernel wrote into the buffers is what comes back, by name
        assert bit_identical(getattr(out, name), getattr(stand_in.expected, name)), name
    assert runners.last_launch["kernel"] == "mamba_mimo_bwd_bwd" and runners.last_launch["threads"] == 256
    runners.run_stage2(*STAGE2.args(inputs), **STAGE2.kwargs(inputs))
    assert len(stand_in.compiled) == 1 and len(stand_in.launches) == 2  # compiled once per sizes


def test_run_stage2_compile_failure_and_validation(monkeypatch, no_cuda_check):
    class Failing(StandInStage2):
        def mamba_mimo_bwd_bwd(self, *compile_args):
            raise RuntimeError("Check failed: (stride == 4 || stride % 8 == 0) is false: stride=18")

    monkeypatch.setattr(runners, "stage2_module", lambda source_dir=None, check_hash=True: Failing())
    inputs = STAGE2.draw(SPEC)
    with pytest.raises(runners.UpstreamUnsupported, match="does not compile mamba_mimo_bwd_bwd for N=16 P=8 R=2 C=4"):
        runners.run_stage2(*STAGE2.args(inputs), **STAGE2.kwargs(inputs))
    bad = dict(inputs, qk_dot=inputs["qk_dot"][..., :1])
    with pytest.raises(ValueError, match="qk_dot must have shape"):
        runners.run_stage2(*STAGE2.args(bad), **STAGE2.kwargs(bad))


def test_runner_source_info_hashes_the_whole_ops_files(tmp_path):
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream as stage1

    root = tmp_path / "src"
    for _, path, _ in runners.FILES[:2]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"# {path}\n")
    (root / stage1.KERNEL_RELPATH).parent.mkdir(parents=True, exist_ok=True)
    (root / stage1.KERNEL_RELPATH).write_text("# kernel\n")
    info = runners.source_info(root)
    assert info["source_dir"] == str(root)
    hashes = info["files_sha256"]
    assert list(hashes) == [path for _, path, _ in runners.FILES]
    assert all(len(hashes[path]) == 64 for _, path, _ in runners.FILES[:2])
    assert hashes[stage1.KERNEL_RELPATH] == info["kernel_sha256"]
    assert hashes[runners.FILES[3][1]] is None  # absent here
