"""One folder per operator of the Mamba-3 MIMO op (see the operator contract); each folder stands alone."""
