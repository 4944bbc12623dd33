"""Operators of the Mamba-3 MIMO op, one folder each."""
