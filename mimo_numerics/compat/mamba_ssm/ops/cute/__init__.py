"""Upstream's package path, mirrored by ``mimo_numerics.compat``."""

__mimo_numerics_compat__ = True
