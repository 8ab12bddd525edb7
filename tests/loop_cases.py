"""Tiny, seeded training problems, one per training path of `utils`.

`tests/data/old_loops.json` holds the per-update losses (and logged diagnostics) that the eight
training loops `utils` had before the one loop in `utils/train.py` replaced them, recorded on
these problems with the old code (commit "tests: record the old training loops' trajectories").
`tests/test_one_loop.py` runs the same problems through today's code and asks for the same
numbers, so the refactor provably moved no CPU result.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from torch import nn

OLD_LOOPS = Path(__file__).parent / "data" / "old_loops.json"


def old_trajectories() -> dict:
    return json.loads(OLD_LOOPS.read_text())


class FakeClock:
    """A clock that reads the number of training-mode forward passes of `model` so far.

    Time-budgeted loops then stop after a fixed number of updates and their time-following
    schedules see progress = updates / budget exactly, on any machine.
    """

    def __init__(self, model: nn.Module) -> None:
        self.ticks = 0.0
        model.register_forward_pre_hook(self._tick)

    def _tick(self, module, args):
        if module.training:
            self.ticks += 1.0

    def perf_counter(self) -> float:
        return self.ticks


def floats(values) -> list[float]:
    return [float(v) for v in values]


# ---------------------------------------------------------------------------- problems
def toy_features():
    """(train loader, val loader, model) for `fit`: 3-D points, a linear rule, an MLP with dropout."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5]) > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True,
                                        generator=torch.Generator().manual_seed(1))
    val = torch.utils.data.DataLoader(data, batch_size=32)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 2))
    return train, val, model


def toy_reviews():
    """(train loader, val loader, model) for the text classifiers: token lists, a tiny Transformer."""
    from utils.classifiers import TransformerClassifier, TransformerClassifierConfig, make_loader
    from utils.transformer import EncoderConfig

    g = torch.Generator().manual_seed(0)
    ids, labels = [], []
    for _ in range(48):
        n = int(torch.randint(3, 12, (1,), generator=g))
        seq = torch.randint(4, 30, (n,), generator=g).tolist()
        ids.append(seq)
        labels.append(int(sum(t < 15 for t in seq) * 2 > n))
    train = make_loader(ids[:32], labels[:32], 8, shuffle=True, seed=0)
    val = make_loader(ids[32:], labels[32:], 8, shuffle=False)
    torch.manual_seed(0)
    enc = EncoderConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.1, norm_first=True)
    model = TransformerClassifier(TransformerClassifierConfig(vocab_size=30, encoder=enc, max_len=16))
    return train, val, model


TRANSLATION_TEXTS = [("ein Mann fährt Rad.", "A man rides a bike."),
                     ("zwei Hunde spielen im Schnee!", "Two dogs play in the snow!"),
                     ("eine Frau liest und lächelt.", "A woman, smiling, reads."),
                     ("der Hund des Mannes rennt.", "The man's dog runs."),
                     ("ein Kind spielt.", "A child plays.")]


def toy_translation(monkeypatch, shared: bool):
    """`TranslationData` from a few sentence pairs (Multi30k's loader is monkeypatched)."""
    from utils.seq2seq import load_translation_data

    fake = {"train": TRANSLATION_TEXTS * 4, "val": TRANSLATION_TEXTS, "test": TRANSLATION_TEXTS}
    monkeypatch.setattr("utils.seq2seq.load_multi30k", lambda split, src, tgt, limit=None: fake[split])
    return load_translation_data(vocab_size=70, shared=shared)


def rnn_translator(data):
    from utils.seq2seq import EncoderDecoder, Seq2SeqConfig

    torch.manual_seed(0)
    random.seed(0)  # the teacher-forcing coin
    cfg = Seq2SeqConfig(src_vocab=data.src_tok.vocab_size, tgt_vocab=data.tgt_tok.vocab_size,
                        emb=8, hidden=12, attn=6, dropout=0.1)
    return EncoderDecoder(cfg, "bahdanau")


def transformer_translator(data):
    from utils.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    V = data.tgt_tok.vocab_size
    cfg = TransformerConfig(src_vocab=V, tgt_vocab=V, d_model=16, n_heads=2, d_ff=32,
                            n_enc_layers=1, n_dec_layers=1, dropout=0.1, max_len=64)
    return Transformer(cfg)


def token_stream(n: int = 600, vocab: int = 11) -> torch.Tensor:
    """A stream with some structure (a repeating pattern plus noise), (n,) long."""
    g = torch.Generator().manual_seed(0)
    pattern = torch.arange(n) % 7
    noise = torch.randint(0, vocab, (n,), generator=g)
    return torch.where(torch.rand(n, generator=g) < 0.2, noise, pattern)  # (n,)


def tiny_gpt_config(**kw):
    from utils.gpt import GPTConfig

    return GPTConfig(**{"vocab_size": 11, "block_size": 8, "d_model": 16, "n_heads": 2,
                        "n_layers": 2, "dropout": 0.1, **kw})


def tiny_gpt():
    from utils.gpt import GPT

    torch.manual_seed(0)
    return GPT(tiny_gpt_config())


def tiny_mlm():
    from utils.bert import BertConfig, BertMLM

    torch.manual_seed(0)
    return BertMLM(BertConfig(vocab_size=12, max_len=8, d_model=16, n_heads=2, n_layers=1,
                              d_ff=32, dropout=0.1))


def toy_images():
    """(x, y, x_eval, y_eval, model): 8x8 one-channel images of two classes, a tiny ViT."""
    from utils.vit import VisionTransformer, ViTConfig

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (40,), generator=g)
    x = torch.randn(40, 1, 8, 8, generator=g) + y[:, None, None, None].float()
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=8, patch_size=4, n_classes=2, d_model=16,
                                        n_heads=2, n_layers=1, dropout=0.1))
    return x[:32], y[:32], x[32:], y[32:], model


def char_lm():
    """(loader of (x, y) batches (4, 20), validation (x, y), CharLM LSTM) for truncated BPTT."""
    from utils.rnn import CharLM, make_lm_loader

    ids = token_stream(n=400, vocab=12)
    loader = make_lm_loader(ids[:320], 20, 4, seed=0)
    val = next(iter(make_lm_loader(ids[320:], 20, 3, shuffle=False)))
    torch.manual_seed(0)
    return loader, val, CharLM(12, 16, cell="lstm")
