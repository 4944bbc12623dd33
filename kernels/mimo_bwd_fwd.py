"""Launcher of the Triton ``mamba_mimo_bwd_fwd`` kernels: policy → constexprs, checks, buffers, four launches.

``mamba_mimo_bwd_fwd(*tensors, chunk_size, rotary_dim_divisor, policy)`` takes the 17 tensors of the reference in
the same order and returns the same ``MimoBwdFwdOutputs`` (dtypes, shapes, None for absent branches) after the
same validation (``mimo_numerics.validation.validate_inputs``). CPU tensors run in Triton's interpreter, CUDA
tensors compiled, NPU tensors through triton-ascend (``_backend.py``). Kernel design: ``_mimo_kernels.py``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Dict, Iterator, Optional

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.outputs import MimoBwdFwdOutputs
from mimo_numerics.policy import FUTURE_KNOBS, RoundingPolicy
from mimo_numerics.validation import Dims, validate_inputs

from . import _backend

#: The operator whose policy section configures these kernels.
OPERATOR_NAME = "mamba_mimo_bwd_fwd"

#: State and value dims the kernels support (powers of two; tl.dot needs ≥ 16 on NVIDIA).
SUPPORTED_DIMS = (16, 32, 64, 128)
#: Largest number of fused rows C·R of one chunk.
MAX_FUSED_ROWS = 128
#: Interpreter runs estimated above this many seconds are refused unless ``allow_slow_interpreter=True``.
INTERPRETER_LIMIT_S = 120.0
#: Calibrated cost of one interpreted Triton op (seconds), for the estimate (2 shared CPU cores).
_INTERPRETER_OP_S = 3.2e-4

_LP_NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}

#: Overrides of the tile plan, for benchmarks and tests only (never numerics: tiles change FP32 summation orders
#: inside GEMMs and of the dmimo sums at most). Keys: ``BN``, ``BP2`` (state walk tile), ``BP3`` (output kernel P
#: tile), ``CB`` (chunks per decay load), ``CBR``/``BLKR`` (chunks/columns per step of the dmimo sum),
#: ``max_programs`` (cap the chunk kernels' grids; they loop over virtual programs), ``RB`` and ``qk_gemm`` (prep
#: kernel rows per program and its same-step product form; the Ascend choices are 16 and 0),
#: ``TB``, ``RBK``, ``JB`` (output kernel: tokens, ranks and k̂/ΨV rows per step), ``kt_load`` (state walk),
#: ``warps_k1`` … ``warps_k4``, ``stages_k2``, ``stages_k3`` (software pipelining of the output kernel's rank loop;
#: measured slower), ``maxnreg_k1``/``maxnreg_k3`` (CUDA register cap of the prep/output kernels; measured slower),
#: ``state_one_dot`` (default 1 on CUDA: the state walk's accumulate_into as one K = LP GEMM),
#: ``rcp_approx`` (default 1 on CUDA: the Z gate's reciprocal as div.approx, the same bits as the div.full of ``/``
#: there, tests/test_kernels_gpu.py),
#: and ``native_lp`` (0: on CUDA round with the integer helpers as on the other backends;
#: default 1: use the hardware's lp instructions: cvt.rn for every rounding, fma.rn / mul.rn + add.rn for the
#: diagonal's rank steps; bit-identical to the integer helpers, far fewer instructions). Empty in normal use.
TUNING: Dict[str, int] = {}
#: The keys ``TUNING`` understands (``tuning`` refuses others, so a misspelt key cannot silently do nothing).
TUNING_KEYS = frozenset({"BN", "BP2", "BP3", "CB", "CBR", "BLKR", "max_programs", "RB", "qk_gemm", "TB", "RBK", "JB",
                         "kt_load", "warps_k1", "warps_k2", "warps_k3", "warps_k4", "stages_k2",
                         "native_lp", "maxnreg_k1", "maxnreg_k3", "stages_k3",
                         "rcp_approx", "state_one_dot", "walk_psiv_from_v"})


@contextlib.contextmanager
def tuning(overrides: Dict[str, int]) -> Iterator[None]:
    """Run a block with ``TUNING`` replaced by ``overrides`` (benchmarks and tests), restored afterwards.

    Raises:
        TypeError: ``overrides`` is not a dict of int values. ValueError: a key is not in ``TUNING_KEYS``.
    """
    if not isinstance(overrides, dict):
        raise TypeError(f"overrides must be a dict of TUNING keys to ints, got {type(overrides).__name__}")
    unknown = sorted(set(overrides) - TUNING_KEYS)
    if unknown:
        raise ValueError(f"overrides has unknown TUNING keys {unknown}; known: {sorted(TUNING_KEYS)}")
    bad = sorted(k for k, v in overrides.items() if isinstance(v, bool) or not isinstance(v, int))
    if bad:
        raise TypeError(f"overrides values must be ints, not for {bad}")
    saved = dict(TUNING)
    TUNING.clear()
    TUNING.update(overrides)
    try:
        yield
    finally:
        TUNING.clear()
        TUNING.update(saved)


class UnsupportedPolicyError(ValueError):
    """A policy field has a value the Triton kernels cannot express (the message names the field)."""


class SlowInterpreterError(RuntimeError):
    """A CPU (interpreter) run would take too long; pass ``allow_slow_interpreter=True`` to run it anyway."""


def triton_available() -> bool:
    """True when ``triton`` (or triton-ascend, which provides the same module) can be imported."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "mimo_numerics.kernels needs Triton: install the 'triton' extra (pip install 'mimo_numerics[triton]') "
            "for NVIDIA GPUs and the CPU interpreter, or the 'npu' extra (triton-ascend and torch_npu) for Ascend "
            f"NPUs ({exc})") from exc


def policy_constexprs(policy) -> Dict[str, object]:
    """The policy as the kernels' constexpr keyword arguments (the one place the policy reaches Triton).

    Args:
        policy (RoundingPolicy | str): a policy, a preset name or a policy JSON path.

    Returns:
        dict: one upper-case bool per switch (``PSI_WEIGHT``, ``QK_BIAS``, …), ``LPK`` (0 bf16, 1 fp16),
        ``DIAG_FMA`` (``diag_mode == "fma"``), ``ACCUMULATE`` (``state_update == "accumulate_into"``) and
        ``SILU_TANH`` (``silu_form == "tanh"``).

    Raises:
        UnsupportedPolicyError: for ``math_dtype="float64"`` (the kernels compute in FP32; no fp64 on Ascend),
            ``round_outputs=False`` (lp output stores are the kernels' contract), or any FP32-level knob other
            than its honoured value; the message names the field.
    """
    policy = _presets.resolve(policy)
    if not isinstance(policy, RoundingPolicy):
        raise TypeError(f"policy must resolve to a RoundingPolicy, got {type(policy).__name__}")
    if policy.math_dtype != "float32":
        raise UnsupportedPolicyError(
            f"RoundingPolicy.math_dtype={policy.math_dtype!r} cannot be expressed by the Triton kernels: they "
            "compute in float32 only (fp64 is not available on every backend); use mimo_numerics.reference")
    if policy.round_outputs is not True:
        raise UnsupportedPolicyError(
            "RoundingPolicy.round_outputs=False cannot be expressed by the Triton kernels: states, qk_dot and dz "
            "are always stored in the lp dtype; use mimo_numerics.reference")
    for knob, allowed in FUTURE_KNOBS.items():
        if getattr(policy, knob) != allowed[0]:
            raise UnsupportedPolicyError(
                f"RoundingPolicy.{knob}={getattr(policy, knob)!r} is not implemented by the Triton kernels")
    sites = policy.section(OPERATOR_NAME)
    cx: Dict[str, object] = {name.upper(): bool(value) for name, value in sites.items()}
    cx["LPK"] = 0 if policy.lp_dtype == "bfloat16" else 1
    cx["DIAG_FMA"] = policy.diag_mode == "fma"
    cx["ACCUMULATE"] = policy.state_update == "accumulate_into"
    cx["SILU_TANH"] = policy.silu_form == "tanh"
    return cx


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass(frozen=True)
class Plan:
    """Tile sizes and grids of one launch (see ``plan``)."""

    backend: str
    LP: int  # fused rows per chunk, padded (K of the intra GEMMs)
    CP: int  # token rows per chunk, padded
    RB: int  # prep kernel: fused rows per program (LP, or 16 on Ascend)
    QK_GEMM: bool  # prep kernel: same-step q̃·k̃ᵀ as one [LP, LP] GEMM (needs RB == LP) or as row products
    BN: int  # state walk: N tile
    BP2: int  # state walk: P tile
    CB: int  # state walk: chunks per decay load
    CBR: int  # dmimo sum: chunks per step
    BP3: int  # output kernel: P tile
    TB: int  # output kernel: tokens per program (n_tb = CP / TB token blocks per chunk)
    RBK: int  # output kernel: ranks per row block (TB·RBK rows per GEMM)
    JB: int  # output kernel: fused rows per scores/intra step (LP, or 16 on Ascend)
    W: int  # record row width
    grid1: int  # programs launched for the prep kernel (≤ virt1)
    grid2: int
    grid3: int  # programs launched for the output kernel (≤ virt3)
    warps: Dict[str, int]
    virt1: int  # virtual programs of the prep kernel: B·H·nc·(LP/RB)
    virt3: int  # virtual programs of the output kernel: B·H·nc·(CP/TB)·(P/BP3)
    walk_psiv_from_v: bool = False  # CUDA state walk: ΨV recomputed from v (more than two walk programs per SM)

    @property
    def n_tb(self) -> int:
        """Token blocks per chunk in the output kernel."""
        return self.CP // self.TB


def _check_sizes(dims: Dims) -> None:
    if dims.state_dim not in SUPPORTED_DIMS:
        raise ValueError(f"q has state dim N={dims.state_dim}; the Triton kernels support N in {SUPPORTED_DIMS}")
    if dims.value_dim not in SUPPORTED_DIMS:
        raise ValueError(f"v has value dim P={dims.value_dim}; the Triton kernels support P in {SUPPORTED_DIMS}")
    if dims.chunk_size * dims.rank > MAX_FUSED_ROWS:
        raise ValueError(f"chunk_size={dims.chunk_size} with rank R={dims.rank} gives "
                         f"C·R={dims.chunk_size * dims.rank} fused rows per chunk; the Triton kernels support "
                         f"C·R <= {MAX_FUSED_ROWS}")


def plan(dims: Dims, backend: str, sm_count: Optional[int] = None) -> Plan:
    """Tile sizes for ``dims`` on ``backend`` ("interpreter", "cuda", "npu").

    The interpreter gets the fewest programs (its cost is per executed op). CUDA gets enough state-walk programs
    to fill the SMs and small chunk programs (measured fastest). Ascend tiles keep an estimated ≤ ~96 KB of live
    FP32 tiles per program (half the 192 KB UB; an estimate; the Ascend compile gate checks the planned UB).
    """
    N, P, R, C = dims.state_dim, dims.value_dim, dims.rank, dims.chunk_size
    B, H, nc = dims.batch, dims.heads, dims.nchunks
    LP = max(16, _pow2(C * R))
    CP = max(16, _pow2(C))
    W = max(N, P, R)
    RB, QK_GEMM = LP, True
    RP2 = _pow2(R)
    JB = LP
    maxnreg3 = 0  # output kernel register cap (0: none)
    if backend == "interpreter":
        # fewest programs and ops: all ranks and tokens of a chunk in one program
        BN, BP2, BP3, CB = N, P, P, 16
        TB, RBK = CP, RP2
        warps = {}
    elif backend == "cuda":
        BN, BP2 = min(N, 64), min(P, 64)
        sms = sm_count or torch.cuda.get_device_properties(dims.device).multi_processor_count
        while B * H * (N // BN) * (P // BP2) < 2 * sms and (BN > 16 or BP2 > 16):
            if BP2 >= BN and BP2 > 16:
                BP2 //= 2
            else:
                BN //= 2
        if BN == BP2 == 16 and BN < N and B * H * (N // BN) * (P // BP2) // 2 >= sms:
            # one warp also walks a 32 x 16 tile (two MMA row blocks): half the ΨV re-reads from L2, where the
            # walk is bound; shape (c): 0.164 ms against 0.274 for 16 x 16 tiles (H200, 20261130_021324)
            BN = 32
        BP3 = min(P, 64)
        # The chunk kernels are latency-bound (dependent loads, small GEMMs): many small resident programs beat
        # fewer large ones. Measured on an H200 at shapes (a) and (c) (reports/bench/history/, 20261129_190957): output
        # kernel rows RBK·TB = 16 with 2 warps, prep programs of 16 fused rows with 2 warps: (a) 1.17 ms against
        # 2.15 ms for 64 rows with 8 warps (which also faulted with Triton 3.6 at N = 128, P = 32).
        TB, RBK = 16, 1
        RB, QK_GEMM = 16, False
        # state walk: 64 chunks per decay load (fewer restarts of its pipelined inner loop; H200, 20261129_235027:
        # 0.174 ms at shape (a) against 0.185 with 16)
        CB = 64
        # state walk: one warp for tiles up to 32 x 16 (one or two MMA row blocks); one warp avoids a cross-warp
        # reduction (and its barrier) on the sequential path every chunk (measured on an H200 with 4 warps: ~1 µs
        # per chunk at shape (a); shape (b), 32 x 16 tiles: 0.086 ms with 1 warp against 0.106 with 4,
        # 20261130_022000).
        # Prep programs: 2 warps at N = 64, 4 at N = 128 (H200, 20261129_212623: (a) 0.877 ms with 2 warps
        # against 0.915 with 4; (c) 1.289 ms with 4 against 1.438 with 2)
        chunk_warps = 4 if N >= 128 else 2
        warps = {"k1": chunk_warps, "k2": 1 if BN * BP2 <= 512 else 4, "k3": 4, "k4": 4}
        # output kernel: 4 warps capped at 128 registers (4 programs, 16 warps per SM): 0.304 ms at shape (a)
        # against 0.367 with 2 warps at 255 registers (H200, 20261130_020730; uncapped 4 warps: 164 registers,
        # 3 programs per SM, slower), 0.396 against 0.491 uncapped (172 registers) at (c) (20261130_021324)
        maxnreg3 = 128
    else:  # npu (triton-ascend): keep the live tiles of a program within the unified buffer
        RB, QK_GEMM = 16, False  # no [LP, LP] tile, 16-row tiles (docs/ascend_findings.md)
        BN, BP2 = 16, 16
        # output kernel: one rank of 16 tokens per step, k̂/ΨV 16 fused rows at a time
        TB, RBK, JB = 16, 1, 16
        BP3 = min(P, 64)
        while BP3 > 16 and 4 * (8 * TB * N + JB * N + 3 * TB * JB + JB * BP3 + N * BP3 + 12 * TB * BP3) > 96 * 1024:
            BP3 //= 2
        CB = 16
        warps = {}
    # dmimo sums: chunk rows per step; more loads in flight per program on CUDA (H200, 20261129_220813: 256 rows
    # 0.017 ms per sum at shape (a) against 0.028 with 64)
    CBR = 256 if backend == "cuda" else 64
    # state walk pipeline depth: 6 with at most two programs per SM (H200, 20261130_000423: 0.149 ms at shape (a)
    # against 0.179 with 4), 4 with more (shape (d): 0.54 ms with 4 against 0.77 with 6; shape (b): 0.086 ms)
    stages2 = 6 if backend == "cuda" and B * H * (N // BN) * (P // BP2) <= 2 * sms else 4
    # state walk, CUDA: with more than two programs per SM the walk is bound by L2 reads, and recomputing ΨV from v
    # (a quarter of the bytes) pays for its instructions: shape (d) 0.390 ms against 0.481, (b) 0.082 against
    # 0.088; with at most two (latency-bound one-warp walks) it does not: (a) 0.241 against 0.145, (c) 0.267
    # against 0.165 (H200, 20261130_022959)
    walk_psiv_from_v = backend == "cuda" and B * H * (N // BN) * (P // BP2) > 2 * sms
    if TUNING:
        BN = min(N, TUNING.get("BN", BN))
        BP2 = min(P, TUNING.get("BP2", BP2))
        BP3 = min(P, TUNING.get("BP3", BP3))
        TB = min(CP, TUNING.get("TB", TB))
        RBK = min(RP2, TUNING.get("RBK", RBK))
        JB = min(LP, TUNING.get("JB", JB))
        CB = TUNING.get("CB", CB)
        CBR = TUNING.get("CBR", CBR)
        RB = min(LP, TUNING.get("RB", RB))
        QK_GEMM = bool(TUNING.get("qk_gemm", QK_GEMM)) and RB == LP
        warps = {k: TUNING.get(f"warps_{k}", warps.get(k, 4)) for k in ("k1", "k2", "k3", "k4")}
        stages2 = TUNING.get("stages_k2", stages2)
        maxnreg3 = TUNING.get("maxnreg_k3", maxnreg3)
    warps["stages_k2"] = stages2
    warps["maxnreg_k3"] = maxnreg3
    virt1 = B * H * nc * (LP // RB)
    virt3 = B * H * nc * (CP // TB) * (P // BP3)  # launched only when an output branch or a record needs it
    if backend == "npu":
        # Ascend: at most 65535 programs per launch; the chunk kernels loop over virtual programs
        cap = min(65535, _npu_core_count(dims.device) * 8)
        grid1, grid3 = min(virt1, cap), min(virt3, cap)
    else:
        grid1, grid3 = virt1, virt3
    if TUNING.get("max_programs"):
        grid1, grid3 = min(grid1, TUNING["max_programs"]), min(grid3, TUNING["max_programs"])
    grid2 = B * H * (N // BN) * (P // BP2)
    return Plan(backend, LP, CP, RB, QK_GEMM, BN, BP2, CB, CBR, BP3, TB, RBK, JB, W, grid1, grid2, grid3, warps,
                virt1, virt3, walk_psiv_from_v)


def _npu_core_count(device) -> int:
    """AI (cube) cores of the NPU (triton-ascend driver), or a conservative default when unavailable."""
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        return int(props.get("num_aicore", 24))
    except Exception:  # pragma: no cover - depends on triton-ascend internals
        return 24


def estimate_interpreter_seconds(dims: Dims, pl: Optional[Plan] = None) -> float:
    """Rough wall time of a CPU (interpreter) run: op counts per program times a calibrated cost per op."""
    pl = pl or plan(dims, "interpreter")
    R, nc = dims.rank, dims.nchunks
    nsl = pl.LP // 16
    k1 = pl.virt1 * (150 + 12 * R) + dims.batch * dims.seqlen * dims.heads / 8192 * 10
    k2 = dims.batch * dims.heads * (nc / pl.CB * 8 + nc * (12 + 8 * nsl))
    per3 = 120 + R * (80 + R * 35) + (R * 60 if dims.has_z else 0)
    k3 = pl.virt3 * per3
    k4 = dims.batch * dims.heads * (math.ceil(nc / 32) * 6 + 4) * 2
    ops = k1 + k2 + k3 + k4
    # bigger tiles cost more per op in numpy
    scale = 1.0 + (pl.LP * max(dims.state_dim, dims.value_dim)) / 16384
    return ops * _INTERPRETER_OP_S * scale


def _kwargs_for(kernel, values: dict) -> dict:
    names = set(kernel.arg_names)
    return {k: v for k, v in values.items() if k in names}


@dataclass
class Launch:
    """One kernel launch: ``kernel[(grid,)](*args, **constexprs, **options)``."""

    name: str
    kernel: object
    grid: int
    args: tuple
    constexprs: dict
    options: dict

    def run(self):
        self.kernel[(self.grid,)](*self.args, **self.constexprs, **self.options)


@dataclass
class Prepared:
    """The launches of one call and the tensors they write (``build_launches``)."""

    launches: list
    outputs: MimoBwdFwdOutputs
    plan: Plan
    finish: object  # callable run after the launches (fills ``record``)


def _options(backend: str, warps: int, stages: int, maxnreg: int = 0) -> dict:
    if backend == "cuda":
        # fp32_fma=False: no FP32 FMA contraction (the TwoSum of the fma diagonal relies on it)
        opts = {"num_warps": warps, "num_stages": stages, "enable_fp_fusion": False}
        if maxnreg:
            opts["maxnreg"] = maxnreg  # register cap per thread (more resident programs, some spills)
        return opts
    return {}


def mamba_mimo_bwd_fwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90", *,
    record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False, allow_slow_interpreter: bool = False,
) -> MimoBwdFwdOutputs:
    """Stage 1 of the Mamba-3 MIMO backward pass in Triton, rounded as ``policy`` says.

    Args:
        dout … segsum (Tensor | None): the 17 tensors of ``mimo_numerics.reference.mamba_mimo_bwd_fwd``, same
            order, shapes and dtypes (see ``docs/semantics.md``). All on one device: ``cpu`` (Triton interpreter),
            ``cuda`` or ``npu``.
        chunk_size (int): C. rotary_dim_divisor (int): 2 or 4.
        policy (RoundingPolicy | str): a policy or preset name; lp inputs must have its ``lp_dtype``.
        record (dict, optional): filled with per-stage tensors under the reference's stage names (FP32, trimmed
            to the S valid tokens): every stage of the reference's docstring table (q_biased, k_biased,
            qk_dot, q_rot, k_rot, gamma, shifted_gamma, trap_scale, k_scaled, psiv, k_state, state,
            state_operand, inter, causal_scores, intra, diag_accum, diag, out; with Z also gate, dphio, dzz,
            dz_accum). Costs extra memory and bandwidth; for drift studies.
        poison (bool): fill outputs and every intermediate buffer with NaN before launching (a test hook: an
            element the kernels fail to write shows up as NaN).
        allow_slow_interpreter (bool): run on CPU even when the estimated interpreter time exceeds
            ``INTERPRETER_LIMIT_S``.

    Returns:
        MimoBwdFwdOutputs: ``dmimo_o``, ``dmimo_z`` ``[B, H, R, P]`` float32; ``states`` ``[B, H, nc, N, P]``,
        ``dz`` ``[B, S, H, P]``, ``qk_dot`` ``[B, H, S, R, R]`` in lp; None where a branch is off.

    Raises:
        ImportError: when ``triton`` is not installed. UnsupportedPolicyError: see ``policy_constexprs``.
        TypeError, ValueError: bad inputs (the reference's validation), unsupported sizes (N, P not in
            {16, 32, 64, 128}, C·R > 128) or devices. SlowInterpreterError: see ``allow_slow_interpreter``.
    """
    prep = build_launches(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                          trap, d, segsum, chunk_size, rotary_dim_divisor, policy, record=record, poison=poison,
                          allow_slow_interpreter=allow_slow_interpreter)
    for launch in prep.launches:
        launch.run()
    prep.finish()
    return prep.outputs


def build_launches(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90", *,
    record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False, allow_slow_interpreter: bool = False,
    backend: Optional[str] = None, sm_count: Optional[int] = None,
) -> Prepared:
    """Validate, allocate and describe the launches of ``mamba_mimo_bwd_fwd`` without running them.

    ``backend`` (default: from the tensors' device) and ``sm_count`` let tools plan a device launch from CPU
    tensors, e.g. to compile the kernels for sm_90 without a GPU (``tests/test_kernels.py``).
    """
    _require_triton()
    policy = _presets.resolve(policy)
    cx = policy_constexprs(policy)
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev,
                           dt, trap, d, segsum, chunk_size, rotary_dim_divisor, lp_dtype=policy.lp_torch_dtype)
    _check_sizes(dims)
    backend = backend or _backend.backend_of(dims.device)
    pl = plan(dims, backend, sm_count=sm_count)
    if backend == "interpreter" and not allow_slow_interpreter:
        est = estimate_interpreter_seconds(dims, pl)
        if est > INTERPRETER_LIMIT_S:
            raise SlowInterpreterError(
                f"this CPU run goes through Triton's interpreter and would take about {est:.0f} s "
                f"(B={dims.batch}, S={dims.seqlen}, H={dims.heads}, N={dims.state_dim}, P={dims.value_dim}, "
                f"R={dims.rank}, C={dims.chunk_size}: {pl.grid3} chunk programs); pass allow_slow_interpreter=True "
                "to run it anyway, or use a CUDA/NPU device")
    mod = _backend.kernel_module(interpreted=(backend == "interpreter"))
    on_device = not _backend.is_interpreted(mod._mimo_out_kernel)

    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    lp = dims.lp_dtype
    dev = dims.device
    keep = record is not None

    # ---- constexprs: policy switches, sizes, branches, dot operand formats
    cx = dict(cx)
    native = backend == "cuda" and bool(TUNING.get("native_lp", 1))
    if native:
        cx["LPK"] += 2  # same RNE through cvt.rn (see _rounding.py); never under the interpreter
    cx["NATIVE_DIAG"] = native and cx["DIAG_ACCUM"] and cx["QK_DOT_INTERNAL"] and cx["PSIV"]
    cx.update(N=N, P=P, R=R, C=C, LP=pl.LP, CP=pl.CP, BN=pl.BN, CB=pl.CB, W=pl.W, AW=N // rotary_dim_divisor,
              HAS_Z=dims.has_z, HAS_D=dims.has_d, REDUCE_O=dims.reduce_o, RECORD=keep)
    cx["DOT_QK_LP"] = on_device and cx["QK_BIASED"]
    q_rot_lp = cx["QK_BIASED"] and cx["ROTARY"]
    cx["DOT_INTER_LP"] = on_device and q_rot_lp and cx["STATE_OPERAND"]
    cx["DOT_SCORES_LP"] = on_device and q_rot_lp and cx["K_SCALED"]
    cx["DOT_INTRA_LP"] = on_device and cx["CAUSAL_SCORES"] and cx["PSIV"]
    cx["DOT_STATE_LP"] = on_device and cx["K_STATE"] and cx["PSIV"]
    store_f32 = keep or not cx["STATE_OPERAND"]
    cx["STORE_F32"] = store_f32
    need_out = dims.reduce_o or dims.has_z or keep
    rcp_approx = backend == "cuda" and bool(TUNING.get("rcp_approx", 1))

    # ---- inputs: contiguous, lp ones as int16 bits
    def cont(x):
        return None if x is None else x.contiguous()

    dout, q, k, v, z, trap = (cont(x) for x in (dout, q, k, v, z, trap))
    q_bias, k_bias, mimo_v, mimo_o, mimo_z, angles, da_cs, da_cs_rev, dt, d, segsum = (
        cont(x) for x in (q_bias, k_bias, mimo_v, mimo_o, mimo_z, angles, da_cs, da_cs_rev, dt, d, segsum))
    dummy_f = q_bias  # never read: the constexpr branch that would read it is off

    # ---- outputs and workspaces (torch.empty: every element is written by a kernel)
    f32 = torch.float32

    def work(shape, as_lp):
        return torch.empty(shape, dtype=lp if as_lp else f32, device=dev)

    states = torch.empty((B, H, nc, N, P), dtype=lp, device=dev)
    qk_dot = torch.empty((B, H, S, R, R), dtype=lp, device=dev)
    dz = torch.empty((B, S, H, P), dtype=lp, device=dev) if dims.has_z else None
    kst = work((B * H * nc, pl.LP, N), cx["K_STATE"])
    khat = work((B * H * nc, pl.LP, N), cx["K_SCALED"])
    psiv = work((B * H * nc, pl.LP, P), cx["PSIV"])
    qkf = None if cx["QK_DOT_INTERNAL"] else torch.empty((B, H, S, R, R), dtype=f32, device=dev)
    aw = N // rotary_dim_divisor
    cs = torch.empty((B, S, H, aw), dtype=f32, device=dev)
    sn = torch.empty((B, S, H, aw), dtype=f32, device=dev)
    hf32 = torch.empty((B, H, nc, N, P), dtype=f32, device=dev) if store_f32 else None
    n_part = B * H * nc * pl.n_tb  # dmimo partials: one row per (chunk, token block)
    # dmimo_o and dmimo_z (and their partials) as the two halves of one tensor when both exist: one sum launch
    n_sums = int(dims.reduce_o) + int(dims.has_z)
    parts = torch.empty((n_sums, n_part, R * P), dtype=f32, device=dev) if n_sums else None
    dmimo = torch.empty((n_sums, B, H, R, P), dtype=f32, device=dev) if n_sums else None
    part_o, dmimo_o = (parts[0], dmimo[0]) if dims.reduce_o else (None, None)
    part_z, dmimo_z = (parts[-1], dmimo[-1]) if dims.has_z else (None, None)
    rec = rec_cs = None
    if keep:
        rec = torch.zeros((_ix(mod.NSLOT), B, H, S, R, pl.W), dtype=f32, device=dev)
        rec_cs = torch.zeros((B * H * nc, C * R, C * R), dtype=f32, device=dev)
    if poison:
        for t in (states, qk_dot, dz, kst, khat, psiv, qkf, cs, sn, hf32, parts, dmimo, rec,
                  rec_cs):
            if t is None:
                continue
            if t.dtype == f32:
                t.fill_(float("nan"))
            else:
                t.view(torch.int16).fill_(_LP_NAN_BITS[lp])

    def arg(t):  # lp tensors travel as int16 bits; absent ones as a never-read FP32 placeholder
        if t is None:
            return dummy_f
        return t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t

    rec_arg = rec if keep else dummy_f
    rec_cs_arg = rec_cs if keep else dummy_f
    launches = []

    def add(name, kernel, grid, args, extra, warps, stages, maxnreg=0):
        launches.append(Launch(name, kernel, grid, args, _kwargs_for(kernel, extra),
                               _options(backend, warps, stages, maxnreg)))

    # ---- 0. cos/sin of every angle, once
    n_ang = cs.numel()
    add("angles", mod._mimo_angles_kernel, -(-n_ang // 1024), (angles, cs, sn, n_ang), {"BLOCK": 1024}, 4, 1)
    # ---- 1. per-row quantities of every chunk (k̂, k_state, ΨV, qk_dot), chunk-parallel
    add("prep", mod._mimo_prep_kernel, pl.grid1,
        (arg(q), arg(k), arg(v), q_bias, k_bias, mimo_v, cs, sn, dt, arg(trap), da_cs_rev,
         arg(kst), arg(khat), arg(psiv), arg(qk_dot), arg(qkf), rec_arg, B, S, H, dims.heads_per_group, nc,
         pl.LP // pl.RB, pl.virt1),
        dict(cx, RB=pl.RB, QK_GEMM=pl.QK_GEMM, PERSISTENT=pl.grid1 < pl.virt1), pl.warps.get("k1", 4), 1,
        TUNING.get("maxnreg_k1", 0))
    # ---- 2. sequential walk over the chunks: states (lp), FP32 h when needed
    one_dot = (backend == "cuda" and cx["DOT_STATE_LP"] and bool(TUNING.get("kt_load", 1))
               and bool(TUNING.get("state_one_dot", 1)))
    add("state", mod._mimo_state_kernel, pl.grid2,
        (arg(kst), arg(psiv), arg(v), mimo_v, da_cs, arg(states), arg(hf32), S, H, nc, N // pl.BN, P // pl.BP2),
        dict(cx, BP=pl.BP2, KT_LOAD=bool(TUNING.get("kt_load", 1)), ONE_DOT=one_dot,
             PSIV_FROM_V=(backend == "cuda" and (one_dot or not cx["ACCUMULATE"])
                          and bool(TUNING.get("walk_psiv_from_v", pl.walk_psiv_from_v)))),
        pl.warps.get("k2", 4), pl.warps.get("stages_k2", 3))
    # ---- 3. chunk-parallel outputs from rnd(h_c)
    if need_out:
        hop = states if cx["STATE_OPERAND"] else hf32
        qkin = qk_dot if cx["QK_DOT_INTERNAL"] else qkf
        add("out", mod._mimo_out_kernel, pl.grid3,
            (arg(dout), arg(q), q_bias, arg(mimo_o), arg(z), arg(mimo_z), cs, sn, da_cs, dt, arg(trap), arg(d),
             segsum, arg(khat), arg(psiv), arg(hop), arg(qkin), arg(dz), arg(part_o), arg(part_z), rec_arg,
             rec_cs_arg, B, S, H, dims.heads_per_group, nc, pl.n_tb, P // pl.BP3, pl.virt3),
            dict(cx, BP=pl.BP3, TB=pl.TB, RBK=pl.RBK, RPAD=_pow2(R), JB=pl.JB,
                 DIAG_LOOP=backend == "npu" or R > 8,
                 RCP_APPROX=rcp_approx, PERSISTENT=pl.grid3 < pl.virt3),
            pl.warps.get("k3", 4), TUNING.get("stages_k3", 1), pl.warps.get("maxnreg_k3", 0))
    # ---- 4. deterministic sums of the per-chunk dmimo partials
    RPc = R * P
    # enough programs for the dmimo sums (measured: 16 programs of 256 columns took ~0.09 ms each at shape (a))
    blk = TUNING.get("BLKR", min(32, _pow2(RPc)))
    nblk = -(-RPc // blk)
    if n_sums:
        # both sums in one launch: rows of the stacked partials are (sum, b, h, chunk block)
        add("reduce", mod._mimo_reduce_kernel, n_sums * B * H * nblk, (parts, dmimo, nc * pl.n_tb, nblk),
            {"RP": RPc, "BLK": blk, "CB": pl.CBR}, pl.warps.get("k4", 4), 1)

    def finish():
        if keep:
            _fill_record(record, rec, rec_cs, states, hf32, cx, dims, mod)

    outputs = MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states, dz=dz, dmimo_z=dmimo_z, qk_dot=qk_dot)
    return Prepared(launches, outputs, pl, finish)


def _ix(slot) -> int:
    """A record slot (a ``tl.constexpr`` in the kernel module) as a Python int."""
    return int(getattr(slot, "value", slot))


def _fill_record(record, rec, rec_cs, states, hf32, cx, dims: Dims, mod) -> None:
    N, P, R = dims.state_dim, dims.value_dim, dims.rank
    B, H, nc, C = dims.batch, dims.heads, dims.nchunks, dims.chunk_size

    def slot(i, width):
        return rec[_ix(i)][..., :width].clone()

    record["q_biased"] = slot(mod.SLOT_Q_BIASED, N)
    record["k_biased"] = slot(mod.SLOT_K_BIASED, N)
    record["k_rot"] = slot(mod.SLOT_K_ROT, N)
    record["shifted_gamma"] = rec[_ix(mod.SLOT_SHIFTED_GAMMA)][..., 0, 0].clone()
    record["q_rot"] = slot(mod.SLOT_Q_ROT, N)
    record["k_scaled"] = slot(mod.SLOT_K_SCALED, N)
    record["k_state"] = slot(mod.SLOT_K_STATE, N)
    record["qk_dot"] = slot(mod.SLOT_QK_DOT, R)
    record["gamma"] = rec[_ix(mod.SLOT_GAMMA)][..., 0, 0].clone()
    record["trap_scale"] = rec[_ix(mod.SLOT_TRAP_SCALE)][..., 0, 0].clone()
    record["psiv"] = slot(mod.SLOT_PSIV, P)
    record["state"] = hf32.clone()
    record["state_operand"] = states.to(torch.float32) if cx["STATE_OPERAND"] else hf32.clone()
    record["inter"] = slot(mod.SLOT_INTER, P)
    record["causal_scores"] = rec_cs.reshape(B, H, nc, C * R, C * R).clone()
    record["intra"] = slot(mod.SLOT_INTRA, P)
    record["diag_accum"] = slot(mod.SLOT_DIAG_ACCUM, P)
    record["diag"] = slot(mod.SLOT_DIAG, P)
    record["out"] = slot(mod.SLOT_OUT, P)
    if dims.has_z:
        record["gate"] = slot(mod.SLOT_GATE, P)
        record["dphio"] = slot(mod.SLOT_DPHIO, P)
        record["dzz"] = slot(mod.SLOT_DZZ, P)
        record["dz_accum"] = rec[_ix(mod.SLOT_DZ_ACCUM)][..., 0, :P].clone()
