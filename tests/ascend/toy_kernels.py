"""Small Triton kernels for the Ascend compile gate's own tests (tests/ascend/test_ascend_gate.py).

``plans()`` returns launch plans in the gate's format: two kernels that compile on Ascend, one whose tile
deliberately overflows the 192 KiB unified buffer, and two constructs triton-ascend 3.2.0 rejects at compile time
on this machine: an fp64 cast (BiShengIR aborts: "unsupported datatype for arith::ExtFOp to hfusion") and a
``tl.dot`` with ``input_precision="tf32"`` (the front end asserts).

Measured here, NOT rejected before ``hivmc`` (so the gate cannot catch them; keep avoiding them by the portability
rules): uint32 loads and casts, tensor shift amounts, ``tl.where`` on int64, ``tl.sort``, a (2, 1, 0)
``tl.permute``, ``tl.cumsum`` on bf16, ``inline_asm_elementwise``.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def toy_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    safe = tl.where(m, offs, 0)
    a = tl.load(x_ptr + safe, mask=m, other=0.0)
    b = tl.load(y_ptr + safe, mask=m, other=0.0)
    tl.store(out_ptr + safe, a + b, mask=m)


@triton.jit
def toy_dot_bf16(a_bits, b_bits, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    # bf16 carried as int16 bits (portability rule 1), widened, then fed to the cube as bf16.
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = (tl.load(a_bits + rm[:, None] * K + rk[None, :]).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    b = (tl.load(b_bits + rk[:, None] * N + rn[None, :]).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    c = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], c)


@triton.jit
def toy_loop_mul_add(x_ptr, y_ptr, out_ptr, n, n_tiles, BLOCK: tl.constexpr):
    # persistent loop: with BLOCK = 16384 the double-buffered tiles overflow the UB; BiShengIR retries without
    # auto multi-buffering and then fits (128 KiB)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        a = tl.load(x_ptr + offs, mask=m, other=0.0)
        b = tl.load(y_ptr + offs, mask=m, other=0.0)
        tl.store(out_ptr + offs, a * b + a, mask=m)


@triton.jit
def toy_oversized_tile(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    # One fp32 tile of R x C with a few live temporaries: 128 x 256 x 4 B = 128 KiB per tensor, far above the
    # ~96 KiB double-buffered budget of the unified buffer.
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + r * C + c)
    y = tl.exp(x) * x + 1.0
    tl.store(out_ptr + r * C + c, y)


@triton.jit
def toy_tf32_dot(a_ptr, b_ptr, out_ptr, M: tl.constexpr):
    r = tl.arange(0, M)
    a = tl.load(a_ptr + r[:, None] * M + r[None, :])
    b = tl.load(b_ptr + r[:, None] * M + r[None, :])
    tl.store(out_ptr + r[:, None] * M + r[None, :], tl.dot(a, b, input_precision="tf32"))


@triton.jit
def toy_fp64_cast(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, (x.to(tl.float64) * 3.0).to(tl.float32))


def _t(n, dtype):
    return torch.empty(n, dtype=dtype)


def plans_ok():
    f32, i16 = torch.float32, torch.int16
    return [
        dict(kernel=toy_add, args=(_t(1024, f32), _t(1024, f32), _t(1024, f32), 1000), kwargs=dict(BLOCK=1024),
             grid=(1,), name="BLOCK=1024"),
        dict(kernel=toy_dot_bf16, args=(_t(64 * 64, i16), _t(64 * 64, i16), _t(64 * 64, f32)),
             kwargs=dict(M=64, N=64, K=64), grid=(1,), name="64x64x64 bf16"),
    ]


def plan_fits_without_multibuffer():
    f32 = torch.float32
    return dict(kernel=toy_loop_mul_add, args=(_t(16384, f32), _t(16384, f32), _t(16384, f32), 100000, 7),
                kwargs=dict(BLOCK=16384), grid=(4,), name="BLOCK=16384 loop")


def plan_oversized():
    return dict(kernel=toy_oversized_tile, args=(_t(128 * 256, torch.float32), _t(128 * 256, torch.float32)),
                kwargs=dict(R=128, C=256), grid=(1,), name="R=128 C=256 fp32")


def plan_fp64():
    return dict(kernel=toy_fp64_cast, args=(_t(256, torch.float32), _t(256, torch.float32)),
                kwargs=dict(BLOCK=256), grid=(1,), name="fp64 cast")


def plan_tf32():
    f32 = torch.float32
    return dict(kernel=toy_tf32_dot, args=(_t(32 * 32, f32), _t(32 * 32, f32), _t(32 * 32, f32)),
                kwargs=dict(M=32), grid=(1,), name="tf32 dot")


def plans_bad():
    return [plan_oversized(), plan_fp64(), plan_tf32()]


def plans():
    return plans_ok() + plans_bad()
