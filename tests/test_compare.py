"""Tests of the decision helpers in utils.compare: each reproduces the notebook code it replaces.

The reference functions below are copied from the notebooks (09 cell 25, 12 cells 37 and 50,
06 cell 70) and compared with the helpers on small synthetic inputs, then the edge cases.
"""

import math

import numpy as np
import pytest

from utils.compare import Decision, binomial_half_width, keep_or_drop, paired_bootstrap
from utils.metrics import paired_difference


# ---------------------------------------------------------------------------- the notebooks' inline code
def paired_interval_09(hits_a, hits_b, n_boot=2000, seed=0):  # notebook 09, cell 25
    a, b = np.mean(hits_a, 0), np.mean(hits_b, 0)
    idx = np.random.default_rng(seed).integers(0, len(a), (n_boot, len(a)))
    return tuple(np.percentile(a[idx].mean(1) - b[idx].mean(1), [2.5, 97.5]))


def verdict_09(gains, interval, macs_ratio, simpler):  # notebook 09, cell 25
    if min(gains) > 0 and interval[0] > 0:
        return "kept: gains on every seed"
    if max(gains) < 0 and interval[1] < 0:
        return "dropped: loses on every seed"
    if abs(macs_ratio - 1) > 0.1:
        return "kept: tie, cheaper" if macs_ratio < 1 else "dropped: tie, dearer"
    return "kept: tie, simpler" if simpler == "change" else "dropped: tie, not simpler"


def paired_12(a, b):  # notebook 12, cell 50
    d = a.astype(float) - b.astype(float)
    return float(d.mean()), float(1.96 * d.std(ddof=1) / math.sqrt(len(d)))


def interval_12(acc, n):  # notebook 12, cell 37 (and cell 63, 06 cell 70: the same formula)
    return 1.96 * math.sqrt(acc * (1 - acc) / n)


def hits_pair(seeds=2, n=300, gap=0.05, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((seeds, n)) < 0.8 + gap, rng.random((seeds, n)) < 0.8  # (seeds, N) bool each


# ---------------------------------------------------------------------------- binomial_half_width
@pytest.mark.parametrize("acc,n", [(0.9, 2500), (0.5, 2000), (0.858, 25_000), (0.1, 150_210), (0.0, 10), (1.0, 3)])
def test_binomial_half_width_is_notebook_12s_interval(acc, n):
    assert binomial_half_width(acc, n) == interval_12(acc, n)


@pytest.mark.parametrize("acc,n", [(-0.1, 10), (1.2, 10), (0.5, 0), (math.nan, 10)])
def test_binomial_half_width_rejects_a_non_accuracy_or_no_examples(acc, n):
    with pytest.raises(ValueError, match="accuracy"):
        binomial_half_width(acc, n)


# ---------------------------------------------------------------------------- paired intervals
@pytest.mark.parametrize("seeds,n,gap,n_boot,seed", [(2, 300, 0.05, 2000, 0), (2, 50, 0.0, 500, 3),
                                                    (3, 1000, -0.02, 200, 1), (1, 2, 0.1, 100, 0)])
def test_paired_bootstrap_is_notebook_09s_paired_interval(seeds, n, gap, n_boot, seed):
    a, b = hits_pair(seeds, n, gap, seed)
    lo, hi = paired_bootstrap(a, b, n_boot, seed)
    assert (lo, hi) == paired_interval_09(a, b, n_boot, seed)  # exactly: the same draws, the same percentiles
    assert isinstance(lo, float) and lo <= hi


def test_paired_bootstrap_averages_the_seeds_per_example_and_pairs_the_draws():
    a, b = hits_pair()
    assert paired_bootstrap(a, b) == paired_bootstrap(a.mean(0), b.mean(0))  # (seeds, N) = the shares (N,)
    assert paired_bootstrap(a[:1], b[:1]) == paired_bootstrap(a[0], b[0])  # one seed = (N,)
    assert paired_bootstrap(a, a) == (0.0, 0.0)  # the same model: every draw's gain is 0
    lo, hi = paired_bootstrap(a, b)
    d, half = paired_difference(a, b)  # the normal approximation of the same difference
    assert lo < d < hi and abs((hi - lo) / 2 - half) < 0.3 * half


@pytest.mark.parametrize("a,b,n_boot", [(np.ones((2, 5)), np.ones((2, 6)), 10), (np.ones((2, 5)), np.ones((3, 5)), 10),
                                        (np.ones(1), np.ones(1), 10), (np.ones((2, 2, 2)), np.ones((2, 2, 2)), 10),
                                        (np.ones(5), np.ones(5), 0)])
def test_paired_bootstrap_rejects_unpaired_or_empty_inputs(a, b, n_boot):
    with pytest.raises(ValueError, match="same N >= 2"):
        paired_bootstrap(a, b, n_boot)


def test_notebook_12s_paired_difference_is_utils_metrics_paired_difference():
    # 12's inline `paired` (cell 50) pairs per test review, as utils.metrics.paired_difference does
    for seed in range(5):
        a, b = hits_pair(1, 400, 0.03 * seed, seed)
        assert paired_difference(a[0], b[0]) == paired_12(a[0], b[0])


# ---------------------------------------------------------------------------- the ladder's rule
CASES = [  # (gains per seed, interval, multiply-adds ratio, simpler side)
    ([-0.0024, 0.0024], (-0.006, 0.006), 1.0, "change"),  # 09's rungs, as its markdown reads them
    ([-0.0032, 0.0248], (0.002, 0.018), 4.04 / 5.02, "current"),
    ([0.051, 0.070], (0.05, 0.07), 1.0, "current"),
    ([0.0024, 0.0020], (-0.002, 0.006), 1.0, "current"),
    ([-0.010, -0.016], (-0.02, -0.006), 1.0, "current"),
    ([0.026, 0.012], (0.01, 0.03), 2.0, "current"),
    ([0.01, 0.02], (0.0, 0.03), 1.0, "current"),  # the interval ends exactly at 0: a tie
    ([-0.01, -0.02], (-0.03, 0.0), 1.0, "change"),
    ([0.0, 0.02], (0.001, 0.03), 1.0, "change"),  # one seed exactly level: a tie
    ([0.01, 0.02], (-0.001, 0.03), 1.3, "change"),  # a tie at higher cost: dearer, whatever is simpler
    ([0.01, 0.02], (-0.001, 0.03), 0.7, "current"),
    ([0.01, 0.02], (-0.001, 0.03), 1.05, "current"),  # within 10%: equal cost
    ([0.01], (0.001, 0.02), 1.0, "current"),  # one seed
    ([0.01, 0.02, 0.03], (0.001, 0.03), 1.0, "current"),
]


@pytest.mark.parametrize("gains,interval,ratio,simpler", CASES)
def test_keep_or_drop_is_notebook_09s_verdict(gains, interval, ratio, simpler):
    decision = keep_or_drop(gains, interval, ratio, simpler)
    assert decision.reason == str(decision) == f"{decision}" == verdict_09(gains, interval, ratio, simpler)
    assert decision.kept == decision.reason.startswith("kept")  # what 09 tests with .startswith("kept")
    kept, reason = decision  # a (decision, sentence) pair
    assert isinstance(decision, Decision) and isinstance(kept, bool)


def test_keep_or_drop_reads_the_rungs_as_09s_markdown_does():
    assert str(keep_or_drop([-0.0024, 0.0024], (-0.006, 0.006), 1.0, "change")) == "kept: tie, simpler"
    assert str(keep_or_drop([-0.0032, 0.0248], (0.002, 0.018), 4.04 / 5.02, "current")) == "kept: tie, cheaper"
    assert str(keep_or_drop([0.0024, 0.0020], (-0.002, 0.006), 1.0, "current")) == "dropped: tie, not simpler"
    assert keep_or_drop([0.01, 0.02], (0.0, 0.03), 1.0, "current") == (False, "dropped: tie, not simpler")
    assert keep_or_drop([0.01, 0.02], (1e-9, 0.03), 1.0, "current") == (True, "kept: gains on every seed")


def test_keep_or_drop_on_a_synthetic_rung_matches_the_inline_ladder_step():
    for gap, seed in ((0.06, 0), (0.0, 1), (-0.06, 2), (0.01, 3)):
        hits, best_hits = hits_pair(2, 500, gap, seed)
        gains = list(hits.mean(1) - best_hits.mean(1))
        interval = paired_bootstrap(hits, best_hits)
        assert interval == paired_interval_09(hits, best_hits)
        assert str(keep_or_drop(gains, interval, 1.0, "current")) == verdict_09(gains, interval, 1.0, "current")


@pytest.mark.parametrize("gains,interval,ratio,simpler,match", [
    ([], (0.0, 0.1), 1.0, "current", "finite gain"),
    ([math.nan, 0.1], (0.0, 0.1), 1.0, "current", "finite gain"),
    ([0.1, 0.1], (0.1, 0.0), 1.0, "current", "lo <= hi"),
    ([0.1, 0.1], (0.0, math.inf), 1.0, "current", "finite"),
    ([0.1, 0.1], (0.0, 0.1), 0.0, "current", "ratio > 0"),
    ([0.1, 0.1], (0.0, 0.1), 1.0, "the change", "simpler"),
])
def test_keep_or_drop_rejects_bad_inputs(gains, interval, ratio, simpler, match):
    with pytest.raises(ValueError, match=match):
        keep_or_drop(gains, interval, ratio, simpler)


# ---------------------------------------------------------------------------- notebook 03's gap, cell 61 (2026-12-06)
def rnn_gap_03(rnn_nll, bar_nll, scored):
    """Notebook 03's inline rule: chunks of the scored positions (20 and 100, the wider), paired
    chunk means, and a t interval over each seed's own difference, combined in quadrature."""
    T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}
    by_chunks = []
    for n_chunks in (20, 100):
        chunks = np.array_split(np.flatnonzero(scored), n_chunks)
        rnn = np.array([[seed_nll[c].mean() for c in chunks] for seed_nll in rnn_nll])
        bar = np.array([bar_nll[c].mean() for c in chunks])
        by_chunks.append((*paired_difference(rnn, bar), (rnn - bar).mean(1)))
    d, w_text, per_seed = max(by_chunks, key=lambda g: g[1])
    w_seeds = T_975[len(per_seed) - 1] * per_seed.std(ddof=1) / math.sqrt(len(per_seed))
    return d, math.hypot(w_text, w_seeds), w_text, w_seeds


@pytest.mark.parametrize("seeds", [2, 3, 4])
def test_gap_over_text_and_seeds_is_notebook_03s_rule(seeds):
    from utils.compare import gap_over_text_and_seeds

    rng = np.random.default_rng(seeds)
    n = 5_000
    bar = rng.gamma(2.0, 0.8, n)
    rnn = bar + 0.05 + rng.normal(0, 0.3, (seeds, n)) + rng.normal(0, 0.01, (seeds, 1))
    scored = rng.random(n) > 0.05
    gap = gap_over_text_and_seeds(rnn[:, scored], bar[scored])
    np.testing.assert_allclose(gap[:4], rnn_gap_03(rnn, bar, scored), rtol=2e-3)  # the table's t: 3 decimals
    np.testing.assert_allclose(gap.per_seed, (rnn[:, scored] - bar[scored]).mean(1))


def test_gap_over_text_and_seeds_takes_a_given_seed_half_width_and_rejects_bad_input():
    from utils.compare import gap_over_text_and_seeds, t_quantile

    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 0.2, (1, 400)), rng.normal(1.0, 0.2, 400)
    gap = gap_over_text_and_seeds(a, b, seeds_half_width=0.03)
    assert gap.seeds == 0.03 and gap.half_width == pytest.approx(math.hypot(gap.text, 0.03))
    with pytest.raises(ValueError, match="one seed"):
        gap_over_text_and_seeds(a, b)
    with pytest.raises(ValueError, match="same N"):
        gap_over_text_and_seeds(a, b[:-1])
    with pytest.raises(ValueError, match="NaN"):
        gap_over_text_and_seeds(np.r_[a[0, :-1], np.nan][None], b, seeds_half_width=0.0)
    assert t_quantile(2) == pytest.approx(4.303, abs=1e-3) and t_quantile(3) == pytest.approx(3.182, abs=1e-3)


def test_paired_bleu_bootstrap_matches_sacrebleu_and_covers_the_difference():
    from sacrebleu.metrics import BLEU

    from utils.compare import paired_bleu_bootstrap

    rng = np.random.default_rng(0)
    words = "a man dog runs on the grass in front of white fence two girls play ball".split()
    refs = [" ".join(rng.choice(words, rng.integers(5, 12))) for _ in range(60)]
    noisy = [" ".join(w if rng.random() > 0.3 else "x" for w in r.split()) for r in refs]  # 30% words wrong
    noisier = [" ".join(w if rng.random() > 0.5 else "x" for w in r.split()) for r in refs]
    diff, lo, hi = paired_bleu_bootstrap(noisy, noisier, refs, n_boot=300)
    expected = BLEU().corpus_score(noisy, [refs]).score - BLEU().corpus_score(noisier, [refs]).score
    assert diff == pytest.approx(expected, abs=1e-9)  # the full-sample difference is sacreBLEU's
    assert lo < diff < hi and lo > 0  # a clear gap: the interval excludes 0
    assert paired_bleu_bootstrap(noisy, noisy, refs, n_boot=50) == (0.0, 0.0, 0.0)  # a system against itself
    with pytest.raises(ValueError, match="N references"):
        paired_bleu_bootstrap(noisy, noisier[:-1], refs)
