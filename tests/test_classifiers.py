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
