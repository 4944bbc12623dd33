"""An ordered FP32 sum over rows in one launch: ``out[j] = ((x[0, j] + x[1, j]) + x[2, j]) + ...``.

The references' long sequential sums (the epilogue's bias sums over B·S tokens) model upstream's order: one IEEE
FP32 add per term, left to right. Written as torch adds that is one device launch per term; on the host (numpy)
it is a device-to-host copy per call. This kernel keeps the same chain of adds on the device, one launch for the
whole sum: every program owns ``BLOCK`` columns and walks the rows in order, so each column sees exactly the adds
of the sequential loop and gets the same bits (an IEEE add is correctly rounded, whoever executes it; only NaN
payloads may differ, the GPU returning its canonical NaN).

Kernel ``_ordered_row_sum_kernel``:

* constexprs: ``BLOCK`` (columns per program, a power of two).
* rounding sites: none. Every add is an FP32 add rounded to nearest (no multiply, nothing to contract; the launch
  passes ``enable_fp_fusion=False`` on CUDA all the same), no conversion to a low-precision dtype.
* grid: ``ceil(n_cols / BLOCK)`` programs; the row walk advances a pointer by ``n_cols`` (no 32-bit index product).

Used on CUDA tensors only (``mimo_numerics.ops.mamba3_mimo_epilogue.reference``); CPU tensors keep their numpy
path. Within the triton-ascend subset (loads, adds, stores, a scalar loop), not run on Ascend.
"""

from __future__ import annotations

import torch

#: Columns per program of the CUDA launch.
CUDA_BLOCK = 128


_kernel = None


def _compiled_kernel():
    """The ``@triton.jit`` kernel, defined on first use (importing this module never imports ``triton``)."""
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

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

        _kernel = _ordered_row_sum_kernel
    return _kernel


def ordered_row_sum(x: torch.Tensor) -> torch.Tensor:
    """``x[0] + x[1] + ...`` over dim 0, left to right, in FP32, on the GPU in one launch.

    Args:
        x (Tensor): ``[T, ...]`` float32 on a CUDA device, T >= 1.

    Returns:
        Tensor: ``[...]`` float32 on ``x``'s device.

    Raises:
        TypeError, ValueError: on another dtype or device, or T == 0.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"x must be float32, got {x.dtype}")
    if not x.is_cuda:
        raise ValueError(f"x must be a CUDA tensor (CPU tensors sum in numpy), got device {x.device}")
    if x.dim() < 1 or x.shape[0] < 1:
        raise ValueError(f"x must have at least one row along dim 0, got shape {list(x.shape)}")
    rows = x.contiguous().reshape(x.shape[0], -1)
    n_rows, n_cols = rows.shape
    out = torch.empty(n_cols, dtype=torch.float32, device=x.device)
    if n_cols:
        grid = (-(-n_cols // CUDA_BLOCK),)
        _compiled_kernel()[grid](rows, out, n_rows, n_cols, BLOCK=CUDA_BLOCK, enable_fp_fusion=False)
    return out.reshape(x.shape[1:])
