"""Tokenizers, the vocabulary, and batching of variable-length sequences.

Shapes: B batch, T sequence length. Everything is batch-first.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

PAD, UNK, SOS, EOS = "<pad>", "<unk>", "<sos>", "<eos>"
SPECIALS = (PAD, UNK, SOS, EOS)  # indices 0, 1, 2, 3 in every Vocab

# ---------------------------------------------------------------------------- tokenizers
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
# a word (letters/digits, with inner apostrophes such as "don't") or one punctuation mark
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*|[^\w\s]|_")


def char_tokenize(text: str) -> list[str]:
    """Every character is a token, spaces and newlines included."""
    return list(text)


def clean_review(text: str) -> str:
    """IMDB reviews carry HTML line breaks (`<br />`); turn them into spaces."""
    return _BR.sub(" ", text)


def word_tokenize(text: str, lower: bool = True) -> list[str]:
    """English word tokenizer for reviews: strip `<br />`, lowercase, split off punctuation.

    >>> word_tokenize("Great film!<br /><br />Don't miss it.")
    ['great', 'film', '!', "don't", 'miss', 'it', '.']
    """
    text = clean_review(text)
    return _WORD.findall(text.lower() if lower else text)


def merge_pair(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """Replace every left-to-right occurrence of `pair` in `symbols` by its concatenation."""
    out, i = [], 0
    while i < len(symbols):
        if symbols[i:i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def learn_bpe_merges(word_counts: dict[str, int], n_merges: int) -> list[tuple[str, str]]:
    """Byte-pair encoding's training loop (Sennrich et al. 2016), over a {word: count} table.

    Start from characters; `n_merges` times, count every adjacent pair of symbols (weighted by
    the word's count), merge the most frequent pair everywhere, and record it. Ties go to the
    pair whose symbols were created first (characters in sorted order, then merges in order),
    which is the rule Hugging Face `tokenizers` uses, so the two learn the same merges.
    """
    words = {tuple(w): c for w, c in word_counts.items()}  # each word as a tuple of symbols
    created = {ch: i for i, ch in enumerate(sorted({ch for w in word_counts for ch in w}))}
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for symbols, count in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += count
        if not pairs:  # every word is a single symbol: nothing left to merge
            break
        best = max(pairs, key=lambda p: (pairs[p], -created[p[0]], -created[p[1]]))
        merges.append(best)
        created.setdefault(best[0] + best[1], len(created))
        words = {merge_pair(symbols, best): count for symbols, count in words.items()}
    return merges


class BPETokenizer:
    """Byte-pair encoding (Sennrich et al. 2016) trained with Hugging Face `tokenizers`.

    Text is cleaned and lowercased like `word_tokenize`, split on whitespace and punctuation,
    then each word is split into learned subword units; continuation pieces start with `##`
    so `decode` can rejoin them. Characters never seen in training become `<unk>`.
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer  # a tokenizers.Tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token=UNK, continuing_subword_prefix="##"))
        tok.normalizer = normalizers.Sequence(
            [normalizers.Replace(_BR.pattern, " "), normalizers.Lowercase()]
        )
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
        )
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS),
            continuing_subword_prefix="##", show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def tokenize(self, text: str) -> list[str]:
        return self._tok.encode(text).tokens

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))

    def id_to_token(self, i: int) -> str:
        """The piece with id `i` as the vocabulary stores it (continuation or word markers kept)."""
        piece = self._tok.id_to_token(int(i))
        if piece is None:
            raise IndexError(f"token id {i} is outside the vocabulary of {self.vocab_size} pieces")
        return piece

    def vocab(self) -> dict[str, int]:
        """piece -> id for the whole vocabulary, specials included."""
        return self._tok.get_vocab()

    def save(self, path: str | Path) -> None:
        self._tok.save(str(path))

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))


# ---------------------------------------------------------------------------- vocabulary
class Vocab:
    """Token <-> index table: specials first, then tokens by falling frequency.

    Ties in frequency are broken alphabetically so the same corpus always gives the same ids.
    Tokens outside the table encode to `<unk>`.
    """

    def __init__(self, itos: Sequence[str], counts: Counter | None = None) -> None:
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a Vocab must start with the specials {SPECIALS}, got {itos[:4]}")
        if len(set(itos)) != len(itos):
            raise ValueError("a Vocab must not list a token twice")
        self.itos = list(itos)
        self.stoi = {tok: i for i, tok in enumerate(self.itos)}
        self.counts = counts or Counter()  # training-corpus counts, for Zipf and coverage plots

    @classmethod
    def build(
        cls, token_lists: Iterable[Sequence[str]], max_size: int | None = None, min_freq: int = 1
    ) -> Vocab:
        """Count tokens; keep those seen `min_freq`+ times, at most `max_size` (specials excluded)."""
        counts = Counter(tok for tokens in token_lists for tok in tokens)
        for special in SPECIALS:
            counts.pop(special, None)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = [tok for tok, c in ranked if c >= min_freq][:max_size]
        return cls(list(SPECIALS) + kept, counts)

    pad_id, unk_id, sos_id, eos_id = 0, 1, 2, 3

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def encode(self, tokens: Sequence[str], add_sos_eos: bool = False) -> list[int]:
        ids = [self.stoi.get(tok, self.unk_id) for tok in tokens]
        return [self.sos_id, *ids, self.eos_id] if add_sos_eos else ids

    def decode(self, ids: Iterable[int], skip_specials: bool = False) -> list[str]:
        ids = [int(i) for i in ids]
        tokens = [self.itos[i] for i in ids]
        if skip_specials:
            tokens = [t for t in tokens if t not in (PAD, SOS, EOS)]
        return tokens

    def save(self, path: str | Path) -> None:
        # UTF-8 whatever the locale: a vocabulary saved on one machine must load on another
        Path(path).write_text(json.dumps({"itos": self.itos}, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        return cls(json.loads(Path(path).read_text(encoding="utf-8"))["itos"])


# ---------------------------------------------------------------------------- batching
@dataclass
class Batch:
    """A padded batch. `mask` is True on real tokens, False on padding."""

    tokens: torch.Tensor  # (B, T) int64
    lengths: torch.Tensor  # (B,) int64, real lengths after truncation
    mask: torch.Tensor  # (B, T) bool
    labels: torch.Tensor | None = None  # (B,) int64, when the examples carry labels

    def to(self, device) -> Batch:
        labels = None if self.labels is None else self.labels.to(device)
        return Batch(self.tokens.to(device), self.lengths.to(device), self.mask.to(device), labels)


class PadCollate:
    """DataLoader `collate_fn`: pad each batch to its longest sequence (or to `fixed_len`).

    Examples are id sequences, or (ids, label) pairs. With `fixed_len`, longer sequences are
    truncated and every batch has exactly `fixed_len` columns (the torchtext `fix_length` setup).
    """

    def __init__(self, pad_id: int = 0, fixed_len: int | None = None) -> None:
        if fixed_len is not None and fixed_len <= 0:
            raise ValueError(f"fixed_len must be positive, got {fixed_len}")
        self.pad_id, self.fixed_len = pad_id, fixed_len

    def __call__(self, examples: Sequence) -> Batch:
        if len(examples) == 0:
            raise ValueError("cannot collate an empty batch")
        labeled = isinstance(examples[0], tuple)
        seqs = [ex[0] if labeled else ex for ex in examples]
        if self.fixed_len is not None:
            seqs = [s[: self.fixed_len] for s in seqs]
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)  # (B,)
        T = self.fixed_len or int(lengths.max())
        tokens = torch.full((len(seqs), T), self.pad_id, dtype=torch.long)  # (B, T)
        for i, s in enumerate(seqs):
            tokens[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
        labels = torch.tensor([ex[1] for ex in examples], dtype=torch.long) if labeled else None
        return Batch(tokens, lengths, mask, labels)


class BucketBatchSampler(torch.utils.data.Sampler):
    """Batches of similar length, so little padding is needed.

    Shuffle the indices, cut them into pools of `pool_batches` batches, sort each pool by
    length, cut it into batches, then shuffle the batches. Randomness stays (different
    neighbours each epoch) while each batch holds sequences of nearly equal length.
    """

    def __init__(
        self, lengths: Sequence[int], batch_size: int, shuffle: bool = True,
        pool_batches: int = 50, seed: int = 0, drop_last: bool = False,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.lengths = np.asarray(lengths)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.pool = batch_size * pool_batches
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self.lengths)
        order = self.rng.permutation(n) if self.shuffle else np.arange(n)
        batches = []
        for start in range(0, n, self.pool):
            pool = order[start: start + self.pool]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            for b in range(0, len(pool), self.batch_size):
                batch = pool[b: b + self.batch_size].tolist()
                if len(batch) == self.batch_size or not self.drop_last:
                    batches.append(batch)
        if self.shuffle:
            batches = [batches[i] for i in self.rng.permutation(len(batches))]
        yield from batches

    def __len__(self) -> int:
        n, pool = len(self.lengths), self.pool
        full, rest = divmod(n, pool)
        per_pool = pool // self.batch_size if self.drop_last else -(-pool // self.batch_size)
        last = rest // self.batch_size if self.drop_last else -(-rest // self.batch_size)
        return full * per_pool + last


# ---------------------------------------------------------------------------- a token stream in random windows
def random_windows(ids: torch.Tensor, block_size: int, batch_size: int,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """B random windows of the token stream `ids` (N,) and their targets, shifted by one.

    -> x (B, T), y (B, T) with y[b, t] = x[b, t + 1]: every position is a training example.
    """
    if len(ids) <= block_size:
        raise ValueError(f"need more than block_size={block_size} tokens, got {len(ids)}")
    start = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(block_size + 1)  # (T + 1,)
    chunk = ids[start[:, None] + offsets]  # (B, T + 1)
    return chunk[:, :-1], chunk[:, 1:]  # (B, T), (B, T)


def random_batches(ids: torch.Tensor, block_size: int, batch_size: int, generator: torch.Generator):
    """Endless `random_windows` batches (x, y) of the token stream `ids`, drawn with `generator`."""
    while True:
        yield random_windows(ids, block_size, batch_size, generator)  # (B, T), (B, T)
