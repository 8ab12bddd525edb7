"""Transformer building blocks: positional encodings, layer norm, feed-forward, encoder blocks.

One file per idea, nanoGPT-style: each part is short, batch-first, and named after the math of
notebook 08. Notebooks 09-12 add their parts next to these (the decoder block with causal
self-attention and cross-attention, GPT, ViT, ReZero) and reuse the ones here.

    x (B, T, E) --+--> [LayerNorm] -> MultiHeadAttention -> dropout --(+)--> ...   one block
                  +----------------------------------------------------^
Post-LN (the paper, Vaswani et al. 2017; `norm_first=False`):
    x = LN(x + MHA(x)),         x = LN(x + FFN(x))
Pre-LN (GPT-2, ViT and most models since; Xiong et al. 2020; `norm_first=True`):
    x = x + MHA(LN(x)),         x = x + FFN(LN(x))      and one final LN after the stack
Multi-head attention itself lives in `utils.attention.MultiHeadAttention`. Every block has a
`load_from_torch` that copies PyTorch's own module, so the equivalence tests are one line.

Shapes: B batch, T tokens, E = d_model, nh heads, F = d_ff (the feed-forward width).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from utils.attention import MultiHeadAttention

Tensor = torch.Tensor


# ---------------------------------------------------------------------------- positions
def sinusoidal_encoding(T: int, d_model: int, base: float = 10_000.0, device=None) -> Tensor:
    """PE (T, E): PE[pos, 2i] = sin(pos / base^(2i/E)), PE[pos, 2i+1] = cos(pos / base^(2i/E)).

    Pair i is a clock hand turning at angular speed w_i = base^(-2i/E): the first pairs turn
    fast (like the low bits of a binary counter), the last ones slowly (the high bits).
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal encodings pair sin and cos: d_model must be even, got {d_model}")
    pos = torch.arange(T, dtype=torch.float32, device=device)[:, None]  # (T, 1)
    w = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32, device=device) / d_model)  # (E/2,)
    pe = torch.zeros(T, d_model, device=device)  # (T, E)
    pe[:, 0::2] = torch.sin(pos * w)  # (T, E/2) even features
    pe[:, 1::2] = torch.cos(pos * w)  # (T, E/2) odd features
    return pe


def shift_matrix(k: int, d_model: int, base: float = 10_000.0) -> Tensor:
    """M_k (E, E) with PE[pos + k] = PE[pos] @ M_k for every pos: a rotation by k w_i per pair.

    [sin(w(p+k)), cos(w(p+k))] = [sin(wp), cos(wp)] @ [[cos wk, -sin wk], [sin wk, cos wk]],
    so M_k is block-diagonal and depends on the offset k only, not on the position.
    """
    w = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (E/2,)
    c, s = torch.cos(k * w), torch.sin(k * w)  # (E/2,) each
    M = torch.zeros(d_model, d_model, dtype=torch.float64)  # (E, E)
    i = torch.arange(0, d_model, 2)  # (E/2,) first index of each pair
    M[i, i], M[i, i + 1], M[i + 1, i], M[i + 1, i + 1] = c, -s, s, c
    return M.float()


class SinusoidalPositions(nn.Module):
    """x + PE[start : start + T]: fixed encodings, no parameters, any length up to `max_len`."""

    def __init__(self, d_model: int, max_len: int = 4096, base: float = 10_000.0) -> None:
        super().__init__()
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x (B, T, E) -> (B, T, E); `start` offsets the positions (decoding with a cache)."""
        T = x.shape[1]
        if start + T > self.pe.shape[0]:
            raise ValueError(f"positions up to {start + T} but max_len is {self.pe.shape[0]}")
        return x + self.pe[start:start + T]  # (B, T, E), PE broadcast over the batch


class LearnedPositions(nn.Module):
    """x + P[start : start + T] with P (max_len, E) a trained table (BERT, GPT-2, ViT)."""

    def __init__(self, d_model: int, max_len: int = 512) -> None:
        super().__init__()
        self.P = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.P.weight, std=0.02)  # small, like GPT-2: positions start as a nudge

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        T = x.shape[1]
        if start + T > self.P.num_embeddings:
            raise ValueError(f"positions up to {start + T} but max_len is {self.P.num_embeddings}")
        pos = torch.arange(start, start + T, device=x.device)  # (T,) on the input's device
        return x + self.P(pos)  # (B, T, E)


POSITIONS = ("sinusoidal", "learned", "none")


def make_positions(kind: str, d_model: int, max_len: int) -> nn.Module:
    """One of `POSITIONS` as a module that adds positions to x (B, T, E); "none" adds nothing."""
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model, max_len)
    if kind == "learned":
        return LearnedPositions(d_model, max_len)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"positions must be one of {POSITIONS}, got {kind!r}")


# ---------------------------------------------------------------------------- layer norm, FFN
class LayerNorm(nn.Module):
    """Normalize each position's features: y = gamma * (x - mu) / sqrt(var + eps) + beta.

    mu and var are the mean and the *biased* variance over the last axis (E) of one position;
    unlike batch norm nothing is shared across the batch or the sequence.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))  # (E,) starts as the identity
        self.beta = nn.Parameter(torch.zeros(d_model))  # (E,)

    def forward(self, x: Tensor) -> Tensor:
        mu = x.mean(-1, keepdim=True)  # (..., 1)
        var = x.var(-1, unbiased=False, keepdim=True)  # (..., 1), divides by E as torch does
        return self.gamma * (x - mu) / torch.sqrt(var + self.eps) + self.beta  # (..., E)

    @torch.no_grad()
    def load_from_torch(self, ln: nn.LayerNorm) -> LayerNorm:
        self.gamma.copy_(ln.weight)
        self.beta.copy_(ln.bias)
        self.eps = ln.eps
        return self


ACTIVATIONS = {  # FFN nonlinearities: the paper's ReLU, BERT's exact GELU, GPT-2's tanh GELU
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """Position-wise FFN(x) = act(x W_1 + b_1) W_2 + b_2, the same MLP at every position.

    Attention moves information between positions ("communication"); this MLP then works on
    each position alone ("computation"). E -> F -> E, with F = 4E in the paper.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        self.act = ACTIVATIONS[activation]
        self.W_1 = nn.Linear(d_model, d_ff)
        self.W_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.W_2(self.dropout(self.act(self.W_1(x))))  # (B, T, F) -> (B, T, E)


# ---------------------------------------------------------------------------- encoder
@dataclass(frozen=True)
class EncoderConfig:
    """Sizes and switches of a Transformer encoder; defaults are the paper's base model."""

    d_model: int = 512  # E, the width of every position's vector
    n_heads: int = 8  # nh; each head works in hs = E / nh dimensions
    d_ff: int = 2048  # F, the hidden width of the feed-forward network
    n_layers: int = 6  # encoder blocks in the stack
    dropout: float = 0.1  # on the FFN hidden layer and each sublayer output
    attn_dropout: float | None = None  # on the attention weights; None: the same as `dropout`
    norm_first: bool = False  # False: post-LN (paper); True: pre-LN (GPT-2, ViT, today)
    activation: str = "relu"  # FFN nonlinearity: "relu" (paper), "gelu" (BERT), "gelu_tanh" (GPT-2)
    eps: float = 1e-5  # layer norm epsilon (PyTorch's default)
    sdpa: bool = False  # attention through F.scaled_dot_product_attention when no weights are asked

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")


class EncoderBlock(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual and a layer norm.

    forward: x (B, T, E), key_mask (B, T) bool (True on real tokens) or None
    -> (x (B, T, E), attention weights (B, nh, T, T) if need_weights else None).
    `causal=True` lets position t attend to positions <= t only: the same block is then a
    GPT block (decoder-only models have no cross-attention).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        p_attn = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, p_attn, sdpa=cfg.sdpa)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation)
        self.norm1, self.norm2 = LayerNorm(cfg.d_model, cfg.eps), LayerNorm(cfg.d_model, cfg.eps)
        self.drop1, self.drop2 = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)

    def _sa(self, x: Tensor, key_mask: Tensor | None, need_weights: bool, causal: bool):
        out, w = self.attn(x, key_mask=key_mask, causal=causal, need_weights=need_weights)  # (B, T, E)
        return self.drop1(out), w

    def forward(self, x: Tensor, key_mask: Tensor | None = None, need_weights: bool = False,
                causal: bool = False) -> tuple[Tensor, Tensor | None]:
        if self.norm_first:  # pre-LN: the residual path x -> x + ... is never normalized
            a, w = self._sa(self.norm1(x), key_mask, need_weights, causal)
            x = x + a  # (B, T, E)
            x = x + self.drop2(self.ffn(self.norm2(x)))  # (B, T, E)
        else:  # post-LN: normalize after each residual sum, as in the paper
            a, w = self._sa(x, key_mask, need_weights, causal)
            x = self.norm1(x + a)  # (B, T, E)
            x = self.norm2(x + self.drop2(self.ffn(x)))  # (B, T, E)
        return x, w

    @torch.no_grad()
    def load_from_torch(self, layer: nn.TransformerEncoderLayer) -> EncoderBlock:
        """Copy the weights of `nn.TransformerEncoderLayer` (same sizes and norm_first)."""
        if layer.norm_first != self.norm_first:
            raise ValueError(f"norm_first differs: torch layer {layer.norm_first}, ours {self.norm_first}")
        self.attn.load_from_torch(layer.self_attn)
        for ours, theirs in ((self.ffn.W_1, layer.linear1), (self.ffn.W_2, layer.linear2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        self.norm1.load_from_torch(layer.norm1)
        self.norm2.load_from_torch(layer.norm2)
        return self


class Encoder(nn.Module):
    """A stack of `n_layers` encoder blocks over already embedded inputs (tokens or patches).

    Pre-LN stacks end with one more layer norm (the residual stream is never normalized inside
    them). forward: x (B, T, E), key_mask (B, T) or None -> (x (B, T, E), list of per-block
    weights (B, nh, T, T), empty unless need_weights).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = LayerNorm(cfg.d_model, cfg.eps) if cfg.norm_first else nn.Identity()

    def forward(self, x: Tensor, key_mask: Tensor | None = None, need_weights: bool = False,
                causal: bool = False) -> tuple[Tensor, list[Tensor]]:
        maps = []
        for block in self.blocks:
            x, w = block(x, key_mask, need_weights, causal)  # (B, T, E)
            if need_weights:
                maps.append(w)
        return self.norm(x), maps  # (B, T, E)


def block_param_count(d_model: int, n_heads: int, d_ff: int, head_size: int | None = None,
                      qkvo_bias: bool = True) -> int:
    """Parameters of one encoder block: 4 E hs nh attention weights (+ 4E biases), FFN, 2 norms.

    With `qkvo_bias=False` this is the textbook's count (eq. 7.32), which leaves out the biases
    of the query, key, value and output projections; PyTorch's layer has them.
    """
    hs = head_size or d_model // n_heads
    attn = 4 * d_model * hs * n_heads + (4 * d_model if qkvo_bias else 0)
    ffn = 2 * d_model * d_ff + d_ff + d_model
    return attn + ffn + 4 * d_model  # + gamma, beta of two layer norms

