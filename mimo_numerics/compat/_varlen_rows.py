"""The per-kernel varlen functions of ``mimo_numerics.compat``: upstream's packed arguments as zero-padded batch
rows and back (``mimo_numerics.ops.mamba3_mimo.varlen`` says why the padding changes no real token)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..ops.mamba3_mimo import varlen

#: The time axis of the per-kernel arguments (upstream's names) that have one.
KERNEL_TIME_AXES = {"q": 1, "k": 1, "v": 1, "z": 1, "angles": 1, "dout": 1, "dA_cs": 2, "dA_cs_rev": 2, "dt": 2,
                    "trap": 2}


def to_rows(args: Dict[str, Optional[torch.Tensor]], segsum: torch.Tensor, cu_seqlens, chunk_size: int
            ) -> Tuple[Dict[str, Optional[torch.Tensor]], torch.Tensor, List[Tuple[int, int]]]:
    """``(args as rows, segsum as rows [NS, H, length / C, C, C], bounds)`` of upstream's packed varlen arguments
    (``segsum`` in its global chunk layout, ``mamba3_mimo_utils.compute_dacs_segsum_triton_varlen``)."""
    q = args["q"]
    bounds = varlen.sequence_bounds(cu_seqlens, q.shape[0], q.shape[1])
    length = varlen.padded_length(bounds, chunk_size)
    rows = varlen.pack(args, bounds, length, axes=KERNEL_TIME_AXES)
    rows["dA_cs"] = varlen.extend_tail_chunk(rows["dA_cs"], bounds, chunk_size)
    slots = varlen.chunk_slots(bounds, chunk_size)
    seg_rows = segsum.new_zeros((len(bounds), segsum.shape[1], length // chunk_size) + tuple(segsum.shape[3:]))
    for i, row_slots in enumerate(slots):
        seg_rows[i, :, :len(row_slots)] = segsum[0, :, row_slots]
    return rows, seg_rows, bounds
