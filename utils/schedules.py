"""Learning-rate schedules for Transformers: linear warm-up + cosine decay, inverse square root,
and warm-up, hold, decay (`WarmupStableDecay`, a schedule that early stopping can end).

Both are multipliers of the optimizer's base learning rate, written twice on purpose: once as a
closed form of the step (`warmup_cosine_factor`, `inverse_sqrt_factor`), which plots and tests
use, and once as a `torch.optim.lr_scheduler.LRScheduler` (the public API since torch 2.0), which
training loops step once per optimizer step and which saves and resumes with `state_dict()`.

    warm-up + cosine (GPT-2, BERT, ViT):  f(s) = min(1, (s+1)/w) * [m + (1-m) (1 + cos(pi p)) / 2]
                                          p = (s - w) / (S - w) clipped to [0, 1], m = min_lr_ratio
    inverse square root (Vaswani et al.): f(s) = min((s+1)/w, sqrt(w/(s+1)))   ("Noam"), 1 at s+1 = w

The paper writes Noam as d_model^-0.5 * min(s^-0.5, s w^-1.5); that is f(s) above times the peak
learning rate d_model^-0.5 w^-0.5, so here the peak is simply the optimizer's `lr`.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


def warmup_cosine_factor(step: int, warmup_steps: int, progress: float,
                         min_lr_ratio: float = 0.0) -> float:
    """Multiplier at optimizer step `step` (0-based): linear warm-up over `warmup_steps`, times a
    cosine from 1 down to `min_lr_ratio` as `progress` goes from 0 to 1.

    `progress` is the share of the decay phase spent (`WarmupCosine`: updates after warm-up) or
    of the whole budget (`warmup_cosine`, the form `utils.train.fit` takes).
    """
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    p = min(max(progress, 0.0), 1.0)
    return warm * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)))


def warmup_cosine(warmup_steps: int, min_lr_ratio: float = 0.0):
    """The warm-up + cosine schedule as `utils.train.fit` takes it: factor(update, progress), where
    `progress` is the share of the budget spent (updates, or the seconds cap if it is further
    along), so the cosine reaches `min_lr_ratio` exactly when the run ends."""
    def factor(step: int, progress: float) -> float:
        return warmup_cosine_factor(step, warmup_steps, progress, min_lr_ratio)
    return factor


def start_of_longer_plan(schedule, updates: int | None, schedule_updates: int):
    """`schedule` (as `fit` takes it) for a run of `updates` that stops early in a plan of
    `schedule_updates`: progress is measured against the longer plan, not against the budget
    actually run. Two runs of different lengths then take the same learning rate at every
    update they share, and can be compared checkpoint by checkpoint."""
    if updates is None or not 0 < updates <= schedule_updates:
        raise ValueError(f"schedule_updates ({schedule_updates}) needs updates=... between 1 and it, "
                         f"got updates={updates}")

    def factor(step: int, progress: float) -> float:
        return schedule(step, step / schedule_updates)
    return factor


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """Multiplier at step `step` (0-based): rises linearly to 1 at step w - 1, then falls as 1/sqrt."""
    s = step + 1
    return min(s / warmup_steps, math.sqrt(warmup_steps / s))


def _check(optimizer: Optimizer, warmup_steps: int, total_steps: int | None = None) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if warmup_steps < 0 or (total_steps is not None and total_steps <= warmup_steps):
        raise ValueError(f"need 0 <= warmup_steps < total_steps, got warmup_steps={warmup_steps}, "
                         f"total_steps={total_steps}")


class WarmupCosine(LRScheduler):
    """lr = base_lr * warmup_cosine_factor(s, w, (s - w) / (S - w)) at optimizer step s.

    Call `scheduler.step()` after every `optimizer.step()`. After `total_steps` the rate stays at
    `min_lr_ratio * base_lr`.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int,
                 min_lr_ratio: float = 0.0, last_epoch: int = -1) -> None:
        _check(optimizer, warmup_steps, total_steps)
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return warmup_cosine_factor(step, self.warmup_steps, progress, self.min_lr_ratio)

    def get_lr(self) -> list[float]:
        f = self.factor(self.last_epoch)  # last_epoch counts scheduler steps: 0 before the first update
        return [base * f for base in self.base_lrs]


class InverseSqrt(LRScheduler):
    """lr = base_lr * inverse_sqrt_factor(s, w): the original Transformer's schedule, peak = base_lr."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, last_epoch: int = -1) -> None:
        _check(optimizer, warmup_steps)
        if warmup_steps == 0:
            raise ValueError("InverseSqrt needs warmup_steps >= 1 (its rate at step 0 would be infinite)")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = inverse_sqrt_factor(self.last_epoch, self.warmup_steps)
        return [base * f for base in self.base_lrs]


class WarmupStableDecay(LRScheduler):
    """Linear warm-up, the peak rate held, then a linear decay to 0: "warmup-stable-decay" (Hu et
    al. 2024), which ends as well as a cosine of the same length (Hägele et al. 2024) but need not
    know that length in advance.

    The decay starts when `start_decay()` is called, e.g. once validation stops improving, so
    early stopping still ends at a low rate; at the latest it starts at step
    total_steps / (1 + decay_share). It lasts `decay_share` times the steps before it, rounded up
    to a multiple of `round_to` (a run's validation interval, so the end falls on a check), so a
    run never passes `total_steps`. `done` is True once the decay has ended. Step it after every
    `optimizer.step()`.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int,
                 decay_share: float = 0.2, round_to: int = 1, last_epoch: int = -1) -> None:
        _check(optimizer, warmup_steps, total_steps)
        if decay_share <= 0 or round_to < 1:
            raise ValueError(f"need decay_share > 0 and round_to >= 1, got {decay_share}, {round_to}")
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.decay_share, self.round_to = decay_share, round_to
        self.latest_start = math.floor(total_steps / (1 + decay_share))
        self.decay_start: int | None = None  # the step the decay began at
        self.decay_steps = 0
        super().__init__(optimizer, last_epoch)

    def start_decay(self) -> None:
        """Begin the decay after the updates taken so far (no effect once it has begun)."""
        if self.decay_start is None:
            s = self.last_epoch  # updates taken so far
            steps = max(1, math.ceil(self.decay_share * s / self.round_to)) * self.round_to
            self.decay_start, self.decay_steps = s, min(steps, self.total_steps - s)

    @property
    def done(self) -> bool:
        return self.decay_start is not None and self.last_epoch >= self.decay_start + self.decay_steps

    def factor(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps > 0 else 1.0
        if self.decay_start is None or step < self.decay_start:
            return warm
        return warm * max(0.0, 1.0 - (step - self.decay_start) / self.decay_steps)

    def get_lr(self) -> list[float]:
        if self.decay_start is None and self.last_epoch >= self.latest_start:  # the budget runs out
            self.decay_start, self.decay_steps = self.latest_start, self.total_steps - self.latest_start
        f = self.factor(self.last_epoch)
        return [base * f for base in self.base_lrs]
