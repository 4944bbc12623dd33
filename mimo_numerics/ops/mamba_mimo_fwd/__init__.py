"""The forward kernel ``mamba_mimo_fwd``: sites, spec, validation, policy reference and FP64 oracle."""
