"""Error metrics between an ``actual`` and an ``expected`` tensor (torch.testing argument order).

Every metric computes in float64 and takes inputs of any floating dtype (the two may differ, except for
:func:`bit_equal_fraction`) and of the same shape (``ValueError`` otherwise). Float metrics return Python floats.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Sequence, Union

import torch

FormatLike = Union[str, torch.dtype]

_FORMATS = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32,
}
_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: Default bucket edges of :func:`ulp_histogram`.
DEFAULT_ULP_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


def _check_pair(actual: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    for label, tensor in (("actual", actual), ("expected", expected)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}{label} must be a torch.Tensor, got {type(tensor).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(f"{name}actual and expected must have the same shape, got {list(actual.shape)} and "
                         f"{list(expected.shape)}")


def _as_f64(actual: torch.Tensor, expected: torch.Tensor):
    _check_pair(actual, expected)
    return actual.detach().to(torch.float64), expected.detach().to(torch.float64)


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative RMS error ``||actual - expected||_2 / ||expected||_2``.

    Args:
        actual, expected (Tensor): same shape, any floating dtype.

    Returns:
        float: ``nan`` if either contains NaN; when ``||expected|| = 0``: ``0.0`` if ``actual`` equals ``expected``
        everywhere, else ``inf``.
    """
    a, e = _as_f64(actual, expected)
    if torch.isnan(a).any() or torch.isnan(e).any():
        return math.nan
    norm_e = torch.linalg.vector_norm(e).item()
    if norm_e == 0.0:
        return 0.0 if torch.equal(a, e) else math.inf
    return (torch.linalg.vector_norm(a - e) / norm_e).item()


def max_abs(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected|`` (0.0 for empty tensors; ``nan`` if either contains NaN)."""
    a, e = _as_f64(actual, expected)
    if a.numel() == 0:
        return 0.0
    if torch.isnan(a).any() or torch.isnan(e).any():
        return math.nan
    return (a - e).abs().max().item()


def max_rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (the upstream test's metric).

    Returns:
        float: ``nan`` if either contains NaN; when ``max |expected| = 0``: 0.0 if the tensors are equal, else inf.
    """
    a, e = _as_f64(actual, expected)
    diff = max_abs(a, e)
    if math.isnan(diff):
        return math.nan
    scale = e.abs().max().item() if e.numel() else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def _resolve_format(fmt: FormatLike) -> torch.dtype:
    if isinstance(fmt, torch.dtype):
        if fmt not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"fmt must be bfloat16, float16 or float32, got {fmt}")
        return fmt
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    raise ValueError(f"unknown fmt {fmt!r}; expected one of {sorted(_FORMATS)} or a torch dtype")


def _ordered_codes(x: torch.Tensor, dtype: torch.dtype, label: str) -> torch.Tensor:
    """Bit patterns of ``x`` (exactly representable in ``dtype``) mapped to ordered int64 codes.

    Non-negative values keep their bit pattern, negative ones map to ``-(pattern & ~sign)``; so the codes are
    monotone in the value, ``+0`` and ``-0`` both map to 0 and adjacent values differ by 1 (infinities sit one code
    beyond the largest finite value).
    """
    x = x.detach()
    if torch.isnan(x).any():
        raise ValueError(f"{label} contains NaN: ULP distances are undefined")
    converted = x.to(dtype)
    if not torch.equal(converted.to(torch.float64), x.to(torch.float64)):
        bad = (converted.to(torch.float64) != x.to(torch.float64)).sum().item()
        raise ValueError(f"{label} has {bad} value(s) not exactly representable in {dtype}; round them first")
    width = torch.finfo(dtype).bits
    bits = converted.view(_INT_OF_WIDTH[width // 8]).to(torch.int64)
    sign = 1 << (width - 1)
    bits = bits & ((1 << width) - 1)  # as unsigned
    magnitude = bits & (sign - 1)
    return torch.where(bits >= sign, -magnitude, magnitude)


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor, fmt: FormatLike) -> torch.Tensor:
    """Element-wise distance in units in the last place of ``fmt``, counted along the ordered bit patterns.

    Both tensors are converted to ``fmt``; their values must already be exactly representable there (e.g. a
    bfloat16 output, or a float64 tensor holding bfloat16 values), otherwise ``ValueError``. The distance is the
    number of representable values stepped over from ``expected`` to ``actual``: it counts across zero (``+0`` and
    ``-0`` are the same point, so the smallest positive and smallest negative subnormals are 2 apart) and across
    binade boundaries uniformly; an infinity is one step beyond the largest finite value.

    Args:
        actual, expected (Tensor): same shape, floating.
        fmt (str | torch.dtype): ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``, ``"float32"``/``"fp32"`` or
            the torch dtype.

    Returns:
        Tensor: int64, the shape of the inputs, ``>= 0``.

    Raises:
        ValueError: on a shape mismatch, an unknown format, NaN, or a value not representable in ``fmt``.
    """
    _check_pair(actual, expected)
    dtype = _resolve_format(fmt)
    return (_ordered_codes(actual, dtype, "actual") - _ordered_codes(expected, dtype, "expected")).abs()


def _bin_labels(bins: Sequence[int]):
    edges = list(bins)
    if not edges or edges[0] != 0:
        raise ValueError(f"bins must start at 0, got {tuple(bins)}")
    if any(not isinstance(b, int) or isinstance(b, bool) for b in edges):
        raise ValueError(f"bins must be ints, got {tuple(bins)}")
    if any(b >= c for b, c in zip(edges, edges[1:])):
        raise ValueError(f"bins must be strictly increasing, got {tuple(bins)}")
    labels = []
    for lo, hi in zip(edges, edges[1:]):
        labels.append(str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}")
    labels.append(f">={edges[-1]}")
    return edges, labels


def ulp_histogram(actual: torch.Tensor, expected: torch.Tensor, fmt: FormatLike,
                  bins: Sequence[int] = DEFAULT_ULP_BINS) -> Dict[str, int]:
    """Counts of :func:`ulp_distance` values in buckets.

    Args:
        actual, expected (Tensor): as for :func:`ulp_distance`.
        fmt (str | torch.dtype): as for :func:`ulp_distance`.
        bins (sequence of int): strictly increasing bucket lower edges starting at 0. Bucket ``[lo, hi)`` is
            labelled ``"lo"`` when it holds one value, else ``"lo-(hi-1)"``; the last one is ``">=last"``.
            The default gives ``"0", "1", "2-3", "4-7", ..., "128-255", ">=256"``.

    Returns:
        dict: label -> count (ints, in bucket order, summing to the number of elements).
    """
    edges, labels = _bin_labels(bins)
    dist = ulp_distance(actual, expected, fmt).flatten()
    bounds = torch.tensor(edges[1:], dtype=torch.int64)
    index = torch.bucketize(dist, bounds, right=True)  # number of upper bounds <= dist
    counts = torch.bincount(index, minlength=len(labels))
    return {label: int(count) for label, count in zip(labels, counts.tolist())}


def bit_equal_fraction(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Fraction of elements whose bit patterns are identical (``-0`` differs from ``+0``; equal NaN bits match).

    Args:
        actual, expected (Tensor): same shape and the same dtype.

    Returns:
        float: in [0, 1]; 1.0 for empty tensors.

    Raises:
        ValueError: on a shape or dtype mismatch.
    """
    _check_pair(actual, expected)
    if actual.dtype != expected.dtype:
        raise ValueError(f"bit_equal_fraction needs the same dtype, got {actual.dtype} and {expected.dtype}")
    if actual.numel() == 0:
        return 1.0
    int_type = _INT_OF_WIDTH[actual.element_size()]
    a = actual.detach().contiguous().view(int_type)
    e = expected.detach().contiguous().view(int_type)
    return (a == e).to(torch.float64).mean().item()


def _outputs_by_name(outputs, label: str, names: Sequence[str]) -> Mapping[str, Optional[torch.Tensor]]:
    if isinstance(outputs, Mapping):
        unknown = sorted(set(outputs) - set(names))
        missing = [n for n in names if n not in outputs]
        if unknown or missing:
            raise ValueError(f"{label} must have exactly the outputs {list(names)}; "
                             f"unknown {unknown}, missing {missing}")
        return outputs
    if hasattr(outputs, "_asdict"):
        return outputs._asdict()
    if isinstance(outputs, (tuple, list)) and len(outputs) == len(names):
        return dict(zip(names, outputs))
    raise TypeError(f"{label} must be the outputs NamedTuple, a {len(names)}-tuple or a dict by output name, "
                    f"got {type(outputs).__name__}")


def compare_outputs(actual, expected, op=None) -> Dict[str, Optional[Dict[str, float]]]:
    """Metrics of each output of operator ``op`` (default: the registry's default operator).

    Args:
        actual, expected: the operator's outputs NamedTuple (or a tuple in that order, or a dict keyed by its output
            names).
        op (str | Operator, optional): the operator whose outputs these are.

    Returns:
        dict: output name -> ``{"rel_rms", "max_abs", "max_rel", "bit_equal_fraction"}`` (floats;
        ``bit_equal_fraction`` is ``nan`` when the two dtypes differ), or ``None`` where both are None.

    Raises:
        ValueError: naming the output when only one side is None or the shapes differ.
    """
    from . import operator as _operator

    names = _operator.get(op).output_names
    a_all = _outputs_by_name(actual, "actual", names)
    e_all = _outputs_by_name(expected, "expected", names)
    result: Dict[str, Optional[Dict[str, float]]] = {}
    for name in names:
        a, e = a_all[name], e_all[name]
        if a is None and e is None:
            result[name] = None
            continue
        if a is None or e is None:
            raise ValueError(f"output {name}: {'actual' if a is None else 'expected'} is None but "
                             f"{'expected' if a is None else 'actual'} is not")
        _check_pair(a, e, name=f"output {name}: ")
        result[name] = {
            "rel_rms": rel_rms(a, e),
            "max_abs": max_abs(a, e),
            "max_rel": max_rel(a, e),
            "bit_equal_fraction": bit_equal_fraction(a, e) if a.dtype == e.dtype else math.nan,
        }
    return result
