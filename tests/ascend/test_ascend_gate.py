"""The Ascend compile gate (scripts/ascend_compile_gate.py) passes good kernels and catches bad ones.

Runs only in the triton-ascend environment (see conftest.py); compiles take well under a second each.
"""

import importlib
import importlib.metadata as md
import importlib.util
import sys
from pathlib import Path

import pytest

try:
    md.version("triton-ascend")
except md.PackageNotFoundError:
    pytest.skip("needs the triton-ascend compile environment (scripts/setup_ascend_env.sh)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import toy_kernels  # noqa: E402

_spec = importlib.util.spec_from_file_location("ascend_compile_gate", ROOT / "scripts" / "ascend_compile_gate.py")
gate = importlib.util.module_from_spec(_spec)
sys.modules["ascend_compile_gate"] = gate
_spec.loader.exec_module(gate)

PARTS = gate.DEFAULT_PARTS

pytestmark = pytest.mark.ascend_compile


def test_environment_is_triton_ascend_with_bishengir():
    info = gate.check_environment()
    assert info["triton-ascend"] == "3.2.0"
    assert Path(info["bishengir-compile"]).is_file()


def test_the_gate_refuses_kernels_of_another_checkout(tmp_path):
    """An editable install made from another checkout maps ``mimo_numerics.kernels`` there; the gate would compile
    that checkout's kernels under this one's commit, so it stops with a clear error instead."""
    gate.check_kernels_source(ROOT)
    with pytest.raises(gate.GateEnvironmentError, match="another checkout"):
        gate.check_kernels_source(tmp_path)


@pytest.mark.parametrize("part", PARTS)
def test_good_kernels_reach_hivmc(part):
    results = gate.run_gate(toy_kernels.plans_ok(), parts=(part,))
    assert len(results) == 2
    for r in results:
        assert r.ok, r.describe()
        assert r.stage in ("hivmc", "binary")


def test_fit_only_without_multibuffering_passes_and_is_flagged():
    r = gate.compile_plan(toy_kernels.plan_fits_without_multibuffer(), PARTS[0])
    assert r.ok and r.no_multibuffer, r.describe()
    assert r.ub_peak_bytes is not None and r.ub_peak_bytes <= gate.UB_BITS // 8
    assert gate.compile_plan(toy_kernels.plans_ok()[0], PARTS[0]).no_multibuffer is False


@pytest.mark.parametrize("part", PARTS)
def test_gate_catches_unified_buffer_overflow(part):
    r = gate.compile_plan(toy_kernels.plan_oversized(), part)
    assert not r.ok
    assert r.stage == "bishengir"
    assert r.ub_required_bits is not None and r.ub_required_bits > gate.UB_BITS
    text = r.describe()
    assert "toy_oversized_tile" in text and "R=128 C=256" in text and part in text
    assert f"requires {r.ub_required_bits} bits" in text
    assert "ub overflow" in r.message


def test_gate_catches_fp64_rejected_by_bishengir():
    r = gate.compile_plan(toy_kernels.plan_fp64(), PARTS[0])
    assert not r.ok and r.stage == "bishengir" and r.ub_required_bits is None
    # the compiler's own message comes first, not buried in a stack dump
    first = r.message.splitlines()[0]
    assert "unsupported datatype" in first and "ExtFOp" in first, r.message


def test_gate_catches_tf32_dot_rejected_by_frontend():
    r = gate.compile_plan(toy_kernels.plan_tf32(), PARTS[0])
    assert not r.ok and r.stage == "frontend"
    assert "hf32" in r.message and "toy_tf32_dot" in r.describe()


def test_grid_over_ascend_cap_fails_without_compiling():
    plan = dict(toy_kernels.plans_ok()[0], grid=(70000,))
    r = gate.compile_plan(plan, PARTS[0])
    assert not r.ok and r.stage == "grid" and "65535" in r.message


def test_classifier():
    probe = ("[ERROR] Cannot find hivmc under $PATH \n[ERROR] Failed to run `hivmc --version`.\n"
             "[WARNING] Failed to detect hivmc version for backward compatibility\n")
    stop = ('[ERROR] Cannot find hivmc under $PATH \nloc("k.mlir":1:1): error: External hivmc run fails, '
            "returning module before running external compiler\n[ERROR] Failed to run BiShengIR pipeline\n")
    assert gate.classify_bishengir(1, probe + stop, False)[:2] == (True, "hivmc")
    # the start-up probe alone is not the stop at hivmc
    ok, stage, msg, _ = gate.classify_bishengir(134, probe + "LLVM ERROR: unsupported datatype\n", False)
    assert not ok and msg.startswith("LLVM ERROR: unsupported datatype")
    # any other error before the stop fails
    assert not gate.classify_bishengir(1, probe + 'loc("k":2:3): error: something else\n' + stop, False)[0]
    ok, _, _, ub = gate.classify_bishengir(
        1, probe + 'error: ub overflow, requires 2097152 bits while 1572864 bits available!\n', False)
    assert not ok and ub == 2097152
    assert not gate.classify_bishengir(1, "", False)[0]
    assert gate.classify_bishengir(0, "", True)[:2] == (True, "binary")


def test_cli_exit_status_and_report(tmp_path, capsys):
    report = tmp_path / "report.md"
    rc = gate.main(["--plans", "tests.ascend.toy_kernels:plans", "--parts", ",".join(PARTS),
                    "--report", str(report), "--quiet", "--jobs", "1"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "toy_oversized_tile [R=128 C=256 fp32] on Ascend910B3: FAIL" in out
    text = report.read_text()
    assert "| toy_add | BLOCK=1024 |  | Ascend910B3 | pass | hivmc |" in text
    assert "| toy_add | BLOCK=1024 |  | Ascend910_9382 | pass | hivmc |" in text
    assert "| Ascend910B3 | 5 | 2 | 3 |" in text
    rc = gate.main(["--plans", "tests.ascend.toy_kernels:plans_ok", "--no-report", "--quiet"])
    assert rc == 0


def test_identical_specializations_compile_once():
    plan = toy_kernels.plans_ok()[0]
    a, b = dict(plan, group="preset_a"), dict(plan, group="preset_b")
    kept = gate.dedupe_plans([gate.as_plan(a), gate.as_plan(b)])
    assert len(kept) == 1 and kept[0].group == "preset_a, preset_b"
    # a different runtime-int specialisation (n = 1024 is a multiple of 16, 1000 is not) is a different compile
    c = dict(plan, args=plan["args"][:3] + (1024,))
    assert len(gate.dedupe_plans([gate.as_plan(a), gate.as_plan(c)])) == 2


def test_project_launcher_enumerates_every_kernel_and_preset():
    """The gate gets its specializations from the launcher (build_launches with backend="npu")."""
    plans = gate.project_plans(scope="ci")
    kernels = {p.kernel_name for p in plans}
    launcher = importlib.import_module("mimo_numerics.kernels.mimo_bwd_fwd")
    assert len(kernels) >= 3, kernels
    assert {p.group for p in plans} == set(gate.GATE_PRESETS)
    for p in plans:
        assert type(p.kernel).__name__ == "JITFunction", p.kernel    # compiled kernels, not interpreted copies
        assert 1 <= p.grid[0] <= gate.MAX_PROGRAMS
    # every constexpr the launcher passes is a parameter of the kernel
    for p in plans:
        assert set(p.kwargs) <= set(p.kernel.arg_names)
    assert hasattr(launcher, "build_launches")


def test_forward_ci_cases_cover_every_branch_and_forward_preset():
    """The forward's CI scope: every branch combination, every preset with forward semantics; its plans are the
    forward launcher's (``fwd_`` labels, the output kernel with FORWARD)."""
    from mimo_numerics import presets

    cases = gate.FORWARD_CI_CASES
    assert {c[5:] for c in cases} == set(gate.GATE_BRANCHES)
    assert {c[0] for c in cases} == {p for p in gate.GATE_PRESETS if presets.get(p).defines("mamba_mimo_fwd")}
    plans = gate.project_plans(scope="ci", operators=("mamba_mimo_fwd",))
    assert plans and all(p.name.startswith("fwd_") for p in plans)
    outs = [p for p in plans if p.kernel_name == "_mimo_out_kernel"]
    assert len(outs) == len(cases) and all(p.kwargs["FORWARD"] for p in outs)
    # return_state: the state walk with FINAL, planned for the cases of FORWARD_FINAL_STATE_CASES only
    finals = [p for p in plans if p.kwargs.get("FINAL")]
    assert len(finals) == len(gate.FORWARD_FINAL_STATE_CASES)
    assert all(p.kernel_name == "_mimo_state_kernel" and p.name.startswith("fwd_final_") for p in finals)
    with pytest.raises(ValueError, match="operators"):
        gate.project_plans(scope="ci", operators=("mamba_mimo_chunk_scan",))
    # stage 2's launches build for Ascend from CPU tensors, with the Ascend tile plan (row and token blocks)
    stage2 = gate.project_plans(scope="ci", operators=("mamba_mimo_bwd_bwd",))
    assert stage2 and all(p.name.startswith("bwd2_") for p in stage2)
    assert {p.kernel_name for p in stage2} >= {
        "_bwd2_rows_kernel", "_bwd2_kside_kernel", "_bwd2_qside_kernel", "_bwd2_token_kernel"}


def test_ci_cases_cover_every_preset_branch_dim_and_tile_class():
    cases = gate.ci_cases()
    assert {c[0] for c in cases} == set(gate.GATE_PRESETS)
    assert {c[5:] for c in cases} == set(gate.GATE_BRANCHES)
    assert {c[1] for c in cases} == set(gate.GATE_DIMS) and {c[2] for c in cases} == set(gate.GATE_DIMS)
    # every padded fused-row / token-row tile class (LP, CP) at the largest N = P
    def tiles(c, r):
        pow2 = lambda x: max(16, 1 << (x - 1).bit_length())
        return pow2(c * r), pow2(c)
    assert {tiles(c, r) for _, n, p, c, r, *_ in cases if n == p == 128} == {tiles(c, r) for c, r in gate.GATE_CR}
    assert any((c * r) & (c * r - 1) for _, _, _, c, r, *_ in cases)      # a padded non-power-of-two C·R
    assert set(cases) <= set(gate.full_cases()) and set(gate.wide_cases()) <= set(gate.full_cases())


def test_bounds_scope_is_every_size_class_stage2_accepts_on_npu():
    """``--scope bounds``: every N × P × (C, R) with the heaviest branches; the stage-2 plans it yields are exactly
    the size classes ``backend_refusal`` lets through, each with the kernels' Ascend tile plan."""
    from mimo_numerics.kernels import mimo_bwd_bwd

    cases = gate.bounds_cases()
    assert len(cases) == len(gate.GATE_DIMS) ** 2 * len(gate.GATE_CR) and set(cases) <= set(gate.full_cases())
    accepted = {(n, p, c, r) for _, n, p, c, r, *_ in cases if not mimo_bwd_bwd.backend_refusal("npu", n, p, c * r)}
    plans = gate.project_plans(scope="bounds", operators=("mamba_mimo_bwd_bwd",))
    kside = [pl for pl in plans if pl.kernel_name == "_bwd2_kside_kernel"]
    assert {(pl.kwargs["N"], pl.kwargs["P"], pl.kwargs["C"], pl.kwargs["R"]) for pl in kside} == accepted
    for pl in kside:
        assert pl.kwargs["BR"] == mimo_bwd_bwd.npu_tiles(pl.kwargs["LP"], pl.kwargs["CP"]).rows
    for pl in (pl for pl in plans if pl.kernel_name == "_bwd2_token_kernel"):
        assert pl.kwargs["BT"] == mimo_bwd_bwd.npu_tiles(pl.kwargs["LP"], pl.kwargs["CP"]).tokens


def test_ub_peak_reads_planned_offsets_and_sizes():
    hivm = """
    %c0_i64 = arith.constant 0 : i64
    %c4096_i64 = arith.constant 4096 : i64
    %c8192_i64 = arith.constant 8192 : i64
    %1 = hivm.hir.pointer_cast(%c0_i64) : memref<1024xf32, #hivm.address_space<ub>>
    %2 = hivm.hir.pointer_cast(%c4096_i64, %c8192_i64) : memref<16x64xbf16, #hivm.address_space<ub>>
    %3 = hivm.hir.pointer_cast(%c8192_i64) : memref<32x16x256xi1, #hivm.address_space<ub>>
    %4 = hivm.hir.pointer_cast(%c0_i64) : memref<1x2x16x16xf32, #hivm.address_space<cc>>
    """
    # bf16 16x64 at 8192 ends at 10240; i1 bits are packed: 32*16*256/8 = 16384 bytes from 8192 -> 24576
    assert gate.ub_peak_bytes(hivm) == 24576
    assert gate.ub_peak_bytes("no buffers") is None


def test_max_failures_skips_the_rest_and_still_fails():
    plans = [toy_kernels.plan_tf32(), toy_kernels.plan_fp64(), toy_kernels.plans_ok()[0]]
    results = gate.run_gate(plans, parts=PARTS, max_failures=1)
    assert [r.status for r in results] == ["FAIL", "FAIL", "skipped", "skipped", "skipped", "skipped"]


def test_an_adapter_abort_on_an_internal_assertion_counts_as_a_tool_crash():
    """The gate compiles a plan again when triton-adapter-opt aborts on an MLIR assertion (a nondeterministic tool
    crash measured in CI), never on a diagnostic about the kernel or at another stage."""
    crash = ("triton-adapter-opt: .../mlir/IR/TypeSupport.h:173: const AbstractType &mlir::TypeStorage::"
             "getAbstractType(): Assertion `abstractType && \"Malformed type storage object.\"' failed.")
    assert gate.is_tool_crash("ttadapter", crash)
    assert not gate.is_tool_crash("ttir", crash)
    assert not gate.is_tool_crash("ttadapter", "error: 'tt.load' op operand #0 must be ptr")
    assert gate.TOOL_CRASH_RETRIES >= 1


def test_a_crash_on_a_signal_without_an_assertion_counts_as_a_tool_crash():
    """The CI run of 2026-12-07 hit an adapter crash with LLVM's stack dump and no assertion line (the k-side kernel
    of bwd2_N16_P16_R2_C8_roZ-, which compiled in nine isolated runs after it): the banner, the dump, or the end of
    a long dump (frames in the tool) mark it; a diagnostic about the kernel does not."""
    frames = "\n".join(f"#{i} 0x000055f677cad54e (.../triton-adapter-opt+0xa1f54e)" for i in range(30, 50))
    crash = ("PLEASE submit a bug report to https://github.com/llvm/llvm-project/issues/ and include the crash "
             "backtrace.\nStack dump:\n0.\tProgram arguments: triton-adapter-opt ...\n" + frames)
    assert gate.is_tool_crash("ttadapter", crash)
    assert gate.is_tool_crash("ttadapter", gate._tail(crash, 300))
    assert not gate.is_tool_crash("ttir", crash)
    assert not gate.is_tool_crash("ttadapter", "loc(\"kernel.py\":12:5): error: failed to legalize operation 'tt.dot'")


def test_a_crash_with_a_long_stack_dump_is_still_a_tool_crash_and_is_compiled_again(monkeypatch):
    """A wide-scope run (2026-12-05) hit an adapter abort whose stack dump pushed the assertion line out of the
    summarized message: the gate did not recognize the crash and did not compile the plan again (in isolation the
    plan compiles). The crash is judged on the whole output, and the summary keeps the assertion line first."""
    dump = "\n".join(f"#{i} 0x000055fd2b6fd192 (.../triton-adapter-opt+0x1ae4192)" for i in range(200))
    output = ("triton-adapter-opt: .../TypeSupport.h:173: Assertion `abstractType && \"Malformed type storage "
              "object.\"' failed.\nPLEASE submit a bug report\nStack dump:\n" + dump)
    summary = gate.summarize_failure(output)
    assert summary.splitlines()[0].startswith("triton-adapter-opt: .../TypeSupport.h:173: Assertion")
    assert gate.is_tool_crash("ttadapter", summary)

    calls = []
    plan = toy_kernels.plans_ok()[0]
    real = gate.compile_frontend

    def crash_then_compile(p, part):
        calls.append(part)
        if len(calls) == 1:
            return gate._Frontend(None, None, "ttadapter", gate._tail(output, 2000), 0.0, tool_crash=True)
        return real(p, part)

    monkeypatch.setattr(gate, "compile_frontend", crash_then_compile)
    results = gate.run_gate([plan], parts=PARTS[:1])
    assert len(calls) == 2 and [r.ok for r in results] == [True]


def test_reports_name_no_machine_paths():
    """A tool's stack dump prints absolute paths into a failure's message; the report replaces them."""
    text = f"#23 0x1 ({sys.prefix}/lib/site-packages/triton-adapter-opt+0x1)\nsee {ROOT}/kernels/_config.py"
    cleaned = gate.without_machine_paths(text)
    assert sys.prefix not in cleaned and str(ROOT) not in cleaned
    assert "<venv>/lib/site-packages/triton-adapter-opt" in cleaned and "<repo>/kernels/_config.py" in cleaned
