"""The state recurrence of the forward and of stage 1 (S41–S45 of the stage-1 catalog), under ``state_update``."""

from __future__ import annotations

from typing import Dict

import torch

#: Rows per accumulate step of the state GEMMs under ``state_update="accumulate_into"`` (the wgmma/mma k16 step).
STATE_ACCUMULATE_ROWS = 16

#: On CUDA, replay the recurrence's kernels from a captured CUDA graph (same kernels, same bits) once there are this
#: many chunks: the loop is otherwise bound by the host's per-launch cost (about 2 600 launches at S = 8192, C = 16).
USE_CUDA_GRAPHS = True
CUDA_GRAPH_MIN_CHUNKS = 64
_GRAPH_CACHE: Dict[tuple, tuple] = {}


def recurrence_loop(steps: torch.Tensor, decay: torch.Tensor, states: torch.Tensor, nchunks: int,
                    n_steps: int) -> None:
    """h_0 = 0; h_{c+1} = (((h_c·decay_c) + steps_0) + steps_1) + ...; writes h_c into ``states[c]``.

    Args:
        steps (Tensor): [nc·n_steps, B, H, N, P] the chunk sums (one per accumulate step).
        decay (Tensor): [nc, B, H, 1, 1]. states (Tensor): [nc, B, H, N, P], written.
    """
    step_views, decay_views, state_views = steps.unbind(0), decay.unbind(0), states.unbind(0)
    state_views[0].zero_()
    h = torch.empty_like(state_views[0])
    for c in range(nchunks - 1):
        torch.mul(state_views[c], decay_views[c], out=h)
        first = c * n_steps
        for s in range(first, first + n_steps - 1):
            h.add_(step_views[s])
        torch.add(h, step_views[first + n_steps - 1], out=state_views[c + 1])


def _recurrence_cuda_graph(steps: torch.Tensor, decay: torch.Tensor, nchunks: int, n_steps: int) -> torch.Tensor:
    """:func:`recurrence_loop` captured once per shape as a CUDA graph and replayed (only the latest shape is kept)."""
    key = (tuple(steps.shape), tuple(decay.shape), steps.dtype, steps.device, nchunks, n_steps)
    entry = _GRAPH_CACHE.get(key)
    if entry is None:
        _GRAPH_CACHE.clear()
        static_steps, static_decay = torch.empty_like(steps), torch.empty_like(decay)
        static_states = torch.empty((nchunks,) + steps.shape[1:], dtype=steps.dtype, device=steps.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            recurrence_loop(static_steps, static_decay, static_states, nchunks, n_steps)
        entry = _GRAPH_CACHE[key] = (graph, static_steps, static_decay, static_states)
    graph, static_steps, static_decay, static_states = entry
    static_steps.copy_(steps)
    static_decay.copy_(decay)
    graph.replay()
    return static_states.clone()


def state_recurrence(k_state: torch.Tensor, psiv: torch.Tensor, decay: torch.Tensor, policy) -> torch.Tensor:
    """States at the start of every chunk (S41–S45).

    Args:
        k_state (Tensor): [B, H, nc, L, N] rows of each chunk, L = C·R.
        psiv (Tensor): [B, H, nc, L, P].
        decay (Tensor): [B, H, nc] exp(da_cs) at the last valid token of each chunk.
        policy: its ``state_update`` (``"separate"``: one GEMM per chunk added to the decayed state;
            ``"accumulate_into"``: the GEMM adds into it in slices of ``STATE_ACCUMULATE_ROWS`` rows).

    Returns:
        Tensor: [B, H, nc, N, P] h_c, unrounded, in the math dtype.
    """
    batch, heads, nchunks, rows, _ = k_state.shape
    kt = k_state.transpose(-1, -2)  # [B, H, nc, N, L]
    if policy.state_update == "separate":
        steps = (kt @ psiv).unsqueeze(3)  # [B, H, nc, 1, N, P]
    else:
        slices = [kt[..., s:s + STATE_ACCUMULATE_ROWS] @ psiv[..., s:s + STATE_ACCUMULATE_ROWS, :]
                  for s in range(0, rows, STATE_ACCUMULATE_ROWS)]
        steps = torch.stack(slices, dim=3)  # [B, H, nc, n_slices, N, P]
    # chunk-major copies: steps [nc * n_steps, B, H, N, P], decay [nc, B, H, 1, 1]
    n_steps = steps.shape[3]
    steps = steps.permute(2, 3, 0, 1, 4, 5).reshape((nchunks * n_steps,) + steps.shape[:2] + steps.shape[4:])
    decay = decay.permute(2, 0, 1)[..., None, None].contiguous()
    if steps.is_cuda and nchunks >= CUDA_GRAPH_MIN_CHUNKS and USE_CUDA_GRAPHS:
        states = _recurrence_cuda_graph(steps, decay, nchunks, n_steps)
    else:
        states = torch.empty((nchunks,) + steps.shape[1:], dtype=steps.dtype, device=steps.device)
        recurrence_loop(steps, decay, states, nchunks, n_steps)
    return states.permute(1, 2, 0, 3, 4)
