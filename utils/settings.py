"""Run settings: fast/full mode, device, seeding and the run header every notebook prints."""

from __future__ import annotations

import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")


def is_fast() -> bool:
    """True when `SEQ_FAST=1`: tiny data slices and few epochs, every code path still runs."""
    value = os.environ.get("SEQ_FAST", "0").strip().lower()
    if value not in {"0", "1", "", "false", "true"}:
        raise ValueError(f"SEQ_FAST must be 0 or 1, got {value!r}")
    return value in {"1", "true"}


def pick(full: T, fast: T) -> T:
    """The one place a notebook depends on the run mode: `epochs = pick(full=10, fast=1)`."""
    return fast if is_fast() else full


def get_device() -> torch.device:
    """CUDA if present, then Apple MPS, then the CPU (override with `SEQ_DEVICE=cpu`)."""
    forced = os.environ.get("SEQ_DEVICE")
    if forced:
        return torch.device(forced)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so a run can be repeated."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA and MPS generators


@dataclass(frozen=True)
class Run:
    """What `setup` decided for this notebook run; `utils.results` records it."""

    seed: int  # global seed set by `setup`
    device: torch.device  # where models and batches go
    fast: bool  # SEQ_FAST mode?
    started: float = field(default_factory=time.perf_counter)  # for the wall time

    @property
    def mode(self) -> str:
        return "fast" if self.fast else "full"

    def elapsed(self) -> float:
        """Seconds since `setup` was called."""
        return time.perf_counter() - self.started


def run_header(run: Run) -> str:
    """One line per fact a reader needs to compare runs."""
    threads = torch.get_num_threads()
    return "\n".join(
        [
            f"mode    : {run.mode} (set SEQ_FAST=1 for the quick run, 0 for the full one)",
            f"device  : {run.device}" + (f" ({threads} CPU threads)" if run.device.type == "cpu" else ""),
            f"python  : {platform.python_version()}   torch: {torch.__version__}",
            f"seed    : {run.seed}",
        ]
    )


def setup(seed: int = 0, threads: int | None = None, quiet: bool = False) -> Run:
    """Seed everything, choose the device, style the plots and print the run header.

    `threads` sets torch's CPU threads (None keeps torch's default). Small recurrent models
    step through time in tiny matrix products; on a small or busy CPU one thread is often
    faster than several that wait for each other.
    """
    from utils.plots import use_course_style  # local import: settings must stay light

    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    seed_everything(seed)
    use_course_style()
    run = Run(seed=seed, device=get_device(), fast=is_fast())
    if not quiet:
        print(run_header(run), file=sys.stdout)
    return run
