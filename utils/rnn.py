"""Recurrent networks from scratch, gradient clipping, and a character language model.

Shapes (batch-first everywhere): B batch, T time steps, E input width, H hidden size,
V vocabulary size, L layers, D directions (1 or 2).

The recurrence of a simple (Elman) RNN, in row-vector form as the code computes it:

    h_t = tanh(x_t W_xh + h_{t-1} W_hh + b_h)        x_t: (B, E), h_t: (B, H)

`RNNScratch` runs that loop over time explicitly; `StackedRNN` composes single layers into
deep and bidirectional networks; `rnn_from_torch` copies an `nn.RNN`'s weights into them so
both give the same numbers. `CharLM` is the (fast, cuDNN/oneDNN-backed) language model built on
`nn.RNN`/`nn.LSTM`/`nn.GRU`, with its data loader, training step and sampler.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from utils.gated import init_keep_gate_

State = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # nn.RNN/GRU: h; nn.LSTM: (h, c)


# ---------------------------------------------------------------------------- from scratch
class RNNScratch(nn.Module):
    """One tanh RNN layer with an explicit Python loop over time.

    Parameters follow the math: `W_xh` (E, H), `W_hh` (H, H), `b_h` (H,). PyTorch's `nn.RNN`
    stores the transposes (`weight_ih_l0` is (H, E)) and two bias vectors `b_ih + b_hh`,
    which act as one: that is why it counts H more parameters than the textbook.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        assert input_size > 0 and hidden_size > 0, "input_size and hidden_size must be positive"
        self.input_size, self.hidden_size = input_size, hidden_size
        self.W_xh = nn.Parameter(torch.empty(input_size, hidden_size))  # (E, H)
        self.W_hh = nn.Parameter(torch.empty(hidden_size, hidden_size))  # (H, H)
        self.b_h = nn.Parameter(torch.empty(hidden_size))  # (H,)
        bound = 1 / math.sqrt(hidden_size)  # the same uniform init nn.RNN uses
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def cell(self, x_t: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
        """One time step: (B, E), (B, H) -> (B, H)."""
        return torch.tanh(x_t @ self.W_xh + h_prev @ self.W_hh + self.b_h)

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, E), h0 (B, H) or None (zeros) -> out (B, T, H) (every h_t), h_T (B, H)."""
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"x must be (B, T, {self.input_size}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        h = x.new_zeros(B, self.hidden_size) if h0 is None else h0  # (B, H)
        if h.shape != (B, self.hidden_size):
            raise ValueError(f"h0 must be ({B}, {self.hidden_size}), got {tuple(h.shape)}")
        outs = []
        for t in range(T):  # the sequential dependency: step t needs h_{t-1}
            h = self.cell(x[:, t], h)  # (B, H)
            outs.append(h)
        return torch.stack(outs, dim=1), h  # (B, T, H), (B, H)

    @torch.no_grad()
    def load_from_torch(self, rnn: nn.RNN, layer: int = 0, reverse: bool = False) -> RNNScratch:
        """Copy layer `layer` (its backward direction if `reverse`) of an `nn.RNN` into self."""
        sfx = f"_l{layer}" + ("_reverse" if reverse else "")
        w_ih, w_hh = getattr(rnn, "weight_ih" + sfx), getattr(rnn, "weight_hh" + sfx)
        if w_ih.shape != (self.hidden_size, self.input_size):
            raise ValueError(f"weight_ih{sfx} is {tuple(w_ih.shape)}, expected "
                             f"({self.hidden_size}, {self.input_size})")
        self.to(w_ih.device)  # the copy lives where the reference does
        self.W_xh.copy_(w_ih.T)  # torch stores (H, E) and computes x @ W.T
        self.W_hh.copy_(w_hh.T)
        self.b_h.copy_(getattr(rnn, "bias_ih" + sfx) + getattr(rnn, "bias_hh" + sfx))
        return self


class BidirectionalRNN(nn.Module):
    """Two `RNNScratch` layers: one reads left to right, one right to left; outputs concatenated."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.fwd = RNNScratch(input_size, hidden_size)
        self.bwd = RNNScratch(input_size, hidden_size)

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, E), h0 (2, B, H) or None -> out (B, T, 2H), h_n (2, B, H) [forward, backward]."""
        h0f, h0b = (None, None) if h0 is None else (h0[0], h0[1])
        out_f, h_f = self.fwd(x, h0f)  # (B, T, H)
        out_b, h_b = self.bwd(x.flip(1), h0b)  # reads x_T ... x_1
        out_b = out_b.flip(1)  # (B, T, H) realigned: position t holds the state after x_T..x_t
        return torch.cat([out_f, out_b], dim=-1), torch.stack([h_f, h_b])  # (B, T, 2H), (2, B, H)


class StackedRNN(nn.Module):
    """`num_layers` RNN layers, each fed the previous layer's outputs, like `nn.RNN(num_layers)`.

    With `bidirectional=True` each layer is a `BidirectionalRNN` and the next layer reads 2H
    features. State layout is torch's: h0 and h_n are (L * D, B, H), layer-major.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 2,
                 bidirectional: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        assert num_layers >= 1, f"num_layers must be >= 1, got {num_layers}"
        assert 0.0 <= dropout < 1.0, f"dropout must be in [0, 1), got {dropout}"
        self.D = 2 if bidirectional else 1
        self.num_layers, self.hidden_size, self.dropout = num_layers, hidden_size, dropout
        Layer = BidirectionalRNN if bidirectional else RNNScratch
        sizes = [input_size] + [self.D * hidden_size] * (num_layers - 1)
        self.layers = nn.ModuleList(Layer(e, hidden_size) for e in sizes)

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, E), h0 (L*D, B, H) or None -> out (B, T, D*H) of the top layer, h_n (L*D, B, H)."""
        LD = self.num_layers * self.D
        if h0 is not None and h0.shape[0] != LD:
            raise ValueError(f"h0 must be ({LD}, B, {self.hidden_size}), got {tuple(h0.shape)}")
        finals = []
        for i, layer in enumerate(self.layers):
            h_i = None if h0 is None else h0[i * self.D:(i + 1) * self.D]  # (D, B, H)
            if h_i is not None and self.D == 1:
                h_i = h_i[0]  # RNNScratch takes (B, H)
            x, h_n = layer(x, h_i)  # (B, T, D*H)
            finals.append(h_n.reshape(self.D, *h_n.shape[-2:]))  # (D, B, H)
            if i < self.num_layers - 1:  # like nn.RNN: dropout between layers, not after the top
                x = F.dropout(x, self.dropout, self.training)
        return x, torch.cat(finals)  # (B, T, D*H), (L*D, B, H)


def rnn_from_torch(rnn: nn.RNN) -> StackedRNN:
    """A from-scratch `StackedRNN` holding a copy of `rnn`'s weights (same outputs, same h_n).

    Our modules are always batch-first; feed them (B, T, E) even if `rnn.batch_first` is False.
    """
    if not isinstance(rnn, nn.RNN) or rnn.nonlinearity != "tanh" or not rnn.bias:
        raise ValueError("rnn_from_torch needs an nn.RNN with tanh and biases")
    ours = StackedRNN(rnn.input_size, rnn.hidden_size, rnn.num_layers, rnn.bidirectional,
                      rnn.dropout).to(rnn.weight_ih_l0.device, rnn.weight_ih_l0.dtype)
    for i, layer in enumerate(ours.layers):
        if rnn.bidirectional:
            layer.fwd.load_from_torch(rnn, i)
            layer.bwd.load_from_torch(rnn, i, reverse=True)
        else:
            layer.load_from_torch(rnn, i)
    return ours


# ---------------------------------------------------------------------------- clipping
@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: float,
                   eps: float = 1e-6) -> torch.Tensor:
    """Rescale all gradients together: g <- min(1, max_norm / ||g||) g; return ||g|| before.

    ||g|| is the L2 norm of every gradient concatenated into one vector, so the direction of
    the update is kept and only its length is capped. `eps` matches torch's
    `clip_grad_norm_` (it avoids dividing by zero when all gradients vanish). Like torch, it
    accepts one tensor or an iterable of them, and returns the norm in the gradients' dtype.
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    if isinstance(parameters, torch.Tensor):  # iterating a tensor would walk over its rows
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    # accumulate in float64 so neither float32 nor float64 gradients lose precision
    total_norm = torch.sqrt(sum((g.double() ** 2).sum().to(grads[0].device) for g in grads))
    scale = torch.clamp(max_norm / (total_norm + eps), max=1.0)  # min(1, theta / ||g||)
    for g in grads:
        g.mul_(scale.to(g.device, g.dtype))
    return total_norm.to(grads[0].dtype)


# ---------------------------------------------------------------------------- language model
class CharLM(nn.Module):
    """Character language model: one-hot (or embedded) input -> nn.RNN/LSTM/GRU -> logits.

    `forward(x (B, T) long, h=None) -> (logits (B, T, V), h)`. `h` is torch's state format
    ((L, B, H) tensor, or an (h, c) pair for the LSTM), so truncated BPTT can carry it from
    one window to the next (detach it first: `detach_state`). `forget_bias` is the keep-gate
    init of an LSTM/GRU (`utils.gated.init_keep_gate_`; "open" is the course's standard).
    """

    CELLS = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int = 1, cell: str = "rnn",
                 embed_size: int | None = None, dropout: float = 0.0,
                 forget_bias: float | str | None = "open") -> None:
        super().__init__()
        if cell not in self.CELLS:
            raise ValueError(f"cell must be one of {sorted(self.CELLS)}, got {cell!r}")
        assert vocab_size > 0 and hidden_size > 0 and num_layers >= 1, "sizes must be positive"
        assert 0.0 <= dropout < 1.0, f"dropout must be in [0, 1), got {dropout}"
        self.vocab_size, self.cell = vocab_size, cell
        # embed_size None: one-hot inputs (the textbook setup); else a learned embedding table
        self.embed = None if embed_size is None else nn.Embedding(vocab_size, embed_size)
        E = vocab_size if embed_size is None else embed_size
        self.rnn = self.CELLS[cell](E, hidden_size, num_layers, batch_first=True,
                                    dropout=dropout if num_layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_size, vocab_size)  # W_hq, b_q
        init_keep_gate_(self.rnn, forget_bias)  # gated cells start open (notebook 04)

    def forward(self, x: torch.Tensor, h: State | None = None) -> tuple[torch.Tensor, State]:
        if x.dim() != 2:
            raise ValueError(f"x must be (B, T) token ids, got shape {tuple(x.shape)}")
        if self.embed is None:
            e = F.one_hot(x, self.vocab_size).to(self.head.weight.dtype)  # (B, T, V), model dtype
        else:
            e = self.embed(x)  # (B, T, E)
        out, h = self.rnn(e, h)  # (B, T, H); batch_first=True, so no time-major switch
        return self.head(self.drop(out)), h  # (B, T, V)


def detach_state(h: State | None) -> State | None:
    """Cut the graph at a batch boundary (truncated BPTT): keep the values, drop the history."""
    if h is None:
        return None
    return tuple(t.detach() for t in h) if isinstance(h, tuple) else h.detach()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def make_lm_loader(ids: torch.Tensor, seq_len: int, batch_size: int, shuffle: bool = True,
                   seed: int = 0) -> torch.utils.data.DataLoader:
    """Cut a token stream (N,) into non-overlapping windows; yield (x, y) batches (B, T).

    y is x shifted by one token: y[b, t] = ids[start_b + t + 1]. `shuffle=True`: windows in a
    seeded random order; `shuffle=False`: in text order. Every window is kept either way.
    To carry a hidden state from batch to batch (truncated BPTT), lay the text out as parallel
    streams instead: `utils.bptt.make_streams` and `stream_windows`.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D token stream, got shape {tuple(ids.shape)}")
    if seq_len <= 0 or batch_size <= 0:
        raise ValueError(f"seq_len and batch_size must be positive, got {seq_len}, {batch_size}")
    n = (len(ids) - 1) // seq_len  # windows; the +1 target needs one extra token
    if n == 0:
        raise ValueError(f"a stream of {len(ids)} tokens is too short for seq_len={seq_len}")
    x = ids[: n * seq_len].reshape(n, seq_len)  # (n, T)
    y = ids[1: n * seq_len + 1].reshape(n, seq_len)  # (n, T)
    gen = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                       batch_size=batch_size, shuffle=shuffle, generator=gen)


def lm_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """Mean next-token cross-entropy of a (x, y) batch, for `utils.train.fit`; "n" = tokens."""
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in batch)  # (B, T), (B, T)
    logits, _ = model(x)  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return {"loss": loss, "n": y.numel()}


@torch.no_grad()
def sample(model: nn.Module, vocab, prompt: str, length: int, temperature: float = 1.0,
           generator: torch.Generator | None = None) -> str:
    """Feed `prompt` (characters), then draw `length` characters one at a time; return all.

    Each draw is from softmax(logits / temperature): below 1 sharpens the distribution
    (safer, more repetitive), above 1 flattens it (more surprising, more errors). Special
    tokens (<pad>, <unk>, ...) are never drawn. Sampling runs on the CPU so a CPU
    `generator` makes it reproducible on any device.
    """
    if not prompt:
        raise ValueError("the prompt must hold at least one character")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x = torch.tensor([vocab.encode(list(prompt))], device=device)  # (1, T0)
    logits, h = model(x)  # warm the state up on the whole prompt
    last, out = logits[0, -1], []  # (V,)
    for _ in range(length):
        scaled = (last.float().cpu() / temperature)  # (V,)
        scaled[:4] = -math.inf  # the specials <pad> <unk> <sos> <eos> occupy ids 0..3
        nxt = torch.multinomial(F.softmax(scaled, dim=-1), 1, generator=generator)  # (1,)
        out.append(int(nxt))
        logits, h = model(nxt.view(1, 1).to(device), h)  # (1, 1, V)
        last = logits[0, -1]
    model.train(was_training)
    return prompt + "".join(vocab.decode(out))
