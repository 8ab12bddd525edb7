"""Tests of utils.seq2seq: the translation pipeline and the recurrent encoder-decoders."""

import math

import pytest
import torch

from utils.decoding import beam_search, greedy_decode
from utils.seq2seq import (
    DECODERS,
    EOS_ID,
    PAD_ID,
    PIECE_CLASSES,
    SOS_ID,
    EncoderDecoder,
    Seq2SeqConfig,
    TranslationCollate,
    bleu_scores,
    cross_attention_stats,
    head_sums,
    ids_to_text,
    is_punctuation,
    load_translation_data,
    make_loader,
    make_step,
    piece_classes,
    reverse_padded,
    train_subword_tokenizer,
)

TEXTS = ["A man rides a bike.", "Two dogs play in the snow!", "A woman, smiling, reads.",
         "The man's dog runs."] * 5


def tiny_cfg(**kw):
    return Seq2SeqConfig(src_vocab=20, tgt_vocab=20, emb=8, hidden=12, attn=6, dropout=0.0, **kw)


def toy_batch(B=3):
    pairs = [([5, 6, 7, 8], [9, 10, 11]), ([5, 7], [12, 13, 14, 15]), ([8, 6, 5], [9, 11])][:B]
    return TranslationCollate()(pairs)


def test_subword_tokenizer_round_trips_cased_text():
    tok = train_subword_tokenizer(TEXTS, vocab_size=80)
    for text in TEXTS[:4]:
        ids = tok.encode(text)
        assert ids_to_text(ids + [EOS_ID, 7, 7], tok) == text  # cut at <eos>
    assert tok.tokenize("A man rides.")[-1] == "."  # punctuation is its own piece
    assert [tok.encode(s)[0] for s in ("<pad>", "<unk>", "<sos>", "<eos>")] == [0, 1, 2, 3]


def test_vocabulary_comes_from_the_training_split_only(monkeypatch):
    fake = {"train": [("ein Hund", "a dog")] * 3, "val": [("Zebra", "zebra")],
            "test": [("Quokka", "quokka")]}
    monkeypatch.setattr("utils.seq2seq.load_multi30k",
                        lambda split, src, tgt, limit=None: fake[split])
    data = load_translation_data(vocab_size=60)
    vocab = data.tgt_tok.vocab()
    assert "▁dog" in vocab and not any("q" in piece for piece in vocab)  # "quokka" unseen
    assert data.sizes() == {"train": 3, "val": 1, "test": 1}
    assert set(data.ids) == {"train", "val", "test"}


def test_collate_shifts_targets_and_masks_padding():
    batch = toy_batch()
    assert batch.tgt_in[:, 0].tolist() == [SOS_ID] * 3
    assert batch.tgt_out[0].tolist() == [9, 10, 11, EOS_ID, PAD_ID]
    assert batch.tgt_in[1, 1:].tolist() == batch.tgt_out[1, :-1].tolist()
    assert batch.src_mask.tolist()[1] == [True, True, False, False]


def test_loader_buckets_similar_lengths():
    pairs = [([5] * n, [6] * n) for n in range(1, 41)] * 2
    lengths = [b.src.shape[1] - b.src_mask.sum(1).min().item()
               for b in make_loader(pairs, 8, seed=0)]
    assert max(lengths) <= 4  # sorted pools: little padding per batch


def test_reverse_padded_keeps_padding_in_place():
    x = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    assert reverse_padded(x, x != 0).tolist() == [[3, 2, 1, 0], [5, 4, 0, 0]]


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_every_model_shapes_and_attention(kind):
    torch.manual_seed(0)
    model = EncoderDecoder(tiny_cfg(bidirectional=kind in ("bahdanau", "luong")), kind)
    b = toy_batch()
    logits = model(b.src, b.src_mask, b.tgt_in)
    assert logits.shape == (3, 5, 20)
    logits2, weights = model(b.src, b.src_mask, b.tgt_in, return_attention=True)
    assert torch.allclose(logits, logits2, atol=1e-5)  # parallel path == step-by-step path
    if weights is not None:
        assert weights.shape == (3, 5, 4)
        assert torch.all(weights[1, :, 2:] == 0)  # padded source positions get zero weight
        assert torch.allclose(weights.sum(-1), torch.ones(3, 5))


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_every_model_runs_on_meta(kind):
    model = EncoderDecoder(tiny_cfg(bidirectional=kind == "bahdanau"), kind).to("meta")
    src = torch.zeros(2, 4, dtype=torch.long, device="meta")
    mask = torch.ones(2, 4, dtype=torch.bool, device="meta")
    tgt = torch.zeros(2, 3, dtype=torch.long, device="meta")
    assert model.decoder.embed.weight.device.type == "meta"
    assert model.encoder.rnn.weight_hh_l0.device.type == "meta"
    # the encoder packs its input, and PyTorch's packing needs the real lengths on the CPU, so
    # on meta we run the decoder (the part that builds tensors at every step) from a meta memory
    assert reverse_padded(src, mask).device.type == "meta"
    memory = torch.zeros(2, 4, 12 * (2 if kind == "bahdanau" else 1), device="meta")
    state = model.decoder.init_state(memory, torch.zeros(2, 12, device="meta"), mask)
    assert model.decoder(tgt, state).shape == (2, 3, 20)
    assert model.decoder(tgt, state, teacher_forcing=0.5).device.type == "meta"
    log_probs, _ = model.step(tgt, state)
    assert log_probs.shape == (2, 20) and src.device.type == "meta"


def test_bad_inputs_give_clear_errors():
    model = EncoderDecoder(tiny_cfg(), "seq2seq")
    with pytest.raises(ValueError, match="src_mask"):
        model.start(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4))
    with pytest.raises(ValueError, match="unknown decoder"):
        EncoderDecoder(tiny_cfg(), "transformer")
    with pytest.raises(ValueError, match="positive"):
        Seq2SeqConfig(src_vocab=0, tgt_vocab=5)


def test_beam_one_equals_greedy_for_bahdanau():
    torch.manual_seed(0)
    model = EncoderDecoder(tiny_cfg(bidirectional=True), "bahdanau").eval()
    b = toy_batch()
    prefix = torch.full((3, 1), SOS_ID)
    with torch.no_grad():
        g = greedy_decode(model.step, prefix, model.start(b.src, b.src_mask), 8, EOS_ID, -1)
        beams = beam_search(model.step, prefix, model.start(b.src, b.src_mask), 8, EOS_ID, 1)
    assert [[t for t in row if t != -1] for row in g[:, 1:].tolist()] == [h[0].tokens for h in beams]


@pytest.mark.parametrize("kind", ["seq2seq", "bahdanau"])
def test_tiny_seeded_overfit(kind):
    torch.manual_seed(0)
    model = EncoderDecoder(tiny_cfg(bidirectional=kind == "bahdanau"), kind)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    step, b = make_step(), toy_batch()
    for _ in range(60):
        loss = step(model, b)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3
    model.eval()
    with torch.no_grad():
        out = greedy_decode(model.step, torch.full((3, 1), SOS_ID),
                            model.start(b.src, b.src_mask), 6, EOS_ID)
    assert out[0, 1:5].tolist() == [9, 10, 11, EOS_ID]


def test_bleu_scores_headline_matches_sacrebleu():
    import sacrebleu

    hyps = ["A man rides a bike.", "Two dogs are playing in snow!"]
    refs = ["A man is riding a bike.", "Two dogs play in the snow!"]
    ours = bleu_scores(hyps, refs)
    ref = sacrebleu.corpus_bleu(hyps, [refs])
    print(f"ours {ours['bleu'].score:.4f} vs sacrebleu {ref.score:.4f}")
    assert abs(ours["bleu"].score - ref.score) < 1e-9
    assert abs(ours["bleu_lc"].score - sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score) < 1e-9


def test_luong_input_feeding_runs_step_by_step_and_decodes_like_its_forward():
    from utils.seq2seq import EncoderDecoder

    torch.manual_seed(0)
    model = EncoderDecoder(tiny_cfg(input_feeding=True, bidirectional=True), "luong").eval()
    batch = toy_batch()
    assert not model.decoder.parallel
    logits = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V), teacher-forced
    state, steps = model.start(batch.src, batch.src_mask), []
    for t in range(batch.tgt_in.shape[1]):
        lp, state = model.step(batch.tgt_in[:, : t + 1], state)
        steps.append(lp)
    torch.testing.assert_close(torch.stack(steps, 1), torch.log_softmax(logits, -1), atol=1e-5, rtol=1e-5)


def test_luong_input_feeding_feeds_back_the_attentional_state_not_the_gru_state():
    """Luong et al. (2015, section 3.3): the GRU reads [emb(y_{t-1}); h~_{t-1}], where
    h~ = tanh(W_c [c; s]) is the attentional state the output layer reads, not s itself.
    Written out step by step with the model's own layers."""
    torch.manual_seed(0)
    model = EncoderDecoder(tiny_cfg(input_feeding=True, bidirectional=True), "luong").eval()
    dec, batch = model.decoder, toy_batch()
    memory, s = model.encoder(batch.src, batch.src_mask)  # (B, S, 2H), (B, H)
    h_tilde, expected = torch.zeros_like(s), []
    for t in range(batch.tgt_in.shape[1]):
        x = torch.cat([dec.embed(batch.tgt_in[:, t]), h_tilde], dim=-1)[:, None]  # (B, 1, E + H)
        out, s = dec.rnn(x, s[None])  # (B, 1, H), (1, B, H)
        s = s[0]
        c, _ = dec.attention(out, memory, memory, batch.src_mask)  # (B, 1, 2H)
        h_tilde = torch.tanh(dec.W_c(torch.cat([c, out], dim=-1)))[:, 0]  # (B, H)
        expected.append(dec.out(h_tilde))  # (B, V)
    torch.testing.assert_close(model(batch.src, batch.src_mask, batch.tgt_in), torch.stack(expected, 1))


def test_attention_entropy_is_between_a_point_and_uniform():
    from utils.seq2seq import EncoderDecoder, attention_entropy

    torch.manual_seed(0)
    model = EncoderDecoder(tiny_cfg(bidirectional=True), "bahdanau")
    pairs = [([5, 6, 7, 8], [9, 10, 11]), ([5, 7], [12, 13, 14, 15])]
    out = attention_entropy(model, pairs)
    assert 0 < out["nats"] and 0 < out["share_of_uniform"] <= 1 + 1e-6


def test_is_punctuation_drops_the_word_marker():
    assert all(is_punctuation(p) for p in (".", ",", "-", "'", "▁(", "▁\""))
    assert not any(is_punctuation(p) for p in ("▁in", "s", "▁", "▁3", "▁Frisbee"))


def test_piece_classes_punctuation_frequent_content():
    tok = train_subword_tokenizer(TEXTS, vocab_size=80)
    pairs = [([], tok.encode(t)) for t in ("A man rides a bike.", "A man reads.", "A dog.")]
    classes = piece_classes(tok, pairs, k=2)  # the two most frequent target pieces: "▁A" and "."
    cls = {tok.id_to_token(i): PIECE_CLASSES[c] for i, c in enumerate(classes.tolist()) if c >= 0}
    assert cls["."] == cls[","] == "punctuation"  # "." is frequent too: punctuation comes first
    assert cls["▁A"] == "frequent" and cls["▁man"] == cls["▁dog"] == "content"
    assert classes[:4].tolist() == [-1] * 4  # specials


def test_head_sums_on_hand_made_weights():
    batch = TranslationCollate()([([5, 6, 7], [6, 9])])  # tgt_out = 6, 9, <eos>: 6 is in the source once
    W = torch.zeros(1, 1, 2, 3, 3)  # (L, B, nh, T, S)
    W[..., 0, :, 1] = 1.0  # head 1 looks at source position 1 (the "6") on every row
    W[..., 1, :, :] = 1 / 3  # head 2 is uniform
    classes = torch.full((20,), 2)
    out = head_sums(W, batch, classes)
    assert out["points"].tolist() == [0, 0, 1] and out["rows"] == 3
    assert torch.allclose(out["copy"][2, 0], torch.tensor([1.0, 1 / 3]))
    assert torch.allclose(out["last"][0], torch.tensor([0.0, 1.0]))  # summed over the 3 rows
    assert torch.allclose(out["entropy"][0], torch.tensor([0.0, 3 * math.log(3)]), atol=1e-5)


def test_cross_attention_stats_shapes_and_ranges():
    from utils.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(src_vocab=20, tgt_vocab=20, d_model=16, n_heads=2, d_ff=32,
                                          n_enc_layers=1, n_dec_layers=2, dropout=0.0))
    pairs = [([5, 6, 7, 8], [6, 9, 8]), ([5, 7], [12, 7, 14, 15]), ([8, 6, 5], [9, 5])]
    classes = torch.tensor([-1] * 4 + [0, 1] + [2] * 14)  # piece 5 "frequent", 6.. "content"
    stats = cross_attention_stats(model, pairs, classes, batch_size=2)
    assert stats["copy"].shape == (3, 2, 2) and stats["last"].shape == stats["entropy"].shape == (2, 2)
    assert stats["points"].tolist() == [0, 1, 3] and stats["rows"] == 4 + 5 + 3  # 5 | 6, 8, 7
    assert ((stats["copy"] >= 0) & (stats["copy"] <= 1)).all()
    assert (stats["entropy"] <= math.log(4) + 1e-5).all()  # at most uniform over 4 source pieces
