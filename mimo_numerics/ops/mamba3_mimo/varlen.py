"""Variable-length batches (``cu_seqlens``) of the whole op: packed sequences as a zero-padded batch.

Upstream's varlen path (mamba-ssm 2.3.2.post1: ``mamba3_mimo_fwd_varlen.py``, ``mamba3_mimo_bwd_varlen.py``, the
``_varlen`` Triton helpers) takes ``B = 1`` and ``cu_seqlens [NS + 1]`` (``0 = c_0 < c_1 < ... < c_NS = S``);
sequence i is tokens ``c_i .. c_{i+1} - 1``. Every kernel restarts at each sequence: its chunks start at the
sequence's first token (a sequence whose length is not a multiple of C ends in a tail chunk), the angle walk and
the SSM state start from zero, the trapezoid's shifted term of a sequence's last token is 0 (``dt`` of the next
token is masked), the log-decays are cumulated within the sequence's chunks. The parameter gradients are sums over
every token (``dq.sum(dim=(0, 1))``) and over the sequences (``dmimo_v.sum(dim=(0, 2))``).

Here the sequences become the rows of a batch, ``[NS, S_pad, ...]`` with ``S_pad`` the longest sequence rounded up to
a multiple of C, each row zero past its sequence's end; the whole op runs on that batch and ``Out`` (and each
input's gradient) is gathered back into the packed layout. The padding changes no real token: a padded token has
``dt = 0`` and ``V = 0`` (no trapezoid weight, no value: it adds nothing to any state, and the shifted term of the
real last token, ``dt·σ(-trap)`` of the next token, is 0 as upstream masks it), ``ADT = 0`` (the state passes
through unchanged), ``dout = 0`` (no gradient flows from it); tokens after a sequence's end never reach the tokens
before it. The sums over tokens and sequences meet the padded zeros in the packed order (adding ``+0`` is exact).
``return_state`` takes each sequence's state after its last real token (``FINAL_K`` of that token,
``Final_V = V`` of that token): ``[NS, ...]`` as upstream's varlen kernels return them.

Cost: ``NS · S_pad`` tokens instead of ``S`` (a reference, not a kernel: very unequal lengths pay for the padding).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

#: The op's inputs with a time axis, by the axis (``[B, S, ...]``: 1; ``[B, H, S]``: 2).
TIME_AXES = {"Q": 1, "K": 1, "V": 1, "Z": 1, "Angles": 1, "ADT": 2, "DT": 2, "Trap": 2}


def sequence_bounds(cu_seqlens, batch: int, seqlen: int) -> List[Tuple[int, int]]:
    """The ``(start, end)`` token range of each sequence of ``cu_seqlens``, after checking it.

    Args:
        cu_seqlens (Tensor): ``[NS + 1]`` int32 (or int64, which upstream casts to int32), on any device:
            ``0``, then strictly increasing, ending at ``seqlen``.
        batch (int): B of the inputs, which must be 1 (upstream's varlen mode packs every sequence in one row).
        seqlen (int): S, the packed length.

    Raises:
        TypeError, ValueError: naming ``cu_seqlens`` and what was expected.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor of int32, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must have dtype torch.int32 (or torch.int64, cast as upstream does), got "
                        f"{cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries [NS + 1], got shape "
                         f"{list(cu_seqlens.shape)}")
    if batch != 1:
        raise ValueError(f"cu_seqlens needs the sequences packed in one batch row (B = 1, as upstream's varlen "
                         f"mode asserts), got B={batch}")
    offsets = [int(v) for v in cu_seqlens.tolist()]
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets[0]}")
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    if any(n <= 0 for n in lengths):
        first = next(i for i, n in enumerate(lengths) if n <= 0)
        raise ValueError(f"cu_seqlens must be strictly increasing (every sequence at least one token): entries "
                         f"{first} and {first + 1} are {offsets[first]}, {offsets[first + 1]}")
    if offsets[-1] != seqlen:
        raise ValueError(f"cu_seqlens must end at the packed length S={seqlen}, got {offsets[-1]}")
    return list(zip(offsets, offsets[1:]))


def padded_length(bounds: List[Tuple[int, int]], chunk_size: int) -> int:
    """The rows' length: the longest sequence rounded up to a multiple of ``chunk_size``."""
    longest = max(b - a for a, b in bounds)
    return -(-longest // chunk_size) * chunk_size


def pack(tensors: Dict[str, Optional[torch.Tensor]], bounds: List[Tuple[int, int]],
         length: int, axes: Optional[Dict[str, int]] = None) -> Dict[str, Optional[torch.Tensor]]:
    """The op's inputs with the sequences as zero-padded batch rows (differentiable: gradients flow back).

    Args:
        tensors: the 14 inputs by golden names, ``B = 1`` packed. bounds: :func:`sequence_bounds`.
        length (int): the rows' length (:func:`padded_length`).
        axes (dict, optional): the time axis of each name that has one (default :data:`TIME_AXES`).

    Returns:
        dict: the same names; inputs with a time axis ``[NS, length, ...]`` / ``[NS, H, length]``, the rest as
        given.
    """
    axes = TIME_AXES if axes is None else axes
    packed = {}
    for name, x in tensors.items():
        axis = axes.get(name)
        if x is None or axis is None:
            packed[name] = x
            continue
        rows = []
        for a, b in bounds:
            row = x[0].narrow(axis - 1, a, b - a)
            pad = [0, 0] * (row.dim() - axis) + [0, length - (b - a)]
            rows.append(F.pad(row, pad))
        packed[name] = torch.stack(rows, dim=0)
    return packed


def unpack(out: torch.Tensor, bounds: List[Tuple[int, int]], axis: int = 1) -> torch.Tensor:
    """``[NS, length, ...]`` rows (time on ``axis``) back to the packed ``[1, S, ...]``: each row's real tokens,
    in order."""
    return torch.cat([out[i].narrow(axis - 1, 0, b - a) for i, (a, b) in enumerate(bounds)],
                     dim=axis - 1).unsqueeze(0)


def extend_tail_chunk(rows: torch.Tensor, bounds: List[Tuple[int, int]], chunk_size: int) -> torch.Tensor:
    """``rows [NS, H, length]`` with each row's padded tokens inside its last (tail) chunk set to the row's last
    real value: a chunk's cumulative log-decay ``da_cs`` as the preprocessing of a zero-padded ``ADT`` gives it
    (the state's decay across the tail chunk is read at its last token); later chunks keep their zeros."""
    out = rows.clone()
    for i, (a, b) in enumerate(bounds):
        n = b - a
        end = -(-n // chunk_size) * chunk_size
        if end > n:
            out[i, :, n:end] = rows[i, :, n - 1:n]
    return out


def chunk_slots(bounds: List[Tuple[int, int]], chunk_size: int) -> List[List[int]]:
    """Upstream's global chunk index of each sequence's chunks (``compute_dacs_segsum_triton_varlen``: sequence i's
    chunk j at ``start_i // C + i + j``, ``len_i // C + 1`` slots per sequence, ``S // C + NS`` in all)."""
    return [[a // chunk_size + i + j for j in range(-(-(b - a) // chunk_size))] for i, (a, b) in enumerate(bounds)]


def last_tokens(bounds: List[Tuple[int, int]]) -> Tuple[int, ...]:
    """Each row's last real token (its ``FINAL_K`` and ``Final_V``)."""
    return tuple(b - a - 1 for a, b in bounds)
