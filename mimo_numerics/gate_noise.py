"""The FP32-order noise floor of the accuracy gates (:mod:`mimo_numerics.testing`).

A case's noise floor is how far correct implementations of the same rounding policy, differing only at the FP32
level, land from the policy reference: FP64 intermediate math, the other ``state_update`` order, a permuted
state-dimension summation order (:func:`permute_state_dim`). :func:`measure_gate_noise` records the measurements
behind the gate defaults of ``mimo_numerics.tolerances``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from . import operator as _operator
from . import presets as _presets
from .gate_cases import (CasesLike, OperatorLike, PolicyLike, as_output_dict, case_inputs, oracle_outputs,
                         policy_label, reference_outputs, resolve_cases)
from .gate_report import safe_ratio
from .metrics import rel_rms
from .policy import RoundingPolicy, with_float64_math

__all__ = ["state_dim_axes", "permute_state_dim", "noise_perturbations", "self_noise", "measure_gate_noise",
           "clear_noise_cache"]

_NOISE: Dict[tuple, Dict[str, Tuple[float, str]]] = {}
_PERTURBED: Dict[tuple, Dict[str, Any]] = {}


def clear_noise_cache() -> None:
    """Forget the cached noise floors and perturbed reference runs of this process."""
    _NOISE.clear()
    _PERTURBED.clear()


#: Shape letters of a state-dimension axis: ``N`` itself and ``N/d``, the rotary angles (one per pair of columns).
_STATE_LETTERS = ("N", "N/d")


def _state_axis(letters: Sequence[str], where: str) -> Optional[Tuple[int, bool]]:
    """``(axis counted from the end, paired)`` of the state-dimension letter of one tensor, None without one."""
    found = [(i, letter) for i, letter in enumerate(letters) if letter in _STATE_LETTERS]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"{where} has {len(found)} state-dimension axes {list(letters)}; the permutation handles one")
    index, letter = found[0]
    if any(letter_.startswith("(") for letter_ in letters[index + 1:]):
        raise ValueError(f"{where}: an optional axis after the state dimension ({list(letters)}) leaves its position "
                         "from the end undetermined")
    return index - len(letters), letter == "N/d"


def state_dim_axes(op: OperatorLike = None) -> Tuple[Dict[str, Tuple[int, bool]], Dict[str, Tuple[int, bool]]]:
    """The tensors of ``op`` indexed by the state dimension N, from their shape letters.

    Inputs' letters are the spec's ``extra["input_shapes"]``, outputs' are ``op.outputs[i].shape``. A letter ``N``
    is the state dimension; ``N/d`` is the rotary angles', one per rotated pair of columns ``(j, N/2 + j)``,
    ``j < N/d``.

    Returns:
        tuple: ``(inputs, outputs)``, each ``{name: (axis, paired)}`` with ``axis`` counted from the end (negative)
        and ``paired`` true for an ``N/d`` axis.

    Raises:
        ValueError: the operator declares no input shapes (naming it).
    """
    op = _operator.get(op)
    shapes = op.extra.get("input_shapes")
    if shapes is None:
        raise ValueError(f"operator {op.name} declares no input shapes (its spec's extra['input_shapes']), so its "
                         "state dimension cannot be permuted")
    inputs = {name: _state_axis(tuple(shapes[name]), f"input {name} of {op.name}") for name in op.input_names}
    outputs = {o.name: _state_axis(o.shape, f"output {o.name} of {op.name}") for o in op.outputs}
    return ({k: v for k, v in inputs.items() if v is not None}, {k: v for k, v in outputs.items() if v is not None})


def _state_permutation(n: int, width: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(perm, pair_perm)``: a permutation of the N columns that maps rotary pairs ``(j, N/2 + j)``, ``j < width``,
    to rotary pairs (``pair_perm`` permutes ``j``) and the other columns among themselves."""
    half = n // 2
    gen = torch.Generator().manual_seed(seed)
    pair_perm = torch.randperm(width, generator=gen)
    free = torch.tensor([j for j in range(n) if not (j < width or half <= j < half + width)], dtype=torch.long)
    perm = torch.arange(n)
    perm[:width] = pair_perm
    perm[half:half + width] = half + pair_perm
    if free.numel():
        perm[free] = free[torch.randperm(free.numel(), generator=gen)]
    return perm, pair_perm


def _state_sizes(tensors: Mapping[str, Optional[torch.Tensor]], axes: Mapping[str, Tuple[int, bool]],
                 op_name: str) -> Tuple[int, int]:
    """``(N, N/d)`` read off the inputs (``N/d`` = 0 without an angles input); ValueError when they disagree."""
    sizes: Dict[bool, Tuple[int, str]] = {}
    for name, (axis, paired) in axes.items():
        tensor = tensors[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        size = tensor.shape[axis]
        if paired in sizes and sizes[paired][0] != size:
            raise ValueError(f"{op_name}: input {name} has {'N/d' if paired else 'N'} = {size} but "
                             f"{sizes[paired][1]} has {sizes[paired][0]}")
        sizes.setdefault(paired, (size, name))
    if False not in sizes:
        raise ValueError(f"{op_name}: no input with a state-dimension axis was given")
    n, width = sizes[False][0], sizes.get(True, (0, ""))[0]
    if 2 * width > n:
        raise ValueError(f"{op_name}: N/d = {width} rotary pairs do not fit N = {n} columns")
    return n, width


def permute_state_dim(fn: Callable, seed: int = 0, op: OperatorLike = None) -> Callable:
    """Wrap ``fn`` so that it computes the same function with the state dimension N permuted.

    Every sum over N (dot products of q and k, the scores, the state GEMMs) then runs in another FP32 order, while
    the math is unchanged: the permutation maps rotary pairs ``(j, N/2 + j)``, ``j < N/d``, to rotary pairs
    (permuting the ``N/d`` axis of the angles with them) and the other columns among themselves. Which inputs and
    outputs have an N axis comes from the operator's shape letters (:func:`state_dim_axes`); the outputs' N axes are
    permuted back. This models a correct kernel that sums in a different order.

    Args:
        fn: an implementation of ``op`` (signature as for :func:`check`).
        seed (int): seed of the permutation.
        op: the operator (default ``registry.DEFAULT_OPERATOR``).

    Returns:
        callable: same signature as ``fn``; returns ``fn``'s result in the form ``fn`` returned it (named tuple,
        dict or tuple) with the outputs' N axes restored.
    """
    op = _operator.get(op)
    in_axes, out_axes = state_dim_axes(op)
    names = op.input_names

    @functools.wraps(fn)
    def permuted(*tensors, **kwargs):
        if len(tensors) != len(names):
            raise TypeError(f"{op.name} takes {len(names)} tensors {list(names)}, got {len(tensors)}")
        given = dict(zip(names, tensors))
        n, width = _state_sizes(given, in_axes, op.name)
        perm, pair_perm = _state_permutation(n, width, seed)
        orders = {False: perm, True: pair_perm}
        args = []
        for name, tensor in given.items():
            if name in in_axes and isinstance(tensor, torch.Tensor):
                axis, paired = in_axes[name]
                tensor = tensor.index_select(axis, orders[paired].to(tensor.device)).contiguous()
            args.append(tensor)
        result = fn(*args, **kwargs)
        outs = as_output_dict(result, op)
        restored = {}
        for name, (axis, paired) in out_axes.items():
            value = outs[name]
            if isinstance(value, torch.Tensor):
                inverse = torch.argsort(orders[paired]).to(value.device)
                restored[name] = value.index_select(axis, inverse).contiguous()
        return _with_outputs(result, outs, restored, op)

    return permuted


def _with_outputs(result, outs: Dict[str, Any], changes: Dict[str, Any], op):
    """``result`` (as ``fn`` returned it) with some outputs replaced."""
    if not changes:
        return result
    if hasattr(result, "_replace"):
        return result._replace(**changes)
    merged = dict(outs, **changes)
    if isinstance(result, Mapping):
        return merged
    if isinstance(result, torch.Tensor):
        return merged[op.output_names[0]]
    return tuple(merged[n] for n in op.output_names)


def noise_perturbations(policy: PolicyLike, op: OperatorLike = None) -> Dict[str, Callable]:
    """FP32-level perturbations of ``op``'s reference under ``policy``: implementations of the same rounding policy.

    Returns:
        dict: label -> callable with the reference's signature: ``"fp64_math"`` (the same roundings with FP64
        intermediate math; when ``math_dtype`` acts on ``op`` and is ``"float32"``), ``"state_update"`` (the other
        ``state_update`` order, when that knob acts on ``op``: the two differ only in FP32 summation order),
        ``"state_dim_order"`` (:func:`permute_state_dim`, when ``op`` has inputs with an N axis).
    """
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    reference = op.load("reference")
    variants = {}
    if "math_dtype" in op.knobs and policy.math_dtype == "float32":
        variants["fp64_math"] = functools.partial(reference, policy=with_float64_math(policy))
    if "state_update" in op.knobs:
        other = "separate" if policy.state_update == "accumulate_into" else "accumulate_into"
        variants["state_update"] = functools.partial(reference, policy=policy.replace(state_update=other))
    if op.extra.get("input_shapes") is not None and state_dim_axes(op)[0]:
        variants["state_dim_order"] = permute_state_dim(functools.partial(reference, policy=policy), seed=0, op=op)
    return variants


def _perturbed_outputs(case, policy: RoundingPolicy, op) -> Dict[str, Any]:
    key = (op.name, case, policy)
    if key not in _PERTURBED:
        inputs = case_inputs(case, op)
        with torch.no_grad():
            _PERTURBED[key] = {label: variant(*op.args(inputs), **op.kwargs(inputs))
                               for label, variant in noise_perturbations(policy, op).items()}
    return _PERTURBED[key]


def self_noise(case, policy: PolicyLike, op: OperatorLike = None) -> Dict[str, Tuple[float, str]]:
    """This case's FP32-order noise floor per output: ``max rel_rms(reference[P'], reference[P])`` over
    :func:`noise_perturbations`, with the label of the largest (cached per (operator, case, policy)).

    Returns:
        dict: output name -> ``(noise, label)``; ``(0.0, "")`` where every perturbation is bit-equal, and for
        absent outputs.
    """
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    key = (op.name, case, policy)
    if key not in _NOISE:
        ref = as_output_dict(reference_outputs(case, policy, op), op)
        noise = {name: (0.0, "") for name in op.output_names}
        for label, out in _perturbed_outputs(case, policy, op).items():
            out = as_output_dict(out, op)
            for name in op.output_names:
                expected, got = ref[name], out[name]
                if expected is None or got is None:
                    continue
                value = rel_rms(got, expected)
                if value > noise[name][0]:
                    noise[name] = (value, label)
        _NOISE[key] = noise
    return _NOISE[key]



def measure_gate_noise(policy: PolicyLike = "upstream_sm90", cases: CasesLike = "gate",
                       dtype_mismatch: str = "adapt", op: OperatorLike = None) -> List[dict]:
    """The measurements behind the gate defaults in ``tolerances.py``, for every case and output of ``op``.

    For each :func:`noise_perturbations` variant ``P'`` (correct implementations of the policy that differ at the
    FP32 level) records ``same = rel_rms(ref[P'], ref[P])``, ``ratio = rel_rms(ref[P'], fp64) /
    rel_rms(ref[P], fp64)`` and ``excess = rel_rms(ref[P'], fp64) - rel_rms(ref[P], fp64)``.

    Returns:
        list of dict: ``{"operator", "case_id", "policy", "output", "ref_err_oracle", "variant", "same", "ratio",
        "excess"}``.
    """
    op = _operator.get(op)
    policy = _presets.resolve(policy)
    rows = []
    for case in resolve_cases(cases, op):
        case_policy = policy
        if case.lp_dtype != policy.lp_torch_dtype:
            if dtype_mismatch == "skip":
                continue
            case_policy = policy.replace(lp_dtype=case.dtype)
        ref = as_output_dict(reference_outputs(case, case_policy, op), op)
        oracle = as_output_dict(oracle_outputs(case, op), op)
        for label, out in _perturbed_outputs(case, case_policy, op).items():
            out = as_output_dict(out, op)
            for name in op.output_names:
                r = ref[name]
                if r is None:
                    continue
                o, v = oracle[name], out[name]
                ref_err, var_err = rel_rms(r, o), rel_rms(v, o)
                rows.append({"operator": op.name, "case_id": case.case_id, "policy": policy_label(case_policy, op),
                             "output": name, "ref_err_oracle": ref_err, "variant": label, "same": rel_rms(v, r),
                             "ratio": safe_ratio(var_err, ref_err), "excess": var_err - ref_err})
    return rows
