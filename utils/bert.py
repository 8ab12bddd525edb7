"""A BERT-style encoder from the course's blocks: masked-LM pre-training and real weights (notebook 12).

BERT (Devlin et al. 2019) is the Transformer encoder of notebook 08 with three embeddings
added, a layer norm on their sum, and post-LN blocks with exact GELU:

    h_0 = LN(W_e[x] + P[1..T] + S[segment])        (B, T, E), S: sentence A / B embedding
    h_l = Block_l(h_{l-1}, key_mask),  l = 1..L    bidirectional: every token sees every token

Masked language modeling (MLM) trains it: pick 15% of the positions; of those, replace 80% by
[MASK], 10% by a random token, keep 10% unchanged; predict the original token there only.

`load_state_dict_hf` reads a Hugging Face `BertModel` state dict (from a live model or from a
`model.safetensors` file), so the same class runs all-MiniLM-L6-v2 (6 layers, E 384) and
reproduces `transformers`' hidden states. `EpochBatches` feeds fine-tuning in true epochs.

Shapes: B batch, T word pieces, V vocabulary, E = d_model, nh heads, L layers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from utils.schedules import warmup_cosine
from utils.train import fit
from utils.transformer import ACTIVATIONS, Encoder, EncoderConfig, LayerNorm, LearnedPositions

Tensor = torch.Tensor


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT-style encoder; defaults are all-MiniLM-L6-v2's (BERT-base: E 768, L 12)."""

    vocab_size: int = 30522  # V, WordPiece vocabulary of bert-base-uncased
    max_len: int = 512  # rows of the position table
    type_vocab_size: int = 2  # segments (sentence A, sentence B)
    d_model: int = 384  # E
    n_heads: int = 12  # nh
    n_layers: int = 6  # L
    d_ff: int = 1536  # F = 4 E
    dropout: float = 0.1  # everywhere (BERT uses one rate)
    activation: str = "gelu"  # BERT's exact (erf) GELU
    eps: float = 1e-12  # BERT's layer norm epsilon
    sdpa: bool = False  # fused attention when no weights are asked

    def encoder_config(self) -> EncoderConfig:
        return EncoderConfig(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff,
                             n_layers=self.n_layers, dropout=self.dropout, norm_first=False,
                             activation=self.activation, eps=self.eps, sdpa=self.sdpa)

    @classmethod
    def from_hf(cls, hf_config) -> BertConfig:
        """The same sizes as a `transformers.BertConfig` (or its config.json as a dict)."""
        c = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        if c.get("hidden_act", "gelu") != "gelu" or c.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only BERT with exact GELU and absolute positions is supported")
        return cls(vocab_size=c["vocab_size"], max_len=c["max_position_embeddings"],
                   type_vocab_size=c["type_vocab_size"], d_model=c["hidden_size"],
                   n_heads=c["num_attention_heads"], n_layers=c["num_hidden_layers"],
                   d_ff=c["intermediate_size"], dropout=c["hidden_dropout_prob"],
                   eps=c["layer_norm_eps"])


class BertEmbeddings(nn.Module):
    """LN(W_e[x] + P[pos] + S[segment]), then dropout: ids (B, T) -> (B, T, E)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)  # W_e (V, E)
        self.pos = LearnedPositions(cfg.d_model, cfg.max_len)  # P (max_len, E)
        self.seg = nn.Embedding(cfg.type_vocab_size, cfg.d_model)  # S (2, E)
        self.norm = LayerNorm(cfg.d_model, cfg.eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, ids: Tensor, segments: Tensor | None = None) -> Tensor:
        seg = self.seg.weight[0] if segments is None else self.seg(segments)  # (E,) or (B, T, E)
        return self.drop(self.norm(self.pos(self.tok(ids)) + seg))  # (B, T, E)


class BertEncoder(nn.Module):
    """Embeddings + a post-LN encoder stack (no pooler: sentence vectors are mean-pooled).

    forward: ids (B, T) int64, key_mask (B, T) bool (True on real word pieces) or None
    -> (hidden (B, T, E), per-block attention maps (B, nh, T, T), empty unless need_weights).
    """

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = BertEmbeddings(cfg)
        self.encoder = Encoder(cfg.encoder_config())
        self.apply(_init_bert)

    def forward(self, ids: Tensor, key_mask: Tensor | None = None, segments: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        if key_mask is not None and key_mask.dtype != torch.bool:
            key_mask = key_mask.bool()  # a tokenizer's 0/1 attention_mask
        return self.encoder(self.embed(ids, segments), key_mask, need_weights)  # (B, T, E)


def _init_bert(module: nn.Module) -> None:
    """BERT's initialization: N(0, 0.02) weights, zero biases (real weights overwrite it anyway)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class MLMHead(nn.Module):
    """BERT's prediction head: act(h W + b) -> LN -> tied un-embedding W_e^T + bias: (B, T, E) -> (B, T, V)."""

    def __init__(self, cfg: BertConfig, tok: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]
        self.norm = LayerNorm(cfg.d_model, cfg.eps)
        self.tok = tok  # shared with the input embedding (weight tying)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))  # (V,)
        _init_bert(self.dense)

    def forward(self, h: Tensor) -> Tensor:
        z = self.norm(self.act(self.dense(h)))  # (B, T, E)
        return z @ self.tok.weight.T + self.bias  # (B, T, V)


class BertMLM(nn.Module):
    """Encoder + MLM head: ids (B, T), key_mask (B, T) or None -> logits (B, T, V)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bert = BertEncoder(cfg)
        self.head = MLMHead(cfg, self.bert.embed.tok)

    def forward(self, ids: Tensor, key_mask: Tensor | None = None) -> Tensor:
        return self.head(self.bert(ids, key_mask)[0])  # (B, T, V)


class SentenceClassifier(nn.Module):
    """A BERT-style encoder, mean pooling over real word pieces, dropout, a linear layer.

    forward: ids (B, T), key_mask (B, T) -> logits (B, n_classes). Fine-tuning trains it all;
    the frozen-feature baseline trains only a linear model on the pooled vectors.
    """

    def __init__(self, encoder: BertEncoder, n_classes: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(encoder.cfg.d_model, n_classes)

    def forward(self, ids: Tensor, key_mask: Tensor) -> Tensor:
        from utils.encoders import mean_pool

        h, _ = self.encoder(ids, key_mask)  # (B, T, E)
        return self.out(self.drop(mean_pool(h, key_mask)))  # (B, n_classes)


# ---------------------------------------------------------------------------- fine-tuning batches
class EpochBatches:
    """Batches of labelled texts in true epochs, for `utils.train.fit(..., epochs=k)`.

    ids (N, T), key_mask (N, T) bool, labels (N,). Each pass (one `iter`) is a fresh random
    permutation drawn from a generator seeded once with `seed`, cut into batches of
    `batch_size` (the last one of a pass may be smaller): sampling *without* replacement, so
    every row is trained on exactly once per epoch (drawing batches with `randint` instead
    touches only about 63% of the rows in "one pass"). A batch is cut after its last column with
    a real piece in some row (by the mask, so left-padded rows keep theirs). `len` is batches per
    epoch; `seen` holds the distinct rows handed out.
    """

    def __init__(self, ids: Tensor, key_mask: Tensor, labels: Tensor, batch_size: int = 16,
                 seed: int = 0) -> None:
        if not len(ids) == len(key_mask) == len(labels) > 0:
            raise ValueError(f"ids, key_mask and labels need the same non-zero length, got "
                             f"{len(ids)}, {len(key_mask)}, {len(labels)}")
        self.ids, self.key_mask, self.labels = ids, key_mask, labels
        self.batch_size, self.generator = batch_size, torch.Generator().manual_seed(seed)
        self.seen: set[int] = set()

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.labels), generator=self.generator)  # (N,) one epoch
        for i in order.split(self.batch_size):  # (b,) each row once
            self.seen.update(i.tolist())
            real = self.key_mask[i].any(0).nonzero()  # (n, 1) the columns real in some row
            keep = int(real.max()) + 1 if len(real) else 0  # up to the last of them
            yield self.ids[i, :keep], self.key_mask[i, :keep], self.labels[i]  # (b, T'), (b, T'), (b,)


# ---------------------------------------------------------------------------- MLM masking
def mask_tokens(ids: Tensor, mask_id: int, vocab_size: int, p: float = 0.15,
                special: Tensor | None = None, generator: torch.Generator | None = None
                ) -> tuple[Tensor, Tensor]:
    """BERT's 80/10/10 recipe: -> (inputs (B, T), labels (B, T), -100 where nothing is predicted).

    Each position not flagged in `special` (B, T) bool (padding, [CLS], [SEP]) is selected with
    probability p; a selected token becomes [MASK] with probability 0.8, a random token with
    0.1, and stays itself with 0.1. The label is the original token at selected positions only.
    Random tokens are drawn from all V ids (as BERT does); nothing is created off `ids.device`.
    """
    if not 0 < p < 1:
        raise ValueError(f"the masking rate p must be in (0, 1), got {p}")
    u = torch.rand(ids.shape, generator=generator).to(ids.device)  # (B, T) three uniform draws
    r = torch.rand(ids.shape, generator=generator).to(ids.device)  # (B, T)
    rand_tok = torch.randint(vocab_size, ids.shape, generator=generator).to(ids.device)  # (B, T)
    chosen = u < p  # (B, T)
    if special is not None:
        chosen = chosen & ~special
    labels = ids.masked_fill(~chosen, -100)  # (B, T)
    inputs = torch.where(chosen & (r < 0.8), torch.full_like(ids, mask_id), ids)  # 80%: [MASK]
    inputs = torch.where(chosen & (r >= 0.8) & (r < 0.9), rand_tok, inputs)  # 10%: random
    return inputs, labels  # the last 10% keep their token


# ---------------------------------------------------------------------------- real weights
_HF_BLOCK = {  # our name inside block i -> Hugging Face BertLayer name
    "attn.W_q": "attention.self.query", "attn.W_k": "attention.self.key",
    "attn.W_v": "attention.self.value", "attn.W_o": "attention.output.dense",
    "norm1": "attention.output.LayerNorm", "ffn.W_1": "intermediate.dense",
    "ffn.W_2": "output.dense", "norm2": "output.LayerNorm",
}


def hf_name_map(n_layers: int) -> dict[str, str]:
    """Our parameter names -> Hugging Face BertModel names (both nn.Linear: no transposes)."""
    names = {"embed.tok.weight": "embeddings.word_embeddings.weight",
             "embed.pos.P.weight": "embeddings.position_embeddings.weight",
             "embed.seg.weight": "embeddings.token_type_embeddings.weight",
             "embed.norm.gamma": "embeddings.LayerNorm.weight",
             "embed.norm.beta": "embeddings.LayerNorm.bias"}
    for i in range(n_layers):
        for ours, theirs in _HF_BLOCK.items():
            for p_ours, p_theirs in ((("gamma", "weight"), ("beta", "bias")) if "norm" in ours
                                     else (("weight", "weight"), ("bias", "bias"))):
                names[f"encoder.blocks.{i}.{ours}.{p_ours}"] = f"encoder.layer.{i}.{theirs}.{p_theirs}"
    return names


@torch.no_grad()
def load_state_dict_hf(model: BertEncoder, state: dict[str, Tensor]) -> BertEncoder:
    """Copy a `BertModel` state dict (keys with or without a "bert." prefix) into `model`."""
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    params = dict(model.named_parameters())
    names = hf_name_map(model.cfg.n_layers)
    missing = sorted(v for v in names.values() if v not in state)
    if missing or set(names) != set(params):
        raise ValueError(f"not a matching BertModel state dict; missing e.g. {missing[:3]}")
    for ours, theirs in names.items():
        if params[ours].shape != state[theirs].shape:
            raise ValueError(f"{ours} {tuple(params[ours].shape)} vs {theirs} {tuple(state[theirs].shape)}")
        params[ours].copy_(state[theirs])
    return model


def load_bert_folder(folder: str | Path, **overrides) -> BertEncoder:
    """Our `BertEncoder` from a Hugging Face model folder (config.json + model.safetensors).

    `overrides` change switches that leave the weights alone, e.g. `sdpa=True`, `dropout=0.0`.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = replace(BertConfig.from_hf(json.loads((folder / "config.json").read_text())), **overrides)
    model = BertEncoder(cfg)
    return load_state_dict_hf(model, load_file(folder / "model.safetensors")).eval()


# ---------------------------------------------------------------------------- MLM training
def mlm_loss(model: BertMLM, ids: Tensor, mask_id: int, p: float = 0.15,
             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Mask `ids` (B, T) with `mask_tokens`, predict: -> (mean loss over chosen positions, logits, labels)."""
    inputs, labels = mask_tokens(ids, mask_id, model.cfg.vocab_size, p, generator=generator)
    logits = model(inputs)  # (B, T, V)
    loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
    return loss, logits, labels


@torch.no_grad()
def mlm_predict(model: BertMLM, ids: Tensor, mask_id: int, block: int = 128, p: float = 0.15,
                seed: int = 0, batch_size: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """Mask a whole split `ids` (N,) in consecutive windows of `block` tokens with `mask_tokens`
    (a fixed `seed`: the same blanks at every call) and predict them.

    -> inputs (n, block), labels (n, block) (-100 where nothing is predicted), logits
    (n, block, V), all on the model's device; the last N mod block tokens are left out.
    """
    model.eval()
    device, n = next(model.parameters()).device, len(ids) // block
    windows = ids[: n * block].view(n, block)  # (n, T)
    inputs, labels = mask_tokens(windows, mask_id, model.cfg.vocab_size, p,
                                 generator=torch.Generator().manual_seed(seed))  # (n, T), (n, T)
    inputs, labels = inputs.to(device), labels.to(device)
    logits = torch.cat([model(inputs[i:i + batch_size]).float()
                        for i in range(0, n, batch_size)])  # (n, T, V)
    return inputs, labels, logits


def evaluate_mlm(model: BertMLM, ids: Tensor, mask_id: int, block: int = 128, p: float = 0.15,
                 seed: int = 0) -> dict[str, float]:
    """Masked-LM loss (nats) and accuracy at the chosen positions of a whole split (`mlm_predict`)."""
    _, labels, logits = mlm_predict(model, ids, mask_id, block, p, seed)
    chosen = labels != -100  # (n, T)
    loss = nn.functional.cross_entropy(logits[chosen], labels[chosen])
    return {"loss": loss.item(), "acc": (logits[chosen].argmax(-1) == labels[chosen]).float().mean().item()}


def train_mlm(model: BertMLM, ids: Tensor, *, updates: int | None = None, seconds: float | None = None,
              block: int = 128, batch_size: int = 32, mask_id: int = 0, p: float = 0.15,
              lr: float = 2e-3, warmup_steps: int = 100, min_lr_ratio: float = 0.1,
              weight_decay: float = 0.1, clip: float = 1.0, precision: str = "fp32", seed: int = 0,
              val_ids: Tensor | None = None, eval_every: int | None = None,
              log_every: int | None = None) -> dict:
    """Masked-LM pre-training on random windows of the token stream `ids` (N,), through
    `utils.train.fit` with the GPT's recipe (`utils.gpt.train_lm`: AdamW, warm-up + cosine,
    clipping). One generator draws the windows and the masks, so a seed fixes both. With
    `val_ids` the whole split is scored (`evaluate_mlm`, the same blanks each time) every
    `eval_every` updates and at the end: "val_loss", "val_acc" in the log."""
    from utils.text import random_batches
    from utils.train import adamw

    g = torch.Generator().manual_seed(seed)

    def step(m: BertMLM, batch) -> dict:
        x, _ = batch  # (B, T); the shifted targets are unused
        loss, _, labels = mlm_loss(m, x, mask_id, p, g)
        return {"loss": loss, "n": int((labels != -100).sum())}

    validate = None if val_ids is None else (lambda m: evaluate_mlm(m, val_ids, mask_id, block, p))
    return fit(model, random_batches(ids, block, batch_size, g), step, adamw(model, lr, weight_decay),
               updates=updates, seconds=seconds, schedule=warmup_cosine(warmup_steps, min_lr_ratio),
               clip=clip, precision=precision, validate=validate, eval_every=eval_every,
               log_every=log_every)
