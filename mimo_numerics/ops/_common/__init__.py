"""Building blocks the policy references of the kernels share (in the spirit of ``fla/ops/common``).

* :mod:`.rounder`: :class:`~.rounder.SiteRounder`, the policy's switches of one operator applied to a tensor.
* :mod:`.chunked`: the zero padding of a tail chunk, the discretisation (γ, shifted γ, trap scale), the biased
  q/k per head, the rotation, the diagonal rank sum, the chunk decays and the chunk outputs (inter, masked scores,
  intra), and the TF32 guard.
* :mod:`.recurrence`: the forward state recurrence under ``state_update`` (with its CUDA-graph replay).
* :mod:`.inputs`: the dimension letters and dtype class of every kernel input, for the operators' specs.

Used by the forward's, stage 1's (both paths) and stage 2's references. The FP64 oracles import nothing from here:
they stay independent implementations.
"""
