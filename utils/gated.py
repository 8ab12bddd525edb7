"""Gated recurrent networks from scratch: LSTM and GRU cells, stacked and bidirectional layers.

Every module here loops over time explicitly and names its parameters as in the equations of
notebook 05, so the code can be read next to the math. All tensors are batch-first:
x (B, T, D) in, out (B, T, H * num_directions) out. Final states follow PyTorch's layout
(num_layers * num_directions, B, H) so the scratch layers are drop-in comparable with
`nn.LSTM` / `nn.GRU`, whose weights they can load (`load_from_torch`).

Conventions (the details notebook 05 checks numerically):
- PyTorch stacks the gate blocks of `weight_ih_l0` (shape (G * H, D)) in the order
  i, f, g, o for the LSTM and r, z, n for the GRU, and keeps two biases, `bias_ih` and `bias_hh`.
  For the LSTM both biases are simply added, so b_i = b_ii + b_hi. For the GRU the candidate's
  hidden bias sits inside the reset product, so the scratch GRU keeps both (b_xh and b_hh).
- GRU reset: "before" (Cho et al. 2014, d2l): tanh(x W_xh + (r * h) W_hh + b);
  "after" (PyTorch / cuDNN): tanh(x W_xh + b_xh + r * (h W_hh + b_hh)).
- GRU update gate: z_weights="old" means h' = z * h + (1 - z) * h_tilde (Cho et al., d2l,
  PyTorch); z_weights="new" means h' = (1 - z) * h + z * h_tilde (Chung et al. 2014 and some
  textbooks). The two are the same model with the z-gate's weights and bias negated.
- Open gates: `open_gates_` starts PyTorch's LSTM/GRU layers in "keep the state" mode, the
  course's standard initialization for gated cells from notebook 04 on.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

Tensor = torch.Tensor
GATES_PER_CELL = {"rnn": 1, "gru": 3, "lstm": 4}  # weight blocks per cell type


def _param(*shape: int, scale: float) -> nn.Parameter:
    """Uniform(-scale, scale) init, the same rule PyTorch uses for its recurrent layers."""
    return nn.Parameter(torch.empty(*shape).uniform_(-scale, scale))


class LSTMCell(nn.Module):
    """One LSTM step: (x_t (B, D), (h, c) each (B, H)) -> (h_t, c_t), optionally the gates.

    i = sigma(x W_xi + h W_hi + b_i)      input gate
    f = sigma(x W_xf + h W_hf + b_f)      forget gate
    g = tanh (x W_xg + h W_hg + b_g)      candidate cell (c tilde)
    o = sigma(x W_xo + h W_ho + b_o)      output gate
    c_t = f * c + i * g,   h_t = o * tanh(c_t)
    """

    GATES = "ifgo"  # PyTorch's block order inside weight_ih / weight_hh

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(f"sizes must be positive, got D={input_size}, H={hidden_size}")
        self.input_size, self.hidden_size = input_size, hidden_size
        k = 1 / math.sqrt(hidden_size)
        for gate in self.GATES:
            setattr(self, f"W_x{gate}", _param(input_size, hidden_size, scale=k))  # (D, H)
            setattr(self, f"W_h{gate}", _param(hidden_size, hidden_size, scale=k))  # (H, H)
            setattr(self, f"b_{gate}", _param(hidden_size, scale=k))  # (H,)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor], return_gates: bool = False):
        h, c = state  # (B, H), (B, H)
        i = torch.sigmoid(x @ self.W_xi + h @ self.W_hi + self.b_i)  # (B, H)
        f = torch.sigmoid(x @ self.W_xf + h @ self.W_hf + self.b_f)  # (B, H)
        g = torch.tanh(x @ self.W_xg + h @ self.W_hg + self.b_g)  # (B, H)
        o = torch.sigmoid(x @ self.W_xo + h @ self.W_ho + self.b_o)  # (B, H)
        c = f * c + i * g  # (B, H): the additive path the gradient travels along
        h = o * torch.tanh(c)  # (B, H)
        if return_gates:
            return (h, c), {"i": i, "f": f, "g": g, "o": o, "c": c}
        return h, c

    @torch.no_grad()
    def load_from_torch(self, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> None:
        """Copy one direction of one layer of `nn.LSTM` (weights (4H, D) and (4H, H)) onto
        the weights' device."""
        H = self.hidden_size
        self.to(w_ih.device)  # the copy lives where the reference does
        for k, gate in enumerate(self.GATES):
            rows = slice(k * H, (k + 1) * H)  # block k of the i, f, g, o stack
            getattr(self, f"W_x{gate}").copy_(w_ih[rows].T)  # torch computes x @ W^T
            getattr(self, f"W_h{gate}").copy_(w_hh[rows].T)
            getattr(self, f"b_{gate}").copy_(b_ih[rows] + b_hh[rows])  # two biases, one sum


class GRUCell(nn.Module):
    """One GRU step: (x_t (B, D), h (B, H)) -> h_t (B, H), optionally the gates.

    r = sigma(x W_xr + h W_hr + b_r)                                  reset gate
    z = sigma(x W_xz + h W_hz + b_z)                                  update gate
    reset="before": h_tilde = tanh(x W_xh + b_xh + (r * h) W_hh + b_hh)   Cho et al., d2l
    reset="after":  h_tilde = tanh(x W_xh + b_xh + r * (h W_hh + b_hh))   PyTorch, cuDNN
    z_weights="old": h_t = z * h + (1 - z) * h_tilde;  "new": h_t = (1 - z) * h + z * h_tilde
    """

    GATES = "rzh"  # PyTorch's r, z, n blocks; we call the candidate block "h" (h tilde)

    def __init__(self, input_size: int, hidden_size: int,
                 reset: Literal["before", "after"] = "after",
                 z_weights: Literal["old", "new"] = "old") -> None:
        super().__init__()
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(f"sizes must be positive, got D={input_size}, H={hidden_size}")
        if reset not in ("before", "after") or z_weights not in ("old", "new"):
            raise ValueError(f"reset must be before/after and z_weights old/new, got "
                             f"{reset!r}, {z_weights!r}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.reset, self.z_weights = reset, z_weights
        k = 1 / math.sqrt(hidden_size)
        for gate in self.GATES:
            setattr(self, f"W_x{gate}", _param(input_size, hidden_size, scale=k))  # (D, H)
            setattr(self, f"W_h{gate}", _param(hidden_size, hidden_size, scale=k))  # (H, H)
        self.b_r, self.b_z = _param(hidden_size, scale=k), _param(hidden_size, scale=k)
        # the candidate keeps two biases: with reset="after" b_hh is scaled by r, so it
        # cannot be merged into b_xh the way the gate biases can
        self.b_xh, self.b_hh = _param(hidden_size, scale=k), _param(hidden_size, scale=k)

    def forward(self, x: Tensor, h: Tensor, return_gates: bool = False):
        r = torch.sigmoid(x @ self.W_xr + h @ self.W_hr + self.b_r)  # (B, H)
        z = torch.sigmoid(x @ self.W_xz + h @ self.W_hz + self.b_z)  # (B, H)
        if self.reset == "before":
            h_tilde = torch.tanh(x @ self.W_xh + self.b_xh + (r * h) @ self.W_hh + self.b_hh)
        else:
            h_tilde = torch.tanh(x @ self.W_xh + self.b_xh + r * (h @ self.W_hh + self.b_hh))
        keep = z if self.z_weights == "old" else 1 - z  # share of the old state kept
        h = keep * h + (1 - keep) * h_tilde  # (B, H)
        if return_gates:
            return h, {"r": r, "z": z, "h_tilde": h_tilde}
        return h

    @torch.no_grad()
    def load_from_torch(self, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> None:
        """Copy one direction of one layer of `nn.GRU` (weights (3H, D) and (3H, H)).

        Weights are copied as they are. This reproduces `nn.GRU` for reset="after" and
        z_weights="old"; with z_weights="new" negate W_xz, W_hz and b_z as well, since
        1 - sigma(a) = sigma(-a). The copy lives on the weights' device.
        """
        H = self.hidden_size
        self.to(w_ih.device)
        for k, gate in enumerate(self.GATES):
            rows = slice(k * H, (k + 1) * H)  # block k of the r, z, n stack
            getattr(self, f"W_x{gate}").copy_(w_ih[rows].T)
            getattr(self, f"W_h{gate}").copy_(w_hh[rows].T)
        self.b_r.copy_(b_ih[:H] + b_hh[:H])
        self.b_z.copy_(b_ih[H:2 * H] + b_hh[H:2 * H])
        self.b_xh.copy_(b_ih[2 * H:])
        self.b_hh.copy_(b_hh[2 * H:])


def scan(cell: nn.Module, x: Tensor, state, reverse: bool = False, return_gates: bool = False):
    """Run `cell` over the time axis of x (B, T, D) from `state`; the explicit loop over t.

    Returns (hs, state, gates): hs is the list of the T hidden states (B, H) in time order;
    they are the very tensors the next step reads, so autograd.grad(loss, hs) gives the true
    dL/dh_t. gates maps each gate name to (B, T, H) when return_gates is set, else {}.
    """
    T = x.shape[1]
    hs: list[Tensor | None] = [None] * T
    steps: list[dict] = []
    for t in (reversed(range(T)) if reverse else range(T)):
        out = cell(x[:, t], state, return_gates=return_gates)
        state, info = out if return_gates else (out, None)
        hs[t] = state[0] if isinstance(state, tuple) else state  # LSTM state is (h, c)
        if return_gates:
            steps.append(info)
    if reverse:
        steps.reverse()
    gates = {k: torch.stack([s[k] for s in steps], dim=1) for k in (steps[0] if steps else {})}
    return hs, state, gates  # gates: name -> (B, T, H)


class _StackedScratch(nn.Module):
    """num_layers x num_directions cells; layer l > 0 reads the concatenated outputs of l - 1.

    Between layers only h travels upwards (an LSTM's c stays in its own layer); the backward
    direction of a bidirectional layer reads the sequence from T - 1 down to 0.
    """

    kind = ""  # "lstm" or "gru", set by subclasses

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False, **cell_kwargs) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.num_directions = 2 if bidirectional else 1
        sizes = [input_size] + [hidden_size * self.num_directions] * (num_layers - 1)
        self.cells = nn.ModuleList(  # index = layer * num_directions + direction, as in torch
            self.make_cell(sizes[layer], hidden_size, **cell_kwargs)
            for layer in range(num_layers) for _ in range(self.num_directions))

    def make_cell(self, input_size: int, hidden_size: int, **kwargs) -> nn.Module:
        raise NotImplementedError

    def forward(self, x: Tensor, state=None, return_gates: bool = False):
        """x (B, T, D) -> out (B, T, num_directions * H), final state like nn.LSTM/nn.GRU.

        With return_gates, also a list (one per cell, torch's order) of dicts: each gate as
        (B, T, H) and "h_steps", the list of the T per-step hidden states (graph nodes).
        """
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"expected x of shape (B, T, {self.input_size}), got {tuple(x.shape)}")
        states = self.split_state(state, x)
        layer_in, finals, internals = x, [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                idx = layer * self.num_directions + d
                hs, final, gates = scan(self.cells[idx], layer_in, states[idx],
                                        reverse=d == 1, return_gates=return_gates)
                outs.append(torch.stack(hs, dim=1))  # (B, T, H)
                finals.append(final)
                internals.append({**gates, "h_steps": hs})
            layer_in = torch.cat(outs, dim=-1)  # (B, T, num_directions * H)
        out = (layer_in, self.join_states(finals))
        return (*out, internals) if return_gates else out

    def zeros(self, x: Tensor) -> Tensor:
        n = self.num_layers * self.num_directions
        return x.new_zeros(n, x.shape[0], self.hidden_size)  # (L * dirs, B, H)

    @torch.no_grad()
    def load_from_torch(self, module: nn.RNNBase) -> _StackedScratch:
        """Copy every weight of an `nn.LSTM` / `nn.GRU` with the same sizes; returns self."""
        same = (module.input_size, module.hidden_size, module.num_layers,
                2 if module.bidirectional else 1)
        mine = (self.input_size, self.hidden_size, self.num_layers, self.num_directions)
        if module.mode.lower() != self.kind or same != mine or not module.bias:
            raise ValueError(f"cannot load {module} (sizes {same}, bias={module.bias}) into "
                             f"a scratch {self.kind} with sizes {mine}")
        for idx, cell in enumerate(self.cells):
            layer, d = divmod(idx, self.num_directions)
            sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
            cell.load_from_torch(*(getattr(module, f"{name}{sfx}") for name in
                                   ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))
        return self


class LSTMScratch(_StackedScratch):
    """Stacked / bidirectional LSTM from `LSTMCell`s; state = (h, c), each (L * dirs, B, H)."""

    kind = "lstm"

    def make_cell(self, input_size: int, hidden_size: int, **kwargs) -> nn.Module:
        return LSTMCell(input_size, hidden_size)

    def split_state(self, state, x: Tensor) -> list[tuple[Tensor, Tensor]]:
        h0, c0 = state if state is not None else (self.zeros(x), self.zeros(x))
        return list(zip(h0, c0, strict=True))

    def join_states(self, finals: list) -> tuple[Tensor, Tensor]:
        return torch.stack([h for h, _ in finals]), torch.stack([c for _, c in finals])


class GRUScratch(_StackedScratch):
    """Stacked / bidirectional GRU from `GRUCell`s; state = h (L * dirs, B, H).

    Keyword arguments `reset` and `z_weights` pick the convention (see `GRUCell`).
    """

    kind = "gru"

    def make_cell(self, input_size: int, hidden_size: int, **kwargs) -> nn.Module:
        return GRUCell(input_size, hidden_size, **kwargs)

    def split_state(self, state, x: Tensor) -> list[Tensor]:
        return list(state if state is not None else self.zeros(x))

    def join_states(self, finals: list) -> Tensor:
        return torch.stack(finals)


def recurrent_param_count(cell: str, input_size: int, hidden_size: int, num_layers: int = 1,
                          bidirectional: bool = False, two_biases: bool = True) -> int:
    """Parameters of a PyTorch-style recurrent layer, from the formula.

    Each of the G weight blocks (G = 1 RNN, 3 GRU, 4 LSTM) of one cell has an input matrix
    (H x D_l), a recurrent matrix (H x H) and one or two bias vectors:
    G * (H * D_l + H * H + n_biases * H), where D_0 = D and D_l = dirs * H above the first layer.
    """
    if cell not in GATES_PER_CELL:
        raise ValueError(f"cell must be one of {sorted(GATES_PER_CELL)}, got {cell!r}")
    G, H, dirs = GATES_PER_CELL[cell], hidden_size, 2 if bidirectional else 1
    n_biases = 2 if two_biases else 1
    total = 0
    for layer in range(num_layers):
        D_l = input_size if layer == 0 else dirs * H
        total += dirs * G * (H * D_l + H * H + n_biases * H)
    return total


OPEN_GATE_BIAS = 2.0  # the course's standard keep-gate bias: the gate starts near sigma(2) = 0.88


def init_keep_gate_(rnn: nn.Module, forget_bias: float | str | None = "open") -> nn.Module:
    """The course's initialization of a torch recurrent layer's "keep" gate, in place.

    "open" (the default everywhere from notebook 04 on): gated layers (LSTM, GRU) get
    `OPEN_GATE_BIAS` through `open_gates_`; a plain `nn.RNN` has no gate and is left alone.
    A number: that bias (gated layers only). None: torch's own init (gates near 0.5), kept as
    the cautionary baseline of notebook 04 (and exercise 3 of notebook 05).
    """
    gated = isinstance(rnn, (nn.LSTM, nn.GRU))
    if forget_bias == "open":
        return open_gates_(rnn, OPEN_GATE_BIAS) if gated else rnn
    if forget_bias is None:
        return rnn
    if isinstance(forget_bias, str) or not gated:
        raise ValueError(f"forget_bias must be 'open', None or a number for an LSTM/GRU layer, "
                         f"got {forget_bias!r} for {type(rnn).__name__}")
    return open_gates_(rnn, float(forget_bias))


@torch.no_grad()
def open_gates_(rnn: nn.LSTM | nn.GRU, bias: float = OPEN_GATE_BIAS) -> nn.LSTM | nn.GRU:
    """Set the "keep" gate's bias of every layer and direction so the cell starts by remembering.

    LSTM: the forget gate, f = sigma(... + b_f), rows H..2H of torch's i, f, g, o blocks.
    GRU: the update gate, z = sigma(... + b_z), rows H..2H of torch's r, z, n blocks; in torch's
    convention h' = (1 - z) * n + z * h, so z near 1 keeps the old state.
    With bias 1 the gate starts near sigma(1) = 0.73, with 3 near 0.95 (default init: about 0.5,
    so a signal fades by half every step). torch adds its two biases, so `bias_ih` gets `bias`
    and `bias_hh` gets 0 in those rows. Returns `rnn`, changed in place.
    """
    if not isinstance(rnn, (nn.LSTM, nn.GRU)) or not rnn.bias:
        raise TypeError(f"open_gates_ needs an nn.LSTM or nn.GRU with biases, got {rnn!r}")
    H = rnn.hidden_size
    for name, p in rnn.named_parameters():
        if name.startswith("bias_ih"):
            p[H:2 * H] = bias  # the keep gate's block: f (LSTM) or z (GRU)
        elif name.startswith("bias_hh"):
            p[H:2 * H] = 0.0
    return rnn
