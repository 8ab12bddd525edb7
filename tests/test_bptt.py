"""Manual BPTT (utils.bptt) against autograd, and the truncated-BPTT stream helpers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from utils.bptt import (
    adjoint_norms,
    bptt,
    make_streams,
    mean_ce_grad,
    position_loss,
    rnn_forward,
    saved_activation_bytes,
    stream_loss,
    stream_windows,
    train_truncated,
    with_spectral_radius,
)
from utils.rnn import CharLM, make_lm_loader


def _weights(d, H, q, gen):
    """Float64 weights, W_hh scaled so a long sequence neither vanishes nor explodes much."""
    W_hx = torch.randn(H, d, generator=gen, dtype=torch.float64)
    W_hh = with_spectral_radius(torch.randn(H, H, generator=gen, dtype=torch.float64), 0.95)
    W_qh = torch.randn(q, H, generator=gen, dtype=torch.float64)
    return [w.requires_grad_() for w in (W_hx, W_hh, W_qh)]


def _probed_forward(X, W_hx, W_hh, W_qh, probe, activation):
    """Reference loop that adds a zero probe to every h_t: probe.grad = total dL/dh_t."""
    h, outs = torch.zeros(X.shape[0], W_hh.shape[0], dtype=X.dtype), []
    for t in range(X.shape[1]):
        a = X[:, t] @ W_hx.T + h @ W_hh.T  # (B, H)
        h = (torch.tanh(a) if activation == "tanh" else a) + probe[:, t]  # (B, H)
        outs.append(h @ W_qh.T)  # (B, q)
    return torch.stack(outs, dim=1)  # (B, T, q)


@pytest.mark.parametrize("activation", ["identity", "tanh"])
@pytest.mark.parametrize("B,T,d,H,q", [(1, 1, 3, 2, 4), (3, 7, 5, 4, 6), (2, 25, 2, 8, 3)])
def test_manual_bptt_matches_autograd(activation, B, T, d, H, q):
    gen = torch.Generator().manual_seed(B * 100 + T)
    X = torch.randn(B, T, d, generator=gen, dtype=torch.float64)  # (B, T, d)
    Y = torch.randint(0, q, (B, T), generator=gen)  # (B, T)
    W = _weights(d, H, q, gen)
    Hs, outs = rnn_forward(X, *W, activation=activation)  # (B, T, H), (B, T, q)
    probe = torch.zeros(B, T, H, dtype=torch.float64, requires_grad=True)
    O_ref = _probed_forward(X, *W, probe, activation)
    assert torch.allclose(O_ref, outs)
    F.cross_entropy(O_ref.flatten(0, 1), Y.flatten()).backward()
    g = bptt(X, Hs.detach(), mean_ce_grad(outs.detach(), Y), *(w.detach() for w in W),
             activation=activation)
    assert g.dH.shape == (B, T, H) and g.W_hh.shape == (H, H)
    for ours, ref in [(g.dH, probe.grad), (g.W_hx, W[0].grad), (g.W_hh, W[1].grad),
                      (g.W_qh, W[2].grad)]:
        diff = (ours - ref).abs().max().item()
        print(f"max |diff| = {diff:.1e}")
        assert torch.allclose(ours, ref, atol=1e-12, rtol=1e-9)


def test_linear_adjoint_is_matrix_power():
    """Loss on the last output only: zeta_t = (W_hh^T)^(T-t) zeta_T for the linear RNN."""
    gen = torch.Generator().manual_seed(0)
    W = [w.detach() for w in _weights(3, 4, 2, gen)]
    X = torch.randn(1, 6, 3, generator=gen, dtype=torch.float64)
    Hs, outs = rnn_forward(X, *W)
    dO = torch.zeros_like(outs)
    dO[:, -1] = torch.randn(2, generator=gen, dtype=torch.float64)
    g = bptt(X, Hs, dO, *W)
    zeta_T = g.dH[0, -1]
    for t in range(6):
        expected = torch.linalg.matrix_power(W[1].T, 5 - t) @ zeta_T
        assert torch.allclose(g.dH[0, t], expected)
    assert adjoint_norms(g.dH).shape == (6,)


def test_bad_inputs_raise():
    W = [torch.zeros(4, 3), torch.zeros(4, 4), torch.zeros(2, 4)]
    with pytest.raises(ValueError, match="activation"):
        rnn_forward(torch.zeros(1, 2, 3), *W, activation="relu")
    with pytest.raises(ValueError, match="W_hx"):
        rnn_forward(torch.zeros(1, 2, 5), *W)
    with pytest.raises(ValueError, match="square"):
        with_spectral_radius(torch.zeros(2, 3), 1.0)


def test_spectral_radius():
    W = with_spectral_radius(torch.randn(6, 6, generator=torch.Generator().manual_seed(1)), 1.1)
    assert abs(torch.linalg.eigvals(W).abs().max().item() - 1.1) < 1e-5


def test_streams_and_windows_cover_the_text_once():
    ids = torch.arange(103)
    streams = make_streams(ids, 4)  # (4, 25)
    assert streams.shape == (4, 25) and streams[1, 0] == 25  # row b continues ids[b*S:]
    windows = list(stream_windows(streams, 10))
    assert [w[0].shape[1] for w in windows] == [10, 10, 4]  # S - 1 = 24 inputs
    x = torch.cat([w[0] for w in windows], dim=1)
    y = torch.cat([w[1] for w in windows], dim=1)
    assert torch.equal(x, streams[:, :-1]) and torch.equal(y, streams[:, 1:])
    with pytest.raises(ValueError):
        make_streams(ids, 100)


def test_saved_bytes_grow_with_window():
    torch.manual_seed(0)
    model = CharLM(10, 8)
    params = list(model.parameters())
    x = torch.randint(0, 10, (2, 40))
    small = saved_activation_bytes(lambda: model(x[:, :5]), exclude=params)
    large = saved_activation_bytes(lambda: model(x), exclude=params)
    assert 0 < small < large and large / small > 4


def test_train_truncated_learns_a_periodic_text_with_either_budget():
    torch.manual_seed(0)
    ids = torch.tensor([4, 5, 6, 7, 8] * 40)  # a periodic "text"
    loader = make_lm_loader(ids, seq_len=20, batch_size=3, seed=0)  # 3 batches of 3 sequences
    x, y = next(iter(make_lm_loader(ids, seq_len=20, batch_size=8, shuffle=False)))
    model = CharLM(10, 16)
    before = position_loss(model, x, y).mean()
    out = train_truncated(model, loader, k=5, updates=60, lr=3e-2, val=(x, y), eval_every=20)
    assert out["updates"] == 60 and out["items"] == 60 * 3 * 5 and out["activation_bytes"] > 0
    assert out["eval_update"] == [20, 40, 60]  # the final model scored once
    assert out["val_loss"][-1] < 0.1 < before
    timed = train_truncated(CharLM(10, 16), loader, k=20, seconds=0.05)
    assert timed["train_s"] >= 0.05 and timed["updates"] >= 1
    with pytest.raises(ValueError, match="exactly one budget"):
        train_truncated(model, loader, k=5)


def test_position_loss_shape_and_mode():
    model = CharLM(vocab_size=5, hidden_size=4).train()
    x = torch.randint(0, 5, (3, 7))
    assert position_loss(model, x, x).shape == (7,) and model.training


@pytest.mark.parametrize("training", [True, False])
def test_stream_loss_keeps_the_model_mode(training):
    model = CharLM(vocab_size=5, hidden_size=4).train(training)
    stream_loss(model, torch.randint(0, 5, (2, 12)), k=4)
    assert model.training is training


def test_char_nll_carried_and_reset_average_to_the_training_losses():
    """Per-character NLL (for paired comparisons with a count model) equals, averaged over the
    positions it scores, the carried stream loss and the validation loss of the windows."""
    from utils.bptt import char_nll, make_streams
    from utils.rnn import lm_step
    from utils.train import evaluate

    torch.manual_seed(0)
    model = CharLM(vocab_size=7, hidden_size=6)
    ids = torch.randint(0, 7, (1_000,))
    carried = char_nll(model, ids, seq_len=10, carried=True, streams=4)
    assert np.isnan(carried[[0, 250, 500, 750]]).all() and np.isfinite(carried).sum() == 4 * 249
    assert np.nanmean(carried) == pytest.approx(stream_loss(model, make_streams(ids, 4), k=10), rel=1e-6)
    reset = char_nll(model, ids, seq_len=10, carried=False)
    loss = evaluate(model, make_lm_loader(ids, 10, 256, shuffle=False), lm_step)["loss"]
    assert np.isnan(reset[0]) and np.nanmean(reset) == pytest.approx(loss, rel=1e-6)
