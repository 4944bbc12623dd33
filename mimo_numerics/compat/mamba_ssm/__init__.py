"""``mamba_ssm`` as ``mimo_numerics.compat`` provides it: the Mamba-3 MIMO op's modules only (package docstring
of ``mimo_numerics.compat``)."""

__mimo_numerics_compat__ = True
