"""Backward stage 1 of the Mamba-3 MIMO op, ``mamba_mimo_bwd_fwd``: sites, reference, oracle, cases, kernels."""
