"""Operators of the Mamba-3 MIMO op, one folder each (``ops/<op_name>/``: sites, spec, validation, reference)."""
