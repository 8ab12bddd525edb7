"""utils.metrics: perplexity helpers against torch, BLEU against sacrebleu."""

import math
import random

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from utils.metrics import (
    BLEUResult,
    brevity_penalty,
    corpus_bleu,
    perplexity,
    sentence_bleu,
    token_nll,
)


def sacre(hyps, refs, **kw):
    """sacrebleu on whitespace tokens; our refs are per sentence, sacrebleu's are streams."""
    streams = [list(s) for s in zip(*refs, strict=True)]
    return sacrebleu.corpus_bleu(hyps, streams, tokenize="none", **kw)


CASES = {  # name: (hypotheses, per-sentence reference lists)
    "real": (["a man in an orange hat looking at something .",
              "a boston terrier runs on green grass ."],
             [["a man in an orange hat starring at something ."],
              ["a boston terrier is running on lush green grass in front of a white fence ."]]),
    "empty hypothesis": ([""], [["a dog runs ."]]),
    "empty among others": (["", "a dog runs on the beach"], [["a cat"], ["a dog runs on sand"]]),
    "shorter than reference": (["a dog"], [["a dog runs along the beach"]]),
    "longer than reference": (["a dog runs along the sandy beach today"], [["a dog runs"]]),
    "repeated words": (["the the the the the the"], [["the cat sat on the mat"]]),
    "multiple references": (["a dog is running on the beach"],
                            [["a dog runs on the beach", "the dog is running on sand",
                              "on the beach a dog is running fast"]]),
    "ref length tie": (["a b c d e"], [["a b c d", "a b c d e f"]]),
    "no match": (["x y z"], [["a b c"]]),
    "identical": (["the same words here"], [["the same words here"]]),
}


@pytest.mark.parametrize("smooth", ["none", "floor", "add-k", "exp"])
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_bleu_equals_sacrebleu(name, smooth):
    hyps, refs = CASES[name]
    ours = corpus_bleu(hyps, refs, smooth=smooth)
    theirs = sacre(hyps, refs, smooth_method=smooth)
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)
    assert ours.bp == pytest.approx(theirs.bp, abs=1e-12)
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)


@pytest.mark.parametrize("name", list(CASES))
def test_sentence_bleu_equals_sacrebleu(name):
    hyps, refs = CASES[name]
    ours = sentence_bleu(hyps[-1], refs[-1])
    theirs = sacrebleu.sentence_bleu(hyps[-1], refs[-1], tokenize="none")
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)


def test_random_corpora_equal_sacrebleu():
    rng, words = random.Random(0), "a b c the dog".split()
    for _ in range(200):
        n, n_refs = rng.randint(1, 3), rng.randint(1, 3)
        hyps = [" ".join(rng.choices(words, k=rng.randint(0, 7))) for _ in range(n)]
        refs = [[" ".join(rng.choices(words, k=rng.randint(1, 7))) for _ in range(n_refs)]
                for _ in range(n)]
        assert corpus_bleu(hyps, refs).score == pytest.approx(sacre(hyps, refs).score, abs=1e-9)


def test_token_lists_equal_strings():
    hyps, refs = CASES["real"]
    as_lists = corpus_bleu([h.split() for h in hyps], [[r.split() for r in rs] for rs in refs])
    assert as_lists == corpus_bleu(hyps, refs)


def test_clipping_and_brevity_penalty_by_hand():
    result = corpus_bleu(*CASES["repeated words"], max_n=1)
    assert result.counts == (2,) and result.totals == (6,)  # "the" occurs twice in the ref
    assert brevity_penalty(4, 6) == pytest.approx(math.exp(1 - 6 / 4))
    assert brevity_penalty(0, 6) == 0.0 and brevity_penalty(7, 6) == 1.0


def test_bad_references_raise():
    with pytest.raises(ValueError, match="list of reference"):
        corpus_bleu(["a b"], ["a b"])  # a bare string instead of [ref]
    with pytest.raises(ValueError, match="hypotheses"):
        corpus_bleu(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="smooth"):
        corpus_bleu(["a"], [["a"]], smooth="bogus")


def test_result_is_frozen_and_prints_like_sacrebleu():
    result = corpus_bleu(*CASES["real"])
    assert isinstance(result, BLEUResult) and str(result).startswith("BLEU = ")
    with pytest.raises(AttributeError):
        result.score = 1.0


def test_token_nll_matches_cross_entropy_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)  # (B, T, V)
    targets = torch.randint(1, 7, (3, 5))  # (B, T)
    targets[0, 3:] = 0
    targets[2, 1:] = 0
    total, count = token_nll(logits, targets, pad_id=0)
    assert total.shape == () and count == int((targets != 0).sum())
    mean = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=0)
    assert torch.allclose(total / count, mean)
    padded_more = torch.cat([logits, torch.randn(3, 2, 7)], dim=1)  # (B, T+2, V)
    more_targets = torch.cat([targets, torch.zeros(3, 2, dtype=torch.long)], dim=1)
    total2, count2 = token_nll(padded_more, more_targets, pad_id=0)
    assert count2 == count and torch.allclose(total2, total)


def test_token_nll_shape_error():
    with pytest.raises(ValueError, match="expected logits"):
        token_nll(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long))


def test_perplexity_of_uniform_and_perfect_models():
    V, B, T = 11, 2, 6
    targets = torch.randint(0, V, (B, T))  # (B, T)
    total, count = token_nll(torch.zeros(B, T, V), targets, pad_id=None)  # uniform logits
    assert perplexity(total.item(), count) == pytest.approx(V)
    perfect = F.one_hot(targets, V).float() * 1e4  # (B, T, V), all mass on the target
    assert perplexity(token_nll(perfect, targets, pad_id=None)[0].item(), count) == 1.0
    assert perplexity(float("inf"), 3) == math.inf
    with pytest.raises(ValueError):
        perplexity(1.0, 0)


def test_perplexity_of_a_nan_loss_is_nan():
    """A diverged model has no perplexity: nan, not inf."""
    assert math.isnan(perplexity(float("nan"), 10))
    assert perplexity(1e6, 1) == math.inf  # a finite but huge loss still overflows to inf


def test_paired_difference_is_the_mean_gain_with_a_paired_interval():
    import numpy as np

    from utils.metrics import paired_difference

    rng = np.random.default_rng(0)
    b = rng.random(4000) < 0.8
    a = b.copy()
    a[rng.choice(np.flatnonzero(~b), 80, replace=False)] = True  # a fixes 80 of b's errors
    d, half = paired_difference(a, b)
    assert d == pytest.approx(80 / 4000) and 0 < half < d  # a clear, paired gain
    assert paired_difference(b, b) == (0.0, 0.0)
    seeds = np.stack([a, b])  # two seeds: each example counts the share of seeds right
    assert paired_difference(seeds, b)[0] == pytest.approx(40 / 4000)
    with pytest.raises(ValueError, match="same N"):
        paired_difference(a, b[:10])


def test_paired_difference_half_width_uses_the_sample_standard_deviation():
    """d = a - b = (1, 0, 1, 0): mean 1/2, sample variance 4 (1/2)^2 / (4 - 1) = 1/3, so the
    half-width is 1.96 sqrt(1/3) / sqrt(4); the population std (ddof=0, 1/2) gives 0.49."""
    from utils.metrics import paired_difference

    d, half = paired_difference([1, 1, 1, 0], [0, 1, 0, 0])
    assert d == 0.5 and half == pytest.approx(1.96 * math.sqrt(1 / 3) / 2)
