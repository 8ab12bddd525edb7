"""utils.ngram.KneserNeyLM: interpolated (plain and modified) Kneser-Ney language models."""

import time
from collections import Counter

import numpy as np
import pytest

from utils.ngram import KneserNeyLM, NGramLM

STREAM = np.array([2, 4, 5, 4, 5, 6, 4, 5, 4, 7, 5, 6])  # ids in [0, 8), 2 doubles as <sos>

TEXT = """\
It was a bright cold day in April, and the clocks were striking thirteen. The hallway smelt of
boiled cabbage and old rag mats. At one end of it a coloured poster, too large for indoor
display, had been tacked to the wall. It depicted simply an enormous face, more than a metre
wide: the face of a man of about forty-five, with a heavy black moustache and ruggedly handsome
features. He made for the stairs. It was no use trying the lift. Even at the best of times it
was seldom working, and at present the electric current was cut off during daylight hours.
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my
purse, and nothing particular to interest me on shore, I thought I would sail about a little
and see the watery part of the world. It is a way I have of driving off the spleen and
regulating the circulation. Whenever I find myself growing grim about the mouth; whenever it
is a damp, drizzly November in my soul; whenever I find myself involuntarily pausing before
coffin warehouses, and bringing up the rear of every funeral I meet; then, I account it high
time to get to sea as soon as I can. It is a truth universally acknowledged, that a single man
in possession of a good fortune, must be in want of a wife. However little known the feelings
or views of such a man may be on his first entering a neighbourhood, this truth is so well
fixed in the minds of the surrounding families, that he is considered the rightful property
of some one or other of their daughters. In a hole in the ground there lived a hobbit. Not a
nasty, dirty, wet hole, filled with the ends of worms and an oozy smell, nor yet a dry, bare,
sandy hole with nothing in it to sit down on or to eat: it was a hobbit-hole, and that means
comfort. It had a perfectly round door like a porthole, painted green, with a shiny yellow
brass knob in the exact middle. The door opened on to a tube-shaped hall like a tunnel: a very
comfortable tunnel without smoke, with panelled walls, and floors tiled and carpeted.
"""


def char_ids(text):
    chars = sorted(set(TEXT))
    return np.array([3 + chars.index(c) for c in text]), 3 + len(chars)  # 0..2: specials


def reference_probs(train, test, order, V, modified, bos=2):
    """Interpolated Kneser-Ney straight from the equations, with dicts: P(x_t | h) for test."""
    padded = [bos] * (order - 1) + [int(x) for x in train]
    counts = {order: Counter(tuple(padded[i:i + order]) for i in range(len(train)))}
    for m in range(order - 1, 0, -1):  # N1+(. g): distinct (m+1)-grams ending in g
        counts[m] = Counter(g[1:] for g in counts[m + 1])
    discount = {}
    for m, table in counts.items():
        n = Counter(table.values())
        y = n[1] / (n[1] + 2 * n[2]) if n[1] else 0.5  # documented fallback when n1 = 0
        ds = [y, y, y]
        if modified:
            for r in (1, 2, 3):
                d = r - (r + 1) * y * n[r + 1] / n[r] if n[r] else -1
                ds[r - 1] = d if 0 < d <= r else y  # documented fallback
        discount[m] = ds

    def prob(w, h):
        m = len(h) + 1
        lower = 1 / V if m == 1 else prob(w, h[1:])
        after_h = {g[-1]: c for g, c in counts[m].items() if g[:-1] == h}
        total = sum(after_h.values())
        if total == 0:
            return lower
        c = after_h.get(w, 0)
        d = discount[m][min(c, 3) - 1] if c else 0.0
        gamma = sum(discount[m][min(k, 3) - 1] for k in after_h.values()) / total
        return max(c - d, 0) / total + gamma * lower

    padded_test = [bos] * (order - 1) + [int(x) for x in test]
    return np.array([prob(w, tuple(padded_test[t:t + order - 1])) for t, w in enumerate(test)])


@pytest.mark.parametrize("discounts", ["plain", "modified"])
@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_distributions_sum_to_one_and_are_positive(order, discounts):
    model = KneserNeyLM(order, vocab_size=8, discounts=discounts).fit(STREAM)
    for context in ([], [4], [4, 5], [6, 4], [7, 7], [0, 1, 3]):  # seen and unseen contexts
        p = model.next_distribution(context)  # (V,)
        assert p.shape == (8,) and (p > 0).all()
        assert abs(p.sum() - 1) < 1e-12
    assert len(model.discounts_) == order
    assert all(len(d) == (3 if discounts == "modified" else 1) for d in model.discounts_)


@pytest.mark.parametrize("discounts", ["plain", "modified"])
@pytest.mark.parametrize("order", [2, 3])
def test_matches_a_naive_dict_implementation(order, discounts):
    ids, V = char_ids(TEXT)
    train, test = ids[:1500], ids[1500:1900]  # test has contexts never seen in train
    model = KneserNeyLM(order, V, discounts=discounts).fit(train)
    ref = reference_probs(train, test, order, V, discounts == "modified")
    assert np.abs(model.probs(test) - ref).max() < 1e-12
    # and a test stream with a symbol the training text never has (id 0, a special)
    odd = np.array([0, 5, 0, 0, 7])
    assert np.abs(model.probs(odd) - reference_probs(train, odd, order, V, discounts == "modified")
                  ).max() < 1e-12


def test_probability_by_hand():
    model = KneserNeyLM(2, vocab_size=5, discounts="plain").fit([0, 1, 0, 1, 0, 3])
    # padded stream 2 0 1 0 1 0 3 -> bigrams 20, 01, 10, 01, 10, 03: counts 01:2, 10:2, 20:1, 03:1
    # bigram n1 = 2, n2 = 2: D = 2 / (2 + 2*2) = 1/3
    # continuation counts N1+(. w): 0 after {2, 1} -> 2, 1 after {0} -> 1, 3 after {0} -> 1; sum 4
    # unigram n1 = 2, n2 = 1: D = 2 / (2 + 2) = 1/2, gamma = 1/2 * 3 types / 4
    # P1(1) = (1 - 1/2) / 4 + (1.5 / 4) * (1/5) = 0.125 + 0.075 = 0.2
    # P1(4) = 0 + 0.075 (never seen: only the uniform share)
    # context 0: c(0) = 3 (01 twice, 03 once), 2 types: gamma = (1/3 * 2) / 3 = 2/9
    # P(1 | 0) = (2 - 1/3) / 3 + 2/9 * 0.2 = 5/9 + 2/45 = 27/45 = 0.6
    # P(4 | 0) = 2/9 * 0.075 = 1/60
    assert model.discounts_ == [(pytest.approx(0.5),), (pytest.approx(1 / 3),)]
    p = model.next_distribution([0])
    assert p[1] == pytest.approx(0.6, abs=1e-15) and p[4] == pytest.approx(1 / 60, abs=1e-15)
    assert model.next_distribution([4])[1] == pytest.approx(0.2, abs=1e-15)  # unseen context: P1
    assert model.n_grams == 4 + 3  # 4 distinct bigrams, 3 unigrams with continuation counts


def test_discounts_closed_form():
    # unigram counts: 0..3 once (n1 = 4), 4..6 twice (n2 = 3), 7, 8 three times (n3 = 2),
    # 9 four times (n4 = 1), 10 seven times
    stream = np.repeat(np.arange(11), [1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 7])
    y = 4 / (4 + 2 * 3)  # 0.4
    plain = KneserNeyLM(1, 12, discounts="plain").fit(stream)
    assert plain.discounts_ == [(pytest.approx(y),)]
    modified = KneserNeyLM(1, 12, discounts="modified").fit(stream)
    expected = (1 - 2 * y * 3 / 4, 2 - 3 * y * 2 / 3, 3 - 4 * y * 1 / 2)  # 0.4, 1.2, 2.2
    assert modified.discounts_[0] == pytest.approx(expected)
    # the bigram model's lower order: continuation counts, here the bigram table repeated
    assert KneserNeyLM(2, 12).fit(stream).n_grams == len(np.unique(
        np.concatenate([[2], stream[:-1]]) * 12 + stream)) + 11


def test_degenerate_counts_fall_back_and_stay_normalized():
    stream = np.repeat([3, 4, 5], 2)  # every symbol twice: n1 = 0, so Y falls back to 0.5
    model = KneserNeyLM(1, 6, discounts="modified").fit(stream)
    # D1: n1 = 0 -> Y; D2 = 2 - 3 * 0.5 * n3 / n2 = 2 (in (0, 2]); D3+: n3 = 0 -> Y
    assert model.discounts_ == [(0.5, 2.0, 0.5)]
    p = model.next_distribution([])
    assert (p > 0).all() and abs(p.sum() - 1) < 1e-12
    empty = KneserNeyLM(3, 6).fit([])  # nothing counted: uniform
    assert np.allclose(empty.next_distribution([3]), 1 / 6) and empty.perplexity(stream) == (
        pytest.approx(6))


@pytest.mark.parametrize("discounts", ["plain", "modified"])
def test_probs_equal_next_distribution_position_by_position(discounts):
    ids, V = char_ids(TEXT)
    model = KneserNeyLM(4, V, discounts=discounts).fit(ids[:1200])
    test = ids[1200:1400]
    step = np.array([model.next_distribution(test[:t])[w] for t, w in enumerate(test)])
    assert np.abs(model.probs(test) - step).max() < 1e-15
    total, n = model.nll(test)
    assert n == len(test) and total == pytest.approx(-np.log(step).sum())


@pytest.mark.parametrize("order", [3, 4, 5])
def test_beats_add_k_on_held_out_text(order):
    ids, V = char_ids(TEXT)
    cut = int(0.8 * len(ids))
    kn = KneserNeyLM(order, V).fit(ids[:cut]).perplexity(ids[cut:])
    counts = NGramLM(order, V).fit(ids[:cut])
    # add-k even gets its best k chosen on the test text itself
    add_k = min(counts.with_k(k).perplexity(ids[cut:]) for k in (1.0, 0.3, 0.1, 0.03, 0.01, 3e-3))
    assert kn < add_k


def test_choose_order_on_held_out_training_text():
    ids, V = char_ids(TEXT)
    best, held = KneserNeyLM.choose_order(ids, [1, 2, 3, 4], V, discounts="plain")
    assert set(held) == {1, 2, 3, 4} and best.order == min(held, key=held.get)
    assert best.discounts == "plain" and best.tables[0][1].sum() > 0  # refit on all ids
    assert best.n_grams == KneserNeyLM(best.order, V, "plain").fit(ids).n_grams


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="order must be at least 1"):
        KneserNeyLM(0, vocab_size=8)
    with pytest.raises(ValueError, match="discounts must be 'plain' or 'modified'"):
        KneserNeyLM(2, vocab_size=8, discounts="absolute")
    with pytest.raises(ValueError, match="overflows"):
        KneserNeyLM(11, vocab_size=69)
    with pytest.raises(ValueError, match="token ids"):
        KneserNeyLM(2, vocab_size=8).fit([0, 8])
    with pytest.raises(ValueError, match="fit"):
        KneserNeyLM(2, vocab_size=8).probs([0, 1])
    model = KneserNeyLM(2, vocab_size=8).fit(STREAM)
    with pytest.raises(ValueError, match="token ids"):
        model.probs([-1, 3])
    with pytest.raises(ValueError, match="held_out"):
        KneserNeyLM.choose_order(STREAM, [1, 2], 8, held_out=1.0)


def test_sampling_is_seeded_and_in_range():
    model = KneserNeyLM(3, vocab_size=8).fit(STREAM)
    a = model.sample([4], 30, np.random.default_rng(0))
    assert a == model.sample([4], 30, np.random.default_rng(0))
    assert len(a) == 30 and all(0 <= t < 8 for t in a)


def test_order_7_on_a_million_ids_takes_seconds():
    rng = np.random.default_rng(0)
    V = 69
    # text-like ids: 3,000 random "words" (ids 4..68) drawn by a Zipf law, each ended by id 3
    lexicon = [rng.integers(4, V, size=n) for n in rng.integers(1, 9, size=3000)]
    zipf = 1 / np.arange(1, 3001)
    words = rng.choice(3000, size=250_000, p=zipf / zipf.sum())
    ids = np.concatenate([np.append(lexicon[w], 3) for w in words])[:1_000_000]
    assert len(ids) == 1_000_000
    start = time.perf_counter()
    model = KneserNeyLM(7, V).fit(ids)
    fitted = time.perf_counter()
    ppl = model.perplexity(ids[-100_000:])
    seconds = time.perf_counter() - start
    print(f"order 7, 1M ids: fit {fitted - start:.2f} s, score 100k "
          f"{seconds - (fitted - start):.2f} s, {model.n_grams:,} n-grams, PPL {ppl:.2f}")
    assert 1 < ppl < V and seconds < 20  # generous: about 1 s on a 2-core machine


@pytest.mark.parametrize("discounts", ["plain", "modified"])
def test_raw_lower_orders_the_ablation_are_normalised_and_count_like_ngram_lm(discounts):
    """continuation=False: absolute discounting alone; each lower order holds the raw counts
    NGramLM counts for that order (same padding), and every distribution still sums to one."""
    from utils.ngram import NGramLM

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 6, 400)
    model = KneserNeyLM(3, 8, discounts=discounts, continuation=False).fit(ids)
    for m in (1, 2):
        grams, counts = model.tables[m - 1][:2]
        # the last m tokens of every padded trigram: NGramLM(m)'s m-gram at the same position
        ref = NGramLM(m, 8, k=0.0).fit(ids)
        assert dict(zip(grams.tolist(), counts.tolist())) == dict(zip(ref.grams.tolist(),
                                                                        ref.gram_counts.tolist()))
    for ctx in ([], [1], [1, 2], [7, 7]):
        assert model.next_distribution(ctx).sum() == pytest.approx(1.0, abs=1e-12)
    with_cont = KneserNeyLM(3, 8, discounts=discounts).fit(ids)
    assert not np.allclose(with_cont.probs(ids[:50]), model.probs(ids[:50]))


def all_distributions(model, ids):
    """(contexts, V) next-token distributions for every context of `ids`, plus one never seen."""
    keys = model._keys(np.asarray(ids))
    contexts = np.r_[np.unique(keys // model.V), model.V ** (model.order - 1) - 1]  # + an unseen one
    grid = (contexts[:, None] * model.V + np.arange(model.V)[None, :]).ravel()
    return model._probs_of_keys(grid).reshape(len(contexts), model.V)


@pytest.mark.parametrize("size", ["n-grams", "numbers read"])
@pytest.mark.parametrize("discounts", ["plain", "modified"])
def test_pruned_models_hit_the_size_and_stay_normalised(size, discounts):
    ids, V = char_ids(TEXT)
    full = KneserNeyLM(4, V, discounts=discounts).fit(ids)
    measure = {"n-grams": lambda m: m.n_grams, "numbers read": lambda m: m.numbers_read}[size]
    for target in (measure(full) - 1, measure(full) // 2, measure(full) // 5):
        pruned = full.pruned(target, size)
        assert target - 2 <= measure(pruned) <= target  # exact up to one context's two numbers
        p = all_distributions(pruned, ids)
        np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
        assert (p > 0).all()
    assert len(pruned.tables[0][0]) == len(full.tables[0][0])  # the unigrams are never pruned


def test_pruning_nothing_changes_nothing_and_the_rarest_highest_go_first():
    ids, V = char_ids(TEXT)
    full = KneserNeyLM(3, V).fit(ids)
    same = full.pruned(full.n_grams)
    np.testing.assert_array_equal(same.probs(ids), full.probs(ids))
    one_less = full.pruned(full.n_grams - 1)
    (gone,) = np.setdiff1d(full.tables[2][0], one_less.tables[2][0])  # an order-3 n-gram went
    assert full.tables[2][1][np.searchsorted(full.tables[2][0], gone)] == 1  # seen once
    assert all(len(a[0]) == len(b[0]) for a, b in zip(full.tables[:2], one_less.tables[:2]))


def test_a_removed_ngram_is_predicted_through_its_context_by_hand():
    full = KneserNeyLM(2, vocab_size=8, discounts="plain").fit(STREAM)
    grams, counts, d, ctxs, c_h, gamma = full.tables[1]
    pruned = full.pruned(full.n_grams - 1)
    (gone,) = np.setdiff1d(grams, pruned.tables[1][0])
    h, w = divmod(int(gone), 8)
    i, j = np.searchsorted(grams, gone), np.searchsorted(ctxs, h)
    lower = full.tables[0]  # P_1(w): continuation counts, interpolated with the uniform
    n1 = lower[1][np.searchsorted(lower[0], w)]  # w's continuation count (w was seen)
    p1 = (max(n1 - lower[2][min(n1, 3)], 0) + lower[5][0] / 8) / lower[4][0]
    expected = (gamma[j] + counts[i] - d[min(counts[i], 3)]) * p1 / c_h[j]
    np.testing.assert_allclose(pruned.probs(np.array([h, w]))[1], expected)


def test_choose_order_prunes_every_candidate_to_the_size():
    ids, V = char_ids(TEXT * 3)
    model, ppl = KneserNeyLM.choose_order(ids, [2, 3, 4], V, prune_to=(1500, "numbers read"))
    assert set(ppl) == {2, 3, 4} and model.order == min(ppl, key=ppl.get)
    assert model.numbers_read <= 1500


def test_pruning_bad_requests_raise():
    ids, V = char_ids(TEXT)
    model = KneserNeyLM(3, V).fit(ids)
    with pytest.raises(ValueError, match="size must be"):
        model.pruned(100, "bytes")
    with pytest.raises(ValueError, match="below the unigram"):
        model.pruned(5)
    with pytest.raises(ValueError, match="call fit"):
        KneserNeyLM(3, V).pruned(100)


def test_pruning_cuts_on_raw_occurrences_and_keeps_every_kept_ngrams_suffix():
    """One cutoff for all orders on how often an n-gram occurs in the text (not on the
    continuation count the lower orders store), so a kept n-gram's shorter suffixes are kept too."""
    ids, V = char_ids(TEXT)
    full = KneserNeyLM(4, V).fit(ids)
    padded = np.r_[[2] * 3, ids]
    occurs = {}  # (order, key) -> occurrences in the padded text
    for m in (2, 3, 4):
        for g, c in Counter(tuple(padded[i + 4 - m:i + 4]) for i in range(len(ids))).items():
            occurs[m, sum(int(s) * V ** (m - 1 - j) for j, s in enumerate(g))] = c
    for target in (full.n_grams // 2, full.n_grams // 4):
        pruned = full.pruned(target)
        for m in (2, 3):  # every kept (m+1)-gram's last m symbols are a kept m-gram
            assert np.isin(pruned.tables[m][0] % V ** m, pruned.tables[m - 1][0]).all()
        kept = {(m, int(k)) for m in (2, 3, 4) for k in pruned.tables[m - 1][0]}
        assert kept <= set(occurs)
        assert max(c for g, c in occurs.items() if g not in kept) <= min(occurs[g] for g in kept)
