"""The state recurrence of the forward and of stage 1 (S41–S45 of the stage-1 catalog), under ``state_update``."""

from __future__ import annotations

import torch

from ...tensor_core import tensor_core_matmul
from .cuda_graph import replayed
from .gemm import operand_format, policy_matmul

#: Rows per accumulate step of the state GEMMs under ``state_update="accumulate_into"`` (the wgmma/mma k16 step).
STATE_ACCUMULATE_ROWS = 16

#: On CUDA, replay the recurrence's kernels from a captured CUDA graph (``cuda_graph.replayed``: same kernels, same
#: bits) once there are this many chunks: the loop is otherwise bound by the host's per-launch cost (about 2 600
#: launches at S = 8192, C = 16).
USE_CUDA_GRAPHS = True
CUDA_GRAPH_MIN_CHUNKS = 64


def recurrence_loop(steps: torch.Tensor, decay: torch.Tensor, states: torch.Tensor, nchunks: int,
                    n_steps: int, reverse: bool = False, final: bool = False) -> None:
    """h_0 = 0; h_{c+1} = (((h_c·decay_c) + steps_0) + steps_1) + ...; writes h_c into ``states[c]``. ``reverse``:
    the same walk from the last chunk down, D_{nc−1} = 0, D_{c−1} = ((D_c·decay_c) + steps_0) + ...; ``final``
    (forward only): one step more, h_nc (the state after the last chunk) into ``states[nc]``.

    Args:
        steps (Tensor): [nc·n_steps, B, H, N, P] the chunk sums (one per accumulate step), chunk c's at
            ``c·n_steps ...``. decay (Tensor): [nc, B, H, 1, 1]. states (Tensor): [nc (+ 1 with ``final``), B, H,
            N, P], written.
    """
    step_views, decay_views, state_views = steps.unbind(0), decay.unbind(0), states.unbind(0)
    order = range(nchunks - 1, 0, -1) if reverse else range(nchunks if final else nchunks - 1)
    state_views[nchunks - 1 if reverse else 0].zero_()
    h = torch.empty_like(state_views[0])
    for c in order:
        torch.mul(state_views[c], decay_views[c], out=h)
        first = c * n_steps
        for s in range(first, first + n_steps - 1):
            h.add_(step_views[s])
        torch.add(h, step_views[first + n_steps - 1], out=state_views[c - 1 if reverse else c + 1])


def recurrence_states(steps: torch.Tensor, decay: torch.Tensor, *, nchunks: int, n_steps: int,
                      reverse: bool = False, final: bool = False) -> torch.Tensor:
    """:func:`recurrence_loop` into a new ``[nc (+ 1 with final), B, H, N, P]`` tensor (the step
    ``cuda_graph.replayed`` captures)."""
    states = torch.empty((nchunks + int(final),) + steps.shape[1:], dtype=steps.dtype, device=steps.device)
    recurrence_loop(steps, decay, states, nchunks, n_steps, reverse, final)
    return states


def chunk_recurrence(steps: torch.Tensor, decay: torch.Tensor, reverse: bool = False, final: bool = False):
    """The decayed sum carried across chunks, its additions in the modelled order.

    Forward: h_0 = 0, h_{c+1} = ((h_c·decay_c) + steps[c, 0]) + steps[c, 1] + ...; ``reverse``: D_{nc−1} = 0,
    D_{c−1} = ((D_c·decay_c) + steps[c, 0]) + ... (the same loop walking the chunks from the last one down).

    Args:
        steps (Tensor): [B, H, nc, n_steps, N, P] the terms added in each chunk, in order.
        decay (Tensor): [B, H, nc].

        final (bool): forward only: also h_nc, the state after the last chunk (the same walk one step further).

    Returns:
        Tensor: [B, H, nc, N, P]; entry c is h_c (``reverse``: D_c), in ``steps``' dtype; forward: a chunk-major
        view, ``reverse``: contiguous. With ``final`` a pair ``(states, h_nc [B, H, N, P])``.
    """
    if final and reverse:
        raise ValueError("final=True is the forward walk's last step; the reverse walk has none")
    nchunks, n_steps = steps.shape[2], steps.shape[3]
    # chunk-major copies: steps [nc * n_steps, B, H, N, P], decay [nc, B, H, 1, 1]
    steps = steps.permute(2, 3, 0, 1, 4, 5).reshape((nchunks * n_steps,) + steps.shape[:2] + steps.shape[4:])
    decay = decay.permute(2, 0, 1)[..., None, None].contiguous()
    if steps.is_cuda and nchunks >= CUDA_GRAPH_MIN_CHUNKS and USE_CUDA_GRAPHS:
        states = replayed(recurrence_states, steps, decay, nchunks=nchunks, n_steps=n_steps, reverse=reverse,
                          final=final)
    else:
        states = recurrence_states(steps, decay, nchunks=nchunks, n_steps=n_steps, reverse=reverse, final=final)
    if final:
        return states[:nchunks].permute(1, 2, 0, 3, 4), states[nchunks]
    states = states.permute(1, 2, 0, 3, 4)
    # the layouts the references had before they shared this walk: the forward's the chunk-major view, the reverse
    # walk's a contiguous [B, H, nc, N, P] (a GEMM reads its operands in the order of their strides)
    return states.contiguous() if reverse else states


def state_recurrence(k_state: torch.Tensor, psiv: torch.Tensor, decay: torch.Tensor, policy, final: bool = False):
    """States at the start of every chunk (S41–S45).

    Args:
        k_state (Tensor): [B, H, nc, L, N] rows of each chunk, L = C·R.
        psiv (Tensor): [B, H, nc, L, P].
        decay (Tensor): [B, H, nc] exp(da_cs) at the last valid token of each chunk.
        policy: its ``state_update`` (``"separate"``: one GEMM per chunk added to the decayed state;
            ``"accumulate_into"``: the GEMM adds into it in slices of ``STATE_ACCUMULATE_ROWS`` rows) and its
            ``gemm_model`` (a tensor-core model: :func:`modelled_state_recurrence`).

        final (bool): also return h_nc ``[B, H, N, P]``, the state after the last chunk (upstream's
            ``FINAL_STATE``), the walk's next step.

    Returns:
        Tensor: [B, H, nc, N, P] h_c, unrounded, in the math dtype; with ``final`` a pair ``(h, h_nc)``.
    """
    batch, heads, nchunks, rows, _ = k_state.shape
    kt = k_state.transpose(-1, -2)  # [B, H, nc, N, L]
    if policy.gemm_model != "fp32":
        return modelled_state_recurrence(kt, psiv, decay, policy, final)
    if policy.state_update == "separate":
        steps = (kt @ psiv).unsqueeze(3)  # [B, H, nc, 1, N, P]
    else:
        slices = [kt[..., s:s + STATE_ACCUMULATE_ROWS] @ psiv[..., s:s + STATE_ACCUMULATE_ROWS, :]
                  for s in range(0, rows, STATE_ACCUMULATE_ROWS)]
        steps = torch.stack(slices, dim=3)  # [B, H, nc, n_slices, N, P]
    return chunk_recurrence(steps, decay, final=final)


def modelled_state_recurrence(kt: torch.Tensor, psiv: torch.Tensor, decay: torch.Tensor, policy, final: bool = False,
                              reverse: bool = False):
    """The chunk walk of :func:`state_recurrence` (``reverse``: of stage 2's dstates) under a tensor-core
    ``gemm_model`` (``mimo_numerics.tensor_core``).

    ``"accumulate_into"``: h_{c+1} = the GEMM ktᵀ·ΨV of chunk c accumulated *into* C = h_c·decay_c (upstream's
    ``clear_accum=False`` / ``mma.sync`` with C, S44–S45), chunk after chunk; ``reverse``: D_{nc−1} = 0,
    D_{c−1} = the GEMM of chunk c into D_c·decay_c. ``"separate"``: the cleared GEMM per chunk, then the FP32 walk of
    :func:`chunk_recurrence`.

    Args:
        kt (Tensor): [B, H, nc, N, L] the GEMM's left operand (k_stateᵀ; stage 2: q_rotᵀ). psiv (Tensor):
            [B, H, nc, L, P]. decay (Tensor): [B, H, nc].
        policy: its ``gemm_model``, ``lp_dtype`` and ``state_update``. final (bool): as in :func:`state_recurrence`
            (not with ``reverse``).

    Returns:
        Tensor: [B, H, nc, N, P] h_c (``reverse``: D_c), float32; with ``final`` a pair ``(h, h_nc [B, H, N, P])``.
    """
    if final and reverse:
        raise ValueError("final=True is the forward walk's last step; the reverse walk has none")
    if policy.state_update == "separate":
        steps = policy_matmul(policy)(kt, psiv).unsqueeze(3)  # [B, H, nc, 1, N, P]
        return chunk_recurrence(steps, decay, reverse=reverse, final=final)
    formats = operand_format(kt, policy.lp_dtype), operand_format(psiv, policy.lp_dtype)
    batch, heads, nchunks, n, _ = kt.shape
    states = kt.new_empty((batch, heads, nchunks + int(final), n, psiv.shape[-1]))
    h = states[:, :, nchunks - 1 if reverse else 0]
    h.zero_()
    order = range(nchunks - 1, 0, -1) if reverse else range(nchunks if final else nchunks - 1)
    for c in order:
        h = tensor_core_matmul(kt[:, :, c], psiv[:, :, c], h * decay[:, :, c, None, None], policy.gemm_model, *formats)
        states[:, :, c - 1 if reverse else c + 1] = h
    if final:
        return states[:, :, :nchunks], states[:, :, nchunks]
    return states
