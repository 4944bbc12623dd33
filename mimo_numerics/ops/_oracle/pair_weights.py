"""Token-pair decay weights of the FP64 oracles, split into a chunk's own pairs and chunk-to-chunk sums.

From the kernels' inputs ``da_cs``, ``da_cs_rev`` ``[B, H, S]`` and ``segsum`` ``[B, H, nc, C, C]`` (float64), the
weight of source token ``s`` in target token ``t > s`` is

* ``W[t, s] = exp(segsum[c_t, t mod C, s mod C])`` when both lie in chunk ``c_t``;
* ``W[t, s] = exp(da_cs[t]) · E[c_t, c_s] · exp(da_cs_rev[s])`` when ``c_s < c_t``, with ``E[c, c'] = exp(M[c, c'])``,
  ``M[c, c'] = Σ_{c' < k < c} Λ_k`` (0 for adjacent chunks), ``Λ_k = da_cs[last(k)]`` and
  ``last(k) = min((k + 1)·C, S) - 1``: the source leaves its chunk scaled by ``exp(da_cs_rev[s])``, decays by
  ``exp(Λ_k)`` through every chunk in between and is read by token ``t`` with ``exp(da_cs[t])``.

Because the cross-chunk weight factors into a target part, a chunk-pair part and a source part, a sum over the
source tokens of every earlier chunk is a sum over earlier *chunks* of per-chunk totals:
``Σ_{s : c_s < c_t} W[t, s] x[s] = exp(da_cs[t]) Σ_{c' < c_t} E[c_t, c'] Σ_{s in c'} exp(da_cs_rev[s]) x[s]``, an
explicit double sum with the ``[nc, nc]`` matrix ``E`` (no state recurrence: nothing is carried from one chunk to
the next), and likewise for a sum over later targets. ``M`` is an explicit masked sum (no cumulative sum). Memory
is ``O(B·H·(S·C + nc²))``; an oracle's per-chunk totals add ``O(B·H·nc·N·P)``.

Tokens are laid out by chunk, ``[..., nc, C, ...]`` (:meth:`ChunkPairs.by_chunk`), the tail chunk padded with
zeros; every weight of a padded token is 0, so padded tokens contribute nothing.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

_F64 = torch.float64


class ChunkPairs:
    """The weights of the module docstring for one call of an oracle.

    Args:
        da_cs, da_cs_rev (Tensor): ``[B, H, S]``. segsum (Tensor): ``[B, H, nc, C, C]``. Any real floating dtype,
            used in float64.
        chunk_size (int): C.

    Attributes:
        read (Tensor): ``exp(da_cs[t])`` by chunk, ``[B, H, nc, C]`` (0 on padded tokens).
        leave (Tensor): ``exp(da_cs_rev[s])`` by chunk, ``[B, H, nc, C]`` (0 on padded tokens).
        lam (Tensor): ``Λ [B, H, nc]``.
        decay (Tensor): ``E [B, H, nc (target chunk), nc (source chunk)]``, 0 unless source < target.
        intra (Tensor): ``W[t, s]`` inside each chunk, ``[B, H, nc, C (t), C (s)]``, 0 unless ``s < t``, both real.
    """

    def __init__(self, da_cs: torch.Tensor, da_cs_rev: torch.Tensor, segsum: torch.Tensor, chunk_size: int):
        da_cs, da_cs_rev, segsum = da_cs.to(_F64), da_cs_rev.to(_F64), segsum.to(_F64)
        self.seqlen, self.chunk_size, self.nchunks = da_cs.shape[-1], chunk_size, segsum.shape[2]
        device = da_cs.device
        zero = torch.zeros((), dtype=_F64, device=device)
        real = (torch.arange(self.nchunks * chunk_size, device=device) < self.seqlen).reshape(self.nchunks, chunk_size)
        self.read = torch.where(real, torch.exp(self.by_chunk(da_cs, 2)), zero)
        self.leave = torch.where(real, torch.exp(self.by_chunk(da_cs_rev, 2)), zero)
        last = torch.clamp(torch.arange(1, self.nchunks + 1, device=device) * chunk_size, max=self.seqlen) - 1
        self.lam = da_cs[..., last]

        index = torch.arange(self.nchunks, device=device)
        log_between = torch.zeros((*self.lam.shape, self.nchunks), dtype=_F64, device=device)
        for c in range(2, self.nchunks):  # M[c, c'] = Σ_{c' < k < c} Λ_k, as a masked sum over k for each c
            inside = (index[None, :c] < index[:c, None]).to(_F64)  # inside[k, c'] = 1 if c' < k (< c)
            log_between[:, :, c, :c] = torch.einsum("kj,bhk->bhj", inside, self.lam[..., :c])
        earlier_chunk = index[None, :] < index[:, None]  # [c, c']
        self.decay = torch.where(earlier_chunk, torch.exp(torch.where(earlier_chunk, log_between, zero)), zero)

        local = torch.arange(chunk_size, device=device)
        pair_real = real[:, :, None] & real[:, None, :] & (local[None, :] < local[:, None])  # [nc, t, s]
        self.intra = torch.where(pair_real, torch.exp(torch.where(pair_real, segsum, zero)), zero)

    def by_chunk(self, x: Optional[torch.Tensor], dim: int) -> Optional[torch.Tensor]:
        """``x`` with its token axis ``dim`` (length S) padded with zeros to ``nc·C`` and split into ``[nc, C]``."""
        if x is None:
            return None
        padded = self.nchunks * self.chunk_size
        if x.shape[dim] != padded:
            pad = [0, 0] * (x.dim() - 1 - dim) + [0, padded - x.shape[dim]]
            x = F.pad(x, pad)
        return x.reshape(*x.shape[:dim], self.nchunks, self.chunk_size, *x.shape[dim + 1:])

    def to_tokens(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The inverse of :meth:`by_chunk`: axes ``dim, dim + 1`` (``nc, C``) merged and cut to the S real tokens."""
        merged = x.reshape(*x.shape[:dim], self.nchunks * self.chunk_size, *x.shape[dim + 2:])
        return merged.narrow(dim, 0, self.seqlen)

    def from_earlier_chunks(self, totals: torch.Tensor) -> torch.Tensor:
        """``Σ_{c' < c} E[c, c'] totals[c']`` for every chunk ``c``: ``totals [B, H, nc, ...]`` -> same shape."""
        return torch.einsum("bhcd,bhd...->bhc...", self.decay, totals)

    def to_end(self, totals: torch.Tensor) -> torch.Tensor:
        """``Σ_c exp(Σ_{c < k < nc} Λ_k) totals[c]``: each chunk's total carried past every later chunk's decay to
        the end of the sequence (the state after the last chunk). ``totals [B, H, nc, ...]`` -> ``[B, H, ...]``."""
        later = torch.zeros_like(self.lam)  # Σ_{k > c} Λ_k
        later[..., :-1] = self.lam[..., 1:].flip(-1).cumsum(-1).flip(-1)
        return torch.einsum("bhc,bhc...->bh...", torch.exp(later), totals)

    def from_later_chunks(self, totals: torch.Tensor) -> torch.Tensor:
        """``Σ_{c > c'} E[c, c'] totals[c]`` for every chunk ``c'``: ``totals [B, H, nc, ...]`` -> same shape."""
        return torch.einsum("bhcd,bhc...->bhd...", self.decay, totals)
