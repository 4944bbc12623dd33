"""Operators of the Mamba-3 MIMO op, one folder each (``ops/<name>/``: sites, spec, validation, reference,
oracle, cases, kernels); :mod:`mimo_numerics.ops.registry` lists them."""
