"""What the launchers of the chunk kernels share: size checks, the interpreter-time guard, buffers, launches.

The forward (``mimo_fwd.py``) and stage 1 (``mimo_bwd_fwd.py``) run the same four kernel families
(``_mimo_kernels.py``: angles, prep, state walk, output kernel; stage 1 adds the dmimo sums) from one frozen
``LaunchConfig`` (``_config.py``); :func:`build_chunk_launches` allocates their workspaces and binds every launch's
arguments. Each launcher validates its own operator's inputs first and wraps the buffers into its outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import torch

from mimo_numerics.validation import Dims

from . import _backend, _compile_ahead
from ._config import KERNEL_FUNCTIONS, LaunchConfig, Plan, launch_config, plan

#: State and value dims the kernels support (powers of two; tl.dot needs ≥ 16 on NVIDIA).
SUPPORTED_DIMS = (16, 32, 64, 128)
#: Largest number of fused rows C·R of one chunk.
MAX_FUSED_ROWS = 128
#: Interpreter runs estimated above this many seconds are refused unless ``allow_slow_interpreter=True``.
INTERPRETER_LIMIT_S = 120.0
#: Calibrated cost of one interpreted Triton op (seconds), for the estimate (2 shared CPU cores).
_INTERPRETER_OP_S = 3.2e-4

LP_NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}
#: The tensors a launch may read, by the stage-1 reference's argument names (the forward has no ``dout``).
TENSOR_NAMES = ("dout", "q", "k", "v", "q_bias", "k_bias", "mimo_v", "mimo_o", "z", "mimo_z", "angles", "da_cs",
                "da_cs_rev", "dt", "trap", "d", "segsum")


class SlowInterpreterError(RuntimeError):
    """A CPU (interpreter) run would take too long; pass ``allow_slow_interpreter=True`` to run it anyway."""


def triton_available() -> bool:
    """True when ``triton`` (or triton-ascend, which provides the same module) can be imported."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def require_triton() -> None:
    """Raise ``ImportError`` naming the extras to install when ``triton`` cannot be imported."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "mimo_numerics.kernels needs Triton: install the 'triton' extra (pip install 'mimo_numerics[triton]') "
            "for NVIDIA GPUs and the CPU interpreter, or the 'npu' extra (triton-ascend and torch_npu) for Ascend "
            f"NPUs ({exc})") from exc


def check_sizes(dims: Dims) -> None:
    """Refuse sizes the kernels do not support (N, P not in :data:`SUPPORTED_DIMS`, C·R > :data:`MAX_FUSED_ROWS`),
    naming the argument."""
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


def kwargs_for(kernel, values: Mapping[str, object]) -> dict:
    """The entries of ``values`` that ``kernel`` declares as arguments."""
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
        _compile_ahead.launch(self.kernel, (self.grid,), self.args, {**self.constexprs, **self.options})


@dataclass
class Prepared:
    """The launches of one call and the tensors they write (``build_launches`` of a launcher)."""

    launches: list
    outputs: object  # the operator's outputs NamedTuple
    config: LaunchConfig
    finish: object  # callable run after the launches (fills ``record``)

    @property
    def plan(self) -> Plan:
        """Tiles and grids of the launches (``config.plan``)."""
        return self.config.plan

    def run(self):
        """Run the launches and ``finish``; the outputs (refuses device tensors under ``TRITON_INTERPRET=1``)."""
        if self.config.backend != "interpreter" and any(_backend.is_interpreted(la.kernel) for la in self.launches):
            raise RuntimeError(
                f"TRITON_INTERPRET=1 is set, so the kernels for these {self.config.backend} tensors would run in "
                "Triton's interpreter with device constexprs; unset it (the kernels use the interpreter for CPU "
                "tensors by themselves)")
        for launch in self.launches:
            launch.run()
        self.finish()
        return self.outputs


@dataclass
class ChunkBuffers:
    """The tensors the chunk kernels write: outputs (those of the operator, None where absent) and the
    workspaces the records read back (``hf32``: FP32 states; ``rec``, ``rec_cs``: record slots)."""

    states: torch.Tensor  # [B, H, nc, N, P] lp: stage 1's output, the forward's workspace
    qk_dot: torch.Tensor  # [B, H, S, R, R] lp
    dz: Optional[torch.Tensor]  # [B, S, H, P] lp (stage 1, Z)
    o: Optional[torch.Tensor]  # [B, S, H, P] or [B, S, R, H, P] lp (forward)
    dmimo_o: Optional[torch.Tensor]  # [B, H, R, P] FP32 (stage 1, reduce_o)
    dmimo_z: Optional[torch.Tensor]  # [B, H, R, P] FP32 (stage 1, Z)
    hf32: Optional[torch.Tensor]
    rec: Optional[torch.Tensor]
    rec_cs: Optional[torch.Tensor]
    final: Optional[torch.Tensor] = None  # [B, H, N, P] FP32: the state after the last chunk (forward, FINAL)


def build_chunk_launches(operator: str, tensors: Dict[str, Optional[torch.Tensor]], dims: Dims, policy, *,
                         record: bool, poison: bool, allow_slow_interpreter: bool,
                         tuning: Optional[Mapping[str, int]], backend: Optional[str], sm_count: Optional[int],
                         final: bool = False):
    """The launches of ``operator`` on validated inputs: ``(config, kernel module, launches, ChunkBuffers)``.

    Args:
        operator (str): ``"mamba_mimo_bwd_fwd"`` or ``"mamba_mimo_fwd"`` (``_config.OPERATORS``).
        tensors (dict): :data:`TENSOR_NAMES` -> tensor or None, already validated by the operator's launcher.
        dims (Dims): their validated sizes. policy (RoundingPolicy): resolved.
        record (bool): write the record slots. poison (bool): NaN-fill every buffer first.
        allow_slow_interpreter, tuning, backend, sm_count: as the launchers document them.
        final (bool): also the state after the last chunk (``ChunkBuffers.final``; the forward's ``return_state``).
    """
    check_sizes(dims)
    cfg = launch_config(policy, dims, backend or _backend.backend_of(dims.device), tuning=tuning,
                        sm_count=sm_count, record=record, operator=operator, final=final)
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
    t = {name: (None if tensors.get(name) is None else tensors[name].contiguous()) for name in TENSOR_NAMES}
    dummy_f = t["q_bias"]  # never read: the constexpr branch that would read it is off

    # ---- outputs and workspaces (torch.empty: every element is written by a kernel)
    f32 = torch.float32

    def work(shape, as_lp):
        return torch.empty(shape, dtype=lp if as_lp else f32, device=dev)

    states = torch.empty((B, H, nc, N, P), dtype=lp, device=dev)
    qk_dot = torch.empty((B, H, S, R, R), dtype=lp, device=dev)
    dz = torch.empty((B, S, H, P), dtype=lp, device=dev) if dims.has_z and not cfg.forward else None
    o = None
    if cfg.forward:
        o = torch.empty((B, S, H, P) if dims.reduce_o else (B, S, R, H, P), dtype=lp, device=dev)
    kst = work((B * H * nc, pl.LP, N), cx["K_STATE"])
    khat = work((B * H * nc, pl.LP, N), cx["K_SCALED"])
    psiv = work((B * H * nc, pl.LP, P), cx["PSIV"])
    qkf = None if cx["QK_DOT_INTERNAL"] else torch.empty((B, H, S, R, R), dtype=f32, device=dev)
    aw = N // dims.rotary_dim_divisor
    cs = torch.empty((B, S, H, aw), dtype=f32, device=dev)
    sn = torch.empty((B, S, H, aw), dtype=f32, device=dev)
    hf32 = torch.empty((B, H, nc, N, P), dtype=f32, device=dev) if cx["STORE_F32"] else None
    final_state = torch.empty((B, H, N, P), dtype=f32, device=dev) if final else None
    n_part = B * H * nc * pl.n_tb  # dmimo partials: one row per (chunk, token block)
    # dmimo_o and dmimo_z (and their partials) as the two halves of one tensor when both exist: one sum launch
    n_sums = cfg.n_sums
    parts = torch.empty((n_sums, n_part, R * P), dtype=f32, device=dev) if n_sums else None
    dmimo = torch.empty((n_sums, B, H, R, P), dtype=f32, device=dev) if n_sums else None
    part_o, dmimo_o = (parts[0], dmimo[0]) if n_sums and dims.reduce_o else (None, None)
    part_z, dmimo_z = (parts[-1], dmimo[-1]) if n_sums and dims.has_z else (None, None)
    rec = rec_cs = None
    if record:
        rec = torch.zeros((_ix(mod.NSLOT), B, H, S, R, pl.W), dtype=f32, device=dev)
        rec_cs = torch.zeros((B * H * nc, C * R, C * R), dtype=f32, device=dev)
    if poison:
        for x in (states, qk_dot, dz, o, kst, khat, psiv, qkf, cs, sn, hf32, final_state, parts, dmimo, rec, rec_cs):
            if x is None:
                continue
            if x.dtype == f32:
                x.fill_(float("nan"))
            else:
                x.view(torch.int16).fill_(LP_NAN_BITS[lp])

    def arg(x):  # lp tensors travel as int16 bits; absent ones as a never-read FP32 placeholder
        if x is None:
            return dummy_f
        return x.view(torch.int16) if x.dtype in (torch.bfloat16, torch.float16) else x

    rec_arg = rec if record else dummy_f
    rec_cs_arg = rec_cs if record else dummy_f
    # ---- the arguments of each launch the configuration lists (constexprs and options come from it)
    args = {
        # 0. cos/sin of every angle, once
        "angles": (t["angles"], cs, sn, cs.numel()),
        # 1. per-row quantities of every chunk (k̂, k_state, ΨV, qk_dot), chunk-parallel
        "prep": (arg(t["q"]), arg(t["k"]), arg(t["v"]), t["q_bias"], t["k_bias"], t["mimo_v"], cs, sn, t["dt"],
                 arg(t["trap"]), t["da_cs_rev"], arg(kst), arg(khat), arg(psiv), arg(qk_dot), arg(qkf), rec_arg, B,
                 S, H, dims.heads_per_group, nc, pl.LP // pl.RB, pl.virt1),
        # 2. sequential walk over the chunks: states (lp), FP32 h when needed
        "state": (arg(kst), arg(psiv), arg(t["v"]), t["mimo_v"], t["da_cs"], arg(states), arg(hf32),
                  arg(final_state), S, H, nc, N // pl.BN, P // pl.BP2),
    }
    if "out" in cfg.kernels:
        # 3. chunk-parallel outputs from rnd(h_c)
        hop = states if cx["STATE_OPERAND"] else hf32
        qkin = qk_dot if cx["QK_DOT_INTERNAL"] else qkf
        args["out"] = (arg(t["dout"]), arg(t["q"]), t["q_bias"], arg(t["mimo_o"]), arg(t["z"]), arg(t["mimo_z"]),
                       cs, sn, t["da_cs"], t["dt"], arg(t["trap"]), arg(t["d"]), t["segsum"], arg(khat), arg(psiv),
                       arg(hop), arg(qkin), arg(dz), arg(o), arg(part_o), arg(part_z), rec_arg, rec_cs_arg, B, S, H,
                       dims.heads_per_group, nc, pl.n_tb, P // pl.BP3, pl.virt3)
    if "reduce" in cfg.kernels:
        # 4. deterministic sums of the per-chunk dmimo partials (both sums in one launch)
        args["reduce"] = (parts, dmimo, nc * pl.n_tb, -(-(R * P) // pl.BLKR))
    launches = []
    for name, kc in cfg.kernels.items():
        kernel = getattr(mod, KERNEL_FUNCTIONS[name])
        launches.append(Launch(name, kernel, kc.grid, args[name], kwargs_for(kernel, kc.constexprs),
                               dict(kc.options)))
    buffers = ChunkBuffers(states=states, qk_dot=qk_dot, dz=dz, o=o, dmimo_o=dmimo_o, dmimo_z=dmimo_z, hf32=hf32,
                           rec=rec, rec_cs=rec_cs, final=final_state)
    return cfg, mod, launches, buffers


def _ix(slot) -> int:
    """A record slot (a ``tl.constexpr`` in the kernel module) as a Python int."""
    return int(getattr(slot, "value", slot))


def record_slot(buffers: ChunkBuffers, slot, width: int) -> torch.Tensor:
    """Record slot ``slot`` (``_mimo_kernels.SLOT_*``) as ``[B, H, S, R, width]`` FP32."""
    return buffers.rec[_ix(slot)][..., :width].clone()


def record_token_slot(buffers: ChunkBuffers, slot) -> torch.Tensor:
    """A per-token record slot (γ, trap scale, ...) as ``[B, H, S]`` FP32."""
    return buffers.rec[_ix(slot)][..., 0, 0].clone()


def fill_common_record(record: dict, buffers: ChunkBuffers, cx: Mapping[str, object], dims: Dims, mod) -> None:
    """The stages both operators record, under the references' names: the prep kernel's (q̃, k̃, rotations, k̂,
    k_state, qk_dot, γ, trap scale, ΨV), the states, and the output kernel's (inter, scores, intra, diagonal,
    out, gate with Z)."""
    N, P, R = dims.state_dim, dims.value_dim, dims.rank
    B, H, nc, C = dims.batch, dims.heads, dims.nchunks, dims.chunk_size
    for name, slot, width in (("q_biased", mod.SLOT_Q_BIASED, N), ("k_biased", mod.SLOT_K_BIASED, N),
                              ("k_rot", mod.SLOT_K_ROT, N), ("q_rot", mod.SLOT_Q_ROT, N),
                              ("k_scaled", mod.SLOT_K_SCALED, N), ("k_state", mod.SLOT_K_STATE, N),
                              ("qk_dot", mod.SLOT_QK_DOT, R), ("psiv", mod.SLOT_PSIV, P),
                              ("inter", mod.SLOT_INTER, P), ("intra", mod.SLOT_INTRA, P),
                              ("diag_accum", mod.SLOT_DIAG_ACCUM, P), ("diag", mod.SLOT_DIAG, P),
                              ("out", mod.SLOT_OUT, P)):
        record[name] = record_slot(buffers, slot, width)
    for name, slot in (("gamma", mod.SLOT_GAMMA), ("shifted_gamma", mod.SLOT_SHIFTED_GAMMA),
                       ("trap_scale", mod.SLOT_TRAP_SCALE)):
        record[name] = record_token_slot(buffers, slot)
    record["state"] = buffers.hf32.clone()
    record["state_operand"] = (buffers.states.to(torch.float32) if cx["STATE_OPERAND"] else buffers.hf32.clone())
    record["causal_scores"] = buffers.rec_cs.reshape(B, H, nc, C * R, C * R).clone()
    if dims.has_z:
        record["gate"] = record_slot(buffers, mod.SLOT_GATE, P)
