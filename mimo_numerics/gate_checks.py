"""How the accuracy gates (:mod:`mimo_numerics.testing`) run one case: call ``fn``, check each output's structure
and both gates (:func:`check_output`, :func:`run_case`)."""

from __future__ import annotations

import functools
import math
import time
import traceback
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch

from .gate_cases import as_output_dict, case_inputs, oracle_outputs, reference_outputs
from .gate_noise import self_noise
from .gate_report import CaseResult, OutputCheck
from .gate_settings import GateSettings, SettingsByOutput
from .metrics import max_abs, rel_rms
from .policy import RoundingPolicy

__all__ = ["DTYPE_MISMATCH", "check_output", "run_case"]

#: What :func:`run_case` does with a case whose dtype differs from the policy's ``lp_dtype``.
DTYPE_MISMATCH = ("skip", "adapt")


def _expected_dtype_reason(name: str, policy: RoundingPolicy, op) -> str:
    if not policy.round_outputs:
        return "round_outputs=False: unrounded outputs in the math dtype"
    if name in op.lp_outputs:
        return f"the policy's lp_dtype {policy.lp_dtype}"
    return "FP32 accumulation output"


def _first_index(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def check_output(name: str, got, ref: Optional[torch.Tensor], oracle: Optional[torch.Tensor],
                  noise_of: Callable[[], Tuple[float, str]], policy: RoundingPolicy, device: torch.device,
                  settings: GateSettings, op) -> OutputCheck:
    if ref is None:
        if got is None:
            return OutputCheck(name, "absent")
        kind = type(got).__name__ if not isinstance(got, torch.Tensor) else f"tensor {list(got.shape)}"
        return OutputCheck(name, "FAIL", (f"returned a {kind} but the reference has no {name} for this case "
                                          "(branch off): expected None",))
    if got is None:
        return OutputCheck(name, "FAIL", (f"missing (None) but the reference has {name} {list(ref.shape)}",))
    if not isinstance(got, torch.Tensor):
        return OutputCheck(name, "FAIL", (f"not a tensor: {type(got).__name__}",))
    problems: List[str] = []
    if tuple(got.shape) != tuple(ref.shape):
        return OutputCheck(name, "FAIL", (f"shape {list(got.shape)}, expected {list(ref.shape)}",))
    if got.dtype != ref.dtype:
        problems.append(f"dtype {got.dtype}, expected {ref.dtype} ({_expected_dtype_reason(name, policy, op)})")
    if got.device != device:
        problems.append(f"on device {got.device}, expected the input device {device}")
    if got.is_complex() or not (got.is_floating_point()):
        problems.append(f"dtype {got.dtype} is not a real floating dtype")
        return OutputCheck(name, "FAIL", tuple(problems))
    try:
        got = got.detach().to("cpu")
    except (RuntimeError, NotImplementedError) as exc:
        problems.append(f"cannot be copied to the CPU ({type(exc).__name__}: {str(exc).splitlines()[0]})")
        return OutputCheck(name, "FAIL", tuple(problems))
    ref_ok = torch.isfinite(ref) & torch.isfinite(oracle)
    bad = ~torch.isfinite(got) & ref_ok
    nonfinite = int(bad.sum())
    if nonfinite:
        problems.append(f"{nonfinite} NaN/Inf element(s) where the reference is finite (first at "
                        f"{_first_index(bad)})")
    mask = ref_ok & torch.isfinite(got)
    notes = ()
    if not bool(ref_ok.all()):
        notes = (f"reference has {int((~ref_ok).sum())} non-finite element(s); compared on the others",)
    g, r, o = got[mask], ref[mask], oracle[mask]
    err_same = rel_rms(g, r)
    err_oracle = rel_rms(g, o)
    ref_err = rel_rms(r, o)
    # The case's noise floor can only raise the tolerance: measure it (3 reference runs) only when it can matter.
    noise_value, noise_source = math.nan, ""
    tol = settings.tol_same
    if not err_same <= settings.tol_same and settings.noise_factor > 0:
        noise_value, noise_source = noise_of()
        tol = max(tol, settings.noise_factor * noise_value)
    bound = settings.alpha * ref_err + settings.floor
    if not err_same <= tol:
        problems.append(f"same-policy gate: rel RMS vs ref[P] {err_same:.2e} > tol {tol:.2e} (does not "
                        "reproduce the policy's roundings)")
    if not err_oracle <= bound:
        problems.append(f"noise-floor gate: rel RMS vs fp64 {err_oracle:.2e} > {settings.alpha:g}·{ref_err:.2e} + "
                        f"{settings.floor:.1e} = {bound:.2e} (less accurate than the policy)")
    bit_equal = math.nan
    if got.dtype == ref.dtype:
        bit_equal = 1.0 if got.numel() == 0 else float(
            (got.contiguous().view(_int_view(got)) == ref.contiguous().view(_int_view(ref))).double().mean())
    return OutputCheck(name, "FAIL" if problems else "pass", tuple(problems), notes=notes, err_same=err_same,
                       noise=noise_value, noise_source=noise_source, tol_same=tol,
                       tol_base=settings.tol_same, tol_entry=dict(settings.entries).get("tol_same", ""),
                       err_oracle=err_oracle,
                       ref_err_oracle=ref_err, bound_oracle=bound, max_abs=max_abs(g, r) if g.numel() else 0.0,
                       bit_equal=bit_equal, nonfinite=nonfinite)


def _int_view(t: torch.Tensor) -> torch.dtype:
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def _exception_summary(exc: BaseException, width: int = 160) -> str:
    """First line of the message, plus its last line when it has several (compilers put the cause last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= width else text[:width - 3] + "..."


def _short_traceback(exc: BaseException, limit: int = 8) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-limit)).rstrip()


def run_case(fn: Callable, case, policy: RoundingPolicy, device: torch.device, settings_of: SettingsByOutput,
              pass_policy: bool, dtype_mismatch: str, op) -> CaseResult:
    case_policy = policy
    if case.lp_dtype != policy.lp_torch_dtype:
        if dtype_mismatch == "skip":
            return CaseResult(case, None, skipped=f"case dtype {case.dtype} differs from the policy's lp_dtype "
                                                  f"{policy.lp_dtype} (dtype_mismatch='adapt' gates it under "
                                                  f"lp_dtype={case.dtype})")
        case_policy = policy.replace(lp_dtype=case.dtype)
    inputs = case_inputs(case, op)
    ref = as_output_dict(reference_outputs(case, case_policy, op), op)
    oracle = as_output_dict(oracle_outputs(case, op), op)
    result = CaseResult(case, case_policy)
    moved = {n: (None if inputs[n] is None else inputs[n].to(device, copy=True)) for n in op.input_names}
    kwargs = op.kwargs(inputs)
    if pass_policy:
        kwargs["policy"] = case_policy
    start = time.perf_counter()
    try:
        raw = fn(*op.args(moved), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of fn is a gate failure, reported per case
        result.seconds = time.perf_counter() - start
        result.problems.append(f"fn raised {type(exc).__name__}: {_exception_summary(exc)}")
        result.traceback = _short_traceback(exc)
        return result
    try:
        outs = as_output_dict(raw, op)
    except (TypeError, ValueError) as exc:
        result.seconds = time.perf_counter() - start
        result.problems.append(str(exc))
        return result
    target = next(t.device for t in moved.values() if isinstance(t, torch.Tensor))
    for name in op.output_names:
        noise_of = functools.partial(lambda n: self_noise(case, case_policy, op)[n], name)
        result.outputs.append(check_output(name, outs[name], ref[name], oracle[name], noise_of,
                                            case_policy, target, settings_of(name, case_policy.lp_dtype), op))
    result.seconds = time.perf_counter() - start
    modified = [n for n in op.input_names if moved[n] is not None
                and not torch.equal(moved[n].detach().to("cpu"), inputs[n])]
    if modified:
        result.problems.append(f"fn modified its input(s) {modified} in place")
    if result.failed:
        result.fn_outputs = _cpu_copies(outs)
    return result


def _cpu_copies(outs: Mapping[str, object]) -> Dict[str, torch.Tensor]:
    """The real floating tensors of ``outs`` on the CPU (others, and those that cannot be copied, left out)."""
    copies = {}
    for name, value in outs.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            try:
                copies[name] = value.detach().to("cpu")
            except (RuntimeError, NotImplementedError):
                continue
    return copies
