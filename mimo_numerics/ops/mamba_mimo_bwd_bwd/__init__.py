"""``mamba_mimo_bwd_bwd``: stage 2 of the Mamba-3 MIMO backward pass (sites, spec, validation, policy reference)."""
