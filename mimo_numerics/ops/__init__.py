"""One folder per operator of the Mamba-3 MIMO op (see each folder's modules)."""
