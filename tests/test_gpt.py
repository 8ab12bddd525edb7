"""Tests of utils.gpt: causal masking, GPT-2 equivalence, decoding with it, training helpers."""

import pytest
import torch
import torch.nn.functional as F
from helpers import randomize_

from utils.decoding import greedy_decode, sample
from utils.gpt import GPT, GPTConfig, decoding_step, evaluate_lm, load_from_hf, token_nll, train_lm
from utils.text import random_windows
from utils.train import adamw, param_count

TINY = GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=2, dropout=0.0)


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY.__dict__, **kw})).eval()


def test_shapes_loss_and_initial_loss_near_log_v():
    model = tiny()
    x = torch.randint(0, 11, (3, 7))
    logits, loss = model(x, x)
    assert logits.shape == (3, 7, 11) and loss.shape == ()
    assert abs(loss.item() - torch.log(torch.tensor(11.0)).item()) < 0.3  # small init: ~uniform
    _, _, maps = model(x, x, need_weights=True)
    assert len(maps) == 2 and maps[0].shape == (3, 2, 7, 7)
    assert torch.all(maps[0].triu(1) == 0)  # no weight on the future


@pytest.mark.parametrize("norm_first", [True, False])
def test_changing_a_later_token_never_changes_earlier_logits(norm_first):
    model = tiny(norm_first=norm_first)
    x = torch.randint(0, 11, (2, 10))
    y = x.clone()
    y[:, 6] = (y[:, 6] + 1) % 11  # change token 6 only
    a, b = model(x), model(y)
    assert torch.equal(a[:, :6], b[:, :6])  # positions 0..5 are bit-for-bit the same
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-4  # and the change does reach t >= 6


def test_weight_tying_is_an_option():
    tied = tiny()
    assert tied.head.weight is tied.tok.weight
    untied = tiny(tie_weights=False)
    assert untied.head.weight is not untied.tok.weight
    assert param_count(untied) == param_count(tiny()) + 11 * 16


@pytest.mark.parametrize("tie", [True, False])
def test_matches_hugging_face_gpt2_with_copied_weights(tie):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=11, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=tie)
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial biases and norms, so a missed copy shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    for sdpa in (False, True):
        ours = load_from_hf(tiny(sdpa=sdpa, tie_weights=tie), hf)
        x = torch.randint(0, 11, (2, 9))
        with torch.no_grad():
            diff = (ours(x) - hf(x).logits).abs().max().item()
        print(f"GPT vs GPT2LMHeadModel (sdpa={sdpa}, tied={tie}): max |diff| = {diff:.1e}")
        assert diff < 1e-5


GPT2_MISMATCHES = {  # a change to the tiny GPT-2 config or to ours, what the error says
    "heads": (dict(n_head=4), {}, "n_heads: GPT2LMHeadModel has 4, ours has 2"),
    "activation": (dict(activation_function="relu"), {}, "activation: GPT2LMHeadModel has 'relu', ours has 'gelu_tanh'"),
    "exact gelu": ({}, dict(activation="gelu"), "activation: GPT2LMHeadModel has 'gelu_tanh', ours has 'gelu'"),
    "eps": (dict(layer_norm_epsilon=1e-6), {}, "eps: GPT2LMHeadModel has 1e-06, ours has 1e-05"),
    "d_ff": (dict(n_inner=32), {}, "d_ff: GPT2LMHeadModel has 32, ours has 64"),
    "untied": (dict(tie_word_embeddings=False), {}, "tie_weights: GPT2LMHeadModel has False, ours has True"),
    "post-LN": ({}, dict(norm_first=False), "norm_first: GPT2LMHeadModel has True, ours has False"),
    "rezero": ({}, dict(block="rezero"), "block: GPT2LMHeadModel has 'standard', ours has 'rezero'"),
    "embed_norm": ({}, dict(embed_norm=True), "embed_norm: GPT2LMHeadModel has False, ours has True"),
    "unscaled": (dict(scale_attn_weights=False), {}, "scale_attn_weights: GPT2LMHeadModel has False"),
    "by layer": (dict(scale_attn_by_inverse_layer_idx=True), {}, "scale_attn_by_inverse_layer_idx: GPT2LMHeadModel has True"),
    "positions": (dict(n_positions=8), {}, "block_size: GPT2LMHeadModel has n_positions = 8, ours has 16"),
}


def tiny_gpt2(**changes):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(**{"vocab_size": 11, "n_positions": 16, "n_embd": 16, "n_layer": 2,
                                     "n_head": 2, "bos_token_id": 0, "eos_token_id": 0, **changes})
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("case", GPT2_MISMATCHES)
def test_load_from_hf_refuses_a_gpt2_configured_otherwise(case):
    # before: a 4-head GPT-2 loaded into a 2-head GPT, a ReLU GPT-2 into the tanh-GELU GPT
    theirs, ours, message = GPT2_MISMATCHES[case]
    with pytest.raises(ValueError, match=message):
        load_from_hf(tiny(**ours), tiny_gpt2(**theirs))


def test_load_from_hf_near_miss_only_where_asked():
    hf = randomize_(tiny_gpt2())  # GPT-2's small init would hide the activation's effect
    near = load_from_hf(tiny(activation="gelu"), hf, ignore=("activation",))  # notebook 11's near miss
    ours = load_from_hf(tiny(), hf)
    x = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        ref = hf(x).logits
        assert (ours(x) - ref).abs().max() < 1e-5 < (near(x) - ref).abs().max()
    with pytest.raises(ValueError, match="n_heads"):
        load_from_hf(tiny(n_heads=4, activation="gelu"), hf, ignore=("activation",))


def test_sampling_cold_equals_greedy_and_top_k_stays_in_the_k_best():
    model = tiny()
    step = decoding_step(model)
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        greedy = greedy_decode(step, prompt, None, max_len=20)  # longer than block_size: crops
        cold = sample(step, prompt, None, max_len=20, temperature=1e-4,
                      generator=torch.Generator().manual_seed(0))
        assert torch.equal(greedy, cold)
        g = torch.Generator().manual_seed(0)
        for _ in range(20):
            out = sample(step, prompt, None, max_len=1, top_k=3, temperature=2.0, generator=g)
            best3 = step(prompt, None)[0].topk(3, dim=-1).indices  # (B, 3)
            assert (best3 == out[:, -1:]).any(dim=-1).all()


def test_random_windows_are_shifted_and_evaluate_covers_the_split():
    ids = torch.arange(100)
    x, y = random_windows(ids, 8, 5, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8) and torch.equal(y, x + 1)
    model = tiny()
    # a split of 40 tokens: 39 predictions in windows of 16, 16, 7; equal to a direct mean
    data = torch.randint(0, 11, (40,))
    loss = evaluate_lm(model, data, batch_size=2)
    chunks = [(data[s:s + 16], data[s + 1:s + 17]) for s in range(0, 39, 16)]
    with torch.no_grad():
        total = sum(torch.nn.functional.cross_entropy(model(x[None, :len(t)])[0], t, reduction="sum")
                    for x, t in chunks)
    assert abs(loss - total.item() / 39) < 1e-5
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_evaluate_lm_window_restarts_the_context_every_window_tokens():
    model = tiny()
    data = torch.randint(0, 11, (40,))
    assert evaluate_lm(model, data, window=16) == pytest.approx(evaluate_lm(model, data), abs=1e-7)
    chunks = [(data[s:s + 5], data[s + 1:s + 6]) for s in range(0, 39, 5)]  # 8 windows of 5, 39 targets
    with torch.no_grad():
        total = sum(torch.nn.functional.cross_entropy(model(x[None, :len(t)])[0], t, reduction="sum")
                    for x, t in chunks)
    assert evaluate_lm(model, data, window=5) == pytest.approx(total.item() / 39, abs=1e-5)
    with pytest.raises(ValueError, match="window"):
        evaluate_lm(model, data, window=17)


def test_token_nll_is_per_position_in_the_split_order_and_averages_to_evaluate_lm():
    model = tiny()
    data = torch.randint(0, 11, (40,))
    nll = token_nll(model, data, batch_size=3, window=5)  # 8 windows of 5, 39 targets, 3 batches
    assert nll.shape == (39,) and nll.device.type == "cpu"
    with torch.no_grad():  # position t is predicted from the window that holds it, in order
        direct = torch.cat([torch.nn.functional.cross_entropy(model(data[None, s:s + 5][:, :len(data[s + 1:s + 6])])[0],
                                                              data[s + 1:s + 6], reduction="none")
                            for s in range(0, 39, 5)])
    assert torch.allclose(nll, direct, atol=1e-5)
    assert evaluate_lm(model, data, batch_size=3, window=5) == pytest.approx(nll.double().mean().item(), abs=1e-7)


def test_token_nll_with_a_stride_scores_each_token_once_with_overlapping_context():
    model = tiny()
    data = torch.randint(0, 11, (40,))
    nll = token_nll(model, data, batch_size=2, window=8, stride=3)  # windows at 0, 3, 6, ..., 33
    assert nll.shape == (39,)
    x, y = data[:-1], data[1:]
    with torch.no_grad():
        direct = [torch.nn.functional.cross_entropy(model(x[None, :8])[0], y[:8], reduction="none")]
        for s in range(3, 34, 3):  # each later window scores its last 3 targets (the last one fewer)
            logits = model(x[None, s:s + 8])[0]
            direct.append(torch.nn.functional.cross_entropy(logits, y[s:s + 8], reduction="none")[5:])
    assert torch.allclose(nll, torch.cat(direct), atol=1e-5)
    assert torch.allclose(token_nll(model, data, window=8, stride=8), token_nll(model, data, window=8))
    with pytest.raises(ValueError, match="stride"):
        token_nll(model, data, window=8, stride=9)


def test_train_lm_schedule_updates_runs_the_start_of_a_longer_plan():
    """A run stopped at 10 updates of a 20-update plan follows the 20-update run exactly."""
    ids = torch.randint(0, 11, (200,), generator=torch.Generator().manual_seed(0))
    long = train_lm(tiny(), ids, updates=20, batch_size=4, warmup_steps=3)
    short = train_lm(tiny(), ids, updates=10, batch_size=4, warmup_steps=3, schedule_updates=20)
    assert short["lr"] == pytest.approx(long["lr"][:10]) and short["loss"] == pytest.approx(long["loss"][:10])
    own = train_lm(tiny(), ids, updates=10, batch_size=4, warmup_steps=3)
    assert own["lr"][-1] < short["lr"][-1]  # its own cosine has decayed further
    with pytest.raises(ValueError, match="schedule_updates"):
        train_lm(tiny(), ids, updates=10, schedule_updates=5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_train_lm_overfits_a_repeating_pattern(precision):
    model = tiny()
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6] * 30)
    log = train_lm(model, ids, updates=60, batch_size=8, lr=1e-2, warmup_steps=5, precision=precision)
    assert log["updates"] == 60 and log["loss"][-1] < 0.2 < log["loss"][0]
    assert log["items"] == 60 * 8 * 16  # tokens trained on
    assert evaluate_lm(model, ids) < 0.5
    # autocast changes the arithmetic, not the model: weights stay float32, evaluations agree
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert abs(evaluate_lm(model, ids, precision="bf16") - evaluate_lm(model, ids)) < 0.05


def test_train_lm_keeps_the_best_model_on_validation():
    """nanoGPT's recipe overfits a small text on a long run: keep_best restores the best point."""
    model = tiny()
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6] * 30)
    val = torch.tensor([0, 1, 2, 3, 4, 5, 6] * 5)
    log = train_lm(model, ids, updates=40, batch_size=8, lr=1e-2, warmup_steps=5, val_ids=val,
                   eval_every=10, keep_best=True)
    assert log["eval_update"] == [10, 20, 30, 40]
    best = min(range(4), key=lambda i: log["val_loss"][i])
    assert log["best_update"] == log["eval_update"][best]
    assert evaluate_lm(model, val) == pytest.approx(log["val_loss"][best], abs=1e-6)


def test_meta_device_forward():
    meta = torch.device("meta")
    for norm_first in (True, False):
        model = GPT(GPTConfig(**{**TINY.__dict__, "norm_first": norm_first})).to(meta)
        x = torch.zeros(2, 5, dtype=torch.long, device=meta)
        logits, loss = model(x, x)
        assert logits.shape == (2, 5, 11) and logits.device.type == "meta"
        out = sample(decoding_step(model), x, None, max_len=2, top_k=3)
        assert out.shape == (2, 7)


def test_fused_adamw_takes_the_same_steps_as_the_usual_one():
    def trained(fused):
        model = tiny().train()
        opt = adamw(model, lr=1e-2, weight_decay=0.1, fused=fused)
        x = torch.randint(0, 11, (4, 16), generator=torch.Generator().manual_seed(1))
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]), opt
    usual, _ = trained(False)
    fused, opt = trained(True)  # falls back to the usual kernel where no fused one exists
    diff = (usual - fused).abs().max().item()
    print(f"fused={opt.defaults.get('fused')}: max |diff| after 5 steps = {diff:.1e}")
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert diff < 1e-4  # each step moves a weight by about lr = 1e-2
