"""Tolerances of the whole op ``mamba3_mimo`` (autograd function, golden gates), with the measurements behind them.

They join the project's one table, :data:`mimo_numerics.tolerances.TOLERANCES`, when this module is imported
(``autograd.py`` imports it), so tests read them with ``mimo_numerics.tolerances.get(name)`` like every other.
(The block is kept here because the generic module is edited by others in parallel; it can move into
``mimo_numerics/tolerances.py`` unchanged.)
"""

from __future__ import annotations

from ...tolerances import TOLERANCES, Tolerance

WHOLE_OP_TOLERANCES = {
    "whole_op_fp64_vs_autograd_rel_rms": Tolerance(
        1e-10,
        "mamba3_mimo(policy='fp64') backward (the recorded float64 epilogue outputs) vs torch autograd of "
        "fp64_model.mamba3_mimo_fp64, every gradient, the 5 fast cases of tests/test_mamba3_mimo_autograd.py "
        "(every branch, G = 1 and G = H, R in {1, 2, 4, 8}, N in {32, 64}, bf16 and fp16): max 1.1e-15 "
        "(2026-12-01, CPU): FP64 summation order only",
        "tests/test_mamba3_mimo_autograd.py::test_fp64_backward_equals_autograd_of_the_fp64_model"),
    "whole_op_golden_fp32_over_sm90_ratio_min": Tolerance(
        3.0,
        "issue 18 acceptance 1. rel RMS to the golden upstream autograd (Out and the 14 gradients, 100 pairs over "
        "the 7 cases), fp32 preset / upstream_sm90, the op run from the raw inputs: min 3.5 (dK_bias of "
        "g_..._seedformula, 6.65e-3 / 1.90e-3), next 4.0 (dV of g_..._nored_z), median ~11 (2026-12-01, CPU; "
        "reports/mamba3_mimo_golden.md)",
        "tests/test_mamba3_mimo_autograd.py::test_golden_upstream_sm90_is_closer_than_fp32; "
        "scripts/measure_whole_op_golden.py"),
    "whole_op_golden_sm90_rel_rms": Tolerance(
        2e-3,
        "issue 18 acceptance 1, on Out, dQ, dK, dV, dZ, dQ_bias, dK_bias, dMIMO_V, dMIMO_Z, dMIMO_Out: "
        "upstream_sm90 from the raw inputs vs the golden upstream autograd: max 1.90e-3 (dK_bias of "
        "g_..._seedformula: one flipped dPhiO rounding in stage 2, 1.9e-3 also on upstream's own preprocessing), "
        "next 1.54e-3 (dQ_bias, same case), 1.38e-3 (dV of g_..._nored_z); the other cases <= 1.1e-3. Upstream's "
        "own run-to-run spread (two H200 processes, device_runs/run2): <= 3.0e-4 (2026-12-01, CPU)",
        "tests/test_mamba3_mimo_autograd.py::test_golden_upstream_sm90_within_gate; "
        "scripts/measure_whole_op_golden.py"),
}

TOLERANCES.update(WHOLE_OP_TOLERANCES)
