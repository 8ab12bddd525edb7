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


FAST_VALUES = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False, "": False}


def is_fast() -> bool:
    """True when `SEQ_FAST=1`: tiny data slices and few epochs, every code path still runs."""
    value = os.environ.get("SEQ_FAST", "0").strip().lower()
    if value not in FAST_VALUES:
        accepted = ", ".join(repr(v) for v in FAST_VALUES if v)
        raise ValueError(f"SEQ_FAST must be one of {accepted} (or unset), got {value!r}")
    return FAST_VALUES[value]


def pick(full: T, fast: T) -> T:
    """The one place a notebook depends on the run mode: `epochs = pick(full=10, fast=1)`."""
    return fast if is_fast() else full


def available_devices() -> list[str]:
    """The devices this machine can run on, in the order `get_device` prefers them."""
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    mps = getattr(torch.backends, "mps", None)
    return (["cuda"] if cuda else []) + cuda[1:] + (["mps"] if mps and mps.is_available() else []) + ["cpu"]


DEVICE_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "apple": "mps", "metal": "mps"}  # what people type


def get_device() -> torch.device:
    """CUDA if present, then Apple MPS, then the CPU; `SEQ_DEVICE=cpu` (any case) forces one.

    A device this machine does not have, or a misspelled one, is refused here with the list of
    those it has, rather than failing later deep inside a model.
    """
    forced = os.environ.get("SEQ_DEVICE", "").strip().lower()
    if not forced:
        return torch.device(available_devices()[0])
    have = available_devices()
    try:
        device = torch.device(forced)
    except RuntimeError:
        kind, colon, index = forced.partition(":")
        meant = DEVICE_ALIASES.get(kind)
        hint = f"; for a GPU torch says {meant + colon + index!r}" if meant else ""
        raise ValueError(f"SEQ_DEVICE={forced!r} is not a device name{hint}; this machine has "
                         f"{', '.join(have)} (unset SEQ_DEVICE to pick the first)") from None
    usable = (device.type in ("cpu", "meta")
              or (device.type == "cuda" and torch.cuda.is_available()
                  and (device.index or 0) < torch.cuda.device_count())
              or (device.type == "mps" and "mps" in have and (device.index or 0) == 0))  # one MPS device
    if not usable:
        raise ValueError(f"SEQ_DEVICE={forced!r}, but this machine has no such device; it has "
                         f"{', '.join(have)} (unset SEQ_DEVICE to pick the first)")
    return device


def check_settings() -> list[str]:
    """What is wrong with `SEQ_FAST` and `SEQ_DEVICE`, one line each (empty: both good), read
    by `is_fast` and `get_device` themselves: the runner asks before it starts a kernel."""
    problems = []
    for read in (is_fast, get_device):
        try:
            read()
        except ValueError as err:
            problems.append(str(err))
    return problems


def synchronize(device: torch.device) -> None:
    """Wait until `device` has finished its queued work. GPU kernels run asynchronously, so a
    clock read without this measures the launching, not the computing; on a CPU it is a no-op."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def supported_precisions(device: torch.device) -> list[str]:
    """The training precisions `device` supports: float32 always; bfloat16 autocast on CPUs and
    on GPUs from Ampere on; float16 autocast (with a loss scaler) on CUDA and MPS. Which is
    *faster* depends on the model too: notebooks that train Transformers time them
    (`utils.train.time_precisions`) and keep the fastest."""
    if device.type == "cuda":
        return ["fp32"] + (["bf16"] if torch.cuda.is_bf16_supported() else []) + ["fp16"]
    if device.type == "mps":
        return ["fp32", "fp16"]
    return ["fp32", "bf16"] if device.type == "cpu" else ["fp32"]


def precision_note(device: torch.device) -> str:
    """One line for the run header: what this device offers besides float32."""
    offered = supported_precisions(device)
    if "bf16" in offered:
        return "float32; bfloat16 autocast available (used where a notebook's timing says it is faster)"
    if "fp16" in offered:
        return "float32; no bfloat16 here: float16 autocast with a loss scaler where it is faster"
    return "float32"


def marked_section(path, start: str, end: str) -> str:
    """The text of file `path` between the marker lines `start` and `end` (a generated README table)."""
    text = path.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{path} lacks the markers {start} ... {end}")
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def replace_marked_section(path, start: str, end: str, body: str) -> None:
    """Write `body` between the marker lines `start` and `end` of file `path`, keeping the rest."""
    marked_section(path, start, end)  # refuses a file without both markers
    head, rest = path.read_text().split(start, 1)
    path.write_text(f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}")


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
            f"mode     : {run.mode} (set SEQ_FAST=1 for the quick run, 0 for the full one)",
            f"device   : {run.device}" + (f" ({threads} CPU thread{'s' if threads != 1 else ''})" if run.device.type == "cpu" else ""),
            f"precision: {precision_note(run.device)}",
            f"python   : {platform.python_version()}   torch: {torch.__version__}",
            f"seed     : {run.seed}",
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
    # cuDNN would use TensorFloat-32 on recent GPUs: ~1e-3 errors, so "equals nn.RNN / nn.Conv2d"
    # checks would fail there. Full float32, as on a CPU; autocast is the course's speed knob.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    use_course_style()
    run = Run(seed=seed, device=get_device(), fast=is_fast())
    if os.environ.get("SEQ_DEVICE_CHECK") == "1":  # the test run's GPU stand-in on a CPU
        from course.devicecheck import install

        install(run.device)
    if not quiet:
        print(run_header(run), file=sys.stdout)
    return run
