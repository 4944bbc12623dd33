"""The references' special functions under the policy's ``special_functions`` knob.

``special_functions(policy)`` returns a :class:`SpecialFunctions` whose ``exp``, ``sigmoid``, ``tanh`` and
``cos_sin`` the references call wherever upstream's kernels evaluate one:

* ``"accurate"``: torch's functions in the math dtype (``torch.exp``, ``torch.sigmoid``, ``torch.tanh``,
  ``Tensor.cos``/``sin``), as before the knob existed;
* ``"fast_sm90"``: what ``nvcc --use_fast_math`` makes of them on the H200 (TileLang kernels), bit for bit through
  :mod:`mimo_numerics.mufu`'s table models (proven on all 2^32 inputs on the H200):
  ``exp(x) = ex2.approx.ftz(fl32(x·fl32(log2 e)))``; ``σ(x) = rcp.approx.ftz(fl32(1 + exp(−x)))``;
  ``tanh = tanh.approx.f32``; ``cos``/``sin`` = ``cos/sin.approx.ftz.f32``. FP32 inputs only (the policy requires
  ``math_dtype="float32"`` for it).

The FP32 Triton helpers (the epilogue, the angle preprocessing) are compiled by Triton, not with nvcc's fast math:
their ``tanh_approx`` is the same ``tanh.approx.f32`` (:meth:`SpecialFunctions.tanh`), ``tl.exp`` is
``ex2.approx.f32`` without ``.ftz`` (:meth:`SpecialFunctions.triton_exp`: the same bits as the ``.ftz`` form except
where the result is subnormal, x·log2 e < −126, measured on the H200) and ``tl.sigmoid`` is ``1 / (1 + tl.exp(-x))``
with ``div.full.f32`` (:meth:`SpecialFunctions.triton_sigmoid`: MUFU.RCP of the divisor; bit-identical to the H200's
``ddt_core`` on every golden case).

A ``torch.sigmoid`` outside the kernels, the decode step's gate that ``Mamba3.step`` forms on the device, is
:meth:`SpecialFunctions.torch_sigmoid`: torch's CPU function under ``"accurate"``, torch's CUDA kernel under
``"fast_sm90"`` (not fast math: CUDA's accurate ``expf``, :func:`cuda_expf`, and IEEE division).
"""

from __future__ import annotations

import functools
import struct
from typing import Tuple

import torch

from ... import mufu

KINDS = ("accurate", "fast_sm90")


@functools.lru_cache(maxsize=None)
def _models(device: str, trig: bool):
    from importlib import resources

    name = "mufu_sm90_trig.npz" if trig else "mufu_sm90.npz"
    with resources.as_file(resources.files("mimo_numerics").joinpath("data", name)) as path:
        return mufu.load_models(path, device=torch.device(device))


def models(device, trig: bool = False):
    """The H200's MUFU table models on ``device`` (cached): ``ex2``, ``rcp``, ``tanh``; with ``trig`` ``sin``, ``cos``."""
    return _models(str(torch.device(device)), trig)


def _require_fp32(x: torch.Tensor, what: str) -> None:
    if x.dtype != torch.float32:
        raise TypeError(f"special_functions='fast_sm90' {what}: expected a float32 tensor, got {x.dtype}")


class SpecialFunctions:
    """exp, σ, tanh, cos/sin of one ``special_functions`` kind (see the module docstring)."""

    def __init__(self, kind: str):
        if kind not in KINDS:
            raise ValueError(f"special_functions must be one of {KINDS}, got {kind!r}")
        self.kind = kind

    @property
    def fast(self) -> bool:
        return self.kind != "accurate"

    def exp(self, x: torch.Tensor) -> torch.Tensor:
        """e^x (TileLang's ``expf`` under fast math: MUFU.EX2 of fl32(x·log2 e), subnormal results flushed)."""
        if not self.fast:
            return torch.exp(x)
        _require_fp32(x, "exp")
        scaled = x * torch.tensor(mufu.LOG2E_FP32, dtype=torch.float32, device=x.device)
        return models(x.device)["ex2"](scaled)

    def triton_exp(self, x: torch.Tensor) -> torch.Tensor:
        """``tl.exp`` of the FP32 Triton helpers: :meth:`exp` (their ``ex2.approx.f32`` keeps subnormal results,
        which this flushes: see the module docstring)."""
        return self.exp(x)

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        """σ(x) = 1 / (1 + e^−x) (fast math: MUFU.RCP of fl32(1 + exp(−x)))."""
        if not self.fast:
            return torch.sigmoid(x)
        _require_fp32(x, "sigmoid")
        return models(x.device)["rcp"](1.0 + self.exp(-x))

    def triton_sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        """``tl.sigmoid`` of the FP32 Triton helpers, ``1 / (1 + tl.exp(-x))`` with ``div.full.f32``: under fast
        math :meth:`sigmoid`, i.e. ``div.full.f32`` of 1 modelled as MUFU.RCP of the divisor (``1 + e`` is the same
        whether ``ex2`` flushed a subnormal ``e`` or not). Evidence: the H200's ``ddt_core`` on every golden case;
        divisors above 2^126 (x < −87.3), where ``div.full`` rescales, are not covered."""
        return self.sigmoid(x)

    def torch_sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        """``torch.sigmoid`` as a caller outside the kernels evaluates it on the device (the decode step's gate
        ``σ(trap_proj)``, formed by ``Mamba3.step``): ``"accurate"`` is torch's on the CPU; ``"fast_sm90"`` torch's
        CUDA kernel on the H200, ``1 / (1 + expf(−x))`` in FP32 with CUDA's ``expf`` (:func:`cuda_expf`) and IEEE
        division (torch is compiled without fast math)."""
        if not self.fast:
            return torch.sigmoid(x)
        _require_fp32(x, "torch_sigmoid")
        return 1.0 / (1.0 + cuda_expf(-x))

    def tanh(self, x: torch.Tensor) -> torch.Tensor:
        """tanh(x) (fast math and Triton's ``tanh_approx``: MUFU.TANH)."""
        if not self.fast:
            return torch.tanh(x)
        _require_fp32(x, "tanh")
        return models(x.device)["tanh"](x)

    def cos_sin(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(cos x, sin x) (fast math: MUFU.COS/SIN of RZ32(x·fl32(1/2π)))."""
        if not self.fast:
            return x.cos(), x.sin()
        _require_fp32(x, "cos/sin")
        trig = models(x.device, trig=True)
        return trig["cos"](x), trig["sin"](x)


def f32_constant(bits: int) -> float:
    """The float32 value of a bit pattern (a constant read from a compiled kernel's PTX)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


#: CUDA's ``expf`` constants (as the PTX writes them): log2 e / 256, the high and low parts of log2 e.
_EXPF_LOG2E_OVER_256, _EXPF_LOG2E_HI, _EXPF_LOG2E_LO = (f32_constant(0x3BBB989D), f32_constant(0x3FB8AA3B),
                                                        f32_constant(0x32A57060))


def cuda_expf(x: torch.Tensor) -> torch.Tensor:
    """CUDA's accurate ``expf`` (not fast math) on the H200, bit for bit: the exponent ``n = ⌊sat(fma(x, log2 e/256,
    ½))·252⌋ − 126`` (``cvt.sat``, then ``fma.rm`` against 1.5·2^23 + 1), the reduced argument ``f = fma(x, log2e_lo,
    fma(x, log2e_hi, −n))``, then ``ex2.approx.ftz(f)·2^n`` (MUFU.EX2 by :mod:`mimo_numerics.mufu`'s table, the
    product rounded once, subnormals kept). ``x`` ``[...]`` float32. Evidence: ``torch.sigmoid`` of every gate of
    the decode step's H200 golden data (1248 values, ``tests/ops/mamba3_mimo/test_decode_step_golden.py``);
    ``scripts/check_cuda_sigmoid.py`` compares every float32 on a GPU."""
    from ...rounding import fma_fp32

    _require_fp32(x, "cuda_expf")

    def const(value):
        return torch.full_like(x, value)

    scaled = torch.nan_to_num(fma_fp32(x, const(_EXPF_LOG2E_OVER_256), const(0.5)), nan=0.0).clamp(0.0, 1.0)
    n = torch.floor(scaled.double() * 252.0) - 126.0  # exact: a float32 in [0, 1] times 252
    reduced = fma_fp32(x, const(_EXPF_LOG2E_LO), fma_fp32(x, const(_EXPF_LOG2E_HI), (-n).float()))
    return (models(x.device)["ex2"](reduced).double() * torch.pow(2.0, n)).float()


def special_functions(policy) -> SpecialFunctions:
    """The :class:`SpecialFunctions` of ``policy.special_functions``."""
    return SpecialFunctions(policy.special_functions)


ACCURATE = SpecialFunctions("accurate")
