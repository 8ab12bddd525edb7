"""Shared, tested code of the course "Sequence Models, from RNNs to Transformers".

Modules (each notebook imports what it needs):
- `utils.settings`: fast/full mode (`pick`), device, seeding, the run header (`setup`)
- `utils.data`: the course datasets, their sources and checksums, loaders
- `utils.text`: tokenizers, `Vocab`, padding (`PadCollate`) and length bucketing
- `utils.train`: the training loop (`fit`, `evaluate`) and checkpoints
- `utils.plots`: training curves and heatmaps
- `utils.results`: headline numbers of full runs and the README results table
- `utils.course`: repository URL, Colab badge/setup cell, executing notebooks
"""

from utils.settings import get_device, is_fast, pick, seed_everything, setup

__all__ = ["get_device", "is_fast", "pick", "seed_everything", "setup"]
