"""Triton rounding helpers: bf16/fp16 round-to-nearest-even with integer bit operations, on every backend.

Every narrowing in the kernels goes through this module (``triton_portability.md`` rule 1): Triton's interpreter
truncates on ``.to(tl.bfloat16)``, so a native cast would make the CPU run and the devices disagree. Values stay in
FP32 registers; a "rounded" value is an FP32 number on the low-precision grid, and only output stores turn it into
the 16-bit pattern (carried as int16, never as a bf16/fp16 tensor).

The format is a constexpr ``LPK``: 0 = bfloat16, 1 = float16 (integer helpers, the default on every backend);
2 and 3 are the same formats rounded by the backend's native RNE conversion (``cvt.rn`` on NVIDIA: bit-identical
results, fewer instructions; the launcher's ``native_lp`` code form, on by default on CUDA only, never used by the
interpreter, whose conversion truncates, nor on Ascend). One helper per format, used at every site:

* ``_rne_bf16_u`` / ``_rne_f16_u``: FP32 bit pattern (int32) -> FP32 bit pattern of the RNE-rounded value.
  Subnormals (fp16: |x| < 2**-14 rounds to a multiple of 2**-24), overflow to inf, NaN kept NaN.
* ``rnd`` / ``rnd_if``: FP32 -> FP32 on the grid (``rnd_if`` rounds only when its constexpr switch is on).
* ``enc`` / ``dec``: FP32 on the grid <-> int16 bit pattern (``enc`` rounds first, so it is always a correct RNE).
* ``rnd_sum``: the exact ``a + b`` rounded once (``diag_mode="fma"``): TwoSum in FP32, then the residual's sign
  breaks exact ties, as ``mimo_numerics.rounding.round_sum_to_lp`` does (bit-identical for the same FP32 inputs).

Also here, because the kernels may only call jit functions of their own (interpreted or compiled) build: ``tsum``,
``tcumsum`` and ``fzeros`` (``tl.sum``/``tl.zeros`` are jit functions of triton.language), ``sigmoid``, ``sincos`` (portable
sin/cos), ``silu_parts`` (the Z gate's functions from one exp), and the ``tl.dot`` operand helpers ``operand``,
``bits_operand``, ``mma``, ``mma_acc``.

Only int32 bit operations with constant shift amounts, FP32 add/sub/mul and compares are used: no inline assembly,
no fp64, no unsigned types (Triton-Ascend lacks uint tensors and tensor shift amounts), and libdevice only in the
CUDA-only ``RCP_APPROX`` branch of ``silu_parts`` (never traced by the interpreter or triton-ascend).
"""

import triton
import triton.language as tl

try:  # CUDA's reciprocal-multiply (div.approx.f32); traced only in RCP_APPROX branches, which only CUDA launches take
    from triton.language.extra.cuda import libdevice as _cuda_libdevice
except ImportError:  # pragma: no cover - Triton builds without the CUDA backend (triton-ascend)
    _cuda_libdevice = None

try:  # the combine function of tl.sum: Triton's interpreter maps a reduce with it onto numpy's sum
    from triton.language.standard import _sum_combine
except ImportError:  # pragma: no cover - other Triton layouts

    @triton.jit
    def _sum_combine(a, b):
        return a + b


@triton.jit
def _rne_bf16_u(u):
    """RNE of the FP32 pattern ``u`` (int32) to bfloat16; returns the FP32 pattern (low 16 bits zero unless NaN)."""
    a = u & 0x7FFFFFFF
    # the carry out of the low half propagates into the exponent: largest finite + half ulp gives inf
    r = (u + 0x7FFF + ((u >> 16) & 1)) & -65536
    # NaN: keep it NaN (set the quiet bit, which lies in the kept half)
    return tl.where(a > 0x7F800000, u | 0x400000, r)


@triton.jit
def _rne_f16_u(u):
    """RNE of the FP32 pattern ``u`` (int32) to float16; returns the FP32 pattern of the rounded value."""
    a = u & 0x7FFFFFFF
    sign = u ^ a
    # normal range [2**-14, 65520): drop 13 mantissa bits; 65520 (the tie above 65504) and beyond become inf
    rn = (a + 0xFFF + ((a >> 13) & 1)) & -8192
    rn = tl.where(rn >= 0x47800000, 0x7F800000, rn)
    # subnormal range: an FP32 add at the binade [0.5, 1) rounds |x| to a multiple of 2**-24 (one RNE rounding);
    # subtracting 0.5 again is exact (Sterbenz)
    ax = a.to(tl.float32, bitcast=True)
    rs = ((ax + 0.5) - 0.5).to(tl.int32, bitcast=True)
    r = tl.where(a < 0x38800000, rs, rn)
    r = tl.where(a > 0x7F800000, a | 0x400000, r)
    return r | sign


@triton.jit
def _native_rnd(x, LPK: tl.constexpr):
    if LPK % 2 == 0:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        return x.to(tl.float16).to(tl.float32)


@triton.jit
def rnd(x, LPK: tl.constexpr):
    """Round FP32 ``x`` to the low-precision grid (RNE); the result is FP32."""
    if LPK >= 2:
        return _native_rnd(x, LPK)
    else:
        u = x.to(tl.int32, bitcast=True)
        if LPK == 0:
            r = _rne_bf16_u(u)
        else:
            r = _rne_f16_u(u)
        return r.to(tl.float32, bitcast=True)


@triton.jit
def rnd_if(x, ON: tl.constexpr, LPK: tl.constexpr):
    """``rnd(x)`` when the policy switch ``ON`` is set, else ``x`` unchanged."""
    if ON:
        return rnd(x, LPK)
    else:
        return x


@triton.jit
def enc(x, LPK: tl.constexpr):
    """FP32 ``x`` -> int16 bit pattern of RNE(x) in bfloat16 (LPK=0) or float16 (LPK=1)."""
    u = x.to(tl.int32, bitcast=True)
    if LPK == 2:
        bits = x.to(tl.bfloat16).to(tl.int16, bitcast=True)
    elif LPK == 3:
        bits = x.to(tl.float16).to(tl.int16, bitcast=True)
    elif LPK == 0:
        # arithmetic shift: the result always fits int16
        bits = _rne_bf16_u(u) >> 16
    else:
        r = _rne_f16_u(u)
        a = r & 0x7FFFFFFF
        normal = (a >> 13) - 0x1C000
        # clamp so that the (unused) large lanes do not overflow the int conversion
        sub = (tl.where(a < 0x38800000, a, 0).to(tl.float32, bitcast=True) * 16777216.0).to(tl.int32)
        mag = tl.where(a >= 0x38800000, normal, sub)
        mag = tl.where(a >= 0x7F800000, tl.where(a == 0x7F800000, 0x7C00, 0x7E00), mag)
        # two's complement of sign|mag, kept inside the int16 range (no wrapping conversion needed)
        bits = tl.where(r < 0, mag - 32768, mag)
    return bits.to(tl.int16)


@triton.jit
def dec(bits, LPK: tl.constexpr):
    """int16 bit pattern of a bfloat16 (LPK=0) or float16 (LPK=1) value -> FP32 (exact).

    LPK 2, 3 (devices): the bits reinterpreted as bf16/fp16 and widened by the hardware (the same exact values in one
    instruction instead of a sign extension and a shift)."""
    if LPK == 2:
        x = bits.to(tl.bfloat16, bitcast=True).to(tl.float32)
    elif LPK == 3:
        x = bits.to(tl.float16, bitcast=True).to(tl.float32)
    else:
        h = bits.to(tl.int32)
        if LPK == 0:
            u = h << 16
        else:
            mag = h & 0x7FFF
            e = mag >> 10
            normal = (mag << 13) + 0x38000000
            special = (mag << 13) | 0x7F800000
            sub = ((mag & 0x3FF).to(tl.float32) * 5.9604644775390625e-08).to(tl.int32, bitcast=True)
            u = tl.where(e == 31, special, tl.where(e == 0, sub, normal))
            u = u | ((h >> 31) << 31)
        x = u.to(tl.float32, bitcast=True)
    return x


@triton.jit
def rnd_sum(a, b, LPK: tl.constexpr):
    """RNE of the exact sum ``a + b`` to the low-precision grid, rounded once (FP32 result).

    TwoSum gives ``s = fl(a + b)`` and the exact error ``e``. Rounding ``s`` alone is right unless ``s`` is exactly
    halfway between two low-precision neighbours and ``e != 0``: then ``s`` is nudged by one FP32 ulp toward the
    exact value (no FP32 number lies between, so no other rounding boundary is crossed) and rounded.
    """
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    u = s.to(tl.int32, bitcast=True)
    au = u & 0x7FFFFFFF
    if LPK % 2 == 0:
        tie = (u & 0xFFFF) == 0x8000
    else:
        tie_normal = (u & 0x1FFF) == 0x1000
        # below 2**-14 the fp16 step is 2**-24: a tie is an odd multiple of 2**-25
        y = tl.where(au < 0x38800000, au, 0).to(tl.float32, bitcast=True) * 33554432.0
        yi = y.to(tl.int32)
        tie_sub = (yi.to(tl.float32) == y) & ((yi & 1) == 1)
        tie = tl.where(au < 0x38800000, tie_sub, tie_normal)
    tie = tie & (e != 0.0) & (au < 0x7F800000)
    away = (e > 0.0) == (s > 0.0)
    u = tl.where(tie, tl.where(away, u + 1, u - 1), u)
    return rnd(u.to(tl.float32, bitcast=True), LPK)


@triton.jit
def operand(x, LP_OPS: tl.constexpr, LPK: tl.constexpr):
    """A ``tl.dot`` operand: cast to bf16/fp16 when ``LP_OPS`` (values already on the grid, so exact), else FP32."""
    if LP_OPS:
        if LPK % 2 == 0:
            return x.to(tl.bfloat16)
        else:
            return x.to(tl.float16)
    else:
        return x


@triton.jit
def bits_operand(bits, LPK: tl.constexpr):
    """int16 lp bits reinterpreted as a bf16/fp16 ``tl.dot`` operand (devices only: the interpreter cannot dot
    bf16)."""
    if LPK % 2 == 0:
        return bits.to(tl.bfloat16, bitcast=True)
    else:
        return bits.to(tl.float16, bitcast=True)


@triton.jit
def mma(a, b, LP_OPS: tl.constexpr, LPK: tl.constexpr):
    """``a @ b`` with an FP32 result: low-precision operands on devices when exact, IEEE FP32 otherwise."""
    if LP_OPS:
        return tl.dot(operand(a, LP_OPS, LPK), operand(b, LP_OPS, LPK))
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def mma_acc(a, b, acc, LP_OPS: tl.constexpr, LPK: tl.constexpr):
    """``acc + a @ b`` accumulated into ``acc`` (the state GEMM of ``state_update="accumulate_into"``)."""
    if LP_OPS:
        return tl.dot(operand(a, LP_OPS, LPK), operand(b, LP_OPS, LPK), acc)
    else:
        return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def sigmoid(x):
    """1 / (1 + exp(-x)) in FP32 (the backend's exp)."""
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tsum(x, axis: tl.constexpr):
    """Sum over ``axis`` (``tl.sum`` for FP32 inputs without calling a jit function of ``triton.language``: the
    interpreted copy of these kernels can only call interpreted functions; the numpy fast path is kept)."""
    return tl.reduce(x, axis, _sum_combine)


@triton.jit
def tcumsum(x, axis: tl.constexpr):
    """Inclusive prefix sum over ``axis`` (``tl.cumsum`` for FP32 inputs as ``tsum`` is ``tl.sum``: the builtin
    scan with Triton's own sum combine, which the interpreter maps onto numpy's cumsum)."""
    return tl.associative_scan(x, axis, _sum_combine)


@triton.jit
def fzeros(M: tl.constexpr, N: tl.constexpr):
    """An [M, N] FP32 tile of zeros (``tl.full``, a builtin; ``tl.zeros`` is a jit function of triton.language)."""
    return tl.full([M, N], 0.0, tl.float32)


@triton.jit
def sincos(x):
    """sin(x), cos(x) in FP32 without libdevice (same formula on every backend; about 1 ulp for |x| < 1e4).

    Cody–Waite reduction by π/2 with a three-part constant whose first two parts have few significant bits (so
    k·part is exact for |k| < 2**12 without FMA), then minimax polynomials on [-π/4, π/4] (Cephes coefficients)
    and the quadrant's sign/swap.
    """
    k = tl.floor(x * 0.6366197723675814 + 0.5)
    rr = ((x - k * 1.5703125) - k * 4.837512969970703125e-4) - k * 7.54978995489188216e-8
    z = rr * rr
    s = rr + rr * z * ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1)
    c = 1.0 - 0.5 * z + z * z * ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2)
    quad = k.to(tl.int32) & 3
    sin_x = tl.where(quad == 0, s, tl.where(quad == 1, c, tl.where(quad == 2, -s, -c)))
    cos_x = tl.where(quad == 0, c, tl.where(quad == 1, -s, tl.where(quad == 2, -c, s)))
    return sin_x, cos_x


@triton.jit
def silu_parts(x, SILU_TANH: tl.constexpr, RCP_APPROX: tl.constexpr):
    """The Z-branch special functions of x = z·ζ from one exp and one reciprocal: (gate, σ(x), σ(−x)).

    With e = exp(−|x|) and w = 1/(1 + e): σ(|x|) = w, σ(−|x|) = e·w and tanh(|x|/2) = (1 − e)·w, so
    gate = x/2·tanh(x/2) + x/2 (``SILU_TANH``) or x·σ(x). No cancellation except in 1 − e for tiny |x|, where
    the tanh term is negligible next to x/2.

    ``RCP_APPROX`` (CUDA only): w as ``div.approx.f32`` (rcp.approx, then a multiply) instead of the ``div.full.f32``
    that ``/`` compiles to: both are within 2 ulp, and for denominators in [1, 2], as here, div.full does no operand
    scaling, so the two give the same bits (checked on the H200: ``test_gpu_rcp_approx_gives_the_same_bits``) for
    about a third of the instructions.
    """
    e = tl.exp(-tl.abs(x))
    if RCP_APPROX:
        w = _cuda_libdevice.fast_dividef(1.0, 1.0 + e)
    else:
        w = 1.0 / (1.0 + e)
    ew = e * w
    pos = x >= 0.0
    sig = tl.where(pos, w, ew)
    sig_neg = tl.where(pos, ew, w)
    if SILU_TANH:
        hx = x * 0.5
        gate = tl.abs(hx) * ((1.0 - e) * w) + hx
    else:
        gate = x * sig
    return gate, sig, sig_neg
