"""utils.rnn: from-scratch RNNs vs nn.RNN, clipping vs clip_grad_norm_, the char LM pieces."""

import pytest
import torch
from torch import nn

from utils.rnn import (
    BidirectionalRNN,
    CharLM,
    RNNScratch,
    StackedRNN,
    clip_grad_norm,
    count_parameters,
    detach_state,
    lm_step,
    make_lm_loader,
    rnn_from_torch,
    sample,
)
from utils.text import Vocab

B, T, E, H = 3, 5, 4, 6



def _check_close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6) -> None:
    diff = (a - b).abs().max().item()
    print(f"max |diff| = {diff:.2e}")
    assert diff < atol


def test_rnn_scratch_shapes():
    torch.manual_seed(0)
    out, h = RNNScratch(E, H)(torch.randn(B, T, E))
    assert out.shape == (B, T, H) and h.shape == (B, H)
    assert torch.equal(out[:, -1], h)  # the last output is the final state
    out, h = StackedRNN(E, H, num_layers=3, bidirectional=True)(torch.randn(B, T, E))
    assert out.shape == (B, T, 2 * H) and h.shape == (3 * 2, B, H)


def test_rnn_scratch_rejects_bad_shapes():
    rnn = RNNScratch(E, H)
    with pytest.raises(ValueError, match="x must be"):
        rnn(torch.randn(B, T, E + 1))
    with pytest.raises(ValueError, match="h0 must be"):
        rnn(torch.randn(B, T, E), torch.zeros(B, H + 1))


def test_rnn_scratch_param_count_is_textbook():
    # one bias vector, unlike nn.RNN's two: E*H + H*H + H
    assert count_parameters(RNNScratch(8, 20)) == 8 * 20 + 20 * 20 + 20
    assert count_parameters(nn.RNN(8, 20)) == 8 * 20 + 20 * 20 + 2 * 20


@pytest.mark.parametrize("batch_first", [True, False])
def test_single_layer_matches_nn_rnn(batch_first):
    torch.manual_seed(0)
    ref = nn.RNN(E, H, batch_first=batch_first)
    ours = RNNScratch(E, H).load_from_torch(ref)
    x, h0 = torch.randn(B, T, E), torch.randn(B, H)
    out, h = ours(x, h0)
    x_ref = x if batch_first else x.transpose(0, 1)  # time-first (T, B, E) for the default layout
    out_ref, h_ref = ref(x_ref, h0[None])
    out_ref = out_ref if batch_first else out_ref.transpose(0, 1)
    _check_close(out, out_ref)
    _check_close(h, h_ref[0])


@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, False), (1, True), (2, True)])
def test_stacked_and_bidirectional_match_nn_rnn(num_layers, bidirectional):
    torch.manual_seed(0)
    ref = nn.RNN(E, H, num_layers, batch_first=True, bidirectional=bidirectional)
    ours = rnn_from_torch(ref)
    D = 2 if bidirectional else 1
    x, h0 = torch.randn(B, T, E), torch.randn(num_layers * D, B, H)
    out, h = ours(x, h0)
    out_ref, h_ref = ref(x, h0)
    assert out.shape == (B, T, D * H) and h.shape == (num_layers * D, B, H)
    _check_close(out, out_ref)
    _check_close(h, h_ref)


def test_gradients_match_nn_rnn():
    """Every weight's gradient (both layers, both directions) and the input's match nn.RNN."""
    torch.manual_seed(0)
    ref = nn.RNN(E, H, 2, batch_first=True, bidirectional=True)
    ours = rnn_from_torch(ref)
    x_ref, x = torch.randn(B, T, E).requires_grad_(), None
    x = x_ref.detach().clone().requires_grad_()
    ref(x_ref)[0].square().sum().backward()
    ours(x)[0].square().sum().backward()
    _check_close(x.grad, x_ref.grad, atol=1e-5)
    for layer in range(2):
        for sfx, scratch in (("", ours.layers[layer].fwd), ("_reverse", ours.layers[layer].bwd)):
            name = f"_l{layer}{sfx}"
            _check_close(scratch.W_xh.grad, getattr(ref, "weight_ih" + name).grad.T, atol=1e-5)
            _check_close(scratch.W_hh.grad, getattr(ref, "weight_hh" + name).grad.T, atol=1e-5)
            # b_h stands for b_ih + b_hh: its gradient equals the gradient of either one
            _check_close(scratch.b_h.grad, getattr(ref, "bias_ih" + name).grad, atol=1e-5)


def test_bidirectional_backward_half_sees_the_future():
    # the backward direction at t=0 depends on x_T: why it cannot be a left-to-right LM
    torch.manual_seed(0)
    bi = BidirectionalRNN(E, H)
    x = torch.randn(1, T, E)
    x2 = x.clone()
    x2[:, -1] += 1.0
    out, out2 = bi(x)[0], bi(x2)[0]
    assert torch.equal(out[:, 0, :H], out2[:, 0, :H])  # forward half: causal
    assert not torch.allclose(out[:, 0, H:], out2[:, 0, H:])  # backward half: not causal


def test_concatenation_identity():
    """RNNScratch.cell equals one product of [x_t, h] with the stacked matrix [W_xh; W_hh]."""
    torch.manual_seed(0)
    rnn = RNNScratch(E, H)
    X, Hs = torch.randn(B, E), torch.randn(B, H)
    stacked = torch.cat([rnn.W_xh, rnn.W_hh], dim=0)  # (E+H, H)
    right = torch.tanh(torch.cat([X, Hs], dim=1) @ stacked + rnn.b_h)  # (B, E+H) @ (E+H, H)
    _check_close(rnn.cell(X, Hs), right, atol=1e-6)


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(max_norm):
    torch.manual_seed(0)
    a, b = nn.Linear(E, H), nn.Linear(E, H)
    b.load_state_dict(a.state_dict())
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        p.grad = torch.randn_like(p) * 3
        q.grad = p.grad.clone()
    norm = clip_grad_norm(a.parameters(), max_norm)
    norm_ref = nn.utils.clip_grad_norm_(b.parameters(), max_norm)
    _check_close(norm, norm_ref, atol=1e-5)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        _check_close(p.grad, q.grad)
    new_norm = torch.sqrt(sum(p.grad.square().sum() for p in a.parameters()))
    assert new_norm <= max_norm + 1e-4  # after clipping the norm is at most theta


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_float64_matches_torch(max_norm):
    """float64 gradients are clipped with a float64 norm (a float32 norm loses ~1e-8)."""
    torch.manual_seed(0)
    grads = [torch.randn(50, 50, dtype=torch.float64) * 3 for _ in range(3)]
    a = [torch.zeros(50, 50, dtype=torch.float64, requires_grad=True) for _ in grads]
    b = [torch.zeros(50, 50, dtype=torch.float64, requires_grad=True) for _ in grads]
    for p, q, g in zip(a, b, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    norm, norm_ref = clip_grad_norm(a, max_norm), nn.utils.clip_grad_norm_(b, max_norm)
    assert norm.dtype == torch.float64
    _check_close(norm, norm_ref, atol=1e-12)
    for p, q in zip(a, b, strict=True):
        _check_close(p.grad, q.grad, atol=1e-14)


def test_clip_grad_norm_accepts_a_single_tensor():
    """torch accepts one tensor; so do we (iterating it used to walk its rows and skip it)."""
    w, w_ref = torch.zeros(4, 3, requires_grad=True), torch.zeros(4, 3, requires_grad=True)
    w.grad = torch.full((4, 3), 2.0)
    w_ref.grad = w.grad.clone()
    norm, norm_ref = clip_grad_norm(w, 1.0), nn.utils.clip_grad_norm_(w_ref, 1.0)
    _check_close(norm, norm_ref)
    _check_close(w.grad, w_ref.grad)
    assert w.grad.norm() <= 1.0 + 1e-5


def test_charlm_runs_in_float64():
    """The one-hot input takes the model's dtype (it was hard-coded to float32)."""
    model = CharLM(vocab_size=7, hidden_size=5).double()
    logits, _ = model(torch.randint(0, 7, (2, 3)))
    assert logits.dtype == torch.float64 and logits.shape == (2, 3, 7)


def test_clip_grad_norm_rejects_bad_max_norm():
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm(nn.Linear(2, 2).parameters(), 0.0)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("embed_size", [None, 5])
def test_charlm_shapes(cell, embed_size):
    torch.manual_seed(0)
    V = 11
    lm = CharLM(V, H, num_layers=2, cell=cell, embed_size=embed_size)
    logits, h = lm(torch.randint(0, V, (B, T)))
    assert logits.shape == (B, T, V)
    h_tensor = h[0] if cell == "lstm" else h
    assert h_tensor.shape == (2, B, H)
    logits2, _ = lm(torch.randint(0, V, (B, 1)), detach_state(h))  # the state can be carried
    assert logits2.shape == (B, 1, V)


def test_charlm_rejects_bad_cell_and_shape():
    with pytest.raises(ValueError, match="cell"):
        CharLM(5, 4, cell="transformer")
    with pytest.raises(ValueError, match="x must be"):
        CharLM(5, 4)(torch.zeros(2, 3, 5, dtype=torch.long))


def test_lm_loader_targets_and_order():
    ids = torch.arange(101)
    x, y = next(iter(make_lm_loader(ids, seq_len=10, batch_size=4, shuffle=True)))
    assert x.shape == (4, 10) and torch.equal(y, x + 1)  # y is x shifted by one token
    in_order = list(make_lm_loader(ids, seq_len=10, batch_size=4, shuffle=False))
    assert [len(b[0]) for b in in_order] == [4, 4, 2]  # all 10 windows kept, in text order
    assert torch.equal(in_order[0][0][1], torch.arange(10, 20))


def test_lm_loader_shuffle_is_seeded():
    ids = torch.arange(1001)
    first = [next(iter(make_lm_loader(ids, 10, 4, seed=1)))[0] for _ in range(2)]
    assert torch.equal(first[0], first[1])


def test_charlm_overfits_a_tiny_text():
    torch.manual_seed(0)
    text = "hello world. " * 4
    vocab = Vocab.build([list(text)])
    ids = torch.tensor(vocab.encode(list(text)))
    loader = make_lm_loader(ids, seq_len=12, batch_size=4)
    lm = CharLM(len(vocab), 32)
    opt = torch.optim.Adam(lm.parameters(), lr=0.05)
    for _ in range(25):
        for batch in loader:
            loss = lm_step(lm, batch)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert loss.item() < 0.1
    gen = torch.Generator().manual_seed(0)
    assert sample(lm, vocab, "hello", 7, temperature=0.1, generator=gen) == "hello world."


def test_sample_rejects_bad_arguments():
    vocab = Vocab.build([list("abc")])
    lm = CharLM(len(vocab), 4)
    with pytest.raises(ValueError, match="prompt"):
        sample(lm, vocab, "", 3)
    with pytest.raises(ValueError, match="temperature"):
        sample(lm, vocab, "a", 3, temperature=0.0)
