"""Evaluation metrics for sequence models: perplexity and BLEU, written from scratch.

Perplexity: `token_nll` sums the cross-entropy of a padded batch over its real tokens,
`perplexity(total_nll, n_tokens)` turns the running sums of a whole evaluation into one number.

BLEU (Papineni et al. 2002) with the conventions of sacrebleu (Post 2018), so that the
numbers agree with `sacrebleu.corpus_bleu(..., tokenize="none")` on whitespace-tokenized text:
clipped n-gram precisions for n = 1..4, the closest reference length per sentence, a brevity
penalty on the corpus totals, and the geometric mean of the precisions, on a 0-100 scale.

Paired comparison: `paired_difference` says whether two classifiers scored on the same examples
differ by more than the sampling of those examples explains.

Shapes: B batch, T sequence length, V vocabulary size.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------- perplexity


def token_nll(logits: torch.Tensor, targets: torch.Tensor, pad_id: int | None = 0
              ) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood (nats) of `targets` under `logits`, padding excluded.

    logits: (B, T, V) unnormalized scores; targets: (B, T) int64 ids. Positions whose target
    is `pad_id` contribute nothing (pass `pad_id=None` to count every position).
    Returns (sum, count): a 0-dim tensor that keeps its graph (so `sum / count` can be the
    training loss) and the number of real tokens, so batches of different sizes can be
    accumulated exactly: perplexity(sum over batches, count over batches).
    """
    if logits.dim() != 3 or targets.dim() != 2 or logits.shape[:2] != targets.shape:
        raise ValueError(f"expected logits (B, T, V) and targets (B, T), got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    ignore = -100 if pad_id is None else pad_id
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore,
                            reduction="sum")  # () summed over real tokens
    count = int(targets.numel() if pad_id is None else (targets != pad_id).sum())
    return total, count


def perplexity(total_nll: float, n_tokens: int) -> float:
    """exp(mean negative log-likelihood per token), from a summed NLL in nats and a token count.

    Sum the loss over tokens (not the mean over batches) while evaluating, then call this once:
    averaging per-batch means weights the tokens of short batches too heavily.
    """
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    mean = float(total_nll) / n_tokens
    if math.isnan(mean):  # a diverged model: say so, do not report an infinite perplexity
        return math.nan
    return math.exp(mean) if mean < 709.0 else math.inf  # exp overflows a float past ~709


def bits_per_token(total_nll: float, n_tokens: int) -> float:
    """Mean negative log-likelihood in bits (log2 of the perplexity); per character: 'bpc'."""
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    return float(total_nll) / n_tokens / math.log(2)


# ---------------------------------------------------------------------------- BLEU
Sentence = str | Sequence[str]  # a whitespace-tokenized string, or a list of tokens
SMOOTH_METHODS = ("none", "floor", "add-k", "exp")
SMOOTH_DEFAULTS = {"none": 0.0, "floor": 0.1, "add-k": 1.0, "exp": 0.0}  # as in sacrebleu


@dataclass(frozen=True)
class BLEUResult:
    """A BLEU score and the statistics it was computed from (precisions in percent)."""

    score: float  # 0-100, like sacrebleu (divide by 100 for the 0-1 convention)
    precisions: tuple[float, ...]  # p_n in percent, n = 1..max_n (after smoothing)
    bp: float  # brevity penalty, in (0, 1]
    sys_len: int  # total hypothesis length in tokens
    ref_len: int  # total closest-reference length in tokens
    counts: tuple[int, ...]  # clipped n-gram matches per order
    totals: tuple[int, ...]  # hypothesis n-grams per order

    def __str__(self) -> str:
        precs = "/".join(f"{p:.1f}" for p in self.precisions)
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        return (f"BLEU = {self.score:.2f} {precs} (BP = {self.bp:.3f} ratio = {ratio:.3f} "
                f"hyp_len = {self.sys_len} ref_len = {self.ref_len})")


def _tokens(sentence: Sentence) -> list[str]:
    # strings are split on whitespace exactly like sacrebleu's tokenize="none"
    return sentence.split() if isinstance(sentence, str) else list(sentence)


def ngram_counts(tokens: Sequence[str], max_n: int = 4) -> Counter:
    """Counts of every n-gram (as a tuple) of orders 1..max_n in one token list."""
    return Counter(tuple(tokens[i:i + n]) for n in range(1, max_n + 1)
                   for i in range(len(tokens) - n + 1))


def closest_ref_len(hyp_len: int, ref_lens: Sequence[int]) -> int:
    """The reference length nearest to the hypothesis length; ties go to the shorter one."""
    return min(ref_lens, key=lambda r: (abs(r - hyp_len), r))


def sentence_stats(hypothesis: Sentence, references: Sequence[Sentence], max_n: int = 4
                   ) -> tuple[int, int, list[int], list[int]]:
    """(hyp_len, ref_len, clipped matches per order, hypothesis n-grams per order).

    Clipping: a hypothesis n-gram counts as matched at most as often as it occurs in the
    reference where it occurs most often (the max over references, per n-gram).
    """
    if isinstance(references, str) or len(references) == 0:
        raise ValueError("references must be a non-empty list of reference sentences "
                         "(wrap a single reference as [ref])")
    hyp = _tokens(hypothesis)
    refs = [_tokens(r) for r in references]
    max_ref: Counter = Counter()
    for ref in refs:
        max_ref |= ngram_counts(ref, max_n)  # `|` keeps the max count of each n-gram
    correct, total = [0] * max_n, [0] * max_n
    for gram, count in ngram_counts(hyp, max_n).items():
        total[len(gram) - 1] += count
        correct[len(gram) - 1] += min(count, max_ref[gram])
    return len(hyp), closest_ref_len(len(hyp), [len(r) for r in refs]), correct, total


def brevity_penalty(sys_len: int, ref_len: int) -> float:
    """1 if the hypotheses are at least as long as the references, else exp(1 - r / c)."""
    if sys_len >= ref_len:
        return 1.0
    return math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0


def _precisions(correct: list[int], total: list[int], smooth: str, value: float
                ) -> tuple[list[float], int]:
    """Smoothed precisions in percent and the number of orders used (sacrebleu's rules)."""
    precisions, used, halvings = [0.0] * len(total), 0, 1.0
    for n in range(len(total)):
        c, t = correct[n], total[n]
        if smooth == "add-k" and n > 0:  # add-k leaves unigrams alone
            c, t = c + value, t + value
        if t == 0:  # no n-grams of this order at all: stop here
            break
        used = n + 1
        if c > 0:
            precisions[n] = 100.0 * c / t
        elif smooth == "exp":  # NIST: 1/2, 1/4, ... of a match for each order with none
            halvings *= 2
            precisions[n] = 100.0 / (halvings * t)
        elif smooth == "floor":
            precisions[n] = 100.0 * value / t
    return precisions, used


def bleu_from_stats(sys_len: int, ref_len: int, correct: list[int], total: list[int],
                    smooth: str = "exp", smooth_value: float | None = None,
                    effective_order: bool = False) -> BLEUResult:
    """BLEU = BP * exp(mean_n log p_n) from summed statistics, on a 0-100 scale.

    effective_order: average only over the orders the hypotheses have n-grams of (useful
    for sentences shorter than max_n tokens); otherwise a missing order gives BLEU 0.
    """
    if smooth not in SMOOTH_METHODS:
        raise ValueError(f"smooth must be one of {SMOOTH_METHODS}, got {smooth!r}")
    value = SMOOTH_DEFAULTS[smooth] if smooth_value is None else smooth_value
    bp = brevity_penalty(sys_len, ref_len)
    stats = (sys_len, ref_len, tuple(correct), tuple(total))
    if not any(correct):  # nothing matched at all: 0, whatever the smoothing
        return BLEUResult(0.0, (0.0,) * len(total), bp, *stats)
    precisions, used = _precisions(correct, total, smooth, value)
    orders = used if effective_order else len(total)
    if min(precisions[:orders]) == 0.0:  # log 0: the geometric mean is 0
        score = 0.0
    else:
        score = bp * math.exp(sum(math.log(p) for p in precisions[:orders]) / orders)
    return BLEUResult(score, tuple(precisions), bp, *stats)


def corpus_bleu(hypotheses: Sequence[Sentence], references: Sequence[Sequence[Sentence]],
                max_n: int = 4, smooth: str = "exp", smooth_value: float | None = None,
                effective_order: bool = False) -> BLEUResult:
    """Corpus BLEU: sum the n-gram statistics of all sentences, then combine once.

    hypotheses[i]: a whitespace-tokenized string or a token list.
    references[i]: the list of references of sentence i (one or more, same kind).
    Note: sacrebleu takes references as streams, refs[k][i]; ours are per sentence, refs[i][k].
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    if max_n < 1:
        raise ValueError(f"max_n must be at least 1, got {max_n}")
    sys_len = ref_len = 0
    correct, total = [0] * max_n, [0] * max_n
    for hyp, refs in zip(hypotheses, references, strict=True):
        h, r, c, t = sentence_stats(hyp, refs, max_n)
        sys_len, ref_len = sys_len + h, ref_len + r
        correct = [a + b for a, b in zip(correct, c, strict=True)]
        total = [a + b for a, b in zip(total, t, strict=True)]
    return bleu_from_stats(sys_len, ref_len, correct, total, smooth, smooth_value,
                           effective_order)


def sentence_bleu(hypothesis: Sentence, references: Sequence[Sentence], max_n: int = 4,
                  smooth: str = "exp", smooth_value: float | None = None,
                  effective_order: bool = True) -> BLEUResult:
    """BLEU of one sentence against its references (sacrebleu's sentence_bleu defaults)."""
    return corpus_bleu([hypothesis], [references], max_n, smooth, smooth_value,
                       effective_order)


# ---------------------------------------------------------------------------- paired comparison
def paired_difference(hits_a, hits_b) -> tuple[float, float]:
    """Accuracy of a minus accuracy of b on the same examples, and the half-width of its 95%
    interval (normal approximation, 1.96 standard errors of the mean per-example difference).

    hits_*: (N,) booleans, which examples each model gets right, or (seeds, N) for a model
    trained with several seeds (each example then counts the share of seeds that get it right).
    Pairing removes what both models find easy or hard, so the interval is much narrower than
    two separate ones: a difference inside it is a tie.
    """
    import numpy as np

    a, b = np.asarray(hits_a, dtype=float), np.asarray(hits_b, dtype=float)
    a, b = (a.mean(0) if a.ndim == 2 else a), (b.mean(0) if b.ndim == 2 else b)
    if a.ndim != 1 or a.shape != b.shape or len(a) < 2:
        raise ValueError(f"need the hits of both models on the same N >= 2 examples, as (N,) or "
                         f"(seeds, N) arrays; got shapes {np.shape(hits_a)} and {np.shape(hits_b)}")
    d = a - b  # (N,)
    return float(d.mean()), float(1.96 * d.std(ddof=1) / math.sqrt(len(d)))

