"""Sequence-to-sequence translation: the Multi30k pipeline and recurrent encoder-decoders.

Pipeline (notebooks 07 and 10 use it unchanged):
- `load_translation_data` reads Multi30k (de -> en by default), trains a cased subword (BPE)
  tokenizer per language on the TRAINING split only (or one shared tokenizer), and encodes
  every split. The tokenizer's decoder gives back detokenized text, so model outputs can be
  scored with sacreBLEU's default BLEU (cased, detokenized, 13a);
- `make_loader` batches sentence pairs of similar length (bucketing) into `TranslationBatch`es
  with padding masks;
- `evaluate_translation` decodes a split (greedy or beam) and reports BLEU (the course's
  `utils.metrics.corpus_bleu`, headline and lowercased variants) and perplexity;
- `translation_lexicon`, `word_alignments` and `cross_attention_stats` measure what a
  Transformer's cross-attention heads do on whole words whose translation is known (notebook 10).

Models: an `Encoder` (GRU, optionally bidirectional) and four decoders, all behind one
`EncoderDecoder` that any "translator" in the course imitates:
    model(src, src_mask, tgt_in) -> logits (B, T, V)        training, teacher forcing
    model.start(src, src_mask) -> state                        decoding, see utils.decoding
    model.step(prefix, state) -> (log_probs (B, V), state)
- `FixedContextDecoder`: the encoder's last state is the decoder's only view of the source
  (Sutskever et al. 2014);
- `ContextDecoder`: that context is also fed at every step and to the output (Cho et al. 2014);
- `BahdanauDecoder`: additive attention queried with the PREVIOUS decoder state s_{t-1}
  (Bahdanau et al. 2015);
- `LuongDecoder`: attention queried with the CURRENT state s_t, attentional hidden state
  h~_t = tanh(W_c [c_t; s_t]) (Luong et al. 2015).

Shapes: B batch, S source length, T target length, E embedding, H hidden, V vocabulary.
"""

from __future__ import annotations

import collections
import random
import unicodedata
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from utils.attention import AdditiveScore, Attention, GeneralScore
from utils.data import load_multi30k
from utils.decoding import beam_search, greedy_decode
from utils.metrics import BLEUResult, corpus_bleu, perplexity, token_nll
from utils.schedules import start_of_longer_plan, warmup_cosine
from utils.text import SPECIALS, UNK, BPETokenizer, BucketBatchSampler
from utils.train import autocast, evaluate, fit, model_device

Tensor = torch.Tensor
PAD_ID, UNK_ID, SOS_ID, EOS_ID = 0, 1, 2, 3  # the order of utils.text.SPECIALS


# ---------------------------------------------------------------------------- tokenization
def train_subword_tokenizer(texts, vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
    """A CASED BPE tokenizer whose `decode` returns detokenized text.

    Words are split at spaces (kept as a leading "▁" on the first piece, as in SentencePiece)
    and punctuation is split off, so "bike." -> ["▁bike", "."]; decoding glues the pieces and
    turns "▁" back into spaces: "A man rides a bike." round-trips exactly. Specials get ids
    0-3 (<pad>, <unk>, <sos>, <eos>) like every `utils.text.Vocab`.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIALS), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok)  # reuse the course's wrapper: encode / decode / tokenize / save


@dataclass
class TranslationData:
    """Tokenizers and encoded splits of a parallel corpus; `raw[split]` keeps the strings."""

    src_lang: str
    tgt_lang: str
    src_tok: BPETokenizer
    tgt_tok: BPETokenizer
    raw: dict[str, list[tuple[str, str]]]  # split -> [(src text, tgt text)]
    ids: dict[str, list[tuple[list[int], list[int]]]] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {split: len(pairs) for split, pairs in self.raw.items()}


def load_translation_data(src: str = "de", tgt: str = "en", vocab_size: int = 8000,
                          shared: bool = False, limits: dict | None = None,
                          max_tokens: int = 64) -> TranslationData:
    """Multi30k (train / val / test 2016) tokenized with subword tokenizers trained on train only.

    shared=True trains one tokenizer on both languages (a Transformer can then tie its
    embeddings); otherwise each language gets its own of `vocab_size` pieces.
    `limits` optionally caps each split, e.g. {"train": 2000}; `max_tokens` truncates
    sentences (a handful of training sentences are much longer than the rest).
    """
    limits = limits or {}
    raw = {s: load_multi30k(s, src=src, tgt=tgt, limit=limits.get(s))
           for s in ("train", "val", "test")}
    train_src = [s for s, _ in raw["train"]]
    train_tgt = [t for _, t in raw["train"]]
    if shared:
        src_tok = tgt_tok = train_subword_tokenizer(train_src + train_tgt, vocab_size)
    else:
        src_tok = train_subword_tokenizer(train_src, vocab_size)
        tgt_tok = train_subword_tokenizer(train_tgt, vocab_size)
    data = TranslationData(src, tgt, src_tok, tgt_tok, raw)
    for split, pairs in raw.items():
        data.ids[split] = [(src_tok.encode(s)[:max_tokens], tgt_tok.encode(t)[:max_tokens])
                           for s, t in pairs]
    return data


def ids_to_text(ids, tok: BPETokenizer) -> str:
    """Model output ids -> detokenized text: stop at the first <eos>, drop specials."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
        ids = ids[: ids.index(EOS_ID)]
    return tok.decode([i for i in ids if i >= len(SPECIALS)])


def ids_to_pieces(ids, tok: BPETokenizer) -> list[str]:
    """The subword pieces of ids (for plot labels), "▁" marking the start of a word."""
    return [tok.id_to_token(i) for i in ids]


# ---------------------------------------------------------------------------- batching
@dataclass
class TranslationBatch:
    """Padded source and target; masks are True on real tokens.

    tgt_in = <sos> y_1 .. y_n (what the decoder reads), tgt_out = y_1 .. y_n <eos> (what it
    must predict), so tgt_in[:, t] is the input at the step whose target is tgt_out[:, t].
    """

    src: Tensor  # (B, S) int64
    src_mask: Tensor  # (B, S) bool
    tgt_in: Tensor  # (B, T) int64
    tgt_out: Tensor  # (B, T) int64, PAD_ID on padding

    def to(self, device) -> TranslationBatch:
        return TranslationBatch(*(x.to(device) for x in (self.src, self.src_mask,
                                                           self.tgt_in, self.tgt_out)))


def _pad(seqs: list[list[int]]) -> Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD_ID, dtype=torch.long)  # (B, L)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


class TranslationCollate:
    """`collate_fn` for (src ids, tgt ids) pairs -> `TranslationBatch`."""

    def __call__(self, pairs) -> TranslationBatch:
        srcs = [s if s else [UNK_ID] for s, _ in pairs]  # an empty source would break packing
        src = _pad(srcs)  # (B, S)
        tgt_in = _pad([[SOS_ID, *t] for _, t in pairs])  # (B, T)
        tgt_out = _pad([[*t, EOS_ID] for _, t in pairs])  # (B, T)
        return TranslationBatch(src, src != PAD_ID, tgt_in, tgt_out)


def make_loader(pairs, batch_size: int, shuffle: bool = True, seed: int = 0
                ) -> torch.utils.data.DataLoader:
    """Batches of pairs bucketed by source + target length (little padding)."""
    lengths = [len(s) + len(t) for s, t in pairs]
    sampler = BucketBatchSampler(lengths, batch_size, shuffle=shuffle, seed=seed)
    return torch.utils.data.DataLoader(pairs, batch_sampler=sampler,
                                       collate_fn=TranslationCollate())


def reverse_padded(x: Tensor, mask: Tensor) -> Tensor:
    """Reverse the real tokens of every row, padding stays at the end: x, mask (B, S) -> (B, S)."""
    S = x.shape[1]
    pos = torch.arange(S, device=x.device)[None, :]  # (1, S)
    lengths = mask.sum(dim=1, keepdim=True)  # (B, 1)
    index = torch.where(pos < lengths, lengths - 1 - pos, pos)  # (B, S)
    return x.gather(1, index)  # (B, S)


# ---------------------------------------------------------------------------- models
@dataclass(frozen=True)
class Seq2SeqConfig:
    src_vocab: int  # source vocabulary size V_src
    tgt_vocab: int  # target vocabulary size V
    emb: int = 256  # E, embedding width on both sides
    hidden: int = 512  # H, decoder GRU width (and each encoder direction's width)
    attn: int = 256  # d_a, hidden width of the additive score
    dropout: float = 0.3  # on embeddings and before the output layer
    bidirectional: bool = False  # encoder reads the source both ways (attention models)
    reverse_src: bool = False  # read the source backwards (Sutskever et al.'s input reversal)
    input_feeding: bool = False  # Luong: feed h~_{t-1} back into the next step's GRU input

    def __post_init__(self):
        if min(self.src_vocab, self.tgt_vocab, self.emb, self.hidden, self.attn) <= 0:
            raise ValueError(f"sizes must be positive: {self}")


class Encoder(nn.Module):
    """Embed and run a GRU over the source (packed, so padding never enters the state).

    src (B, S), src_mask (B, S) -> memory (B, S, H * dirs), summary (B, H): the last state,
    for a bidirectional encoder tanh(W [h_fwd_last; h_bwd_first]) so it has the decoder's width.
    """

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.src_vocab, cfg.emb, padding_idx=PAD_ID)
        self.rnn = nn.GRU(cfg.emb, cfg.hidden, batch_first=True, bidirectional=cfg.bidirectional)
        dirs = 2 if cfg.bidirectional else 1
        self.bridge = nn.Linear(dirs * cfg.hidden, cfg.hidden) if dirs == 2 else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        self.reverse_src = cfg.reverse_src

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        B, S = src.shape
        if self.reverse_src:  # memory position i then holds source word len - 1 - i
            src = reverse_padded(src, src_mask)  # (B, S)
        x = self.dropout(self.embed(src))  # (B, S, E)
        lengths = src_mask.sum(dim=1).cpu()  # (B,): packing wants lengths on the CPU
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, h_n = self.rnn(packed)  # h_n (dirs, B, H)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=S)  # (B, S, dirs*H)
        last = h_n.transpose(0, 1).reshape(B, -1)  # (B, dirs*H): batch-first again
        summary = torch.tanh(self.bridge(last)) if h_n.shape[0] == 2 else last  # (B, H)
        return memory, summary


class OutputLayer(nn.Module):
    """Features (..., F) -> logits (..., V). A wide F (state, context and embedding
    concatenated) first goes through a tanh bottleneck of E units, Bahdanau et al.'s "deep
    output": the V-way matrix product, the most expensive one of the model, then reads E
    numbers instead of F. When F <= E the features go straight to the V-way layer."""

    def __init__(self, d_in: int, d_bottleneck: int, vocab: int) -> None:
        super().__init__()
        self.pre = (nn.Sequential(nn.Linear(d_in, d_bottleneck), nn.Tanh())
                    if d_in > d_bottleneck else nn.Identity())
        self.proj = nn.Linear(min(d_in, d_bottleneck), vocab)

    def forward(self, f: Tensor) -> Tensor:
        return self.proj(self.pre(f))  # (..., V)


class _Decoder(nn.Module):
    """What every decoder shares: embedding, dropout, output layer, the step-by-step unroll.

    A subclass defines `init_state(memory, summary, src_mask) -> state (dict, batch first)` and
    `features(y_prev (B,), state) -> (f (B, F), state, weights (B, S) or None)`, where f is
    what the output layer reads; it may override `forward_parallel` when, with full teacher
    forcing, all steps can run at once.
    """

    parallel = False  # True: forward_parallel exists

    def __init__(self, cfg: Seq2SeqConfig, out_in: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.tgt_vocab, cfg.emb, padding_idx=PAD_ID)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = OutputLayer(out_in, cfg.emb, cfg.tgt_vocab)

    def step(self, y_prev: Tensor, state: dict):
        """One decoder step: y_prev (B,) -> (logits (B, V), state, weights (B, S) or None)."""
        f, state, w = self.features(y_prev, state)  # (B, F)
        return self.out(self.dropout(f)), state, w  # (B, V)

    def forward(self, tgt_in: Tensor, state: dict, teacher_forcing: float = 1.0,
                return_attention: bool = False):
        """tgt_in (B, T) -> logits (B, T, V) [, weights (B, T, S)].

        At each step the input is the gold token with probability `teacher_forcing`, else the
        model's own previous prediction (one coin per step for the whole batch). With full
        teacher forcing the output layer runs once on all steps (one big matrix product).
        """
        if teacher_forcing >= 1.0 and self.parallel and not return_attention:
            return self.forward_parallel(tgt_in, state)
        feats, weights, y = [], [], tgt_in[:, 0]  # y (B,)
        for t in range(tgt_in.shape[1]):
            f, state, w = self.features(y, state)  # (B, F)
            feats.append(f)
            weights.append(w)
            if t + 1 < tgt_in.shape[1]:
                gold = teacher_forcing >= 1.0 or random.random() < teacher_forcing
                y = tgt_in[:, t + 1] if gold else self.out(f).argmax(dim=-1)  # (B,)
        logits = self.out(self.dropout(torch.stack(feats, dim=1)))  # (B, T, V)
        if return_attention:
            return logits, torch.stack(weights, dim=1) if weights[0] is not None else None
        return logits


class FixedContextDecoder(_Decoder):
    """s_0 = c (the encoder's summary); s_t = GRU(emb(y_{t-1}), s_{t-1}); logits = W_o s_t."""

    parallel = True

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__(cfg, out_in=cfg.hidden)
        self.rnn = nn.GRU(cfg.emb, cfg.hidden, batch_first=True)

    def init_state(self, memory: Tensor, summary: Tensor, src_mask: Tensor) -> dict:
        return {"s": summary}  # (B, H): everything the decoder will know about the source

    def features(self, y_prev: Tensor, state: dict):
        x = self.dropout(self.embed(y_prev))[:, None]  # (B, 1, E)
        out, s = self.rnn(x, state["s"][None])  # (B, 1, H), (1, B, H)
        return out[:, 0], {"s": s[0]}, None  # (B, H)

    def forward_parallel(self, tgt_in: Tensor, state: dict) -> Tensor:
        x = self.dropout(self.embed(tgt_in))  # (B, T, E)
        out, _ = self.rnn(x, state["s"][None])  # (B, T, H)
        return self.out(self.dropout(out))  # (B, T, V)


class ContextDecoder(_Decoder):
    """The context c at every step: s_t = GRU([emb(y_{t-1}); c], s_{t-1}),
    logits = W_o [s_t; emb(y_{t-1}); c] (Cho et al. 2014)."""

    parallel = True

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__(cfg, out_in=cfg.hidden + cfg.emb + cfg.hidden)
        self.rnn = nn.GRU(cfg.emb + cfg.hidden, cfg.hidden, batch_first=True)

    def init_state(self, memory: Tensor, summary: Tensor, src_mask: Tensor) -> dict:
        return {"s": summary, "c": summary}  # (B, H) each

    def _features(self, e: Tensor, c: Tensor, s0: Tensor):
        out, s = self.rnn(torch.cat([e, c], dim=-1), s0[None])  # (B, T, H), (1, B, H)
        return torch.cat([out, e, c], dim=-1), s[0]  # (B, T, H + E + H)

    def features(self, y_prev: Tensor, state: dict):
        e = self.dropout(self.embed(y_prev))[:, None]  # (B, 1, E)
        f, s = self._features(e, state["c"][:, None], state["s"])  # (B, 1, F)
        return f[:, 0], {"s": s, "c": state["c"]}, None

    def forward_parallel(self, tgt_in: Tensor, state: dict) -> Tensor:
        e = self.dropout(self.embed(tgt_in))  # (B, T, E)
        c = state["c"][:, None].expand(-1, tgt_in.shape[1], -1)  # (B, T, H)
        return self.out(self.dropout(self._features(e, c, state["s"])[0]))  # (B, T, V)


class BahdanauDecoder(_Decoder):
    """Attention queried with the previous state (Bahdanau et al. 2015):
    alpha_t = softmax(additive(s_{t-1}, h_i)), c_t = sum_i alpha_ti h_i,
    s_t = GRU([emb(y_{t-1}); c_t], s_{t-1}), logits = W_o [s_t; c_t; emb(y_{t-1})].
    The memory h_i is (B, S, 2H) from the bidirectional encoder."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        d_mem = 2 * cfg.hidden if cfg.bidirectional else cfg.hidden
        super().__init__(cfg, out_in=cfg.hidden + d_mem + cfg.emb)
        self.attention = Attention(AdditiveScore(cfg.hidden, d_mem, cfg.attn))
        self.cell = nn.GRUCell(cfg.emb + d_mem, cfg.hidden)

    def init_state(self, memory: Tensor, summary: Tensor, src_mask: Tensor) -> dict:
        keys = self.attention.score.project_keys(memory)  # (B, S, d_a), once per sentence
        return {"s": summary, "memory": memory, "keys": keys, "mask": src_mask}

    def features(self, y_prev: Tensor, state: dict):
        e = self.dropout(self.embed(y_prev))  # (B, E)
        c, w = self.attention(state["s"][:, None], state["memory"], state["memory"],
                              state["mask"], keys_projected=state["keys"])  # (B, 1, 2H), (B, 1, S)
        s = self.cell(torch.cat([e, c[:, 0]], dim=-1), state["s"])  # (B, H)
        return torch.cat([s, c[:, 0], e], dim=-1), {**state, "s": s}, w[:, 0]  # (B, H + 2H + E)


class LuongDecoder(_Decoder):
    """Attention queried with the current state (Luong et al. 2015, general score):
    s_t = GRU(emb(y_{t-1}), s_{t-1}), alpha_t = softmax(s_t W h_i), c_t = sum_i alpha_ti h_i,
    h~_t = tanh(W_c [c_t; s_t]), logits = W_s h~_t. Without input feeding, a teacher-forced
    pass runs the GRU over all steps at once and attends for all of them in one bmm.
    With `input_feeding` (Luong et al.'s own remedy) the GRU reads [emb(y_{t-1}); h~_{t-1}], so
    the step knows where it attended before; the steps must then run one after the other."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        d_mem = 2 * cfg.hidden if cfg.bidirectional else cfg.hidden
        super().__init__(cfg, out_in=cfg.hidden)
        self.feed = cfg.input_feeding
        self.parallel = not self.feed
        self.rnn = nn.GRU(cfg.emb + (cfg.hidden if self.feed else 0), cfg.hidden, batch_first=True)
        self.attention = Attention(GeneralScore(cfg.hidden, d_mem))
        self.W_c = nn.Linear(d_mem + cfg.hidden, cfg.hidden, bias=False)

    def init_state(self, memory: Tensor, summary: Tensor, src_mask: Tensor) -> dict:
        state = {"s": summary, "memory": memory, "mask": src_mask}
        return {**state, "h_tilde": torch.zeros_like(summary)} if self.feed else state  # (B, H)

    def _attend(self, out: Tensor, state: dict):
        c, w = self.attention(out, state["memory"], state["memory"], state["mask"])  # (B, T, 2H)
        return torch.tanh(self.W_c(torch.cat([c, out], dim=-1))), w  # h~ (B, T, H), (B, T, S)

    def features(self, y_prev: Tensor, state: dict):
        x = self.dropout(self.embed(y_prev))[:, None]  # (B, 1, E)
        if self.feed:
            x = torch.cat([x, state["h_tilde"][:, None]], dim=-1)  # (B, 1, E + H)
        out, s = self.rnn(x, state["s"][None])  # (B, 1, H), (1, B, H)
        h_tilde, w = self._attend(out, state)  # (B, 1, H)
        state = {**state, "s": s[0], **({"h_tilde": h_tilde[:, 0]} if self.feed else {})}
        return h_tilde[:, 0], state, w[:, 0]

    def forward_parallel(self, tgt_in: Tensor, state: dict) -> Tensor:
        out, _ = self.rnn(self.dropout(self.embed(tgt_in)), state["s"][None])  # (B, T, H)
        return self.out(self.dropout(self._attend(out, state)[0]))  # (B, T, V)


DECODERS = {"seq2seq": FixedContextDecoder, "context": ContextDecoder,
            "bahdanau": BahdanauDecoder, "luong": LuongDecoder}


class EncoderDecoder(nn.Module):
    """Encoder + one of `DECODERS`, with the training and decoding interface described above."""

    def __init__(self, cfg: Seq2SeqConfig, decoder: str) -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {sorted(DECODERS)}")
        self.cfg, self.kind = cfg, decoder
        self.encoder = Encoder(cfg)
        self.decoder = DECODERS[decoder](cfg)

    def start(self, src: Tensor, src_mask: Tensor) -> dict:
        """Encode the source: src (B, S), src_mask (B, S) -> the decoder's first state."""
        if src.shape != src_mask.shape or src_mask.dtype != torch.bool:
            raise ValueError(f"expected src (B, S) and a bool src_mask of the same shape, got "
                             f"{tuple(src.shape)} and {tuple(src_mask.shape)} {src_mask.dtype}")
        memory, summary = self.encoder(src, src_mask)  # (B, S, dirs*H), (B, H)
        return self.decoder.init_state(memory, summary, src_mask)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor,
                teacher_forcing: float = 1.0, return_attention: bool = False):
        """Teacher-forced logits (B, T, V) for tgt_in (B, T) [and attention weights (B, T, S)]."""
        return self.decoder(tgt_in, self.start(src, src_mask), teacher_forcing, return_attention)

    def step(self, prefix: Tensor, state: dict) -> tuple[Tensor, dict]:
        """The `utils.decoding` interface: prefix (B, t) -> log-probs (B, V) of the next token."""
        logits, state, _ = self.decoder.step(prefix[:, -1], state)  # (B, V)
        return torch.log_softmax(logits.float(), dim=-1), state


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- training
def make_step(teacher_forcing: float = 1.0, label_smoothing: float = 0.0):
    """`utils.train.fit` step: mean token cross-entropy of a `TranslationBatch` (padding ignored).

    `teacher_forcing` < 1 feeds the model its own previous prediction at some steps (recurrent
    decoders, in training only). `label_smoothing` > 0 trains against targets that give that
    much probability mass to the other tokens (Szegedy et al. 2016; the Transformer uses 0.1).
    The loss is computed in float32, also under autocast.
    """
    def step(model: nn.Module, batch: TranslationBatch) -> dict:
        batch = batch.to(model_device(model))
        tf = teacher_forcing if model.training else 1.0  # evaluation: always teacher-forced
        kw = {"teacher_forcing": tf} if tf < 1.0 else {}
        logits = model(batch.src, batch.src_mask, batch.tgt_in, **kw).float()  # (B, T, V)
        if label_smoothing > 0:
            n = int((batch.tgt_out != PAD_ID).sum())
            loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD_ID,
                                   label_smoothing=label_smoothing)
            return {"loss": loss, "n": n}
        nll, n = token_nll(logits, batch.tgt_out, pad_id=PAD_ID)
        return {"loss": nll / n, "n": n}

    return step


def train_translator(model: nn.Module, data: TranslationData, *, epochs: int | None = None,
                     updates: int | None = None, seconds: float | None = None, lr: float = 1e-3,
                     warmup_steps: int | None = None, batch_size: int = 128,
                     betas: tuple = (0.9, 0.999), weight_decay: float = 0.0, clip: float | None = 1.0,
                     teacher_forcing: float = 1.0, label_smoothing: float = 0.0,
                     precision: str = "fp32", eval_every: int | None = None, val_loss: bool = True,
                     val_bleu: bool = True, val_pairs: int | None = None, seed: int = 0,
                     schedule_updates: int | None = None, log_every: int | None = 1) -> dict:
    """Train a translator (RNN or Transformer) on the training split through `utils.train.fit`.

    Adam(W) at a constant `lr`, or with `warmup_steps` a linear warm-up and a cosine over the
    budget; `schedule_updates` >= `updates` runs only the first `updates` of a longer run's
    schedule (the same batches and rates as that run, for a comparison at equal updates).
    Validation (after every epoch, or every `eval_every` updates, and at the end): the
    teacher-forced loss and the greedy BLEU of the first `val_pairs` validation sentences.
    Returns `fit`'s log (losses in nats per subword, BLEU 0-100).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    loader = make_loader(data.ids["train"], batch_size, seed=seed)
    val, refs = data.ids["val"][:val_pairs], [t for _, t in data.raw["val"][:val_pairs]]
    val_loader = make_loader(val, 200, shuffle=False)
    score_step = make_step()  # validation loss: plain cross-entropy, teacher-forced

    def validate(m: nn.Module) -> dict:
        out = {"loss": evaluate(m, val_loader, score_step, precision)["loss"]} if val_loss else {}
        if val_bleu:
            out["bleu"] = bleu_scores(translate(m, val, data.tgt_tok, precision=precision), refs)["bleu"].score
        return out

    schedule = None if warmup_steps is None else warmup_cosine(warmup_steps)
    if schedule_updates is not None:  # progress measured against the longer plan, not this budget
        if schedule is None:
            raise ValueError("schedule_updates needs a schedule: pass warmup_steps as well")
        schedule = start_of_longer_plan(schedule, updates, schedule_updates)
    return fit(model, loader, make_step(teacher_forcing, label_smoothing), opt, epochs,
               updates=updates, seconds=seconds, clip=clip, precision=precision, schedule=schedule,
               validate=validate, eval_every=eval_every, log_every=log_every)


@torch.no_grad()
def attention_entropy(model: nn.Module, pairs, batch_size: int = 200) -> dict:
    """How spread out a translator's attention is, teacher-forced on `pairs`: the entropy
    H = -sum_i alpha_ti log alpha_ti of every target step's weights over the real source
    pieces, averaged over the real target steps, in nats and as a share of log S (1 = uniform
    over the sentence, 0 = all weight on one piece). Returns {"nats", "share_of_uniform"}."""
    model.eval()
    nats, share, count = 0.0, 0.0, 0
    for batch in make_loader(pairs, batch_size, shuffle=False):
        batch = batch.to(model_device(model))
        _, w = model(batch.src, batch.src_mask, batch.tgt_in, return_attention=True)  # (B, T, S)
        h = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (B, T)
        log_s = batch.src_mask.sum(1, keepdim=True).float().log().clamp_min(1e-12)  # (B, 1)
        real = batch.tgt_out != PAD_ID  # (B, T)
        nats += float(h[real].sum())
        share += float((h / log_s)[real].sum())
        count += int(real.sum())
    return {"nats": nats / count, "share_of_uniform": share / count}


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def translate(model: nn.Module, pairs, tgt_tok: BPETokenizer, beam_size: int = 1,
              batch_size: int = 200, max_len: int = 60, alpha: float = 1.0,
              precision: str = "fp32") -> list[str]:
    """Detokenized translations of the sources of `pairs` (id lists), in their order.

    beam_size 1 is batched greedy decoding; larger beams use length-normalized beam search.
    """
    model.eval()
    device = model_device(model)
    collate, hyps = TranslationCollate(), []
    for i in range(0, len(pairs), batch_size):
        batch = collate(pairs[i: i + batch_size]).to(device)
        prefix = torch.full((batch.src.shape[0], 1), SOS_ID, dtype=torch.long, device=device)
        with autocast(model, precision):
            state = model.start(batch.src, batch.src_mask)
            if beam_size == 1:
                out = greedy_decode(model.step, prefix, state, max_len, eos_id=EOS_ID)[:, 1:]
                hyps += [ids_to_text(row, tgt_tok) for row in out.tolist()]
            else:
                beams = beam_search(model.step, prefix, state, max_len, EOS_ID, beam_size, alpha)
                hyps += [ids_to_text(b[0].tokens, tgt_tok) for b in beams]
    return hyps


def bleu_scores(hyps: list[str], refs: list[str]) -> dict[str, BLEUResult]:
    """BLEU with notebook 02's `corpus_bleu` after sacreBLEU's 13a tokenization.

    "bleu": sacreBLEU's default (cased, detokenized input, 13a), the headline;
    "bleu_lc": the same, lowercased, like scores computed on lowercased tokenized text.
    """
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok = Tokenizer13a()
    refs_tok = [[tok(r)] for r in refs]
    cased = corpus_bleu([tok(h) for h in hyps], refs_tok)
    lower = corpus_bleu([tok(h).lower() for h in hyps], [[r[0].lower()] for r in refs_tok])
    return {"bleu": cased, "bleu_lc": lower}


BLEU_SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"  # sacreBLEU's default BLEU


def evaluate_translation(model: nn.Module, data: TranslationData, split: str = "test",
                         beam_size: int = 1, batch_size: int = 200, alpha: float = 1.0,
                         precision: str = "fp32", verbose: bool = True) -> dict:
    """BLEU (headline and lowercased) of decoded `split`, and its teacher-forced perplexity.

    Returns {"bleu", "bleu_lc", "ppl", "hyps"}; BLEU on the 0-100 scale.
    """
    pairs, refs = data.ids[split], [t for _, t in data.raw[split]]
    hyps = translate(model, pairs, data.tgt_tok, beam_size, batch_size, alpha=alpha,
                     precision=precision)
    scores = bleu_scores(hyps, refs)
    ppl = split_perplexity(model, pairs, batch_size, precision)
    if verbose:
        print(f"{split}: BLEU {scores['bleu'].score:.2f} ({BLEU_SIGNATURE}) | lowercased "
              f"{scores['bleu_lc'].score:.2f} | perplexity {ppl:.2f} | beam {beam_size}")
    return {"bleu": scores["bleu"].score, "bleu_lc": scores["bleu_lc"].score, "ppl": ppl,
            "hyps": hyps}


def split_perplexity(model: nn.Module, pairs, batch_size: int = 200,
                     precision: str = "fp32") -> float:
    """exp(mean nll per target subword, <eos> included) under teacher forcing."""
    loader = make_loader(pairs, batch_size, shuffle=False)
    mean_nll = evaluate(model, loader, make_step(), precision)["loss"]  # token-weighted mean
    return perplexity(mean_nll, 1)



# ---------------------------------------------------------------------------- reading cross-attention
def is_punctuation(piece: str) -> bool:
    """True for a piece made only of punctuation or symbol characters once the word marker "▁"
    is dropped: ".", ",", "-", "'", "▁(" (Unicode categories P* and S*)."""
    text = piece.replace("▁", "")
    return bool(text) and all(unicodedata.category(c)[0] in "PS" for c in text)


def piece_words(ids, tok: BPETokenizer) -> list[tuple[str, list[int]]]:
    """The whole words of a piece sequence: [(word, positions of its pieces)]. A piece that
    starts with "▁" opens a word and the pieces after it continue it; punctuation pieces and
    specials belong to no word: ["▁Schne", "em", "obil", "."] -> [("Schneemobil", [0, 1, 2])]."""
    words, open_word = [], False
    for pos, i in enumerate(ids):
        piece = tok.id_to_token(i)
        if i < len(SPECIALS) or is_punctuation(piece):
            open_word = False
        elif piece.startswith("▁") or not open_word:
            words.append((piece.lstrip("▁"), [pos]))
            open_word = True
        else:
            words[-1] = (words[-1][0] + piece, words[-1][1] + [pos])
    return [(w, pos) for w, pos in words if w]  # a lone "▁" before punctuation is no word


def translation_lexicon(pairs, tok: BPETokenizer, min_count: int = 20, min_dice: float = 0.5,
                        skip_frequent: int = 50) -> dict[str, str]:
    """Word pairs the parallel data make obvious: {source word: target word}, lowercased.

    Over the sentence pairs of `pairs` (pass the TRAINING split), every source word seen in at
    least `min_count` of them gets the target word with the highest Dice coefficient
    2 c(s, t) / (c(s) + c(t)) (c counts sentence pairs), kept if it reaches `min_dice`. Target
    words among the `skip_frequent` most common ("a", "in", "man", ...) and one-letter words are
    left out: they occur several times or everywhere, so they make poor alignment points.
    """
    c_src, c_tgt, c_pair = collections.Counter(), collections.Counter(), collections.Counter()
    for src, tgt in pairs:
        s = {w.lower() for w, _ in piece_words(src, tok) if len(w) > 1}
        t = {w.lower() for w, _ in piece_words(tgt, tok) if len(w) > 1}
        c_src.update(s)
        c_tgt.update(t)
        c_pair.update((a, b) for a in s for b in t)
    skip = {w for w, _ in c_tgt.most_common(skip_frequent)}
    best = {}  # source word -> (dice, target word)
    for (a, b), n in c_pair.items():
        if c_src[a] >= min_count and b not in skip:
            dice = 2 * n / (c_src[a] + c_tgt[b])
            if dice > best.get(a, (0.0, ""))[0]:
                best[a] = (dice, b)
    return {a: b for a, (dice, b) in best.items() if dice >= min_dice}


def word_alignments(src_ids, tgt_ids, tok: BPETokenizer, lexicon: dict[str, str]) -> list[tuple]:
    """Whole-word alignment points of one sentence pair: [(target piece positions, source word
    index)], with the source's words from `piece_words`. A target word is aligned to a source
    word when both occur once in their sentence and the pair is in `lexicon` (lowercased) or
    the two are the same name or number (identical, with a digit or a capital letter, neither
    at the start of its sentence: "Boston", "2"). Target words with no such partner, or with
    two candidates, are left out."""
    src, tgt = piece_words(src_ids, tok), piece_words(tgt_ids, tok)
    n_src = collections.Counter(w.lower() for w, _ in src)
    n_tgt = collections.Counter(w.lower() for w, _ in tgt)

    def partner(j, v, i, w):
        if len(w) < 2 or n_src[w.lower()] != 1:
            return False
        name = w == v and i > 0 and j > 0 and any(c.isdigit() or c.isupper() for c in w)
        return name or lexicon.get(w.lower()) == v.lower()

    points = []
    for j, (v, tgt_pos) in enumerate(tgt):
        if n_tgt[v.lower()] == 1:
            found = [i for i, (w, _) in enumerate(src) if partner(j, v, i, w)]
            if len(found) == 1:
                points.append((tgt_pos, found[0]))
    return points


@torch.no_grad()
def cross_attention_stats(model: nn.Module, pairs, tok: BPETokenizer, lexicon: dict[str, str],
                          batch_size: int = 100) -> dict:
    """How each cross-attention head spends its weight, teacher-forced on the targets of `pairs`.

    model: a `utils.transformer.Transformer` (its `decode` returns the maps). For every aligned
    word pair of `word_alignments`, the rows of the target word's pieces (the positions that
    predict them) are averaged and their weight summed over each source word's pieces. Returns,
    on the CPU: "weight" (L, nh) mean weight on the aligned source word; "hit" (L, nh) share of
    aligned words whose most-weighted source word is the aligned one; "weight_reading" and
    "hit_reading", the same for the rows one later (those that READ the word's pieces);
    "chance_weight", the weight uniform attention gives the aligned word, and "chance_hit",
    the hit rate of a random source word; "diagonal_hit", that of the source word at the
    target word's relative position (a monotone guess); "points" the number of aligned words;
    "last" (L, nh) mean weight on the last source piece and "entropy" (L, nh) mean entropy
    (nats), both over all real target positions; "rows" their number.
    """
    model.eval()
    device = model_device(model)
    total = collections.defaultdict(float)
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i: i + batch_size]
        bt = TranslationCollate()(chunk).to(device)
        memory = model.encode(bt.src, bt.src_mask)[0]  # (B, S, E)
        maps = model.decode(bt.tgt_in, memory, bt.src_mask, need_weights=True)[1]["cross"]
        W = torch.stack(maps).float().cpu()  # (L, B, nh, T, S)
        real = (bt.tgt_out != PAD_ID).cpu()  # (B, T)
        n_src = bt.src_mask.sum(1).cpu()  # (B,)
        last = F.one_hot(n_src - 1, W.shape[-1]).to(W.dtype)  # (B, S)
        total["last"] = total["last"] + ((W * last[None, :, None, None]).sum(-1) * real[None, :, None]).sum((1, 3))
        entropy = -(W.clamp_min(1e-9).log() * W).sum(-1)  # (L, B, nh, T)
        total["entropy"] = total["entropy"] + (entropy * real[None, :, None]).sum((1, 3))
        total["rows"] += int(real.sum())
        for b, (src_ids, tgt_ids) in enumerate(chunk):
            words = [pos for _, pos in piece_words(src_ids, tok)]
            centres = torch.tensor([(sum(pos) / len(pos) + 0.5) / int(n_src[b]) for pos in words])
            for tgt_pos, k in word_alignments(src_ids, tgt_ids, tok, lexicon):
                # rows that predict the word's pieces, and the rows one later that read them
                for key, at in (("", tgt_pos), ("_reading", [p + 1 for p in tgt_pos])):
                    rows = W[:, b, :, at].mean(2)  # (L, nh, S): the target word's mean row
                    per_word = torch.stack([rows[..., pos].sum(-1) for pos in words], -1)  # (L, nh, words)
                    total["weight" + key] = total["weight" + key] + per_word[..., k]
                    total["hit" + key] = total["hit" + key] + (per_word.argmax(-1) == k).float()
                where = (sum(tgt_pos) / len(tgt_pos) + 0.5) / len(tgt_ids)  # the word's relative position
                total["diagonal_hit"] += int((centres - where).abs().argmin()) == k
                total["chance_weight"] += len(words[k]) / int(n_src[b])
                total["chance_hit"] += 1 / len(words)
                total["points"] += 1
    points, rows = max(total["points"], 1), total["rows"]
    return {"weight": total["weight"] / points, "hit": total["hit"] / points,
            "weight_reading": total["weight_reading"] / points, "hit_reading": total["hit_reading"] / points,
            "chance_weight": total["chance_weight"] / points, "chance_hit": total["chance_hit"] / points,
            "diagonal_hit": total["diagonal_hit"] / points,
            "points": int(total["points"]), "last": total["last"] / rows, "entropy": total["entropy"] / rows,
            "rows": int(rows)}
