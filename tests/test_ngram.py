"""utils.ngram: add-k n-gram language models."""

import math

import numpy as np
import pytest

from utils.ngram import InterpolatedNGramLM, NGramLM

STREAM = np.array([2, 4, 5, 4, 5, 6, 4, 5, 4, 7, 5, 6])  # ids in [0, 8), 2 doubles as <sos>


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("k", [0.0, 0.5, 1.0])
def test_distributions_sum_to_one(order, k):
    model = NGramLM(order, vocab_size=8, k=k).fit(STREAM)
    for context in ([], [4], [4, 5], [6, 4], [7, 7]):  # seen and unseen contexts
        p = model.next_distribution(context)
        assert p.shape == (8,) and (p >= 0).all()
        if k > 0 or p.sum() > 0:  # k = 0 gives no mass to a context never seen
            assert p.sum() == pytest.approx(1.0)


def test_probabilities_match_counting_by_hand():
    model = NGramLM(2, vocab_size=8, k=1.0).fit(STREAM)
    # bigrams starting with 4 in the padded stream: 45, 45, 45, 47 -> count(4) = 4
    assert model.next_distribution([4])[5] == pytest.approx((3 + 1) / (4 + 8))
    assert model.next_distribution([4])[6] == pytest.approx((0 + 1) / (4 + 8))
    mle = NGramLM(1, vocab_size=8, k=0.0).fit(STREAM)
    assert mle.next_distribution([])[4] == pytest.approx(4 / len(STREAM))


def test_probs_shape_and_with_k_shares_counts():
    model = NGramLM(3, vocab_size=8, k=1.0).fit(STREAM)
    assert model.probs(STREAM[:5]).shape == (5,)
    sharp = model.with_k(0.01)
    assert sharp.grams is model.grams and sharp.k == 0.01
    assert sharp.perplexity(STREAM) < model.perplexity(STREAM)  # training data: less smoothing fits better


def test_uniform_and_zero_probability_perplexity():
    V = 8
    empty_counts = NGramLM(1, vocab_size=V, k=1.0).fit([])  # no data: add-k is uniform
    assert empty_counts.perplexity(STREAM) == pytest.approx(V)
    mle = NGramLM(2, vocab_size=V, k=0.0).fit(STREAM)
    assert mle.perplexity([4, 3]) == math.inf  # bigram 4->3 never seen


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="token ids"):
        NGramLM(2, vocab_size=4).fit([0, 5])
    with pytest.raises(ValueError, match="fit"):
        NGramLM(2, vocab_size=4).probs([0, 1])
    with pytest.raises(AssertionError, match="order"):
        NGramLM(0, vocab_size=4)


def test_sampling_is_seeded_and_in_range():
    model = NGramLM(2, vocab_size=8, k=0.1).fit(STREAM)
    a = model.sample([4], 20, np.random.default_rng(0))
    b = model.sample([4], 20, np.random.default_rng(0))
    assert a == b and all(0 <= t < 8 for t in a)


def test_overfit_a_deterministic_stream():
    cycle = np.tile([4, 5, 6, 7], 50)  # fully predictable from one previous token
    model = NGramLM(2, vocab_size=8, k=1e-6).fit(cycle)
    assert model.perplexity(cycle) < 1.001


@pytest.mark.parametrize("k", [1e-3, 0.01])
def test_unseen_context_with_small_k_is_uniform(k):
    """k * V < 1 and an unseen context: every word gets 1/V (it used to get k, summing to k*V)."""
    lm = NGramLM(order=3, vocab_size=10, k=k).fit([4, 5, 6, 4, 5, 6])
    p = lm.next_distribution([9, 9])  # the context (9, 9) never occurs
    np.testing.assert_allclose(p, np.full(10, 0.1))
    assert math.isclose(p.sum(), 1.0)


def test_next_distribution_rejects_out_of_range_context():
    lm = NGramLM(order=2, vocab_size=5).fit([0, 1, 2, 3, 4])
    for bad in ([5], [-1]):
        with pytest.raises(ValueError, match="token ids must lie in"):
            lm.next_distribution(bad)


def _markov_stream(n, V=6, seed=0):
    """Ids from a random second-order Markov source: order 3 is the true model."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(V, 0.3), size=(V, V))  # P(x_t | x_{t-2}, x_{t-1})
    out = [0, 1]
    for _ in range(n):
        out.append(int(rng.choice(V, p=table[out[-2], out[-1]])))
    return np.array(out)


def test_interpolation_weights_and_held_out_choice():
    stream = _markov_stream(8000)
    train, fresh = stream[:6000], stream[6000:]  # one source, unseen text
    lm = InterpolatedNGramLM(5, vocab_size=6).fit(train)
    assert np.all(lm.weights >= 0) and math.isclose(lm.weights.sum(), 1.0)
    assert lm.k in lm.ks and len(lm.models) == 5 and 0 < lm.held_out_nll < math.log(6)
    assert math.isclose(lm.probs(fresh).sum() / len(fresh), lm.probs(fresh).mean())
    singles = [NGramLM(n, 6, lm.k).fit(train).perplexity(fresh) for n in range(1, 6)]
    assert lm.perplexity(fresh) <= min(singles) * 1.01  # the mixture is at least as good as any order
    assert lm.weights[0] < 0.2  # a unigram explains little of a second-order source


def test_interpolation_refuses_bad_settings_and_unfitted_use():
    with pytest.raises(ValueError, match="held_out"):
        InterpolatedNGramLM(3, 5, held_out=1.0)
    with pytest.raises(ValueError, match="fit"):
        InterpolatedNGramLM(3, 5).probs([1, 2])


def test_interpolation_never_keeps_a_nan_held_out_loss_whatever_the_order_of_ks():
    """k = 0 gives a held-out token seen only there probability 0 under every order: EM's shares
    are 0 / 0 and the held-out loss NaN. First in the grid, that NaN once stayed the best
    (NaN < x is always False), and every probability of the fitted model was NaN."""
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(0, 5, 200), [5], rng.integers(0, 5, 20)])  # a 5 only held out
    first = InterpolatedNGramLM(3, 6, ks=(0.0, 0.01, 0.1)).fit(ids)
    last = InterpolatedNGramLM(3, 6, ks=(0.01, 0.1, 0.0)).fit(ids)
    assert first.k == last.k == 0.1 and np.array_equal(first.weights, last.weights)
    assert math.isfinite(first.held_out_nll) and np.all(np.isfinite(first.probs(ids)))
