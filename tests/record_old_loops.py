"""Record the eight old training loops' trajectories on `loop_cases` (run once, before the refactor).

    python tests/record_old_loops.py   # writes tests/data/old_loops.json
"""

import json
import math
import random
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import loop_cases as lc  # noqa: E402


def fake_time(module_name, model):
    clock = lc.FakeClock(model)
    mp = pytest.MonkeyPatch()
    mp.setattr(f"{module_name}.time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return mp


def without_progress_bar():
    """Old `fit` wrapped every epoch in tqdm.auto, whose asyncio base calls iter() on the
    loader in __init__ and again in __iter__: each epoch and each evaluation made an unused
    DataLoader iterator, which draws a seed (from the loader's generator, or the global RNG)
    and so shifted shuffles and dropout masks. That side effect is switched off here: what is
    recorded is the loop's arithmetic, which the one loop must reproduce."""
    mp = pytest.MonkeyPatch()
    mp.setattr("utils.train.progress", lambda iterable, **kw: iterable)
    return mp


def record_fit():
    from utils.train import fit

    mp = without_progress_bar()
    train, val, model = lc.toy_features()
    batch_losses = []

    def step(m, batch):
        x, y = batch
        logits = m(x)
        out = {"loss": torch.nn.functional.cross_entropy(logits, y), "n": len(y),
               "acc": (logits.argmax(-1) == y).float().mean()}
        if m.training:
            batch_losses.append(out["loss"].item())
        return out

    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=3 * len(train))
    h = fit(model, train, step, opt, 3, val_loader=val, clip=0.5, scheduler=sched)
    mp.undo()
    return {"loss": batch_losses, **{k: lc.floats(v) for k, v in h.items() if k != "epoch_time"}}


def record_fit_for_time(bf16):
    from utils.classifiers import fit_for_time

    train, val, model = lc.toy_reviews()
    mp = fake_time("utils.classifiers", model)
    log = fit_for_time(model, train, seconds=10, lr=3e-3, warmup_steps=3, val_dl=val, bf16=bf16)
    mp.undo()
    return {"loss": log["loss"], "val_acc": log["val_acc"], "steps": log["steps"]}


def record_train_translator():
    from utils.seq2seq import train_translator

    mp = without_progress_bar()
    data = lc.toy_translation(mp, shared=False)
    model = lc.rnn_translator(data)
    import utils.seq2seq as s2s

    losses, make_step = [], s2s.make_step

    def recording_make_step(*a, **kw):
        step = make_step(*a, **kw)

        def wrapped(m, batch):
            out = step(m, batch)
            if m.training:
                losses.append(out["loss"].item())
            return out
        return wrapped

    mp.setattr(s2s, "make_step", recording_make_step)
    h = train_translator(model, data, epochs=2, batch_size=4, lr=1e-2, teacher_forcing=0.5)
    mp.undo()
    return {"loss": losses, **{k: lc.floats(v) for k, v in h.items() if k != "epoch_time"}}


def record_seq2seq_train_for_time():
    from utils.seq2seq import train_for_time

    mp = pytest.MonkeyPatch()
    data = lc.toy_translation(mp, shared=True)
    model = lc.transformer_translator(data)
    mpt = fake_time("utils.seq2seq", model)
    log = train_for_time(model, data, seconds=10, lr=3e-3, warmup_steps=3, batch_size=4,
                         eval_every_s=4, val_pairs=5)
    mpt.undo()
    mp.undo()
    return {"loss": log["loss"], "lr": log["lr"], "val_bleu": log["val_bleu"], "steps": log["steps"]}


def record_train_lm(bf16):
    from utils.gpt import train_lm

    model = lc.tiny_gpt()
    log = train_lm(model, lc.token_stream(), seconds=1e9, batch_size=4, lr=3e-3, warmup_steps=3,
                   bf16=bf16, max_steps=15, seed=1)
    return {"loss": log["loss"], "lr": log["lr"], "steps": log["steps"]}


def record_train_mlm():
    from utils.bert import train_mlm

    model = lc.tiny_mlm()
    log = train_mlm(model, lc.token_stream(vocab=11), seconds=1e9, block=8, batch_size=4,
                    mask_id=11, p=0.3, lr=3e-3, warmup_steps=2, max_steps=10, seed=2)
    return {"loss": log["loss"], "lr": log["lr"], "steps": log["steps"]}


def record_train_classifier():
    from utils.vit import train_classifier

    x, y, xe, ye, model = lc.toy_images()
    log = train_classifier(model, x, y, steps=12, batch_size=8, lr=3e-3, warmup_steps=3,
                           eval_every=5, x_eval=xe, y_eval=ye, seed=3)
    return {"loss": log["loss"], "eval_step": log["eval_step"], "eval_acc": log["eval_acc"],
            "steps": log["steps"]}


def record_run_char_gpt(**kw):
    from utils.taming import run_char_gpt

    ids = lc.token_stream()
    out = run_char_gpt(lc.tiny_gpt_config(), ids[:500], ids[500:], steps=12, batch_size=4,
                       lr=1e-2, warmup_steps=3, seed=4, **kw)
    keys = ("loss", "lr", "grad_norm", "update_ratio", "grad_qkv", "grad_blocks")
    return {**{k: out[k] for k in keys}, "val_loss": out["val_loss"], "diverged": out["diverged"]}


def record_train_truncated():
    import utils.bptt as bptt
    from utils.bptt import train_truncated

    loader, val, model = lc.char_lm()
    losses, update = [], bptt.tbptt_update

    def recording_update(*a, **kw):
        loss, h = update(*a, **kw)
        losses.append(loss)
        return loss, h

    mp = pytest.MonkeyPatch()
    mp.setattr(bptt, "tbptt_update", recording_update)
    out = train_truncated(model, loader, k=7, updates=10, lr=1e-2, clip=0.5, val=val, eval_every=4)
    mp.undo()
    return {"loss": losses, "curve": [(u, v) for u, _, v in out["curve"]], "updates": out["updates"],
            "chars": out["chars"], "activation_bytes": out["activation_bytes"]}


def record_train_recall(**kw):
    from utils.tasks import train_recall

    out = train_recall(distance=6, hidden_size=8, n_train=64, n_val=32, steps=15, batch_size=8,
                       seed=5, **kw)
    return {"loss": out["history"]["loss"], "grad_norm": out["history"]["grad_norm"],
            "val_acc": out["val_acc"], "train_acc": out["train_acc"]}


def main():
    torch.set_num_threads(1)
    random.seed(0)
    record = {
        "fit": record_fit(),
        "fit_for_time": record_fit_for_time(bf16=False),
        "fit_for_time_bf16": record_fit_for_time(bf16=True),
        "train_translator": record_train_translator(),
        "seq2seq_train_for_time": record_seq2seq_train_for_time(),
        "train_lm": record_train_lm(bf16=False),
        "train_lm_bf16": record_train_lm(bf16=True),
        "train_mlm": record_train_mlm(),
        "vit_train_classifier": record_train_classifier(),
        "run_char_gpt": record_run_char_gpt(),
        "run_char_gpt_radam_xavier": record_run_char_gpt(optimizer="radam", init="xavier"),
        "train_truncated": record_train_truncated(),
        "train_recall_lstm": record_train_recall(cell="lstm", lr=1e-2, clip=1.0),
        "train_recall_rnn_sgd": record_train_recall(cell="rnn", lr=0.5, clip=None, optimizer="sgd"),
    }
    for name, rec in record.items():
        assert all(math.isfinite(v) for v in rec.get("loss", [0.0])), name
        print(f"{name}: {len(rec.get('loss', rec.get('curve', [])))} updates recorded")
    lc.OLD_LOOPS.parent.mkdir(exist_ok=True)
    lc.OLD_LOOPS.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
