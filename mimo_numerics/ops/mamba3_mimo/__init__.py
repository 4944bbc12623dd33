"""The whole Mamba-3 MIMO op (`mamba3_mimo`): raw-input cases, preprocessing, upstream oracle."""
