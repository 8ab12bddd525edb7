"""Tests of utils.seq2seq: the translation pipeline and the recurrent encoder-decoders."""


import pytest
import torch

from utils.decoding import beam_search, greedy_decode
from utils.seq2seq import (
    DECODERS,
    EOS_ID,
    PAD_ID,
    SOS_ID,
    EncoderDecoder,
    Seq2SeqConfig,
    TranslationCollate,
    bleu_scores,
    cross_attention_stats,
    ids_to_text,
    is_punctuation,
    load_translation_data,
    make_loader,
    make_step,
    piece_words,
    reverse_padded,
    train_subword_tokenizer,
    translation_lexicon,
    word_alignments,
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


def test_piece_words_joins_pieces_and_drops_punctuation():
    tok = train_subword_tokenizer(TEXTS, vocab_size=80)
    ids = tok.encode("A man rides a bike.")
    words = piece_words(ids, tok)
    assert [w for w, _ in words] == ["A", "man", "rides", "a", "bike"]
    assert [p for _, pos in words for p in pos] == list(range(len(ids) - 1))  # every piece but "."
    assert piece_words([0, 2, *ids, 3], tok)[0][1] == [2]  # specials belong to no word


def test_translation_lexicon_and_word_alignments():
    tok = train_subword_tokenizer(["Der Hund läuft.", "Der Hund schläft.", "Der Ball.", "The dog runs.",
                                   "The dog sleeps.", "The ball.", "Boston 2"], vocab_size=120)
    enc = lambda de, en: (tok.encode(de), tok.encode(en))  # noqa: E731
    pairs = [enc("Der Hund läuft.", "The dog runs."), enc("Der Hund schläft.", "The dog sleeps."),
             enc("Der Hund.", "The dog."), enc("Der Ball.", "The ball.")]
    lexicon = translation_lexicon(pairs, tok, min_count=2, min_dice=0.5, skip_frequent=0)
    assert lexicon["hund"] == "dog" and lexicon["der"] == "the" and "läuft" not in lexicon  # once: too rare
    assert translation_lexicon(pairs, tok, min_count=2, skip_frequent=1).get("der") != "the"  # "the" skipped
    src, tgt = enc("Ein Hund in Boston läuft.", "A dog runs in Boston.")
    words_src, words_tgt = piece_words(src, tok), piece_words(tgt, tok)
    found = {(next(w for w, p in words_tgt if p == pos), words_src[k][0])
             for pos, k in word_alignments(src, tgt, tok, lexicon)}
    assert found == {("dog", "Hund"), ("Boston", "Boston")}  # "in" is identical but not a name
    src2, tgt2 = enc("Hund und Hund.", "A dog.")
    assert word_alignments(src2, tgt2, tok, lexicon) == []  # "Hund" twice: no point


class _DiagonalHeads(torch.nn.Module):
    """A stand-in decoder with hand-made cross-attention: head 1 uniform over the real source
    pieces, head 2 puts target position t on source position t (a perfect monotone aligner)."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))  # model_device reads a parameter

    def encode(self, src, src_mask):
        return src_mask, []

    def decode(self, tgt_in, memory, src_mask, need_weights=False):
        B, T, S = tgt_in.shape[0], tgt_in.shape[1], src_mask.shape[1]
        uniform = src_mask[:, None, :].float().expand(B, T, S)
        uniform = uniform / uniform.sum(-1, keepdim=True)
        diagonal = torch.eye(T, S)[None].expand(B, T, S)
        return None, {"cross": [torch.stack([uniform, diagonal], 1)]}  # one layer: (B, nh=2, T, S)


def test_cross_attention_stats_on_hand_made_heads():
    tok = train_subword_tokenizer(["x Boston Denver", "y Boston Denver"], vocab_size=60)
    src, tgt = tok.encode("x Boston Denver"), tok.encode("y Boston Denver")
    assert len(src) == len(tgt)  # same pieces at the same positions: the diagonal aligns them
    pairs = [(src, tgt), (tok.encode("x"), tok.encode("y"))]  # the second pair has no point
    stats = cross_attention_stats(_DiagonalHeads(), pairs, tok, {}, batch_size=1)
    assert stats["points"] == 2  # Boston and Denver: identical names, not sentence-initial
    n_words = len(piece_words(src, tok))
    assert stats["chance_hit"] == pytest.approx(1 / n_words)
    assert stats["weight"][0, 0].item() == pytest.approx(stats["chance_weight"])  # uniform = chance
    assert stats["weight"][0, 1].item() == pytest.approx(1.0) and stats["hit"][0, 1].item() == 1.0
    assert stats["rows"] == sum(len(t) + 1 for _, t in pairs)  # every target piece and <eos>
    assert stats["entropy"][0, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert stats["weight_reading"][0, 1].item() == 0.0  # the reading rows sit one word later
    assert stats["diagonal_hit"] == 1.0  # same word order on both sides
