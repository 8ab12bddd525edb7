"""Text classifiers for IMDB sentiment (notebook 06), one calling convention for all.

Every sequence classifier here is called the same way:

    logits = model(tokens, lengths)      tokens (B, T) int64, padded with id 0 on the right
                                         lengths (B,) int64, the real lengths (>= 1)
                                         logits (B, C) float

so one training step (`classify_step`) and one evaluation (`predict`) serve them all, and
notebook 09 plugs its transformer classifier into the same slot. Padding never changes the
logits: every model either packs its input (recurrent), averages or max-pools over real
positions only (bag of embeddings, CNN), or reads the last *real* position. The one exception
is the seed tutorial's mistake, kept as `RecurrentClassifier(read="padded_last")` so its cost
can be measured. `EmbeddingMLP` is a head over precomputed sentence vectors: `model(x (B, D))`.

The zoo: `BagOfEmbeddings` (mean pooling, or no pooling: the last token's own prediction),
`FastText` (words + hashed bigrams), `RecurrentClassifier` (LSTM / GRU / BiLSTM, packed),
`TextCNN` (n-gram filters + global max pooling), `EmbeddingMLP`. Helpers: `length_mask`,
`classify_step`, `predict`, `accuracy`, `fit_classifier`, `classification_metrics`, `split_indices`, `fraction_of`.
Bookkeeping of the choices made on validation: `tune` (a grid grown at its edge, one line per
choice), `tune_tfidf_lr` (the linear baseline's row), `macs_per_review` (notebook 09's count).

Shapes: B batch, T tokens, V vocabulary, E embedding width, H hidden width, C classes,
F filters per width, D sentence-vector width.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from utils.compare import improves
from utils.gated import OPEN_GATE_BIAS, open_gates_
from utils.schedules import warmup_cosine
from utils.train import choose_rate, fit, model_device, to_device
from utils.transformer import POSITIONS, Encoder, EncoderConfig, LayerNorm, make_positions

PAD_ID = 0  # utils.text.Vocab puts <pad> at index 0


def length_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) bool, True on real tokens; built on `lengths`' device (meta/CUDA safe)."""
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)


def _check_inputs(tokens: torch.Tensor, lengths: torch.Tensor) -> None:
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (B, T) ids, got shape {tuple(tokens.shape)}")
    if lengths.shape != tokens.shape[:1]:
        raise ValueError(f"lengths must be (B,) = ({tokens.shape[0]},), got {tuple(lengths.shape)}")


# ---------------------------------------------------------------------------- bags of words
class BagOfEmbeddings(nn.Module):
    """Neural bag of words: embed every token, average over the real ones, one linear layer.

    s = (1/L) sum_{t < L} e(x_t),  logits = dropout(s) W + b.
    `pool="none"` is the ablation without pooling: the same embedding and linear layer give
    every token its own logits (`token_logits`, trained with `every_token_step`, as the seed's
    model does), and `forward` judges the review by its last real token alone.
    """

    def __init__(self, vocab_size: int, E: int, C: int = 2, pool: str = "mean",
                 dropout: float = 0.0, sparse: bool = False):
        super().__init__()
        if pool not in ("mean", "none"):
            raise ValueError(f"pool must be 'mean' or 'none', got {pool!r}")
        self.pool = pool
        # sparse=True: the gradient touches only the rows a batch used (optimizers that take
        # sparse gradients: SGD, Adagrad, SparseAdam), which matters for a million-row table
        self.embedding = nn.Embedding(vocab_size, E, padding_idx=PAD_ID, sparse=sparse)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(E, C)

    def token_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every token's own prediction, no pooling: (B, T) -> (B, T, C)."""
        return self.head(self.dropout(self.embedding(tokens)))  # (B, T, C)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        _check_inputs(tokens, lengths)
        B, T = tokens.shape
        if self.pool == "none":  # logits of every token; keep the last real one
            return self.token_logits(tokens)[torch.arange(B, device=tokens.device), lengths - 1]  # (B, C)
        e = self.embedding(tokens)  # (B, T, E)
        mask = length_mask(lengths, T)  # (B, T)
        s = (e * mask[..., None]).sum(1) / lengths[:, None].to(e.dtype)  # (B, E)
        return self.head(self.dropout(s))  # (B, C)


class FastText(BagOfEmbeddings):
    """fastText (Joulin et al. 2017): a bag of words *and* of word bigrams, hashed into buckets.

    Bigram (a, b) gets row V + hash(a, b) mod n_buckets of the same embedding table, so word
    order enters locally without a bigram vocabulary. The mean runs over the L words and the
    L - 1 bigrams of each review.
    """

    def __init__(self, vocab_size: int, E: int, C: int = 2, n_buckets: int = 2**20,
                 dropout: float = 0.0, sparse: bool = True):
        super().__init__(vocab_size + n_buckets, E, C, "mean", dropout, sparse)
        self.vocab_size, self.n_buckets = vocab_size, n_buckets

    def bigram_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T - 1) ids of the bigrams (x_t, x_{t+1}) in [V, V + n_buckets)."""
        a, b = tokens[:, :-1], tokens[:, 1:]  # (B, T - 1) each
        h = (a * 1_000_003 + b * 7_919) % self.n_buckets  # (B, T - 1), a cheap mixing hash
        return self.vocab_size + h  # (B, T - 1)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        _check_inputs(tokens, lengths)
        T = tokens.shape[1]
        grams = torch.cat([tokens, self.bigram_ids(tokens)], dim=1)  # (B, 2T - 1)
        mask = torch.cat([length_mask(lengths, T), length_mask(lengths - 1, T - 1)], 1)  # (B, 2T-1)
        e = self.embedding(grams)  # (B, 2T - 1, E)
        s = (e * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).to(e.dtype)  # (B, E)
        return self.head(self.dropout(s))  # (B, C)


# ---------------------------------------------------------------------------- n-gram bag
def log_count_ratio(X, y, alpha: float = 1.0) -> torch.Tensor:
    """Naive Bayes log-count ratios of binary n-gram features (Wang & Manning 2012):
    r_j = log( (p_j / |p|_1) / (q_j / |q|_1) ), p = alpha + counts in positive reviews,
    q = alpha + counts in negative ones. X: scipy sparse (N, F) of 0/1, y: (N,) -> r (F,).
    A feature's r says how much more often it occurs in positive than in negative reviews."""
    X, y = X.tocsr(), np.asarray(y)
    p = alpha + np.asarray(X[y == 1].sum(0)).ravel()  # (F,)
    q = alpha + np.asarray(X[y == 0].sum(0)).ravel()  # (F,)
    return torch.as_tensor(np.log((p / p.sum()) / (q / q.sum())), dtype=torch.float32)  # (F,)


class NBWeightedBag(nn.Module):
    """A bag of n-grams whose features are scaled by their log-count ratios: NBSVM's features
    (Wang & Manning 2012) under a trainable linear layer, run as an `nn.EmbeddingBag`.

    logits_c = sum over the review's n-grams j of r_j W[j, c] + b_c. The ratios r are fixed
    (computed on the training split); W starts at zero. Inputs are a review's feature ids,
    flattened, with `offsets` marking where each review starts (`sparse_batches`).
    """

    def __init__(self, r: torch.Tensor, C: int = 2) -> None:
        super().__init__()
        self.register_buffer("r", r)  # (F,)
        self.bag = nn.EmbeddingBag(len(r), C, mode="sum")
        nn.init.zeros_(self.bag.weight)
        self.bias = nn.Parameter(torch.zeros(C))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.bag(ids, offsets, per_sample_weights=self.r[ids]) + self.bias  # (B, C)


class SparseBatches:
    """Batches of rows of a scipy CSR matrix as (ids, offsets, labels), re-shuffled each epoch;
    `len()` is the number of batches, so `fit` can count epochs."""

    def __init__(self, X, y, batch_size: int, shuffle: bool, seed: int = 0) -> None:
        self.X, self.y, self.batch_size, self.shuffle = X.tocsr(), np.asarray(y), batch_size, shuffle
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return -(-self.X.shape[0] // self.batch_size)

    def __iter__(self):
        order = self.rng.permutation(self.X.shape[0]) if self.shuffle else np.arange(self.X.shape[0])
        for i in range(0, len(order), self.batch_size):
            rows = self.X[order[i:i + self.batch_size]]
            yield (torch.as_tensor(rows.indices, dtype=torch.long),  # (nnz,) feature ids
                   torch.as_tensor(rows.indptr[:-1], dtype=torch.long),  # (B,) where each row starts
                   torch.as_tensor(self.y[order[i:i + self.batch_size]], dtype=torch.long))  # (B,)


def bag_step(model: nn.Module, batch) -> dict:
    """`fit` step for `NBWeightedBag` on `SparseBatches`: loss, n, acc."""
    ids, offsets, labels = to_device(batch, model_device(model))
    logits = model(ids, offsets)  # (B, C)
    return {"loss": F.cross_entropy(logits, labels), "n": len(labels),
            "acc": (logits.argmax(-1) == labels).float().mean()}


# ---------------------------------------------------------------------------- recurrent
class RecurrentClassifier(nn.Module):
    """Embedding -> LSTM / GRU (optionally bidirectional) over a *packed* batch -> linear head.

    Packing makes the layer stop at each review's own length, so h_n is the state after the
    last real token: for a BiLSTM, h_n[-2] is the forward direction after token L and h_n[-1]
    the backward direction after reading back to token 1; we concatenate them (B, 2H).
    `forget_bias` opens the "keep" gate at the start, at the course's `OPEN_GATE_BIAS` (2, as in
    notebooks 04 and 05): the LSTM's forget gate, or the GRU's update gate
    (`utils.gated.open_gates_`); None keeps torch's init.
    `read="gather"` runs the layer over the padded batch and reads each row at its own last
    real token, out[b, L_b - 1]: the same state as packing for a one-directional layer (the
    pads come after it), without packing's bookkeeping. `read="padded_last"` is the seed
    tutorial's classifier: no packing, read out[:, -1], which for every review shorter than the
    batch is the state after a run of <pad> tokens.
    """

    def __init__(self, vocab_size: int, E: int, H: int, C: int = 2, cell: str = "lstm",
                 bidirectional: bool = False, dropout: float = 0.0,
                 forget_bias: float | None = OPEN_GATE_BIAS, read: str = "final"):
        super().__init__()
        if cell not in ("lstm", "gru"):
            raise ValueError(f"cell must be 'lstm' or 'gru', got {cell!r}")
        if read not in ("final", "gather", "padded_last"):
            raise ValueError(f"read must be 'final', 'gather' or 'padded_last', got {read!r}")
        if read == "gather" and bidirectional:
            raise ValueError("read='gather' is for one direction: a backward pass over a padded "
                             "batch starts on the pads; use read='final' (packing)")
        self.cell, self.read = cell, read
        self.embedding = nn.Embedding(vocab_size, E, padding_idx=PAD_ID)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(E, H, batch_first=True, bidirectional=bidirectional)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(H * (2 if bidirectional else 1), C)
        if forget_bias is not None:
            open_gates_(self.rnn, forget_bias)  # the keep gate starts open (notebook 05)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        _check_inputs(tokens, lengths)
        e = self.dropout(self.embedding(tokens))  # (B, T, E)
        if self.read == "padded_last":  # the bug, kept to measure it
            out, _ = self.rnn(e)  # (B, T, H * dirs), pads included
            return self.head(self.dropout(out[:, -1]))  # (B, C)
        if self.read == "gather":  # the pads come after the last real token: read there
            out, _ = self.rnn(e)  # (B, T, H)
            last = out[torch.arange(len(lengths), device=out.device), lengths - 1]  # (B, H)
            return self.head(self.dropout(last))  # (B, C)
        # torch wants the lengths on the CPU for packing, whatever the device of the data
        packed = pack_padded_sequence(e, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.rnn(packed)  # LSTM: (h_n, c_n); h_n: (layers * dirs, B, H)
        h_n = h_n[0] if self.cell == "lstm" else h_n
        if self.rnn.bidirectional:
            h = torch.cat([h_n[-2], h_n[-1]], dim=-1)  # (B, 2H): forward end, backward end
        else:
            h = h_n[-1]  # (B, H)
        return self.head(self.dropout(h))  # (B, C)


# ---------------------------------------------------------------------------- convolution
class TextCNN(nn.Module):
    """Kim (2014): filters over k consecutive embeddings for several widths k, max over time.

    c_{t} = relu(W_k [e_t; ...; e_{t+k-1}] + b_k) for windows that start on a real token,
    z = concat_k max_t c_t (B, F * len(widths)), logits = dropout(z) W + b. The <pad>
    embedding is zero, so a window that runs past the end sees zeros however much padding
    follows, and windows starting on padding are masked out: padding cannot change the logits.
    """

    def __init__(self, vocab_size: int, E: int, C: int = 2, widths: tuple[int, ...] = (3, 4, 5),
                 n_filters: int = 100, dropout: float = 0.5):
        super().__init__()
        assert len(widths) > 0 and min(widths) > 0, "need at least one positive filter width"
        self.widths = tuple(widths)
        self.embedding = nn.Embedding(vocab_size, E, padding_idx=PAD_ID)
        self.convs = nn.ModuleList(nn.Conv1d(E, n_filters, k) for k in self.widths)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(n_filters * len(self.widths), C)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        _check_inputs(tokens, lengths)
        T = tokens.shape[1]
        e = self.embedding(tokens).transpose(1, 2)  # (B, E, T): Conv1d wants channels first
        e = F.pad(e, (0, max(self.widths) - 1))  # (B, E, T + k_max - 1), zeros = <pad>
        starts_real = length_mask(lengths, T)[:, None, :]  # (B, 1, T)
        pooled = []
        for conv in self.convs:
            c = F.relu(conv(e))[..., :T]  # (B, F, T): one value per window start
            pooled.append(c.masked_fill(~starts_real, 0.0).amax(dim=-1))  # (B, F); relu >= 0
        return self.head(self.dropout(torch.cat(pooled, dim=-1)))  # (B, C)


# ---------------------------------------------------------------------------- sentence vectors
class EmbeddingMLP(nn.Module):
    """A small MLP over frozen sentence vectors: x (B, D) -> logits (B, C)."""

    def __init__(self, D: int, hidden: int = 256, C: int = 2, dropout: float = 0.2):
        super().__init__()
        self.net = nn.Sequential(nn.Dropout(dropout), nn.Linear(D, hidden), nn.ReLU(),
                                 nn.Dropout(dropout), nn.Linear(hidden, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"x must be (B, D) sentence vectors, got shape {tuple(x.shape)}")
        return self.net(x)  # (B, C)


# ---------------------------------------------------------------------------- train / evaluate
def cut(ids: list[int], max_len: int | None, keep: str = "head") -> list[int]:
    """At most `max_len` tokens of a review: its first ("head"), its last ("tail"), or the first
    and last halves ("head+tail"; the middle is dropped). None keeps every token."""
    if keep not in ("head", "tail", "head+tail"):
        raise ValueError(f"keep must be 'head', 'tail' or 'head+tail', got {keep!r}")
    if max_len is None or len(ids) <= max_len:
        return ids
    if keep == "head":
        return ids[:max_len]
    if keep == "tail":
        return ids[-max_len:]
    return ids[: max_len - max_len // 2] + ids[len(ids) - max_len // 2:]


def make_loader(ids: list[list[int]], labels, batch_size: int, shuffle: bool,
                max_len: int | None = None, seed: int = 0, sort: bool = True, keep: str = "head"
                ) -> torch.utils.data.DataLoader:
    """Padded batches of (truncated) id lists with labels, built on utils.text.

    Keeps `max_len` tokens of each review, chosen by `keep` (`cut`: the first, the last, or the
    first and last halves). `shuffle=True` (training): batches of
    similar length from `BucketBatchSampler`, in random order. `shuffle=False` (evaluation):
    with `sort=True` the reviews are batched in order of length, so there is little padding,
    and `loader.order` records that order, which `predict` undoes; `sort=False` batches
    them in data order, as a plain DataLoader would (much padding).
    """
    from utils.text import BucketBatchSampler, PadCollate

    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} id lists but {len(labels)} labels")
    if any(len(x) == 0 for x in ids):
        raise ValueError("every example needs at least one token (an empty review?)")
    data = [(cut(x, max_len, keep), int(y)) for x, y in zip(ids, labels)]
    lengths = [len(x) for x, _ in data]
    if shuffle:
        sampler = BucketBatchSampler(lengths, batch_size, seed=seed)
    else:
        order = np.argsort(lengths, kind="stable") if sort else np.arange(len(data))
        sampler = [order[i:i + batch_size].tolist() for i in range(0, len(data), batch_size)]
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=PadCollate())
    loader.order = None if shuffle else order  # position k of the batches = example order[k]
    return loader


def classify_step(model: nn.Module, batch) -> dict:
    """`utils.train.fit` step for a `utils.text.Batch` with labels: loss, n, acc."""
    batch = batch.to(model_device(model))  # a no-op inside `fit`, which has moved it already
    logits = model(batch.tokens, batch.lengths)  # (B, C)
    loss = F.cross_entropy(logits.float(), batch.labels)  # the loss in float32
    acc = (logits.argmax(-1) == batch.labels).float().mean()
    return {"loss": loss, "n": len(batch.labels), "acc": acc}


def every_token_step(model: nn.Module, batch) -> dict:
    """`fit` step for `BagOfEmbeddings(pool="none")`: every real token predicts the review's
    label on its own (the seed's unpooled model); loss and accuracy are means over tokens."""
    batch = batch.to(model_device(model))
    logits = model.token_logits(batch.tokens)  # (B, T, C)
    labels = batch.labels[:, None].expand_as(batch.tokens)  # (B, T): the review's label everywhere
    logits, labels = logits[batch.mask], labels[batch.mask]  # (N, C), (N,) real tokens only
    return {"loss": F.cross_entropy(logits.float(), labels), "n": len(labels),
            "acc": (logits.argmax(-1) == labels).float().mean()}


def features_step(model: nn.Module, batch) -> dict:
    """`fit` step for (x (B, D), y (B,)) batches of precomputed sentence vectors."""
    x, y = to_device(batch, model_device(model))
    logits = model(x)  # (B, C)
    return {"loss": F.cross_entropy(logits, y), "n": len(y),
            "acc": (logits.argmax(-1) == y).float().mean()}


def tfidf_logistic_regression(C: float = 10.0, ngram_range: tuple[int, int] = (1, 2)):
    """The course's linear baseline (notebooks 06 and 09): TF-IDF of word 1- and 2-grams
    (sublinear tf, seen in at least 2 reviews) into logistic regression, as one scikit-learn
    pipeline; `ngram_range=(1, 3)` adds word triples. It reads reviews already tokenized and
    joined by spaces, so it sees the same words as the neural models:
    `fit([" ".join(tokens), ...], labels)`."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    lo, hi = ngram_range
    if not 1 <= lo <= hi:
        raise ValueError(f"ngram_range must be (lo, hi) with 1 <= lo <= hi, got {ngram_range!r}")
    return make_pipeline(TfidfVectorizer(ngram_range=(lo, hi), min_df=2, sublinear_tf=True, token_pattern=None,
                                         tokenizer=str.split, lowercase=False),
                         LogisticRegression(C=C, max_iter=1000))


def sparse_adagrad(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adagrad, which accepts the sparse embedding gradients of `FastText` (Adam does not).

    Each step then updates only the rows a batch used instead of the whole million-row table.
    torch checks sparse-tensor invariants only on request and warns that it skips them unless
    told; we opt out explicitly (the gradients come from torch's own embedding backward).
    """
    torch.sparse.check_sparse_tensor_invariants.disable()
    return torch.optim.Adagrad(model.parameters(), lr=lr)


@torch.no_grad()
def predict(model: nn.Module, loader) -> tuple[np.ndarray, np.ndarray]:
    """Positive-class probabilities (N,) and labels (N,), in the order of the loader's data
    (batches go to the model's device; the results come back to the CPU).

    A loader from `make_loader(shuffle=False)` may batch the examples by length; its `order`
    says how, and the outputs are put back into data order.
    """
    model.eval()
    probs, labels, device = [], [], model_device(model)
    for batch in loader:
        batch = batch.to(device)
        logits = model(batch.tokens, batch.lengths).float()  # (B, C)
        probs.append(logits.softmax(-1)[:, 1].cpu())
        labels.append(batch.labels.cpu())
    probs, labels = torch.cat(probs).numpy(), torch.cat(labels).numpy()  # (N,), (N,)
    order = getattr(loader, "order", None)
    if order is not None:  # undo the sort by length
        probs[order], labels[order] = probs.copy(), labels.copy()
    return probs, labels


def classification_metrics(y_true, y_pred) -> dict:
    """Accuracy, and precision / recall / F1 of the positive class (label 1), from counts.

    precision = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2 P R / (P + R) (their harmonic
    mean); a ratio with an empty denominator is 0, as in scikit-learn's `zero_division=0`.
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape or y_true.ndim != 1:
        raise ValueError(f"need two 1-D label arrays of equal length, got {y_true.shape}, "
                         f"{y_pred.shape}")
    tp = int(((y_pred == 1) & (y_true == 1)).sum())
    fp = int(((y_pred == 1) & (y_true != 1)).sum())
    fn = int(((y_pred != 1) & (y_true == 1)).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"acc": float((y_true == y_pred).mean()), "precision": precision, "recall": recall,
            "f1": f1}


# ---------------------------------------------------------------------------- leakage-safe splits
def split_indices(n: int, n_val: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle range(n) once and cut it: (train indices, validation indices), disjoint, sorted."""
    if not 0 < n_val < n:
        raise ValueError(f"need 0 < n_val < n, got n_val={n_val}, n={n}")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def fraction_of(train_idx: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """A seeded random `fraction` of the *training* indices (never the validation slice).

    Drawing from `train_idx` rather than from all of the data is what keeps a subset
    disjoint from the validation slice (the seed notebook's warned-about leak).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = max(1, round(len(train_idx) * fraction))
    return np.sort(np.random.default_rng(seed).choice(train_idx, size=k, replace=False))


# ---------------------------------------------------------------------------- transformer (09)


@dataclass(frozen=True)
class TransformerClassifierConfig:
    """A Transformer encoder classifier; the defaults are a small pre-LN model for IMDB."""

    vocab_size: int  # V, with <pad> = 0
    encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(
        d_model=64, n_heads=4, d_ff=256, n_layers=1, norm_first=True))
    C: int = 2  # classes
    positions: str = "sinusoidal"  # "sinusoidal" (fixed), "learned" or "none"
    max_len: int = 1024  # longest input the positions cover
    pool: str = "mean"  # "mean" or "max" over positions (real ones only if mask_padding)
    mask_padding: bool = True  # False: the seed's model, which attends to and pools over <pad>
    embed_norm: bool = False  # the seed's LayerNorm on embeddings + positions

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.pool not in ("mean", "max"):
            raise ValueError(f"pool must be 'mean' or 'max', got {self.pool!r}")


def macs_per_review(cfg: TransformerClassifierConfig, lengths, max_len: int, fixed: bool = False) -> float:
    """Multiply-adds of the classifier's encoder for one review, forward pass, averaged over the
    reviews whose token counts are `lengths` (N,) (notebook 09's tie-break: a count every device
    agrees on, not a prediction of seconds).

    Per block, for a review read as n tokens: 4 n E^2 (query, key, value and output projections)
    + 2 n E F (the feed-forward network) + 2 n^2 E (the scores Q K^T and the mix A V, all heads
    together), times n_layers. n = max_len for every review when batches are padded to a fixed
    length (`fixed`: pads are computed like words), else min(length, max_len). Embeddings,
    positions, norms, softmax, pooling and the head (E C) are left out.
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or len(lengths) == 0 or (lengths < 0).any() or max_len < 1:
        raise ValueError(f"need (N,) token counts >= 0, N >= 1, and max_len >= 1; got shape {lengths.shape}, "
                         f"max_len={max_len}")
    E, d_ff, n_layers = cfg.encoder.d_model, cfg.encoder.d_ff, cfg.encoder.n_layers
    n = np.full(len(lengths), max_len) if fixed else np.minimum(lengths, max_len)  # (N,) tokens read per review
    per_block = 4 * n * E**2 + 2 * n * E * d_ff + 2 * n.astype(float) ** 2 * E  # (N,)
    return float(n_layers * per_block.mean())


class TransformerClassifier(nn.Module):
    """Embed, add positions, run `utils.transformer.Encoder`, pool over positions, classify.

    logits = head(pool_t h_t) with h = Encoder(dropout(E[x] + PE)) (B, T, E). With
    `mask_padding=True` padded keys get zero attention and pooling skips padding, so padding
    never changes the logits; `mask_padding=False` is the seed tutorial's model (batches padded
    to a fixed length, <pad> attended to and max-pooled like any token).
    """

    def __init__(self, cfg: TransformerClassifierConfig) -> None:
        super().__init__()
        self.cfg, E = cfg, cfg.encoder.d_model
        self.embedding = nn.Embedding(cfg.vocab_size, E, padding_idx=PAD_ID)
        self.positions = make_positions(cfg.positions, E, cfg.max_len)  # adds PE or P to x
        self.embed_norm = LayerNorm(E) if cfg.embed_norm else nn.Identity()
        self.dropout = nn.Dropout(cfg.encoder.dropout)
        self.encoder = Encoder(cfg.encoder)
        self.head = nn.Linear(E, cfg.C)

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor, need_weights: bool = False):
        """-> (h (B, T, E), real-token mask (B, T) or None, per-block weights (B, nh, T, T))."""
        _check_inputs(tokens, lengths)
        mask = length_mask(lengths, tokens.shape[1]) if self.cfg.mask_padding else None  # (B, T)
        x = self.dropout(self.embed_norm(self.positions(self.embedding(tokens))))  # (B, T, E)
        h, maps = self.encoder(x, mask, need_weights)  # (B, T, E)
        return h, mask, maps

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h, mask, _ = self.encode(tokens, lengths)  # (B, T, E)
        if self.cfg.pool == "max":
            z = h if mask is None else h.masked_fill(~mask[..., None], float("-inf"))  # (B, T, E)
            z = z.amax(dim=1)  # (B, E)
        elif mask is None:
            z = h.mean(dim=1)  # (B, E)
        else:
            z = (h * mask[..., None]).sum(1) / lengths[:, None].to(h.dtype)  # (B, E)
        return self.head(z)  # (B, C)

    @torch.no_grad()
    def attention_maps(self, tokens: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every block, [(B, nh, T, T)] * n_layers, in eval mode."""
        was_training = self.training
        self.eval()
        maps = self.encode(tokens, lengths, need_weights=True)[2]
        self.train(was_training)
        return maps


def fit_classifier(model: nn.Module, train_dl, lr: float, *, epochs: int | None = None,
                   updates: int | None = None, seconds: float | None = None, warmup_steps: int = 0,
                   weight_decay: float = 0.01, val_dl=None, clip: float | None = 1.0,
                   precision: str = "fp32", constant_lr: bool = False, log_every: int | None = None) -> dict:
    """Train a `(tokens, lengths) -> logits` model with AdamW through `utils.train.fit`.

    The learning rate warms up over `warmup_steps` and follows a cosine to 0 over the budget
    (`constant_lr=True`: a constant rate, as in the seed). With `val_dl` the accuracy is
    measured after every epoch and at the end, and the best weights are kept.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    validate = None if val_dl is None else (lambda m: {"acc": accuracy(m, val_dl)})
    return fit(model, train_dl, classify_step, opt, epochs, updates=updates, seconds=seconds,
               schedule=None if constant_lr else warmup_cosine(warmup_steps), clip=clip,
               precision=precision, validate=validate,
               keep_best=("val_acc", "max") if val_dl is not None else None, log_every=log_every)


def accuracy(model: nn.Module, loader) -> float:
    """Share of the loader's examples whose positive-class probability is on the right side of 0.5."""
    probs, labels = predict(model, loader)
    return float(((probs > 0.5) == labels).mean())


# ---------------------------------------------------------------------------- choices on validation (06)
@dataclass(frozen=True)
class Tuned:
    """One value chosen on validation by `tune`; `print(tuned)` is its one-line report."""

    name: str  # what was tuned, e.g. "NBoW (mean pooling)"
    param: str  # the value's name in the report: "lr", "C"
    grid: tuple[float, ...]  # the grid as given, before any growth
    scores: dict[float, float]  # validation score per value tried, in increasing value order
    best: float  # the value chosen
    kept: object  # what the chosen value's trial returned beside its score (a model, a log, ...)
    seconds: float  # wall time of all the trials
    metric: str = "validation accuracy"
    notes: dict[float, str] = field(default_factory=dict)  # per value, what its trial said beside the score

    @property
    def score(self) -> float:
        return self.scores[self.best]

    @property
    def grown(self) -> bool:  # did a winner at the edge send the search further out?
        return len(self.scores) > len(self.grid)

    @property
    def at_edge(self) -> bool:  # is the chosen value still the smallest or largest one tried?
        return len(self.scores) > 1 and self.best in (min(self.scores), max(self.scores))

    def __str__(self) -> str:
        per = ", ".join(f"{v:g} {s:.4f}" + (f" {self.notes[v]}" if v in self.notes else "")
                        for v, s in self.scores.items())
        edge = f" (at the grid's edge{' after growing it' if self.grown else ''})" if self.at_edge else ""
        grown = f", grown from {len(self.grid)}" if self.grown else ""
        return (f"{self.name}: {self.metric} per {self.param} {per} -> {self.param} = {self.best:g}{edge} "
                f"({len(self.scores)} runs{grown}, {self.seconds:.0f} s)")


def tune(trial: Callable, grid, name: str = "", param: str = "lr", mode: str = "max", step: float = 3.0,
         max_extra: int = 2, metric: str = "validation accuracy") -> Tuned:
    """Run `trial(value)` on a grid grown at its edge (`utils.train.choose_rate`) and keep the best.

    trial(value) -> the validation score, or (score, anything to keep), or (score, keep, a short
    note the report prints after the score, e.g. the epochs run). The best score
    (highest for mode "max", lowest for "min") wins; ties go to the value tried first; a
    non-finite score never wins (`utils.compare.improves`). While the winner is the grid's
    largest (smallest) value, the one `step` times larger (smaller) is tried too, at most
    `max_extra` times. Only the best trial's extra output stays in memory (`Tuned.kept`).
    """
    grid = tuple(grid)  # the values as given (a C of 3 stays the int 3 in what is recorded)
    if mode not in ("min", "max") or len(set(grid)) != len(grid):
        raise ValueError(f"need mode 'min' or 'max' and a grid without repeats, got {mode!r} and {grid}")
    scores, notes, top, start = {}, {}, {}, time.perf_counter()

    def run(value: float) -> float:  # choose_rate minimizes: hand it the score, or minus the score
        out = trial(value)
        out = out if isinstance(out, tuple) else (out,)
        if not 1 <= len(out) <= 3:
            raise ValueError(f"trial({value:g}) must return a score, (score, keep) or (score, keep, note); got {out}")
        score, kept, note = (*out, None, None)[:3]
        scores[value] = score = float(score)
        if note is not None:
            notes[value] = str(note)
        if improves(score, top.get("score"), mode):  # strictly better, in the order tried: choose_rate's pick
            top.update(value=value, score=score, kept=kept)
        return score if mode == "min" else -score

    best, _ = choose_rate(run, list(grid), step, max_extra)
    if not top:
        raise ValueError(f"{name or 'tune'}: every trial's score was non-finite {scores}: nothing to choose")
    assert top["value"] == best, (top, best)  # the same rule, applied to the same scores in the same order
    return Tuned(name, param, grid, dict(sorted(scores.items())), best, top["kept"], time.perf_counter() - start,
                 metric, notes)


@dataclass(frozen=True)
class LinearRow:
    """TF-IDF + logistic regression with C chosen on validation (`tune_tfidf_lr`); prints as one line."""

    tuned: Tuned  # validation accuracy per C; .best is the chosen C, .kept (pipeline, seconds to fit)
    probs: np.ndarray | None  # (N_test,) P(positive) of the chosen model, None without test texts
    hits: np.ndarray | None  # (N_test,) bool: which test reviews it gets right (for `paired_difference`)
    infer_s: float  # seconds to score the test texts

    @property
    def model(self):  # the fitted pipeline at the chosen C
        return self.tuned.kept[0]

    @property
    def C(self) -> float:
        return self.tuned.best

    @property
    def val_acc(self) -> float:
        return self.tuned.score

    @property
    def train_s(self) -> float:  # the chosen C's fit
        return self.tuned.kept[1]

    @property
    def test_acc(self) -> float | None:
        return None if self.hits is None else float(self.hits.mean())

    @property
    def params(self) -> int:  # weights and bias of the logistic regression
        return int(self.model[-1].coef_.size + self.model[-1].intercept_.size)

    def __str__(self) -> str:
        return str(self.tuned) + ("" if self.hits is None else f"; test accuracy {self.test_acc:.4f}")


def tune_tfidf_lr(train_texts, y_train, val_texts, y_val, test_texts=None, y_test=None, Cs=(3.0, 10.0, 30.0),
                  name: str = "TF-IDF + logistic regression") -> LinearRow:
    """The linear baseline's row: `tfidf_logistic_regression(C)` fitted on the training texts for
    each C of a grid grown at its edge (`tune`), C chosen by validation accuracy (share of
    `predict(val_texts) == y_val`), then the chosen model scores the test texts once:
    probs = P(positive) (N_test,), hits = (probs > 0.5) == y_test (N_test,).
    Texts are pre-tokenized reviews joined by spaces."""
    y_train, y_val = np.asarray(y_train), np.asarray(y_val)
    if len(train_texts) != len(y_train) or len(val_texts) != len(y_val) or (test_texts is None) != (y_test is None) \
            or (test_texts is not None and len(test_texts) != len(y_test)):
        raise ValueError("each set of texts needs one label per text (and test texts come with test labels)")

    def trial(C: float):
        start = time.perf_counter()
        model = tfidf_logistic_regression(C).fit(train_texts, y_train)
        train_s = time.perf_counter() - start
        return float((model.predict(val_texts) == y_val).mean()), (model, train_s)

    tuned = tune(trial, Cs, name=name, param="C")
    if test_texts is None:
        return LinearRow(tuned, None, None, 0.0)
    start = time.perf_counter()
    probs = tuned.kept[0].predict_proba(test_texts)[:, 1]  # (N_test,)
    return LinearRow(tuned, probs, (probs > 0.5) == np.asarray(y_test), time.perf_counter() - start)
