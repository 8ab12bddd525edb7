from collections import Counter

import pytest
import torch

from utils.text import (
    SPECIALS,
    BPETokenizer,
    BucketBatchSampler,
    PadCollate,
    Vocab,
    char_tokenize,
    word_tokenize,
)


def test_word_tokenize_cleans_reviews():
    assert word_tokenize("Great FILM!<br /><br />Don't miss it.") == [
        "great", "film", "!", "don't", "miss", "it", "."
    ]
    assert word_tokenize("A<br/>B") == ["a", "b"]


def test_char_tokenize_keeps_every_character():
    assert char_tokenize("a b\n") == ["a", " ", "b", "\n"]


def test_vocab_orders_by_frequency_then_alphabet():
    vocab = Vocab.build([["b", "a", "c", "a", "b", "d"]], max_size=2)
    assert vocab.itos == [*SPECIALS, "a", "b"]
    assert (vocab.pad_id, vocab.unk_id, vocab.sos_id, vocab.eos_id) == (0, 1, 2, 3)
    assert vocab.encode(["a", "zzz"], add_sos_eos=True) == [2, 4, 1, 3]
    assert vocab.decode([2, 4, 1, 3, 0], skip_specials=True) == ["a", "<unk>"]


def test_vocab_min_freq_and_roundtrip(tmp_path):
    vocab = Vocab.build([["x", "x", "y"]], min_freq=2)
    assert "x" in vocab and "y" not in vocab
    vocab.save(tmp_path / "v.json")
    assert Vocab.load(tmp_path / "v.json").itos == vocab.itos


def test_vocab_rejects_missing_specials():
    with pytest.raises(ValueError, match="specials"):
        Vocab(["a", "b"])


def test_bpe_roundtrip_and_unknown_characters(tmp_path):
    texts = ["the cat sat on the mat", "the dog sat on the log"] * 20
    bpe = BPETokenizer.train(texts, vocab_size=40, min_frequency=1)
    assert bpe.decode(bpe.encode("the cat sat")) == "the cat sat"
    assert "<unk>" in bpe.tokenize("the zebra")  # 'z', 'e', 'b', 'r' never seen... 'z' at least
    bpe.save(tmp_path / "bpe.json")
    assert BPETokenizer.load(tmp_path / "bpe.json").encode("the mat") == bpe.encode("the mat")


def test_bpe_id_to_token_and_vocab_name_every_piece():
    bpe = BPETokenizer.train(["the cat sat on the mat"] * 20, vocab_size=40, min_frequency=1)
    ids = bpe.encode("the mat")
    assert [bpe.id_to_token(i) for i in ids] == bpe.tokenize("the mat")
    assert [bpe.id_to_token(i) for i in range(4)] == ["<pad>", "<unk>", "<sos>", "<eos>"]
    assert {bpe.vocab()[bpe.id_to_token(i)] for i in range(bpe.vocab_size)} == set(range(bpe.vocab_size))
    with pytest.raises(IndexError, match="outside the vocabulary"):
        bpe.id_to_token(bpe.vocab_size)


def test_pad_collate_pads_masks_and_truncates():
    batch = PadCollate(pad_id=0)([([5, 6, 7], 1), ([8], 0)])
    assert batch.tokens.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.lengths.tolist() == [3, 1] and batch.labels.tolist() == [1, 0]
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]
    fixed = PadCollate(pad_id=0, fixed_len=2)([[5, 6, 7], [8]])
    assert fixed.tokens.shape == (2, 2) and fixed.lengths.tolist() == [2, 1] and fixed.labels is None


def test_bucket_sampler_covers_everything_once_with_similar_lengths():
    lengths = torch.randint(1, 500, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = BucketBatchSampler(lengths, batch_size=32, pool_batches=10, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches)
    assert spread / len(batches) < 100  # pools of 320 over lengths 1..499: ~55; random: ~450
    assert len(BucketBatchSampler(lengths, 32, drop_last=True)) == len(
        list(BucketBatchSampler(lengths, 32, drop_last=True)))


def test_vocab_save_and_load_use_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """Non-ASCII tokens survive even where the locale's default encoding is ASCII."""
    from pathlib import Path

    write, read = Path.write_text, Path.read_text
    # simulate an ASCII locale: a call that does not name its encoding gets "ascii"
    monkeypatch.setattr(Path, "write_text", lambda self, data, encoding=None, **kw:
                        write(self, data, encoding=encoding or "ascii", **kw))
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None, **kw:
                        read(self, encoding=encoding or "ascii", **kw))
    vocab = Vocab.build([["café", "über", "naïve", "café"]])
    vocab.save(tmp_path / "v.json")
    assert "café" in (tmp_path / "v.json").read_bytes().decode("utf-8")
    assert Vocab.load(tmp_path / "v.json").itos == vocab.itos


def test_learn_bpe_merges_by_hand():
    from utils.text import learn_bpe_merges, merge_pair

    merges = learn_bpe_merges({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 4)
    assert merges == [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]  # counts 9, 9, 7, 7
    assert merge_pair(("a", "a", "a"), ("a", "a")) == ("aa", "a")  # left to right, no overlap
    assert learn_bpe_merges({"a": 3}, 5) == []  # nothing to merge


@pytest.mark.parametrize("seed", range(5))
def test_learn_bpe_merges_equal_huggingface(seed):
    """Our loop learns the same merges, in the same order, as the tokenizers library."""
    import json
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from utils.text import learn_bpe_merges

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdelnorst") for _ in range(rng.randint(2, 8))) for _ in range(30)]
    corpus = [w for w in words for _ in range(rng.randint(1, 9))]
    n_merges = 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=len(set("".join(corpus))) + n_merges,
                                  min_frequency=1, show_progress=False)
    tok.train_from_iterator([" ".join(corpus)], trainer=trainer)
    theirs = [tuple(m) if isinstance(m, list) else tuple(m.split())
              for m in json.loads(tok.to_str())["model"]["merges"]]
    assert learn_bpe_merges(Counter(corpus), n_merges) == theirs
