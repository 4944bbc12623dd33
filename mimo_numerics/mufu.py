"""NVIDIA's fast-math special functions (the SFU's ``MUFU`` instructions), emulated bit for bit in torch (any device).

Upstream's TileLang kernels are compiled with ``--use_fast_math``: ``exp`` becomes ``ex2.approx.ftz.f32`` of
``fl32(x·log2 e)``, ``sin``/``cos`` become ``sin/cos.approx.ftz.f32`` (``FMUL.RZ`` by fl32(1/2π), then
``MUFU.SIN/COS`` of those turns), ``tanh`` becomes ``tanh.approx.f32`` and a division ``a/b`` becomes
``a·rcp.approx.ftz.f32(b)``. None of them is correctly rounded, so a reference that wants upstream's bits must
compute what the hardware computes.

Each function here is a *table model*: the hardware's output is a function of a short key of the input (a
fixed-point fraction, or the high bits of the float), looked up in a table measured on the GPU, then scaled and
signed as the model says. :class:`MufuModel` holds one function's model (its parameters and table); the tables were
fitted and the models proven on **all 2^32 float32 inputs** against an H200 by ``scripts/fit_mufu_models.py``
(``reports/mufu_models_h200.md``); they ship in ``mimo_numerics/data/mufu_sm90*.npz``. The proven models:

``ex2`` (``fraction_bits`` 23, ``rounding="magnitude"``)
    ``X = trunc(|x|·2^23)``, ``n = X >> 23``, ``j = X mod 2^23``; ``ex2(x) = T[j]·2^n`` for x >= 0 and
    ``T[2^23 + j]·2^-n`` for x < 0; results below 2^-126 flush to +0, 2^128 and above are +inf.
``rcp`` (``dropped_bits`` 0)
    ``x = ±m·2^e`` (m in [1, 2)); ``rcp(x) = ±T[mantissa]·2^-e``; subnormal inputs are ±0 (so ±inf out),
    results below 2^-126 flush to ±0.
``sin``, ``cos`` (``reduction="magnitude_fixed"``, ``fraction_bits`` 25)
    ``t = RZ32(x·fl32(1/2π))``, ``j = trunc(|t|·2^25) mod 2^25``, output ``T[j]``, negated for sin of a negative t.
``tanh`` (``dropped_bits`` 2, ``lo`` = the bits of 2^-8, ``hi`` = the bits of 8)
    odd; ``|x| < lo``: x itself (no ``.ftz``: subnormals pass); ``|x| >= hi``: 1; between:
    ``T[(bits(|x|) - lo) >> 2]``.

The other parameter values (``rounding`` ``floor``/``trunc``/``nearest``, ``reduction`` ``fixed``/
``magnitude_float``/``quadrant``) are the candidates the fit tried; the report lists their mismatch counts.

Inputs are float32 tensors; subnormal inputs are flushed to (signed) zero first for the ``.ftz`` instructions.
NaN inputs give NaN. All arithmetic that builds a result is exact (float64 products of float32 values and powers of
two), so the emulation gives the same bits on every device.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

import torch

from .tensor_core import pow2

#: fl32(1/2π), the constant of the ``FMUL.RZ`` in front of ``MUFU.SIN``/``MUFU.COS``.
INV_TWO_PI_FP32 = float(torch.tensor(1.0 / (2.0 * math.pi), dtype=torch.float32))
#: fl32(log2 e), the constant of the ``FMUL`` in front of ``MUFU.EX2`` for ``expf``.
LOG2E_FP32 = float(torch.tensor(math.log2(math.e), dtype=torch.float32))
_TINY = 2.0 ** -126
#: |t| is clamped here before its fixed-point key is taken: every FP32 value of 2^23 or more is an integer (key 0),
#: and t·2^F stays far inside int64 (a float -> int64 conversion out of range is device-dependent).
_LARGE = 2.0 ** 30
ROUNDINGS = ("floor", "trunc", "nearest")
#: ex2 also knows ``magnitude``: |x| truncated, the sign a key bit, ``2^-n`` for negative x.
EX2_ROUNDINGS = ROUNDINGS + ("magnitude",)


@dataclasses.dataclass
class MufuModel:
    """One function's table model (see the module docstring).

    Attributes:
        function (str): ``ex2``, ``rcp``, ``sin``, ``cos`` or ``tanh``.
        params (dict): the model's parameters (``fraction_bits``, ``rounding``, ``dropped_bits``, ``lo``, ``hi``).
        table (Tensor): ``[K]`` int32, the float32 bit patterns of the table.
    """

    function: str
    params: Dict[str, object]
    table: torch.Tensor

    def to(self, device) -> "MufuModel":
        return MufuModel(self.function, dict(self.params), self.table.to(device))

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        """The table index of every element of ``x`` (int64; meaningful where the model looks the table up)."""
        return _KEYS[self.function](self, x if self.function in _NO_FTZ else _ftz(x))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"MufuModel({self.function!r}): x must be float32, got {x.dtype}")
        return _APPLY[self.function](self, x if self.function in _NO_FTZ else _ftz(x))


def bits_of(x: torch.Tensor) -> torch.Tensor:
    """float32 -> its bit pattern as int64 in [0, 2^32)."""
    return x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def float_of(bits: torch.Tensor) -> torch.Tensor:
    """int64 bit patterns in [0, 2^32) -> float32."""
    return bits.to(torch.int32).view(torch.float32)


def _ftz(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.abs() < _TINY, x * 0.0, x)


def _table_values(model: MufuModel, index: torch.Tensor) -> torch.Tensor:
    index = index.clamp(0, model.table.numel() - 1)
    return model.table[index].view(torch.float32).to(torch.float64)


def _fixed_point(value64: torch.Tensor, fraction_bits: int, rounding: str) -> torch.Tensor:
    scaled = value64 * float(2 ** fraction_bits)
    if rounding == "floor":
        scaled = torch.floor(scaled)
    elif rounding == "trunc":
        scaled = torch.trunc(scaled)
    elif rounding == "nearest":
        scaled = torch.round(scaled)
    else:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return torch.nan_to_num(scaled, nan=0.0).to(torch.int64)


# ---- ex2 -------------------------------------------------------------------------------------------------------

def _ex2_parts(model, x):
    """(key, n, negative) of the fixed-point input; ``magnitude`` rounding converts |x| and keys on the sign."""
    F = int(model.params["fraction_bits"])
    rounding = str(model.params["rounding"])
    x64 = x.to(torch.float64).clamp(-1024.0, 1024.0)
    negative = torch.zeros_like(x, dtype=torch.bool)
    if rounding == "magnitude":
        negative = torch.signbit(x)
        X = _fixed_point(x64.abs(), F, "trunc")
    else:
        X = _fixed_point(x64, F, rounding)
    n = X >> F
    key = (X & ((1 << F) - 1)) + negative.to(torch.int64) * (1 << F)
    return key, torch.where(negative, -n, n), negative


def _ex2_keys(model, x):
    return _ex2_parts(model, x)[0]


def _ex2(model, x):
    key, n, _ = _ex2_parts(model, x)
    y = (_table_values(model, key) * pow2(n.clamp(-1022, 1023).to(torch.int32))).to(torch.float32)
    y = torch.where(y < _TINY, torch.zeros_like(y), y)
    return torch.where(torch.isnan(x), x, y)


# ---- rcp -------------------------------------------------------------------------------------------------------

def _rcp_keys(model, x):
    return (bits_of(x) & 0x7FFFFF) >> int(model.params["dropped_bits"])


def _rcp(model, x):
    b = bits_of(x)
    exponent = ((b >> 23) & 0xFF) - 127
    y = (_table_values(model, (b & 0x7FFFFF) >> int(model.params["dropped_bits"]))
         * pow2((-exponent).clamp(-1022, 1023).to(torch.int32))).to(torch.float32)
    y = torch.where(y < _TINY, torch.zeros_like(y), y)
    y = torch.where(x == 0, torch.full_like(y, math.inf), y)
    y = torch.where(torch.isinf(x), torch.zeros_like(y), y)
    y = torch.copysign(y, x)
    return torch.where(torch.isnan(x), x, y)


# ---- sin, cos --------------------------------------------------------------------------------------------------

def turns(x: torch.Tensor) -> torch.Tensor:
    """``RZ32(x·fl32(1/2π))`` with a flushed subnormal product: the ``FMUL.RZ`` in front of MUFU.SIN/COS."""
    exact = x.to(torch.float64) * INV_TWO_PI_FP32
    nearest = exact.to(torch.float32)
    away = nearest.to(torch.float64).abs() > exact.abs()
    t = torch.where(away, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)
    t = torch.where(torch.isinf(x), x, t)  # the product of a finite x stays finite
    return _ftz(t)


def _quadrant_parts(model, x):
    """(key, negate) of the ``quadrant`` reduction: j = trunc(|t|·2^F) mod 2^F (cos: plus a quarter turn), the
    quadrant q = j >> (F-2); the key folds the quadrant onto the first (mirrored in odd quadrants); q >= 2 negates."""
    F = int(model.params["fraction_bits"])
    quarter = 1 << (F - 2)
    t = turns(x)
    j = _fixed_point(t.abs().to(torch.float64).clamp(max=_LARGE), F, "trunc") & ((1 << F) - 1)
    if model.function == "cos":
        j = (j + quarter) & ((1 << F) - 1)
    q = j >> (F - 2)
    i = j & (quarter - 1)
    key = torch.where((q & 1) == 1, quarter - i, i)
    negate = q >= 2
    if model.function == "sin":
        negate = negate ^ torch.signbit(t)
    return key, negate


def _trig_keys(model, x):
    reduction = str(model.params.get("reduction", "fixed"))
    if reduction == "quadrant":
        return _quadrant_parts(model, x)[0]
    t = turns(x)
    if reduction == "fixed":
        F = int(model.params["fraction_bits"])
        t64 = t.to(torch.float64).clamp(-_LARGE, _LARGE)
        return _fixed_point(t64, F, str(model.params["rounding"])) & ((1 << F) - 1)
    a = t.abs().to(torch.float64).clamp(max=_LARGE)
    if reduction == "magnitude_fixed":
        F = int(model.params["fraction_bits"])
        return _fixed_point(a, F, "trunc") & ((1 << F) - 1)
    if reduction == "magnitude_float":  # the fraction of |t| (exact), keyed by its float bits
        r = torch.nan_to_num(a - torch.floor(a), nan=0.0).to(torch.float32)
        return bits_of(r) >> int(model.params["dropped_bits"])
    raise ValueError(f"unknown reduction {reduction!r}")


def trig_sign(model, x) -> torch.Tensor:
    """Where the model negates the table value (bool, x's shape)."""
    reduction = str(model.params.get("reduction", "fixed"))
    if reduction == "quadrant":
        return _quadrant_parts(model, x)[1]
    if reduction != "fixed" and model.function == "sin":
        return torch.signbit(turns(x))
    return torch.zeros_like(x, dtype=torch.bool)


def _trig(model, x):
    y = _table_values(model, _trig_keys(model, x)).to(torch.float32)
    y = torch.where(trig_sign(model, x), -y, y)
    return torch.where(torch.isfinite(x), y, torch.full_like(y, math.nan))


# ---- tanh ------------------------------------------------------------------------------------------------------

def _tanh_keys(model, x):
    lo, k = int(model.params["lo"]), int(model.params["dropped_bits"])
    return ((bits_of(x) & 0x7FFFFFFF) - lo) >> k


def _tanh(model, x):
    lo, hi = int(model.params["lo"]), int(model.params["hi"])
    magnitude = bits_of(x) & 0x7FFFFFFF
    y = _table_values(model, _tanh_keys(model, x)).to(torch.float32)
    y = torch.where(magnitude < lo, x.abs(), y)
    y = torch.where(magnitude >= hi, torch.ones_like(y), y)
    y = torch.copysign(y, x)
    return torch.where(torch.isnan(x), x, y)


_KEYS = {"ex2": _ex2_keys, "rcp": _rcp_keys, "sin": _trig_keys, "cos": _trig_keys, "tanh": _tanh_keys}
_APPLY = {"ex2": _ex2, "rcp": _rcp, "sin": _trig, "cos": _trig, "tanh": _tanh}
FUNCTIONS = tuple(_APPLY)
#: ``tanh.approx.f32`` has no ``.ftz``: subnormal inputs pass through.
_NO_FTZ = ("tanh",)


def empty_model(function: str, params: Dict[str, object], size: int, device=None) -> MufuModel:
    """A model with an all-zero table of ``size`` entries (for fitting)."""
    if function not in _APPLY:
        raise ValueError(f"function must be one of {FUNCTIONS}, got {function!r}")
    return MufuModel(function, dict(params), torch.zeros(size, dtype=torch.int32, device=device))


def _encode(table):
    """int32 table -> (head [first value, first difference, size], second differences as int8, and the positions
    and values of the second differences outside int8 (zero crossings, binade steps))."""
    import numpy as np

    t = table.astype(np.int64)
    d1 = np.diff(t)
    d2 = np.diff(d1)
    outside = np.nonzero((d2 < -127) | (d2 > 127))[0]
    small = d2.copy()
    small[outside] = 0
    head = [int(t[0]) if t.size else 0, int(d1[0]) if d1.size else 0, int(t.size)]
    return head, small.astype(np.int8), outside.astype(np.int64), d2[outside]


def _decode(head, small, outside, values) -> torch.Tensor:
    first, slope, size = head
    d2 = torch.from_numpy(small).to(torch.int64)
    d2[torch.from_numpy(outside)] = torch.from_numpy(values)
    d1 = torch.cat([torch.tensor([slope]), slope + torch.cumsum(d2, 0)])
    table = torch.cat([torch.tensor([first]), first + torch.cumsum(d1, 0)])[:size]
    return table.to(torch.int32)


def _segments(model: MufuModel):
    """The key ranges inputs can reach, as ``[start, stop, stride]``: a ``magnitude_fixed`` trig key j = |t|·2^F of
    an FP32 t in [2^-k-1, 2^-k) is a multiple of 2^max(0, F-24-k); other models reach every key."""
    size = model.table.numel()
    if model.params.get("reduction") != "magnitude_fixed":
        return [[0, size, 1]]
    F = int(model.params["fraction_bits"])
    segments, stop, k = [], size, 0
    while stop > 1 and (1 << max(0, F - 24 - k)) > 1:
        start = stop >> 1
        segments.append([start, stop, 1 << (F - 24 - k)])
        stop, k = start, k + 1
    segments.append([0, stop, 1])
    return sorted(segments)


def _pack(table, segments):
    import numpy as np

    return np.concatenate([table[a:b:c] for a, b, c in segments])


def _unpack(packed: torch.Tensor, segments) -> torch.Tensor:
    parts, offset = [], 0
    for a, b, c in segments:
        n = len(range(a, b, c))
        parts.append(packed[offset:offset + n].repeat_interleave(c)[: b - a])
        offset += n
    return torch.cat(parts)


def _xz(array) -> "np.ndarray":
    import lzma

    import numpy as np

    return np.frombuffer(lzma.compress(array.tobytes(), preset=9 | lzma.PRESET_EXTREME), dtype=np.uint8)


def _unxz(data, dtype) -> "np.ndarray":
    import lzma

    import numpy as np

    return np.frombuffer(lzma.decompress(bytes(data)), dtype=dtype).copy()


def save_models(models: Dict[str, MufuModel], path) -> None:
    """Write models to one ``.npz``: each table as its second differences (smooth functions make them small
    integers), xz-compressed; the parameters as JSON."""
    import json
    import lzma

    import numpy as np

    arrays, meta = {}, {}
    for name, m in models.items():
        segments = _segments(m)
        head, small, outside, values = _encode(_pack(m.table.cpu().numpy(), segments))
        arrays.update({f"{name}_d2": _xz(small), f"{name}_at": _xz(np.diff(outside, prepend=0)),
                       f"{name}_big": _xz(values)})
        meta[name] = {"function": m.function, "params": m.params, "head": head, "segments": segments}
    np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def load_models(path, device: Optional[torch.device] = None) -> Dict[str, MufuModel]:
    """Read models written by :func:`save_models`."""
    import json
    import lzma

    import numpy as np

    with np.load(path) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        models = {}
        for name, entry in meta.items():
            small = _unxz(data[f"{name}_d2"], np.int8)
            outside = np.cumsum(_unxz(data[f"{name}_at"], np.int64))
            table = _decode(entry["head"], small, outside, _unxz(data[f"{name}_big"], np.int64))
            table = _unpack(table, entry.get("segments", [[0, table.numel(), 1]]))
            models[name] = MufuModel(entry["function"], entry["params"], table.to(device))
        return models
