"""The whole Mamba-3 MIMO op (``mamba3_mimo``): upstream's preprocessing and an FP64 model of the op."""
