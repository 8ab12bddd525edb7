"""A long-range dependency toy task and a small recurrent classifier to train on it.

The recall task: every sequence starts with a class token, then `distance - 1` noise tokens;
the label is the first token. To answer at the last step the network must carry one symbol
across `distance - 1` steps, so accuracy against `distance` shows how far back a recurrent
cell can learn to look (chance is 1 / n_classes). Notebook 04 uses it for the vanilla RNN vs
the LSTM, notebook 05 for RNN / LSTM / GRU sweeps.

Shapes (batch-first): B batch, T time steps (= distance), V vocabulary, H hidden, C classes.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn

from utils.gated import init_keep_gate_
from utils.settings import get_device
from utils.train import fit

CELLS = ("rnn", "irnn", "lstm", "gru")
SOLVED_ACC = 0.9  # a run has "solved" the recall task when its held-out accuracy reaches this
TEST_SEED = 99_999  # the fixed held-out set every run of a distance is scored on  # irnn: ReLU RNN with identity W_hh (Le et al., 2015)


def make_recall_task(n_samples: int, distance: int, n_classes: int = 4, n_noise: int = 4,
                     seed: int = 0) -> torch.utils.data.TensorDataset:
    """x (N, distance) long, y (N,) long: y = x[:, 0], a class token in [0, n_classes).

    Positions 1 .. distance-1 hold noise tokens drawn uniformly from
    [n_classes, n_classes + n_noise), so the vocabulary size is n_classes + n_noise and
    nothing after the first position tells the class.
    """
    if n_samples <= 0 or distance < 1:
        raise ValueError(f"need n_samples > 0 and distance >= 1, got {n_samples}, {distance}")
    if n_classes < 2 or n_noise < 1:
        raise ValueError(f"need n_classes >= 2 and n_noise >= 1, got {n_classes}, {n_noise}")
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, n_classes, (n_samples,), generator=gen)  # (N,)
    noise = torch.randint(n_classes, n_classes + n_noise, (n_samples, distance - 1),
                          generator=gen)  # (N, distance - 1)
    x = torch.cat([y[:, None], noise], dim=1)  # (N, distance)
    return torch.utils.data.TensorDataset(x, y)


class SequenceClassifier(nn.Module):
    """One-hot tokens -> torch recurrent layer (`.rnn`) -> linear head on the last state.

    `forward(x (B, T)) -> logits (B, C)`. `forget_bias` sets the bias of the gate that keeps
    the state (the LSTM's forget gate, the GRU's update gate; `utils.gated.init_keep_gate_`):
    "open", the course's standard (ignored by the ungated cells), a number such as 3 (the gate
    starts near 0.95), or None for torch's init (gates near 0.5, the cautionary baseline).
    With `return_states=True` it also returns `states` (B, T, H), the hidden states h_1 .. h_T, as a leaf tensor whose `.grad` after
    `backward()` is the *total* gradient dL/dh_t (see `_unrolled`).
    """

    def __init__(self, vocab_size: int, hidden_size: int, n_classes: int, cell: str = "rnn",
                 forget_bias: float | str | None = "open"):
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
        assert vocab_size > 0 and hidden_size > 0 and n_classes > 1, "sizes must be positive"
        self.vocab_size, self.cell = vocab_size, cell
        if cell in ("rnn", "irnn"):
            nonlinearity = "relu" if cell == "irnn" else "tanh"
            self.rnn = nn.RNN(vocab_size, hidden_size, batch_first=True, nonlinearity=nonlinearity)
        else:
            self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](vocab_size, hidden_size,
                                                             batch_first=True)
        self.head = nn.Linear(hidden_size, n_classes)
        if cell == "irnn":  # identity recurrence and zero biases: h_t = relu(h_{t-1} + W x_t)
            with torch.no_grad():
                self.rnn.weight_hh_l0.copy_(torch.eye(hidden_size))
                self.rnn.bias_hh_l0.zero_()
                self.rnn.bias_ih_l0.zero_()
        init_keep_gate_(self.rnn, forget_bias)  # LSTM forget gate / GRU update gate

    def forward(self, x: torch.Tensor, return_states: bool = False):
        if x.dim() != 2:
            raise ValueError(f"x must be (B, T) token ids, got shape {tuple(x.shape)}")
        e = F.one_hot(x, self.vocab_size).to(self.head.weight.dtype)  # (B, T, V)
        if return_states:
            return self._unrolled(e)
        out, _ = self.rnn(e)  # (B, T, H), the fast fused loop
        return self.head(out[:, -1])  # (B, C)

    def _unrolled(self, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step the layer one token at a time so each h_t is its own node in the graph.

        The fused layer's `out[:, t]` only receives the gradient of what reads `out[:, t]`
        directly, not what flows back from later steps. Here we add a zero "probe" z_t to
        every state before the next step reads it: adding zero changes no value, and
        dL/dz_t = dL/dh_t, the full adjoint. Afterwards the probe is filled with the state
        values (no op saved it for backward, so this is safe) and returned as `states`.
        """
        B, T, _ = e.shape
        probe = torch.zeros(B, T, self.rnn.hidden_size, device=e.device, dtype=e.dtype,
                            requires_grad=True)  # (B, T, H)
        state, hs = None, []
        for t in range(T):
            _, state = self.rnn(e[:, t:t + 1], state)  # h: (1, B, H); LSTM: (h, c)
            h = (state[0] if self.cell == "lstm" else state)[0] + probe[:, t]  # (B, H)
            state = (h[None], state[1]) if self.cell == "lstm" else h[None]
            hs.append(h)
        with torch.no_grad():
            probe.copy_(torch.stack(hs, dim=1))  # (B, T, H)
        return self.head(hs[-1]), probe  # (B, C), (B, T, H)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> float:
    """Share of sequences whose arg-max logit is the label."""
    was_training = model.training
    model.eval()
    correct = sum(int((model(x[i:i + batch_size]).argmax(-1) == y[i:i + batch_size]).sum())
                  for i in range(0, len(x), batch_size))
    model.train(was_training)  # leave the model in the mode we found it in
    return correct / len(x)


def random_index_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator):
    """Endless minibatches (x[idx], y[idx]) of examples drawn uniformly with replacement."""
    while True:
        idx = torch.randint(0, len(y), (batch_size,), generator=generator)  # (B,)
        yield x[idx], y[idx]


def train_recall(cell: str = "rnn", distance: int = 20, hidden_size: int = 32,
                 n_train: int = 2048, n_val: int = 512, steps: int = 300, batch_size: int = 64,
                 lr: float = 3e-3, clip: float | None = 1.0, seed: int = 0,
                 device: str | torch.device | None = None, n_classes: int = 4,
                 n_noise: int = 4, forget_bias: float | str | None = "open",
                 optimizer: str = "adam", n_test: int = 1024, stop_at: float | None = None,
                 eval_every: int = 25) -> dict:
    """Train `SequenceClassifier(cell)` on the recall task for `steps` updates (`utils.train.fit`).

    `device` defaults to the course's (`utils.settings.get_device`). `optimizer` is "adam" or
    "sgd" (plain SGD, where one huge gradient means one huge step); `clip=None` trains without
    gradient clipping (the norm is still logged). Returns {"val_acc": float, "train_acc": float,
    "history": `fit`'s log (per update "loss", "grad_norm" before clipping), "time_s", "model",
    "test_acc": float, "solved": bool}. Validation data use a different seed, so they are unseen
    sequences: choose settings (e.g. the learning rate) on "val_acc". "test_acc" is measured on
    one fixed held-out set per distance (`TEST_SEED`), the same for every run, and a run has
    "solved" the task when it reaches `SOLVED_ACC` there.

    `stop_at` (e.g. `SOLVED_ACC`): validate every `eval_every` updates and stop as soon as the
    validation accuracy reaches it, so `steps` is a cap, not a fixed budget; "updates" says how
    many the run used (the updates-to-solve of a solved run), "stopped" whether it stopped early.
    """
    torch.manual_seed(seed)
    train = make_recall_task(n_train, distance, n_classes, n_noise, seed=seed)
    val = make_recall_task(n_val, distance, n_classes, n_noise, seed=seed + 10_000)
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    device = torch.device(device) if device is not None else get_device()
    model = SequenceClassifier(n_classes + n_noise, hidden_size, n_classes, cell,
                               forget_bias).to(device)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(), lr=lr)
    x, y = train.tensors  # (N, T), (N,)

    def step(m: nn.Module, batch) -> dict:
        xb, yb = batch
        return {"loss": F.cross_entropy(m(xb), yb), "n": len(yb)}

    batches = random_index_batches(x, y, batch_size, torch.Generator().manual_seed(seed))
    xv, yv = val.tensors
    early = {} if stop_at is None else dict(
        validate=lambda m: {"acc": accuracy(m, xv.to(device), yv.to(device))}, eval_every=eval_every,
        stop_when=lambda stats: stats["val_acc"] >= stop_at)
    log = fit(model, batches, step, opt, updates=steps, clip=clip or float("inf"), log_every=None,
              **early)
    xt, yt = make_recall_task(n_test, distance, n_classes, n_noise, seed=TEST_SEED).tensors
    test_acc = accuracy(model, xt.to(device), yt.to(device))
    return {"val_acc": accuracy(model, xv.to(device), yv.to(device)),
            "train_acc": accuracy(model, x.to(device), y.to(device)), "history": log,
            "time_s": log["train_s"], "model": model, "test_acc": test_acc,
            "solved": test_acc >= SOLVED_ACC, "updates": log["updates"],
            "stopped": log["updates"] < steps}


def parallel_workers(device: str | torch.device | None = None) -> int:
    """How many processes `run_parallel` should use: the usable CPU cores on the CPU, else 1.

    The recall models are tiny, so one run gains little from a second thread but two runs on
    two cores take the time of one. On a GPU the runs stay in one process (they share the card).
    """
    device = torch.device(device) if device is not None else get_device()
    if device.type != "cpu":
        return 1
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return max(1, len(cores))


def run_parallel(fn, jobs: list[dict], workers: int = 1) -> list:
    """[fn(**job) for job in jobs], in order; with `workers` > 1, in that many processes.

    Every job must seed itself (as `train_recall` does), so the results do not depend on which
    process ran which job: in parallel they equal the sequential ones (tested). `fn` must be
    importable from a module (processes are spawned, as on every OS; in a script, call this
    under `if __name__ == "__main__":`). Each process uses one CPU thread. Models in a result
    come back sent to the job's `device` (a process returns them as plain CPU tensors).
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1 or len(jobs) <= 1:
        return [fn(**job) for job in jobs]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx, initializer=_worker_init) as pool:
        futures = [pool.submit(fn, **job) for job in jobs]
        results = [f.result() for f in futures]
    for job, result in zip(jobs, results, strict=True):  # a model comes back as plain CPU tensors:
        _place(result, job.get("device") or get_device())  # send it where the job asked for it
    return results


def _place(value, device) -> None:
    """Send every `nn.Module` inside a result (dicts and lists, nested) to `device`, in place."""
    if isinstance(value, nn.Module):
        value.to(device)
    elif isinstance(value, dict):
        for v in value.values():
            _place(v, device)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _place(v, device)


def _worker_init() -> None:
    """One CPU thread per process; no progress bars (a worker's would not reach the notebook)."""
    os.environ["SEQ_QUIET"] = "1"
    torch.set_num_threads(1)


def _sweep_variant(cell: str, forget_bias, distances: list[int], seeds: list[int], lrs: list[float],
                   cap: int, grid_distance: int, grid_seeds: list[int], device, stop_at: float,
                   max_extra: int, kw: dict) -> dict:
    """One variant of `recall_sweep`: its rate on the grid seeds, then every seed at every distance."""
    from utils.train import choose_rate

    grid = {}

    def train(T, lr, seed):
        return train_recall(cell, T, steps=cap, lr=lr, seed=seed, device=device,
                            forget_bias=forget_bias, stop_at=stop_at, **kw)

    def trial(lr):
        tried = [train(grid_distance, lr, s) for s in grid_seeds]
        reached, updates = sum(r["val_acc"] >= stop_at for r in tried), sum(r["updates"] for r in tried) / len(tried)
        grid[lr] = (reached, updates)
        return len(tried) - reached + updates / (cap + 1)  # fewer misses first, then fewer updates

    lr = choose_rate(trial, lrs, max_extra=max_extra)[0]
    return {"lr": lr, "grid": grid, "runs": {T: [train(T, lr, s) for s in seeds] for T in distances}}


def recall_sweep(variants: dict, distances: list[int] | dict, seeds: list[int], lrs: list[float],
                 cap: int, grid_distance: int | dict, grid_seeds: list[int],
                 device: str | torch.device | None = None, stop_at: float = SOLVED_ACC,
                 max_extra: int = 2, workers: int = 1, **kw) -> dict:
    """Each variant at its own learning rate, chosen on validation, then over several seeds.

    Every run stops as soon as its validation accuracy reaches `stop_at` (checked every few
    dozen updates), under a cap of `cap` updates, so the table measures reach within the cap.
    `variants` maps a name to (cell, forget_bias); `distances` and `grid_distance` are one value
    for all, or a dict name -> value. For each variant, every rate in `lrs` trains
    the `grid_seeds` at `grid_distance`; the rate that reaches `stop_at` on validation in the most
    grid runs wins, ties going to the fewest mean updates (a count, the same on any device). A
    winner at the edge of the grid sends the search one step (x3 or /3) further out, at most
    `max_extra` times (`utils.train.choose_rate`). The grid seeds must differ from `seeds`: grid
    runs choose, they are not reported. The variants are independent: with `workers` > 1 they
    train in that many processes (`run_parallel`; same results). Returns {"lr": {name: chosen
    rate}, "grid": {(name, lr): (runs that reached stop_at, mean updates)} for every rate tried,
    "runs": {(name, distance): [one `train_recall` result per seed]}}; report "test_acc",
    "solved" and "updates" of the runs (the held-out set took no part in any choice).
    """
    if set(seeds) & set(grid_seeds):
        raise ValueError(f"the grid seeds {grid_seeds} must differ from the reported seeds {seeds}: "
                         "runs that choose the rate are not counted in the table")
    jobs = [dict(cell=cell, forget_bias=forget_bias, seeds=seeds, lrs=lrs, cap=cap, grid_seeds=grid_seeds,
                 distances=distances[name] if isinstance(distances, dict) else distances,
                 grid_distance=grid_distance[name] if isinstance(grid_distance, dict) else grid_distance,
                 device=device, stop_at=stop_at, max_extra=max_extra, kw=kw)
            for name, (cell, forget_bias) in variants.items()]
    parts = run_parallel(_sweep_variant, jobs, workers)
    out = {"lr": {}, "grid": {}, "runs": {}}
    for name, part in zip(variants, parts, strict=True):
        out["lr"][name] = part["lr"]
        out["grid"].update({(name, lr): v for lr, v in part["grid"].items()})
        out["runs"].update({(name, T): rs for T, rs in part["runs"].items()})
    return out


def updates_to_solve(runs: list[dict]) -> int | None:
    """Median updates the solved runs used (the upper median for an even count); None if none solved."""
    used = sorted(r["updates"] for r in runs if r["solved"])
    return used[len(used) // 2] if used else None


def seed_updates(runs: list[dict]) -> str:
    """The updates each run used, "x" for a run that did not solve the task: "150 x 700"."""
    return " ".join(str(r["updates"]) if r["solved"] else "x" for r in runs)


def solved_summary(runs: list[dict]) -> str:
    """"k/n" runs that solved the task, with the mean held-out accuracy: "2/3 (0.73)"."""
    solved = sum(r["solved"] for r in runs)
    return f"{solved}/{len(runs)} ({sum(r['test_acc'] for r in runs) / len(runs):.2f})"
