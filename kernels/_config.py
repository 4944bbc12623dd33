"""Launch configuration of the Triton ``mamba_mimo_bwd_fwd`` kernels: ``(policy, backend, tuning)`` → one frozen object.

``launch_config(policy, dims, backend, tuning=None, sm_count=None, record=False)`` derives everything the launcher
passes to Triton besides the tensors and runtime sizes, in one place and in this order:

1. ``policy_constexprs(policy)``: the policy section ``policy.mamba_mimo_bwd_fwd`` and the knobs as constexprs
   (the one place the policy reaches Triton);
2. ``plan(dims, backend, sm_count, tuning)``: tiles, grids, warps, pipeline stages and register caps;
3. ``BackendSwitches``: the CUDA-only code forms (``native_lp``, ``state_one_dot``, ``rcp_approx``,
   ``walk_psiv_from_v``) and ``kt_load``, each bit-identical on or off (``tests/ops/mamba_mimo_bwd_fwd/test_kernels_gpu.py``);
4. per kernel: its grid, constexprs and launch options (``KernelConfig``).

``tuning`` is a mapping of ``TUNING_KEYS`` to ints, checked by ``check_tuning``, for benchmarks and tests only: a
tile changes FP32 summation orders inside GEMMs and of the dmimo sums at most, never a rounding site. Nothing
here reads global state or the environment, and this module never imports ``triton``. Being pure, the policy's
constexprs and the launch configuration are memoized per (policy, sizes, backend, ...) (:func:`per_policy`,
:func:`launch_config`): a policy is frozen and hashable, so a repeated call reuses them instead of rebuilding them on
the host (its launches are otherwise the same).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Mapping, Optional

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.policy import FP32_LEVEL_DEFAULTS, RoundingPolicy
from mimo_numerics.validation import Dims

#: The operator whose policy section configures these kernels by default (stage 1).
OPERATOR_NAME = "mamba_mimo_bwd_fwd"
#: The operators the chunk kernels compute: stage 1 and, with the output kernel's ``FORWARD``, the forward.
OPERATORS = ("mamba_mimo_bwd_fwd", "mamba_mimo_fwd")
#: A forward site whose constexpr has another name in the shared kernels (the others: the site in upper case).
FORWARD_CONSTEXPR_NAMES = MappingProxyType({"qk_dot": "QK_DOT_INTERNAL"})
#: Switches only stage 1 has (off in the forward) and only the forward has (off in stage 1).
STAGE1_ONLY_SWITCHES = ("OUT", "DPHIO", "DZ_ACCUM")
FORWARD_ONLY_SWITCHES = ("D_TERM", "GATE", "PHI_GATE", "OUT_PROJ", "OUT_ACCUM")

#: Backends a configuration can target: CPU tensors run in Triton's interpreter, CUDA compiled, NPU through
#: triton-ascend (``_backend.backend_of``).
BACKENDS = ("interpreter", "cuda", "npu")

#: Tuning keys whose value is a tile or block size, a chunk count or a warp count (powers of two: ``tl.arange``).
#: ``BN``, ``BP2`` (state walk tile), ``BP3`` (output kernel P tile), ``CB`` (chunks per decay load), ``CBR`` /
#: ``BLKR`` (chunks / columns per step of the dmimo sum), ``RB`` (prep kernel rows per program), ``TB``, ``RBK``,
#: ``JB`` (output kernel: tokens, ranks and k̂/ΨV rows per step), ``warps_k1`` … ``warps_k4`` (CUDA).
POW2_TUNING_KEYS = frozenset({"BN", "BP2", "BP3", "CB", "CBR", "BLKR", "RB", "TB", "RBK", "JB",
                              "warps_k1", "warps_k2", "warps_k3", "warps_k4"})
#: Tuning keys that are on (1) / off (0) switches: ``qk_gemm`` (prep kernel's same-step products as one [LP, LP]
#: GEMM; needs RB = LP), ``kt_load`` (state walk loads k_stateᵀ transposed), and the CUDA code forms of
#: ``BackendSwitches`` (``native_lp``, ``state_one_dot``, ``rcp_approx``, ``walk_psiv_from_v``).
SWITCH_TUNING_KEYS = frozenset({"qk_gemm", "kt_load", "native_lp", "state_one_dot", "rcp_approx",
                                "walk_psiv_from_v"})
#: Tuning keys that are counts: ``max_programs`` (cap the chunk kernels' grids; they loop over virtual programs),
#: ``stages_k2`` / ``stages_k3`` (software pipelining of the state walk / the output kernel's rank loop, ≥ 1),
#: ``maxnreg_k1`` / ``maxnreg_k3`` (CUDA register cap per thread of the prep / output kernel, 0 = none).
COUNT_TUNING_KEYS = frozenset({"max_programs", "stages_k2", "stages_k3", "maxnreg_k1", "maxnreg_k3"})
#: Every key ``tuning`` understands (others are refused, so a misspelt key cannot silently do nothing).
TUNING_KEYS = POW2_TUNING_KEYS | SWITCH_TUNING_KEYS | COUNT_TUNING_KEYS
_MIN_COUNT = {"max_programs": 1, "stages_k2": 1, "stages_k3": 1, "maxnreg_k1": 0, "maxnreg_k3": 0}


class UnsupportedPolicyError(ValueError, NotImplementedError):
    """A policy field has a value the Triton kernels cannot express (the message names the field)."""


def check_tuning(tuning: Optional[Mapping[str, int]]) -> Mapping[str, int]:
    """``tuning`` checked, as a read-only copy (an empty one for None).

    Raises:
        TypeError: ``tuning`` is not a mapping, or a value is not an int (bools are refused too).
        ValueError: a key is not in ``TUNING_KEYS`` (the message names it), or a value is out of range: tile,
            block and warp counts must be powers of two, switches 0 or 1, ``max_programs`` and stages ≥ 1,
            register caps ≥ 0.
    """
    if tuning is None:
        return MappingProxyType({})
    if not isinstance(tuning, Mapping):
        raise TypeError(f"tuning must be a mapping of tuning keys to ints, got {type(tuning).__name__}")
    unknown = sorted(str(k) for k in set(tuning) - TUNING_KEYS)
    if unknown:
        raise ValueError(f"tuning has unknown keys {unknown}; known: {sorted(TUNING_KEYS)}")
    bad = sorted(k for k, v in tuning.items() if isinstance(v, bool) or not isinstance(v, int))
    if bad:
        raise TypeError(f"tuning values must be ints, not for {bad}")
    for key, value in sorted(tuning.items()):
        if key in POW2_TUNING_KEYS and (value < 1 or value & (value - 1)):
            raise ValueError(f"tuning[{key!r}]={value}: must be a power of two >= 1")
        if key in SWITCH_TUNING_KEYS and value not in (0, 1):
            raise ValueError(f"tuning[{key!r}]={value}: must be 0 (off) or 1 (on)")
        if key in COUNT_TUNING_KEYS and value < _MIN_COUNT[key]:
            raise ValueError(f"tuning[{key!r}]={value}: must be >= {_MIN_COUNT[key]}")
    return MappingProxyType(dict(tuning))


#: Distinct (policy, arguments) entries each memo of :func:`per_policy` and :func:`launch_config` keeps (a site sweep
#: visits about a hundred policies).
MEMO_SIZE = 512


def per_policy(fn):
    """Memoize ``fn(policy, *args, **kwargs) -> dict`` (a function of a resolved, frozen ``RoundingPolicy`` and
    hashable arguments, nothing else) per its arguments. Each call gets a fresh ``dict``; errors are not cached (they
    are raised again); a policy that does not resolve to a ``RoundingPolicy`` or an unhashable argument goes to
    ``fn`` itself, which names the problem. ``wrapper.cache_clear()`` empties the memo."""

    @functools.lru_cache(maxsize=MEMO_SIZE)
    def cached(policy, args, kwargs, _types):
        return MappingProxyType(fn(policy, *args, **dict(kwargs)))

    @functools.wraps(fn)
    def wrapper(policy, *args, **kwargs):
        policy = _presets.resolve(policy)
        key = tuple(sorted(kwargs.items()))
        types = (tuple(map(type, args)), tuple(type(v) for _, v in key))  # True == 1, but not as an argument
        try:
            hash((policy, args, key))
        except TypeError:
            return fn(policy, *args, **kwargs)
        if not isinstance(policy, RoundingPolicy):
            return fn(policy, *args, **kwargs)
        return dict(cached(policy, args, key, types))

    wrapper.cache_clear = cached.cache_clear
    return wrapper


@per_policy
def policy_constexprs(policy, operator: str = OPERATOR_NAME) -> Dict[str, object]:
    """The policy as the kernels' constexpr keyword arguments (the one place the policy reaches Triton).

    Args:
        policy (RoundingPolicy | str): a policy, a preset name or a policy JSON path.
        operator (str): whose section configures the kernels: ``"mamba_mimo_bwd_fwd"`` (stage 1, the default) or
            ``"mamba_mimo_fwd"`` (the forward, :data:`OPERATORS`).

    Returns:
        dict: one upper-case bool per site of ``policy.section(operator)`` (``PSI_WEIGHT``, ``QK_BIAS``, …; the
        forward's ``qk_dot`` as ``QK_DOT_INTERNAL``, :data:`FORWARD_CONSTEXPR_NAMES`), the other operator's own
        switches off (:data:`STAGE1_ONLY_SWITCHES`, :data:`FORWARD_ONLY_SWITCHES`), ``FORWARD``, ``LPK`` (0 bf16,
        1 fp16), ``DIAG_FMA`` (``diag_mode == "fma"``), ``ACCUMULATE`` (``state_update == "accumulate_into"``)
        and ``SILU_TANH`` (``silu_form == "tanh"``).

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
    for knob, default in FP32_LEVEL_DEFAULTS.items():
        if getattr(policy, knob) != default:
            raise UnsupportedPolicyError(
                f"RoundingPolicy.{knob}={getattr(policy, knob)!r} is not implemented by the Triton kernels")
    if operator not in OPERATORS:
        raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")
    forward = operator == "mamba_mimo_fwd"
    sites = policy.section(operator)
    names = FORWARD_CONSTEXPR_NAMES if forward else {}
    cx: Dict[str, object] = {name: False for name in STAGE1_ONLY_SWITCHES + FORWARD_ONLY_SWITCHES}
    cx.update({names.get(name, name.upper()): bool(value) for name, value in sites.items()})
    cx["FORWARD"] = forward
    cx["LPK"] = 0 if policy.lp_dtype == "bfloat16" else 1
    cx["DIAG_FMA"] = policy.diag_mode == "fma"
    cx["ACCUMULATE"] = policy.state_update == "accumulate_into"
    cx["SILU_TANH"] = policy.silu_form == "tanh"
    return cx


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


# ---------------------------------------------------------------------------------------------------- tile plan
@dataclass(frozen=True)
class Plan:
    """Tile sizes, grids and launch resources of one call (see ``plan``); tuning overrides already applied."""

    backend: str
    LP: int  # fused rows per chunk, padded (K of the intra GEMMs)
    CP: int  # token rows per chunk, padded
    RB: int  # prep kernel: fused rows per program (LP, or 16 on devices)
    QK_GEMM: bool  # prep kernel: same-step q̃·k̃ᵀ as one [LP, LP] GEMM (needs RB == LP) or as row products
    BN: int  # state walk: N tile
    BP2: int  # state walk: P tile
    CB: int  # state walk: chunks per decay load
    CBR: int  # dmimo sum: chunks per step
    BLKR: int  # dmimo sum: columns per program
    BP3: int  # output kernel: P tile
    TB: int  # output kernel: tokens per program (n_tb = CP / TB token blocks per chunk)
    RBK: int  # output kernel: ranks per row block (TB·RBK rows per GEMM)
    JB: int  # output kernel: fused rows per scores/intra step (LP, or 16 on Ascend)
    W: int  # record row width
    grid1: int  # programs launched for the prep kernel (≤ virt1)
    grid2: int  # programs of the state walk: B·H·(N/BN)·(P/BP2)
    grid3: int  # programs launched for the output kernel (≤ virt3)
    virt1: int  # virtual programs of the prep kernel: B·H·nc·(LP/RB)
    virt3: int  # virtual programs of the output kernel: B·H·nc·(CP/TB)·(P/BP3)
    warps_k1: int  # num_warps (CUDA) of the prep, state walk, output and dmimo-sum kernels
    warps_k2: int
    warps_k3: int
    warps_k4: int
    stages_k2: int  # num_stages (CUDA) of the state walk and of the output kernel
    stages_k3: int
    maxnreg_k1: int  # CUDA register cap per thread of the prep and output kernels (0: none)
    maxnreg_k3: int
    walk_psiv_from_v: bool = False  # CUDA state walk: ΨV recomputed from v (planned from the untuned walk grid)

    @property
    def n_tb(self) -> int:
        """Token blocks per chunk in the output kernel."""
        return self.CP // self.TB


def _cuda_sm_count(dims: Dims, sm_count: Optional[int]) -> int:
    return sm_count or torch.cuda.get_device_properties(dims.device).multi_processor_count


def _npu_core_count(device) -> int:
    """AI (cube) cores of the NPU (triton-ascend driver), or a conservative default when unavailable."""
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        return int(props.get("num_aicore", 24))
    except Exception:  # pragma: no cover - depends on triton-ascend internals
        return 24


def plan(dims: Dims, backend: str, sm_count: Optional[int] = None,
         tuning: Optional[Mapping[str, int]] = None) -> Plan:
    """Tile sizes for ``dims`` on ``backend`` ("interpreter", "cuda", "npu"), with ``tuning`` overrides applied.

    The interpreter gets the fewest programs (its cost is per executed op). CUDA gets enough state-walk programs
    to fill the SMs (``sm_count``, default: the device's) and small chunk programs (measured fastest). Ascend
    tiles keep an estimated ≤ ~96 KB of live FP32 tiles per program (half the 192 KB UB; an estimate; the Ascend
    compile gate checks the planned UB). Tile overrides are clamped to the padded sizes (``BN`` ≤ N, ``TB`` ≤ CP,
    …); ``qk_gemm`` takes effect only with RB = LP.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    tuning = check_tuning(tuning)
    N, P, R, C = dims.state_dim, dims.value_dim, dims.rank, dims.chunk_size
    B, H, nc = dims.batch, dims.heads, dims.nchunks
    LP = max(16, _pow2(C * R))
    CP = max(16, _pow2(C))
    W = max(N, P, R)
    RB, QK_GEMM = LP, True
    RP2 = _pow2(R)
    JB = LP
    maxnreg3 = 0  # output kernel register cap (0: none)
    sms = _cuda_sm_count(dims, sm_count) if backend == "cuda" else 0
    if backend == "interpreter":
        # fewest programs and ops: all ranks and tokens of a chunk in one program
        BN, BP2, BP3, CB = N, P, P, 16
        TB, RBK = CP, RP2
        warps = {}
    elif backend == "cuda":
        BN, BP2 = min(N, 64), min(P, 64)
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
    # 0.017 ms per sum at shape (a) against 0.028 with 64); columns per program: enough programs for the sums
    # (measured: 16 programs of 256 columns took ~0.09 ms each at shape (a))
    CBR = 256 if backend == "cuda" else 64
    BLKR = min(32, _pow2(R * P))
    # state walk pipeline depth: 6 with at most two programs per SM (H200, 20261130_000423: 0.149 ms at shape (a)
    # against 0.179 with 4), 4 with more (shape (d): 0.54 ms with 4 against 0.77 with 6; shape (b): 0.086 ms)
    stages2 = 6 if backend == "cuda" and B * H * (N // BN) * (P // BP2) <= 2 * sms else 4
    # state walk, CUDA: with more than two programs per SM the walk is bound by L2 reads, and recomputing ΨV from v
    # (a quarter of the bytes) pays for its instructions: shape (d) 0.390 ms against 0.481, (b) 0.082 against
    # 0.088; with at most two (latency-bound one-warp walks) it does not: (a) 0.241 against 0.145, (c) 0.267
    # against 0.165 (H200, 20261130_022959)
    walk_psiv_from_v = backend == "cuda" and B * H * (N // BN) * (P // BP2) > 2 * sms
    # ---- tuning overrides (benchmarks and tests)
    BN = min(N, tuning.get("BN", BN))
    BP2 = min(P, tuning.get("BP2", BP2))
    BP3 = min(P, tuning.get("BP3", BP3))
    TB = min(CP, tuning.get("TB", TB))
    RBK = min(RP2, tuning.get("RBK", RBK))
    JB = min(LP, tuning.get("JB", JB))
    CB = tuning.get("CB", CB)
    CBR = tuning.get("CBR", CBR)
    BLKR = tuning.get("BLKR", BLKR)
    RB = min(LP, tuning.get("RB", RB))
    QK_GEMM = bool(tuning.get("qk_gemm", QK_GEMM)) and RB == LP
    warps = {k: tuning.get(f"warps_{k}", warps.get(k, 4)) for k in ("k1", "k2", "k3", "k4")}
    stages2 = tuning.get("stages_k2", stages2)
    stages3 = tuning.get("stages_k3", 1)
    maxnreg1 = tuning.get("maxnreg_k1", 0)
    maxnreg3 = tuning.get("maxnreg_k3", maxnreg3)
    # ---- grids
    virt1 = B * H * nc * (LP // RB)
    virt3 = B * H * nc * (CP // TB) * (P // BP3)  # launched only when an output branch or a record needs it
    if backend == "npu":
        # Ascend: at most 65535 programs per launch; the chunk kernels loop over virtual programs
        cap = min(65535, _npu_core_count(dims.device) * 8)
        grid1, grid3 = min(virt1, cap), min(virt3, cap)
    else:
        grid1, grid3 = virt1, virt3
    if tuning.get("max_programs"):
        grid1, grid3 = min(grid1, tuning["max_programs"]), min(grid3, tuning["max_programs"])
    grid2 = B * H * (N // BN) * (P // BP2)
    return Plan(backend=backend, LP=LP, CP=CP, RB=RB, QK_GEMM=QK_GEMM, BN=BN, BP2=BP2, CB=CB, CBR=CBR, BLKR=BLKR,
                BP3=BP3, TB=TB, RBK=RBK, JB=JB, W=W, grid1=grid1, grid2=grid2, grid3=grid3, virt1=virt1, virt3=virt3,
                warps_k1=warps["k1"], warps_k2=warps["k2"], warps_k3=warps["k3"], warps_k4=warps["k4"],
                stages_k2=stages2, stages_k3=stages3, maxnreg_k1=maxnreg1, maxnreg_k3=maxnreg3,
                walk_psiv_from_v=walk_psiv_from_v)


# ---------------------------------------------------------------------------------------------------- switches
@dataclass(frozen=True)
class BackendSwitches:
    """Code forms that give the same bits on or off (``tests/ops/mamba_mimo_bwd_fwd/test_kernels_gpu.py`` checks each on the H200).

    Attributes:
        native_lp (bool): CUDA: round with the hardware's lp instructions (``cvt.rn`` for every rounding, ``fma.rn``
            / ``mul.rn`` + ``add.rn`` for the diagonal's rank steps) instead of the integer helpers (``LPK`` + 2,
            ``NATIVE_DIAG``). Never under the interpreter (its conversion truncates) or on Ascend.
        kt_load (bool): state walk: k_stateᵀ loaded transposed from memory (``KT_LOAD``); every backend.
        state_one_dot (bool): CUDA, lp state GEMM, ``kt_load``: ``accumulate_into`` as one K = LP GEMM
            (``ONE_DOT``).
        rcp_approx (bool): CUDA: the Z gate's reciprocal as div.approx (``RCP_APPROX``).
        walk_psiv_from_v (bool): CUDA, with ``state_one_dot`` or ``state_update="separate"``: the state walk
            recomputes ΨV from v and Ψ instead of reading the workspace (``PSIV_FROM_V``); by default where the
            plan puts more than two walk programs on an SM (``Plan.walk_psiv_from_v``).
    """

    native_lp: bool
    kt_load: bool
    state_one_dot: bool
    rcp_approx: bool
    walk_psiv_from_v: bool


def backend_switches(policy_cx: Mapping[str, object], pl: Plan, tuning: Mapping[str, int]) -> BackendSwitches:
    """The switches for the policy constexprs ``policy_cx``, the plan ``pl`` (and its backend) and ``tuning``
    (keys ``native_lp``, ``kt_load``, ``state_one_dot``, ``rcp_approx``, ``walk_psiv_from_v``; default 1, the
    last one the plan's choice). A CUDA-only switch is off on other backends whatever ``tuning`` says."""
    cuda = pl.backend == "cuda"
    kt_load = bool(tuning.get("kt_load", 1))
    dot_state_lp = _on_device(pl.backend) and policy_cx["K_STATE"] and policy_cx["PSIV"]
    one_dot = cuda and dot_state_lp and kt_load and bool(tuning.get("state_one_dot", 1))
    return BackendSwitches(
        native_lp=cuda and bool(tuning.get("native_lp", 1)),
        kt_load=kt_load,
        state_one_dot=one_dot,
        rcp_approx=cuda and bool(tuning.get("rcp_approx", 1)),
        walk_psiv_from_v=(cuda and (one_dot or not policy_cx["ACCUMULATE"])
                          and bool(tuning.get("walk_psiv_from_v", pl.walk_psiv_from_v))),
    )


def _on_device(backend: str) -> bool:
    return backend != "interpreter"


# ---------------------------------------------------------------------------------------------------- config
#: Kernel launched for each launch name (attributes of ``_mimo_kernels``), in launch order.
KERNEL_FUNCTIONS = MappingProxyType({"angles": "_mimo_angles_kernel", "prep": "_mimo_prep_kernel",
                                     "state": "_mimo_state_kernel", "out": "_mimo_out_kernel",
                                     "reduce": "_mimo_reduce_kernel"})
#: Elements per program of the angles kernel.
ANGLES_BLOCK = 1024


@dataclass(frozen=True)
class KernelConfig:
    """One launch's grid (1-D, programs), constexprs and launch options (CUDA: warps, stages, register cap,
    ``enable_fp_fusion=False``; other backends: none). ``constexprs`` may hold names the kernel does not declare:
    the launcher passes each kernel only its own."""

    grid: int
    constexprs: Mapping[str, object]
    options: Mapping[str, object]


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the launches of one call take besides tensors and runtime sizes, from ``(policy, backend,
    tuning)`` and the call's sizes (``launch_config``). Read-only: the mappings are ``MappingProxyType``.

    Attributes:
        backend (str): "interpreter", "cuda" or "npu". dims (Dims): the validated sizes and branches.
        record (bool): per-stage records are written (``RECORD``; also FP32 states and the output kernel).
        policy_constexprs (Mapping): ``policy_constexprs(policy)``, unchanged.
        tuning (Mapping): the checked overrides (empty in normal use).
        plan (Plan): tiles, grids, warps, stages, register caps. switches (BackendSwitches): code forms.
        constexprs (Mapping): shared by the prep, state and output kernels: the policy's (``LPK`` + 2 with
            ``native_lp``), sizes (N, P, R, C, LP, CP, BN, CB, W, AW), branches (HAS_Z, HAS_D, REDUCE_O, RECORD),
            GEMM operand formats (``DOT_*_LP``: devices only, both operands on the lp grid under the policy),
            ``NATIVE_DIAG`` and ``STORE_F32``.
        kernels (Mapping[str, KernelConfig]): per launch, in launch order: angles, prep, state, out (only when an
            output branch or a record needs it), reduce (only with reduce_o or Z).
    """

    backend: str
    dims: Dims
    record: bool
    policy_constexprs: Mapping[str, object]
    tuning: Mapping[str, int]
    plan: Plan
    switches: BackendSwitches
    constexprs: Mapping[str, object]
    kernels: Mapping[str, KernelConfig]

    @property
    def forward(self) -> bool:
        """The launches compute the forward operator (``FORWARD``), not stage 1."""
        return bool(self.policy_constexprs["FORWARD"])

    @property
    def n_sums(self) -> int:
        """dmimo sums made by the reduce launch: reduce_o and Z each add one (their partials are stacked); none in
        the forward."""
        return 0 if self.forward else int(self.dims.reduce_o) + int(self.dims.has_z)


def _options(backend: str, warps: int, stages: int, maxnreg: int = 0) -> Mapping[str, object]:
    if backend == "cuda":
        # fp32_fma=False: no FP32 FMA contraction (the TwoSum of the fma diagonal relies on it)
        opts = {"num_warps": warps, "num_stages": stages, "enable_fp_fusion": False}
        if maxnreg:
            opts["maxnreg"] = maxnreg  # register cap per thread (more resident programs, some spills)
        return MappingProxyType(opts)
    return MappingProxyType({})


def launch_config(policy, dims: Dims, backend: str, tuning: Optional[Mapping[str, int]] = None,
                  sm_count: Optional[int] = None, record: bool = False,
                  operator: str = OPERATOR_NAME, final: bool = False) -> LaunchConfig:
    """The launch configuration of one call (see the module docstring); pure: no global state, no environment, so
    it is memoized per its arguments (a ``RoundingPolicy``, hashable ``dims``, the tuning's items; the CUDA device's
    SM count, read when ``sm_count`` is None, is fixed for a device): a repeated call returns the same frozen object.

    Args:
        policy (RoundingPolicy | str): a policy or preset name (``policy_constexprs``).
        dims (Dims): ``mimo_numerics.validation.validate_inputs`` of the call.
        backend (str): "interpreter", "cuda" or "npu".
        tuning (Mapping[str, int], optional): overrides (``TUNING_KEYS``, checked by ``check_tuning``).
        sm_count (int, optional): SMs of the CUDA device (default: asked from ``dims.device``).
        record (bool): the call records per-stage tensors.
        operator (str): ``"mamba_mimo_bwd_fwd"`` (stage 1) or ``"mamba_mimo_fwd"`` (the forward: the same angles,
            prep and state launches, the output kernel with ``FORWARD``, no dmimo sums).
        final (bool): the state walk also stores the state after the last chunk (``FINAL``: the forward's
            ``return_state``).

    Raises:
        UnsupportedPolicyError: see ``policy_constexprs``. TypeError, ValueError: see ``check_tuning``; an unknown
            backend.
    """
    policy = _presets.resolve(policy)
    try:
        # each value with its type: True == 1 as a key, but check_tuning refuses a bool where it takes an int
        tuning_key = None if tuning is None else tuple(sorted((k, type(v), v) for k, v in tuning.items()))
        key = (policy, dims, backend, tuning_key, type(sm_count), sm_count, record, operator, final)
        hash(key)
    except (TypeError, AttributeError):  # not a mapping, unhashable values: the uncached path names the problem
        return _launch_config(policy, dims, backend, tuning, sm_count, record, operator, final)
    if not isinstance(policy, RoundingPolicy):
        return _launch_config(policy, dims, backend, tuning, sm_count, record, operator, final)
    return _launch_config_memo(*key)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _launch_config_memo(policy, dims, backend, tuning_key, _sm_type, sm_count, record, operator,
                        final) -> LaunchConfig:
    tuning = None if tuning_key is None else {k: v for k, _, v in tuning_key}
    return _launch_config(policy, dims, backend, tuning, sm_count, record, operator, final)


def _launch_config(policy, dims: Dims, backend: str, tuning: Optional[Mapping[str, int]], sm_count: Optional[int],
                   record: bool, operator: str, final: bool) -> LaunchConfig:
    policy_cx = MappingProxyType(policy_constexprs(policy, operator))
    tuning = check_tuning(tuning)
    pl = plan(dims, backend, sm_count=sm_count, tuning=tuning)
    sw = backend_switches(policy_cx, pl, tuning)
    N, P, R, C = dims.state_dim, dims.value_dim, dims.rank, dims.chunk_size
    B, H = dims.batch, dims.heads
    on_device = _on_device(backend)

    # ---- shared constexprs: policy switches, sizes, branches, dot operand formats
    cx = dict(policy_cx)
    if sw.native_lp:
        cx["LPK"] += 2  # same RNE through cvt.rn (see _rounding.py); never under the interpreter
    cx["NATIVE_DIAG"] = sw.native_lp and cx["DIAG_ACCUM"] and cx["QK_DOT_INTERNAL"] and cx["PSIV"]
    cx.update(N=N, P=P, R=R, C=C, LP=pl.LP, CP=pl.CP, BN=pl.BN, CB=pl.CB, W=pl.W, AW=N // dims.rotary_dim_divisor,
              HAS_Z=dims.has_z, HAS_D=dims.has_d, REDUCE_O=dims.reduce_o, RECORD=record)
    cx["DOT_QK_LP"] = on_device and cx["QK_BIASED"]
    q_rot_lp = cx["QK_BIASED"] and cx["ROTARY"]
    cx["DOT_INTER_LP"] = on_device and q_rot_lp and cx["STATE_OPERAND"]
    cx["DOT_SCORES_LP"] = on_device and q_rot_lp and cx["K_SCALED"]
    cx["DOT_INTRA_LP"] = on_device and cx["CAUSAL_SCORES"] and cx["PSIV"]
    cx["DOT_STATE_LP"] = on_device and cx["K_STATE"] and cx["PSIV"]
    cx["STORE_F32"] = record or not cx["STATE_OPERAND"]
    cx["FINAL"] = bool(final)

    # ---- per launch: grid, constexprs, options
    kernels: Dict[str, KernelConfig] = {}

    def add(name, grid, constexprs, warps, stages, maxnreg=0):
        kernels[name] = KernelConfig(int(grid), MappingProxyType(dict(constexprs)),
                                     _options(backend, warps, stages, maxnreg))

    n_ang = B * dims.seqlen * H * (N // dims.rotary_dim_divisor)
    add("angles", -(-n_ang // ANGLES_BLOCK), {"BLOCK": ANGLES_BLOCK}, 4, 1)
    add("prep", pl.grid1, dict(cx, RB=pl.RB, QK_GEMM=pl.QK_GEMM, PERSISTENT=pl.grid1 < pl.virt1),
        pl.warps_k1, 1, pl.maxnreg_k1)
    add("state", pl.grid2, dict(cx, BP=pl.BP2, KT_LOAD=sw.kt_load, ONE_DOT=sw.state_one_dot,
                                PSIV_FROM_V=sw.walk_psiv_from_v),
        pl.warps_k2, pl.stages_k2)
    forward = policy_cx["FORWARD"]
    if forward or dims.reduce_o or dims.has_z or record:
        add("out", pl.grid3, dict(cx, BP=pl.BP3, TB=pl.TB, RBK=pl.RBK, RPAD=_pow2(R), JB=pl.JB,
                                  DIAG_LOOP=backend == "npu" or R > 8, RCP_APPROX=sw.rcp_approx,
                                  PERSISTENT=pl.grid3 < pl.virt3),
            pl.warps_k3, pl.stages_k3, pl.maxnreg_k3)
    n_sums = 0 if forward else int(dims.reduce_o) + int(dims.has_z)
    if n_sums:
        # both sums in one launch: rows of the stacked partials are (sum, b, h, chunk block)
        n_blk = -(-(R * P) // pl.BLKR)
        add("reduce", n_sums * B * H * n_blk, {"RP": R * P, "BLK": pl.BLKR, "CB": pl.CBR}, pl.warps_k4, 1)
    return LaunchConfig(backend=backend, dims=dims, record=bool(record), policy_constexprs=policy_cx, tuning=tuning,
                        plan=pl, switches=sw, constexprs=MappingProxyType(cx), kernels=MappingProxyType(kernels))
