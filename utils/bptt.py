"""Backpropagation through time by hand, gradient-norm probes, and truncated BPTT.

Notation (notebook 04, following the d2l-style derivation): a bias-free RNN with inputs
x_t (d,), hidden states h_t (H,), outputs o_t (q,),

    a_t = W_hx x_t + W_hh h_{t-1},   h_t = phi(a_t),   o_t = W_qh h_t,   h_0 = 0,

phi = identity (the linear RNN) or tanh. The code is batch-first and uses row vectors, so a
batch computes A_t = X_t W_hx^T + H_{t-1} W_hh^T with X (B, T, d), H (B, T, H), O (B, T, q).
The backward recursion for the adjoints zeta_t = dL/dh_t is

    zeta_T = W_qh^T dL/do_T
    zeta_t = W_hh^T (phi'(a_{t+1}) * zeta_{t+1}) + W_qh^T dL/do_t       (t < T)

i.e. the Jacobian dh_{t+1}/dh_t = diag(phi'(a_{t+1})) W_hh, applied transposed.

The second half is truncated BPTT on character text: `make_streams` lays a long text out as
B parallel streams and `stream_windows` cuts them into windows of k steps (`stream_loss`
carries the state along them); `train_truncated` reads batches of sequences in windows of k
steps, carrying the hidden state from one window to the next but detaching it, so gradients
flow back at most k steps; `position_loss` shows how much context a trained model uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from utils.rnn import clip_grad_norm, detach_state, make_lm_loader
from utils.train import fit

ACTIVATIONS = ("identity", "tanh")


def _check(X: torch.Tensor, W_hx: torch.Tensor, W_hh: torch.Tensor, W_qh: torch.Tensor,
           activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if X.dim() != 3:
        raise ValueError(f"X must be (B, T, d), got shape {tuple(X.shape)}")
    H = W_hh.shape[0]
    if W_hh.shape != (H, H) or W_hx.shape != (H, X.shape[-1]) or W_qh.shape[1] != H:
        raise ValueError(f"need W_hx (H, d), W_hh (H, H), W_qh (q, H) with d={X.shape[-1]}; "
                         f"got {tuple(W_hx.shape)}, {tuple(W_hh.shape)}, {tuple(W_qh.shape)}")


def rnn_forward(X: torch.Tensor, W_hx: torch.Tensor, W_hh: torch.Tensor, W_qh: torch.Tensor,
                activation: str = "identity",
                probe: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """X (B, T, d) -> hidden states H (B, T, H) and outputs O (B, T, q); h_0 = 0.

    `probe` (B, T, H), if given, must be zeros: it is added to every h_t before anything reads
    it, so autograd's gradient w.r.t. the probe is the total adjoint dL/dh_t. (The stacked H
    is not on the path from h_t to h_{t+1}, so H.grad would only hold the direct term.)
    """
    _check(X, W_hx, W_hh, W_qh, activation)
    B, T, _ = X.shape
    h = X.new_zeros(B, W_hh.shape[0])  # (B, H)
    states = []
    for t in range(T):
        a = X[:, t] @ W_hx.T + h @ W_hh.T  # (B, H): a_t = W_hx x_t + W_hh h_{t-1}, row form
        h = torch.tanh(a) if activation == "tanh" else a  # (B, H)
        if probe is not None:
            h = h + probe[:, t]  # adds zero; only there to collect dL/dh_t
        states.append(h)
    H = torch.stack(states, dim=1)  # (B, T, H)
    return H, H @ W_qh.T  # (B, T, H), (B, T, q)


def mean_ce_grad(outputs: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """dL/dO for L = mean cross-entropy over all B*T outputs O (B, T, q) with labels Y (B, T).

    dL/do_t = (softmax(o_t) - onehot(y_t)) / (B T): the 1/T of the seed's average loss, and 1/B
    because the batch is averaged too.
    """
    if outputs.shape[:2] != Y.shape:
        raise ValueError(f"outputs (B, T, q) and Y (B, T) disagree: {tuple(outputs.shape)}, "
                         f"{tuple(Y.shape)}")
    B, T, q = outputs.shape
    onehot = F.one_hot(Y, q).to(outputs.dtype)  # (B, T, q)
    return (torch.softmax(outputs, dim=-1) - onehot) / (B * T)  # (B, T, q)


@dataclass(frozen=True)
class BPTTGrads:
    """Everything the backward pass computes; shapes as in the forward pass."""

    dH: torch.Tensor  # (B, T, H) adjoints zeta_t = dL/dh_t (total: through all later steps)
    dA: torch.Tensor  # (B, T, H) dL/da_t = phi'(a_t) * zeta_t
    W_hx: torch.Tensor  # (H, d) dL/dW_hx = sum_t dA_t^T X_t
    W_hh: torch.Tensor  # (H, H) dL/dW_hh = sum_t dA_t^T H_{t-1}
    W_qh: torch.Tensor  # (q, H) dL/dW_qh = sum_t dO_t^T H_t


def bptt(X: torch.Tensor, H: torch.Tensor, dO: torch.Tensor, W_hx: torch.Tensor,
         W_hh: torch.Tensor, W_qh: torch.Tensor, activation: str = "identity") -> BPTTGrads:
    """Manual backward pass of `rnn_forward`, given its states H and dL/dO (B, T, q)."""
    _check(X, W_hx, W_hh, W_qh, activation)
    B, T, _ = H.shape
    # phi'(a_t): 1 for the identity; 1 - tanh(a_t)^2 = 1 - h_t^2 for tanh (no need to keep a_t)
    dphi = 1 - H**2 if activation == "tanh" else torch.ones_like(H)  # (B, T, H)
    dH, dA = torch.zeros_like(H), torch.zeros_like(H)  # (B, T, H)
    from_future = torch.zeros_like(H[:, 0])  # (B, H): W_hh^T dL/da_{t+1}, zero after step T
    for t in reversed(range(T)):
        dH[:, t] = dO[:, t] @ W_qh + from_future  # zeta_t: direct term + term through h_{t+1}
        dA[:, t] = dphi[:, t] * dH[:, t]
        from_future = dA[:, t] @ W_hh  # (B, H); row form of W_hh^T dA_t
    H_prev = torch.cat([torch.zeros_like(H[:, :1]), H[:, :-1]], dim=1)  # (B, T, H): h_{t-1}
    return BPTTGrads(
        dH=dH, dA=dA,
        W_hx=torch.einsum("bth,btd->hd", dA, X),  # sum over batch and time of dA_t x_t^T
        W_hh=torch.einsum("bth,btk->hk", dA, H_prev),
        W_qh=torch.einsum("btq,bth->qh", dO, H),
    )


def with_spectral_radius(W: torch.Tensor, rho: float) -> torch.Tensor:
    """W rescaled so that its largest eigenvalue modulus is `rho`."""
    if W.dim() != 2 or W.shape[0] != W.shape[1] or rho <= 0:
        raise ValueError(f"need a square matrix and rho > 0, got {tuple(W.shape)}, {rho}")
    radius = torch.linalg.eigvals(W).abs().max().to(W.dtype)
    return W * (rho / radius)


def adjoint_norms(dH: torch.Tensor) -> torch.Tensor:
    """||dL/dh_t|| per time step: (B, T, H) -> (T,), the per-sequence norm averaged over B."""
    if dH.dim() != 3:
        raise ValueError(f"dH must be (B, T, H), got shape {tuple(dH.shape)}")
    return dH.norm(dim=-1).mean(dim=0)


def state_grad_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||dL/dh_t|| (T,) of a classifier with `forward(x, return_states=True)` (mean CE loss).

    Runs in train mode (cuDNN backpropagates through recurrent layers only there), so use it
    on models without dropout; the mode is restored afterwards.
    """
    was_training, device = model.training, next(model.parameters()).device
    model.train()
    logits, states = model(x.to(device), return_states=True)  # (B, C), (B, T, H)
    F.cross_entropy(logits, y.to(device)).backward()
    model.zero_grad(set_to_none=True)  # we only wanted the states' gradients
    model.train(was_training)
    return adjoint_norms(states.grad.detach()).cpu()


# ---------------------------------------------------------------------------- truncated BPTT
def make_streams(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Token ids (N,) -> (B, N // B): row b is the b-th contiguous slice of the text.

    Step i of row b is followed by step i+1 of the same row, so a hidden state can be carried
    along a row for the whole pass (the tail N mod B tokens are dropped).
    """
    if ids.dim() != 1 or batch_size <= 0 or len(ids) < 2 * batch_size:
        raise ValueError(f"need ids (N,) with N >= 2B, got {tuple(ids.shape)} and B={batch_size}")
    S = len(ids) // batch_size
    return ids[: batch_size * S].reshape(batch_size, S)  # (B, S)


def stream_windows(streams: torch.Tensor, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive windows (x, y), each (B, <=k), with y the next character of x.

    The S - 1 input positions are cut at 0, k, 2k, ...; the last window may be shorter.
    """
    if streams.dim() != 2 or k <= 0:
        raise ValueError(f"need streams (B, S) and k > 0, got {tuple(streams.shape)}, k={k}")
    S = streams.shape[1]
    for i in range(0, S - 1, k):
        j = min(i + k, S - 1)
        yield streams[:, i:j], streams[:, i + 1:j + 1]  # (B, k), (B, k)


def saved_activation_bytes(fn: Callable[[], object], exclude: list[torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves for backward while `fn()` runs.

    This is the memory one forward graph keeps alive until `backward()`: the activations.
    Each storage is counted once (views share one) and tensors in `exclude` (the
    parameters, which exist anyway) are skipped.
    """
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@torch.no_grad()
def char_nll(model: nn.Module, ids: torch.Tensor, seq_len: int, carried: bool, streams: int = 32) -> np.ndarray:
    """NLL in nats of each token of `ids` (N,) as a language model scores it, NaN where it predicts
    none: the same positions a count model can be scored on, for paired comparisons.

    carried=False: windows of `seq_len` from a zero state (the validation loss of training), so
    ids[1:] up to the last full window are scored. carried=True: `streams` equal rows carrying the
    state across windows (`stream_loss`): the first token of each row and the tail that does not
    fill the rows are not scored.
    """
    was_training, device = model.training, next(model.parameters()).device
    nll = torch.full((len(ids),), math.nan, dtype=torch.float64)  # (N,)
    model.eval()
    if carried:
        rows = make_streams(ids, batch_size=streams).to(device)  # (B, S): row b is ids[b*S:(b+1)*S]
        h, parts = None, []
        for x, y in stream_windows(rows, seq_len):  # (B, k) each; h carries across windows
            logits, h = model(x, h)  # (B, k, V)
            parts.append(F.cross_entropy(logits.transpose(1, 2), y, reduction="none"))  # (B, k)
        nll[: rows.numel()].view(rows.shape)[:, 1:] = torch.cat(parts, dim=1).cpu().double()
    else:
        parts = [F.cross_entropy(model(x.to(device))[0].transpose(1, 2), y.to(device), reduction="none").flatten()
                 for x, y in make_lm_loader(ids, seq_len, 256, shuffle=False)]  # windows in text order
        flat = torch.cat(parts).cpu().double()  # targets ids[1], ids[2], ...
        nll[1: len(flat) + 1] = flat
    model.train(was_training)
    return nll.numpy()


@torch.no_grad()
def stream_loss(model: nn.Module, streams: torch.Tensor, k: int = 256) -> float:
    """Mean next-character cross-entropy over `streams`, carrying the state across windows."""
    was_training = model.training
    model.eval()
    streams = streams.to(next(model.parameters()).device)  # (B, S)
    h, total, n = None, 0.0, 0
    for x, y in stream_windows(streams, k):
        logits, h = model(x, h)  # (B, k, V)
        total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        n += y.numel()
    model.train(was_training)  # leave the model in the mode we found it in
    return total / n


def tbptt_step():
    """A `utils.train.fit` step for truncated BPTT on (x, y, starts_a_sequence) windows.

    The step keeps the hidden state between calls: a window continues from the previous
    window's final state, detached, so the next update starts from its value but no gradient
    flows back past the window boundary. A window that starts new sequences starts from zero.
    """
    carried = {"h": None}

    def step(model: nn.Module, batch) -> dict:
        x, y, fresh = batch  # (B, k), (B, k), bool
        logits, h = model(x, None if fresh else carried["h"])  # (B, k, V)
        carried["h"] = detach_state(h)  # keep the value, drop the graph
        return {"loss": F.cross_entropy(logits.flatten(0, 1), y.flatten()), "n": y.numel()}

    return step


def tbptt_windows(loader: Iterable, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, bool]]:
    """Endless (x, y, starts_a_sequence) windows of k steps, cycling through the loader's
    (x, y) batches of sequences (B, S): k >= S is ordinary full BPTT, one window per batch."""
    while True:
        for x, y in loader:  # (B, S) each
            for j in range(0, x.shape[1], k):
                yield x[:, j:j + k], y[:, j:j + k], j == 0


def train_truncated(model: nn.Module, loader: Iterable, k: int, updates: int | None = None,
                    seconds: float | None = None, lr: float = 3e-3, clip: float | None = 1.0,
                    val: tuple[torch.Tensor, torch.Tensor] | None = None,
                    eval_every: int = 100) -> dict:
    """Adam with truncated BPTT (`tbptt_step` on `tbptt_windows` of k steps) through
    `utils.train.fit`, for `updates` or `seconds` (give exactly one: notebook 04 compares
    window lengths at equal updates and at equal wall time). Gradients are clipped with the
    course's own `clip_grad_norm` (notebook 03). Every `eval_every` updates and at the end the
    mean `position_loss` on `val` is logged as "val_loss". Returns `fit`'s log ("items":
    characters trained on) plus "activation_bytes", the saved-for-backward bytes of one window.
    """
    if (updates is None) == (seconds is None):
        raise ValueError("give exactly one budget: updates=... or seconds=...")
    if k <= 0:
        raise ValueError(f"window length k must be positive, got {k}")
    opt, device = torch.optim.Adam(model.parameters(), lr=lr), next(model.parameters()).device
    x0, _ = next(iter(loader))
    mem = saved_activation_bytes(lambda: model(x0[:, :k].to(device)), exclude=list(model.parameters()))
    clipper = None if clip is None else (lambda m: {"grad_norm": float(clip_grad_norm(m.parameters(), clip))})
    validate = None if val is None else (lambda m: {"loss": float(position_loss(m, *val).mean())})
    log = fit(model, tbptt_windows(loader, k), tbptt_step(), opt, updates=updates, seconds=seconds,
              on_gradients=clipper, validate=validate, eval_every=eval_every, log_every=None)
    return {**log, "activation_bytes": mem}


@torch.no_grad()
def position_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy at each position (S,) of sequences x, y (B, S) read from a zero state.

    Position t has t characters of context, so the curve shows how much longer context the
    model has learned to use.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits, _ = model(x.to(device))  # (B, S, V)
    loss = F.cross_entropy(logits.transpose(1, 2), y.to(device), reduction="none")  # (B, S)
    model.train(was_training)
    return loss.mean(0).cpu()
