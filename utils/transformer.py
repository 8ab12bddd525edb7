"""Transformer building blocks: positional encodings, layer norm, feed-forward, encoder blocks.

One file per idea, nanoGPT-style: each part is short, batch-first, and named after the math of
notebook 08. Notebooks 10-14 add their parts next to these (the decoder block with causal
self-attention and cross-attention, GPT, ViT, ReZero) and reuse the ones here.

    x (B, T, E) --+--> [LayerNorm] -> MultiHeadAttention -> dropout --(+)--> ...   one block
                  +----------------------------------------------------^
Post-LN (the paper, Vaswani et al. 2017; `norm_first=False`):
    x = LN(x + MHA(x)),         x = LN(x + FFN(x))
Pre-LN (GPT-2, ViT and most models since; Xiong et al. 2020; `norm_first=True`):
    x = x + MHA(LN(x)),         x = x + FFN(LN(x))      and one final LN after the stack
ReZero (Bachlechner et al. 2020; `block="rezero"`, notebook 14): no layer norm at all,
    x = x + a_1 MHA(x),         x = x + a_2 FFN(x)      with trained scalars a_1 = a_2 = 0 at start
Multi-head attention itself lives in `utils.attention.MultiHeadAttention`. Every block has a
`load_from_torch` that copies PyTorch's own module, so the equivalence tests are one line; it
refuses a module configured otherwise (heads, activation, norm placement, epsilon, biases).

Shapes: B batch, T tokens, E = d_model, nh heads, F = d_ff (the feed-forward width).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from utils.attention import MultiHeadAttention
from utils.loading import check_same

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
        """Copy gamma and beta of `nn.LayerNorm`; refuse another width, epsilon or no gamma/beta."""
        ours = {"normalized_shape": tuple(self.gamma.shape), "eps": self.eps,
                "elementwise_affine": True, "bias": True}
        check_same("nn.LayerNorm", ours, {
            "normalized_shape": tuple(ln.normalized_shape), "eps": ln.eps,
            "elementwise_affine": ln.weight is not None, "bias": ln.bias is not None})
        self.gamma.copy_(ln.weight)
        self.beta.copy_(ln.bias)
        return self


class FusedLayerNorm(LayerNorm):
    """The course's `LayerNorm` (same gamma, beta, eps) computed by PyTorch's fused kernel.

    Our from-scratch norm takes five passes over the tensor (mean, var, subtract, divide,
    scale); `F.layer_norm` takes one, which makes a small GPT's training step ~15% faster on a CPU.
    """

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.gamma, self.beta, self.eps)  # (..., E)


def fuse_layer_norms_(module: nn.Module) -> nn.Module:
    """Turn every `LayerNorm` inside `module` into a `FusedLayerNorm`, keeping its parameters."""
    for child in module.modules():
        if type(child) is LayerNorm:
            child.__class__ = FusedLayerNorm  # same parameters and buffers, only forward differs
    return module


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: x Phi(x) with the Gaussian CDF Phi approximated through tanh."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {  # FFN nonlinearities: the paper's ReLU, BERT's exact GELU, GPT-2's tanh GELU
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": gelu_tanh,
}


HF_ACTIVATIONS = {  # Hugging Face's names (GPT-2's activation_function, ViT's hidden_act) -> ours
    "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
}


def activation_name(act) -> str:
    """The `ACTIVATIONS` name of a function or module (as PyTorch's layers hold), else its repr."""
    if isinstance(act, nn.ReLU):
        return "relu"
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    return next((name for name, fn in ACTIVATIONS.items() if act is fn), repr(act))


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
    block: str = "standard"  # "standard": with layer norms placed by norm_first; "rezero": none

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {self.block!r}")


BLOCKS = ("standard", "rezero")


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
        """Copy the weights of `nn.TransformerEncoderLayer`; refuse one configured otherwise
        (sizes, heads, norm_first, activation, epsilon, biases)."""
        check_same("nn.TransformerEncoderLayer", block_fields(self, self.attn),
                   torch_layer_fields(layer))
        self.attn.load_from_torch(layer.self_attn)
        for ours, theirs in ((self.ffn.W_1, layer.linear1), (self.ffn.W_2, layer.linear2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        self.norm1.load_from_torch(layer.norm1)
        self.norm2.load_from_torch(layer.norm2)
        return self


def block_fields(block: nn.Module, attn: MultiHeadAttention) -> dict:
    """What a block's `load_from_torch` compares: the fields that change its function."""
    return {"d_model": attn.d_model, "n_heads": attn.n_heads, "d_ff": block.ffn.W_1.out_features,
            "norm_first": block.norm_first, "activation": activation_name(block.ffn.act),
            "eps": block.norm1.eps, "bias": True}


def torch_layer_fields(layer: nn.Module) -> dict:
    """The same fields of `nn.TransformerEncoderLayer` or `nn.TransformerDecoderLayer`."""
    return {"d_model": layer.self_attn.embed_dim, "n_heads": layer.self_attn.num_heads,
            "d_ff": layer.linear1.out_features, "norm_first": layer.norm_first,
            "activation": activation_name(layer.activation), "eps": layer.norm1.eps,
            "bias": layer.linear1.bias is not None}


class ReZeroBlock(nn.Module):
    """ReZero (Bachlechner et al. 2020): x = x + a_1 MHA(x), then x = x + a_2 FFN(x), no layer norm.

    a_1, a_2 are trained scalars that start at 0, so every block starts as the identity and the
    stack as the embedding; each sublayer's contribution then grows as far as training asks.
    Same interface as `EncoderBlock`: x (B, T, E) -> (x (B, T, E), weights or None).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        p_attn = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, p_attn, sdpa=cfg.sdpa)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation)
        self.drop1, self.drop2 = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        self.alpha = nn.Parameter(torch.zeros(2))  # (2,) a_1, a_2: one residual weight per sublayer

    def forward(self, x: Tensor, key_mask: Tensor | None = None, need_weights: bool = False,
                causal: bool = False) -> tuple[Tensor, Tensor | None]:
        a, w = self.attn(x, key_mask=key_mask, causal=causal, need_weights=need_weights)  # (B, T, E)
        x = x + self.alpha[0] * self.drop1(a)  # (B, T, E)
        x = x + self.alpha[1] * self.drop2(self.ffn(x))  # (B, T, E)
        return x, w


def make_block(cfg: EncoderConfig) -> nn.Module:
    """One block of the kind `cfg.block` names: `EncoderBlock` (post- or pre-LN) or `ReZeroBlock`."""
    return ReZeroBlock(cfg) if cfg.block == "rezero" else EncoderBlock(cfg)


class Encoder(nn.Module):
    """A stack of `n_layers` encoder blocks over already embedded inputs (tokens or patches).

    Pre-LN stacks end with one more layer norm (the residual stream is never normalized inside
    them); ReZero stacks have none. forward: x (B, T, E), key_mask (B, T) or None ->
    (x (B, T, E), list of per-block weights (B, nh, T, T), empty unless need_weights).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layers))
        final_norm = cfg.norm_first and cfg.block == "standard"
        self.norm = LayerNorm(cfg.d_model, cfg.eps) if final_norm else nn.Identity()

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



# ---------------------------------------------------------------------------- decoder (notebook 10)
@dataclass(frozen=True)
class DecoderConfig(EncoderConfig):
    """Sizes of a decoder stack: the same fields as `EncoderConfig` (n_layers = decoder blocks)."""


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward.

    Post-LN (the paper):  x = LN1(x + SelfAttn(x, causal))
                          x = LN2(x + CrossAttn(queries x, keys and values = memory))
                          x = LN3(x + FFN(x))
    Pre-LN:               x = x + SelfAttn(LN1(x)); x = x + CrossAttn(LN2(x), memory); x = x + FFN(LN3(x))
    forward: x (B, T, E) target positions, memory (B, S, E) encoder output, memory_mask (B, S)
    bool (True on real source tokens), tgt_mask (B, T) or None -> (x (B, T, E), (self weights
    (B, nh, T, T), cross weights (B, nh, T, S)) or (None, None)). `cache` = {"self": {}, "cross":
    {}} turns on incremental decoding: x then holds only the new target position(s).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        p_attn = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, p_attn, sdpa=cfg.sdpa)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, p_attn, sdpa=cfg.sdpa)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation)
        self.norm1, self.norm2, self.norm3 = (LayerNorm(cfg.d_model, cfg.eps) for _ in range(3))
        self.drop1, self.drop2, self.drop3 = (nn.Dropout(cfg.dropout) for _ in range(3))

    def _sa(self, x, tgt_mask, need_weights, cache):
        out, w = self.self_attn(x, key_mask=tgt_mask, causal=True, need_weights=need_weights,
                                cache=None if cache is None else cache["self"])  # (B, T, E)
        return self.drop1(out), w

    def _ca(self, x, memory, memory_mask, need_weights, cache):
        out, w = self.cross_attn(x, memory, key_mask=memory_mask, need_weights=need_weights,
                                 cache=None if cache is None else cache["cross"], static_kv=True)
        return self.drop2(out), w  # (B, T, E), (B, nh, T, S)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None, need_weights: bool = False,
                cache: dict | None = None) -> tuple[Tensor, tuple]:
        if self.norm_first:
            a, w_self = self._sa(self.norm1(x), tgt_mask, need_weights, cache)
            x = x + a  # (B, T, E)
            c, w_cross = self._ca(self.norm2(x), memory, memory_mask, need_weights, cache)
            x = x + c
            x = x + self.drop3(self.ffn(self.norm3(x)))
        else:
            a, w_self = self._sa(x, tgt_mask, need_weights, cache)
            x = self.norm1(x + a)  # (B, T, E)
            c, w_cross = self._ca(x, memory, memory_mask, need_weights, cache)
            x = self.norm2(x + c)
            x = self.norm3(x + self.drop3(self.ffn(x)))
        return x, (w_self, w_cross)

    @torch.no_grad()
    def load_from_torch(self, layer: nn.TransformerDecoderLayer) -> DecoderBlock:
        """Copy `nn.TransformerDecoderLayer`, refusing one configured otherwise (as
        `EncoderBlock.load_from_torch`); its cross-attention is called `multihead_attn`."""
        check_same("nn.TransformerDecoderLayer", block_fields(self, self.self_attn),
                   torch_layer_fields(layer))
        self.self_attn.load_from_torch(layer.self_attn)
        self.cross_attn.load_from_torch(layer.multihead_attn)
        for ours, theirs in ((self.ffn.W_1, layer.linear1), (self.ffn.W_2, layer.linear2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        for ours, theirs in ((self.norm1, layer.norm1), (self.norm2, layer.norm2),
                             (self.norm3, layer.norm3)):
            ours.load_from_torch(theirs)
        return self


class Decoder(nn.Module):
    """A stack of decoder blocks (plus a final layer norm for pre-LN), like `Encoder`.

    forward: x (B, T, E) embedded targets, memory (B, S, E) -> (x (B, T, E), {"self": [...],
    "cross": [...]} per-block weights, empty lists unless need_weights). `caches`: one
    {"self": {}, "cross": {}} dict per block for incremental decoding, updated in place.
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = LayerNorm(cfg.d_model, cfg.eps) if cfg.norm_first else nn.Identity()

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None, need_weights: bool = False,
                caches: list | None = None) -> tuple[Tensor, dict]:
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"need one cache per block ({len(self.blocks)}), got {len(caches)}")
        maps = {"self": [], "cross": []}
        for i, block in enumerate(self.blocks):
            x, (w_self, w_cross) = block(x, memory, memory_mask, tgt_mask, need_weights,
                                         None if caches is None else caches[i])  # (B, T, E)
            if need_weights:
                maps["self"].append(w_self)
                maps["cross"].append(w_cross)
        return self.norm(x), maps  # (B, T, E)


# ---------------------------------------------------------------------------- encoder-decoder
@dataclass(frozen=True)
class TransformerConfig:
    """The encoder-decoder Transformer for translation; defaults are the paper's base model."""

    src_vocab: int = 37_000  # source vocabulary (the paper: 37k shared BPE for en-de)
    tgt_vocab: int = 37_000  # target vocabulary
    d_model: int = 512  # E
    n_heads: int = 8  # nh
    d_ff: int = 2048  # F
    n_enc_layers: int = 6  # N encoder blocks
    n_dec_layers: int = 6  # N decoder blocks
    dropout: float = 0.1  # on embeddings + positions, FFN hidden layer, every sublayer output
    attn_dropout: float | None = None  # on attention weights; None: the same as `dropout`
    norm_first: bool = False  # False: post-LN (the paper); True: pre-LN
    activation: str = "relu"
    eps: float = 1e-5
    share_embeddings: bool = True  # one table for source and target tokens (needs one vocabulary)
    tie_output: bool = True  # the output layer reuses the target embedding table
    max_len: int = 256  # longest sequence the sinusoidal table covers
    sdpa: bool = True  # fused attention whenever no weights are asked

    def __post_init__(self) -> None:
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"share_embeddings needs one vocabulary, got src_vocab={self.src_vocab} "
                             f"and tgt_vocab={self.tgt_vocab}: train a shared tokenizer "
                             "(load_translation_data(shared=True)) or set share_embeddings=False")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    def block_config(self, n_layers: int) -> EncoderConfig:
        return DecoderConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff,
                             n_layers=n_layers, dropout=self.dropout,
                             attn_dropout=self.attn_dropout, norm_first=self.norm_first,
                             activation=self.activation, eps=self.eps, sdpa=self.sdpa)


class ScaledEmbedding(nn.Module):
    """Token embedding times sqrt(E) (the paper's scaling), plus positions, then dropout.

    ids (B, T) at positions start, start + 1, ... -> (B, T, E). The table may be shared with
    another `ScaledEmbedding` and with the output layer (see `_TranslatorInterface.build`).
    """

    def __init__(self, table: nn.Embedding, positions: nn.Module, dropout: float) -> None:
        super().__init__()
        self.table, self.positions, self.drop = table, positions, nn.Dropout(dropout)
        self.scale = table.embedding_dim ** 0.5

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        return self.drop(self.positions(self.table(ids) * self.scale, start))  # (B, T, E)


def zero_attention_biases(model: nn.Module) -> None:
    """Set the Q, K, V and output projection biases of every `MultiHeadAttention` to 0, the
    start `nn.MultiheadAttention` gives its own (nn.Linear would draw them at random)."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention) and m.W_q.bias is not None:
            for linear in (m.W_q, m.W_k, m.W_v, m.W_o):
                nn.init.zeros_(linear.bias)


class _TranslatorInterface(nn.Module):
    """What `utils.seq2seq` (training, `translate`, BLEU) and `utils.decoding` need from a
    translation model: forward (teacher forcing), start (encode) and step (one more token)."""

    def build(self, cfg: TransformerConfig, make_stacks) -> None:
        """Embeddings (shared if asked), positions, the stacks `make_stacks(cfg)` adds, the
        output layer; Xavier for the matrices as `nn.Transformer` does (per Q/K/V slice of a fused
        projection), zero attention-projection biases as `nn.MultiheadAttention` has them,
        N(0, 1/E) for the token tables, then the optional tie."""
        self.cfg, E = cfg, cfg.d_model
        src_table = nn.Embedding(cfg.src_vocab, E)
        tgt_table = src_table if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab, E)
        positions = SinusoidalPositions(E, cfg.max_len)
        self.src_embed = ScaledEmbedding(src_table, positions, cfg.dropout)
        self.tgt_embed = ScaledEmbedding(tgt_table, positions, cfg.dropout)
        make_stacks(cfg)
        self.out = nn.Linear(E, cfg.tgt_vocab, bias=False)  # (E -> V)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                # nn.MultiheadAttention fuses W_q, W_k, W_v into one (3E, E) `in_proj_weight`:
                # Xavier on the fused matrix would start each 1/sqrt(2) as large as our separate
                # (E, E) matrices. Per slice, both model classes start from the same rule.
                for part in p.chunk(3) if name.endswith("in_proj_weight") else (p,):
                    nn.init.xavier_uniform_(part)
        zero_attention_biases(self)  # nn.MultiheadAttention starts its projection biases at 0: so do we
        # Token tables as tensor2tensor's shared embedding/softmax matrix: N(0, 1/E), so a token
        # vector times sqrt(E) has entries of size 1, like the sinusoidal positions (rms 0.71).
        # Xavier on a (V, E) table gives std sqrt(2 / (V + E)): for V = 8000 and E = 128 (notebook 10),
        # 0.016, 5.6x smaller than 1 / sqrt(E) (rms 0.18 after sqrt(E)), so at the start the positions
        # would outweigh the tokens about four to one.
        for table in [src_table] if tgt_table is src_table else [src_table, tgt_table]:
            nn.init.normal_(table.weight, std=E ** -0.5)
        if cfg.tie_output:
            self.out.weight = tgt_table.weight  # one (V, E) matrix embeds and un-embeds

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor,
                teacher_forcing: float = 1.0) -> Tensor:
        """Teacher-forced logits (B, T, V) for all target positions at once (one parallel pass)."""
        if teacher_forcing != 1.0:
            raise ValueError("a Transformer decoder reads the whole shifted target in one pass: "
                             "train it with teacher_forcing=1.0")
        memory = self.encode(src, src_mask)[0]  # (B, S, E)
        return self.decode(tgt_in, memory, src_mask)[0]  # (B, T, V)

    def start(self, src: Tensor, src_mask: Tensor, cache: bool = True) -> dict:
        """Encode once: the decoding state {"memory", "src_mask"[, "caches"]}, batch first."""
        if src.shape != src_mask.shape or src_mask.dtype != torch.bool:
            raise ValueError(f"expected src (B, S) and a bool src_mask of the same shape, got "
                             f"{tuple(src.shape)} and {tuple(src_mask.shape)} {src_mask.dtype}")
        state = {"memory": self.encode(src, src_mask)[0], "src_mask": src_mask}
        if cache:
            state["caches"] = [{"self": {}, "cross": {}} for _ in range(self.cfg.n_dec_layers)]
        return state

    def step(self, prefix: Tensor, state: dict) -> tuple[Tensor, dict]:
        """`utils.decoding`'s interface: prefix (B, t) -> log-probs (B, V) of token t + 1.

        Without a cache the decoder reruns the whole prefix (O(t^2) attention per step); with
        one it runs the new token(s) only, against the cached keys and values.
        """
        caches = state.get("caches")
        if caches is None:
            logits = self.decode(prefix, state["memory"], state["src_mask"])[0]  # (B, t, V)
            return torch.log_softmax(logits[:, -1].float(), dim=-1), state
        past = caches[0]["self"]["k"].shape[2] if "k" in caches[0]["self"] else 0
        new = [{"self": dict(c["self"]), "cross": dict(c["cross"])} for c in caches]  # no aliasing
        logits = self.decode(prefix[:, past:], state["memory"], state["src_mask"], start=past,
                             caches=new)[0]  # (B, t - past, V)
        return torch.log_softmax(logits[:, -1].float(), dim=-1), {**state, "caches": new}


class Transformer(_TranslatorInterface):
    """The encoder-decoder Transformer (Vaswani et al. 2017) for translation, from our blocks.

    encode: src (B, S) -> memory (B, S, E); decode: tgt_in (B, T) = <sos> y_1 .. y_{T-1},
    memory -> logits (B, T, V) for y_1 .. y_T. Training feeds the whole shifted target at
    once (teacher forcing, one pass); inference calls `step` one token at a time.
    With `share_embeddings` source, target and (with `tie_output`) output layer use one table.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.build(cfg, self.make_stacks)

    def make_stacks(self, cfg: TransformerConfig) -> None:
        self.encoder = Encoder(cfg.block_config(cfg.n_enc_layers))
        self.decoder = Decoder(cfg.block_config(cfg.n_dec_layers))

    def encode(self, src: Tensor, src_mask: Tensor, need_weights: bool = False):
        """src (B, S), src_mask (B, S) -> (memory (B, S, E), per-block self-attention maps)."""
        return self.encoder(self.src_embed(src), src_mask, need_weights)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, start: int = 0,
               caches: list | None = None, need_weights: bool = False):
        """tgt_in (B, T) at positions start.. -> (logits (B, T, V), {"self", "cross"} maps)."""
        x, maps = self.decoder(self.tgt_embed(tgt_in, start), memory, src_mask,
                               need_weights=need_weights, caches=caches)  # (B, T, E)
        return self.out(x), maps  # (B, T, V)

    def load_from_torch(self, ref: TorchTransformer) -> Transformer:
        """Copy every weight of a pre-LN `TorchTransformer` with the same config: the two then
        compute the same function and can be trained side by side from one start (notebook 10)."""
        if not self.cfg.norm_first or ref.cfg != self.cfg:
            raise ValueError("load_from_torch needs a TorchTransformer with this model's config and "
                             "norm_first=True (post-LN nn.Transformer ends each stack with a layer "
                             "norm that our post-LN stacks do not have)")
        with torch.no_grad():  # a tied or shared table is copied onto itself: harmless
            for mine, theirs in ((self.src_embed.table, ref.src_embed.table),
                                 (self.tgt_embed.table, ref.tgt_embed.table), (self.out, ref.out)):
                mine.weight.copy_(theirs.weight)
        for ours, theirs in ((self.encoder, ref.core.encoder), (self.decoder, ref.core.decoder)):
            for block, layer in zip(ours.blocks, theirs.layers, strict=True):
                block.load_from_torch(layer)
            ours.norm.load_from_torch(theirs.norm)
        return self


class TorchTransformer(_TranslatorInterface):
    """The same model around PyTorch's `nn.Transformer`: the reference of notebook 10.

    Same embeddings, positions and output layer as `Transformer`; the encoder and decoder
    stacks are `nn.Transformer`'s (which always ends each stack with a layer norm). It has no
    key/value cache: `step` reruns the whole prefix.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.build(cfg, self.make_stacks)

    def make_stacks(self, cfg: TransformerConfig) -> None:
        with warnings.catch_warnings():  # pre-LN stacks cannot use nested tensors: expected
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.core = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_enc_layers, cfg.n_dec_layers,
                                       cfg.d_ff, cfg.dropout,
                                       activation=ACTIVATIONS[cfg.activation],  # gelu_tanh too
                                       layer_norm_eps=cfg.eps, batch_first=True, norm_first=cfg.norm_first)

    def encode(self, src: Tensor, src_mask: Tensor, need_weights: bool = False):
        # PyTorch's inference fast path does not follow CPU autocast: switch it off meanwhile
        fast = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(fast and not torch.is_autocast_enabled(src.device.type))
        try:
            return self.core.encoder(self.src_embed(src), src_key_padding_mask=~src_mask), []
        finally:
            torch.backends.mha.set_fastpath_enabled(fast)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, start: int = 0,
               caches: list | None = None, need_weights: bool = False):
        if start != 0 or caches is not None:
            raise ValueError("TorchTransformer has no key/value cache: start(..., cache=False)")
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)  # True: hidden
        x = self.core.decoder(self.tgt_embed(tgt_in), memory, tgt_mask=causal, tgt_is_causal=True,
                              memory_key_padding_mask=~src_mask)  # (B, T, E)
        return self.out(x), {}

    def start(self, src: Tensor, src_mask: Tensor, cache: bool = False) -> dict:
        return super().start(src, src_mask, cache=False)


def transformer_param_count(cfg: TransformerConfig) -> int:
    """Parameters of `Transformer(cfg)`, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())  # a tied table is counted once
