"""Tests of utils.classifiers: shapes, padding invariance, overfitting, meta device, leakage."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import precision_recall_fscore_support

from utils.classifiers import (
    PAD_ID,
    BagOfEmbeddings,
    EmbeddingMLP,
    FastText,
    NBWeightedBag,
    RecurrentClassifier,
    SparseBatches,
    TextCNN,
    bag_step,
    classification_metrics,
    classify_step,
    cut,
    every_token_step,
    fraction_of,
    length_mask,
    log_count_ratio,
    make_loader,
    predict,
    sparse_adagrad,
    split_indices,
)

V, E, H, C = 30, 8, 12, 2
MODELS = {
    "nbow": lambda: BagOfEmbeddings(V, E, C),
    "nopool": lambda: BagOfEmbeddings(V, E, C, pool="none"),
    "fasttext": lambda: FastText(V, E, C, n_buckets=64),
    "lstm": lambda: RecurrentClassifier(V, E, H, C),
    "gru": lambda: RecurrentClassifier(V, E, H, C, cell="gru"),
    "bilstm": lambda: RecurrentClassifier(V, E, H, C, bidirectional=True),
    "lstm_gather": lambda: RecurrentClassifier(V, E, H, C, read="gather"),
    "cnn": lambda: TextCNN(V, E, C, widths=(2, 3), n_filters=6, dropout=0.0),
}


def toy_batch(B=5, T=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 1, 3, T - 1, 2][:B])  # (B,), includes a one-token review
    tokens = torch.randint(1, V, (B, T), generator=gen)  # (B, T), no <pad> yet
    return tokens.masked_fill(~length_mask(lengths, T), 0), lengths


@pytest.mark.parametrize("name", MODELS)
def test_shape(name):
    tokens, lengths = toy_batch()
    assert MODELS[name]()(tokens, lengths).shape == (5, C)


@pytest.mark.parametrize("name", MODELS)
def test_padding_does_not_change_logits(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    tokens, lengths = toy_batch()
    padded = F.pad(tokens, (0, 9))  # (B, T + 9): nine more <pad> columns
    diff = (model(tokens, lengths) - model(padded, lengths)).abs().max().item()
    print(f"{name}: max |logits(T) - logits(T + 9)| = {diff:.1e}")
    assert diff < 1e-6


@pytest.mark.parametrize("name", MODELS)
def test_each_review_gets_the_logits_it_gets_alone(name):
    # a review's logits must not depend on its batch-mates (e.g. through the longest length)
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    tokens, lengths = toy_batch()
    together = model(tokens, lengths)  # (B, C)
    alone = torch.cat([model(tokens[i:i + 1], lengths[i:i + 1]) for i in range(len(lengths))])
    diff = (together - alone).abs().max().item()
    print(f"{name}: max |logits in the batch - logits alone| = {diff:.1e}")
    assert diff < 1e-6


@pytest.mark.parametrize("pad_row", ["zero", "nonzero"])
def test_bag_of_embeddings_averages_the_real_tokens_only(pad_row):
    """The <pad> row starts at zero (padding_idx), which hides a mean that sums the pad
    positions too; loaded or edited embeddings need not keep it zero, so the mask must."""
    torch.manual_seed(0)
    model = BagOfEmbeddings(V, E, C).eval()
    if pad_row == "nonzero":
        with torch.no_grad():
            model.embedding.weight[PAD_ID] = 1.0
    tokens, lengths = toy_batch()
    means = torch.stack([model.embedding(tokens[i, :n]).mean(0) for i, n in enumerate(lengths)])
    assert torch.allclose(model(tokens, lengths), model.head(means), atol=1e-6)


def test_padded_last_read_does_depend_on_padding():
    torch.manual_seed(0)
    model = RecurrentClassifier(V, E, H, C, read="padded_last").eval()
    tokens, lengths = toy_batch()
    diff = (model(tokens, lengths) - model(F.pad(tokens, (0, 9)), lengths)).abs().max().item()
    assert diff > 1e-4, "the seed's out[:, -1] read should see the padding"


def test_final_state_matches_unpadded_run():
    """h_n of the packed batch = the state after the last real token of each review alone."""
    torch.manual_seed(0)
    model = RecurrentClassifier(V, E, H, C, bidirectional=True).eval()
    tokens, lengths = toy_batch()
    batched = model(tokens, lengths)  # (B, C)
    alone = torch.cat([model(tokens[i:i + 1, :n], lengths[i:i + 1]) for i, n in
                       enumerate(lengths.tolist())])  # (B, C)
    diff = (batched - alone).abs().max().item()
    print(f"packed batch vs one review at a time: max |diff| = {diff:.1e}")
    assert diff < 1e-6


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_forget_bias_opens_the_keep_gate(cell):
    # rows H..2H are the LSTM's forget gate and the GRU's update gate; the GRU used to stay shut
    model = RecurrentClassifier(V, E, H, C, cell=cell, bidirectional=True, forget_bias=2.0)
    for suffix in ("l0", "l0_reverse"):
        assert torch.all(getattr(model.rnn, f"bias_ih_{suffix}")[H:2 * H] == 2.0)
        assert torch.all(getattr(model.rnn, f"bias_hh_{suffix}")[H:2 * H] == 0.0)
    # the default is the course's open gate, the same as notebooks 04 and 05 use
    from utils.gated import OPEN_GATE_BIAS
    default = RecurrentClassifier(V, E, H, C, cell=cell)
    assert OPEN_GATE_BIAS == 2.0 and torch.all(default.rnn.bias_ih_l0[H:2 * H] == OPEN_GATE_BIAS)


def test_fasttext_bigrams_see_word_order():
    torch.manual_seed(0)
    model = FastText(V, E, C, n_buckets=64).eval()
    a, lengths = torch.tensor([[3, 4, 5]]), torch.tensor([3])
    nbow_like = BagOfEmbeddings(V, E, C).eval()
    assert torch.allclose(nbow_like(a, lengths), nbow_like(a.flip(1), lengths))
    assert not torch.allclose(model(a, lengths), model(a.flip(1), lengths))


@pytest.mark.parametrize("name", MODELS)
def test_tiny_overfit(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    tokens, lengths = toy_batch(seed=1)
    labels = torch.tensor([0, 1, 1, 0, 1])
    opt = (sparse_adagrad(model, lr=0.5) if name == "fasttext"
           else torch.optim.Adam(model.parameters(), lr=0.05))
    for _ in range(60):
        loss = F.cross_entropy(model(tokens, lengths), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"{name} did not fit 5 examples: loss {loss.item():.3f}"


@pytest.mark.parametrize("name", MODELS)
def test_meta_device_forward(name):
    model = MODELS[name]().to("meta")
    tokens, lengths = toy_batch()
    if isinstance(model, RecurrentClassifier):
        lengths_in = lengths  # packing reads lengths on the CPU by torch's design
    else:
        lengths_in = lengths.to("meta")
    out = model(tokens.to("meta"), lengths_in)
    assert out.device.type == "meta" and out.shape == (5, C)


def test_embedding_mlp():
    torch.manual_seed(0)
    model = EmbeddingMLP(16, hidden=8, dropout=0.0)
    x, y = torch.randn(6, 16), torch.tensor([0, 1, 0, 1, 1, 0])
    assert model(x).shape == (6, C)
    assert model.to("meta")(x.to("meta")).device.type == "meta"
    model = EmbeddingMLP(16, hidden=8, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    with pytest.raises(ValueError, match="sentence vectors"):
        model(x[0])


def test_bad_inputs_say_what_is_wrong():
    model = BagOfEmbeddings(V, E, C)
    with pytest.raises(ValueError, match=r"tokens must be \(B, T\)"):
        model(torch.tensor([1, 2, 3]), torch.tensor([3]))
    with pytest.raises(ValueError, match="lengths must be"):
        model(torch.tensor([[1, 2, 3]]), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="cell must be"):
        RecurrentClassifier(V, E, H, C, cell="rnn")


def test_metrics_match_sklearn():
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    ours = classification_metrics(y, p)
    prec, rec, f1, _ = precision_recall_fscore_support(y, p, average="binary")
    diff = max(abs(ours["precision"] - prec), abs(ours["recall"] - rec), abs(ours["f1"] - f1))
    print(f"ours vs sklearn: max |diff| = {diff:.1e}")
    assert diff < 1e-12 and ours["acc"] == (y == p).mean()
    assert classification_metrics([0, 0], [0, 0])["f1"] == 0.0  # no positives at all


def test_split_and_subset_are_leakage_free():
    train_idx, val_idx = split_indices(1000, 100, seed=3)
    assert len(train_idx) == 900 and len(val_idx) == 100
    assert not set(train_idx) & set(val_idx)
    assert set(train_idx) | set(val_idx) == set(range(1000))
    subset = fraction_of(train_idx, 0.1, seed=3)
    assert len(subset) == 90 and len(set(subset)) == 90
    assert not set(subset) & set(val_idx), "the 10% subset must not touch the validation slice"
    assert set(subset) <= set(train_idx)
    with pytest.raises(ValueError):
        split_indices(10, 10)


def test_loader_step_and_predict_agree():
    torch.manual_seed(0)
    ids = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    labels = np.array([0, 1, 0, 1])
    model = BagOfEmbeddings(V, E, C).eval()
    probs, ys = predict(model, make_loader(ids, labels, 3, shuffle=False))  # sorted by length
    plain, _ = predict(model, make_loader(ids, labels, 3, shuffle=False, sort=False))
    assert probs.shape == (4,) and (ys == labels).all()
    assert np.allclose(probs, plain, atol=1e-6), "predict must undo the sort by length"
    batch = next(iter(make_loader(ids, labels, 4, shuffle=True, max_len=2)))
    assert batch.tokens.shape[1] <= 2
    out = classify_step(model, batch)
    assert out["n"] == 4 and out["loss"].dim() == 0


def test_gather_read_equals_the_packed_final_state():
    torch.manual_seed(0)
    packed, gathered = RecurrentClassifier(V, E, H, C), RecurrentClassifier(V, E, H, C, read="gather")
    gathered.load_state_dict(packed.state_dict())
    tokens, lengths = toy_batch()
    torch.testing.assert_close(packed(tokens, lengths), gathered(tokens, lengths))
    with pytest.raises(ValueError, match="backward pass over a padded batch"):
        RecurrentClassifier(V, E, H, C, bidirectional=True, read="gather")


def test_cut_keeps_head_tail_or_both_ends():
    ids = list(range(10))
    assert cut(ids, 4, "head") == [0, 1, 2, 3] and cut(ids, 4, "tail") == [6, 7, 8, 9]
    assert cut(ids, 5, "head+tail") == [0, 1, 2, 8, 9] and cut(ids, None) == ids and cut(ids, 20, "tail") == ids
    with pytest.raises(ValueError, match="keep must be"):
        cut(ids, 4, "middle")
    loader = make_loader([ids], [1], 1, shuffle=False, max_len=3, keep="tail")
    assert next(iter(loader)).tokens.tolist() == [[7, 8, 9]]


def test_every_token_step_trains_each_real_token_on_the_review_label():
    from utils.text import Batch

    torch.manual_seed(0)
    model = BagOfEmbeddings(V, E, C, pool="none")
    tokens, lengths = toy_batch()
    batch = Batch(tokens, lengths, tokens != 0, torch.tensor([0, 1, 0, 1, 1]))
    out = every_token_step(model, batch)
    logits = model.token_logits(tokens)[batch.mask]  # (N, C)
    labels = batch.labels[:, None].expand_as(tokens)[batch.mask]
    assert out["n"] == int(lengths.sum())
    torch.testing.assert_close(out["loss"], F.cross_entropy(logits, labels))


def test_log_count_ratio_normalises_each_class_by_its_own_total():
    """r_j = log((p_j / |p|_1) / (q_j / |q|_1)): with more n-grams in the positive reviews
    than in the negative ones, the L1 normalisation moves every ratio (the toy below has
    equal totals, where it would not show)."""
    import scipy.sparse as sp

    X = sp.csr_matrix(np.array([[1, 1, 1], [1, 1, 0], [0, 0, 1]]))
    y = np.array([1, 1, 0])
    p, q = 1 + np.array([2, 2, 1]), 1 + np.array([0, 0, 1])  # alpha = 1 plus counts: |p| 8, |q| 4
    expected = np.log((p / 8) / (q / 4))
    torch.testing.assert_close(log_count_ratio(X, y), torch.tensor(expected, dtype=torch.float32))


def test_nb_weighted_bag_is_naive_bayes_log_ratios_under_a_linear_layer():
    import scipy.sparse as sp

    X = sp.csr_matrix(np.array([[1, 1, 0], [1, 0, 0], [0, 1, 1], [0, 0, 1]]))
    y = np.array([1, 1, 0, 0])
    r = log_count_ratio(X, y)  # feature 0 only in positives, feature 2 only in negatives
    p, q = np.array([3, 2, 1]) / 6, np.array([1, 2, 3]) / 6
    torch.testing.assert_close(r, torch.tensor(np.log(p / q), dtype=torch.float32))
    model = NBWeightedBag(r)
    with torch.no_grad():
        model.bag.weight[:, 1] = 1.0  # logit_pos = sum of r over the review's features
    ids, offsets, labels = next(iter(SparseBatches(X, y, 4, shuffle=False)))
    logits = model(ids, offsets)  # (4, 2)
    torch.testing.assert_close(logits[:, 1], torch.as_tensor(X @ r.numpy(), dtype=torch.float32))
    assert bag_step(model, (ids, offsets, labels))["n"] == 4 and len(SparseBatches(X, y, 3, True)) == 2
    meta = NBWeightedBag(r).to("meta")
    assert meta(ids.to("meta"), offsets.to("meta")).shape == (4, 2)


def test_the_tfidf_baseline_reads_pre_tokenized_text_as_it_is():
    from utils.classifiers import tfidf_logistic_regression
    texts = ["great film !", "awful film .", "great cast , great plot", "awful , awful plot"] * 3
    labels = [1, 0, 1, 0] * 3
    model = tfidf_logistic_regression().fit(texts, labels)
    vocab = model[0].vocabulary_
    assert "!" in vocab and "great film" in vocab  # split on spaces only: punctuation is a word
    assert list(model.predict(["great plot", "awful film"])) == [1, 0]


def test_the_tfidf_baseline_reads_triples_when_asked_and_refuses_a_bad_range():
    import pytest

    from utils.classifiers import tfidf_logistic_regression
    texts = ["a great film !", "an awful film .", "a great cast , great plot", "an awful , awful plot"] * 3
    model = tfidf_logistic_regression(ngram_range=(1, 3)).fit(texts, [1, 0, 1, 0] * 3)
    assert "a great film" in model[0].vocabulary_ and "great film" in model[0].vocabulary_
    assert "a great film" not in tfidf_logistic_regression().fit(texts, [1, 0, 1, 0] * 3)[0].vocabulary_
    with pytest.raises(ValueError, match="ngram_range"):
        tfidf_logistic_regression(ngram_range=(2, 1))


# ---------------------------------------------------------------------------- the bookkeeping of 09 and 06
def macs_per_review_09(setup, train_lengths):  # notebook 09, cell 23, with train_lengths passed in
    enc = setup["model"].encoder
    n = np.full(len(train_lengths), setup["max_len"]) if setup["fixed"] else np.minimum(train_lengths, setup["max_len"])
    per_block = 4 * n * enc.d_model**2 + 2 * n * enc.d_model * enc.d_ff + 2 * n.astype(float) ** 2 * enc.d_model
    return float(enc.n_layers * per_block.mean())


def tiny_transformer(d_model=8, n_heads=2, d_ff=16, n_layers=2, sdpa=False, mask_padding=True):
    from utils.classifiers import TransformerClassifierConfig
    from utils.transformer import EncoderConfig
    return TransformerClassifierConfig(vocab_size=V, mask_padding=mask_padding, encoder=EncoderConfig(
        d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_layers=n_layers, sdpa=sdpa))


@pytest.mark.parametrize("fixed", [False, True])
def test_macs_per_review_is_notebook_09s_count(fixed):
    from utils.classifiers import macs_per_review
    lengths = np.random.default_rng(0).integers(1, 900, 2000)  # (N,) tokens per training review
    for cfg, max_len in ((tiny_transformer(32, 2, 128, 1), 200), (tiny_transformer(64, 4, 256, 1), 512),
                         (tiny_transformer(16, 2, 32, 3), 48)):
        setup = dict(model=cfg, max_len=max_len, fixed=fixed)
        assert macs_per_review(cfg, lengths, max_len, fixed) == macs_per_review_09(setup, lengths)


def test_macs_per_review_by_hand():
    from utils.classifiers import macs_per_review
    cfg = tiny_transformer(d_model=4, n_heads=2, d_ff=8, n_layers=2)  # E = 4, F = 8, 2 blocks
    # reviews of 3, 5 and 10 tokens read through a window of 6: n = 3, 5, 6
    # per block 4 n E^2 + 2 n E F + 2 n^2 E = 64 n + 64 n + 8 n^2: n=3: 456, n=5: 840, n=6: 1056
    assert macs_per_review(cfg, [3, 5, 10], max_len=6) == 2 * (456 + 840 + 1056) / 3
    assert macs_per_review(cfg, [3, 5, 10], max_len=6, fixed=True) == 2 * 1056  # every review padded to 6
    assert macs_per_review(cfg, [200], max_len=6, fixed=False) == macs_per_review(cfg, [1], 6, fixed=True)


@pytest.mark.parametrize("mask_padding", [True, False])
def test_macs_per_review_matches_torchs_flop_counter(mask_padding):
    # FlopCounterMode counts 2 flops per multiply-add of every matmul; with sdpa=False the attention
    # is two plain matmuls it sees (it does not see CPU's fused SDPA kernel). The head's E*C is the
    # one matmul the count leaves out.
    from torch.utils.flop_counter import FlopCounterMode

    from utils.classifiers import TransformerClassifier, macs_per_review
    cfg = tiny_transformer(d_model=8, n_heads=2, d_ff=24, n_layers=2, mask_padding=mask_padding)
    model = TransformerClassifier(cfg).eval()
    for n in (1, 5, 17):
        with FlopCounterMode(display=False) as counter:
            model(torch.randint(1, V, (1, n)), torch.tensor([n]))  # one review of n tokens
        assert counter.get_total_flops() == 2 * (macs_per_review(cfg, [n], max_len=n) + cfg.encoder.d_model * cfg.C)


@pytest.mark.parametrize("lengths,max_len", [([], 10), ([[3, 4]], 10), ([3, -1], 10), ([3, 4], 0)])
def test_macs_per_review_rejects_bad_lengths(lengths, max_len):
    from utils.classifiers import macs_per_review
    with pytest.raises(ValueError, match="token counts"):
        macs_per_review(tiny_transformer(), np.array(lengths), max_len)


def tuned_06(score_of, rates):  # notebook 06, cell 28's `tuned`: its choice and what it keeps, without training
    from utils.train import choose_rate
    logs, kept = {}, {}

    def trial(lr):
        model = f"model at {lr:g}"
        logs[lr] = {"val_acc": [score_of(lr)]}
        if not kept or max(logs[lr]["val_acc"]) > max(logs[kept["lr"]]["val_acc"]):
            kept.update(lr=lr, model=model)
        return -max(logs[lr]["val_acc"])

    lr, _ = choose_rate(trial, rates)
    return lr, {r: max(log["val_acc"]) for r, log in sorted(logs.items())}, kept


SCORES = {  # validation accuracy per rate: a peak inside, a peak past each edge, ties, a far peak
    "inside": lambda lr: {1e-3: 0.80, 3e-3: 0.85, 1e-2: 0.82}[lr],
    "above": lambda lr: 0.8 + 0.01 * np.log(lr / 1e-3),
    "below": lambda lr: 0.8 - 0.01 * np.log(lr / 1e-3),
    "tie": lambda lr: 0.8,
    "tie_at_top": lambda lr: 0.85 if lr >= 1e-2 - 1e-12 else 0.8,
    "far": lambda lr: 0.8 + 0.01 * np.log(lr / 1e-3) if lr < 1 else 0.5,
}


@pytest.mark.parametrize("case", list(SCORES))
def test_tune_is_notebook_06s_tuned_rate(case):
    from utils.classifiers import tune
    rates = [1e-3, 3e-3, 1e-2]
    lr, scores, kept = tuned_06(SCORES[case], rates)
    t = tune(lambda r: (SCORES[case](r), f"model at {r:g}"), rates, name=case)
    assert (t.best, t.scores, t.kept, t.score) == (lr, scores, kept["model"], scores[lr])
    assert t.grid == tuple(rates) and t.grown == (len(scores) > 3)


def test_tune_grows_the_grid_past_a_winning_edge():
    from utils.classifiers import tune
    up = tune(lambda r: 0.8 + 0.01 * np.log(r / 1e-3), [1e-3, 3e-3, 1e-2], name="NBoW")  # better and better
    assert list(up.scores) == pytest.approx([1e-3, 3e-3, 1e-2, 3e-2, 9e-2])  # two steps further, then the cap
    assert up.best == max(up.scores) and up.grown and up.at_edge
    assert "(at the grid's edge after growing it)" in str(up) and "5 runs, grown from 3" in str(up)
    once = tune(lambda r: -abs(np.log(r / 3e-2)), [1e-3, 3e-3, 1e-2])  # the peak one step out
    assert once.best == pytest.approx(3e-2) and len(once.scores) == 5 and not once.at_edge
    down = tune(lambda r: -r, [1e-3, 3e-3], max_extra=1)
    assert list(down.scores) == pytest.approx([1e-3 / 3, 1e-3, 3e-3]) and down.best == pytest.approx(1e-3 / 3)
    inside = tune(SCORES["inside"], [1e-3, 3e-3, 1e-2], name="CNN")
    assert not inside.grown and not inside.at_edge and inside.kept is None  # a bare score keeps nothing
    assert str(inside).startswith("CNN: validation accuracy per lr 0.001 0.8000, 0.003 0.8500, 0.01 0.8200 -> lr = 0.003 (3 runs")


def test_tune_never_chooses_or_keeps_a_nan_score():
    from utils.classifiers import tune
    nan_first = lambda lr: np.nan if lr == 1e-3 else {3e-3: 0.85, 1e-2: 0.82}[lr]  # noqa: E731
    t = tune(lambda r: (nan_first(r), r), [1e-3, 3e-3, 1e-2])
    assert t.best == 3e-3 and t.kept == 3e-3 and np.isnan(t.scores[1e-3])
    lr, _, kept = tuned_06(nan_first, [1e-3, 3e-3, 1e-2])  # the inline code chose 3e-3 but kept the NaN run's model
    assert lr == 3e-3 and kept["lr"] == 1e-3
    spike = tune(lambda r: np.inf if r == 1e-2 else 0.8, [1e-3, 3e-3, 1e-2])  # an overflow is not a winner
    assert spike.best == 1e-3
    with pytest.raises(ValueError, match="non-finite"):
        tune(lambda r: np.nan, [1e-3, 3e-3])


def test_tune_minimizes_a_loss_and_rejects_bad_grids():
    from utils.classifiers import tune
    t = tune(lambda r: ((np.log(r / 3e-3)) ** 2, None), [1e-3, 3e-3, 1e-2], mode="min", metric="validation loss")
    assert t.best == 3e-3 and "validation loss per lr" in str(t)
    for grid, mode in (([1e-3, 1e-3], "max"), ([1e-3], "best"), ([], "max"), ([0.0, 1.0], "max")):
        with pytest.raises(ValueError):
            tune(lambda r: 0.5, grid, mode=mode)
    with pytest.raises(ValueError, match="must return a score"):
        tune(lambda r: (0.5, None, "", "one too many"), [1e-3])


def test_tune_prints_each_trials_note_as_06_printed_the_epochs_run():
    from utils.classifiers import tune
    epochs = {1e-3: 10, 3e-3: 7, 1e-2: 5}
    t = tune(lambda r: (SCORES["inside"](r), None, f"({epochs[r]})"), [1e-3, 3e-3, 1e-2], name="NBoW (mean pooling)",
             param="rate", metric="best validation accuracy (epochs run)")
    assert str(t).startswith("NBoW (mean pooling): best validation accuracy (epochs run) per rate "
                             "0.001 0.8000 (10), 0.003 0.8500 (7), 0.01 0.8200 (5) -> rate = 0.003 (3 runs, ")


def sentiment_texts(n, seed):  # short synthetic reviews, tokenized and joined by spaces, with label noise
    rng = np.random.default_rng(seed)
    good, bad, neutral = ["great", "superb", "fine"], ["awful", "dull", "waste"], [f"w{i}" for i in range(30)]
    y = rng.integers(0, 2, n)
    texts = [" ".join(rng.choice(neutral, 6).tolist() + rng.choice(good if (lab == 1) ^ (rng.random() < 0.15)
                                                                    else bad, 2).tolist()) for lab in y]
    return texts, y


def linear_row_06(train, y_train, val, y_val, test, Cs):  # notebook 06, cell 19's `linear_row`, without `record`
    from utils.classifiers import tfidf_logistic_regression
    from utils.train import choose_rate
    fits = {}

    def trial(C):
        model = tfidf_logistic_regression(C).fit(train, y_train)
        fits[C] = model, float((model.predict(val) == y_val).mean())
        return -fits[C][1]

    C, _ = choose_rate(trial, Cs)
    model, val_acc = fits[C]
    return C, val_acc, model.predict_proba(test)[:, 1], {c: v[1] for c, v in sorted(fits.items())}


@pytest.mark.parametrize("Cs", [[3, 10, 30], [0.01, 0.03, 0.1], [10]])
def test_tune_tfidf_lr_is_notebook_06s_linear_row(Cs):
    from utils.classifiers import tune_tfidf_lr
    (tr, y_tr), (va, y_va), (te, y_te) = (sentiment_texts(n, s) for n, s in ((300, 0), (80, 1), (80, 2)))
    C, val_acc, probs, per_C = linear_row_06(tr, y_tr, va, y_va, te, Cs)
    row = tune_tfidf_lr(tr, y_tr, va, y_va, te, y_te, Cs, name="TF-IDF + LR")
    assert (row.C, row.val_acc, row.tuned.scores) == (C, val_acc, per_C) and type(row.C) is type(C)  # 3 stays 3
    np.testing.assert_array_equal(row.probs, probs)
    np.testing.assert_array_equal(row.hits, (probs > 0.5) == y_te)
    assert row.test_acc == classification_metrics(y_te, (probs > 0.5).astype(int))["acc"]
    assert row.params == row.model[-1].coef_.size + 1 and row.train_s > 0 and row.infer_s > 0
    assert str(row).startswith("TF-IDF + LR: validation accuracy per C ") and "; test accuracy" in str(row)


def test_tune_tfidf_lr_without_test_texts_and_on_bad_inputs():
    from utils.classifiers import tfidf_logistic_regression, tune_tfidf_lr
    (tr, y_tr), (va, y_va) = sentiment_texts(200, 0), sentiment_texts(60, 1)
    row = tune_tfidf_lr(tr, y_tr, va, y_va, Cs=[10])  # notebook 06's cell 40: C = 10, validation only
    fixed = tfidf_logistic_regression().fit(tr, y_tr)
    assert row.val_acc == float((fixed.predict(va) == y_va).mean()) and row.probs is None and row.test_acc is None
    assert "test accuracy" not in str(row)
    for args in ((tr, y_tr[:-1], va, y_va), (tr, y_tr, va, y_va, va), (tr, y_tr, va, y_va, va, y_va[:-1])):
        with pytest.raises(ValueError, match="one label per text"):
            tune_tfidf_lr(*args)
