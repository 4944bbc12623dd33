"""Ordered FP32 sums, scans and the angle-state walk in one launch each: the references' sequential loops on the GPU.

The references model upstream's orders: one IEEE FP32 add per term, in a fixed order. Written as torch adds, that
is one device launch per term (the epilogue's bias sums over B·S tokens, its carried chunk sums and chunk scans, the
preprocessing's angle walk over S/C chunks: thousands of launches per call at S = 8192); on the host (numpy) it is
a device-to-host copy per call. These kernels keep the same chains on the device, one launch each: every program
owns ``BLOCK`` columns and walks the rows in order, so each column sees exactly the operations of the sequential
loop and gets the same bits (an IEEE add, an IEEE division and an FMA are correctly rounded, whoever executes them;
only NaN payloads may differ, the GPU returning its canonical NaN).

Kernels (constexprs, rounding sites; grid ``ceil(n_cols / BLOCK)`` programs, the row walk advances a pointer by
``n_cols``, no 32-bit index product):

* ``_ordered_row_sum_kernel``: ``out[j] = ((x[0, j] + x[1, j]) + x[2, j]) + ...``. Constexprs: ``BLOCK``.
* ``_ordered_scan_kernel``: the running sum of the rows, inclusive (the first row loaded as it is, so ``-0``
  stays) or exclusive (from ``+0``: ``out[0] = 0``), forwards or backwards. Constexprs: ``BLOCK``, ``REVERSE``,
  ``EXCLUSIVE``.
* ``_angle_walk_kernel``: the angle state entering each chunk: ``out[0] = 0``, then ``state = state + x[c]``
  and ``state = fma(-2π₃₂, floor(state / 2π₃₂), state)`` (an IEEE division, ``tl.math.div_rn``, and one rounding
  of ``state - 2π₃₂·k``). Constexprs: ``BLOCK``, ``TWO_PI`` (fp32(2π)), ``RESIDUAL_IN_F64``: form the exact
  ``state - 2π₃₂·k`` in float64 and round it once to float32 (as the preprocessing's reference does) instead of
  ``tl.fma``; set for the interpreter, whose ``fma`` rounds twice before Triton 3.9 (the product, then the sum).

Rounding sites: none. No conversion to a low-precision dtype; every operation is an FP32 one rounded to nearest,
and the only multiply is the explicit FMA of the angle walk (launches pass ``enable_fp_fusion=False`` on CUDA, so
nothing else is contracted).

Used on CUDA tensors by the references (``ops/mamba3_mimo_epilogue/reference.py``, ``ops/mamba3_mimo/
preprocess.py``); CPU tensors keep their torch or numpy loops, and the kernels run on CPU tensors in Triton's
interpreter for the tests. Loads, adds, stores and a scalar loop are within the triton-ascend subset; ``div_rn``
and ``floor`` have not been through the Ascend compile gate, and nothing here has run on Ascend.
"""

from __future__ import annotations

import torch

from . import _compile_ahead

#: Columns per program of the CUDA launch.
CUDA_BLOCK = 128


_kernels = {}


def compiled_kernels(interpreted: bool = False):
    """The ``@triton.jit`` kernels by name, defined on first use (importing this module never imports ``triton``):
    compiled, or for CPU tensors interpreted (decorated while ``_backend`` switches the interpreter on)."""
    if interpreted not in _kernels:
        _kernels[interpreted] = _define_kernels(interpreted)
    return _kernels[interpreted]


def _define_kernels(interpreted: bool) -> dict:
    # module globals, not locals: the interpreter patches ``triton.language`` where a kernel's globals name it
    global tl
    import triton
    import triton.language as tl

    from . import _backend

    restore = _backend.set_interpret(interpreted)
    try:

        @triton.jit
        def _ordered_row_sum_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
            cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            row_ptr = x_ptr + cols
            acc = tl.load(row_ptr, mask=mask, other=0.0)
            for _ in range(1, n_rows):
                row_ptr += n_cols
                acc = acc + tl.load(row_ptr, mask=mask, other=0.0)
            tl.store(out_ptr + cols, acc, mask=mask)

        @triton.jit
        def _ordered_scan_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK: tl.constexpr, REVERSE: tl.constexpr,
                                 EXCLUSIVE: tl.constexpr):
            cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            acc = tl.full([BLOCK], 0.0, tl.float32)
            for step in range(n_rows):
                row = n_rows - 1 - step if REVERSE else step
                offsets = row.to(tl.int64) * n_cols + cols
                term = tl.load(x_ptr + offsets, mask=mask, other=0.0)
                if EXCLUSIVE:
                    tl.store(out_ptr + offsets, acc, mask=mask)
                    acc = acc + term
                else:
                    acc = tl.where(step == 0, term, acc + term)  # the first term as it is (a -0 stays -0)
                    tl.store(out_ptr + offsets, acc, mask=mask)

        @triton.jit
        def _angle_walk_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK: tl.constexpr, TWO_PI: tl.constexpr,
                               RESIDUAL_IN_F64: tl.constexpr):
            cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x_row = x_ptr + cols
            out_row = out_ptr + cols
            state = tl.full([BLOCK], 0.0, tl.float32)
            for _ in range(n_rows):
                tl.store(out_row, state, mask=mask)
                state = state + tl.load(x_row, mask=mask, other=0.0)
                turns = tl.floor(tl.math.div_rn(state, TWO_PI))
                if RESIDUAL_IN_F64:  # 24-bit 2π₃₂ times an integer turn count and the difference: exact in float64
                    state = (state.to(tl.float64) - turns.to(tl.float64) * TWO_PI).to(tl.float32)
                else:
                    state = tl.fma(turns, -TWO_PI, state)
                x_row += n_cols
                out_row += n_cols

    finally:
        restore()
    return dict(row_sum=_ordered_row_sum_kernel, scan=_ordered_scan_kernel, angle_walk=_angle_walk_kernel)


#: fp32(2π), the modulus of the angle walk (as the preprocessing's ``_TWO_PI_F32``: doubling fp32(π) is exact).
TWO_PI_F32 = 2.0 * float(torch.tensor(3.141592653589793, dtype=torch.float32))


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[T, cols]`` contiguous rows, after checking it (float32, CUDA or CPU, T >= 1)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"x must be float32, got {x.dtype}")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"x must be a CUDA tensor (or a CPU tensor, run in Triton's interpreter), got device "
                         f"{x.device}")
    if x.dim() < 1 or x.shape[0] < 1:
        raise ValueError(f"x must have at least one row along dim 0, got shape {list(x.shape)}")
    return x.contiguous().reshape(x.shape[0], -1)


def _launch(name: str, rows: torch.Tensor, out: torch.Tensor, **constexprs) -> None:
    n_rows, n_cols = rows.shape
    if n_cols == 0:
        return
    interpreted = rows.device.type == "cpu"
    grid = (-(-n_cols // CUDA_BLOCK),)
    options = {} if interpreted else {"enable_fp_fusion": False}
    _compile_ahead.launch(compiled_kernels(interpreted)[name], grid, (rows, out, n_rows, n_cols),
                         dict(BLOCK=CUDA_BLOCK, **constexprs, **options))


def ordered_row_sum(x: torch.Tensor) -> torch.Tensor:
    """``x[0] + x[1] + ...`` over dim 0, left to right, in FP32, in one launch.

    Args:
        x (Tensor): ``[T, ...]`` float32 on a CUDA device (or on the CPU: Triton's interpreter), T >= 1.

    Returns:
        Tensor: ``[...]`` float32 on ``x``'s device.

    Raises:
        TypeError, ValueError: on another dtype or device, or T == 0.
    """
    rows = _rows(x)
    out = torch.empty(rows.shape[1], dtype=torch.float32, device=x.device)
    _launch("row_sum", rows, out)
    return out.reshape(x.shape[1:])


def ordered_scan(x: torch.Tensor, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """The running FP32 sum over dim 0, one IEEE add per term in walk order, in one launch.

    Inclusive: ``out[t] = x[0] + ... + x[t]`` (the first term as it is); exclusive: ``out[t] = 0 + x[0] + ... +
    x[t - 1]``; ``reverse`` walks from the last row (``out[t]`` sums the rows after, or from, ``t``).

    Args:
        x (Tensor): ``[T, ...]`` float32 on a CUDA device (or on the CPU: Triton's interpreter), T >= 1.

    Returns:
        Tensor: ``[T, ...]`` float32 on ``x``'s device.

    Raises:
        TypeError, ValueError: on another dtype or device, or T == 0.
    """
    rows = _rows(x)
    out = torch.empty_like(rows)
    _launch("scan", rows, out, REVERSE=bool(reverse), EXCLUSIVE=bool(exclusive))
    return out.reshape(x.shape)


def angle_state_walk(sums: torch.Tensor) -> torch.Tensor:
    """The angle state entering each chunk: ``out[0] = 0``, then ``state = (state + sums[c]) mod 2π₃₂``.

    The mod is ``state - 2π₃₂·floor(state / 2π₃₂)`` with an IEEE division and one rounding of the difference (the
    preprocessing's ``_mod_two_pi_f32``).

    Args:
        sums (Tensor): ``[nc, ...]`` float32, each chunk's angle sum, on a CUDA device (or on the CPU: Triton's
            interpreter), nc >= 1.

    Returns:
        Tensor: ``[nc, ...]`` float32.

    Raises:
        TypeError, ValueError: on another dtype or device, or nc == 0.
    """
    rows = _rows(sums)
    out = torch.empty_like(rows)
    _launch("angle_walk", rows, out, TWO_PI=TWO_PI_F32, RESIDUAL_IN_F64=rows.device.type == "cpu")
    return out.reshape(sums.shape)
