"""Launcher of the Triton stage-2 kernels ``mamba_mimo_bwd_bwd``: validation, constexprs, workspaces, launches.

``mamba_mimo_bwd_bwd(*tensors, chunk_size, rotary_dim_divisor, dtype, policy)`` takes the stage-2 reference's 19
tensors (``mimo_numerics/ops/mamba_mimo_bwd_bwd/reference.py``) in the same order and returns the same
``MimoBwdBwdOutputs`` after the same validation. Kernels: ``_bwd_bwd_kernels.py`` (and stage 1's angles kernel and
dmimo sum). Every switch of ``policy.mamba_mimo_bwd_bwd`` reaches the kernels as an upper-case constexpr
(:func:`stage2_constexprs`, the one place for this operator).

Plan (:func:`stage2_tiles`, :class:`Stage2Tiles`): blocks of fused rows and of tokens per program of the
chunk-parallel kernels (whole chunks in the interpreter, up to 32 rows on CUDA; on Ascend 8 rows and 16
tokens: :func:`npu_tiles`), the reverse walk on tiles of at most 64 × 64 (16 × 16 on Ascend). A plan changes FP32
summation orders only (``tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_kernels.py::test_stage2_tile_plans_agree``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.ops.mamba_mimo_bwd_bwd.sites import SITES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import MimoBwdBwdOutputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.validation import validate_inputs
from mimo_numerics.policy import FP32_LEVEL_DEFAULTS, RoundingPolicy

from . import _backend
from ._config import ANGLES_BLOCK, UnsupportedPolicyError, per_policy
from ._launch import (INTERPRETER_LIMIT_S, LP_NAN_BITS, Launch, SlowInterpreterError, check_sizes,
                      estimate_interpreter_seconds, kwargs_for, require_triton)

#: The policy section that configures these kernels.
OPERATOR_NAME = "mamba_mimo_bwd_bwd"
#: Columns per program of the dmimo_v sum.
_SUM_BLOCK = 32
#: Ascend: the bounds within which the stage-2 programs fit the 192 KiB unified buffer under the Ascend plan
#: (:func:`stage2_tiles`): the state N·P, and LP·(N + P) (the k-side and q-side kernels hold whole-chunk [LP, N] and
#: [LP, P] tiles and the [N, P] state). Measured by the compile gate (``scripts/ascend_compile_gate.py --operators
#: mamba_mimo_bwd_bwd``): every case within both passes (up to N·P = 64·64 and LP·(N + P) = 128·96); outside,
#: N = P = 128 (C·R = 128) overflows with 4.6 Mbit, N, P = 128, 64 (C·R = 128) with 2.7 Mbit and N, P = 64, 128
#: (C·R = 32) with 2.1 Mbit against 1.57 Mbit.
NPU_MAX_STATE = 64 * 64
NPU_MAX_CHUNK_TILES = 128 * 96


def backend_refusal(backend: str, state_dim: int, value_dim: int, fused_rows: int = 0) -> Optional[str]:
    """Why these kernels refuse sizes on ``backend``, or None. ``"npu"``: N·P above :data:`NPU_MAX_STATE` or
    LP·(N + P) above :data:`NPU_MAX_CHUNK_TILES` (LP: ``fused_rows`` = C·R padded to a power of 2, at least 16)."""
    if backend != "npu":
        return None
    lp = max(16, _pow2(fused_rows))
    if state_dim * value_dim > NPU_MAX_STATE or lp * (state_dim + value_dim) > NPU_MAX_CHUNK_TILES:
        return (f"N = {state_dim}, P = {value_dim} with C·R = {fused_rows}: the stage-2 programs would overflow "
                f"Ascend's 192 KiB unified buffer (supported: N·P <= {NPU_MAX_STATE} and LP·(N + P) <= "
                f"{NPU_MAX_CHUNK_TILES}, LP = C·R padded to a power of 2); use the stage-2 reference")
    return None


@per_policy
def stage2_constexprs(policy) -> Dict[str, object]:
    """The policy as the stage-2 kernels' constexprs: one upper-case bool per site of
    ``policy.section("mamba_mimo_bwd_bwd")``, ``LPK`` (0 bf16, 1 fp16), ``DIAG_FMA``, ``ACCUMULATE``, ``SILU_TANH``.

    Raises:
        UnsupportedPolicyError: ``math_dtype="float64"``, ``round_outputs=False`` or an FP32-level knob other than its
            honoured value (the message names the field). PolicyUndefined: no stage-2 section (``seed_bf16``).
    """
    policy = _presets.resolve(policy)
    if not isinstance(policy, RoundingPolicy):
        raise TypeError(f"policy must resolve to a RoundingPolicy, got {type(policy).__name__}")
    if policy.math_dtype != "float32":
        raise UnsupportedPolicyError(f"RoundingPolicy.math_dtype={policy.math_dtype!r} cannot be expressed by the "
                                     "Triton kernels: they compute in float32 only; use the reference")
    if policy.round_outputs is not True:
        raise UnsupportedPolicyError("RoundingPolicy.round_outputs=False cannot be expressed by the Triton kernels: "
                                     "dq, dk and dv are always stored in the lp dtype; use the reference")
    for knob, default in FP32_LEVEL_DEFAULTS.items():
        if getattr(policy, knob) != default:
            raise UnsupportedPolicyError(
                f"RoundingPolicy.{knob}={getattr(policy, knob)!r} is not implemented by the Triton kernels")
    sites = policy.section(OPERATOR_NAME)
    cx: Dict[str, object] = {name.upper(): bool(sites[name]) for name in SITES}
    cx.update(LPK=0 if policy.lp_dtype == "bfloat16" else 1, DIAG_FMA=policy.diag_mode == "fma",
              ACCUMULATE=policy.state_update == "accumulate_into", SILU_TANH=policy.silu_form == "tanh")
    return cx


def lp_dot_operands(cx: Mapping[str, object], dims, on_device: bool) -> Dict[str, bool]:
    """Which GEMMs of the chunk kernel and the walk take bf16/fp16 operands: on devices, those whose two operands
    hold lp values under the policy (the products are then exact and only the FP32 accumulation order changes);
    the interpreter computes every GEMM in IEEE FP32 (numpy cannot multiply bf16)."""
    q_rot = cx["QK_BIASED"] and cx["ROTARY"]
    dphio = ((cx["DPHIO"] if dims.reduce_o else True) and (cx["DPHIO_GATE"] if dims.has_z else True))
    khat, dop, psiv = cx["K_SCALED"], cx["DSTATES_OPERAND"], cx["PSIV"]
    lp = {"DOT_WALK_LP": q_rot and cx["DPHIO_SCALED"], "DOT_KD_LP": khat and dop, "DOT_KQ_LP": khat and q_rot,
          "DOT_SD_LP": cx["LKQ_MASKED"] and dphio, "DOT_PD_LP": psiv and dop, "DOT_PP_LP": psiv and dphio,
          "DOT_DQ_LP": cx["DKQ_MASKED"] and q_rot, "DOT_QS_LP": dphio, "DOT_DK_LP": cx["DKQ_MASKED"] and khat}
    return {k: bool(on_device and v) for k, v in lp.items()}


def workspace_formats(cx: Mapping[str, object], dims, backend: str = "cuda") -> Dict[str, bool]:
    """Which workspaces of the stage-2 kernels hold lp bits instead of FP32: those whose every value is on the lp
    grid under the policy (its last operation is a rounding site that is on), so storing them in lp is exact and
    halves their traffic. ``WS_QB``: q̃, k̃ (``qk_biased``); ``WS_QROT``: the rotated q̃, k̃ (and ``rotary``);
    ``WS_KHAT``: k̂ (``k_scaled``); ``WS_DPHIO``: dΦO (``dphio_gate`` with Z, else ``dphio`` with the reduced output,
    else DOUT itself); ``WS_DPS`` (``dphio_scaled``), ``WS_PSIV`` (``psiv``), ``WS_DPSIV`` (``dpsiv``), ``WS_DKROT``
    (``dk_scaled``), ``WS_DQROT`` (``dq_combined``). The values are the same either way. On Ascend (``backend="npu"``)
    every workspace stays FP32: with lp q̃, k̃ the token kernel's compile crashed triton-ascend's adapter or timed out
    in BiShengIR (fp16, N = P = 64, R = 4, C = 16; the compile gate)."""
    dphio = (cx["DPHIO_GATE"] if dims.has_z else (cx["DPHIO"] if dims.reduce_o else True))
    if backend == "npu":
        return {name: False for name in ("WS_QB", "WS_QROT", "WS_KHAT", "WS_DPHIO", "WS_DPS", "WS_PSIV", "WS_DPSIV",
                                         "WS_DKROT", "WS_DQROT")}
    return {"WS_QB": bool(cx["QK_BIASED"]), "WS_QROT": bool(cx["QK_BIASED"] and cx["ROTARY"]),
            "WS_KHAT": bool(cx["K_SCALED"]), "WS_DPHIO": bool(dphio), "WS_DPS": bool(cx["DPHIO_SCALED"]),
            "WS_PSIV": bool(cx["PSIV"]), "WS_DPSIV": bool(cx["DPSIV"]), "WS_DKROT": bool(cx["DK_SCALED"]),
            "WS_DQROT": bool(cx["DQ_COMBINED"])}


#: Device memory the stage-2 workspaces of one batch slice may take (CUDA, NPU): the launcher runs the kernels on
#: slices of whole batch rows (:func:`batch_slice_rows`), so the workspaces do not grow with B (shape (d): 0.9 GB a
#: batch row, one row a slice, where the whole batch took 14.5 GB in FP32).
WORKSPACE_BUDGET_BYTES = 1 << 30


def workspace_bytes_per_batch_row(dims, LP: int, CP: int, formats: Mapping[str, bool]) -> int:
    """Bytes of the stage-2 workspaces for one batch row (the chunk workspaces of :func:`build_launches`, the FP32
    walk states and the cos/sin tables)."""
    N, P, R, H, nc = dims.state_dim, dims.value_dim, dims.rank, dims.heads, dims.nchunks
    lp_bytes = dims.lp_dtype.itemsize

    def width(fmt):
        return lp_bytes if formats[fmt] else 4

    n_side = sum(width(f) for f in ("WS_QB", "WS_QB", "WS_QROT", "WS_QROT", "WS_KHAT", "WS_DKROT", "WS_DQROT"))
    p_side = sum(width(f) for f in ("WS_DPHIO", "WS_DPS", "WS_PSIV", "WS_DPSIV"))
    per_chunk = LP * (N * n_side + P * p_side + 4 * (R + CP + 4)) + 4 * (N * P + 1 + CP // 16 * R * P)
    return H * nc * per_chunk + 2 * 4 * dims.seqlen * H * (N // dims.rotary_dim_divisor)


def batch_slice_rows(dims, LP: int, CP: int, formats: Mapping[str, bool], backend: str) -> int:
    """Batch rows per launch slice: as many as :data:`WORKSPACE_BUDGET_BYTES` holds (at least one) on devices, the
    whole batch in the interpreter. Slices change no result: every stage-2 output of a batch row depends on that
    row's inputs only, and each kernel's operations per row are the same whatever the slice."""
    if backend == "interpreter":
        return dims.batch
    per_row = workspace_bytes_per_batch_row(dims, LP, CP, formats)
    return max(1, min(dims.batch, WORKSPACE_BUDGET_BYTES // per_row))


def walk_tiles(dims, backend: str, sm_count: Optional[int] = None, batch: Optional[int] = None) -> tuple:
    """(BN, BP) of the reverse walk: 16 × 16 on Ascend; on CUDA halved from 64 × 64 until the walk of ``batch``
    batch rows (default: all; a launch slice's otherwise) has at least two programs per SM (its programs are
    sequential over the chunks: parallelism comes from the tiles); the interpreter walks whole states (fewest
    programs)."""
    N, P = dims.state_dim, dims.value_dim
    if backend == "interpreter":
        return N, P
    if backend == "npu":
        return min(N, 16), min(P, 16)
    sms = sm_count or torch.cuda.get_device_properties(dims.device).multi_processor_count
    BN, BP = min(N, 64), min(P, 64)
    rows = dims.batch if batch is None else batch
    while rows * dims.heads * (N // BN) * (P // BP) < 2 * sms and (BN > 16 or BP > 16):
        if BP >= BN and BP > 16:
            BP //= 2
        else:
            BN //= 2
    return BN, BP


#: Warps per program of the CUDA launches. At the default 32 rows a program (Triton 3.6, sm_90, N = P = 64, R = 4,
#: C = 16, lp workspaces) no stage-2 kernel spills with 4 (``reports/stage2_plan_resources_sm90.md``), and 4 was the
#: fastest of 2, 4 and 8 on an H100 (figures: ``docs/kernels.md``, ``reports/bench/steps_a_d_h100_plans.md``).
CUDA_NUM_WARPS = 4


@dataclass(frozen=True)
class Stage2Tiles:
    """The stage-2 plan: ``rows`` (BR) fused rows per program of the rows, k-side and q-side kernels (dividing LP =
    the padded C·R), ``tokens`` (BT) tokens per program of the token kernel (dividing CP = the padded C), both powers
    of 2; ``num_warps`` of the CUDA launches; ``walk_warps`` and ``walk_stages``: the reverse walk's own warps and
    software-pipelining stages on CUDA (None: ``num_warps`` and Triton's default; one warp and 6 stages, the form
    that sped up stage 1's walk, did not speed this one up measurably: ``docs/kernels.md``). Warps and stages
    change the schedule only (``test_bwd_bwd_kernels_gpu.py`` checks the walk's bits: passed on an H100);
    ``kside_rows`` and ``kside_warps``: the k-side kernel's own rows per program (a power of 2 dividing LP) and warps
    (CUDA only), None: ``rows`` and ``num_warps`` (the k-side kernel is stage 2's largest, bound by its registers:
    ``reports/bench/ncu_whole_op_triton_h100.md``); ``qside_rows``: the q-side kernel's own rows per program (CUDA
    only; None: ``rows``). Their outputs are per row, so these rows change no sum over rows, but they can change
    the MMA instruction of the kernel's GEMMs (wgmma from 64 rows on 4 warps, mma.sync below) and with it the FP32
    accumulation order inside them: on an H100 at shape (d) 64 k-side rows left dq, dk, dv and every other output
    bit-identical and moved dfactor and ddA_cs_rev in their last bits (``test_bwd_bwd_kernels_gpu.py``).
    Rows and tokens change FP32 summation orders only. ``native_lp`` (CUDA only): every rounding of the stage-2
    kernels by the hardware's RNE conversion (``cvt.rn``, ``LPK`` 2 / 3 of ``_rounding.py``: the code form stage 1 and
    the forward take by default on CUDA, bit-identical there on the H200) instead of the integer RNE helpers; the
    CUDA default of :func:`stage2_tiles` since ``test_bwd_bwd_kernels_gpu.py`` showed the same bits on an H100.
    ``kside_parts`` (1, 2 or 3): the k-side kernel as one launch, or as two (``kside_dpsiv``: dΨV and the
    same-token dqk; ``kside_dk``: dk and dSSdA's terms) or three (``kside_dpsiv``, ``kside_pairs``: dSSdA's terms,
    ``kside_dk``: dk) that each hold fewer live tiles a program (:data:`KSIDE_LAUNCHES`); every output is computed by
    the same operations in any form (a launch recomputes the k̂·q_rotᵀ or ΨV·dΦOᵀ it needs), so the bits are the
    same where the backend compiles the same GEMM the same way (the interpreter:
    ``test_stage2_kside_parts_change_no_bit``; CUDA: ``test_gpu_stage2_kside_parts_change_no_bit``)."""

    rows: int
    tokens: int
    num_warps: int = 4
    walk_warps: Optional[int] = None
    walk_stages: Optional[int] = None
    kside_rows: Optional[int] = None
    kside_warps: Optional[int] = None
    qside_rows: Optional[int] = None
    native_lp: bool = False
    kside_parts: int = 1


#: The k-side launches of each ``Stage2Tiles.kside_parts``: (launch name, SIDES mask of ``_bwd2_kside_kernel``).
KSIDE_LAUNCHES = {1: (("kside", 7),), 2: (("kside_dpsiv", 1), ("kside_dk", 6)),
                  3: (("kside_dpsiv", 1), ("kside_pairs", 2), ("kside_dk", 4))}

_PLAN_TEXT = re.compile(r"(\d+)x(\d+)(?:k(\d+)(?:x(\d+))?(?:p(\d+))?)?(?:q(\d+))?(?:w(\d+))?(?:s(\d+))?(n)?")
_PLAN_FORM = "ROWSxWARPS[kKSIDE_ROWS[xKSIDE_WARPS][pKSIDE_PARTS]][qQSIDE_ROWS][wWALK_WARPS][sWALK_STAGES][n]"


def parse_stage2_plan(text: str, tokens: int) -> Stage2Tiles:
    """A plan written ``ROWSxWARPS[kKSIDE_ROWS[xKSIDE_WARPS][pKSIDE_PARTS]][qQSIDE_ROWS][wWALK_WARPS][sWALK_STAGES][n]``
    (``32x4``, ``32x4k16``, ``32x4k64x8``, ``32x4k64q64``, ``64x4w1s6``, ``32x4k64q64n`` (``n``: ``native_lp``; the
    CUDA default at N = P = 64 and LP = 64), ``32x4k64p2q64`` (``p2``: ``kside_parts=2``): the benchmarks' and
    scripts' plan lists) as :class:`Stage2Tiles` with
    ``tokens`` tokens per program. ``ValueError`` naming the form otherwise; the sizes are checked where the plan is
    used (:func:`build_launches`)."""
    match = _PLAN_TEXT.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"plan must be {_PLAN_FORM}, e.g. 32x4, 32x4k16x8, 64x4w1s6 or 32x4k64q64n; got {text!r}")
    *sizes, native = match.groups()
    rows, warps, kside_rows, kside_warps, kside_parts, qside_rows, walk_warps, walk_stages = (
        None if v is None else int(v) for v in sizes)
    return Stage2Tiles(rows, tokens, warps, walk_warps, walk_stages, kside_rows, kside_warps, qside_rows,
                       native_lp=native is not None, kside_parts=1 if kside_parts is None else kside_parts)


def stage2_tiles(dims, backend: str, LP: int, CP: int) -> Stage2Tiles:
    """The default plan: the interpreter takes whole chunks (fewest programs); CUDA up to 32 fused rows per program
    of the rows kernel, up to 64 of the k-side and q-side kernels (32 where N or P is above 64), whole chunks of
    tokens, 4 warps where N = P = 64 (the fastest of
    the plans timed side by side on an H100 at the benchmark shapes a and d, ``reports/bench/steps_a_d_h100_plans.md``,
    ``reports/bench/steps_a_d_h100_chunk64.md`` and ``reports/bench/stage2_launches_d_h100.md``: 32 rows keep the rows
    kernel from spilling, ``reports/stage2_plan_resources_sm90.md``; 64 rows give the chunk kernels wgmma), rounding
    by ``cvt.rn`` (``native_lp``: the same bits as the integer helpers on an H100 at three realistic sizes in bf16
    and fp16, ``test_gpu_stage2_native_lp_rounding_changes_no_bit``, and a fifth less time at (d),
    ``reports/bench/stage2_launches_d_h100_native.md``); where N or P is 128, 32 rows with ``cvt.rn``; where N or P
    is below 64, 32 rows with the integer helpers (the forms the GPU has checked at those sizes: see the comment in
    the body); Ascend :func:`npu_tiles`."""
    if backend == "interpreter":
        return Stage2Tiles(LP, CP)
    if backend == "npu":
        return npu_tiles(LP, CP)
    if dims is not None and max(dims.state_dim, dims.value_dim) > 64:
        # N or P = 128: compiled for sm_90 the chunk kernels spill at 32 rows and more at 64 (k-side 376 / 480 bytes
        # of stack, q-side 0 / 64); 64 rows were timed at N = P = 64 only, so these sizes keep 32
        return Stage2Tiles(min(LP, 32), CP, CUDA_NUM_WARPS, native_lp=True)
    if dims is not None and min(dims.state_dim, dims.value_dim) < 64:
        # N or P below 64: the plan the GPU checked there last (32 rows, integer helpers: golden whole-op cases on
        # an H100 at cbaa538). With 64-row chunk kernels and cvt.rn, the golden case N = 32, P = 64, R = 2, C = 32
        # gave a wrong dq under upstream_sm90 (rel RMS 1.05 to upstream, right under fp32; 1ebf917,
        # reports/fp32_level_whole_op_kernels_cuda.md); which of the two is at fault is owed
        # (test_gpu_stage2_plans_below_64_match_the_reference)
        return Stage2Tiles(min(LP, 32), CP, CUDA_NUM_WARPS)
    return Stage2Tiles(min(LP, 32), CP, CUDA_NUM_WARPS, kside_rows=min(LP, 64), qside_rows=min(LP, 64),
                       native_lp=True)


def npu_tiles(LP: int, CP: int) -> Stage2Tiles:
    """Ascend's plan: 8 fused rows per program, 16 tokens (4 when CP = 128). With it every size class within
    :func:`backend_refusal`'s bounds fits the 192 KiB unified buffer (``scripts/ascend_compile_gate.py --scope bounds
    --operators mamba_mimo_bwd_bwd``, ``reports/ascend_compile_bounds.md``). Measured, not derived: with 16 rows the
    k-side kernel overflowed inside the bounds at C·R = 16 with R > 1 for every N·P from 16·32 up (up to 8.7 Mbit of
    1.57), at N, P = 32, 128 with C·R = 48 and 64, and at N = 64, P = 16 or 32 with C = 64, R = 2; with 16 tokens
    the token kernel overflowed at N = P = 16, C = 128, R = 1, and with 8 tokens at N, P = 16, 64 (``docs/ascend.md``)."""
    return Stage2Tiles(min(LP, 8), 4 if CP >= 128 else min(CP, 16))


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def mamba_mimo_bwd_bwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, qk_dot,
    segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype=None, *, policy="upstream_sm90",
    poison: bool = False, allow_slow_interpreter: bool = False,
) -> MimoBwdBwdOutputs:
    """Stage 2 of the Mamba-3 MIMO backward pass in Triton, rounded as ``policy.mamba_mimo_bwd_bwd`` says.

    Args:
        dout … segsum: the 19 tensors of the stage-2 reference, same order, shapes and dtypes (dout ``[B, S, H, P]``
            with mimo_o else ``[B, S, R, H, P]``; q, k ``[B, S, R, G, N]``; v, z ``[B, S, H, P]``; states
            ``[B, H, nc, N, P]`` and qk_dot ``[B, H, S, R, R]`` in lp from stage 1; the rest as in the forward). All
            on one device: ``cpu`` (Triton's interpreter), ``cuda`` or ``npu``.
        chunk_size (int): C. rotary_dim_divisor (int): 2 or 4. dtype: upstream's argument (checked).
        policy (RoundingPolicy | str): a policy or preset name with a stage-2 section.
        poison (bool): NaN-fill the outputs and workspaces first (a test hook).
        allow_slow_interpreter (bool): run on CPU even when the estimated interpreter time exceeds
            ``INTERPRETER_LIMIT_S`` (the estimate is stage 1's, ``estimate_interpreter_seconds``: not calibrated for
            these kernels).

    Returns:
        MimoBwdBwdOutputs: dq, dk ``[B, S, R, H, N]`` and dv ``[B, S, H, P]`` in lp; dmimo_v ``[B, H, R, P]``, dD
        ``[B, H]`` (None without d), dangles ``[B, S, H, N/d]``, dfactor, dgamma_diag, ddA, ddA_cs_rev, ddA_cs
        ``[B, H, S]``, dSSdA ``[B, H, nc, C, C]`` in float32.

    Raises:
        ImportError: without ``triton``. UnsupportedPolicyError, PolicyUndefined: see :func:`stage2_constexprs`.
        TypeError, ValueError: bad inputs (the reference's validation) or unsupported sizes.
        NotImplementedError: NPU tensors beyond Ascend's bounds (:func:`backend_refusal`).
    """
    prep = build_launches(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                          da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor, dtype, policy=policy,
                          poison=poison)
    if prep.backend == "interpreter" and not allow_slow_interpreter:
        est = estimate_interpreter_seconds(prep.dims)
        if est > INTERPRETER_LIMIT_S:
            raise SlowInterpreterError(f"this CPU run goes through Triton's interpreter and would take about {est:.0f} "
                                       "s (stage 1's estimate); pass allow_slow_interpreter=True to run it anyway, or "
                                       "use a CUDA device")
    reason = backend_refusal(prep.backend, prep.dims.state_dim, prep.dims.value_dim,
                             prep.dims.chunk_size * prep.dims.rank)
    if reason:
        raise NotImplementedError(f"mamba_mimo_bwd_bwd on {prep.backend}: {reason}")
    return prep.run()


@dataclass
class Stage2Launches:
    """The launches of one stage-2 call (``build_launches``); ``run()`` launches them and returns the outputs."""

    launches: list
    backend: str
    dims: object  # the validated ``Dims``
    finish: Callable[[], MimoBwdBwdOutputs]

    def run(self) -> MimoBwdBwdOutputs:
        if self.backend != "interpreter" and any(_backend.is_interpreted(la.kernel) for la in self.launches):
            raise RuntimeError("TRITON_INTERPRET=1 is set, so the kernels for these device tensors would run in "
                               "Triton's interpreter with device constexprs; unset it")
        for launch in self.launches:
            launch.run()
        return self.finish()


def build_launches(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, qk_dot,
    segsum, chunk_size: int = 16, rotary_dim_divisor: int = 4, dtype=None, *, policy="upstream_sm90",
    poison: bool = False, backend: Optional[str] = None, sm_count: Optional[int] = None,
    tiles: Optional[Stage2Tiles] = None,
):
    """Validate, allocate and describe the stage-2 launches without running them (``backend``: plan a device launch
    from CPU tensors, e.g. for the Ascend compile gate; ``sm_count``: the CUDA device's SMs when planning from CPU;
    ``tiles``: another plan than :func:`stage2_tiles`'s, e.g. for a benchmark sweep; it changes no result beyond
    FP32 summation orders)."""
    require_triton()
    policy = _presets.resolve(policy)
    cx = stage2_constexprs(policy)
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs,
                           da_cs_rev, dt, trap, d, qk_dot, segsum, chunk_size, rotary_dim_divisor, dtype,
                           lp_dtype=policy.lp_torch_dtype)
    check_sizes(dims)
    backend = backend or _backend.backend_of(dims.device)
    interpreted = backend == "interpreter"
    mod1 = _backend.kernel_module(interpreted)
    mod2 = _backend.stage2_module(interpreted)
    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    LP, CP, AW = max(16, _pow2(C * R)), max(16, _pow2(C)), N // dims.rotary_dim_divisor
    lp, dev, f32 = dims.lp_dtype, dims.device, torch.float32
    tiles = tiles or stage2_tiles(dims, backend, LP, CP)
    BR, BT = tiles.rows, tiles.tokens
    if any(x < 1 or x & (x - 1) for x in (BR, BT)) or LP % BR or CP % BT:
        raise ValueError(f"tiles: rows {BR} must be a power of 2 dividing LP = {LP}, tokens {BT} one dividing "
                         f"CP = {CP}")
    for name in ("num_warps", "walk_warps", "walk_stages", "kside_rows", "kside_warps", "qside_rows"):
        value = getattr(tiles, name)
        if (value is not None or name == "num_warps") and (not isinstance(value, int) or isinstance(value, bool)
                                                             or value < 1):
            raise ValueError(f"tiles: {name} must be an int >= 1{'' if name == 'num_warps' else ' or None'}, "
                             f"got {value!r}")
    BRK = BR if tiles.kside_rows is None else tiles.kside_rows
    if BRK & (BRK - 1) or LP % BRK:
        raise ValueError(f"tiles: kside_rows {BRK} must be a power of 2 dividing LP = {LP}")
    BRQ = BR if tiles.qside_rows is None else tiles.qside_rows
    if BRQ & (BRQ - 1) or LP % BRQ:
        raise ValueError(f"tiles: qside_rows {BRQ} must be a power of 2 dividing LP = {LP}")
    NRB, NTB, NRBK, NRBQ = LP // BR, CP // BT, LP // BRK, LP // BRQ
    if not isinstance(tiles.native_lp, bool):
        raise ValueError(f"tiles: native_lp must be a bool, got {tiles.native_lp!r}")
    if type(tiles.kside_parts) is not int or tiles.kside_parts not in KSIDE_LAUNCHES:
        raise ValueError(f"tiles: kside_parts must be 1, 2 or 3 (the k-side kernel as that many launches), got "
                         f"{tiles.kside_parts!r}")
    if tiles.native_lp and backend != "cuda":
        raise ValueError(f"tiles: native_lp is a CUDA code form (cvt.rn); on the {backend} backend the kernels round "
                         "with the integer RNE helpers (the interpreter's conversion truncates)")

    def cont(x):
        return None if x is None else x.contiguous()

    (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d,
     qk_dot, segsum) = (cont(x) for x in (dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, states, z, mimo_z, angles,
                                          da_cs, da_cs_rev, dt, trap, d, qk_dot, segsum))
    formats = workspace_formats(cx, dims, backend)
    slice_rows = batch_slice_rows(dims, LP, CP, formats, backend)
    Bs = min(B, slice_rows)  # batch rows of one slice: the workspaces are sized for it and reused by every slice
    BN, BP = walk_tiles(dims, backend, sm_count, batch=Bs)
    cs_ = Bs * H * nc  # chunks of one slice

    def ws(width, fmt=None):
        return torch.empty((cs_, LP, width), dtype=lp if fmt and formats[fmt] else f32, device=dev)

    qb, kb = ws(N, "WS_QB"), ws(N, "WS_QB")
    qrot, krot, khat = ws(N, "WS_QROT"), ws(N, "WS_QROT"), ws(N, "WS_KHAT")
    dphio, dps, psiv, dpsiv = ws(P, "WS_DPHIO"), ws(P, "WS_DPS"), ws(P, "WS_PSIV"), ws(P, "WS_DPSIV")
    dkrot, dqrot, dqk, pairs = ws(N, "WS_DKROT"), ws(N, "WS_DQROT"), ws(R), ws(CP)
    dst = torch.empty((Bs, H, nc, N, P), dtype=f32, device=dev)
    rowsum = torch.empty((cs_, 4, LP), dtype=f32, device=dev)
    dda = torch.empty(cs_, dtype=f32, device=dev)
    cs = torch.empty((Bs, S, H, AW), dtype=f32, device=dev)
    sn = torch.empty((Bs, S, H, AW), dtype=f32, device=dev)
    part = torch.empty((1, cs_ * NTB, R * P), dtype=f32, device=dev)
    # outputs, whole
    chunks = B * H * nc
    dd = torch.empty(chunks * NRB, dtype=f32, device=dev)
    dssda = torch.empty((chunks, CP, CP), dtype=f32, device=dev)
    dmimo_v = torch.empty((1, B, H, R, P), dtype=f32, device=dev)
    tok_out = torch.empty((5, B, H, S), dtype=f32, device=dev)
    dq = torch.empty((B, S, R, H, N), dtype=lp, device=dev)
    dk = torch.empty((B, S, R, H, N), dtype=lp, device=dev)
    dv = torch.empty((B, S, H, P), dtype=lp, device=dev)
    dangles = torch.empty((B, S, H, AW), dtype=f32, device=dev)
    if poison:
        for t in (qb, kb, qrot, krot, khat, dphio, dps, psiv, dpsiv, dkrot, dqrot, dqk, pairs, dd, dst, rowsum, dssda, dda,
                  cs, sn, part, dmimo_v, tok_out, dangles, dq, dk, dv):
            if t.dtype == f32:
                t.fill_(float("nan"))
            else:
                t.view(torch.int16).fill_(LP_NAN_BITS[lp])

    def arg(t):
        if t is None:
            return q_bias  # never read: the branch that would read it is off
        return t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t

    shared = dict(cx, N=N, P=P, R=R, C=C, LP=LP, CP=CP, AW=AW, HAS_Z=dims.has_z, HAS_D=dims.has_d,
                  REDUCE_O=dims.reduce_o, BN=BN, BP=BP, BR=BR, BT=BT, **formats)
    shared.update(lp_dot_operands(cx, dims, on_device=not interpreted))
    if tiles.native_lp:
        shared["LPK"] += 2  # the same RNE by cvt.rn (``_rounding.py``); CUDA only, checked above
    n_sum = -(-(R * P) // _SUM_BLOCK)
    options = {"num_warps": tiles.num_warps, "enable_fp_fusion": False} if backend == "cuda" else {}
    walk_options, kside_options = dict(options), dict(options)
    if backend == "cuda":
        walk_options["num_warps"] = tiles.walk_warps or tiles.num_warps
        if tiles.walk_stages is not None:
            walk_options["num_stages"] = tiles.walk_stages
        kside_options["num_warps"] = tiles.kside_warps or tiles.num_warps
    kside_launches = KSIDE_LAUNCHES[tiles.kside_parts]
    own_options = dict({name: kside_options for name, _ in kside_launches}, dstates=walk_options)
    launches, declared = [], {}
    for b0 in range(0, B, Bs):  # batch slices: the launches of one slice, then the next (one stream, in order)
        b1 = min(B, b0 + Bs)
        nb = b1 - b0
        ch = nb * H * nc  # this slice's chunks
        c0 = b0 * H * nc

        def rows(x):  # the slice's batch rows of a [B, ...] tensor (None stays None): a contiguous view
            return None if x is None else x[b0:b1]

        plan = [
            ("angles", mod1._mimo_angles_kernel, -(-(nb * S * H * AW) // ANGLES_BLOCK),
             (rows(angles), cs, sn, nb * S * H * AW), {"BLOCK": ANGLES_BLOCK}),
            ("rows", mod2._bwd2_rows_kernel, ch * NRB,
             (arg(rows(dout)), arg(rows(q)), arg(rows(k)), arg(rows(v)), arg(rows(z)), q_bias, k_bias, mimo_v,
              arg(mimo_o), arg(mimo_z), cs, sn, rows(dt), arg(rows(trap)), rows(da_cs), arg(qb), arg(kb), arg(qrot),
              arg(krot), arg(khat), arg(dphio), arg(dps), arg(psiv), dd[c0 * NRB:], S, H, dims.heads_per_group, nc),
             shared),
            ("dstates", mod2._bwd2_dstates_kernel, nb * H * (N // BN) * (P // BP),
             (arg(qrot), arg(dps), rows(da_cs), dst, S, nc, N // BN, P // BP), shared),
            *((kside, mod2._bwd2_kside_kernel, ch * NRBK,
               (arg(rows(qk_dot)), rows(dt), arg(rows(trap)), rows(da_cs_rev), arg(d), rows(segsum), arg(qrot),
                arg(krot), arg(khat), arg(dphio), arg(psiv), dst, arg(dpsiv), dqk, arg(dkrot), rowsum, pairs, S, H,
                nc), dict(shared, BR=BRK, SIDES=sides)) for kside, sides in kside_launches),
            ("qside", mod2._bwd2_qside_kernel, ch * NRBQ,
             (arg(rows(states)), rows(da_cs), rows(segsum), arg(qrot), arg(khat), arg(dphio), arg(psiv), dst,
              arg(dqrot), rowsum, dda, S, nc), dict(shared, BR=BRQ)),
            ("token", mod2._bwd2_token_kernel, ch * NTB,
             (arg(rows(v)), mimo_v, cs, sn, rows(dt), arg(rows(trap)), arg(qb), arg(kb), arg(dpsiv), dqk, arg(dkrot),
              arg(dqrot), rowsum, pairs, dda, arg(rows(dq)), arg(rows(dk)), arg(rows(dv)), rows(dangles), part[0],
              tok_out[0, b0:], dssda[c0:], S, H, nc, B * H * S), shared),
            ("reduce", mod1._mimo_reduce_kernel, nb * H * n_sum, (part, dmimo_v[0, b0:], nc * NTB, n_sum),
             {"RP": R * P, "BLK": _SUM_BLOCK, "CB": 64}),
        ]
        suffix = f"[{b0}:{b1}]" if nb < B else ""
        for name, kernel, grid, args, cxs in plan:
            if name not in declared:  # the constexprs each kernel declares, once for every slice
                declared[name] = kwargs_for(kernel, cxs)
            launches.append(Launch(name + suffix, kernel, grid, args, declared[name],
                                   dict(own_options.get(name, options))))

    def finish() -> MimoBwdBwdOutputs:
        return MimoBwdBwdOutputs(
            dq=dq, dk=dk, dv=dv, dmimo_v=dmimo_v[0], dD=dd.view(B, H, nc * NRB).sum(dim=2) if dims.has_d else None,
            dangles=dangles, dfactor=tok_out[1], dgamma_diag=tok_out[3], ddA=tok_out[4],
            dSSdA=dssda.view(B, H, nc, CP, CP)[..., :C, :C].contiguous(), ddA_cs_rev=tok_out[0], ddA_cs=tok_out[2])

    return Stage2Launches(launches, backend, dims, finish)
