"""Every training path of `utils` on a CUDA GPU (skipped without one): the model, its batches and
its optimizer state stay on the GPU, and the loss falls. On the CPU, `tests/test_one_loop.py`
and the notebooks' device check (`course.devicecheck`) carry the proof."""

import loop_cases as lc
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def on_cuda(model):
    return all(p.is_cuda for p in model.parameters())


def test_fit_and_fit_classifier():
    from utils.classifiers import fit_classifier
    from utils.train import fit

    train, val, model = lc.toy_features()
    model.to(CUDA)

    def step(m, batch):
        x, y = batch
        return {"loss": torch.nn.functional.cross_entropy(m(x), y), "n": len(y)}

    log = fit(model, train, step, torch.optim.Adam(model.parameters(), lr=0.05), 3, val_loader=val,
              clip=0.5, precision="bf16" if torch.cuda.is_bf16_supported() else "fp16")
    assert on_cuda(model) and log["val_loss"][-1] < log["val_loss"][0]
    train, val, model = lc.toy_reviews()
    log = fit_classifier(model.to(CUDA), train, 3e-3, updates=10, val_dl=val, precision="fp16")
    assert on_cuda(model) and len(log["val_acc"]) == 3


def test_translators(monkeypatch):
    from utils.seq2seq import evaluate_translation, train_translator

    for shared, build in ((False, lc.rnn_translator), (True, lc.transformer_translator)):
        data = lc.toy_translation(monkeypatch, shared)
        model = build(data).to(CUDA)
        log = train_translator(model, data, updates=6, batch_size=4, lr=3e-3, warmup_steps=2,
                               teacher_forcing=0.5 if not shared else 1.0, eval_every=3)
        assert on_cuda(model) and len(log["val_bleu"]) == 2
        assert evaluate_translation(model, data, "val", beam_size=2, verbose=False)["ppl"] > 0


def test_language_models():
    from utils.bert import train_mlm
    from utils.gpt import evaluate_lm, train_lm
    from utils.taming import run_char_gpt

    ids = lc.token_stream()
    model = lc.tiny_gpt().to(CUDA)
    log = train_lm(model, ids, updates=10, batch_size=4, val_ids=ids[:100], eval_every=5, keep_best=True)
    assert on_cuda(model) and evaluate_lm(model, ids[:100]) == pytest.approx(min(log["val_loss"]), abs=1e-5)
    mlm = lc.tiny_mlm().to(CUDA)
    assert train_mlm(mlm, lc.token_stream(vocab=11), updates=5, block=8, batch_size=4, mask_id=11)["updates"] == 5
    out = run_char_gpt(lc.tiny_gpt_config(), ids[:500], ids[500:], steps=5, batch_size=4, lr=1e-2,
                       device=CUDA)
    assert on_cuda(out["model"]) and len(out["update_ratio"]) == 5


def test_vision_bptt_and_recall():
    from utils.bptt import train_truncated
    from utils.tasks import train_recall
    from utils.vit import evaluate_classifier, train_classifier

    x, y, xe, ye, model = lc.toy_images()
    train_classifier(model.to(CUDA), x, y, 6, batch_size=8, warmup_steps=1, eval_every=3, x_val=xe, y_val=ye)
    assert on_cuda(model) and 0 <= evaluate_classifier(model, xe, ye) <= 1
    loader, val, lm = lc.char_lm()
    out = train_truncated(lm.to(CUDA), loader, k=7, updates=5, val=val, eval_every=5)
    assert on_cuda(lm) and len(out["val_loss"]) == 1
    rec = train_recall("lstm", distance=5, hidden_size=8, n_train=64, n_val=32, steps=5, device=CUDA)
    assert on_cuda(rec["model"])
