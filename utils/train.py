"""The course's one training loop, `fit`, and what it needs: devices, precision, evaluation.

Every model in the course trains through `fit` (notebooks that teach a loop write one by hand
first). The task stays outside the loop: the caller passes a batch source and
`step(model, batch) -> dict` that returns the batch's mean loss under "loss", the number of
items that mean is over under "n" (tokens for a language model, examples for a classifier) and
any other per-item means (e.g. "acc"). One update, in the order nanoGPT's loop uses:

    lr <- base lr x schedule(update, progress)       (a function; or an LRScheduler, stepped after)
    loss = step(model, batch)                       forward, under autocast if `precision` asks
    backward; clip the gradient norm; optimizer step

Budgets are counted in updates or epochs, so a GPU reproduces a CPU run's numbers, only faster;
`seconds` is an optional cap on training time (evaluation is not counted), whichever ends first.
`progress` in 0..1 is the share of the budget spent, so a schedule ends when the run does.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from utils.compare import improves

Step = Callable[[nn.Module, object], dict]
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def progress(iterable: Iterable | None = None, **kwargs):
    """tqdm.auto bar, off under CI and scripted runs (`SEQ_QUIET=1`) so stored outputs stay clean."""
    from tqdm.auto import tqdm

    quiet = os.environ.get("SEQ_QUIET", "0") == "1" or os.environ.get("CI") == "true"
    return tqdm(iterable, disable=quiet, leave=False, file=sys.stderr, **kwargs)


# ---------------------------------------------------------------------------- device and precision
def model_device(model: nn.Module) -> torch.device:
    """Where `model`'s parameters live: every helper puts its tensors there, never on a default."""
    return next(model.parameters()).device


def to_device(batch, device: torch.device):
    """`batch` with every tensor moved to `device`: tensors, tuples and lists (named ones too),
    dicts, and objects with a `.to(device)` method (`utils.text.Batch`, `TranslationBatch`)."""
    if isinstance(batch, torch.Tensor) or hasattr(batch, "to"):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch  # numbers, strings, None


def autocast(model: nn.Module, precision: str = "fp32"):
    """Autocast on the model's device in `precision` ("bf16", "fp16"), or a no-op for "fp32".

    Under autocast the matrix products run in 16 bits while sums such as the loss stay float32.
    Whether that is faster depends on the device *and* the model (see `time_precisions`).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    if PRECISIONS[precision] is None:  # also keeps devices autocast does not know (meta) working
        return contextlib.nullcontext()
    return torch.autocast(model_device(model).type, dtype=PRECISIONS[precision])


# ---------------------------------------------------------------------------- evaluation
class Means:
    """Item-weighted means of what `step` returns: each per-item mean counts `out["n"]` times."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.items = 0

    def add(self, out: dict) -> None:
        n = int(out["n"])
        for key, value in out.items():
            if key != "n":
                value = value.detach() if torch.is_tensor(value) else value
                self.sums[key] = self.sums.get(key, 0.0) + float(value) * n
        self.items += n

    def result(self, prefix: str = "") -> dict[str, float]:
        return {prefix + key: value / self.items for key, value in self.sums.items()} if self.items else {}


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, step: Step, precision: str = "fp32") -> dict:
    """Item-weighted means of everything `step` returns over `loader`, without gradients."""
    was_training = model.training
    model.eval()
    means, device = Means(), model_device(model)
    for batch in loader:
        with autocast(model, precision):
            means.add(step(model, to_device(batch, device)))
    model.train(was_training)
    if means.items == 0:
        raise ValueError("the loader produced no items: is the dataset empty?")
    return means.result()


# ---------------------------------------------------------------------------- the loop
def fit(model: nn.Module, batches: Iterable, step: Step, optimizer: torch.optim.Optimizer,
        epochs: int | None = None, val_loader: Iterable | None = None, *,
        updates: int | None = None, seconds: float | None = None, schedule=None,
        clip: float | None = None, precision: str = "fp32",
        validate: Callable[[nn.Module], dict] | None = None, eval_every: int | None = None,
        keep_best: tuple[str, str] | None = None, stop_when: Callable[[dict], bool] | None = None,
        on_gradients=None, on_update=None, log_every: int | None = 1) -> dict:
    """Train `model` on `batches` with `step` and `optimizer`; return the log.

    batches   a loader re-read every epoch, or an endless iterator (random batches; no epochs)
    budget    `epochs` or `updates`, optionally capped by `seconds` of training; `seconds`
              alone only where wall time is the lesson
    schedule  lr = base lr x schedule(update, progress), set before each update (the base
              rates go back into the optimizer at the end, so a second `fit` starts from them);
              or a `torch.optim.lr_scheduler.LRScheduler`, stepped after each update
    clip      clip the gradient norm to this value (and log the norm before clipping)
    precision "fp32", or "bf16"/"fp16" autocast on the model's device ("fp16" with a loss scaler)
    validate  model -> {name: value}: run every `eval_every` updates (None: after every epoch),
              and at the end; logged with a "val_" prefix. `val_loader` validates with `step`.
    keep_best ("val_acc", "max") or ("val_loss", "min"): restore the best validated weights
              (a NaN validation never counts as the best)
    stop_when stats -> bool, asked after every validation with what it just logged ("train_<k>",
              "val_<k>"): True ends training there (e.g. stop as soon as a task is solved)
    on_gradients, on_update  model -> dict of diagnostics (or None), called after clipping and
              after the optimizer step; their values are logged per update
    log_every print every k-th validation (and the last); None: print nothing

    Returns {"loss", "lr", "grad_norm", ...: one value per update; "eval_update",
    "eval_train_s", "train_<k>" (means over the updates since the previous validation),
    "val_<k>": one value per validation; "updates", "epochs", "items", "train_s": totals;
    "best_update" with keep_best}. The model is left in eval mode.
    """
    budget = _Budget(updates, epochs, seconds, _length(batches))
    if val_loader is not None and validate is None:
        validate = lambda m: evaluate(m, val_loader, step)  # noqa: E731
    device, base_lrs = model_device(model), [group["lr"] for group in optimizer.param_groups]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    log: dict = {"loss": [], "lr": [], "eval_update": [], "eval_train_s": []}
    since, best, items, bar = Means(), None, 0, progress(total=budget.total, desc="training")

    def run_validation() -> None:
        nonlocal since, best
        stats = since.result("train_")
        if validate is not None:
            stats.update({k if k.startswith("val_") else f"val_{k}": v for k, v in validate(model).items()})
        since = Means()
        _append(log, {"eval_update": budget.done, "eval_train_s": budget.train_s, **stats})
        best = _keep_best(model, log, keep_best, best)
        if stop_when is not None and stop_when(stats):
            budget.stopped = True  # the goal is reached: the rest of the budget is not needed
        if log_every and (len(log["eval_update"]) % log_every == 0 or budget.spent()):
            print(budget.describe(stats))

    try:
        while not budget.spent():
            seen = 0
            for batch in batches:
                if budget.spent():
                    break
                seen, start = seen + 1, time.perf_counter()
                if callable(schedule):  # a function of (update, progress); LRSchedulers step below
                    for group, base in zip(optimizer.param_groups, base_lrs):
                        group["lr"] = base * schedule(budget.done, budget.progress())
                model.train()
                with autocast(model, precision):
                    out = step(model, to_device(batch, device))
                stats = _update(model, optimizer, scaler, out["loss"], clip, on_gradients)
                if isinstance(schedule, torch.optim.lr_scheduler.LRScheduler):
                    schedule.step()
                stats.update((on_update and on_update(model)) or {})
                budget.tick(time.perf_counter() - start)
                since.add(out)
                items += int(out["n"])
                _append(log, stats)
                bar.update()
                if not math.isfinite(stats["loss"]):
                    budget.stopped = True  # a non-finite loss: nothing sensible follows
                elif eval_every and budget.done % eval_every == 0:
                    run_validation()
            else:  # the loader ran to its end: one epoch
                if seen == 0:
                    raise ValueError("the batch source produced no batches: is the dataset empty?")
                budget.epochs_done += 1
                if eval_every is None:
                    run_validation()
    finally:
        bar.close()
        if callable(schedule):  # give the optimizer its own rates back (after an interrupt too),
            # so a second `fit` schedules from the same base, not from the last scheduled rate
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base
    if not log["eval_update"] or log["eval_update"][-1] != budget.done:
        run_validation()  # the final model, unless it was just validated
    if best is not None:
        model.load_state_dict(best[1])
        log["best_update"] = best[2]
    model.eval()
    return {**log, "updates": budget.done, "epochs": budget.epochs_float(), "items": items,
            "train_s": budget.train_s}


def no_gain_for(patience: int = 1, key: str = "val_acc", mode: str = "max") -> Callable[[dict], bool]:
    """A `fit(stop_when=...)` rule for early stopping: True once `key` has not improved on its
    best for `patience` validations in a row. Use it with `keep_best` on the same key, so the
    run ends `patience` validations after its best and returns the best weights."""
    if patience < 1 or mode not in ("max", "min"):
        raise ValueError(f"need patience >= 1 and mode 'max' or 'min', got {patience}, {mode!r}")
    best, since = None, 0

    def stop(stats: dict) -> bool:
        nonlocal best, since
        if key not in stats:
            raise KeyError(f"no_gain_for watches {key!r}, but the validation logged only "
                           f"{sorted(stats)}: pass a key that fit logs (e.g. 'val_loss')")
        if improves(stats[key], best, mode):  # a NaN is never an improvement
            best, since = stats[key], 0
        else:
            since += 1
        return since >= patience

    return stop


def choose_rate(trial: Callable[[float], float], rates: list[float], step: float = 3.0,
                max_extra: int = 2) -> tuple[float, dict[float, float]]:
    """The rate with the lowest `trial(rate)` (a validation loss), on a grid that grows at its edges.

    While the best rate tried is the largest (or the smallest) of the grid, the next one out
    (`step` times larger, or smaller) is tried too, at most `max_extra` times: a rate that wins
    at the edge of its grid is a reason to look further, not a winner. A non-finite loss never
    wins. Returns (best rate, {rate: trial loss} for every rate tried, in increasing rate order).
    """
    if not rates or min(rates) <= 0:
        raise ValueError(f"give at least one positive rate, got {rates}")
    losses = {lr: trial(lr) for lr in sorted(rates)}

    def best() -> float:  # the lowest loss, the earlier rate on a tie; a non-finite loss never wins
        top = None
        for lr in losses:
            if top is None or improves(losses[lr], losses[top]):
                top = lr
        return top

    for _ in range(max_extra):
        lr = best()
        if len(losses) > 1 and lr == max(losses):
            nxt = lr * step
        elif len(losses) > 1 and lr == min(losses):
            nxt = lr / step
        else:
            break
        losses[nxt] = trial(nxt)
    return best(), dict(sorted(losses.items()))


def time_precisions(model: nn.Module, batch, step: Step, precisions: list[str] | None = None,
                    updates: int = 5) -> dict[str, float]:
    """Milliseconds per training update of `model` on `batch` in each precision (default: those
    its device supports, `utils.settings.supported_precisions`), timed on copies of the model
    after one warm-up update. Autocast is not free: on small models its casts can cost more than
    the 16-bit arithmetic saves, so choose by this timing, per device and model."""
    import copy
    import itertools

    from utils.settings import supported_precisions

    times = {}
    for precision in precisions or supported_precisions(model_device(model)):
        m = copy.deepcopy(model).to(model_device(model))  # a copy on the same device
        opt = torch.optim.SGD(m.parameters(), lr=0.0)  # the update's cost, not its effect
        for n in (1, updates):  # warm-up, then the timed updates
            log = fit(m, itertools.repeat(batch), step, opt, updates=n, precision=precision, log_every=None)
        times[precision] = 1000 * log["train_s"] / updates
    return times


def _update(model, optimizer, scaler, loss, clip, on_gradients) -> dict:
    """Backward, clip, step; returns this update's loss, learning rate and diagnostics."""
    stats = {"loss": loss.item(), "lr": optimizer.param_groups[0]["lr"]}
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # true gradients for clipping and probes (no-op unless fp16)
    if clip is not None:
        stats["grad_norm"] = float(nn.utils.clip_grad_norm_(model.parameters(), clip))
    if on_gradients is not None:
        stats.update(on_gradients(model) or {})
    scaler.step(optimizer)
    scaler.update()
    return stats


def _append(log: dict, values: dict) -> None:
    for key, value in values.items():
        log.setdefault(key, []).append(value)


def _keep_best(model, log, keep_best, best):
    """(score, weights, update) of the best validation so far, if `keep_best` asks for it."""
    if keep_best is None:
        return None
    key, mode = keep_best
    if mode not in ("max", "min"):
        raise ValueError(f"keep_best mode must be 'max' or 'min', got {mode!r}")
    if key not in log:
        raise ValueError(f"keep_best names {key!r}, but validation logged {sorted(k for k in log if k.startswith('val_'))}")
    score = log[key][-1]
    if best is None or improves(score, best[0], mode):  # a NaN validation is never best
        best = (score, {k: v.detach().clone() for k, v in model.state_dict().items()}, log["eval_update"][-1])
    return best


def _length(batches) -> int | None:
    try:
        return len(batches)
    except TypeError:  # an endless iterator
        return None


class _Budget:
    """Counts updates, epochs and training seconds; knows when the run is over and how far it is."""

    def __init__(self, updates, epochs, seconds, batches_per_epoch) -> None:
        if updates is not None and epochs is not None:
            raise ValueError("give one budget, updates=... or epochs=..., not both")
        if updates is None and epochs is None and seconds is None:
            raise ValueError("give a budget: updates=..., epochs=... or seconds=...")
        for name, value in (("updates", updates), ("epochs", epochs), ("seconds", seconds)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if epochs is not None and batches_per_epoch is None:
            raise ValueError("an epochs budget needs a loader with a length; "
                             "for an endless batch source give updates=...")
        self.updates, self.epochs, self.seconds = updates, epochs, seconds
        self.per_epoch, self.endless = batches_per_epoch, batches_per_epoch is None
        self.total = updates if updates is not None else (epochs * batches_per_epoch if epochs else None)
        self.done, self.epochs_done, self.train_s, self.stopped = 0, 0, 0.0, False

    def tick(self, seconds: float) -> None:
        self.done, self.train_s = self.done + 1, self.train_s + seconds

    def spent(self) -> bool:
        return (self.stopped
                or (self.updates is not None and self.done >= self.updates)
                or (self.epochs is not None and self.epochs_done >= self.epochs)
                or (self.seconds is not None and self.train_s >= self.seconds))

    def progress(self) -> float:
        """Share of the budget spent, 0..1: updates, or time if the seconds cap is further along."""
        shares = [self.done / self.total] if self.total else []
        shares += [self.train_s / self.seconds] if self.seconds else []
        return max(shares)

    def epochs_float(self) -> float | None:
        return None if self.endless else self.done / self.per_epoch

    def describe(self, stats: dict) -> str:
        where = (f"epoch {self.epochs_done:>{len(str(self.epochs))}}/{self.epochs}" if self.epochs
                 else f"update {self.done}" + (f"/{self.total}" if self.total else ""))
        parts = [where] + [f"{k} {v:.4f}" for k, v in stats.items()]
        return " | ".join(parts) + f" | {self.train_s:.1f} s"


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
                    optimizer: torch.optim.Optimizer | None = None, map_location=None) -> dict:
    """Load a checkpoint into `model` (onto the model's device unless `map_location` says
    otherwise); refuse it if its config differs from `config`."""
    state = torch.load(path, map_location=map_location or model_device(model), weights_only=True)
    if config is not None and state.get("config") != plain_config(config):
        raise ValueError(
            f"checkpoint {path} was trained with config {state.get('config')}, "
            f"but this model uses {config}; delete the file to retrain."
        )
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return state


# ---------------------------------------------------------------------------- optimizers and sizes
def param_count(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer parameter groups: weight decay on matrices (dim >= 2) only, as in GPT-2 and
    nanoGPT; biases, layer-norm gains and other vectors are not decayed."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def adamw(model: nn.Module, lr: float, weight_decay: float, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (`decay_groups`).

    `fused=True` updates each parameter in one kernel instead of about ten small ones (the same
    rule): on a CPU that saves a few milliseconds per update for a model of many small tensors
    (notebook 13's ViT). It needs a torch and a device with the fused kernel (CUDA; CPU from
    torch 2.4); elsewhere the usual implementation runs.
    """
    if fused:
        try:
            return torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr, betas=(0.9, 0.99), fused=True)
        except RuntimeError:  # no fused kernel for this device in this torch version
            pass
    return torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr, betas=(0.9, 0.99))
