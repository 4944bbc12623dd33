"""The forward kernel ``mamba_mimo_fwd`` of the Mamba-3 MIMO op: input validation and an FP64 oracle."""
