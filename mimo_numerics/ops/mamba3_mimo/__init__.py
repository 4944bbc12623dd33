"""The whole Mamba-3 MIMO op (``mamba3_mimo``): raw-input cases, upstream's preprocessing, an FP64 model of the op and
the upstream oracle."""
