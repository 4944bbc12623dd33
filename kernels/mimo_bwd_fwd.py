"""Launcher of the Triton ``mamba_mimo_bwd_fwd`` kernels: checks, launch configuration, buffers, launches.

``mamba_mimo_bwd_fwd(*tensors, chunk_size, rotary_dim_divisor, policy)`` takes the 17 tensors of the reference in
the same order and returns the same ``MimoBwdFwdOutputs`` (dtypes, shapes, None for absent branches) after the
same validation (``mimo_numerics.validation.validate_inputs``). CPU tensors run in Triton's interpreter, CUDA
tensors compiled, NPU tensors through triton-ascend (``_backend.py``). Every constexpr, grid and launch option comes
from one frozen ``LaunchConfig`` built from ``(policy, backend, tuning)`` and the call's sizes (``_config.py``);
this module allocates the buffers and binds the arguments. Kernel design: ``_mimo_kernels.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import torch

from mimo_numerics import presets as _presets
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import MimoBwdFwdOutputs
from mimo_numerics.validation import Dims
from mimo_numerics.ops.mamba_mimo_bwd_fwd.validation import validate_inputs

from . import _backend
from ._config import (  # noqa: F401  (re-exported: the launcher's public names)
    KERNEL_FUNCTIONS,
    OPERATOR_NAME,
    TUNING_KEYS,
    BackendSwitches,
    KernelConfig,
    LaunchConfig,
    Plan,
    UnsupportedPolicyError,
    check_tuning,
    launch_config,
    plan,
    policy_constexprs,
)

#: State and value dims the kernels support (powers of two; tl.dot needs ≥ 16 on NVIDIA).
SUPPORTED_DIMS = (16, 32, 64, 128)
#: Largest number of fused rows C·R of one chunk.
MAX_FUSED_ROWS = 128
#: Interpreter runs estimated above this many seconds are refused unless ``allow_slow_interpreter=True``.
INTERPRETER_LIMIT_S = 120.0
#: Calibrated cost of one interpreted Triton op (seconds), for the estimate (2 shared CPU cores).
_INTERPRETER_OP_S = 3.2e-4

_LP_NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


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


def _check_sizes(dims: Dims) -> None:
    if dims.state_dim not in SUPPORTED_DIMS:
        raise ValueError(f"q has state dim N={dims.state_dim}; the Triton kernels support N in {SUPPORTED_DIMS}")
    if dims.value_dim not in SUPPORTED_DIMS:
        raise ValueError(f"v has value dim P={dims.value_dim}; the Triton kernels support P in {SUPPORTED_DIMS}")
    if dims.chunk_size * dims.rank > MAX_FUSED_ROWS:
        raise ValueError(f"chunk_size={dims.chunk_size} with rank R={dims.rank} gives "
                         f"C·R={dims.chunk_size * dims.rank} fused rows per chunk; the Triton kernels support "
                         f"C·R <= {MAX_FUSED_ROWS}")


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
    config: LaunchConfig
    finish: object  # callable run after the launches (fills ``record``)

    @property
    def plan(self) -> Plan:
        """Tiles and grids of the launches (``config.plan``)."""
        return self.config.plan


def mamba_mimo_bwd_fwd(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90", *,
    record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False, allow_slow_interpreter: bool = False,
    tuning: Optional[Mapping[str, int]] = None,
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
        tuning (Mapping[str, int], optional): overrides of tiles, warps, stages, register caps and the
            bit-identical code forms of this call, for benchmarks and tests (keys: ``TUNING_KEYS``; see
            ``_config.py``). None of them changes a rounding site; tiles change FP32 summation orders inside
            GEMMs and of the dmimo sums at most.

    Returns:
        MimoBwdFwdOutputs: ``dmimo_o``, ``dmimo_z`` ``[B, H, R, P]`` float32; ``states`` ``[B, H, nc, N, P]``,
        ``dz`` ``[B, S, H, P]``, ``qk_dot`` ``[B, H, S, R, R]`` in lp; None where a branch is off.

    Raises:
        ImportError: when ``triton`` is not installed. UnsupportedPolicyError: see ``policy_constexprs``.
        TypeError, ValueError: bad inputs (the reference's validation), unsupported sizes (N, P not in
            {16, 32, 64, 128}, C·R > 128) or devices, bad ``tuning`` (``check_tuning``: unknown keys are named).
        SlowInterpreterError: see ``allow_slow_interpreter``. RuntimeError: device tensors while
            ``TRITON_INTERPRET=1`` made every kernel interpreted (the kernels pick the interpreter themselves, for
            CPU tensors only).
    """
    prep = build_launches(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt,
                          trap, d, segsum, chunk_size, rotary_dim_divisor, policy, record=record, poison=poison,
                          allow_slow_interpreter=allow_slow_interpreter, tuning=tuning)
    if prep.config.backend != "interpreter" and any(_backend.is_interpreted(la.kernel) for la in prep.launches):
        raise RuntimeError(
            f"TRITON_INTERPRET=1 is set, so the kernels for these {prep.config.backend} tensors would run in Triton's "
            "interpreter with device constexprs; unset it (the kernels use the interpreter for CPU tensors by "
            "themselves)")
    for launch in prep.launches:
        launch.run()
    prep.finish()
    return prep.outputs


def build_launches(
    dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev, dt, trap, d, segsum,
    chunk_size: int = 16, rotary_dim_divisor: int = 4, policy="upstream_sm90", *,
    record: Optional[Dict[str, torch.Tensor]] = None, poison: bool = False, allow_slow_interpreter: bool = False,
    tuning: Optional[Mapping[str, int]] = None, backend: Optional[str] = None, sm_count: Optional[int] = None,
) -> Prepared:
    """Validate, allocate and describe the launches of ``mamba_mimo_bwd_fwd`` without running them.

    ``backend`` (default: from the tensors' device) and ``sm_count`` let tools plan a device launch from CPU
    tensors, e.g. to compile the kernels for sm_90 without a GPU (``tests/ops/mamba_mimo_bwd_fwd/test_kernels.py``) or for Ascend (the
    Ascend compile gate). The returned ``Prepared.config`` is the call's ``LaunchConfig``.
    """
    _require_triton()
    policy = _presets.resolve(policy)
    policy_constexprs(policy)  # an unexpressible policy is refused before the inputs are looked at
    dims = validate_inputs(dout, q, k, v, q_bias, k_bias, mimo_v, mimo_o, z, mimo_z, angles, da_cs, da_cs_rev,
                           dt, trap, d, segsum, chunk_size, rotary_dim_divisor, lp_dtype=policy.lp_torch_dtype)
    _check_sizes(dims)
    keep = record is not None
    cfg = launch_config(policy, dims, backend or _backend.backend_of(dims.device), tuning=tuning,
                        sm_count=sm_count, record=keep)
    pl, cx = cfg.plan, cfg.constexprs
    if cfg.backend == "interpreter" and not allow_slow_interpreter:
        est = estimate_interpreter_seconds(dims, pl)
        if est > INTERPRETER_LIMIT_S:
            raise SlowInterpreterError(
                f"this CPU run goes through Triton's interpreter and would take about {est:.0f} s "
                f"(B={dims.batch}, S={dims.seqlen}, H={dims.heads}, N={dims.state_dim}, P={dims.value_dim}, "
                f"R={dims.rank}, C={dims.chunk_size}: {pl.grid3} chunk programs); pass allow_slow_interpreter=True "
                "to run it anyway, or use a CUDA/NPU device")
    mod = _backend.kernel_module(interpreted=(cfg.backend == "interpreter"))

    B, S, H, N, P, R, C, nc = (dims.batch, dims.seqlen, dims.heads, dims.state_dim, dims.value_dim, dims.rank,
                               dims.chunk_size, dims.nchunks)
    lp = dims.lp_dtype
    dev = dims.device

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
    hf32 = torch.empty((B, H, nc, N, P), dtype=f32, device=dev) if cx["STORE_F32"] else None
    n_part = B * H * nc * pl.n_tb  # dmimo partials: one row per (chunk, token block)
    # dmimo_o and dmimo_z (and their partials) as the two halves of one tensor when both exist: one sum launch
    n_sums = cfg.n_sums
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
    # ---- the arguments of each launch the configuration lists (constexprs and options come from it)
    args = {
        # 0. cos/sin of every angle, once
        "angles": (angles, cs, sn, cs.numel()),
        # 1. per-row quantities of every chunk (k̂, k_state, ΨV, qk_dot), chunk-parallel
        "prep": (arg(q), arg(k), arg(v), q_bias, k_bias, mimo_v, cs, sn, dt, arg(trap), da_cs_rev,
                 arg(kst), arg(khat), arg(psiv), arg(qk_dot), arg(qkf), rec_arg, B, S, H, dims.heads_per_group, nc,
                 pl.LP // pl.RB, pl.virt1),
        # 2. sequential walk over the chunks: states (lp), FP32 h when needed
        "state": (arg(kst), arg(psiv), arg(v), mimo_v, da_cs, arg(states), arg(hf32), S, H, nc, N // pl.BN,
                  P // pl.BP2),
    }
    if "out" in cfg.kernels:
        # 3. chunk-parallel outputs from rnd(h_c)
        hop = states if cx["STATE_OPERAND"] else hf32
        qkin = qk_dot if cx["QK_DOT_INTERNAL"] else qkf
        args["out"] = (arg(dout), arg(q), q_bias, arg(mimo_o), arg(z), arg(mimo_z), cs, sn, da_cs, dt, arg(trap),
                       arg(d), segsum, arg(khat), arg(psiv), arg(hop), arg(qkin), arg(dz), arg(part_o), arg(part_z),
                       rec_arg, rec_cs_arg, B, S, H, dims.heads_per_group, nc, pl.n_tb, P // pl.BP3, pl.virt3)
    if "reduce" in cfg.kernels:
        # 4. deterministic sums of the per-chunk dmimo partials (both sums in one launch)
        args["reduce"] = (parts, dmimo, nc * pl.n_tb, -(-(R * P) // pl.BLKR))
    launches = []
    for name, kc in cfg.kernels.items():
        kernel = getattr(mod, KERNEL_FUNCTIONS[name])
        launches.append(Launch(name, kernel, kc.grid, args[name], _kwargs_for(kernel, kc.constexprs),
                               dict(kc.options)))

    def finish():
        if keep:
            _fill_record(record, rec, rec_cs, states, hf32, cx, dims, mod)

    outputs = MimoBwdFwdOutputs(dmimo_o=dmimo_o, states=states, dz=dz, dmimo_z=dmimo_z, qk_dot=qk_dot)
    return Prepared(launches, outputs, cfg, finish)


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
