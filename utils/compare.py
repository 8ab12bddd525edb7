"""Which of two scores is better, said once for every place that keeps a best (no torch here).

A comparison with NaN is always False, so `nll < best` quietly keeps a NaN that came first as
the best for ever. `improves` gives every keep-the-best loop in `utils` the same rule: a
non-finite score (NaN, or an infinity from an overflow) is never an improvement, and any finite
score improves on a missing or non-finite best. Used by `utils.train` (keep_best, no_gain_for,
choose_rate) and `utils.ngram` (the held-out choice of k).

The decision rules of the notebooks, each said once: `verdict` (a headline a - b from its
interval), `binomial_half_width` (one accuracy's 95% sampling interval), `paired_bootstrap`
(notebook 09's interval for a seed-averaged gain, resampling the validation examples),
`paired_bleu_bootstrap` (notebook 10: the interval of one system's corpus BLEU minus another's),
`gap_over_text_and_seeds` (a language model against another, per position, over held-out text
and seeds: notebooks 03 and 05) and `keep_or_drop` (notebook 09's ladder rule). The per-example paired interval is
`utils.metrics.paired_difference`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


def improves(new: float, best: float | None, mode: str = "min") -> bool:
    """True if `new` is strictly better than `best`: lower for mode "min" (a loss), higher for
    "max" (an accuracy). A non-finite `new` never is; a finite one beats a None or non-finite best."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    if not math.isfinite(new):
        return False
    if best is None or not math.isfinite(best):
        return True
    return new < best if mode == "min" else new > best


def verdict(name_a: str, name_b: str, diff: float, half_width: float, higher_is_better: bool = True,
            unit: str = "") -> str:
    """A headline comparison said from its numbers, by one rule stated before the run: `diff` is
    a minus b, `half_width` its 95% interval's half-width (e.g. from `paired_difference`); an
    interval that holds 0 is a tie, otherwise a is ahead or behind.

        verdict("GRU", "RNN", -0.061, 0.012, higher_is_better=False, unit=" nats")
        -> 'GRU is ahead of RNN: -0.061 ± 0.012 nats (the interval excludes 0)'
    """
    if not (math.isfinite(diff) and math.isfinite(half_width)) or half_width < 0:
        raise ValueError(f"need a finite difference and a half-width >= 0, got {diff} and {half_width}")
    said = f"{diff:+.3f} ± {half_width:.3f}{unit}"
    if abs(diff) <= half_width:
        return f"{name_a} ties {name_b}: {said} (the interval holds 0)"
    ahead = (diff > 0) == higher_is_better
    return f"{name_a} is {'ahead of' if ahead else 'behind'} {name_b}: {said} (the interval excludes 0)"


def binomial_half_width(p: float, n: int, z: float = 1.96) -> float:
    """Half-width of the 95% interval of an accuracy p measured on n independent examples:
    z sqrt(p (1 - p) / n) (normal approximation of the binomial; z = 1.96 for 95%).

        binomial_half_width(0.9, 2500) -> 0.01176
    """
    if not 0.0 <= p <= 1.0 or n < 1:
        raise ValueError(f"need an accuracy 0 <= p <= 1 and n >= 1 examples, got p={p}, n={n}")
    return z * math.sqrt(p * (1 - p) / n)


def paired_bootstrap(hits_a, hits_b, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval (lo, hi) of acc(a) - acc(b), both measured on the same
    N examples (notebook 09: the validation reviews) and averaged over the same seeds.

    hits_*: (seeds, N) or (N,) booleans, which examples each seed's model gets right. Per example
    i, a_i = the share of a's seeds right on i (b_i the same); each of the n_boot draws resamples
    N examples with replacement, the SAME draw for both models and all seeds (paired), and
    computes mean(a[draw]) - mean(b[draw]); (lo, hi) are the 2.5th and 97.5th percentiles. It
    covers which examples were held out, not which seeds were drawn: with two seeds, show the
    seeds' own gains beside it. `utils.metrics.paired_difference` is the normal-approximation
    interval of the same difference (1.96 sample sds of the per-example differences / sqrt(N)).
    """
    a, b = np.asarray(hits_a, dtype=float), np.asarray(hits_b, dtype=float)
    if a.shape != b.shape or a.ndim not in (1, 2) or a.shape[-1] < 2 or n_boot < 1:
        raise ValueError(f"need the hits of both models on the same N >= 2 examples as (N,) or (seeds, N) "
                         f"arrays of one shape, and n_boot >= 1; got {a.shape}, {b.shape}, n_boot={n_boot}")
    a, b = (a.mean(0), b.mean(0)) if a.ndim == 2 else (a, b)  # (N,): per example, the share of seeds right
    idx = np.random.default_rng(seed).integers(0, len(a), (n_boot, len(a)))  # (n_boot, N) example draws
    lo, hi = np.percentile(a[idx].mean(1) - b[idx].mean(1), [2.5, 97.5])  # over the n_boot mean gains
    return float(lo), float(hi)


def paired_bleu_bootstrap(hyps_a, hyps_b, refs, n_boot: int = 1000, seed: int = 0
                          ) -> tuple[float, float, float]:
    """Corpus BLEU(a) - BLEU(b) on the same test sentences, and its 95% percentile-bootstrap
    interval: (difference, lo, hi), in BLEU points (sacreBLEU's default BLEU, one reference each).

    hyps_a, hyps_b, refs: N detokenized strings each. Each of the n_boot draws resamples the N
    sentences with replacement, the SAME draw for both systems (paired), and recomputes both
    corpus scores from the per-sentence n-gram counts (as sacreBLEU's own paired test does, so a
    draw costs a sum, not a re-tokenization). It covers which test sentences were drawn, not which
    random draw of the weights each system had. sacreBLEU's `PairedTest` gives each system's own
    interval and a p-value; this is the interval of the difference the comparison needs.
    """
    from sacrebleu.metrics import BLEU  # local: notebooks without translation do not need it

    if not len(hyps_a) == len(hyps_b) == len(refs) or len(refs) < 2 or n_boot < 1:
        raise ValueError(f"need N >= 2 hypotheses of each system and N references, and n_boot >= 1; got "
                         f"{len(hyps_a)}, {len(hyps_b)}, {len(refs)} and n_boot={n_boot}")
    bleu = BLEU()
    # (N, 2 + 2 * 4): per sentence, hypothesis and reference length, then matches and totals per order
    stats = [np.asarray(bleu._extract_corpus_statistics(list(h), [list(refs)]), dtype=np.int64)
             for h in (hyps_a, hyps_b)]

    def score(s):  # summed counts -> corpus BLEU
        return bleu._compute_score_from_stats(s.tolist()).score

    diff = score(stats[0].sum(0)) - score(stats[1].sum(0))
    idx = np.random.default_rng(seed).integers(0, len(refs), (n_boot, len(refs)))  # (n_boot, N) draws
    draws = [score(stats[0][i].sum(0)) - score(stats[1][i].sum(0)) for i in idx]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(diff), float(lo), float(hi)


class Decision(NamedTuple):
    """A ladder rung's verdict: `kept` (bool) and the `reason` it prints as ("kept: ...")."""

    kept: bool
    reason: str

    def __str__(self) -> str:
        return self.reason


def keep_or_drop(gains, interval: tuple[float, float], macs_ratio: float, simpler: str,
                 tolerance: float = 0.1) -> Decision:
    """Notebook 09's rule for one rung of a recipe ladder, stated before the run.

    gains: the change's accuracy gain over the best configuration so far, one per training seed,
    each against the same seed; interval: (lo, hi), the 95% interval of the mean gain
    (`paired_bootstrap`); macs_ratio: the change's multiply-adds per example over the best's;
    simpler: "change" or "current", the side named before the run to win a tie at equal cost.

    - kept when every seed gains (min > 0) and lo > 0; dropped when every seed loses (max < 0)
      and hi < 0 (strict: an interval that ends exactly at 0 holds 0);
    - otherwise a tie (the seeds disagree, or the examples alone could explain the gain): to the
      cheaper side when |macs_ratio - 1| > tolerance (10%), else to the `simpler` side.
    """
    gains = [float(g) for g in gains]
    lo, hi = (float(v) for v in interval)
    if not gains or not all(map(math.isfinite, [*gains, lo, hi, macs_ratio])) or lo > hi or macs_ratio <= 0:
        raise ValueError(f"need >= 1 finite gain, a finite interval lo <= hi and a multiply-add ratio > 0; got "
                         f"gains={gains}, interval={interval}, macs_ratio={macs_ratio}")
    if simpler not in ("change", "current"):
        raise ValueError(f"simpler must be 'change' or 'current', got {simpler!r}")
    if min(gains) > 0 and lo > 0:
        return Decision(True, "kept: gains on every seed")
    if max(gains) < 0 and hi < 0:
        return Decision(False, "dropped: loses on every seed")
    if abs(macs_ratio - 1) > tolerance:  # a tie: the cheaper model, counted, not timed
        return Decision(True, "kept: tie, cheaper") if macs_ratio < 1 else Decision(False, "dropped: tie, dearer")
    return Decision(True, "kept: tie, simpler") if simpler == "change" else Decision(False, "dropped: tie, not simpler")


def t_quantile(df: int, level: float = 0.95) -> float:
    """Student's t quantile for a two-sided `level` interval with `df` degrees of freedom."""
    from scipy import stats  # installed with scikit-learn

    if df < 1:
        raise ValueError(f"need at least one degree of freedom (two seeds), got {df}")
    return float(stats.t.ppf(0.5 + level / 2, df))


class Gap(NamedTuple):
    """A - B in mean NLL per position and its 95% half-width, with the two parts it combines."""
    diff: float
    half_width: float
    text: float  # which stretch of text was held out
    seeds: float  # which seeds trained A (and B)
    per_seed: np.ndarray  # (k,) each seed of A's own difference


def gap_over_text_and_seeds(nll_a, nll_b, seeds_half_width: float | None = None,
                            chunk_counts: tuple[int, ...] = (20, 100)) -> Gap:
    """Model A minus model B, mean NLL over the same scored positions, with an interval over both
    sources of randomness.

    nll_a: (k, N), one row per seed of A; nll_b: (N,), a model without seeds (a count model) or
    the mean over B's seeds. Text: the N positions are cut into contiguous chunks and the chunk
    means paired (`utils.metrics.paired_difference`); neighbouring chunks are not independent, so
    the widest half-width over `chunk_counts` is kept. Seeds: t_{k-1} s / sqrt(k) over each seed's
    own mean difference (s the sample sd, ddof = 1), or `seeds_half_width` when given (a pooled
    one, or one that covers B's seeds too). The two are combined as independent errors:
    half-width = sqrt(text^2 + seeds^2).
    """
    from utils.metrics import paired_difference

    a, b = np.asarray(nll_a, dtype=float), np.asarray(nll_b, dtype=float)
    if a.ndim != 2 or b.shape != a.shape[1:] or a.shape[1] < 2 * max(chunk_counts):
        raise ValueError(f"need nll_a (seeds, N) and nll_b (N,) on the same N >= {2 * max(chunk_counts)} "
                         f"positions, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("NaN or inf in the NLLs: pass only the positions every model scores")
    per_seed = (a - b).mean(1)  # (k,)
    diff, text = max((paired_difference(np.stack([c.mean(1) for c in np.array_split(a, n, axis=1)], axis=1),
                                        np.array([c.mean() for c in np.array_split(b, n)]))
                      for n in chunk_counts), key=lambda g: g[1])
    if seeds_half_width is None and len(per_seed) < 2:
        raise ValueError("one seed has no spread: give seeds_half_width (e.g. one pooled over other runs)")
    if seeds_half_width is None:
        seeds_half_width = t_quantile(len(per_seed) - 1) * per_seed.std(ddof=1) / math.sqrt(len(per_seed))
    return Gap(diff, math.hypot(text, seeds_half_width), text, seeds_half_width, per_seed)
