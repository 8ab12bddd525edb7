"""Count-based n-gram language models with add-k smoothing, over integer token ids.

An order-n model predicts token x_t from the n-1 tokens before it:

    P(x_t = w | c) = (count(c, w) + k) / (count(c) + k * V),   c = x_{t-n+1} .. x_{t-1}

Counting is vectorized: every n-gram of ids becomes one int64 key (its digits in base V),
`np.unique` counts the keys, and `np.searchsorted` looks them up. Nothing of size V**n is
ever allocated, so word-level trigrams over a 6k-word vocabulary fit in a few MB.
The sequence is treated as one stream; n-1 copies of `bos_id` are put in front of it
(when fitting and when scoring), so every token is predicted and models of different
orders are scored on exactly the same tokens.

`InterpolatedNGramLM` mixes add-k models of orders 1..n; `KneserNeyLM` is interpolated
Kneser-Ney (plain or modified discounts), the strongest count model of the course, with
`pruned` to fit it into a size budget (count cutoffs) and `choose_order` to pick its order on
held-out training text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _as_ids(ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    arr = np.asarray(ids, dtype=np.int64)  # (N,)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {arr.min()}..{arr.max()}")
    return arr


def _lookup(keys: np.ndarray, table: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """counts[i] where table[i] == key, else 0, for every key (table sorted, unique)."""
    if len(table) == 0:  # fitted on an empty stream: nothing was counted
        return np.zeros(len(keys), dtype=np.int64)
    idx = np.searchsorted(table, keys)  # (N,)
    idx = np.minimum(idx, len(table) - 1)
    return np.where(table[idx] == keys, counts[idx], 0)  # (N,)


class NGramLM:
    """Add-k smoothed n-gram model over ids 0..V-1 (order 1: unigram, 2: bigram, ...)."""

    def __init__(self, order: int, vocab_size: int, k: float = 1.0, bos_id: int = 2) -> None:
        assert order >= 1, f"order must be at least 1, got {order}"
        assert vocab_size >= 2, f"vocab_size must be at least 2, got {vocab_size}"
        assert vocab_size ** order < 2 ** 62, "V**order overflows the int64 n-gram keys"
        assert k >= 0, f"k must be non-negative, got {k}"
        assert 0 <= bos_id < vocab_size, f"bos_id must be a valid id, got {bos_id}"
        self.order, self.V, self.k, self.bos_id = order, vocab_size, float(k), bos_id
        self.grams = self.gram_counts = None  # sorted unique n-gram keys and their counts
        self.ctxs = self.ctx_counts = None  # same for the (n-1)-token contexts

    def _keys(self, ids: np.ndarray) -> np.ndarray:
        """One int64 key per position: the n-gram ending there, digits in base V."""
        padded = np.concatenate([np.full(self.order - 1, self.bos_id), ids])  # (N+n-1,)
        keys = np.zeros(len(ids), dtype=np.int64)  # (N,)
        for j in range(self.order):  # Horner's rule over the window, oldest token first
            keys = keys * self.V + padded[j:j + len(ids)]
        return keys

    def fit(self, ids: Sequence[int] | np.ndarray) -> NGramLM:
        """Count every n-gram and every context of a training stream of ids."""
        keys = self._keys(_as_ids(ids, self.V))  # (N,)
        self.grams, self.gram_counts = np.unique(keys, return_counts=True)
        # a context's count is the number of n-grams it starts, so each row sums to 1
        self.ctxs, self.ctx_counts = np.unique(keys // self.V, return_counts=True)
        return self

    def with_k(self, k: float) -> NGramLM:
        """The same counts with another smoothing constant (no refitting needed)."""
        other = NGramLM(self.order, self.V, k, self.bos_id)
        other.grams, other.gram_counts = self.grams, self.gram_counts
        other.ctxs, other.ctx_counts = self.ctxs, self.ctx_counts
        return other

    def _probs_of_keys(self, keys: np.ndarray) -> np.ndarray:
        if self.grams is None:
            raise ValueError("call fit(ids) before asking for probabilities")
        num = _lookup(keys, self.grams, self.gram_counts) + self.k  # (N,)
        den = _lookup(keys // self.V, self.ctxs, self.ctx_counts) + self.k * self.V  # (N,)
        # k = 0 and an unseen context would be 0 / 0: such a model gives probability 0.
        # Divide only where den > 0: clamping den to 1 gave k (not 1/V) when k * V < 1.
        return np.divide(num, den, out=np.zeros(len(keys)), where=den > 0)

    def probs(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """P(x_t | previous n-1 tokens) for every token of `ids`: shape (N,)."""
        return self._probs_of_keys(self._keys(_as_ids(ids, self.V)))

    def nll(self, ids: Sequence[int] | np.ndarray) -> tuple[float, int]:
        """(summed negative log-likelihood in nats, number of tokens); inf if a P is 0."""
        p = self.probs(ids)  # (N,)
        with np.errstate(divide="ignore"):
            return float(-np.log(p).sum()), len(p)

    def perplexity(self, ids: Sequence[int] | np.ndarray) -> float:
        """exp(mean NLL per token) of a whole stream of ids."""
        total, n = self.nll(ids)
        return math.exp(total / n) if total / n < 709.0 else math.inf

    def next_distribution(self, context: Sequence[int]) -> np.ndarray:
        """P(w | context) for all w: shape (V,). Uses the last n-1 ids of `context`."""
        ctx = [self.bos_id] * (self.order - 1) + _as_ids(context, self.V).tolist()
        ctx_key = 0
        for tok in ctx[len(ctx) - (self.order - 1):]:  # empty for a unigram model
            ctx_key = ctx_key * self.V + int(tok)
        return self._probs_of_keys(ctx_key * self.V + np.arange(self.V))  # (V,)

    def sample(self, context: Sequence[int], n_tokens: int, rng: np.random.Generator
               ) -> list[int]:
        """Continue `context` by `n_tokens` ids drawn one at a time from the model."""
        out = list(context)
        for _ in range(n_tokens):
            p = self.next_distribution(out)  # (V,)
            out.append(int(rng.choice(self.V, p=p / p.sum())))
        return out[len(context):]


class InterpolatedNGramLM:
    """A linear interpolation of add-k models of orders 1..max_order (Jelinek & Mercer 1980):

        P(x_t | c) = sum_n w_n P_n(x_t | the last n-1 tokens),   w_n >= 0, sum_n w_n = 1.

    `fit` holds out the last `held_out` share of the TRAINING ids: the components are counted on
    the rest, and k (one of `ks`) and the weights w (by EM, which never lowers the held-out
    likelihood) are chosen on the held-out part; then the components are recounted on all ids.
    No validation data is touched. High orders are sharp where their context was seen, low
    orders cover the rest, so the mixture beats every single order.
    """

    def __init__(self, max_order: int, vocab_size: int, ks: Sequence[float] = (1e-3, 1e-2, 1e-1, 1.0),
                 held_out: float = 0.1, bos_id: int = 2, em_steps: int = 100) -> None:
        if max_order < 1 or not 0 < held_out < 1 or not ks:
            raise ValueError(f"need max_order >= 1, 0 < held_out < 1 and at least one k, got "
                             f"max_order={max_order}, held_out={held_out}, ks={ks}")
        self.orders, self.V, self.ks, self.held_out = range(1, max_order + 1), vocab_size, ks, held_out
        self.bos_id, self.em_steps = bos_id, em_steps
        self.models, self.k, self.weights, self.held_out_nll = None, None, None, None

    def _stack(self, models, ids: np.ndarray) -> np.ndarray:
        return np.stack([m.probs(ids) for m in models], axis=1)  # (N, orders)

    def fit(self, ids: Sequence[int] | np.ndarray) -> InterpolatedNGramLM:
        from utils.compare import improves  # the NaN-safe "better" that utils.train uses too

        ids = _as_ids(ids, self.V)
        cut = int(len(ids) * (1 - self.held_out))
        counts = [NGramLM(n, self.V, 0.0, self.bos_id).fit(ids[:cut]) for n in self.orders]
        best = None
        for k in self.ks:
            P = self._stack([m.with_k(k) for m in counts], ids[cut:])  # (N_held, orders)
            w = np.full(len(self.orders), 1 / len(self.orders))
            # a k that gives a held-out token P = 0 under every order (k = 0) makes the shares
            # 0 / 0 and the loss NaN or inf: such a k loses to any finite one, wherever it stands
            with np.errstate(divide="ignore", invalid="ignore"):
                for _ in range(self.em_steps):  # E: each order's share of every token; M: their means
                    share = P * w
                    w = (share / share.sum(1, keepdims=True)).mean(0)
                nll = float(-np.log(P @ w).mean())
            if best is None or improves(nll, best[0]):
                best = (nll, k, w)
        self.held_out_nll, self.k, self.weights = best  # nats per held-out token
        self.models = [NGramLM(n, self.V, self.k, self.bos_id).fit(ids) for n in self.orders]
        return self

    def probs(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """P(x_t | previous tokens) for every token of `ids`: shape (N,)."""
        if self.models is None:
            raise ValueError("call fit(ids) before asking for probabilities")
        return self._stack(self.models, _as_ids(ids, self.V)) @ self.weights

    def perplexity(self, ids: Sequence[int] | np.ndarray) -> float:
        """exp(mean NLL per token) of a whole stream of ids."""
        return math.exp(-np.log(self.probs(ids)).mean())


def _runs(sorted_keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted array (for np.add.reduceat)."""
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if len(sorted_keys) else sorted_keys


def _kn_discounts(counts: np.ndarray, modified: bool) -> np.ndarray:
    """[0, D1, D2, D3+] from one order's counts-of-counts n_r (Chen & Goodman 1998, modified KN):

        Y = n1 / (n1 + 2 n2),   plain: D = Y for every count,
        modified: D_r = r - (r + 1) Y n_{r+1} / n_r   (r = 1, 2, 3; D_3 serves every count >= 3).

    Tiny data can make an estimate undefined (n_r = 0) or push it out of (0, r]; such a D_r
    falls back to Y, and Y to 0.5 when n1 = 0. D > 0 keeps every backoff weight positive (no
    zero probabilities) and D_r <= r keeps every distribution normalized.
    """
    n = np.bincount(np.minimum(counts, 5), minlength=6).astype(float)  # n[r]: n-grams seen r times
    y = n[1] / (n[1] + 2 * n[2]) if n[1] > 0 else 0.5
    out = np.array([0.0, y, y, y])  # index min(count, 3); a count of 0 is never discounted
    for r in (1, 2, 3) if modified else ():
        d = r - (r + 1) * y * n[r + 1] / n[r] if n[r] > 0 else -1.0
        out[r] = d if 0 < d <= r else y
    return out


class KneserNeyLM:
    """Interpolated Kneser-Ney over ids 0..V-1 (Chen & Goodman 1998, interpolated and modified KN):

        P_m(w | h) = (max(c_m(h, w) - D_m(c), 0) + gamma_m(h) P_{m-1}(w | h')) / c_m(h),
        gamma_m(h) = D_m1 N1(h.) + D_m2 N2(h.) + D_m3+ N3+(h.),   c_m(h) = sum_w c_m(h, w),

    h the last m-1 tokens, h' the last m-2, N_r(h.) the number of w with c_m(h, w) = r (3+: >= 3),
    and P_0 = 1/V, so symbols never seen still get mass. A context never seen (c_m(h) = 0) passes
    P_{m-1} through. The highest order counts c_n(h, w) raw; every lower order counts N1+(. h w),
    the number of distinct tokens seen before h w: "Francisco" follows only "San", so as a
    backoff guess after a new word it should be rare, however often it occurs.
    `discounts="plain"` uses one D per order, "modified" three (D1, D2, D3+): see `_kn_discounts`.
    `continuation=False` counts the lower orders raw: absolute discounting alone, the ablation
    that shows what the continuation counts are worth.
    Tables, keys, bos padding and lookups as in `NGramLM`; one pass per order, none per token.
    """

    def __init__(self, order: int, vocab_size: int, discounts: str = "modified", bos_id: int = 2,
                 continuation: bool = True) -> None:
        if order < 1:
            raise ValueError(f"order must be at least 1, got {order}")
        if discounts not in ("plain", "modified"):
            raise ValueError(f"discounts must be 'plain' or 'modified', got {discounts!r}")
        if vocab_size < 2 or not 0 <= bos_id < vocab_size:
            raise ValueError(f"need vocab_size >= 2 and bos_id in [0, vocab_size), got "
                             f"vocab_size={vocab_size}, bos_id={bos_id}")
        if vocab_size ** order >= 2 ** 62:
            raise ValueError(f"V**order = {vocab_size}**{order} overflows the int64 n-gram keys")
        self.order, self.V, self.discounts, self.bos_id = order, vocab_size, discounts, bos_id
        self.continuation = continuation  # False: raw lower-order counts (absolute discounting alone)
        # per order m = 1..n: (m-gram keys, counts, D by count, context keys, c(h), gamma numerator)
        self.tables = None
        self.discounts_ = None  # per order: (D,) plain, (D1, D2, D3+) modified

    # the same stream handling as NGramLM: bos padding, base-V keys, sampling
    _keys = NGramLM._keys
    nll = NGramLM.nll
    perplexity = NGramLM.perplexity
    next_distribution = NGramLM.next_distribution
    sample = NGramLM.sample

    def fit(self, ids: Sequence[int] | np.ndarray) -> KneserNeyLM:
        """Count every order's (raw or continuation) n-grams, discounts and context totals."""
        grams, counts = np.unique(self._keys(_as_ids(ids, self.V)), return_counts=True)  # order n
        tables = []
        for m in range(self.order, 0, -1):
            if m < self.order and self.continuation:  # N1+(. g): distinct (m+1)-grams ending in g
                grams, counts = np.unique(tables[-1][0] % self.V ** m, return_counts=True)
            elif m < self.order:  # the ablation: raw c(g), the summed counts of those (m+1)-grams
                grams, inverse = np.unique(tables[-1][0] % self.V ** m, return_inverse=True)
                counts = np.bincount(inverse, weights=tables[-1][1]).astype(np.int64)
            d = _kn_discounts(counts, self.discounts == "modified")
            # contexts: grams // V is sorted, so each context's n-grams form one run
            ctxs, start = np.unique(grams // self.V, return_index=True)
            n_r = np.stack([counts == 1, counts == 2, counts >= 3]).astype(float)  # (3, T)
            gamma_num = d[1:] @ np.add.reduceat(n_r, start, axis=1) if len(start) else np.zeros(0)
            c_h = np.add.reduceat(counts, start) if len(start) else np.zeros(0, dtype=np.int64)
            tables.append((grams, counts, d, ctxs, c_h, gamma_num))
        self.tables = tables[::-1]  # index m - 1
        self.discounts_ = [tuple(float(x) for x in (t[2][1:] if self.discounts == "modified"
                                                    else t[2][1:2])) for t in self.tables]
        return self

    @property
    def n_grams(self) -> int:
        """Entries in all the n-gram tables together (orders 1..n), for comparing table sizes."""
        return sum(len(t[0]) for t in self.tables) if self.tables is not None else 0

    @property
    def numbers_read(self) -> int:
        """Every number the tables hold for lookups: per order, one count per n-gram and two per
        context (its total c(h) and back-off numerator). Keys and discounts are not counted."""
        return sum(len(t[0]) + 2 * len(t[3]) for t in self.tables) if self.tables is not None else 0

    def pruned(self, max_size: int, size: str = "n-grams") -> KneserNeyLM:
        """A copy with the rarest n-grams of orders >= 2 removed until its size (`"n-grams"` or
        `"numbers read"`) is at most `max_size`: one count cutoff for all orders, on how often
        each n-gram occurs in the text (its raw count, also where the table stores a continuation
        count), made exact by a partial cut at the last count: the highest order first, then the
        lowest stored count, then a seeded shuffle (never the keys' order, which would remove the
        n-grams of the first symbols). A suffix occurs at least as often as the n-gram, so a kept
        n-gram keeps its shorter suffixes.

        A removed n-gram's discounted count c - D(c) moves into its context's back-off
        numerator, so it is predicted through the shorter context and every distribution still
        sums to one; a context left with no n-gram passes the lower order through (the same
        numbers), so it is dropped. The lower orders keep their continuation counts from the
        unpruned text."""
        if self.tables is None:
            raise ValueError("call fit(ids) before pruning")
        if size not in ("n-grams", "numbers read"):
            raise ValueError(f"size must be 'n-grams' or 'numbers read', got {size!r}")
        high = self.tables[1:]  # orders 2..n: the prunable ones
        raw = [self.tables[-1][1]]  # occurrences in the text: the top order's counts are raw
        for m in range(len(self.tables) - 1, 1, -1):  # order m: sum over the (m+1)-grams ending in it
            _, inverse = np.unique(self.tables[m][0] % self.V ** m, return_inverse=True)
            raw.insert(0, np.bincount(inverse, weights=raw[0]).astype(np.int64))
        order_of = np.concatenate([np.full(len(t[0]), m) for m, t in enumerate(high)]).astype(np.int64)
        stored = np.concatenate([t[1] for t in high]) if high else np.zeros(0, dtype=np.int64)
        occurs = np.concatenate(raw) if high else np.zeros(0, dtype=np.int64)
        shuffle = np.random.default_rng(0).permutation(len(occurs))  # the last tie-break, not the keys
        rank = np.empty(len(occurs), dtype=np.int64)  # removal rank: rarest first, higher order first
        rank[np.lexsort((shuffle, stored, -order_of, occurs))] = np.arange(len(occurs))
        bounds = np.cumsum([0] + [len(t[0]) for t in high])
        starts = [_runs(t[0] // self.V) for t in high]  # each context's n-grams form one run (grams sorted)

        def keeps(r: int) -> list[np.ndarray]:  # per high order: which n-grams survive r removals
            return [rank[bounds[m]:bounds[m + 1]] >= r for m in range(len(high))]

        def size_after(r: int) -> int:
            kept = keeps(r)
            total = len(self.tables[0][0]) + sum(int(k.sum()) for k in kept)
            if size == "numbers read":  # two numbers per context that keeps an n-gram
                total += 2 * len(self.tables[0][3]) + 2 * sum(
                    int((np.add.reduceat(k, start) > 0).sum()) for k, start in zip(kept, starts) if len(k))
            return total

        lo, hi = 0, len(occurs)  # the fewest removals that fit: size_after falls as r grows
        if size_after(hi) > max_size:
            raise ValueError(f"max_size {max_size:,} is below the unigram table's size ({size_after(hi):,}): "
                             "even an order-1 model does not fit; give a larger max_size")
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if size_after(mid) <= max_size else (mid + 1, hi)
        out = KneserNeyLM(self.order, self.V, self.discounts, self.bos_id, self.continuation)
        out.discounts_ = self.discounts_
        out.tables = [self.tables[0]]
        for keep, start, (grams, cnt, d, ctxs, c_h, gamma_num) in zip(keeps(lo), starts, high):
            moved = np.add.reduceat(np.where(keep, 0.0, cnt - d[np.minimum(cnt, 3)]), start) if len(start) else 0
            alive = (np.add.reduceat(keep, start) > 0) if len(start) else np.zeros(0, bool)
            out.tables.append((grams[keep], cnt[keep], d, ctxs[alive], c_h[alive], (gamma_num + moved)[alive]))
        return out

    def _probs_of_keys(self, keys: np.ndarray) -> np.ndarray:
        if self.tables is None:
            raise ValueError("call fit(ids) before asking for probabilities")
        p = np.full(len(keys), 1.0 / self.V)  # (N,) P_0: uniform
        for m, (grams, counts, d, ctxs, c_h, gamma_num) in enumerate(self.tables, start=1):
            g = keys % self.V ** m  # (N,) the m-gram ending at each position
            c = _lookup(g, grams, counts)  # (N,) 0 if unseen
            ctx_total = _lookup(g // self.V, ctxs, c_h)  # (N,) 0: context unseen, keep P_{m-1}
            num = np.maximum(c - d[np.minimum(c, 3)], 0) + _lookup(g // self.V, ctxs, gamma_num) * p
            p = np.divide(num, ctx_total, out=p, where=ctx_total > 0)
        return p

    def probs(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """P(x_t | previous n-1 tokens) for every token of `ids`: shape (N,)."""
        return self._probs_of_keys(self._keys(_as_ids(ids, self.V)))

    @classmethod
    def choose_order(cls, ids: Sequence[int] | np.ndarray, orders: Sequence[int], vocab_size: int,
                     held_out: float = 0.1, prune_to: tuple[int, str] | None = None,
                     **kw) -> tuple[KneserNeyLM, dict[int, float]]:
        """Fit each order on the first 1 - held_out of the TRAINING ids, score the rest, and refit
        the order of lowest held-out perplexity on all ids: (that model, {order: held-out PPL}).
        `prune_to=(max_size, size)`: every model is pruned to that size (see `pruned`) first."""
        if not orders or not 0 < held_out < 1:
            raise ValueError(f"need orders and 0 < held_out < 1, got {orders}, {held_out}")
        ids = _as_ids(ids, vocab_size)
        cut = int(len(ids) * (1 - held_out))

        def fitted(n: int, part: np.ndarray) -> KneserNeyLM:
            model = cls(n, vocab_size, **kw).fit(part)
            return model.pruned(*prune_to) if prune_to else model

        ppl = {n: fitted(n, ids[:cut]).perplexity(ids[cut:]) for n in orders}
        best = min(ppl, key=lambda n: (math.isnan(ppl[n]), ppl[n]))  # NaN never wins
        return fitted(best, ids), ppl
