"""ReZero blocks and the training-stability helpers of notebook 14 (utils.taming)."""

import math

import pytest
import torch

from utils.gpt import GPT, GPTConfig
from utils.taming import (
    block_grad_norms,
    layer_norm_jacobian_norm,
    qkv_grad_norms,
    radam_rectification,
    run_char_gpt,
    xavier_init_,
)
from utils.transformer import Encoder, EncoderBlock, EncoderConfig, ReZeroBlock, make_block

CFG = EncoderConfig(d_model=16, n_heads=2, d_ff=32, n_layers=3, dropout=0.0, block="rezero")
TINY = dict(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=3, dropout=0.0)


def test_rezero_block_shape_and_identity_at_init():
    torch.manual_seed(0)
    block = ReZeroBlock(CFG)
    x = torch.randn(2, 5, 16)
    out, w = block(x, causal=True)
    assert out.shape == (2, 5, 16) and w is None
    assert torch.equal(out, x)  # alpha = 0: exactly the identity
    stack = Encoder(CFG)
    assert torch.equal(stack(x)[0], x)  # and so is the stack: no final layer norm either


def test_rezero_is_no_longer_the_identity_once_alpha_moves():
    torch.manual_seed(0)
    block = ReZeroBlock(CFG)
    with torch.no_grad():
        block.alpha.fill_(0.5)
    x = torch.randn(2, 5, 16)
    assert (block(x)[0] - x).abs().max() > 1e-3


def test_rezero_gpt_alpha_gets_the_first_gradient():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, block="rezero"))
    x = torch.randint(0, 11, (2, 8))
    model(x, x)[1].backward()
    block = model.blocks.blocks[0]
    assert block.alpha.grad.abs().max() > 0  # only alpha can move the identity at first
    assert block.ffn.W_2.weight.grad.abs().max() == 0  # F's weights see a zero gradient (alpha = 0)


def test_make_block_and_bad_block_name():
    assert isinstance(make_block(CFG), ReZeroBlock)
    assert isinstance(make_block(EncoderConfig(d_model=16, n_heads=2)), EncoderBlock)
    with pytest.raises(ValueError, match="block must be one of"):
        EncoderConfig(d_model=16, n_heads=2, block="rms")


def test_rezero_gpt_forward_on_meta_device():
    with torch.device("meta"):
        model = GPT(GPTConfig(**TINY, block="rezero"))
        idx = torch.zeros(2, 8, dtype=torch.long)
        logits, loss = model(idx, idx)
    assert logits.device.type == "meta" and logits.shape == (2, 8, 11) and loss.shape == ()


def test_run_char_gpt_logs_diagnostics_and_every_arm_sees_the_same_batches():
    data = torch.randint(0, 11, (200,), generator=torch.Generator().manual_seed(0))
    runs = [run_char_gpt(GPTConfig(**TINY, norm_first=nf), data, data[:50], steps=6, batch_size=4,
                         lr=1e-2, warmup_steps=3) for nf in (True, True, False)]
    log = runs[0]
    assert log["updates"] == 6 and len(log["update_ratio"]) == 6 and len(log["grad_qkv"][0]) == 3
    assert log["lr"][:3] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2])  # linear warm-up
    assert all(r > 0 for r in log["update_ratio"]) and len(log["grad_blocks"][0]) == TINY["n_layers"]
    assert runs[0]["loss"] == runs[1]["loss"] != runs[2]["loss"]  # same seed, same batches


def test_run_char_gpt_overfits_a_repeated_string_and_radam_runs():
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 30)
    out = run_char_gpt(GPTConfig(**TINY, norm_first=True), ids, ids[:50], steps=60, batch_size=8,
                       lr=1e-2)
    assert out["val_loss"] < 1.0 and not out["failed"] and not out["nonfinite"]
    out = run_char_gpt(GPTConfig(**TINY, block="rezero"), ids, ids[:50], steps=3, batch_size=4,
                       lr=1e-3, optimizer="radam")
    assert out["updates"] == 3 and math.isfinite(out["val_loss"])


def test_xavier_init_touches_only_block_matrices_and_bad_init_is_refused():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    before = {n: p.clone() for n, p in model.named_parameters()}
    xavier_init_(model)
    for n, p in model.named_parameters():
        changed = not torch.equal(p, before[n])
        assert changed == (n.startswith("blocks.") and p.dim() > 1), n
    # Xavier-uniform bound for a (fan_out, fan_in) matrix: sqrt(6 / (fan_in + fan_out))
    W = next(p for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() > 1)
    assert W.abs().max() <= math.sqrt(6 / sum(W.shape)) and W.std() > 0.5 * math.sqrt(2 / sum(W.shape))
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 30)
    with pytest.raises(ValueError, match="init must be one of"):
        run_char_gpt(GPTConfig(**TINY), ids, ids[:50], steps=1, batch_size=4, lr=1e-3, init="he")
    out = run_char_gpt(GPTConfig(**TINY), ids, ids[:50], steps=2, batch_size=4, lr=1e-3, init="xavier")
    assert math.isfinite(out["val_loss"])


def test_a_blow_up_is_nonfinite_not_failed():
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 30)
    out = run_char_gpt(GPTConfig(**TINY), ids, ids[:50], steps=2, batch_size=4, lr=1e6)
    assert out["nonfinite"] and not out["failed"] and math.isnan(out["val_loss"])


def test_failed_means_finite_but_above_the_threshold():
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 30)
    kw = dict(steps=2, batch_size=4, lr=1e-4)  # two tiny steps: the loss stays near ln 11 = 2.4
    out = run_char_gpt(GPTConfig(**TINY), ids, ids[:50], fail_nats=1.0, **kw)
    assert math.isfinite(out["val_loss"]) and out["val_loss"] > 1.0
    assert out["failed"] and not out["nonfinite"]
    out = run_char_gpt(GPTConfig(**TINY), ids, ids[:50], fail_nats=out["val_loss"] + 0.01, **kw)
    assert not out["failed"] and not out["nonfinite"]  # same run, a threshold above its loss


def test_block_and_qkv_grad_norms():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, norm_first=False))
    x = torch.randint(0, 11, (2, 8))
    norms = block_grad_norms(model, x, x)
    assert len(norms) == 3 and all(n > 0 for n in norms)
    assert all(p.grad is None for p in model.parameters())  # leaves no gradients behind
    w2 = block_grad_norms(model, x, x, param="ffn.W_2.weight")  # one matrix per block
    model(x, x)[1].backward()
    expected = [float(b.ffn.W_2.weight.grad.norm()) for b in model.blocks.blocks]
    assert w2 == pytest.approx(expected, rel=1e-6) and all(a < b for a, b in zip(w2, norms))
    model.zero_grad(set_to_none=True)
    model(x, x)[1].backward()
    q, k, v = qkv_grad_norms(model)
    assert 0 <= q < v and 0 <= k < v  # small init: scores barely depend on W_q, W_k


def test_layer_norm_jacobian_norm_is_sqrt_E_over_norm():
    torch.manual_seed(0)
    x = torch.randn(32)
    x = x - x.mean()
    for scale in (0.5, 4.0, 40.0):
        expected = math.sqrt(32) / float((scale * x).norm())
        assert layer_norm_jacobian_norm(scale * x, eps=0.0) == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError, match="one position"):
        layer_norm_jacobian_norm(torch.randn(2, 3))


def test_radam_rectification_matches_torch_radam():
    """With a constant gradient of 1, Adam's normalized step m/sqrt(v) is 1, so RAdam moves the
    parameter by lr * r_t once rho_t > 5, and by lr * m_hat = lr in the first (momentum) steps."""
    lr, beta2 = 0.1, 0.999
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.RAdam([p], lr=lr, betas=(0.9, beta2), eps=0.0)
    for t in range(1, 12):
        before = p.item()
        p.grad = torch.ones(1)
        opt.step()
        r = radam_rectification(t, beta2)
        assert before - p.item() == pytest.approx(lr * (r if r > 0 else 1.0), rel=1e-5)
    assert radam_rectification(5, beta2) == 0.0 < radam_rectification(6, beta2) < 0.2
    assert radam_rectification(100_000, beta2) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="count from 1"):
        radam_rectification(0, beta2)


def test_both_optimizers_decay_matrices_only():
    from utils.taming import make_optimizer
    from utils.train import adamw

    model = GPT(GPTConfig(**TINY))
    for opt in (adamw(model, 1e-3, 0.1), make_optimizer(model, "adamw", 1e-3, weight_decay=0.1),
                make_optimizer(model, "radam", 1e-3, weight_decay=0.1)):
        decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
        for p in model.parameters():
            assert (id(p) in decayed) == (p.dim() >= 2)
