"""A plain training loop: epochs of batches, optional clipping and LR schedule, a history.

The loop does not know the task. The caller passes `step(model, batch) -> dict` that returns
the batch's mean loss under "loss", the number of items that mean is over under "n" (tokens for
a language model, examples for a classifier), and any other per-item means (e.g. "acc"). The
loop weights each by "n", so epoch numbers are exact averages even when batches differ in size.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

Step = Callable[[nn.Module, object], dict]


def progress(iterable: Iterable, **kwargs):
    """tqdm.auto bar, off under CI and scripted runs (`SEQ_QUIET=1`) so stored outputs stay clean."""
    from tqdm.auto import tqdm

    quiet = os.environ.get("SEQ_QUIET", "0") == "1" or os.environ.get("CI") == "true"
    return tqdm(iterable, disable=quiet, leave=False, file=sys.stderr, **kwargs)


def _run_epoch(model, loader, step, optimizer=None, clip=None, scheduler=None, desc="") -> dict:
    """One pass over `loader`; trains if an optimizer is given, else evaluates."""
    training = optimizer is not None
    model.train(training)
    sums: dict[str, float] = {}
    total = 0
    with torch.set_grad_enabled(training):
        for batch in progress(loader, desc=desc):
            out = step(model, batch)
            loss, n = out["loss"], int(out["n"])
            if training:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()  # per-batch schedules (warm-up, one-cycle)
            for key, value in out.items():
                if key != "n":
                    value = value.detach() if torch.is_tensor(value) else value
                    sums[key] = sums.get(key, 0.0) + float(value) * n
            total += n
    if total == 0:
        raise ValueError("the loader produced no items: is the dataset empty?")
    return {key: value / total for key, value in sums.items()}


def evaluate(model: nn.Module, loader: Iterable, step: Step) -> dict:
    """Item-weighted means of everything `step` returns, without gradients."""
    return _run_epoch(model, loader, step)


def fit(
    model: nn.Module,
    train_loader: Iterable,
    step: Step,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    val_loader: Iterable | None = None,
    clip: float | None = None,
    scheduler=None,
    log_every: int = 1,
) -> dict[str, list[float]]:
    """Train for `epochs`; return the history {"train_loss": [...], "val_loss": [...], ...}.

    Prints one line per `log_every` epochs (and after the last) with every number `step`
    returned, for train and validation, and the epoch time.
    """
    if epochs <= 0:
        raise ValueError(f"epochs must be positive, got {epochs}")
    history: dict[str, list[float]] = {}
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        stats = {
            f"train_{k}": v
            for k, v in _run_epoch(model, train_loader, step, optimizer, clip, scheduler,
                                   desc=f"epoch {epoch}").items()
        }
        if val_loader is not None:
            stats.update({f"val_{k}": v for k, v in evaluate(model, val_loader, step).items()})
        stats["epoch_time"] = time.perf_counter() - start
        for key, value in stats.items():
            history.setdefault(key, []).append(value)
        if epoch % log_every == 0 or epoch == epochs:
            print(format_stats(epoch, epochs, stats))
    return history


def format_stats(epoch: int, epochs: int, stats: dict) -> str:
    parts = [f"epoch {epoch:>{len(str(epochs))}}/{epochs}"]
    for key, value in stats.items():
        if key != "epoch_time":
            parts.append(f"{key} {value:.4f}")
    return " | ".join(parts) + f" | {stats['epoch_time']:.1f}s"


# ---------------------------------------------------------------------------- checkpoints
def _plain(value, key: str, tensors: bool = False):
    """`value` with numpy/torch scalars turned into Python numbers, recursively; anything that
    `torch.load(weights_only=True)` could not read back is refused here, naming `key`."""
    if isinstance(value, dict):
        return {k: _plain(v, f"{key}.{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v, f"{key}[{i}]", tensors) for i, v in enumerate(value))
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy/torch scalar
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if tensors and isinstance(value, torch.Tensor):
        return value
    raise TypeError(f"checkpoint {key} = {value!r} ({type(value).__name__}) cannot be stored: "
                    "use numbers, strings, bools, None, lists, tuples or dicts"
                    + (" (or tensors)" if tensors else ""))


def plain_config(config: dict | None) -> dict:
    """`config` with numpy scalars turned into Python numbers, so `weights_only` loading accepts it.

    `torch.load(weights_only=True)` refuses numpy objects, so a config holding `np.float64(0.1)`
    would save fine and then fail to load. Anything that is not a number, string, bool, None,
    list, tuple or dict is refused here, at save time, with the offending key.
    """
    return _plain(config or {}, "config")


def save_checkpoint(path: str | Path, model: nn.Module, config: dict | None = None,
                    optimizer: torch.optim.Optimizer | None = None, **extra) -> None:
    """Save weights (and optimizer state, config, extras) in a `weights_only`-loadable file.

    Extras are converted like the config (numpy scalars become numbers); tensors may be extras too.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "config": plain_config(config),
             **_plain(extra, "extra", tensors=True)}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    tmp = path.with_suffix(path.suffix + ".part")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path, model: nn.Module, config: dict | None = None,
                    optimizer: torch.optim.Optimizer | None = None, map_location="cpu") -> dict:
    """Load a checkpoint into `model`; refuse it if its config differs from `config`."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    if config is not None and state.get("config") != plain_config(config):
        raise ValueError(
            f"checkpoint {path} was trained with config {state.get('config')}, "
            f"but this model uses {config}; delete the file to retrain."
        )
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return state
