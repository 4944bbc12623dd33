"""Input validation of the whole op ``mamba3_mimo``: the 14 raw inputs (upstream's names), their shapes and signs.

Every failure raises ``TypeError`` or ``ValueError`` naming the argument. The sizes come from ``Q``
``[B, S, R, G, N]`` and ``V`` ``[B, S, H, P]``; the rule on N and the rotary divisor is the one every kernel
applies (``mimo_numerics.validation.check_rotary_state_dim``).
"""

from __future__ import annotations

import warnings

import torch

from ...validation import check_sizes, check_tensor_arguments
from .cases import OP_INPUT_NAMES as INPUT_NAMES

#: Arguments that may be None (``MIMO_Z`` and ``Z`` together).
OPTIONAL_INPUTS = ("MIMO_Z", "MIMO_Out", "D", "Z")
CLAMP_BACKWARDS = ("upstream", "exact")
_FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
#: Dimension letters of every input (``N/d``: the rotary angles per head).
INPUT_SHAPES = {"Q": ("B", "S", "R", "G", "N"), "K": ("B", "S", "R", "G", "N"), "V": ("B", "S", "H", "P"),
                "ADT": ("B", "H", "S"), "DT": ("B", "H", "S"), "Trap": ("B", "H", "S"), "Q_bias": ("H", "R", "N"),
                "K_bias": ("H", "R", "N"), "MIMO_V": ("H", "R", "P"), "MIMO_Z": ("H", "R", "P"),
                "MIMO_Out": ("H", "R", "P"), "Angles": ("B", "S", "H", "N/d"), "D": ("H",),
                "Z": ("B", "S", "H", "P")}


def _shape_message(name: str, value: torch.Tensor, letters, shape: tuple, sizes: dict, where: dict) -> str:
    text = f"{name} must have shape {list(shape)}, got {list(value.shape)}"
    if value.dim() != len(shape):
        return text
    notes = [f"{letter} = {want} is read from {where[letter]}"
             for letter, want, got in zip(letters, shape, value.shape) if want != got]
    return text + (f" ({'; '.join(notes)}: is {name} or that tensor wrong?)" if notes else "")


def check_dt_adt_signs(dt, adt) -> None:
    """``DT`` is a step size (softplus, > 0) and ``ADT`` = A·DT a log decay (<= 0) in every real use.

    ``ValueError`` when ``DT`` has a negative entry and ``ADT`` a positive one (the signature of the two swapped:
    ``mamba3_mimo`` takes ``..., ADT, DT, ...``); a ``UserWarning`` when only ``DT`` has negative entries (legal
    arithmetic, not a real input). A positive ``ADT`` alone is legal: upstream clamps the cumulative sums
    (``OpCaseSpec(positive_adt=True)``). Reads the two tensors on the host now (a device sync on a GPU):
    :func:`start_dt_adt_sign_check` is the form that does not stall the host.
    """
    start_dt_adt_sign_check(dt, adt, defer=False)


def _judge_dt_adt_signs(dt_negative: bool, adt_positive: bool) -> None:
    if not dt_negative:
        return
    if adt_positive:
        raise ValueError("DT has negative entries and ADT positive ones: were DT and ADT swapped? mamba3_mimo takes "
                         "(Q, K, V, ADT, DT, Trap, ...): ADT = A·DT <= 0, the log decay, then DT > 0, the step size")
    warnings.warn("DT has negative entries: in every real use DT = softplus(...) > 0 (the step size)", UserWarning,
                  stacklevel=4)


def start_dt_adt_sign_check(dt, adt, defer: bool = True):
    """:func:`check_dt_adt_signs` in two halves, so that a GPU call need not wait for its inputs' extremes.

    On a CUDA device with ``defer``, "any DT < 0" and "any ADT > 0" are reduced on the device and copied, without
    blocking, into pinned host memory behind an event; the returned ``finish()`` waits for that event and raises or
    warns as :func:`check_dt_adt_signs`. ``mamba3_mimo`` calls it after issuing the forward's launches: by then the
    event has long passed (it follows only the two reductions in stream order, not the kernels issued after them),
    so the host issues the forward while the GPU runs it. Elsewhere, or without ``defer``, the check runs now.
    Returns ``finish``, or None when nothing is left to check.
    """
    if dt is None or adt is None or not dt.is_floating_point() or not adt.is_floating_point():
        return None
    if dt.numel() == 0 or adt.numel() == 0:
        return None
    if not (defer and dt.device.type == "cuda" and adt.device == dt.device):
        dt_negative = bool((dt.detach() < 0).any())
        _judge_dt_adt_signs(dt_negative, dt_negative and bool((adt.detach() > 0).any()))
        return None
    signs = torch.stack(((dt.detach() < 0).any(), (adt.detach() > 0).any()))
    host = torch.empty(2, dtype=torch.bool, pin_memory=True)
    host.copy_(signs, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(dt.device))

    def finish() -> None:
        ready.synchronize()
        dt_negative, adt_positive = host.tolist()
        _judge_dt_adt_signs(dt_negative, adt_positive)

    return finish


def check_op_inputs(tensors: dict, chunk_size, rotary_dim_divisor, clamp_backward, *,
                    check_signs: bool = True) -> tuple:
    """Check the 14 inputs of ``mamba3_mimo`` (name -> tensor or None) and the sizes; return B, S, R, G, N, H, P, C and
    the rotary divisor (errors name the argument). Used by the FP64 model and by ``autograd.mamba3_mimo``.

    A shape that disagrees with ``Q`` (B, S, R, G, N) or ``V`` (H, P) names both: the tensor checked and the one
    the size was read from (a wrong ``V`` makes ``MIMO_V`` disagree). ``check_signs``: :func:`check_dt_adt_signs`.
    """
    check_tensor_arguments(tensors, OPTIONAL_INPUTS)
    for name, value in tensors.items():
        if value is not None and value.dtype not in _FLOATS:
            raise TypeError(f"{name} must have a floating dtype (bfloat16, float16, float32, float64), got "
                            f"{value.dtype}")
    if clamp_backward not in CLAMP_BACKWARDS:
        raise ValueError(f"clamp_backward must be one of {CLAMP_BACKWARDS}, got {clamp_backward!r}")
    Q, V = tensors["Q"], tensors["V"]
    found = check_sizes(Q, V, chunk_size, rotary_dim_divisor, names=("Q", "V"))
    B, S, R, G, N = found.batch, found.seqlen, found.rank, found.groups, found.state_dim
    H, P = found.heads, found.value_dim
    chunk_size, rotary_dim_divisor = found.chunk_size, found.rotary_dim_divisor
    if (tensors["Z"] is None) != (tensors["MIMO_Z"] is None):
        raise ValueError("Z and MIMO_Z must be given together: got Z "
                         f"{'None' if tensors['Z'] is None else 'present'} and MIMO_Z "
                         f"{'None' if tensors['MIMO_Z'] is None else 'present'}")
    sizes = {"B": B, "S": S, "R": R, "G": G, "N": N, "H": H, "P": P, "N/d": N // rotary_dim_divisor}
    q_at, v_at = f"Q {list(Q.shape)}", f"V {list(V.shape)}"
    where = {"B": q_at, "S": q_at, "R": q_at, "G": q_at, "N": q_at, "H": v_at, "P": v_at,
             "N/d": f"N / rotary_dim_divisor with N from {q_at}"}
    for name, letters in INPUT_SHAPES.items():
        value = tensors[name]
        if value is None:
            continue
        shape = tuple(sizes[letter] for letter in letters)
        if tuple(value.shape) != shape:
            raise ValueError(_shape_message(name, value, letters, shape, sizes, where))
        if value.device != Q.device:
            raise ValueError(f"{name} must be on device {Q.device} (the device of Q), got {value.device}")
    if check_signs:
        check_dt_adt_signs(tensors["DT"], tensors["ADT"])
    return B, S, R, G, N, H, P, chunk_size, rotary_dim_divisor


