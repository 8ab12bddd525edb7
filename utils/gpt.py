"""A decoder-only language model (GPT), built from the course's encoder blocks (notebook 11).

A GPT is a stack of Transformer blocks whose self-attention is causal: position t sees the
tokens 1..t only, so the output at t can be trained to predict token t+1 (no cross-attention,
no encoder). With token ids x_1..x_T, token table W_e (V, E) and position table P (T_max, E):

    h_0 = W_e[x] + P[1..T]                            (B, T, E)
    h_l = Block_l(h_{l-1}, causal=True),  l = 1..L    pre-LN blocks (GPT-2) or post-LN (GPT-1)
    logits = LN(h_L) W_e^T                            (B, T, V) with weight tying, else a new W
    loss = mean_t  -log softmax(logits_t)[x_{t+1}]    next-token cross-entropy

`load_from_hf` copies a Hugging Face `GPT2LMHeadModel`, so a test can prove that these blocks
compute exactly GPT-2. `decoding_step` plugs the model into `utils.decoding` (greedy, sampling).
Training helpers (evaluation over a whole split, `train_lm`; the generic ones, random windows of
a token stream, AdamW with decay on matrices, live in `utils.text` and `utils.train`) are
separate functions, not methods: the model class holds construction and `forward` only.

Shapes: B batch, T tokens, V vocabulary, E = d_model, nh heads, L layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from utils.loading import check_same
from utils.schedules import start_of_longer_plan, warmup_cosine
from utils.text import random_batches
from utils.train import adamw, autocast, fit, model_device, to_device
from utils.transformer import (
    HF_ACTIVATIONS,
    Encoder,
    EncoderConfig,
    LayerNorm,
    LearnedPositions,
    fuse_layer_norms_,
)

Tensor = torch.Tensor


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and switches of a GPT; defaults are a small character model that trains on a CPU."""

    vocab_size: int = 65  # V, the token vocabulary
    block_size: int = 256  # T_max, the longest context (rows of the position table)
    d_model: int = 192  # E, the width of the residual stream
    n_heads: int = 6  # nh; each head works in hs = E / nh dimensions
    n_layers: int = 4  # L, transformer blocks
    d_ff: int | None = None  # F, feed-forward width; None: 4 E as in GPT-2
    dropout: float = 0.1  # on embeddings, the FFN hidden layer and sublayer outputs
    attn_dropout: float | None = None  # on the attention weights; None: the same as `dropout`
    ffn_dropout: float | None = None  # on the FFN hidden layer; None: the same as `dropout`
    norm_first: bool = True  # True: pre-LN (GPT-2); False: post-LN (GPT-1, the 2017 paper)
    activation: str = "gelu_tanh"  # GPT-2's tanh approximation of GELU
    eps: float = 1e-5  # layer norm epsilon (GPT-2's)
    tie_weights: bool = True  # the output layer reuses the token table W_e (Press & Wolf 2017)
    sdpa: bool = True  # fused attention (F.scaled_dot_product_attention) unless weights are asked
    fused_norm: bool = True  # layer norm through F.layer_norm: the same function, one fused kernel
    block: str = "standard"  # "standard": LN placed by norm_first; "rezero": no LN (notebook 14)
    embed_norm: bool = False  # a layer norm on the summed embeddings (BERT's): the stream starts at size sqrt(E)

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.block_size < 1:
            raise ValueError(f"vocab_size and block_size must be positive, got {self.vocab_size}, "
                             f"{self.block_size}")

    def encoder_config(self) -> EncoderConfig:
        return EncoderConfig(d_model=self.d_model, n_heads=self.n_heads,
                             d_ff=self.d_ff or 4 * self.d_model, n_layers=self.n_layers,
                             dropout=self.dropout, attn_dropout=self.attn_dropout,
                             norm_first=self.norm_first,
                             activation=self.activation, eps=self.eps, sdpa=self.sdpa,
                             block=self.block)


class GPT(nn.Module):
    """Token + learned position embeddings, L causal blocks, a (tied) linear head.

    forward: idx (B, T) int64 -> logits (B, T, V); with `targets` (B, T) also the mean
    cross-entropy (float32, ignore_index -100). `need_weights=True` adds the per-block
    attention maps (B, nh, T, T) as a third output.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)  # W_e (V, E)
        self.pos = LearnedPositions(cfg.d_model, cfg.block_size)  # P (T_max, E)
        self.embed_norm = LayerNorm(cfg.d_model, cfg.eps) if cfg.embed_norm else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = Encoder(cfg.encoder_config())  # pre-LN stacks end with the final LN
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (E -> V)
        if cfg.ffn_dropout is not None:  # CPU dropout masks are costly: the widest one is optional
            for block in self.blocks.blocks:
                block.ffn.dropout.p = cfg.ffn_dropout
        if cfg.fused_norm:
            fuse_layer_norms_(self)
        self.apply(_init_gpt2)
        for name, p in self.named_parameters():  # GPT-2: residual writes scaled by 1/sqrt(2L)
            if name.endswith(("attn.W_o.weight", "ffn.W_2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))
        if cfg.tie_weights:
            self.head.weight = self.tok.weight  # one (V, E) matrix: embeds and un-embeds

    def forward(self, idx: Tensor, targets: Tensor | None = None, need_weights: bool = False):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds block_size={self.cfg.block_size}: "
                             "crop the context to the last block_size tokens")
        x = self.drop(self.embed_norm(self.pos(self.tok(idx))))  # (B, T, E)
        x, maps = self.blocks(x, need_weights=need_weights, causal=True)  # (B, T, E)
        logits = self.head(x)  # (B, T, V)
        if targets is None and not need_weights:
            return logits
        out = [logits]
        if targets is not None:  # mean over B * T positions, in float32 even under autocast
            out.append(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()))
        if need_weights:
            out.append(maps)
        return tuple(out)


def _init_gpt2(module: nn.Module) -> None:
    """GPT-2's initialization: N(0, 0.02) weights, zero biases (PyTorch's default is wider)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


# ---------------------------------------------------------------------------- reference: GPT-2
@torch.no_grad()
def load_from_hf(model: GPT, hf, ignore: tuple[str, ...] = ()) -> GPT:
    """Copy the weights of a Hugging Face `GPT2LMHeadModel` into `model`.

    GPT-2 stores its projections as `Conv1D` with weights (in, out), the transpose of
    `nn.Linear`'s (out, in), and packs W_q, W_k, W_v into one `c_attn` of width 3E.
    A GPT-2 configured otherwise (heads, activation, epsilon, tying, ...) is refused: the copy
    would compute another function. `ignore` names fields not to compare, for a near miss.
    """
    cfg, E = model.cfg, model.cfg.d_model
    check_same("GPT2LMHeadModel", gpt2_fields(cfg), hf_gpt2_fields(hf), ignore)
    if cfg.block_size > hf.config.n_positions:
        raise ValueError(f"block_size: GPT2LMHeadModel has n_positions = {hf.config.n_positions}"
                         f", ours has {cfg.block_size}: build ours with block_size <= n_positions")
    t = hf.transformer
    model.tok.weight.copy_(t.wte.weight)
    model.pos.P.weight.copy_(t.wpe.weight[:cfg.block_size])
    for ours, theirs in zip(model.blocks.blocks, t.h):
        W, b = theirs.attn.c_attn.weight, theirs.attn.c_attn.bias  # (E, 3E), (3E,)
        for i, lin in enumerate((ours.attn.W_q, ours.attn.W_k, ours.attn.W_v)):
            lin.weight.copy_(W[:, i * E:(i + 1) * E].T)
            lin.bias.copy_(b[i * E:(i + 1) * E])
        pairs = ((ours.attn.W_o, theirs.attn.c_proj), (ours.ffn.W_1, theirs.mlp.c_fc),
                 (ours.ffn.W_2, theirs.mlp.c_proj))
        for lin, conv in pairs:
            lin.weight.copy_(conv.weight.T)  # Conv1D (in, out) -> Linear (out, in)
            lin.bias.copy_(conv.bias)
        for ln, hf_ln in ((ours.norm1, theirs.ln_1), (ours.norm2, theirs.ln_2)):
            ln.load_from_torch(hf_ln)
    model.blocks.norm.load_from_torch(t.ln_f)
    if not cfg.tie_weights:
        model.head.weight.copy_(hf.lm_head.weight)
    return model


def gpt2_fields(cfg: GPTConfig) -> dict:
    """What `load_from_hf` compares: every field of ours that changes the function."""
    return {"vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads, "d_ff": cfg.d_ff or 4 * cfg.d_model,
            "activation": cfg.activation, "eps": cfg.eps, "tie_weights": cfg.tie_weights,
            "norm_first": cfg.norm_first, "block": cfg.block, "embed_norm": cfg.embed_norm,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}


def hf_gpt2_fields(hf) -> dict:
    """The same fields of a Hugging Face GPT-2 (always pre-LN, no embedding norm)."""
    c = hf.config
    return {"vocab_size": c.vocab_size, "d_model": c.n_embd, "n_layers": c.n_layer,
            "n_heads": c.n_head, "d_ff": c.n_inner or 4 * c.n_embd,
            "activation": HF_ACTIVATIONS.get(c.activation_function, c.activation_function),
            "eps": c.layer_norm_epsilon, "tie_weights": hf.lm_head.weight is hf.transformer.wte.weight,
            "norm_first": True, "block": "standard", "embed_norm": False,
            "scale_attn_weights": c.scale_attn_weights,
            "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx}


# ---------------------------------------------------------------------------- decoding
def decoding_step(model: GPT):
    """A `step(prefix, state)` for `utils.decoding`: log-probabilities of the next token.

    The GPT rereads its (cropped) context at every step; state is unused (None). A key/value
    cache would avoid that recomputation (notebook 10 builds one).
    """
    def step(prefix: Tensor, state):
        logits = model(prefix[:, -model.cfg.block_size:])  # (B, t, V)
        return torch.log_softmax(logits[:, -1].float(), dim=-1), state  # (B, V)
    return step


# ---------------------------------------------------------------------------- data and training
def lm_step(model: nn.Module, batch) -> dict:
    """`utils.train.fit` step: mean next-token loss of a (x, y) batch; "n" = predicted tokens."""
    x, y = to_device(batch, model_device(model))  # (B, T), (B, T)
    return {"loss": model(x, y)[1], "n": y.numel()}


@torch.no_grad()
def token_nll(model: GPT, ids: Tensor, batch_size: int = 32, precision: str = "fp32",
              window: int | None = None, stride: int | None = None) -> Tensor:
    """Next-token loss (nats) of every token of a split `ids` (N,) after the first: shape (N - 1,),
    on the CPU, in the split's order, so two models can be compared position by position.

    Windows of `window` tokens (default block_size) start every `stride` tokens (default: the
    window, so each token is predicted once and the context restarts at each window; a shorter
    window scores the same model with less context, e.g. 100, the course's RNN windows). With
    `stride` < `window` the windows overlap and each after the first scores only its last `stride`
    targets, so every token but the first `window - stride` has at least that much context.
    """
    T, device = window or model.cfg.block_size, model_device(model)
    S = stride or T
    if not 0 < T <= model.cfg.block_size:
        raise ValueError(f"window must be in 1..block_size={model.cfg.block_size}, got {window}")
    if not 0 < S <= T:
        raise ValueError(f"stride must be in 1..window={T}, got {stride}")
    model.eval()
    x_all, y_all = ids[:-1], ids[1:]  # (N - 1,)
    # window k starts at k * S and scores targets [T - S, T) of its own (all of them for k = 0)
    starts = [0] + list(range(S, max(len(x_all) - T + S, S), S))
    out = []
    for i in range(0, len(starts), batch_size):
        xs = [x_all[s:s + T] for s in starts[i:i + batch_size]]
        ys = [y_all[s:s + T].clone() for s in starts[i:i + batch_size]]
        for s, y in zip(starts[i:i + batch_size], ys):
            y[:T - S if s else 0] = -100  # already scored by the previous window
        x = nn.utils.rnn.pad_sequence(xs, batch_first=True)  # (B, T); only the last may be short
        y = nn.utils.rnn.pad_sequence(ys, batch_first=True, padding_value=-100)  # (B, T)
        with autocast(model, precision):
            logits = model(x.to(device))  # (B, T, V)
        nll = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), ignore_index=-100,
                              reduction="none")  # (B * T,)
        out.append(nll[y.flatten() != -100].cpu())
    return torch.cat(out)


def evaluate_lm(model: GPT, ids: Tensor, batch_size: int = 32, precision: str = "fp32",
                window: int | None = None) -> float:
    """Mean next-token loss (nats) over a whole split `ids` (N,): the mean of `token_nll`."""
    return token_nll(model, ids, batch_size, precision, window).double().mean().item()


def train_lm(model: GPT, train_ids: Tensor, *, updates: int | None = None, seconds: float | None = None,
             batch_size: int = 32, lr: float = 2e-3, warmup_steps: int = 100, min_lr_ratio: float = 0.1,
             weight_decay: float = 0.1, clip: float = 1.0, precision: str = "fp32", seed: int = 0,
             val_ids: Tensor | None = None, eval_every: int | None = None, keep_best: bool = False,
             schedule_updates: int | None = None, log_every: int | None = None) -> dict:
    """Train a language model on random windows of `train_ids` (N,) through `utils.train.fit`.

    nanoGPT's recipe: AdamW with weight decay on matrices only, a linear warm-up and a cosine to
    `min_lr_ratio` over the budget, gradients clipped to norm `clip`. With `val_ids` the whole
    split is scored every `eval_every` updates and at the end (`keep_best`: the best weights are
    restored, since a long run can overfit). `schedule_updates` >= `updates` runs the first
    `updates` steps of a longer run's schedule, so two runs can be compared checkpoint by
    checkpoint at the same learning rates. Returns `fit`'s log ("items": tokens trained on).
    """
    batches = random_batches(train_ids, model.cfg.block_size, batch_size, torch.Generator().manual_seed(seed))
    validate = None if val_ids is None else (lambda m: {"loss": evaluate_lm(m, val_ids)})
    schedule = warmup_cosine(warmup_steps, min_lr_ratio)
    if schedule_updates is not None:  # progress measured against the longer plan, not this budget
        schedule = start_of_longer_plan(schedule, updates, schedule_updates)
    return fit(model, batches, lm_step, adamw(model, lr, weight_decay), updates=updates, seconds=seconds,
               schedule=schedule, clip=clip, precision=precision,
               validate=validate, eval_every=eval_every,
               keep_best=("val_loss", "min") if keep_best else None, log_every=log_every)


# ---------------------------------------------------------------------------- subword tokens
def byte_level_bpe(texts, vocab_size: int):
    """A lossless byte-level BPE tokenizer (GPT-2's scheme) trained on `texts` with `tokenizers`.

    Unlike `utils.text.BPETokenizer` (lowercased, whitespace dropped: fine for classification),
    decode(encode(s)) == s here, so a language model on these tokens predicts the exact text
    and its loss can be compared with a character model's in bits per character.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok
