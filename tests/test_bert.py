"""Tests of utils.bert: BertModel equivalence with copied weights, the MLM recipe, meta device."""

import pytest
import torch

from utils.bert import (
    BertConfig,
    BertEncoder,
    BertMLM,
    EpochBatches,
    evaluate_mlm,
    hf_name_map,
    load_state_dict_hf,
    mask_tokens,
    mlm_predict,
    train_mlm,
)

SMALL = BertConfig(vocab_size=40, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0)


def small_hf_bert(seed=0):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missed copy shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return hf


def test_config_from_hf_and_name_map_cover_every_parameter():
    hf = small_hf_bert()
    cfg = BertConfig.from_hf(hf.config)
    assert (cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.eps) == (16, 2, 32, hf.config.layer_norm_eps)
    ours = dict(BertEncoder(cfg).named_parameters())
    assert set(hf_name_map(2)) == set(ours)
    assert set(hf_name_map(2).values()) == set(dict(hf.named_parameters()))


def test_matches_hugging_face_bert_model_with_copied_weights_and_padding():
    hf = small_hf_bert()
    ours = load_state_dict_hf(BertEncoder(BertConfig.from_hf(hf.config)), hf.state_dict()).eval()
    ids = torch.randint(0, 40, (3, 9))
    mask = torch.arange(9)[None] < torch.tensor([[9], [5], [2]])  # (B, T) True on real tokens
    segments = (torch.arange(9)[None] >= 4).long().expand(3, 9)  # sentence B from position 4
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask.long(), token_type_ids=segments).last_hidden_state
        mine, _ = ours(ids, mask, segments)
    diff = (mine[mask] - theirs[mask]).abs().max().item()
    print(f"BertEncoder vs BertModel: max |diff| = {diff:.1e} over real tokens")
    assert diff < 1e-5
    with pytest.raises(ValueError, match="BertModel"):
        load_state_dict_hf(BertEncoder(SMALL), {"nothing": torch.zeros(1)})


def test_without_segment_ids_every_token_is_in_sentence_a():
    # BertModel's default token_type_ids are zeros (sentence A); every single-sentence use of
    # ours (MLM, MiniLM features, classification) relies on the same default
    hf = small_hf_bert()
    ours = load_state_dict_hf(BertEncoder(BertConfig.from_hf(hf.config)), hf.state_dict()).eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        theirs = hf(ids).last_hidden_state
        mine = ours(ids)[0]
        sentence_a = ours(ids, segments=torch.zeros_like(ids))[0]
        sentence_b = ours(ids, segments=torch.ones_like(ids))[0]
    diff = (mine - theirs).abs().max().item()
    print(f"no segment ids, ours vs BertModel: max |diff| = {diff:.1e}")
    assert diff < 1e-5 and torch.allclose(mine, sentence_a, atol=1e-6)
    assert (mine - sentence_b).abs().max() > 1e-2  # the two segment embeddings differ


def test_mask_tokens_follows_the_80_10_10_recipe():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (64, 256), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True  # a [CLS] column is never chosen
    inputs, labels = mask_tokens(ids, mask_id=4, vocab_size=1000, p=0.15, special=special, generator=g)
    chosen = labels != -100
    assert not chosen[:, 0].any() and torch.equal(labels[chosen], ids[chosen])
    rate = chosen[:, 1:].float().mean().item()
    masked = (inputs[chosen] == 4).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()
    random = 1 - masked - kept
    print(f"chosen {rate:.3f}, [MASK] {masked:.3f}, random {random:.3f}, kept {kept:.3f}")
    assert abs(rate - 0.15) < 0.01 and abs(masked - 0.8) < 0.02
    assert abs(random - 0.1) < 0.015 and abs(kept - 0.1) < 0.015  # random hits itself 0.1% of the time
    assert torch.equal(inputs[~chosen], ids[~chosen])  # unchosen positions are untouched


def test_mlm_model_shapes_and_tied_head():
    model = BertMLM(SMALL).eval()
    ids = torch.randint(0, 40, (2, 7))
    assert model(ids).shape == (2, 7, 40)
    assert model.head.tok.weight is model.bert.embed.tok.weight
    _, maps = model.bert(ids, need_weights=True)
    assert len(maps) == 2 and maps[0].shape == (2, 2, 7, 7)


def test_evaluate_mlm_scores_every_window_with_the_same_blanks():
    torch.manual_seed(0)
    model = BertMLM(SMALL).eval()
    ids = torch.randint(0, 39, (100,))  # 6 windows of 16; the last 4 tokens are left out
    inputs, labels, logits = mlm_predict(model, ids, mask_id=39, block=16, p=0.3, seed=1)
    assert inputs.shape == labels.shape == (6, 16) and logits.shape == (6, 16, 40)
    chosen = labels != -100
    assert torch.equal(labels[chosen], ids[:96].view(6, 16)[chosen])
    with torch.no_grad():
        direct = torch.nn.functional.cross_entropy(model(inputs)[chosen], labels[chosen]).item()
    out = evaluate_mlm(model, ids, mask_id=39, block=16, p=0.3, seed=1)
    assert out["loss"] == pytest.approx(direct, abs=1e-5) and 0 <= out["acc"] <= 1
    assert evaluate_mlm(model, ids, mask_id=39, block=16, p=0.3, seed=1) == out  # the same blanks


def test_train_mlm_learns_frequencies_and_logs_validation():
    torch.manual_seed(0)
    model = BertMLM(SMALL)
    ids = torch.tensor([5] * 300 + [7] * 20)  # a blank is almost always a 5
    log = train_mlm(model, ids, updates=20, block=16, batch_size=8, mask_id=39, p=0.3, lr=1e-2,
                    warmup_steps=2, val_ids=ids[:96], eval_every=10)
    assert log["eval_update"] == [10, 20] and len(log["val_acc"]) == 2
    assert log["val_acc"][-1] == 1.0 and log["val_loss"][-1] < 1.0 < 3.0 < log["loss"][0]  # ln 40 = 3.7


def test_meta_device_forward():
    meta = torch.device("meta")
    model = BertMLM(SMALL).to(meta)
    ids = torch.zeros(2, 5, dtype=torch.long, device=meta)
    keep = torch.ones(2, 5, dtype=torch.bool, device=meta)
    assert model(ids, keep).shape == (2, 5, 40)
    inputs, labels = mask_tokens(ids, 3, 40)
    assert inputs.device.type == labels.device.type == "meta"


def test_epoch_batches_are_true_epochs_seeded_and_trimmed():
    """Fine-tuning once drew batches with replacement: "one pass" over 2,000 reviews touched
    1,288 of them. Each epoch must now hold every row exactly once, in a new order."""
    N, T = 37, 10
    ids = torch.arange(N * T).view(N, T)
    lengths = torch.arange(N) % 7 + 2  # real pieces per row, 2..8 of 10
    mask = torch.arange(T)[None] < lengths[:, None]  # (N, T)
    labels = torch.arange(N) % 2
    batches = EpochBatches(ids, mask, labels, batch_size=8, seed=3)
    assert len(batches) == 5
    epochs = [[b for b in batches] for _ in range(2)]
    for epoch in epochs:
        rows = torch.cat([x[:, 0] // T for x, _, _ in epoch])  # the row each example came from
        assert sorted(rows.tolist()) == list(range(N)) and [len(y) for _, _, y in epoch] == [8, 8, 8, 8, 5]
        for x, m, y in epoch:  # shapes agree; only all-padding columns were dropped
            assert x.shape == m.shape and m.shape[1] == int(lengths[x[:, 0] // T].max())
            assert torch.equal(y, labels[x[:, 0] // T])
    first = lambda e: torch.cat([x[:, 0] for x, _, _ in e])  # noqa: E731
    assert not torch.equal(first(epochs[0]), first(epochs[1]))  # a fresh order per epoch
    again = EpochBatches(ids, mask, labels, batch_size=8, seed=3)
    assert torch.equal(first(list(again)), first(epochs[0]))  # the seed fixes the order
    assert batches.seen == set(range(N))
    with pytest.raises(ValueError, match="same non-zero length"):
        EpochBatches(ids, mask, labels[:-1])


def test_fit_over_epoch_batches_trains_each_row_once_per_epoch():
    from utils.train import fit

    N, T = 20, 6
    ids, mask, labels = torch.randint(5, (N, T)), torch.ones(N, T, dtype=torch.bool), torch.arange(N) % 2
    model = torch.nn.Embedding(5, 2)

    def step(m, batch):
        x, _, y = batch
        return {"loss": torch.nn.functional.cross_entropy(m(x).mean(1), y), "n": len(y)}

    batches = EpochBatches(ids, mask, labels, batch_size=6, seed=0)
    log = fit(model, batches, step, torch.optim.SGD(model.parameters(), lr=0.1), epochs=3, log_every=None)
    assert (log["updates"], log["items"], log["epochs"]) == (12, 3 * N, 3.0)
    assert batches.seen == set(range(N))


def test_epoch_batches_keep_the_real_pieces_of_left_padded_rows():
    """Batches were cut at the longest row's count of real pieces, which is where the real pieces
    end only under right padding: a left-padded row [pad, 7] came out as [pad], its 7 dropped."""
    x, m, y = next(iter(EpochBatches(torch.tensor([[0, 7]]), torch.tensor([[False, True]]), torch.tensor([1]))))
    assert x.tolist() == [[0, 7]] and m.tolist() == [[False, True]] and y.tolist() == [1]
    ids = torch.tensor([[0, 0, 7, 0], [5, 6, 0, 0]])  # padded left, padded right; the last column: all padding
    mask = ids > 0
    x, m, _ = next(iter(EpochBatches(ids, mask, torch.tensor([0, 1]), batch_size=2)))
    rows = sorted(zip(x.tolist(), m.tolist()))  # the batch's (ids, mask) rows, whatever their order
    assert rows == sorted(zip(ids[:, :3].tolist(), mask[:, :3].tolist()))  # cut after the last real piece
