"""Golden outputs too large to store whole, kept as a fixed random sample of their elements.

A whole-op run at S = 8192 writes about 40 MB of outputs per case (every kernel's, FP32 workspaces included): too
much for ``tests/data``. What the gates compute from them is a relative RMS, and the RMS of a difference is
estimated well from a uniform sample of its elements (4096 samples: a few percent of relative precision, far finer
than the factors the gates test). So a long golden case keeps, per output tensor, the values at ``SAMPLES``
positions drawn with the machine-independent generator (``mimo_numerics.exact_random``; with replacement), plus the
tensor's shape, dtype, number of elements, RMS and largest magnitude. The inputs are not stored: they are
regenerated from the case's spec, as for ``tests/data/upstream_h200_realistic_outputs.pt``.

Usage::

    record = summarize(tensor, seed=7)            # on the GPU machine, for each upstream output
    sampled_rel_rms(ours, record)                 # in a test: ||ours[pos] - upstream[pos]|| / ||upstream[pos]||
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from . import exact_random

#: Samples kept per tensor.
SAMPLES = 4096


def sample_positions(numel: int, seed: int, count: int = SAMPLES) -> torch.Tensor:
    """``count`` flat indices in ``[0, numel)`` drawn uniformly with replacement, the same on every machine.

    Raises:
        ValueError: ``numel`` < 1 or ``count`` < 1.
    """
    if numel < 1 or count < 1:
        raise ValueError(f"numel and count must be >= 1, got numel={numel}, count={count}")
    gen = torch.Generator().manual_seed(int(seed))
    u = exact_random.uniform((count,), gen)  # float64 in [0, 1)
    return torch.clamp((u * numel).floor().to(torch.int64), max=numel - 1)


def summarize(tensor: Optional[torch.Tensor], seed: int, count: int = SAMPLES) -> Optional[Dict[str, object]]:
    """The sampled record of ``tensor`` (None stays None): ``shape``, ``dtype`` (its name), ``numel``, ``seed``,
    ``positions`` (int32 ``[count]``), ``values`` (float64 ``[count]``, exact for every float dtype), ``rms``,
    ``max_abs`` (of the whole tensor, float64)."""
    if tensor is None:
        return None
    flat = tensor.detach().reshape(-1).to("cpu", torch.float64)
    positions = sample_positions(flat.numel(), seed, count)
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", ""), "numel": flat.numel(),
            "seed": int(seed),
            "positions": positions.to(torch.int32), "values": flat[positions],
            "rms": float(flat.square().mean().sqrt()), "max_abs": float(flat.abs().max())}


def sampled_values(tensor: torch.Tensor, record: Dict[str, object]) -> torch.Tensor:
    """``tensor``'s elements at the record's positions, float64, after checking the shape.

    Raises:
        ValueError: ``tensor`` has another shape than the record's.
    """
    if list(tensor.shape) != list(record["shape"]):
        raise ValueError(f"tensor has shape {list(tensor.shape)}, the sampled record {record['shape']}")
    flat = tensor.detach().reshape(-1).to("cpu", torch.float64)
    return flat[record["positions"].to(torch.int64)]


def sampled_rel_rms(tensor: torch.Tensor, record: Dict[str, object]) -> float:
    """``||t[pos] - r[pos]|| / ||r[pos]||`` over the record's positions (0 when both are 0; inf when only the
    record's values are 0)."""
    got, want = sampled_values(tensor, record), record["values"]
    num, den = (got - want).square().sum().sqrt().item(), want.square().sum().sqrt().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
