"""Test settings: fast mode and no progress bars, also for the notebook kernels nbval starts."""

import os

os.environ.setdefault("SEQ_FAST", "1")  # `SEQ_FAST=0 pytest` runs the notebooks in full mode
os.environ["SEQ_QUIET"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")
