"""Replay a reference step's device kernels from a captured CUDA graph.

The ordered FP32 walks of the references (the state recurrences, the angle walks, the carried chunk sums) are
loops of small elementwise operations, one device launch each: at S = 8192, C = 16 thousands of launches per call,
and the host's per-launch cost, not the GPU, sets the wall time. :func:`replayed` captures such a step once per
shape as a CUDA graph and replays it: the same kernels with the same arguments in the same order, so the same
bits, launched by one host call. On the CPU, or with :data:`USE_CUDA_GRAPHS` off, it calls the step directly.

A step is a module-level function of tensors (and hashable keyword arguments) that returns a tensor or a tuple of
tensors, synchronises nothing with the host and reads no tensor it is not given (a captured graph replays on the
addresses it was captured with: :func:`replayed` copies the inputs into its own buffers and clones the outputs).
"""

from __future__ import annotations

import collections
from typing import Callable, Tuple, Union

import torch

#: Capture on CUDA (off: every step runs its kernels one launch at a time; the bits are the same either way).
USE_CUDA_GRAPHS = True
#: Captured graphs kept (least recently used first out); each holds its input and output buffers and the memory
#: its kernels allocated. One call of the whole op replays 14 distinct steps: fewer would recapture every call.
MAX_CACHED_GRAPHS = 32

_CACHE: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()

Outputs = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


def _signature(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device


def clear_cuda_graphs() -> None:
    """Drop every captured graph (and the device memory it holds)."""
    _CACHE.clear()


def _capture(step: Callable[..., Outputs], inputs: Tuple[torch.Tensor, ...], kwargs: dict) -> tuple:
    static = tuple(torch.empty_like(t) for t in inputs)  # the inputs' strides where dense, else contiguous
    for buffer, t in zip(static, inputs):
        buffer.copy_(t)
    # one eager run on a side stream first, as torch.cuda.graphs asks (lazy initialisations happen outside capture)
    side = torch.cuda.Stream(device=inputs[0].device)
    side.wait_stream(torch.cuda.current_stream(inputs[0].device))
    with torch.cuda.stream(side):
        step(*static, **kwargs)
    torch.cuda.current_stream(inputs[0].device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*static, **kwargs)
    return graph, static, outputs


def replayed(step: Callable[..., Outputs], *inputs: torch.Tensor, **kwargs) -> Outputs:
    """``step(*inputs, **kwargs)``, replayed from a CUDA graph captured once per step, keyword arguments and input
    shapes, strides, dtypes and device when the inputs are CUDA tensors; a direct call otherwise.

    Returns:
        Tensor | tuple: fresh tensors (clones of the graph's outputs), as ``step`` returns them.
    """
    on_cuda = bool(inputs) and all(t.is_cuda for t in inputs)
    if not (USE_CUDA_GRAPHS and on_cuda) or torch.cuda.is_current_stream_capturing():
        return step(*inputs, **kwargs)
    key = (step.__module__, step.__qualname__, tuple(sorted(kwargs.items())),
           tuple(_signature(t) for t in inputs))
    entry = _CACHE.get(key)
    if entry is None:
        entry = _capture(step, inputs, kwargs)
        _CACHE[key] = entry
        while len(_CACHE) > MAX_CACHED_GRAPHS:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    graph, static, outputs = entry
    for buffer, t in zip(static, inputs):
        buffer.copy_(t)
    graph.replay()
    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    return tuple(o.clone() for o in outputs)
